"""loom.sensitivity on the labelled corpus, and focused tests for each shape it generalises to.

The corpus (tests/data/sensitivity_corpus.jsonl, made by tests/data/make_sensitivity_corpus.py)
holds texts with a high shape and look-alikes in many layouts and languages. Every secret in
it and below is random characters in the right shape, or a published test value.
"""

from __future__ import annotations

import base64
import json
import random
import string
import time
from collections import Counter
from pathlib import Path

import pytest
from stdnum import luhn

from loom.sensitivity import KINDS, high_reasons, reads_as_high, window_reads_as_high

CORPUS = Path(__file__).parent / "data" / "sensitivity_corpus.jsonl"
R = random.Random(16)
HEX = "0123456789abcdef"
ALNUM = string.ascii_letters + string.digits


def _rows() -> list[dict[str, str]]:
    with CORPUS.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _rs(n: int, alphabet: str = ALNUM) -> str:
    return "".join(R.choice(alphabet) for _ in range(n))


def _b64(nbytes: int) -> str:
    return base64.b64encode(bytes(R.getrandbits(8) for _ in range(nbytes))).decode()


def _bad_check_digit(card: str) -> str:
    return card[:-1] + str((int(card[-1]) + 1) % 10)


def _card(prefix: str = "4", length: int = 16) -> str:
    body = prefix + _rs(length - len(prefix) - 1, string.digits)
    return body + luhn.calc_check_digit(body)


# --------------------------------------------------------------------------- the corpus


def test_corpus_is_broad_and_well_formed() -> None:
    rows = _rows()
    labels = Counter(r["label"] for r in rows)
    assert labels["high"] >= 300 and labels["plain"] >= 300, labels
    kinds = Counter(r["kind"] for r in rows)
    assert len(kinds) >= 20, kinds
    for r in rows:
        assert r["label"] in ("high", "plain")
        assert (r["reason"] in KINDS) if r["label"] == "high" else r["reason"] == ""
    assert {r["reason"] for r in rows if r["label"] == "high"} == set(KINDS)


def test_corpus_recall_and_false_positive_rate() -> None:
    rows = _rows()
    high = [r for r in rows if r["label"] == "high"]
    plain = [r for r in rows if r["label"] == "plain"]
    missed = [i for i, r in enumerate(rows) if r["label"] == "high" and not reads_as_high(r["text"])]
    flagged = [i for i, r in enumerate(rows) if r["label"] == "plain" and reads_as_high(r["text"])]
    recall = 1 - len(missed) / len(high)
    fpr = len(flagged) / len(plain)
    # Line numbers only (0-based), never the text.
    assert recall >= 0.98, (recall, missed)
    assert fpr <= 0.02, (fpr, flagged)


# Reasons that name the same family: a service's key or token, a PIN given as "senha" (password).
_SAME = {
    "api_key": {"api_key", "token"},
    "token": {"api_key", "token"},
    "pin": {"pin", "password_assignment"},
}


def test_corpus_reasons_name_the_shape() -> None:
    wrong = []
    for i, r in enumerate(_rows()):
        if r["label"] != "high":
            continue
        reasons = set(high_reasons(r["text"]))
        if not reasons & _SAME.get(r["reason"], {r["reason"]}):
            wrong.append((i, r["reason"], sorted(reasons)))
    assert wrong == []


# --------------------------------------------------------------------------- storage account keys


@pytest.mark.parametrize(
    "template",
    [
        "the storage account key1 is {k}",
        "{k}",
        "Key2:\n{k}\n",
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={k};EndpointSuffix=core.windows.net",
        '{{"keyName": "key1", "value": "{k}"}}',
        "az storage blob list --account-key {k}",
    ],
)
def test_storage_account_key(template: str) -> None:
    key = _b64(64)
    assert len(key) == 88 and key.endswith("==")
    assert "api_key" in high_reasons(template.format(k=key))


@pytest.mark.parametrize(
    "template",
    [
        '"integrity": "sha512-{k}"',
        "sha512 digest: {k}",
        "Ed25519 signature {k}",
        "checksum={k}",
    ],
)
def test_same_length_digests_are_not_storage_keys(template: str) -> None:
    assert not reads_as_high(template.format(k=_b64(64)))


