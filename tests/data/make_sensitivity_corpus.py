"""Writes tests/data/sensitivity_corpus.jsonl: a labelled corpus for loom.sensitivity.

Run from the repository root: ``python tests/data/make_sensitivity_corpus.py``. The output
is committed; this script only documents how it was made and lets it be regenerated.

Each line: ``{"kind": ..., "label": "high" | "plain", "reason": <KINDS name or "">, "text": ...}``.
``kind`` groups lines for the per-kind table (bench/studies/sensitivity.py). Every secret is
random characters in the right shape (seeded), or a published test value; none is real.

The templates were written to describe how people actually paste things into a chat:
prose in several languages, .env files, YAML, JSON, shell, logs, CSV/TSV/Markdown tables,
and the look-alikes that sit next to them (ids, digests, dates, versions, templates).
"""

from __future__ import annotations

import base64
import random
import string
from pathlib import Path

from corpus_io import hi, lo, write_rows  # beside this script
from stdnum import luhn

R = random.Random(20261201)
OUT = Path(__file__).with_name("sensitivity_corpus.jsonl")

ALNUM = string.ascii_letters + string.digits
HEX = "0123456789abcdef"


def rs(n: int, alphabet: str = ALNUM) -> str:
    return "".join(R.choice(alphabet) for _ in range(n))


def b64(nbytes: int) -> str:
    return base64.b64encode(bytes(R.getrandbits(8) for _ in range(nbytes))).decode()


def b64url(nbytes: int) -> str:
    return base64.urlsafe_b64encode(bytes(R.getrandbits(8) for _ in range(nbytes))).decode().rstrip("=")


def storage_key() -> str:
    return b64(64)  # 88 characters ending in "=="


def sid(prefix: str = "AC") -> str:
    return prefix + rs(32, HEX)


def card(prefix: str, length: int) -> str:
    body = prefix + rs(length - len(prefix) - 1, string.digits)
    return body + luhn.calc_check_digit(body)


def visa() -> str:
    return card("4", 16)


def mastercard() -> str:
    return card(R.choice(["51", "52", "53", "54", "55", "2221", "2720"]), 16)


def amex() -> str:
    return card(R.choice(["34", "37"]), 15)


def any_card() -> str:
    return R.choice([visa, mastercard, amex, lambda: card("6011", 16)])()


def grouped(num: str, sep: str = " ") -> str:
    if len(num) == 15:
        return sep.join([num[:4], num[4:10], num[10:]])
    return sep.join(num[i : i + 4] for i in range(0, len(num), 4))


def ssn(sep: str = "-") -> str:
    while True:
        area = R.randint(1, 899)
        if area != 666:
            break
    group, serial = R.randint(1, 99), R.randint(1, 9999)
    return f"{area:03d}{sep}{group:02d}{sep}{serial:04d}"


def sin() -> str:
    body = str(R.choice([1, 2, 3, 4, 5, 6, 7, 9])) + rs(7, string.digits)
    return body + luhn.calc_check_digit(body)


def pin() -> str:
    n = R.choice([4, 4, 4, 5, 6])
    while True:
        p = rs(n, string.digits)
        if not (n == 4 and 1900 <= int(p) <= 2099):
            return p


def uuid() -> str:
    h = rs(32, HEX)
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-a{h[17:20]}-{h[20:]}"


def password() -> str:
    return R.choice(
        [
            rs(12) + "!",
            "Tr0ub4dor&" + rs(3, string.digits),
            rs(6, string.ascii_lowercase) + rs(4, string.digits) + "#",
            "S" + rs(10) + "$",
            "correct-horse-" + rs(5, string.digits),
            "Winter" + str(R.randint(2019, 2026)) + "!",
            "hunter" + rs(2, string.digits),
            rs(20, ALNUM + "!@#%^*"),
        ]
    )


def pem(label: str, nbytes: int = 900) -> str:
    body = b64(nbytes)
    lines = "\n".join(body[i : i + 64] for i in range(0, len(body), 64))
    return f"-----BEGIN {label}-----\n{lines}\n-----END {label}-----"


NAMES = [
    "Alice Martin",
    "Bob Okafor",
    "Chen Wei",
    "Dana Kowalski",
    "Émile Roux",
    "Fatima Zahra",
    "Gustavo Lima",
]
CITIES = ["Lyon", "Berlin", "Austin", "Porto", "Utrecht", "Milan", "Sevilla"]

# =============================================================== positives

# --- cloud storage account keys (64 random bytes, base64: 88 chars ending "==")
for _ in range(2):
    k = storage_key
    hi(
        "storage_key",
        "api_key",
        f"the storage account key1 is {k()}",
        f"Storage account key2: {k()} (rotate after the demo)",
        f"DefaultEndpointsProtocol=https;AccountName=st{rs(8, string.ascii_lowercase)};AccountKey={k()};"
        "EndpointSuffix=core.windows.net",
        f"AZURE_STORAGE_CONNECTION_STRING='DefaultEndpointsProtocol=https;AccountName=logs01;AccountKey={k()}'",
        k(),
        f"{k()}\n",
        f"here you go:\n\n{k()}\n\nlet me know once it's in the vault",
        f"AZURE_STORAGE_KEY={k()}",
        f'{{"accountName": "prodblobs", "key": "{k()}"}}',
        f"az storage container list --account-name media01 --account-key {k()}",
        f"KeyName  Permissions  Value\n-------  -----------  -----\nkey1     FULL         {k()}",
        f"I copied the primary key from the portal: {k()} — is that the right one?",
        f"storage_key: {k()}",
        f"$ctx = New-AzStorageContext -StorageAccountName 'bkp' -StorageAccountKey '{k()}'",
        f"la clé du compte de stockage est {k()}",
        f"AccountName=devstoreaccount1;AccountKey={k()};BlobEndpoint=http://127.0.0.1:10000/",
    )

