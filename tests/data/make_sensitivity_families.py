"""Writes tests/data/sensitivity_families.jsonl: a labelled corpus for the rule families of
loom.sensitivity that go beyond an English ``password=`` (run from the repository root:
``python tests/data/make_sensitivity_families.py``; the output is committed).

Families (the ``kind`` of a line; ``*_plain`` kinds are look-alikes that must not read as high):

* ``pw_lang`` / ``pin_lang``: a password, PIN or door code stated in prose in German, Dutch,
  French, Spanish, Portuguese or Italian; the value after the noun (with or without a colon,
  quoted or not) or before it ("Sommer2024! ist mein Passwort"), numeric PINs included.
  ``lang_plain``: prose in those languages that only mentions passwords and PINs (forgotten,
  expired, length rules, dates and versions next to the word).
* ``placeholder_plain``: template values in those languages (tu_contraseña_aquí, dein-passwort).
* ``code_positional``: a driver or client call taking the password positionally (PDO,
  getConnection, MySQLdb/pymysql/mysqli, Sequelize, cx_Oracle, FTP/SMTP/IMAP login,
  HTTPBasicAuth, auth tuples, NetworkCredential, LDAP binds, setters, UI tests filling a
  password field). ``code_plain``: the same calls with references, empty or placeholder
  values, and ordinary calls with literal arguments.
* ``conn_string``: a password in a connection string (key=value segments, a URL authority,
  a DSN without a scheme, Oracle's user/password@db). ``env_reference_plain``: the same with
  the password taken from the environment (``${DB_PASSWORD:?...}``, ``${VAR:-...}``,
  ``%DB_PASSWORD%``, ``$(cat /run/secrets/...)``).
* ``trace_secret``: a stack trace or an HTTP error dump holding a secret (echoed headers, a
  DSN in the message, a locals dump). ``trace_plain``: traces and dumps without one.
* ``basic_auth``: HTTP Basic credentials in base64 in many layouts. ``basic_plain``: Basic
  headers whose user:password is a placeholder or a default, and prose about Basic auth.

Every secret is random or made up for this file; none is real.
"""

from __future__ import annotations

import base64
import random
import string
from pathlib import Path

from corpus_io import hi, lo, write_rows  # beside this script

R = random.Random(46_2026)
OUT = Path(__file__).with_name("sensitivity_families.jsonl")
ALNUM = string.ascii_letters + string.digits


def rs(n: int, alphabet: str = ALNUM) -> str:
    return "".join(R.choice(alphabet) for _ in range(n))


WORDS = {
    "de": ["Sommer", "Hund", "Katze", "Schatz", "Berlin", "Fussball", "Blume", "Apfel"],
    "nl": ["Zomer", "Fiets", "Kaas", "Tulp", "Molen", "Konijn", "Amsterdam", "Appel"],
    "fr": ["Soleil", "Chat", "Paris", "Fromage", "Ete", "Lapin", "Marseille", "Pomme"],
    "es": ["Verano", "Perro", "Gato", "Casa", "Madrid", "Sol", "Playa", "Luna"],
    "pt": ["Verao", "Cachorro", "Gato", "Casa", "Lisboa", "Praia", "Sol", "Bolacha"],
    "it": ["Estate", "Cane", "Gatto", "Casa", "Roma", "Sole", "Mare", "Pizza"],
    "en": ["Summer", "Tiger", "Falcon", "Maple", "Orchid", "Hunter", "Dragon", "Winter"],
}


def password(lang: str = "en") -> str:
    w = R.choice(WORDS[lang])
    return R.choice(
        [
            f"{w}{R.randint(1970, 2026)}!",
            f"{w}#{R.randint(10, 99)}",
            f"{w.lower()}{R.randint(100, 999)}",
            f"{w}_{R.randint(1, 9)}{rs(2, string.ascii_lowercase)}",
            rs(R.randint(9, 14), ALNUM + "!#$%&*"),
            rs(10),
            f"{rs(3)}{w.lower()}{R.randint(10, 99)}",
            f"{w[0]}{rs(6, string.ascii_lowercase)}@{R.randint(0, 9)}",
        ]
    )


def numeric_password() -> str:
    return str(R.randint(10**5, 10**8 - 1))


def pin() -> str:
    while True:
        p = "".join(R.choice(string.digits) for _ in range(R.choice([4, 4, 4, 5, 6])))
        if not (len(p) == 4 and p[:2] in ("19", "20")):
            return p


def quote(v: str) -> str:
    return R.choice([v, v, f'"{v}"', f"'{v}'", f"`{v}`", f"„{v}“", f"«{v}»", f"**{v}**"])


