"""loom.sensitivity on the rule families beyond an English ``password=``: passwords and PINs
in other languages, positional credentials in code, connection strings, traces and HTTP
dumps, HTTP Basic credentials, and the look-alikes of each (foreign placeholders, values
taken from the environment, calls with references, traces without a secret).

The corpus (tests/data/sensitivity_families.jsonl, made by
tests/data/make_sensitivity_families.py) holds hundreds of such turns; the focused tests
below pin each rule. Every secret is made up.
"""

from __future__ import annotations

import base64
import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from loom.sensitivity import KINDS, high_reasons, reads_as_high
from loom.sensitivity_calls import EXPR, NUM, STR, positional_args

CORPUS = Path(__file__).parent / "data" / "sensitivity_families.jsonl"
FAMILIES = ("pw_lang", "pin_lang", "code_positional", "conn_string", "trace_secret", "basic_auth")
LOOK_ALIKES = (
    "lang_plain",
    "placeholder_plain",
    "code_plain",
    "env_reference_plain",
    "trace_plain",
    "basic_plain",
)


def _rows() -> list[dict[str, str]]:
    with CORPUS.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _b64(pair: str) -> str:
    return base64.b64encode(pair.encode()).decode()


# --------------------------------------------------------------------------- the corpus


def test_corpus_covers_every_family_with_hundreds_of_turns() -> None:
    rows = _rows()
    kinds = Counter(r["kind"] for r in rows)
    assert set(kinds) == set(FAMILIES) | set(LOOK_ALIKES), kinds
    assert sum(kinds[k] for k in FAMILIES) >= 400 and sum(kinds[k] for k in LOOK_ALIKES) >= 200
    for r in rows:
        assert (r["label"], r["kind"] in FAMILIES) in (("high", True), ("plain", False)), r["kind"]
        assert (r["reason"] in KINDS) if r["label"] == "high" else r["reason"] == ""


def test_recall_and_false_positive_rate_per_family() -> None:
    per: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # kind -> [count, wrong]
    for i, r in enumerate(_rows()):
        wrong = reads_as_high(r["text"]) != (r["label"] == "high")
        per[r["kind"]][0] += 1
        per[r["kind"]][1] += wrong
        if wrong:
            per[r["kind"]].append(i)  # line numbers only, never the text
    high = sum(per[k][0] for k in FAMILIES), sum(per[k][1] for k in FAMILIES)
    plain = sum(per[k][0] for k in LOOK_ALIKES), sum(per[k][1] for k in LOOK_ALIKES)
    assert 1 - high[1] / high[0] >= 0.98 and plain[1] / plain[0] <= 0.02, dict(per)
    # No family may hide behind the others.
    assert all(wrong / count <= 0.05 for count, wrong, *_ in per.values()), dict(per)


def test_reasons_name_the_shape() -> None:
    wrong = [
        (i, r["reason"], high_reasons(r["text"]))
        for i, r in enumerate(_rows())
        if r["label"] == "high" and r["reason"] not in high_reasons(r["text"])
    ]
    assert wrong == []


# --------------------------------------------------------------------------- positional credentials


@pytest.mark.parametrize(
    "text",
    [
        "$pdo = new PDO('mysql:host=db;dbname=shop', 'root', 'S3cretPw!');",
        'Connection c = DriverManager.getConnection(\n    "jdbc:postgresql://db:5432/app",\n    "app_user",\n    "Pg$ecret2024");',
        'db = MySQLdb.connect("localhost", "root", "Xq9pw2a", "shop")',
        "conn = pymysql.connect('db', 'root', 'Xq9pw2a', 'shop')",  # a host by a short name
        "ssh.connect('10.0.0.5', 22, 'root', 'Xq9pw2a')",  # (host, port, user, password)
        "con = cx_Oracle.connect('scott', 'tiger42', 'localhost/orcl')",
        "r = requests.get(url, auth=('admin', 'Xq9pw2a!'))",
        "smtp.login('alerts@acme.io', 'qwer tyui asdf ghjk')",  # an app password in four groups
        'char[] pw = "Jv4!pass".toCharArray(); new PasswordAuthentication("svc", "Jv4!pass".toCharArray());',
        'client.auth("R3dis!Auth")',
        'ds.setPassword("H1kari#Pool");',
        'props.put("password", "Tiger123");',
        "await page.fill('#password', 'Pl@ywright1')",
        'driver.find_element(By.ID, "password").send_keys("Sel3nium!")',
    ],
)
def test_password_passed_positionally(text: str) -> None:
    assert "password_assignment" in high_reasons(text), text