# --- telephony credentials (account SID + auth token in one sentence)
for _ in range(2):
    hi(
        "telephony",
        "token",
        f"Twilio account SID {sid()} and auth token {rs(32, HEX)}",
        f"use {sid()} / {rs(32, HEX)} for the SMS sender",
        f"client = Client('{sid()}', '{rs(32, HEX)}')",
        f'account_sid = "{sid()}"\nauth_token = "{rs(32, HEX)}"',
        f"TWILIO_ACCOUNT_SID={sid()}\nTWILIO_AUTH_TOKEN={rs(32, HEX)}",
        f"SID: {sid()}, token: {rs(32, HEX)}",
        f"curl -X POST https://api.twilio.com/2010-04-01/Accounts/{sid()}/Messages.json -u {sid()}:{rs(32, HEX)}",
        f"the sid is {sid()} and the secret is {rs(32, HEX)}, don't share",
        f"Account {sid()} token {rs(32, HEX)}",
        f"creds for the voice line: {sid()} {rs(32, HEX)}",
    )

# --- PINs stated in other languages
PINS_FOREIGN = [
    "Meine PIN ist {p}.",
    "Die PIN für die neue Karte lautet {p}",
    "PIN-Nummer: {p}",
    "meine Geheimzahl ist {p}",
    "Geheimzahl {p}, bitte nicht weitersagen",
    "Die PIN meiner EC-Karte ist {p}",
    "mon code PIN est {p}",
    "Le code secret de ma carte est {p}.",
    "code PIN : {p}",
    "mon code confidentiel : {p}",
    "Voici le code PIN de la carte bleue : {p}",
    "mi PIN es {p}",
    "El PIN de mi tarjeta es {p}",
    "el código PIN es {p}",
    "mi número PIN: {p}",
    "Mi clave del cajero es {p}",
    "il mio PIN è {p}",
    "Il PIN della carta è {p}",
    "codice PIN: {p}",
    "il codice segreto del bancomat è {p}",
    "o meu PIN é {p}",
    "O PIN do cartão é {p}",
    "código PIN: {p}",
    "a senha do cartão é {p}",
    "mijn pincode is {p}",
    "De pincode van mijn bankpas is {p}",
    "PIN: {p} (nieuwe pas)",
    "mijn PIN is {p}",
    "min PIN-kod är {p}",
    "mój PIN to {p}",
    "Tu NIP es {p}",
    "PIN-Code {p}",
]
for t in PINS_FOREIGN:
    hi("pin_foreign", "pin", t.format(p=pin()))

# --- English PINs
PINS_EN = [
    "my PIN is {p}",
    "The PIN for the new debit card is {p}.",
    "pin: {p}",
    "PIN code {p}",
    "Card PIN = {p}",
    "ATM pin {p}",
    "the door keypad PIN is {p}",
    "I set the SIM PIN to {p}",
    "new pin is {p}, old one was {p2}",
    "voicemail PIN: {p}",
    "PIN number {p}",
    "ok so the pin's {p}",
    "Alarm code / PIN: {p}",
    "her PIN was {p}",
    "my bank PIN is now {p}",
]
for t in PINS_EN:
    hi("pin_en", "pin", t.format(p=pin(), p2=pin()))

# --- card numbers and SSNs in tables where only the header names the column
for _ in range(2):
    n1, n2, n3 = R.sample(NAMES, 3)
    hi(
        "card_table",
        "card_number",
        f"name,card_number,exp\n{n1},{visa()},04/27\n{n2},{mastercard()},11/26",
        f"customer\tpan\texpiry\n{n1}\t{any_card()}\t09/28",
        f"| Name | Card | Exp |\n|---|---|---|\n| {n1} | {any_card()} | 01/27 |\n| {n2} | {any_card()} | 02/29 |",
        f"id,cc,cvv\n17,{visa()},123\n18,{amex()},4412",
        f"user;card;city\n{n3};{grouped(mastercard(), '-')};{R.choice(CITIES)}",
        f"```csv\nemail,credit_card\nx{rs(4)}@example.com,{visa()}\n```",
        f"Name | Card number | Amount\n--- | --- | ---\n{n1} | {grouped(visa())} | 42.00",
        f"order_id,card_no,total\n{R.randint(10000, 99999)},{any_card()},19.99",
        f'"holder","pan","brand"\n"{n2}","{mastercard()}","MC"',
        f"Kunde;Kartennummer;Ablauf\n{n1};{visa()};03/28",
    )
    hi(
        "ssn_table",
        "ssn",
        f"name,ssn,dob\n{n1},{ssn()},1984-02-11\n{n2},{ssn()},1990-07-30",
        f"employee\tsocial\tstate\n{n3}\t{ssn('')}\tTX",
        f"| Employee | SSN | Start |\n|----------|-----|-------|\n| {n1} | {ssn('')} | 2021-03-01 |",
        f"first,last,social_security_number\nDana,Reyes,{ssn()}",
        f"id,name,ssn\n1,{n2},{ssn('')}\n2,{n3},{ssn('')}",
        f"Name | SIN | Province\n--- | --- | ---\n{n1} | {sin()} | ON",
        f"emp_id;tax_id_ssn;dept\n{R.randint(100, 999)};{ssn()};ops",
        f"```\nname       ssn\n{n1}  {ssn('')}\n```",
    )