def test_storage_key_shape_needs_random_bytes() -> None:
    assert not reads_as_high("A" * 86 + "==")
    assert not reads_as_high(_b64(63))  # 84 characters, one "="
    assert not reads_as_high(_b64(120))  # a longer base64 blob


def test_shared_access_keys_and_sas_signatures() -> None:
    sb = f"Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=Root;SharedAccessKey={_b64(32)}"
    sas = "https://a.blob.core.windows.net/c?sv=2022-11-02&sp=r&sig=" + _b64(32).replace("+", "%2B").replace(
        "/", "%2F"
    )
    assert "api_key" in high_reasons(sb)
    assert "api_key" in high_reasons(sas)
    assert not reads_as_high("AccountKey=<your-account-key>;")


# --------------------------------------------------------------------------- telephony


@pytest.mark.parametrize(
    "template",
    [
        "Twilio account SID {sid} and auth token {tok}",
        "use {sid} / {tok} for the SMS sender",
        "client = Client('{sid}', '{tok}')",
        "creds: {sid}:{tok}",
    ],
)
def test_account_sid_with_its_token(template: str) -> None:
    text = template.format(sid="AC" + _rs(32, HEX), tok=_rs(32, HEX))
    assert "token" in high_reasons(text)


@pytest.mark.parametrize(
    "template",
    [
        "Account SID {sid}",
        "your Account SID starts with AC, e.g. {sid}",
        "POST /2010-04-01/Accounts/{sid}/Messages.json -> 201, message SM{hex}",
        "{sid}. Unrelated: the chunk hash is {hex}",
    ],
)
def test_account_sid_alone_is_an_identifier(template: str) -> None:
    assert not reads_as_high(template.format(sid="AC" + _rs(32, HEX), hex=_rs(32, HEX)))


# --------------------------------------------------------------------------- PINs in other languages


@pytest.mark.parametrize(
    "text",
    [
        "Meine PIN ist 4821",
        "Die PIN für die neue Karte lautet 7305",
        "meine Geheimzahl ist 55123",
        "PIN-Nummer: 0420",
        "mon code PIN est 8642",
        "Le code secret de ma carte est 1357.",
        "mon code confidentiel : 9931",
        "mi PIN es 2468",
        "El código PIN de mi tarjeta es 7412",
        "mi clave del cajero es 3141",
        "il mio PIN è 5926",
        "il codice segreto del bancomat è 535897",
        "o meu PIN é 9323",
        "O PIN do cartão é 8462",
        "mijn pincode is 6433",
        "De pincode van mijn bankpas is 8327",
        "min PIN-kod är 9502",
        "mój PIN to 8841",
        "Tu NIP es 9716",
    ],
)
def test_pin_in_other_languages(text: str) -> None:
    assert high_reasons(text) == ["pin"], text


@pytest.mark.parametrize(
    "text",
    [
        "PIN codes were introduced in 1967",
        "Die PIN wurde 2019 geändert.",
        "Ihre PIN besteht aus 4 Ziffern.",
        "le code PIN est obligatoire depuis 2006",
        "el código postal es 28013",
        "mon code postal est 69003",
        "le code d'erreur est 4031",
        "il CAP è 00184",
        "de pincode moet 5 cijfers hebben",
        "Address: 12 MG Road, Bengaluru, PIN code 560001",
        "my code is 1500 lines long",
        "La clave es 2048 bits",
        "pin the 2026 roadmap",
        "I changed my pin to the new board",
    ],
)
def test_pin_words_without_a_stated_pin(text: str) -> None:
    assert not reads_as_high(text), (text, high_reasons(text))


# --------------------------------------------------------------------------- tables