def host() -> str:
    return R.choice(
        ["db", "localhost", "127.0.0.1", "db.internal", "mysql-prod", "10.0.3.17", "pg01.corp.local"]
    )


def user() -> str:
    return R.choice(["root", "admin", "app", "svc_backup", "deploy", "reporting", "jdoe", "sa", "webuser"])


# =============================================================== passwords and PINs in prose

PW_AFTER = {
    "de": [
        "Mein Passwort ist {v}",
        "Das Passwort für das WLAN lautet {v}",
        "das Passwort lautet: {v}",
        "Passwort: {v}",
        "Benutzer: {u}, Passwort {v}",
        "Hier das neue Kennwort: {v}",
        "Das WLAN-Passwort ist {v} – bitte nicht weitergeben.",
        "Zugangsdaten für den Server:\nBenutzername: {u}\nPasswort: {v}",
        "kannst du dich mit {u} und Passwort {v} einloggen?",
        "Das Admin-Kennwort ist jetzt {v}",
    ],
    "nl": [
        "Mijn wachtwoord is {v}",
        "Het wachtwoord van de wifi is {v}",
        "wachtwoord: {v}",
        "Gebruikersnaam {u}, wachtwoord {v}",
        "Het nieuwe wachtwoord wordt {v}",
        "Inloggen met {u} / wachtwoord {v}",
        "Hier is het wachtwoord voor de NAS: {v}",
        "Het paswoord van de router is {v}",
    ],
    "fr": [
        "Mon mot de passe est {v}",
        "Le mot de passe du wifi est {v}",
        "mot de passe : {v}",
        "Identifiant : {u}\nMot de passe : {v}",
        "mdp: {v}",
        "Voici le nouveau mot de passe : {v}",
        "Le mot de passe de la box, c'est {v}",
        "tu peux te connecter avec {u} et le mot de passe {v}",
    ],
    "es": [
        "Mi contraseña es {v}",
        "La contraseña del wifi es {v}",
        "contraseña: {v}",
        "Usuario: {u} / Contraseña: {v}",
        "La clave del router es {v}",
        "te paso la contraseña: {v}",
        "La nueva contraseña será {v}",
        "entra con el usuario {u} y la contraseña {v}",
    ],
    "pt": [
        "A minha senha é {v}",
        "A senha do wi-fi é {v}",
        "senha: {v}",
        "Usuário: {u}\nSenha: {v}",
        "A palavra-passe do servidor é {v}",
        "palavra-passe: {v}",
        "a nova senha foi {v}",
        "entra com {u} e senha {v}",
    ],
    "it": [
        "La mia password è {v}",
        "La password del wifi è {v}",
        "password: {v}",
        "Utente: {u}\nPassword: {v}",
        "la nuova password sarà {v}",
        "ti giro la password: {v}",
        "Accedi con {u} e la password {v}",
        "La password dell'admin è {v}",
    ],
}
PW_BEFORE = {
    "de": [
        "{v} ist mein Passwort",
        "{v} – das ist das neue Passwort für den Router",
        "Nimm {v} als Passwort",
    ],
    "nl": ["{v} is mijn wachtwoord", "{v} is het wachtwoord van de wifi", "Gebruik {v} als wachtwoord"],
    "fr": ["{v} c'est mon mot de passe", "{v} est le mot de passe du wifi", "Mets {v} comme mot de passe"],
    "es": ["{v} es mi contraseña", "{v} es la contraseña del wifi", "Usa {v} como contraseña"],
    "pt": ["{v} é a minha senha", "{v} é a senha do wifi", "Usa {v} como senha"],
    "it": ["{v} è la mia password", "{v} è la password del wifi", "Usa {v} come password"],
}
for lang in PW_AFTER:
    for t in PW_AFTER[lang]:
        for _ in range(2):
            v = R.choice([password(lang), password(lang), numeric_password()])
            hi("pw_lang", "password_assignment", t.format(v=quote(v) if "{v}" in t else v, u=user()))
    for t in PW_BEFORE[lang]:
        for _ in range(2):
            hi("pw_lang", "password_assignment", t.format(v=password(lang)))

# A user and password pair after a "credentials" noun or after both nouns; a Wi-Fi key.
PAIRS = {
    "de": ["Zugangsdaten: {u} / {v}", "Benutzername und Passwort: {u} / {v}", "WLAN-Schlüssel: {v}"],
    "nl": ["inloggegevens: {u} / {v}", "gebruikersnaam/wachtwoord: {u} / {v}", "wifi-sleutel: {v}"],
    "fr": ["Identifiants : {u} / {v}", "identifiant et mot de passe : {u} / {v}", "la clé WiFi est {v}"],
    "es": ["credenciales: {u} / {v}", "usuario y contraseña: {u} / {v}", "clave wifi: {v}"],
    "pt": ["credenciais: {u} / {v}", "usuário e senha: {u} / {v}", "chave do wifi: {v}"],
    "it": ["credenziali: {u} / {v}", "utente e password: {u} / {v}", "chiave wifi: {v}"],
}
for lang, templates in PAIRS.items():
    for t in templates:
        for _ in range(2):
            v = R.choice(
                [f"{R.choice(WORDS[lang])}{R.randint(10, 99)}!", rs(10), f"{rs(4)}#{R.randint(100, 999)}"]
            )
            hi("pw_lang", "password_assignment", t.format(u=user(), v=v))