# --- cards and SSNs in prose
for _ in range(2):
    hi(
        "card_prose",
        "card_number",
        f"my card number is {grouped(visa())}",
        f"Visa {visa()} exp 08/27",
        f"charge it to {grouped(mastercard(), '-')} please",
        f"the amex is {grouped(amex())}",
        f"CC: {any_card()} CVV 311",
        f"I paid with {grouped(visa())} but it bounced",
        f"card={visa()}&amount=1200",
        f"Kartennummer {grouped(mastercard())}",
        f"numéro de carte : {grouped(visa())}",
        f"{grouped(any_card())}",
    )
    hi(
        "ssn_prose",
        "ssn",
        f"my SSN is {ssn()}",
        f"Social Security Number: {ssn()}",
        f"ssn {ssn('')}",
        f"her social security no. is {ssn(' ')}",
        f"SSN#: {ssn()}",
        f"applicant: {R.choice(NAMES)}, SS# {ssn()}",
        f"{ssn()}",
        f"use {ssn()} on the W-4",
    )

# --- API keys and tokens of common providers
for _ in range(2):
    hi(
        "api_key",
        "api_key",
        f"AWS_ACCESS_KEY_ID=AKIA{rs(16, string.ascii_uppercase + '234567')}",
        f"aws_secret_access_key = {rs(40, ALNUM + '/+')}",
        f"OPENAI_API_KEY=sk-proj-{rs(48, ALNUM + '_-')}",
        f"anthropic key: sk-ant-api03-{rs(93, ALNUM + '_-')}AA",
        f"stripe: sk_live_{rs(24)}",
        f"maps key AIza{rs(35, ALNUM + '_-')}",
        f"SENDGRID_API_KEY=SG.{rs(22, ALNUM + '_-')}.{rs(43, ALNUM + '_-')}",
        f"HF_TOKEN=hf_{rs(34, string.ascii_letters)}",
        f"api_key = '{rs(32, HEX)}'",
        f'"apiKey": "{rs(40)}"',
        f"DATADOG_API_KEY={rs(32, HEX)}",
        f"x-api-key: {rs(40)}",
        f"the API key is {rs(32)}",
        f"mailgun key-{rs(32, HEX)}",
        f"SHOPIFY_ACCESS_TOKEN=shpat_{rs(32, HEX)}",
        f"GROQ_API_KEY=gsk_{rs(52)}",
    )
    hi(
        "token",
        "token",
        f"GITHUB_TOKEN=ghp_{rs(36)}",
        f"git remote set-url origin https://x-access-token:ghs_{rs(36)}@github.com/acme/app.git",
        f"gitlab token glpat-{rs(20, ALNUM + '_-')}",
        f"SLACK_BOT_TOKEN=xoxb-{rs(12, string.digits)}-{rs(13, string.digits)}-{rs(24)}",
        f"Authorization: Bearer eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.{b64url(60)}.{b64url(32)}",
        f"curl -H 'Authorization: Bearer {rs(40)}' https://api.example.com/v1/me",
        f"npm token npm_{rs(36)}",
        f'access_token: "{rs(48, ALNUM + "-_")}"',
        f"refresh_token={b64url(48)}",
        f"my session token is {b64url(32)}",
        f"DIGITALOCEAN_TOKEN=dop_v1_{rs(64, HEX)}",
        f"auth_token = '{rs(32, HEX)}'",
    )

# --- private keys
for label in [
    "RSA PRIVATE KEY",
    "PRIVATE KEY",
    "EC PRIVATE KEY",
    "OPENSSH PRIVATE KEY",
    "ENCRYPTED PRIVATE KEY",
]:
    hi("private_key", "private_key", pem(label), f"here's the deploy key:\n{pem(label, 400)}\nthanks")
hi(
    "private_key",
    "private_key",
    '{"type": "service_account", "private_key": "-----BEGIN PRIVATE KEY-----\\n'
    + "\\n".join(b64(48) for _ in range(5))
    + '\\n-----END PRIVATE KEY-----\\n"}',
    "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\n"
    + "\n".join(b64(48) for _ in range(6))
    + "\n-----END PGP PRIVATE KEY BLOCK-----",
)