@pytest.mark.parametrize(
    "template",
    [
        "name,card_number,exp\nAna,{card},04/27\nBo,{card2},11/26",
        "customer\tpan\texpiry\nAna\t{card}\t09/28",
        "| Name | Card | Exp |\n|---|---|---|\n| Ana | {card} | 01/27 |",
        "id;cc;city\n17;{card};Lyon",
        '"holder","credit_card"\n"Ana","{card}"',
        "```\nname   card\nAna    {card}\n```",
    ],
)
def test_card_in_a_table_named_by_its_header(template: str) -> None:
    text = template.format(card=_card(), card2=_card("51"))
    assert "card_number" in high_reasons(text), text


@pytest.mark.parametrize(
    "template",
    [
        "name,ssn,dob\nAna,{ssn},1984-02-11",
        "employee\tsocial\tstate\nAna\t{bare}\tTX",
        "| Employee | SSN |\n|---|---|\n| Ana | {bare} |",
        "first,last,social_security_number\nAna,Li,{ssn}",
        "Sure, here is the export:\nname,ssn\nAna,{bare}",  # an intro sentence holding the delimiter
        "name,ssn\n" + "".join(f"row{i},000-00-0000\n" for i in range(50)) + "Ana,{ssn}",
    ],
)
def test_ssn_in_a_table_named_by_its_header(template: str) -> None:
    text = template.format(ssn="536-90-4399", bare="536904399")
    assert "ssn" in high_reasons(text), text


@pytest.mark.parametrize(
    "text",
    [
        f"order_id,amount\n{_card()},19.99\n{_card()},5.00",
        f"transaction_id\tamount\n{_card('37', 15)}\t12.00",
        "name,employee_no\nAna,536904399",
        "card_last4,exp\n4242,04/27",
        "card,status\nvisa,active",
        "name,ssn\nAna,000-12-3456",
        f"name,card\nAna,{_bad_check_digit(_card())}",  # one digit off: fails Luhn
    ],
)
def test_table_lookalikes(text: str) -> None:
    assert not reads_as_high(text), (text, high_reasons(text))


# --------------------------------------------------------------------------- empty and placeholder values


@pytest.mark.parametrize(
    "text",
    [
        "PASSWORD=",
        "DB_PASSWORD=\nDB_HOST=localhost",
        "password = \nuser = admin",
        "# .env.example\nAPI_KEY=\nSECRET_KEY=\nDATABASE_URL=postgres://localhost/app",
        "[database]\npassword =\nport = 5432",
        "TWILIO_ACCOUNT_SID=\nTWILIO_AUTH_TOKEN=\nTWILIO_FROM=+15550000000",
        "password: <your-password>",
        "PASSWORD=<password>",
        "DB_PASSWORD=changeme",
        "password = your_password_here",
        "API_KEY=xxxx",
        "api_key: '****'",
        "password: ${DB_PASSWORD}",
        "secret: {{ secret }}",
        "token = example",
    ],
)
def test_empty_and_placeholder_values(text: str) -> None:
    assert not reads_as_high(text), (text, high_reasons(text))


def test_an_assignment_on_the_next_line_still_counts() -> None:
    assert high_reasons("DB_PASSWORD=\nDB_USER_PASSWORD=Zq8kL2mP9x") == ["password_assignment"]


# --------------------------------------------------------------------------- PEM bodies


@pytest.mark.parametrize(
    "body", ["<redacted>", "...", "[REDACTED]", "MIIE...", "x" * 64, "(base64 here)", ""]
)
def test_pem_with_redacted_body(body: str) -> None:
    text = f"-----BEGIN RSA PRIVATE KEY-----\n{body}\n-----END RSA PRIVATE KEY-----"
    assert not reads_as_high(text), text


def test_pem_with_key_material() -> None:
    body = "\n".join(_b64(48) for _ in range(4))
    assert high_reasons(f"-----BEGIN PRIVATE KEY-----\n{body}\n-----END PRIVATE KEY-----") == ["private_key"]
    escaped = body.replace("\n", "\\n")
    json_key = f'{{"private_key": "-----BEGIN PRIVATE KEY-----\\n{escaped}\\n-----END PRIVATE KEY-----\\n"}}'
    assert "private_key" in high_reasons(json_key)
    # A header at the end of a text (a paste cut short) still counts.
    assert reads_as_high("here:\n-----BEGIN OPENSSH PRIVATE KEY-----")