PIN_AFTER = {
    "de": [
        "Meine PIN ist {p}",
        "Die PIN der Karte lautet {p}",
        "PIN: {p}",
        "Der Türcode ist {p}",
        "Zugangscode: {p}",
        "die Geheimzahl meiner EC-Karte ist {p}",
        "Der Code für den Tresor ist {p}",
        "Der Code ist {p}.",
    ],
    "nl": [
        "Mijn pincode is {p}",
        "De pincode van mijn pas is {p}",
        "pincode {p}",
        "De code van de kluis is {p}",
        "De deurcode is {p}",
        "toegangscode: {p}",
        "De code is {p}.",
    ],
    "fr": [
        "Mon code PIN est {p}",
        "Le code de la porte est {p}",
        "Digicode : {p}",
        "le code est {p}",
        "code secret de la CB : {p}",
        "Le code de l'alarme : {p}",
    ],
    "es": [
        "Mi PIN es {p}",
        "El PIN de la tarjeta es {p}",
        "El código de la puerta es {p}",
        "el código es {p}",
        "código PIN: {p}",
        "La clave del cajero es {p}",
    ],
    "pt": [
        "O meu PIN é {p}",
        "O PIN do cartão é {p}",
        "O código do portão é {p}",
        "o código é {p}",
        "código do alarme: {p}",
        "O código PIN é {p}",
    ],
    "it": [
        "Il mio PIN è {p}",
        "Il PIN del bancomat è {p}",
        "Il codice del cancello è {p}",
        "il codice è {p}",
        "codice PIN: {p}",
        "Il codice dell'allarme è {p}",
    ],
}
PIN_BEFORE = {
    "de": ["{p} ist meine PIN", "{p} ist der Code für die Haustür"],
    "nl": ["{p} is mijn pincode", "{p} is de pincode van de pas"],
    "fr": ["{p} c'est mon code PIN", "{p} est le code PIN de la carte"],
    "es": ["{p} es mi PIN", "{p} es el PIN de la tarjeta"],
    "pt": ["{p} é o meu PIN", "{p} é o PIN do cartão"],
    "it": ["{p} è il mio PIN", "{p} è il PIN della carta"],
}
for lang in PIN_AFTER:
    for t in PIN_AFTER[lang]:
        for _ in range(2):
            hi("pin_lang", "pin", t.format(p=pin()))
    for t in PIN_BEFORE[lang]:
        for _ in range(2):
            hi("pin_lang", "pin", t.format(p=pin()))

