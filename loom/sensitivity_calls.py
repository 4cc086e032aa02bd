"""Credentials passed positionally in code: which argument of a call is its password.

``new PDO($dsn, 'root', 'S3cret!')``, ``DriverManager.getConnection(url, "sa", "pw")``,
``MySQLdb.connect("localhost", "root", "pw", "shop")``, ``requests.get(url, auth=('u', 'pw'))``,
``ftp.login('user', 'pw')``: a password literal with no name next to it. The calls and the
index of their password argument are data (``credential_calls`` in sensitivity_words.json);
this module finds such calls and reads their arguments. Whether the literal is a secret
(not empty, not a placeholder, not a reference) is loom.sensitivity's call.

Cost: it runs only where a comma is followed by a quote (a literal argument that is not the
first), and looks at the few opening parentheses before it; work per text is bounded.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from loom.sensitivity_words import AFTER_USER, WORDS, CallRule

STR, NUM, EXPR = "str", "num", "expr"


@dataclass(frozen=True)
class Arg:
    kind: str  # STR: one string literal; NUM: a number; EXPR: anything else
    value: str  # the literal's content, or the argument's source text


# A literal argument after a comma: the only place a positional password can be (save a
# one-argument `auth('pw')`, which loom.sensitivity reaches from its "auth" keyword).
_SITE = re.compile(r""",\s*(?:new\s+)?[rbuf@]{0,2}["'`]""")
_MAX_SITES = 32
_REACH = 400  # how far before a site its call may open
_MAX_OPENS = 4  # opening parentheses tried per site
_MAX_CALL = 800  # characters of arguments read
_MAX_ARGS = 12

# (prefix)"literal"(.toCharArray() / .encode() / .getBytes()...)
_LITERAL_ARG = re.compile(
    r"""^[rbuf@]{0,2}(?P<q>["'`])(?P<val>.*)(?P=q)(?:\s*\.\s*\w+\(\s*\))*$""", re.DOTALL
)
_KEYWORD_ARG = re.compile(r"^[A-Za-z_]\w*\s*=(?!=)")
_NUMBER = re.compile(r"^\d+$")
_SPLIT_NAME = re.compile(r"\.|->|::|\\")

# Where a host or connection string goes, and the users people connect as.
_HOST_NAMES = re.compile(
    r"host|dsn|url|uri|server|addr|endpoint|conn|database|\bdb\b|path|broker|cluster", re.I
)
_HOST_WORDS = frozenset(
    {"localhost", "db", "database", "mysql", "mariadb", "redis", "mongo", "mongodb", "sqlserver"}
)


def _callee(text: str, open_at: int) -> str:
    """The name called at text[open_at] == "(" ("db.connect", "PDO"), or the keyword of a
    tuple argument (`auth=('u', 'pw')` -> "auth"); "" when there is none."""
    j = open_at
    lo = max(0, open_at - 80)
    while j > lo and text[j - 1] in " \t":
        j -= 1
    if j > lo and text[j - 1] in "=:" and text[j - 2 : j] not in ("==", "::"):
        j -= 1  # auth=(...) / auth: (...)
        while j > lo and text[j - 1] in " \t":
            j -= 1
    end = j
    while j > lo:
        c = text[j - 1]
        if c.isalnum() or c in "_$.\\":
            j -= 1
        elif c in ">:" and text[j - 2 : j] in ("->", "::"):
            j -= 2
        else:
            break
    return text[j:end].strip(".\\:->")


def call_rule(name: str) -> CallRule | None:
    """The rule for a callee: by its last two dotted parts, then by its last part."""
    parts = [p for p in _SPLIT_NAME.split(name.lower()) if p]
    if not parts:
        return None
    if len(parts) >= 2:
        rule = WORDS.calls.get(".".join(parts[-2:]))
        if rule is not None:
            return rule
    return WORDS.calls.get(parts[-1])


# One token of an argument list: a string literal, a bracket, a comma, a quote left open, or
# a run of anything else (read in one step, so long arguments cost little).
_TOKEN = re.compile(
    r"""(?P<str>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|`(?:[^`\\]|\\.)*`)"""
    r"""|(?P<open>[(\[{])|(?P<close>[)\]}])|(?P<comma>,)|(?P<quote>["'`])|[^"'`()\[\]{},]+""",
    re.DOTALL,
)