# --- password assignments and statements
for _ in range(2):
    hi(
        "password",
        "password_assignment",
        f"DB_PASSWORD={password()}",
        f'password: "{password()}"',
        f"export PGPASSWORD='{password()}'",
        f"the wifi password is {password()}",
        f"mysql -u root -p{password()}",
        f"postgres://app:{password()}@db.internal:5432/prod",
        f"login admin / password {password()}",
        f"spring.datasource.password={password()}",
        f'{{"username": "svc", "password": "{password()}"}}',
        f"ALTER USER app WITH PASSWORD '{password()}';",
        f"Passwort: {password()}",
        f"mon mot de passe est {password()}",
        f"la contraseña es {password()}",
        f"a senha é {password()}",
        f"het wachtwoord is {password()}",
        f"la password del router è {password()}",
    )

# --- basic-auth in URLs and headers
hi(
    "basic_auth",
    "password_assignment",
    f"https://deploy:{password()}@registry.example.com/v2/",
    f"redis://:{rs(24)}@cache.internal:6379/0",
    "Authorization: Basic " + base64.b64encode(f"svc:{password()}".encode()).decode(),
    f"amqp://worker:{rs(18)}@mq.prod:5672/",
)

# =============================================================== negatives (look-alikes)

# --- empty assignments and templates
lo(
    "empty_assignment",
    "PASSWORD=",
    "DB_PASSWORD=\nDB_HOST=localhost\nDB_PORT=5432",
    "password = \nuser = admin",
    "# .env.example\nAPI_KEY=\nSECRET_KEY=\nDATABASE_URL=postgres://localhost/app",
    "STRIPE_SECRET_KEY=\nSTRIPE_PUBLISHABLE_KEY=\nSENTRY_DSN=",
    "password:\n  - must be 12 characters\n  - one digit",
    'password: ""\nusername: ""',
    "AZURE_STORAGE_KEY=\nAZURE_STORAGE_ACCOUNT=mystorage",
    "TWILIO_ACCOUNT_SID=\nTWILIO_AUTH_TOKEN=\nTWILIO_FROM=+15550000000",
    "secret_key =\nalgorithm = HS256",
    "export GITHUB_TOKEN=\nexport NPM_TOKEN=",
    "password=   \n",
    "[database]\nhost = db\npassword =\nport = 5432",
    "api_key:\nbase_url: https://api.example.com",
    "ACCESS_TOKEN=''\nREFRESH_TOKEN=''",
    "DB_PASS=\n\n# fill these in locally",
    "client_secret = \n# ask ops for the value",
    "  password: \n  database: app_test",
    "MYSQL_ROOT_PASSWORD=\nMYSQL_DATABASE=shop",
    "token=\nretries=3",
)

# --- placeholder values in docs and templates
lo(
    "placeholder",
    "password: <your-password>",
    "DB_PASSWORD=changeme",
    "password = your_password_here",
    "API_KEY=xxxx",
    "api_key: '****'",
    "password: ${DB_PASSWORD}",
    "secret: {{ secret }}",
    "token = example",
    "PASSWORD=<password>",
    "export OPENAI_API_KEY=<your key>",
    "password=CHANGE_ME",
    'client_secret: "YOUR_CLIENT_SECRET"',
    "auth_token = 'your-auth-token'",
    "password: ********",
    "DB_PASSWORD=${DB_PASSWORD:-}",
    "password: '{{ vault_password }}'",
    "AZURE_STORAGE_KEY=<storage-account-key>",
    "AccountKey=<your-account-key>;",
    "TWILIO_AUTH_TOKEN=your_auth_token",
    "secret_key = 'replace-me'",
    "password: REPLACE_ME",
    'api_key = "<insert key here>"',
    "GITHUB_TOKEN=ghp_XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX",
    "password = 'password'",
    "password: example",
    "PASSWORD=dummy",
    "token: %TOKEN%",
    "password = $(cat /run/secrets/db)",
    "api_key: ...",
    "password=<redacted>",
    "Set `password: changeme` in the config and change it on first login.",
    "pin: ****",
    "PIN: XXXX",
    "password: your-password-here",
    "api_key: 'sk-...'",
)

# --- PEM blocks whose body is redacted, and public material
lo(
    "redacted_pem",
    "-----BEGIN RSA PRIVATE KEY-----\n<redacted>\n-----END RSA PRIVATE KEY-----",
    "-----BEGIN PRIVATE KEY-----\n...\n-----END PRIVATE KEY-----",
    "-----BEGIN OPENSSH PRIVATE KEY-----\n[REDACTED]\n-----END OPENSSH PRIVATE KEY-----",
    "-----BEGIN EC PRIVATE KEY-----\n...snip...\n-----END EC PRIVATE KEY-----",
    "key.pem looks like:\n-----BEGIN PRIVATE KEY-----\n(base64 here)\n-----END PRIVATE KEY-----",
    "-----BEGIN RSA PRIVATE KEY-----\nMIIE...\n-----END RSA PRIVATE KEY-----",
    'private_key: "-----BEGIN PRIVATE KEY-----\\n<redacted>\\n-----END PRIVATE KEY-----\\n"',
    "-----BEGIN PRIVATE KEY-----\n****************\n-----END PRIVATE KEY-----",
    "-----BEGIN PRIVATE KEY-----\nxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\n-----END PRIVATE KEY-----",
    "-----BEGIN RSA PRIVATE KEY-----\n<your key here>\n-----END RSA PRIVATE KEY-----",
)
lo(
    "public_material",
    pem("PUBLIC KEY", 294),
    pem("CERTIFICATE", 700),
    f"ssh-rsa {b64(279)} deploy@ci",
    f"ssh-ed25519 {b64(51)} me@laptop",
    "the file starts with -----BEGIN RSA PRIVATE KEY----- and ends with the END line",
)