lo(
    "lang_plain",
    # German
    "Passwort vergessen? Klicken Sie hier, um es zurückzusetzen.",
    "Das Passwort muss mindestens 12 Zeichen lang sein.",
    "Seit 2020 ist das Passwort alle 90 Tage zu ändern.",
    "Ihr Passwort ist abgelaufen. Bitte wählen Sie ein neues.",
    "Mit Windows 11 ist das Passwort optional, Hello reicht.",
    "Die PIN wurde am 12.03.2024 per Post verschickt.",
    "Ihre PIN besteht aus 4 bis 6 Ziffern.",
    "Nach 3 Fehlversuchen ist die PIN gesperrt.",
    "Der Code 404 bedeutet, dass die Seite fehlt.",
    "Ab Version 2.4 ist das Passwort-Feld Pflicht.",
    "Bitte das Passwort nie per E-Mail schicken.",
    "Unser Passwort-Manager ist Bitwarden.",
    # Dutch
    "Wachtwoord vergeten? Klik op de link in de e-mail.",
    "vergeten wachtwoord? klik op de link",
    "Je wachtwoord is verlopen, kies een nieuw wachtwoord.",
    "Het wachtwoord moet minstens 8 tekens hebben.",
    "In 2019 was het wachtwoord nog maar 6 tekens.",
    "Je pincode is geblokkeerd na 3 pogingen.",
    "De postcode is 1012 AB Amsterdam.",
    "Wij vragen nooit om je pincode.",
    # French
    "Mot de passe oublié ? Cliquez sur le lien.",
    "Votre mot de passe a été modifié le 12/03/2024.",
    "Le mot de passe doit contenir 12 caractères dont un chiffre.",
    "Le code postal est 75011.",
    "Le code d'erreur est 4031, voir la doc.",
    "Depuis 2021 le mot de passe expire tous les 90 jours.",
    "Ne communiquez jamais votre code PIN.",
    "Votre code PIN comporte 4 chiffres.",
    # Spanish
    "cambia tu contraseña cada 90 días",
    "¿Olvidaste tu contraseña? Haz clic aquí.",
    "La contraseña debe tener al menos 8 caracteres.",
    "Tu PIN es personal e intransferible.",
    "El código postal es 28013.",
    "Desde 2022 la contraseña caduca cada 6 meses.",
    "La clave es 2048 bits en la versión nueva.",
    "Nunca compartas tu contraseña con nadie.",
    # Portuguese
    "Esqueceu a senha? Clique aqui.",
    "A senha expira em 90 dias.",
    "A senha deve ter pelo menos 8 caracteres.",
    "O código postal é 1000-001 Lisboa.",
    "O PIN tem 4 dígitos.",
    "Desde 2023 a palavra-passe é obrigatória.",
    "Nunca partilhe o seu PIN.",
    # Italian
    "Hai dimenticato la password? Reimpostala qui.",
    "La password deve avere almeno 10 caratteri.",
    "Il CAP è 00184 Roma.",
    "Dal 2020 la password scade ogni 3 mesi.",
    "Il PIN è personale, non comunicarlo.",
    "Il codice errore è 5003.",
    "Non condividere mai la tua password.",
    "La password è stata cambiata ieri.",
    # pairs and Wi-Fi words without a secret
    "Zugangsdaten: bekommst du per Signal",
    "Benutzername und Passwort: siehe KeePass",
    "credentials: see the 1Password vault 'Ops'",
    "usuario y contraseña: los de siempre",
    "identifiants : demande à Paul / Marie",
    "WLAN: FritzBox-7530, Kanal 11",
    "Der WLAN-Schlüssel steht auf dem Router.",
    "la clé WiFi est sur l'étiquette de la box",
    # mixed: numbers near the words, not values
    "Das Passwort hat 16 Zeichen und wurde 2024 geändert.",
    "Het wachtwoord is 3 keer fout ingevoerd.",
    "Le mot de passe est trop court (8 caractères minimum).",
    "La contraseña es incorrecta, te quedan 2 intentos.",
    "A senha está errada, tente novamente.",
    "La password è sbagliata.",
)

# =============================================================== placeholders in other languages

for name in (
    "password",
    "PASSWORD",
    "DB_PASSWORD",
    "passwort",
    "contraseña",
    "senha",
    "wachtwoord",
    "mot_de_passe",
):
    for value in R.sample(
        [
            "tu_contraseña_aquí",
            "tu-contraseña",
            "TU_CONTRASEÑA",
            "sua_senha_aqui",
            "sua-senha",
            "SUA_SENHA_AQUI",
            "dein-passwort",
            "dein_passwort_hier",
            "DEIN_PASSWORT",
            "ihr_passwort",
            "votre_mot_de_passe",
            "votre-mot-de-passe",
            "VOTRE_MOT_DE_PASSE_ICI",
            "jouw_wachtwoord",
            "jouw-wachtwoord-hier",
            "la_tua_password",
            "tua-password-qui",
            "mi_contraseña",
            "nuova_password",
            "nueva_contraseña",
            "nova_senha",
            "geheim",
            "<tu contraseña>",
            "<ihr-passwort>",
            "{{ contraseña }}",
        ],
        6,
    ):
        sep = R.choice(["=", ": ", " = ", "="])
        q = R.choice(["", '"', "'"])
        lo("placeholder_plain", f"{name}{sep}{q}{value}{q}")

# =============================================================== positional credentials in code


def pw() -> str:
    return password(R.choice(list(WORDS)))