def _classify(source: str) -> Arg:
    s = source.strip()
    m = _LITERAL_ARG.match(s)
    if m and _TOKEN.fullmatch(s, m.start("q"), m.end("val") + 1) is not None:
        return Arg(STR, m.group("val"))
    if _NUMBER.match(s):
        return Arg(NUM, s)
    return Arg(EXPR, s)


def positional_args(text: str, open_at: int) -> list[Arg] | None:
    """The positional arguments of the call opening at text[open_at] ("("), up to the first
    keyword argument; None when the call is not closed within the bound."""
    end = min(len(text), open_at + _MAX_CALL)
    args: list[Arg] = []
    depth = 0
    start = open_at + 1
    for tok in _TOKEN.finditer(text, open_at + 1, end):
        kind = tok.lastgroup
        if kind == "quote":
            return None  # a literal not closed on its line
        if kind == "open":
            depth += 1
        elif kind == "close":
            if depth == 0:
                if text[start : tok.start()].strip():
                    args.append(_classify(text[start : tok.start()]))
                return args
            depth -= 1
        elif kind == "comma" and depth == 0:
            source = text[start : tok.start()]
            if _KEYWORD_ARG.match(source.strip()) or len(args) >= _MAX_ARGS:
                return args
            args.append(_classify(source))
            start = tok.end()
    return None


_PORT = re.compile(r":\d{2,5}(?:/|$)")


def _dsn_like(arg: Arg) -> bool:
    """A host/service or a connection string ("localhost/orcl", "db:1521/pdb1", a variable named dsn)."""
    if arg.kind == EXPR:
        return _HOST_NAMES.search(arg.value) is not None
    v = arg.value.lower()
    return arg.kind == STR and (v in _HOST_WORDS or any(c in v for c in "/=;") or _PORT.search(v) is not None)


def _after_user(args: list[Arg]) -> tuple[Arg | None, Arg] | None:
    """(host[, port], user, password, ...) or (user, password[, dsn]): with three arguments or
    more the first is the host, unless the third is (user, password, "host/service")."""
    if len(args) < 2:
        return None
    if len(args) == 2 or _dsn_like(args[2]):
        return args[0], args[1]
    i = 2 if args[1].kind == NUM else 1  # paramiko: (host, port, user, password)
    if i + 1 >= len(args):
        return None
    return args[i], args[i + 1]


@dataclass(frozen=True)
class Candidate:
    password: str
    user: str | None  # the literal user beside it, when there is one
    strict: bool  # the slot is a guess (AFTER_USER, or a one-argument call): ask for a credential look


def _candidate(rule: CallRule, args: list[Arg]) -> Candidate | None:
    if rule == AFTER_USER:
        pair = _after_user(args)
        if pair is None or pair[1].kind != STR:
            return None
        first = pair[0]
        return Candidate(pair[1].value, first.value if first and first.kind == STR else None, True)
    assert isinstance(rule, dict)
    index = rule.get(len(args))
    if index is None or args[index].kind != STR:
        return None
    before = args[index - 1] if index else None
    user = before.value if before is not None and before.kind == STR else None
    return Candidate(args[index].value, user, index == 0)


def call_at(text: str, open_at: int) -> Candidate | None:
    """The password literal of the credential call opening at text[open_at], if it has one."""
    rule = call_rule(_callee(text, open_at))
    if rule is None:
        return None
    args = positional_args(text, open_at)
    return _candidate(rule, args) if args else None


def positional_passwords(text: str) -> Iterator[Candidate]:
    """Password literals passed positionally to the credential calls of `text`."""
    tried: set[int] = set()
    for n, site in enumerate(_SITE.finditer(text)):
        if n >= _MAX_SITES:
            return
        at = site.start()
        lo = max(0, at - _REACH)
        open_at = text.rfind("(", lo, at)
        for _ in range(_MAX_OPENS):
            if open_at < 0:
                break
            if open_at not in tried:
                tried.add(open_at)
                found = call_at(text, open_at)
                if found is not None:
                    yield found
            open_at = text.rfind("(", lo, open_at)