@pytest.mark.parametrize(
    "text",
    [
        "Connection c = DriverManager.getConnection(url, user, password);",
        'Connection c = DriverManager.getConnection("jdbc:h2:mem:test", "sa", "");',
        'Connection c = DriverManager.getConnection("jdbc:h2:mem:test", "sa", "sa");',  # the user again
        "const sequelize = new Sequelize('database', 'username', 'password', { dialect: 'mysql' });",
        "sock.connect(('localhost', 8080))",
        "client.connect('broker.hivemq.com', 1883, 60)",
        'button.connect("clicked", self.on_click)',
        "keyring.get_password('backup', 'admin')",
        "__slots__ = ('scheme', 'user', 'password', 'host', 'port')",
        "KEYWORDS = ['PASSING', 'PASSWORD', 'PLACING']",
        "t('password', 'Mot de passe')",
        "cy.get('#password').type(Cypress.env('password'))",
    ],
)
def test_calls_without_a_password_literal(text: str) -> None:
    assert not reads_as_high(text), (text, high_reasons(text))


def test_positional_args_reads_literals_numbers_and_expressions() -> None:
    text = """f("a,b", 'it\\'s', 3, g(x, "y"), [1, 2], name="kw", "after")"""
    args = [(a.kind, a.value) for a in positional_args(text, 1) or []]
    assert args == [(STR, "a,b"), (STR, "it\\'s"), (NUM, "3"), (EXPR, 'g(x, "y")'), (EXPR, "[1, 2]")]
    assert positional_args('f("unclosed, 1', 1) is None
    assert positional_args("f()", 1) == []


# --------------------------------------------------------------------------- Basic credentials


@pytest.mark.parametrize(
    "template",
    [
        "Authorization: Basic {b}",
        "map[Accept:[*/*] Authorization:[Basic {b}]]",
        "'authorization': b'Basic {b}'",
        "basic auth string: {b}",
        '{{"auths": {{"ghcr.io": {{"auth": "{b}"}}}}}}',
        "_auth={b}",
        "echo {b} | base64 -d",
    ],
)
def test_basic_credentials_are_decoded(template: str) -> None:
    assert "password_assignment" in high_reasons(template.format(b=_b64("deploy:Tr0ub4dor&3")))


def test_basic_credentials_with_the_newline_echo_leaves() -> None:
    assert reads_as_high("Authorization: Basic " + _b64("deploy:Tr0ub4dor&3\n"))


@pytest.mark.parametrize(
    "pair", ["admin:admin", "user:pass", "username:password", "Aladdin:open sesame", "usuario:tu_contraseña"]
)
def test_basic_placeholders_and_defaults_are_not_secrets(pair: str) -> None:
    assert not reads_as_high("Authorization: Basic " + _b64(pair))


# --------------------------------------------------------------------------- connection strings


@pytest.mark.parametrize(
    "text",
    [
        'db, err := sql.Open("mysql", "root:Xq9pw2a@tcp(127.0.0.1:3306)/shop")',
        "sqlplus system/Oracle_123@//dbhost:1521/ORCLPDB1",
        "jdbc:oracle:thin:scott/tiger42@db:1521:ORCL",
        'could not translate host name "app:Xq9pw2a@db" to address',
        "postgres://app:P@ss2024@db:5432/app",
        "mysql -h db -u root -pR00tPass! shop",
        "sshpass -p 'Ssh!pass9' ssh deploy@10.0.0.8",
        "redis-cli -h cache -a 'R3dis!Auth' INFO",
        "mongo --host m1 -u admin -p 'M0ng0Adm!n' --authenticationDatabase admin",
    ],
)
def test_connection_credentials(text: str) -> None:
    assert "password_assignment" in high_reasons(text), text


@pytest.mark.parametrize(
    "text",
    [
        "DATABASE_URL=postgres://app:${DB_PASSWORD:?DB_PASSWORD must be set}@db:5432/app",
        "POSTGRES_PASSWORD: ${POSTGRES_PASSWORD:?Set POSTGRES_PASSWORD in .env}",
        "DATABASE_URL=postgres://app:${DB_PASSWORD:-postgres}@db/app",
        "Server=db;User Id=app;Password=%DB_PASSWORD%;",
        'password: "$(cat /run/secrets/db_password)"',
        "DB_PASS=`cat /run/secrets/db_pass`",
        "$env:DB_PASSWORD = $(op read op://vault/db/password)",
        "docker run -p 5432:5432 -e POSTGRES_PASSWORD=$POSTGRES_PASSWORD postgres:16",
        "uses: actions/checkout@v4",  # user/x@y without an Oracle word on the line
        "Cc:bob2@acme.io",
        "FUNC:_ZN9__gnu_cxx9__freeresEv@@CXXABI_1.3",
        "image: python:3.12-slim@sha256:4aea012537edfad80f98d870a36e6b90b4c09b27be7f4b4759d72db863baeebb",
        "mysql -u root -p shop",
        "docker run -p 8080:80 nginx",
    ],
)
def test_references_and_look_alikes_are_not_credentials(text: str) -> None:
    assert not reads_as_high(text), (text, high_reasons(text))