for _ in range(3):
    h, u = host(), user()
    hi(
        "code_positional",
        "password_assignment",
        f"$pdo = new PDO('mysql:host={h};dbname=shop', '{u}', '{pw()}');",
        f'$db = new PDO($dsn, "{u}", "{pw()}", [PDO::ATTR_ERRMODE => PDO::ERRMODE_EXCEPTION]);',
        f'Connection c = DriverManager.getConnection("jdbc:mysql://{h}:3306/app", "{u}", "{pw()}");',
        f'conn = DriverManager.getConnection(url, "{u}", "{pw()}");',
        f'Connection conn = dataSource.getConnection("{u}", "{pw()}");',
        f'db = MySQLdb.connect("{h}", "{u}", "{pw()}", "shop")',
        f"conn = pymysql.connect('{h}', '{u}', '{pw()}', 'inventory')",
        f'$conn = mysqli_connect("{h}", "{u}", "{pw()}", "wordpress");',
        f'$mysqli = new mysqli("{h}", "{u}", "{pw()}", "app");',
        f"const sequelize = new Sequelize('app', '{u}', '{pw()}', {{ host: '{h}', dialect: 'mysql' }});",
        f"con = cx_Oracle.connect('{u}', '{pw()}', '{h}/orcl')",
        f'conn = oracledb.connect("{u}", "{pw()}", "{h}:1521/freepdb1")',
        f"ftp = FTP('ftp.example.com', '{u}', '{pw()}')",
        f"ftp.login('{u}', '{pw()}')",
        f"server.login('{u}@example.com', '{pw()}')",
        f"mail = imaplib.IMAP4_SSL('imap.example.com')\nmail.login('{u}@example.com', '{pw()}')",
        f"r = requests.get(url, auth=('{u}', '{pw()}'))",
        f"resp = requests.post(API, json=payload, auth=HTTPBasicAuth('{u}', '{pw()}'))",
        f"session.auth = ('{u}', '{pw()}')",
        f"creds = pika.PlainCredentials('{u}', '{pw()}')",
        f'var cred = new NetworkCredential("{u}", "{pw()}", "CORP");',
        f"conn.simple_bind_s('cn={u},dc=example,dc=org', '{pw()}')",
        f"ssh.connect('{h}', 22, '{u}', '{pw()}')",
        f'sta_if.connect("HomeWifi", "{pw()}")',
        f'WiFi.begin("HomeWifi", "{pw()}");',
        f'req.SetBasicAuth("{u}", "{pw()}")',
        f'auth := smtp.PlainAuth("", "{u}@example.com", "{pw()}", "smtp.example.com")',
        f"keyring.set_password('backup', '{u}', '{pw()}')",
        f'ds.setPassword("{pw()}");',
        f'props.put("password", "{pw()}");',
        f'props.setProperty("mail.smtp.password", "{pw()}");',
        f'os.environ.setdefault("DB_PASSWORD", "{pw()}")',
        f"await page.fill('#password', '{pw()}')",
        f'driver.find_element(By.ID, "password").send_keys("{pw()}")',
        f"cy.get('input[name=\"password\"]').type('{pw()}')",
        f'redis.auth("{pw()}")',
        f"$response = Http::withBasicAuth('{u}', '{pw()}')->get($url);",
        f'client.login("{u}", "{pw()}")',
    )

lo(
    "code_plain",
    "conn = psycopg.connect(dsn)",
    "conn = mysql.connector.connect(host=host, user=user, password=password)",
    "Connection c = DriverManager.getConnection(url, user, password);",
    "$pdo = new PDO($dsn, $user, $pass);",
    '$pdo = new PDO("sqlite:/var/db/app.sqlite3");',
    'Connection c = DriverManager.getConnection("jdbc:h2:mem:test", "sa", "");',
    'db = MySQLdb.connect("localhost", "root", "", "test")',
    "const sequelize = new Sequelize('database', 'username', 'password', { dialect: 'mysql' });",
    '$conn = mysqli_connect("localhost", "my_user", "my_password", "my_db");',
    "ftp.login('anonymous', 'guest@example.com')",
    "ftp.login()",
    "r = requests.get(url, auth=('user', 'pass'))",
    "r = requests.get(url, auth=(USER, os.environ['API_PASSWORD']))",
    "server.login(user, password)",
    "client.login(username=username, password=password)",
    "sock.connect(('localhost', 8080))",
    "client.connect('broker.hivemq.com', 1883, 60)",
    'button.connect("clicked", self.on_click)',
    'window.connect("destroy", Gtk.main_quit)',
    "sqlite3.connect('app.db')",
    "ws.connect('wss://stream.example.com/v1', 'chat')",
    'mongoose.connect("mongodb://localhost:27017/test", { useNewUrlParser: true })',
    "keyring.get_password('backup', 'admin')",
    "password = keyring.get_password(SERVICE, USERNAME)",
    'cfg.get("database", "password")',
    'props.getProperty("mail.smtp.password")',
    'os.getenv("DB_PASSWORD", "")',
    "await page.fill('#password', process.env.TEST_PASSWORD)",
    'driver.find_element(By.ID, "password").send_keys(PASSWORD)',
    "cy.get('#password').type(Cypress.env('password'))",
    'print("Connecting to", host, "as", user)',
    'logger.info("user %s logged in from %s", user, ip)',
    "assert check('admin', 'Welcome')",
    "t('password', 'Mot de passe')",
    "label = _('Password', 'Passwort')",
    "new NetworkCredential(username, password, domain)",
    "ssh.connect(hostname, username=user, key_filename='/home/me/.ssh/id_ed25519')",
    "WiFi.begin(ssid, password);",
    "conn.simple_bind_s(bind_dn, bind_pw)",
    'json.dumps({"user": "bob", "role": "admin"}, indent=2)',
    'parser.add_argument("--password", help="the password", default=None)',
    'click.option("--password", prompt=True, hide_input=True)',
    "user.set_password(form.cleaned_data['password1'])",
    'self.assertEqual(resp.status_code, 401, "bad password")',
    'raise ValueError("password", "must be at least 12 characters")',
    'User.objects.create_user("alice", "alice@example.com", password)',
)