# --------------------------------------------------------------------------- other languages' passwords


@pytest.mark.parametrize(
    "text",
    [
        "Passwort: Sx9!kq2Lm",
        "mon mot de passe est Tr0ub4dor&3",
        "la contraseña es Winter2024!",
        "a senha é qz81!Lmx",
        "het wachtwoord is Zq8kL2mP9x",
        "Kennwort: hX7#pp02",
    ],
)
def test_password_in_other_languages(text: str) -> None:
    assert high_reasons(text) == ["password_assignment"], text


@pytest.mark.parametrize(
    "text",
    [
        "Passwort vergessen? Hier klicken",
        "le mot de passe doit contenir 12 caractères",
        "het wachtwoord is verlopen",
        "a senha expira em 90 dias",
    ],
)
def test_password_words_in_other_languages_without_a_value(text: str) -> None:
    assert not reads_as_high(text), (text, high_reasons(text))


def test_window_sees_a_table_header_above_the_shown_part() -> None:
    rows = "\n".join(f"row{i},{_card()}" for i in range(3))
    text = "name,card_number\n" + rows
    assert window_reads_as_high(text, 20, extra=60)


# --------------------------------------------------------------------------- robustness of the new readers


def test_never_raises_on_table_language_and_code_noise() -> None:
    rng = random.Random(5)
    frags = [
        *("password", "PIN", "code", "código", "geheim", "nip", "clave", "ist", "est", "è", "mon", "mi"),
        *("=", ":", "'", '"', "|", ",", ";", "\t", "\n", "  ", "\r", "“", "«", "\\n"),
        *("AC", "SK", "0123456789abcdef" * 2, "4111111111111111", "536-90-4399", "536904399"),
        *("ssn", "card", "pan", "==", "A" * 86, "-----BEGIN PRIVATE KEY-----", "-----END"),
        *("docker login -p", "mysql -p", "Cookie: a=", "://u:p@", "İ", "🙂", string.printable),
        # positional calls, DSNs, Basic credentials, the multilingual lexicon, env references
        *("(", ")", "`", "\\", "@", "/", "$", "{", "}", "%", "-p", "-a", "connect", "getConnection", "login"),
        *("auth", "PDO", "Basic ", "base64", "sqlplus", "tcp(", "Passwort", "wachtwoord", "mot de passe"),
        *("c'est", "mijn", "Zugangsdaten", "wifi", "4821", "Xq9pw2a", "dTp4OTlQdzI=", "${A:?b}", "$(cat x)"),
    ]
    for _ in range(3000):
        text = "".join(rng.choice(frags) for _ in range(rng.randint(0, 30)))
        assert all(r in KINDS for r in high_reasons(text))


@pytest.mark.parametrize(
    "text",
    [
        "order_id,amount\n" + "".join(f"{_card()},1.00\n" for _ in range(3000)),
        "a,b\n" * 20000 + "x,4111111111111111\n",
        "|" * 50000 + "\n4111111111111111|",
        ("AC" + "0" * 32 + " ") * 2000,
        "code " * 20000 + "4821",
        "-----BEGIN PRIVATE KEY-----\n" * 2000,
        "f(" * 30000 + "'a', 'b'",
        "connect('h', 'u', " * 5000,
        ", '" * 30000,
        "a:b@" * 30000,
        "@" * 100000,
        "Basic " * 20000,
        "base64 " * 20000,
        "auth(" * 20000,
        "Passwort ist " * 10000,
        "4821 ist meine PIN " * 5000,
        "-p " * 30000,
    ],
    ids=[
        *("rows", "deep_table", "pipes", "sids", "codes", "pem_headers", "calls", "connects", "commas"),
        *(
            "authorities",
            "ats",
            "basic",
            "base64",
            "auth_calls",
            "foreign_prose",
            "values_before",
            "cli_flags",
        ),
    ],
)
def test_new_readers_stay_bounded(text: str) -> None:
    t0 = time.perf_counter()
    high_reasons(text)
    assert time.perf_counter() - t0 < 5.0