# --- ids, digests, blobs
for _ in range(2):
    lo(
        "ids_hashes",
        f"request {uuid()} failed with 502",
        f"commit {rs(40, HEX)}",
        f"sha256:{rs(64, HEX)}",
        f"md5sum: {rs(32, HEX)}  backup.tar.gz",
        f'"integrity": "sha512-{b64(64)}"',
        f"sha512 digest (base64): {b64(64)}",
        f"Ed25519 signature: {b64(64)}",
        f'etag "{rs(32, HEX)}"',
        f"trace_id={rs(32, HEX)} span_id={rs(16, HEX)}",
        f"data:image/png;base64,{b64(120)}",
        f"Message SID SM{rs(32, HEX)} delivered",
        f"the account SID is {sid()} (that's not secret, it's in every URL)",
        f"call SID CA{rs(32, HEX)}, duration 45s, cost 0.0085",
        f"subscription id {uuid()}, tenant {uuid()}",
        f"container {rs(64, HEX)[:12]} exited",
        f"build {rs(7, HEX)} deployed; previous {rs(7, HEX)}",
        f"nonce={b64(16)}",
        f"object key uploads/{uuid()}.png",
        f"{rs(32, HEX)} and {rs(32, HEX)} are the two chunk hashes",
    )

# --- numbers that are not cards or SSNs
for _ in range(2):
    lo(
        "numbers",
        f"order #{R.randint(10**9, 10**10)} shipped",
        f"Order ID: {visa()}",
        f"tracking number 1Z{rs(16, string.ascii_uppercase + string.digits)}",
        f"call me at +1 415 555 {R.randint(1000, 9999)}",
        f"Tel. +49 30 {R.randint(1000000, 9999999)}",
        f"IBAN DE{R.randint(10, 99)} {rs(4, string.digits)} {rs(4, string.digits)} {rs(4, string.digits)} "
        f"{rs(4, string.digits)} {rs(2, string.digits)}",
        f"invoice INV-{R.randint(100000, 999999)} due 2026-12-31",
        f"the meeting is on {R.randint(1, 28)}/{R.randint(1, 12)}/2026 at 14:30",
        f"upgrade to v{R.randint(1, 9)}.{R.randint(0, 30)}.{R.randint(0, 99)}",
        f"we sold {R.randint(1000, 9999)} units in {R.randint(2010, 2025)}",
        f"ISBN 978-{R.randint(0, 9)}-{R.randint(100, 999)}-{R.randint(10000, 99999)}-{R.randint(0, 9)}",
        f"the timestamp 17{rs(11, string.digits)} is in ms",
        f"part no. {ssn()} is back-ordered",
        f"routing number 0{rs(8, string.digits)}",
        f"employee id {R.randint(100000, 999999)}, badge {R.randint(1000, 9999)}",
        f"zip code {R.randint(10000, 99999)}",
        f"flight LH{R.randint(100, 9999)} gate B{R.randint(1, 60)}",
    )

# --- tables whose columns are not cards or SSNs
lo(
    "table_lookalike",
    f"order_id,amount,date\n{visa()},19.99,2026-01-02\n{mastercard()},5.00,2026-01-03",
    f"| SKU | Qty | Price |\n|---|---|---|\n| {rs(9, string.digits)} | 2 | 9.99 |",
    f"phone\tname\n+1 415 555 0101\t{NAMES[0]}",
    f"id,zip,tracking\n1,94107,{rs(18, string.digits)}",
    "card,status\nvisa,active\nmastercard,expired",
    "card_last4,exp\n4242,04/27\n1881,11/26",
    f"| Card | Holder |\n|---|---|\n| **** **** **** 4242 | {NAMES[1]} |",
    f"ssn_verified,count\ntrue,{R.randint(100, 999)}\nfalse,{R.randint(10, 99)}",
    f"user_id,account_number,routing\n{R.randint(1000, 9999)},{rs(12, string.digits)},0{rs(8, string.digits)}",
    f"year,pin_count\n2024,{R.randint(1000, 9999)}\n2025,{R.randint(1000, 9999)}",
    f"name,employee_no,dept\n{NAMES[2]},{rs(9, string.digits)},ops",
    f"| Build | Commit | Duration |\n|---|---|---|\n| {R.randint(1000, 9999)} | {rs(40, HEX)} | 4m |",
    f"isbn,title\n{card('978', 13)},Dune",
    f"transaction_id\tamount\n{amex()}\t12.00",
)