# =============================================================== connection strings

for _ in range(3):
    h, u = host(), user()
    hi(
        "conn_string",
        "password_assignment",
        f"Server={h};Database=app;User Id={u};Password={pw()};",
        f"Data Source={h};Initial Catalog=Sales;User ID={u};Pwd={pw()};Encrypt=True",
        f"host={h} port=5432 dbname=app user={u} password={pw()} sslmode=require",
        f"postgresql://{u}:{pw()}@{h}:5432/app",
        f"DATABASE_URL=mysql://{u}:{pw()}@{h}/shop",
        f"mongodb+srv://{u}:{pw()}@cluster0.ab1cd.mongodb.net/test?retryWrites=true",
        f'db, err := sql.Open("mysql", "{u}:{pw()}@tcp({h}:3306)/shop?parseTime=true")',
        f'dsn := "{u}:{pw()}@tcp(127.0.0.1:3306)/app"',
        f"jdbc:oracle:thin:{u}/{pw()}@{h}:1521:ORCL",
        f"sqlplus {u}/{pw()}@{h}:1521/orclpdb1",
        f'cx_Oracle.connect("{u}/{pw()}@{h}/orcl")',
        f"amqp://{u}:{pw()}@rabbit.internal:5672/vhost",
        f"redis://default:{pw()}@cache.internal:6379/0",
        f"SQLALCHEMY_DATABASE_URI = 'postgresql+psycopg2://{u}:{pw()}@{h}/analytics'",
        f"spring.datasource.url=jdbc:postgresql://{h}:5432/app?user={u}&password={pw()}",
        f'could not translate host name "{u}:{pw()}@{h}" to address',
    )

for _ in range(2):
    h, u = host(), user()
    lo(
        "env_reference_plain",
        f"DATABASE_URL=postgres://{u}:${{DB_PASSWORD:?DB_PASSWORD must be set}}@{h}:5432/app",
        "DB_PASSWORD=${DB_PASSWORD:?DB_PASSWORD must be set}",
        "POSTGRES_PASSWORD: ${POSTGRES_PASSWORD:?Set POSTGRES_PASSWORD in .env}",
        f"DATABASE_URL=postgres://{u}:${{DB_PASSWORD:-postgres}}@{h}/app",
        "MYSQL_ROOT_PASSWORD: ${MYSQL_ROOT_PASSWORD:-changeme}",
        f"Server={h};User Id={u};Password=%DB_PASSWORD%;",
        f"postgres://{u}:%DB_PASSWORD%@{h}/app",
        'password: "$(cat /run/secrets/db_password)"',
        f"PGPASSWORD=$(cat /run/secrets/pg_password) psql -h {h} -U {u} app",
        "REDIS_URL=redis://:${REDIS_PASSWORD}@redis:6379/0",
        "DB_PASS=`cat /run/secrets/db_pass`",
        "export DB_PASSWORD=$(vault kv get -field=password secret/db)",
        "password: ${{ secrets.DB_PASSWORD }}",
        f"jdbc:postgresql://{h}:5432/app?user={u}&password=${{DB_PASSWORD}}",
        "$env:DB_PASSWORD = $(op read op://vault/db/password)",
        "spring.datasource.password=${SPRING_DATASOURCE_PASSWORD:}",
        "db_password: !Ref DbPassword",
        "Password=@Microsoft.KeyVault(SecretUri=https://kv.vault.azure.net/secrets/db/)",
        "DB_PASSWORD_FILE=/run/secrets/db_password",
        "password = ENC(G6N718UuyPE5bHyWKyuLQSm02auQPUtm)",
    )

# =============================================================== traces and HTTP error dumps


def basic(u: str, p: str, newline: bool = False) -> str:
    return base64.b64encode(f"{u}:{p}{chr(10) if newline else ''}".encode()).decode()


for _ in range(3):
    h, u = host(), user()
    hi(
        "trace_secret",
        "password_assignment",
        'Traceback (most recent call last):\n  File "sync.py", line 41, in <module>\n    r.raise_for_status()\n'
        f"requests.exceptions.HTTPError: 401 Client Error: Unauthorized for url: https://api.example.com/v2/items\n"
        f"request headers: {{'User-Agent': 'python-requests/2.31.0', 'Authorization': 'Basic {basic(u, pw())}'}}",
        'Traceback (most recent call last):\n  File "/app/db.py", line 12, in connect\n'
        f"    engine = create_engine(URL)\nsqlalchemy.exc.OperationalError: (psycopg2.OperationalError) could not "
        f'connect to server\n(Background on this error at: https://sqlalche.me/e/14/e3q8)\nURL was "postgresql://{u}:{pw()}@{h}/app"',
        f'psycopg2.OperationalError: invalid dsn: invalid connection option "sslmod"\nDSN: host={h} user={u} password={pw()} sslmod=require',
        f"panic: dial tcp: lookup {u}:{pw()}@tcp({h}:3306)/shop: no such host\n\ngoroutine 1 [running]:\nmain.main()\n\t/app/main.go:23 +0x1a5",
        f"AxiosError: Request failed with status code 401\n    at settle (/app/node_modules/axios/lib/core/settle.js:19:12)\n  config: {{\n    headers: {{ Accept: 'application/json', Authorization: 'Basic {basic(u, pw())}' }},\n    auth: {{ username: '{u}', password: '{pw()}' }}\n  }}",
        f'org.springframework.web.client.HttpClientErrorException$Unauthorized: 401 Unauthorized\n\tat org.springframework.web.client.DefaultResponseErrorHandler.handleError(DefaultResponseErrorHandler.java:186)\nRequest headers: [Authorization:"Basic {basic(u, pw())}", Accept:"application/json"]',
        f"> GET /api/v1/status HTTP/1.1\n> Host: {h}\n> Authorization: Basic {basic(u, pw())}\n> User-Agent: curl/8.4.0\n>\n< HTTP/1.1 403 Forbidden",
        f"send: b'POST /login HTTP/1.1\\r\\nHost: {h}\\r\\nAuthorization: Basic {basic(u, pw())}\\r\\n\\r\\n'\nreply: 'HTTP/1.1 401 Unauthorized\\r\\n'",
        f"ERROR [main] c.z.h.p.HikariPool - HikariPool-1 - Exception during pool initialization.\njava.sql.SQLException: Cannot create PoolableConnectionFactory (jdbc:mysql://{u}:{pw()}@{h}:3306/app)",
        f'Exception in thread "main" java.lang.RuntimeException: login failed\n\tat com.acme.Db.open(Db.java:42)\nCaused by: connect("{h}", "{u}", "{pw()}")',
        f"redis.exceptions.AuthenticationError: invalid username-password pair\nwhile connecting to redis://default:{pw()}@{h}:6379/0",
        f"Werkzeug Debugger\nFile \"/app/views.py\", line 88, in login\n    user = authenticate(username='{u}', password='{pw()}')\nAttributeError: 'NoneType' object has no attribute 'id'",
        f"kwargs = {{'host': '{h}', 'user': '{u}', 'passwd': '{pw()}', 'db': 'app'}}\npymysql.err.OperationalError: (2003, \"Can't connect to MySQL server on '{h}'\")",
        f'HTTP/1.1 401 Unauthorized\nWWW-Authenticate: Basic realm="api"\n\nRequest was:\nGET /v1/export HTTP/1.1\nProxy-Authorization: Basic {basic(u, pw())}',
        f"DEBUG http.client: header: {{'authorization': b'Basic {basic(u, pw())}', 'accept': b'*/*'}}",
        f'{{"level":"error","msg":"upstream 401","req":{{"headers":{{"authorization":"Basic {basic(u, pw())}"}}}}}}',
    )