# --- PIN words without a stated PIN (any language)
lo(
    "pin_lookalike",
    "PIN codes were introduced in 1967",
    "reset your PIN at any ATM",
    "the PIN must be 4 to 6 digits",
    "PIN entry failed 3 times, card blocked since 2024",
    "Chip and PIN arrived in the UK in 2006",
    "pin 13 is connected to the LED",
    "pin numpy to 1.26.4 please",
    "I pinned issue 4821 to the board",
    "Die PIN wurde 2019 geändert.",
    "Ihre PIN besteht aus 4 Ziffern.",
    "Le code PIN a été envoyé par courrier le 12 mars 2024",
    "el código postal es 28013",
    "code postal 75011, Paris",
    "il CAP è 00184",
    "Postleitzahl 10115",
    "el PIN debe tener 4 dígitos",
    "o PIN tem 4 dígitos",
    "de pincode moet 5 cijfers hebben",
    "Le code promo 2026 est expiré",
    "código de barras 7501031311309",
    "PIN-Eingabe seit 2021 kontaktlos bis 50 Euro nicht nötig",
    "código de país +34",
    "pin the 2026 roadmap",
    "spinning at 7200 rpm",
    "the PIN pad model 3000 is discontinued",
    "opinion 2025: chip and PIN is safe",
    "pinyin has 1300 syllables",
    "Pinterest had 2024 revenue growth",
    "PIN-1234 is the Jira ticket",
    "error code 4031 means forbidden",
    "Use code 2024 at checkout",
    "la referencia es 4821 en el pedido",
)

# --- secrets-words without a secret, and code that only names one
lo(
    "secret_words",
    "reset your password from the login page",
    "the password must be at least 12 characters",
    "password = os.environ['DB_PASSWORD']",
    "token = request.headers.get('Authorization')",
    "api_key = settings.API_KEY",
    "Passwort vergessen? Hier klicken",
    "le mot de passe doit contenir 12 caractères",
    "la contraseña debe tener 8 caracteres",
    "a senha expira em 90 dias",
    "het wachtwoord is verlopen",
    "the storage account key is in Key Vault",
    "rotate the account key every 90 days",
    "auth token expires after 3600 seconds",
    "max_tokens=4096, temperature=0.2",
    "the secret to good bread is time",
    "sk-learn style estimators",
    "Authorization: Bearer <token>",
    "Authorization: Bearer ${TOKEN}",
    "https://user@example.com/repo.git",
    "hashed_password = bcrypt.hashpw(pw, bcrypt.gensalt())",
    "def check(password: str) -> bool:",
    "AKIA is the prefix AWS uses for access key ids",
    "ghp_ tokens are classic GitHub PATs",
    "set TWILIO_AUTH_TOKEN in the environment, never in code",
    "your Account SID starts with AC",
    "the key1/key2 pair lets you rotate storage keys without downtime",
    "passed 2048 tests in 12s",
    "the keyword is 'password'",
    "AWS_SECRET_ACCESS_KEY=$(aws configure get aws_secret_access_key)",
)

# --- ordinary chat, logs and code
lo(
    "plain",
    "Can you summarise the meeting notes from Tuesday?",
    "The deploy at 14:05 failed because the worker ran out of memory (2048 MiB).",
    "2026-12-01T10:22:31Z INFO request_id=8c1f2a shard=3 latency_ms=412",
    "for i in range(1000):\n    total += i * 3",
    "SELECT id, created_at FROM orders WHERE total > 1000 LIMIT 50;",
    "Merci pour ton aide, on se voit jeudi à 18h.",
    "Danke! Die Besprechung ist am 3. März um 10 Uhr.",
    "¿Puedes revisar el informe de 2025 antes del lunes?",
    "Ci vediamo alle 9 in ufficio, stanza 214.",
    "Obrigado, o relatório de 2024 está pronto.",
    "Zullen we om 15:00 bellen over release 4.2?",
    "docker run -p 8080:80 -e LOG_LEVEL=debug nginx:1.25",
    "kubectl get pods -n prod | grep api",
    "The quick brown fox jumps over the lazy dog 1234 times.",
    "Latitude 48.8566, longitude 2.3522",
    "Total: $1,234,567.89 across 4 regions",
)

# =============================================================== second batch (other layouts)

for _ in range(2):
    k = storage_key()
    hi(
        "storage_key",
        "api_key",
        f"Key1: {k}",
        f"Primary access key\n{k}",
        f'"primaryKey": "{k}"',
        f"Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey={b64(32)}",
        "https://acct.blob.core.windows.net/c?sv=2022-11-02&ss=b&srt=o&sp=r&se=2026-12-31T00:00:00Z&sig="
        + b64(32).replace("+", "%2B").replace("/", "%2F").replace("=", "%3D"),
        f"- name: STORAGE_KEY\n  value: {storage_key()}",
    )
    hi(
        "telephony",
        "token",
        f"The account sid is {sid()} and the auth token is {rs(32, HEX)}.",
        f"TWILIO: {sid()}:{rs(32, HEX)}",
        f"accountSid {sid()}, authToken {rs(32, HEX)}",
        f"twilio creds {sid()} / {rs(32, HEX).upper()}",
        f"API key {sid('SK')} with secret {rs(32)}",
    )
    lo(
        "ids_hashes",
        f"sha512-{storage_key()}",
        f"SHA512 (file.iso) = {storage_key()}",
        f"signature={storage_key()}",
        f"Accounts/{sid()}/Messages.json returned 201",
        f"{sid()} sent SM{rs(32, HEX)}",
        f"uuid {uuid()} / commit {rs(40, HEX)}",
        f"blake2b {rs(128, HEX)}",
        f"X-Request-Id: {rs(32, HEX)}",
        f"git push origin {rs(40, HEX)}:refs/heads/main",
    )