lo(
    "trace_plain",
    'Traceback (most recent call last):\n  File "main.py", line 10, in <module>\n    conn = connect(host, user, pw)\n'
    'psycopg2.OperationalError: FATAL:  password authentication failed for user "app"',
    "pymysql.err.OperationalError: (1045, \"Access denied for user 'root'@'localhost' (using password: YES)\")",
    "java.sql.SQLException: Access denied for user 'app'@'172.18.0.3' (using password: YES)",
    "smtplib.SMTPAuthenticationError: (535, b'5.7.8 Username and Password not accepted. Learn more at\\n5.7.8 https://support.google.com/mail/?p=BadCredentials')",
    "System.Data.SqlClient.SqlException (0x80131904): Login failed for user 'sa'.\n   at System.Data.SqlClient.SqlInternalConnectionTds..ctor()",
    "requests.exceptions.HTTPError: 401 Client Error: Unauthorized for url: https://api.example.com/v2/items",
    'HTTP/1.1 401 Unauthorized\nWWW-Authenticate: Basic realm="Restricted", charset="UTF-8"\nContent-Length: 0',
    "> GET / HTTP/1.1\n> Host: example.com\n> User-Agent: curl/8.4.0\n> Accept: */*\n>\n< HTTP/1.1 200 OK",
    "Traceback (most recent call last):\n  File \"app.py\", line 5, in <module>\n    import numpy as np\nModuleNotFoundError: No module named 'numpy'",
    'Exception in thread "main" java.lang.NullPointerException\n\tat com.acme.App.main(App.java:14)',
    "panic: runtime error: index out of range [3] with length 3\n\ngoroutine 1 [running]:\nmain.main()\n\t/app/main.go:8 +0x1d",
    "AxiosError: Request failed with status code 404\n    at settle (/app/node_modules/axios/lib/core/settle.js:19:12)",
    "redis.exceptions.AuthenticationError: Authentication required.",
    "ERROR [main] c.z.h.p.HikariPool - HikariPool-1 - Exception during pool initialization.\njava.sql.SQLNonTransientConnectionException: Could not create connection to database server. Attempted reconnect 3 times.",
    "kwargs = {'host': 'db', 'user': 'app', 'passwd': os.environ['DB_PASSWORD'], 'db': 'app'}",
    'psycopg.OperationalError: connection failed: connection to server at "10.0.3.17", port 5432 failed: Connection refused',
    "ldap.INVALID_CREDENTIALS: {'msgtype': 97, 'msgid': 1, 'result': 49, 'desc': 'Invalid credentials'}",
    "sqlalchemy.exc.ArgumentError: Could not parse SQLAlchemy URL from string 'postgresql://app@db/app'",
    "npm ERR! code E401\nnpm ERR! Unable to authenticate, your authentication token seems to be invalid.",
    "Error: getaddrinfo ENOTFOUND db.internal\n    at GetAddrInfoReqWrap.onlookup [as oncomplete] (node:dns:107:26)",
    "fatal: Authentication failed for 'https://github.com/acme/app.git/'",
    "docker: Error response from daemon: pull access denied for acme/app, repository does not exist or may require 'docker login'.",
)

# =============================================================== Basic auth

for _ in range(3):
    u = user()
    hi(
        "basic_auth",
        "password_assignment",
        f"Authorization: Basic {basic(u, pw())}",
        f"curl -H 'Authorization: Basic {basic(u, pw())}' https://api.example.com/v1/me",
        f"auth: Basic {basic(u, pw())}",
        f"headers = {{'Authorization': 'Basic {basic(u, pw())}'}}",
        f'"Authorization": "Basic {basic(u, pw(), newline=True)}"',
        f"Basic {basic(u, pw())}",
        f"map[Accept:[*/*] Authorization:[Basic {basic(u, pw())}]]",
        f"the header value is Basic {basic(u, pw())} if you need to test it",
        f'{{"auths": {{"registry.example.com": {{"auth": "{basic(u, pw())}"}}}}}}',
        f"_auth={basic(u, pw())}",
        f"HTTP_AUTHORIZATION: 'Basic {basic(u, pw())}'",
        f'req.headers["authorization"] = "Basic {basic(u, pw())}"',
    )

lo(
    "basic_plain",
    "Authorization: Basic <base64(user:pass)>",
    "Authorization: Basic dXNlcm5hbWU6cGFzc3dvcmQ=",  # username:password
    "Authorization: Basic dXNlcjpwYXNz",  # user:pass
    "Authorization: Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==",  # RFC 7617's example
    "Authorization: Basic " + base64.b64encode(b"admin:admin").decode(),
    "Authorization: Basic " + base64.b64encode(b"guest:guest").decode(),
    "Authorization: Basic " + base64.b64encode(b"user:changeme").decode(),
    "Authorization: Basic " + base64.b64encode(b"your_username:your_password").decode(),
    "Authorization: Basic " + base64.b64encode("usuario:tu_contraseña".encode()).decode(),
    "Authorization: Basic ${BASIC_TOKEN}",
    "Authorization: Basic {{ basic_auth }}",
    'WWW-Authenticate: Basic realm="staging"',
    "HTTP Basic authentication sends base64(user:password) on every request.",
    "Use Basic authentication over TLS only.",
    "The basic plan costs 12 dollars per month.",
    "basic_auth = HTTPBasicAuth(username, password)",
    "Visual Basic 6.0 is still in use at some banks",
    "Basic usage: loom serve --home /srv/loom",
    "the Basic scheme (RFC 7617) encodes user-id and password with base64",
    '"auth": "",',
    "auth: ${REGISTRY_AUTH}",
)

write_rows(OUT)