for t in [
    "Mein PIN lautet {p}",
    "Meine Geheimnummer: {p}",
    "mon code est {p}",
    "Le code PIN de ma CB : {p}",
    "code de la carte bleue: {p}",
    "El pin del móvil es {p}",
    "mi clave es {p}",
    "PIN do cartão: {p}",
    "Il mio codice PIN è {p}",
    "Mijn pincode: {p}",
    "PIN-koden är {p}",
    "la PIN è {p}",
    "Mi número de PIN es el {p}",
    "Je code is {p}",
    "PIN-Code lautet {p}",
    "mi NIP: {p}",
    "tu código es {p}",
]:
    hi("pin_foreign", "pin", t.format(p=pin()))

lo(
    "pin_lookalike",
    "Die PIN-Eingabe wurde 2019 abgeschafft",
    "Meine PIN ist falsch",
    "PIN vergessen? Rufen Sie 0800 123 4567 an",
    "le code PIN est obligatoire depuis 2006",
    "el PIN es obligatorio",
    "o PIN expira em 2027",
    "Il PIN è stato introdotto nel 1985",
    "pincode 560001 (Bangalore)",
    "Address: 12 MG Road, Bengaluru, Karnataka, PIN code 560001",
    "my code is 1500 lines long",
    "La clave es 2048 bits",
    "the RSA key is 2048 bits",
    "PIN code length: 6 digits",
    "the pin count is 2048",
    "PIN-pad firmware 4.2.1",
    "mon code postal est 69003",
    "le code d'erreur est 4031",
    "o código do produto é 78912",
)

for _ in range(2):
    hi(
        "card_table",
        "card_number",
        f"name\tcard number\tcvv\n{R.choice(NAMES)}\t{grouped(visa())}\t123",
        f"cardholder,pan,exp\n{R.choice(NAMES)},{mastercard()},12/28",
        f"| # | Customer | CC |\n|:-:|:--|:--|\n| 1 | {R.choice(NAMES)} | {grouped(any_card(), '-')} |",
    )
    hi(
        "ssn_table",
        "ssn",
        f"|ssn|name|\n|---|---|\n|{ssn()}|{R.choice(NAMES)}|",
        f"Name,SSN\n{R.choice(NAMES)},{ssn(' ')}",
        f"employee_id\tSocial Security #\n{R.randint(1000, 9999)}\t{ssn()}",
    )
lo(
    "table_lookalike",
    "order,amount\n4111111111111111,12.00",
    "| id | phone |\n|--|--|\n| 1 | 4155550132 |",
    "name,ssn_last4\nBob,4399",
    "card,amount\nVisa,12.00\nMastercard,30.00",
    f"account,iban\n{R.randint(100, 999)},DE89370400440532013000",
)

for _ in range(2):
    hi(
        "api_key",
        "api_key",
        f"[default]\naws_access_key_id = AKIA{rs(16, string.ascii_uppercase + '234567')}\n"
        f"aws_secret_access_key = {rs(40, ALNUM + '/+')}",
        f"encryption_key: {b64(32)}",
        f"Here is my OpenAI key sk-{rs(20)}T3BlbkFJ{rs(20)}",
        f"dapi{rs(32, HEX)}",
        f"the secret is {rs(40, HEX)}",
        f"webhook secret whsec_{rs(32)}",
    )
    hi(
        "token",
        "token",
        f"Bearer {rs(40, ALNUM + '-_.')}",
        f"gho_{rs(36)}",
        f"github_pat_{rs(22)}_{rs(59)}",
        f"hf_{rs(34, string.ascii_letters)}",
        f"Cookie: session={rs(48, ALNUM)}; token={rs(40, ALNUM)}",
    )
    hi(
        "password",
        "password_assignment",
        f"the db password is {rs(14)}",
        f"DB_PASS: {rs(16)}",
        f"--password {password()}",
        f"jdbc:postgresql://db:5432/app?user=app&password={rs(12)}",
        f"DATABASE_URL=mysql://root:{rs(12)}@127.0.0.1/app",
        f"Username: admin\nPassword: {password()}",
        f"Kennwort: {password()}",
        f"wifi: MyHome / Passwort {password()}",
    )
lo(
    "secret_words",
    "password policy: min 12 chars",
    "passwords stored with argon2id",
    "token bucket size 1000",
    "api_key=None",
    "secret = get_secret('db')",
    "export TOKEN=$(vault read -field=token secret/ci)",
    'Bearer realm="example"',
    "token_type=bearer&expires_in=3600",
    "npm ERR! code E401",
    "Error: 401 Unauthorized (invalid api key)",
    "the tokenizer splits 'password' into 2 tokens",
    "primary key (id)",
    "Card ending in 4242",
    "SSN: ***-**-6789",
    "last four of SSN 6789",
    "password reset link expires in 30 minutes",
    "Das Passwort muss 12 Zeichen haben",
    "le mot de passe est trop court",
)
lo(
    "redacted_pem",
    "-----BEGIN PRIVATE KEY-----\n-----END PRIVATE KEY-----",
    "-----BEGIN RSA PRIVATE KEY-----\n[key material removed]\n-----END RSA PRIVATE KEY-----",
    "-----BEGIN PRIVATE KEY-----\n…\n-----END PRIVATE KEY-----",
    "```\n-----BEGIN OPENSSH PRIVATE KEY-----\n<paste your key here>\n-----END OPENSSH PRIVATE KEY-----\n```",
)
lo(
    "empty_assignment",
    'PASSWORD=""',
    "password = ''  # set in CI",
    "export PASSWORD=",
    "password: null",
    "password: ~",
    "AZURE_STORAGE_CONNECTION_STRING=\nAZURE_CONTAINER=uploads",
)
lo(
    "placeholder",
    "secret: <%= ENV['SECRET'] %>",
    "PASSWORD={{PASSWORD}}",
    "password: <YOUR_PASSWORD>",
    "token: your-token",
    "AccountKey=<key>;EndpointSuffix=core.windows.net",
    "AccountKey=...;",
    "TWILIO_ACCOUNT_SID=ACxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\nTWILIO_AUTH_TOKEN=your_auth_token",
)

# =============================================================== third batch (logs, code, chat)

hi(
    "pin_en",
    "pin",
    f"PIN — {pin()}",
    f"my PIN is: {pin()}",
    f"PIN -> {pin()}",
    f"the code for the alarm is {pin()}",
    f"Garage door code: {pin()}",
    f"**PIN:** `{pin()}`",
)
hi(
    "pin_foreign",
    "pin",
    f"Die PIN lautet: {pin()}",
    f"Code de la porte : {pin()}",
    f"el código de la puerta es {pin()}",
    f"> Meine PIN: {pin()}\n> bitte löschen",
)
hi(
    "password",
    "password_assignment",
    f"docker login -u deploy -p {password()} registry.example.com",
    f"Server=tcp:sql01.example.net,1433;Database=app;User ID=app;Password={rs(14)};Encrypt=True;",
    f"Driver={{ODBC Driver 18}};Server=db;Uid=sa;Pwd={rs(12)};",
    f"kubectl create secret generic db --from-literal=password={rs(12)}",
    f"2026-12-01 10:22:31 DEBUG connecting with password={rs(12)} to db01",
    f"```yaml\ndatabase:\n  user: app\n  password: {rs(16)}\n```",
    f"ssh root@10.0.0.5, password {rs(6)}{rs(4, string.digits)}",
)
hi(
    "token",
    "token",
    f"Cookie: session={rs(48)}",
    f"2026-12-01T10:22:31Z WARN auth header=Bearer {rs(40)} rejected",
    f"```python\nheaders = {{'Authorization': 'token ghp_{rs(36)}'}}\n```",
    f"xoxp-{rs(10, string.digits)}-{rs(10, string.digits)}-{rs(13, string.digits)}-{rs(32, HEX)}",
)
hi(
    "card_prose",
    "card_number",
    f"- Visa: {grouped(visa())}\n- exp: 10/27",
    f'{{"card": "{visa()}", "exp": "01/28"}}',
    f"payment failed for pan={mastercard()} code=05",
)
hi(
    "ssn_prose",
    "ssn",
    f'{{"name": "{R.choice(NAMES)}", "ssn": "{ssn("")}"}}',
    f"SSN - {ssn()}",
    f"numéro de sécurité sociale américain (SSN) : {ssn()}",
)
lo(
    "plain",
    "postgres://postgres:postgres@localhost:5432/postgres",
    "amqp://guest:guest@rabbitmq:5672/",
    "```python\nfor attempt in range(5):\n    time.sleep(2 ** attempt)\n```",
    "| Month | Revenue | Users |\n|---|---|---|\n| Jan | 12,400 | 1,204 |\n| Feb | 13,950 | 1,388 |",
    "region,units,price\nnorth,4521,19.99\nsouth,3310,21.50",
    "2026-12-01 10:22:31,442 ERROR [worker-3] job 88231 failed after 3 retries (timeout=30s)",
    "Le colis 6A12345678901 arrive mardi, code de suivi dans l'e-mail.",
    "Die Rechnung Nr. 2026-04417 über 1.234,56 € ist fällig.",
    "El vuelo IB3166 sale a las 07:45 de la T4.",
    "Il treno 9512 parte dal binario 14 alle 18:05.",
    "A reunião foi remarcada para 12/12 às 15h, sala 3021.",
    "De bestelling 100234567 is onderweg.",
    "Call +49 170 1234567 or +33 6 12 34 56 78 if it fails.",
    "Merci ! Le code promo BLACKFRIDAY expire le 30/11.",
    "Your one-time code was sent to the phone ending in 0132.",
    "The PIN pad beeped 3 times.",
    "Set GPIO pin 17 high and pin 27 low.",
    "Reset PIN via the app (takes about 2 minutes).",
    "mean 0.4111111111111111, std 0.0123456789",
    "see RFC 7519 (JWT) and RFC 6749 (OAuth 2.0)",
    "the AKIA prefix marks long-term keys, ASIA marks temporary ones",
    "sha256sum dist/app-1.4.2.tar.gz > SHA256SUMS",
    "UUIDs like 3f2504e0-4f89-11d3-9a0c-0305e82c3301 are not secret",
)

write_rows(OUT)
