"""Does a piece of text "read as high"? The one screen the whole codebase calls.

Design doc: a turn whose text holds a *high shape* (a pasted API key, a ``password=``
assignment, a card number, an SSN or a stated PIN) is stored as written but gets no
embedding row, and its text is never sent to the embedder. The same screen is applied to
titles, excerpts, summaries and brief events.

Public API::

    reads_as_high(text) -> bool
    window_reads_as_high(text, shown_chars, extra=1024) -> bool   # checks text[:shown+extra]
    high_reasons(text) -> list[str]   # kinds found, for tests/debug; never the secret itself
    high_spans(text) -> list[tuple[int, int]]   # where: the spans conversation.redact replaces

Kinds: ``api_key``, ``token``, ``private_key``, ``password_assignment``, ``card_number``,
``ssn``, ``pin``.

What it is built on:

* detect-secrets 1.5.0 plugins, used programmatically and without its settings/baseline
  machinery (``analyze_line`` may *verify* secrets over the network; we never call it).
  We take the plugins' compiled ``denylist`` patterns (AWS, GitHub, GitLab, OpenAI, Stripe,
  Slack, JWT, SendGrid, Mailchimp, Square, npm, PyPI, Azure storage, Discord, Telegram,
  private keys, basic-auth URLs) and the KeywordDetector's assignment regexes, then add
  Loom's own filters. Plugins deliberately *not* used on free text:

  - Base64HighEntropyString / HexHighEntropyString: on chat text they flag git commit
    hashes, sha256 digests, UUID-ish ids and base64 blobs, which are look-alikes we must
    not flag. We only borrow their Shannon-entropy function, and only for a value that is
    *assigned to a key-like name* (``token = "..."``, ``Authorization: Bearer ...``).
  - ArtifactoryDetector (``AP[0-9A-F]...`` matches upper-case words such as APACHECAMEL),
    TwilioKeyDetector (an account/key SID alone is an identifier; Loom's own rule below
    wants the SID *with* its secret),
    IPPublicDetector (IP addresses are explicitly not high), IBM/Cloudant/SoftLayer (the
    generic keyword rules already cover their ``*_key = ...`` forms).

* python-stdnum: ``stdnum.luhn`` for card numbers (13-19 digits, card-style grouping,
  plausible issuer prefix) and ``stdnum.us.ssn`` for SSNs (area 000/666/9xx, group 00,
  serial 0000 and the published blacklist are rejected).

* Loom's own rules: Google ``AIza`` keys, OpenAI ``sk-``/``sk-proj-`` and Anthropic
  ``sk-ant-`` keys, Stripe test keys, GitHub fine-grained PATs, the published prefixes of
  other services (Hugging Face ``hf_``, Databricks ``dapi``, DigitalOcean ``dop_v1_``,
  Shopify ``shpat_``, Groq ``gsk_``, webhook ``whsec_``, Mailgun ``key-``, ...),
  bearer/basic Authorization headers, session cookies, ``password is X`` prose, SQL
  ``PASSWORD '...'`` / ``IDENTIFIED BY '...'``, ``mysql -pX`` / ``docker login -p X``, and
  stated PINs ("my PIN is 4821", "pin: 0000", "PIN code 123456").

* Data beside the code: loom/sensitivity_words.json (read by loom/sensitivity_words.py) holds,
  per language, the nouns for a password and a PIN, what a code opens, the verbs meaning
  "is", determiners, owners, prepositions, filler adverbs, "default" words and placeholder
  words; and which argument of which call is a password. loom/sensitivity_calls.py reads
  call arguments. The rules below read the union of the languages.

The shapes, stated as rules (tests/data/sensitivity_corpus.jsonl holds examples of each,
and bench/studies/sensitivity.py scores them per kind):

* A cloud storage account key is 64 random bytes in base64: 88 characters ending in
  ``==``, mixed case and digits. It reads as high anywhere (in prose, in a connection
  string, alone on a line), unless a digest word stands just before it (``sha512``,
  ``integrity``, ``digest``, ``hash``, ``checksum``, ``signature``...): a SHA-512 digest
  and an Ed25519 signature have the same shape. ``AccountKey=`` / ``SharedAccessKey=``
  values and a SAS URL's ``sig=`` read as high at any length.
* A telephony account SID (``AC`` + 32 hex) or API key SID (``SK`` + 32 hex) reads as high
  only with a 32-character secret in the same sentence; alone it is an identifier.
* Passwords and PINs are recognised in every language of the lexicon (English, German,
  Dutch, French, Spanish, Portuguese, Italian; Swedish, Polish, Finnish in part): the noun
  (password, Passwort, Kennwort, wachtwoord, mot de passe, mdp, contraseña, clave, senha,
  palavra-passe; PIN, pincode, Geheimzahl, code PIN, código secreto, digicode), then a
  separator, an arrow or the language's "is" (ist, lautet, est, c'est, es, è, é, is, wordt;
  "changed to" and its translations), a filler adverb at most (übrigens, trouwens,
  maintenant), then the value; or the value first ("Sommer2024! ist mein Passwort", "4821 is
  mijn pincode", "use X as the password") when the noun ends its clause or a preposition
  follows it, with no preposition before the value ("seit 2020 ist das Passwort ...") and
  not in a question. With no operator ("Passwort Sommer2024"), the value must be quoted or
  emphasised, or look made up (letters and digits, or six digits or more). A bare "code"
  counts as a PIN with an owner in another language ("mon code est ..."), a definite article
  in another language and the number ending the clause ("le code est 4821"), or what it
  opens named near it (Türcode, deurcode, garage code, "code de la porte", "die Alarmanlage
  hat den Code 7391"); a number followed by a unit (bits, lines, digits...), a year-like
  number, an Indian six-digit postal "PIN code" in an address, "code postal"/"error code"/
  verification codes, and a PIN called the default one ("the default PIN is 0000") do not count.
* Credentials passed positionally in code: a call the lexicon names (``new PDO(dsn, user,
  pw)``, ``getConnection(url, user, pw)``, ``mysqli_connect``, ``MySQLdb``/``pymysql``
  ``connect(host, user, pw, db)``, ``Sequelize``, ``cx_Oracle.connect(user, pw, dsn)``,
  ``ftp.login``, ``smtp.login``, ``HTTPBasicAuth``, ``auth=(user, pw)``,
  ``NetworkCredential``, ``simple_bind_s``, ``WiFi.begin``...) with a literal in its
  password slot; a password name as a call's argument followed by a literal
  (``props.put("password", ...)``, ``page.fill('#password', ...)``,
  ``find_element(By.ID, "password").send_keys(...)``) or a setter's literal
  (``setPassword("...")``). A reference, an empty string, a placeholder or the user again
  (``"sa", "sa"``) is not a password.
* Connection strings: key=value segments (``Password=``, ``Pwd=``, ``password=`` in a libpq
  DSN), a URL's authority, ``user:pw@host`` without a scheme when the host is one word, an
  IP or has a port or path after it (a Go ``user:pw@tcp(host)/db`` always), Oracle's
  ``user/pw@db`` with an Oracle word on its line, and command lines (``mysql -pX``,
  ``docker login -p X``, ``sshpass -p X``, ``redis-cli -a X``, ``mongo -p X``). The same
  shapes inside stack traces and HTTP dumps (headers echoed in a traceback, a DSN in an
  exception message) read as high like anywhere else.
* HTTP Basic credentials are decoded wherever they appear (after "Basic", an ``auth`` key, or
  next to the word base64): a ``user:password`` pair whose password is not a placeholder, a
  default (``guest``, ``pass``...) or the user again, is a password.
* A card number or SSN in a table (CSV, TSV, Markdown, or columns aligned with spaces)
  reads as high when its cell validates (Luhn and issuer prefix; SSN rules, or a Canadian
  SIN's Luhn) and the header of its column names it (``card``, ``card_number``, ``pan``,
  ``cc``, ``credit_card``, ``Kartennummer``, ``tarjeta``...; ``ssn``, ``social``,
  ``social_security_number``, ``sin``), on a line above it in the block of lines that
  share the row's delimiter. A column called ``order_id`` or ``phone`` does not count.
* Not a value: an empty assignment (``PASSWORD=`` at the end of a line never takes the next
  line as its value), a template slot (``<your-password>``, ``{{ secret }}``, ``${VAR}``,
  ``%s``), a mask (``****``, ``xxxx``, ``...``), a placeholder word (``changeme``,
  ``example``, ``your_password_here``, ``REPLACE_ME``...), a value made of the lexicon's
  placeholder words in any language (``tu_contraseña_aquí``, ``sua_senha_aqui``,
  ``dein-passwort``, ``votre_mot_de_passe``), a reference (``os.environ[...]``), and a value
  taken from the environment or a secret store: ``${DB_PASSWORD:?must be set}``,
  ``${VAR:-default}``, ``%DB_PASSWORD%``, ``$(cat /run/secrets/...)``, backticks,
  ``$env:X``, ``op://...``, ``!Ref``, ``@Microsoft.KeyVault(...)``, ``ENC(...)``; a variable
  used rather than assigned (``-e POSTGRES_PASSWORD=$POSTGRES_PASSWORD``).
* A private key reads as high when the PEM armour has key material under it: a closed block
  needs a line of 16+ base64 characters; a block whose body is ``<redacted>``, ``...``,
  ``MIIE...`` or ``xxxx`` does not. A header at the end of a text (a paste cut short) counts.

Speed: it runs on every append, so the common path avoids full-text regex passes (each
costs tens of microseconds per 2,000 characters in CPython). Ordinary text costs one
``lower()``, one ``str.find`` loop per keyword, two ``bytes.translate`` calls (a digit-class
and a token-class view of the text) searched with ``bytes.find``, and a few substring
tests. The lexicon's word lists are compiled as prefix trees (a flat alternation is tried
branch by branch), and a searched word list has no leading ``\\b`` (it would keep the
engine from skipping ahead by first letter). Call arguments are read only where a comma is
followed by a quote, DSNs without a scheme only at "@" signs. Regexes then run only at those spots: plugin patterns on tokens of 16+ key
characters holding a known prefix, keyword regexes where a keyword is followed by an
operator, card/SSN patterns on digit groups that could be one, the table reader only on
rows holding a 9+ digit number that validates (one walk up to the header per table), the
SID rule only where ``AC``/``SK`` occurs. Cost per turn: see bench/studies/sensitivity.py
and bench/results/ (plain prose and text dense with near-miss shapes, 200 and 2,000
characters). Work per keyword, token or row is bounded, so pathological input stays linear.

Nothing is cached between calls and no state is kept: plugin instances and patterns are
built once at import.
"""

from __future__ import annotations

import base64
import binascii
import csv
import os.path
import re
from collections.abc import Callable, Iterable, Iterator
from re import Match, Pattern
from typing import Any

from detect_secrets.plugins import keyword as _ds_keyword
from detect_secrets.plugins.aws import AWSKeyDetector
from detect_secrets.plugins.azure_storage_key import AzureStorageKeyDetector
from detect_secrets.plugins.basic_auth import BasicAuthDetector
from detect_secrets.plugins.discord import DiscordBotTokenDetector
from detect_secrets.plugins.github_token import GitHubTokenDetector
from detect_secrets.plugins.gitlab_token import GitLabTokenDetector
from detect_secrets.plugins.high_entropy_strings import Base64HighEntropyString
from detect_secrets.plugins.jwt import JwtTokenDetector
from detect_secrets.plugins.mailchimp import MailchimpDetector
from detect_secrets.plugins.npm import NpmDetector
from detect_secrets.plugins.openai import OpenAIDetector
from detect_secrets.plugins.private_key import PrivateKeyDetector
from detect_secrets.plugins.pypi_token import PypiTokenDetector
from detect_secrets.plugins.sendgrid import SendGridDetector
from detect_secrets.plugins.slack import SlackDetector
from detect_secrets.plugins.square_oauth import SquareOAuthDetector
from detect_secrets.plugins.stripe import StripeDetector
from detect_secrets.plugins.telegram_token import TelegramBotTokenDetector
from stdnum import luhn
from stdnum.us import ssn as us_ssn

from loom.sensitivity_calls import Candidate, positional_passwords
from loom.sensitivity_words import WORDS

__all__ = ["KINDS", "high_reasons", "high_spans", "reads_as_high", "window_reads_as_high"]

API_KEY = "api_key"
TOKEN = "token"
PRIVATE_KEY = "private_key"
PASSWORD = "password_assignment"
CARD = "card_number"
SSN = "ssn"
PIN = "pin"
KINDS: tuple[str, ...] = (API_KEY, TOKEN, PRIVATE_KEY, PASSWORD, CARD, SSN, PIN)

_MAX_VALUE = 320  # how far past a keyword we look for its value


# --------------------------------------------------------------------------- helpers

# Shannon entropy over the base64 alphabet, borrowed from detect-secrets (plugin instance
# cached; only its entropy function is used, see the module docstring).
_B64_ENTROPY = Base64HighEntropyString()


def _entropy(value: str) -> float:
    return float(_B64_ENTROPY.calculate_shannon_entropy(value))


def _classes(value: str) -> int:
    """How many of upper / lower / digit the value holds."""
    upper = lower = digit = False
    for ch in value:
        if ch.isdigit():
            digit = True
        elif ch.isupper():
            upper = True
        elif ch.islower():
            lower = True
    return upper + lower + digit


_SEGMENT_SPLIT = re.compile(r"[-_./+:~]")


def _looks_random(value: str, min_len: int = 16) -> bool:
    """A machine-made credential rather than a word, an identifier or a number."""
    if len(value) < min_len or _classes(value) < 2:
        return False
    if _entropy(value) < 3.0:
        return False
    # "my-session-token-value", "Some.Dotted.Name": mostly dictionary-ish segments.
    wordish = 0
    for seg in _SEGMENT_SPLIT.split(value):
        if len(seg) >= 3 and seg.isalpha() and (seg.islower() or seg.istitle() or seg.isupper()):
            wordish += len(seg)
    return wordish * 2 <= len(value)


def _is_alnum_ascii(ch: str) -> bool:
    return ch.isascii() and ch.isalnum()


def _bounded(s: str, start: int, end: int, *, after: bool = True, extra: str = "") -> bool:
    """The match s[start:end] is not glued to more letters/digits (or `extra` chars)."""
    if start > 0:
        prev = s[start - 1]
        if _is_alnum_ascii(prev) or prev in extra:
            return False
    if after and end < len(s):
        nxt = s[end]
        if _is_alnum_ascii(nxt) or nxt in extra:
            return False
    return True


def _lower_same_length(text: str) -> str:
    low = text.lower()
    if len(low) == len(text):
        return low
    # A few characters (e.g. "İ") grow when lower-cased; keep offsets aligned.
    return "".join(c if len(c.lower()) != 1 else c.lower() for c in text)


# --------------------------------------------------------------------------- placeholders

# Values that are not a literal secret: masks, templates, references, types, words that
# commonly follow "password:" in forms and docs.
_PLACEHOLDER_WORDS = frozenset(
    """
    none null nil undefined nan true false yes no on off empty blank n/a na tbd todo tba
    unknown redacted removed hidden masked omitted censored elided secret secrets
    password passwords passwd pass pwd pw passphrase passcode token tokens key keys
    apikey api_key api-key value values string str text int integer bool boolean bytes
    char varchar any object number secretstr securestring example sample dummy
    placeholder changeme change_me change-me changeit foo bar baz foobar qux test
    testing xxx abc required optional mandatory incorrect invalid wrong expired reset
    changed updated same unchanged encrypted hashed set unset protected needed forgotten
    forgot weak strong ok okay default see check use enter entered provided supplied
    stored saved sent generated rotated disabled enabled confidential private sensitive
    field fields manager please must should cannot never always again later here above
    below attached the a an is and or of to for in with your my it this that not only
    also then new old current prompt input hint label leaked compromised missing short
    long too matches match mismatch length minimum maximum min max characters chars
    digits letters symbols policy rules requirements format type reveal show hide
    visible toggle guest user username admin_password login credentials
    """.split()  # noqa: SIM905
)

_PLACEHOLDER_RE = re.compile(
    r"""^(?:
        <[^<>]*>                       # <redacted>, <password>
      | \{\{?[^{}]*\}\}?               # {password}, {{ vault_pw }}
      | \[[^\[\]]*\]                   # [REDACTED]
      | \$\{?[A-Za-z_][\w.:-]*\}?      # $DB_PASS, ${DB_PASS}, ${env:X}
      | %\(?\w*\)?[sd]                 # %s, %(password)s
      | [*•●·∙xX#?._\-]+               # ****, xxxx, ..., ---, ____
      | …+
      | (?:my|your|the|new|old|some|db|database|user|admin|app|example|sample|dummy|fake)
        [_\- ]?(?:pass(?:word|wd|phrase)?|pwd|pw|secret|token|key|api[_\- ]?key)
        (?:[_\- ]?here)?
    )$""",
    re.IGNORECASE | re.VERBOSE,
)
# Anywhere in the (lower-cased) value: substring tests, linear and cheap on long values.
_PLACEHOLDER_PARTS = tuple(
    f"{word}{sep}{tail}"
    for word, tails in (
        ("change", ("me",)),
        ("replace", ("me",)),
        ("fix", ("me",)),
        ("fill", ("me", "in")),
        ("set", ("me",)),
    )
    for tail in tails
    for sep in ("", "_", "-")
) + ("your", "_here", "redacted", "placeholder", "xxxx", "***", "example", "dummy")

_DOTTED_IDENT = re.compile(r"^[A-Za-z_$][\w$]*(?:\??\.[A-Za-z_$][\w$]*)+(?:\(\))?$")
# camelCase: word-like segments (userPassword, dbPass2); wZ4eiXbX914b is random, not a name.
_CAMEL_IDENT = re.compile(r"^[a-z]{2,}(?:[A-Z][a-z]{2,}[0-9]*)+$")
_CONST_IDENT = re.compile(r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+$")
_IDENT = re.compile(r"^[A-Za-z_]\w*$")
_KEYWORDISH = re.compile(
    "|".join(
        ["pass", "pwd", "secret", "token", "key", "cred", "auth", *map(re.escape, WORDS.union("password"))]
    ),
    re.IGNORECASE,
)
_CODE_CHARS = re.compile(r"[()\[\]{}]")
_EMAIL = re.compile(r"^[\w.+-]+@[\w-]+(?:\.[\w-]+)+$")
_URLISH = re.compile(r"^(?:[a-z][a-z0-9+.-]*://|www\.)", re.IGNORECASE)
_PATHISH = re.compile(r"^(?:~?/|\.\.?/|[A-Za-z]:\\)")


# A value made only of these words is a template, in any language the lexicon knows:
# your_password_here, tu_contraseña_aquí, sua_senha_aqui, dein-passwort, votre_mot_de_passe.
_PLACEHOLDER_SEGMENTS = _PLACEHOLDER_WORDS | frozenset(WORDS.union("placeholder"))
_VALUE_SEGMENTS = re.compile(r"[\s_\-.:/'’]+")
# ... or starts with a possessive, or ends with "here", glued with "_" or "-" (tu_clave_segura).
_PLACEHOLDER_HEADS = tuple(
    f"{w}{sep}" for w in WORDS.union("owners") if " " not in w and w not in ("je", "sa", "ma") for sep in "_-"
)
_PLACEHOLDER_TAILS = tuple(
    f"{sep}{w}" for w in ("here", "hier", "ici", "aqui", "aquí", "qui", "qua", "här") for sep in "_-"
)


def _is_placeholder(value: str) -> bool:
    v = value.strip()
    if not v or v.startswith(_TEMPLATE_OPENERS) or _is_env_reference(v):
        return True  # <your-password>, {{ secret }}, ${VAR}: a template slot, even when cut short
    if v[:1] == "%" and _sigil_reference(v):
        return True  # %DB_PASSWORD%
    if v.lower() in _PLACEHOLDER_WORDS:
        return True
    if _PLACEHOLDER_RE.match(v) is not None and not (v[:1] == "$" and _not_a_variable(v[1:])):
        return True
    low = v[:128].lower()
    if "\n" in v:
        return False
    if any(part in low for part in _PLACEHOLDER_PARTS):
        return True
    if _WORDY.fullmatch(low) is None:
        return False  # digits or symbols: not a template made of words
    if low.startswith(_PLACEHOLDER_HEADS) or low.endswith(_PLACEHOLDER_TAILS):
        return True
    return all(seg in _PLACEHOLDER_SEGMENTS for seg in _VALUE_SEGMENTS.split(low) if seg)


_WORDY = re.compile(r"[^\W\d_]+(?:[\s_\-.:/'’]+[^\W\d_]+)*")


def _not_a_variable(name: str) -> bool:
    """$sRTJWYLjauEYn is a password that starts with "$"; $DB_PASS, $dbPassword are variables."""
    return not (name.isupper() or name.islower() or name.istitle() or _CAMEL_IDENT.match(name) or "." in name)


_TEMPLATE_OPENERS = ("<", "{{", "${", "%(", "[[")
# Values that name where the secret is kept rather than hold it: a command substitution, a
# shell/PowerShell/CI variable, a secret store's reference, an encrypted blob.
_REFERENCE_OPENERS = (
    "$(",
    "`",
    "$env:",
    "${env:",
    "env:",
    "((",
    "#{",
    "@microsoft.keyvault(",
    "op://",
    "vault:",
    "secret://",
    "sm://",
    "!ref",
    "!sub",
    "!getatt",
    "arn:aws:secretsmanager",
    "arn:aws:ssm",
    "$__file{",
    "$__env{",
    "enc(",
    "file:",
)
_SECRET_FILES = ("/run/secrets/", "/var/run/secrets/", "/etc/secrets/")


def _is_env_reference(value: str) -> bool:
    if "secrets/" in value and any(path in value for path in _SECRET_FILES):
        return True
    return value[:40].lower().startswith(_REFERENCE_OPENERS)


def _is_reference(value: str, prose: bool = False) -> bool:
    """An unquoted value that is code, not a literal: a variable, a call, a lookup. In prose
    (`prose`) a camelCase word is a password, not a variable."""
    if _CODE_CHARS.search(value) or value.startswith(("|", ">", "-")):
        return True
    if value[:1] in _SIGILS:
        return _sigil_reference(value)
    if _DOTTED_IDENT.match(value) or (not prose and _CAMEL_IDENT.match(value)) or _CONST_IDENT.match(value):
        return True
    # password = user_password / db_pass / getpass: a variable named after the secret.
    return bool(_IDENT.match(value) and not any(c.isdigit() for c in value) and _KEYWORDISH.search(value))


_SIGILS = "$!&*@%"
_SIGIL_NAME = re.compile(r"[A-Za-z_]\w*(?:[.:][A-Za-z_]\w*)*%?")


def _sigil_reference(value: str) -> bool:
    """$DB_PASS, ${X}, $(cmd), %DB_PASSWORD%, !Ref, &cfg, @pw: a sigil before a variable's name.
    $0!T1SaQ6d or %TKccbFcfJRfA is a password that starts with a symbol."""
    rest = value[1:]
    if rest[:1] in "{([":
        return True
    if _SIGIL_NAME.fullmatch(rest) is None:
        return False
    name = re.split(r"[.:%]", rest, maxsplit=1)[0]
    return not _not_a_variable(name)


def _credential_look(value: str) -> bool:
    """Unquoted value that is not just a plain word: it has a digit, a symbol or odd case."""
    if any(c.isdigit() for c in value):
        return True
    if any(not c.isalnum() for c in value):
        return True
    body = value[1:]
    return any(c.isupper() for c in body) and any(c.islower() for c in value)


_TRAILING_PUNCT = ".,;:!?)]}>\"'`*"


def _clean_unquoted(raw: str) -> str:
    v = raw.split(None, 1)[0] if raw.strip() else ""
    v = v.rstrip(_TRAILING_PUNCT)
    return v.lstrip("*_`")


# Name segments that say the value is *about* the secret rather than the secret itself.
_META_SEGMENTS = frozenset(
    """
    reset field fields label prompt hint placeholder policy length len min max minlength
    maxlength timeout ttl expiry expires expiration age url uri endpoint path file
    filename dir env var name id arn ref type kind format regex pattern strength rule
    rules required enabled disabled input text message msg error errors attempts retries
    count limit changed updated created at date time version header param prefix suffix
    size hash hashed digest encrypted visible visibility toggle mask masked show hide
    manager store vault backend provider source location storage mode method algorithm
    algo strategy validator validation widget form column col less protected policy help
    description desc title placeholder confirmation recovery forgot forgotten link page
    template
    """.split()  # noqa: SIM905
)

_CAMEL_SPLIT = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")


def _name_is_meta(name: str) -> bool:
    for part in re.split(r"[_\-.\s]+", name):
        for seg in _CAMEL_SPLIT.findall(part) or [part]:
            if seg.lower() in _META_SEGMENTS:
                return True
    return False


# --------------------------------------------------------------------------- known shapes

# Each shape: kind, patterns (mostly detect-secrets plugin denylists), a validator.
_Validator = Callable[[str, Match[str]], bool]


def _v_bounded(s: str, m: Match[str]) -> bool:
    return _bounded(s, m.start(), m.end(), extra="_")


def _v_prefix_bounded(s: str, m: Match[str]) -> bool:
    return _bounded(s, m.start(), m.end(), after=False)


def _v_aws(s: str, m: Match[str]) -> bool:
    if not _bounded(s, m.start(), m.end()):
        return False
    key = m.group(0)
    # AKIA is unambiguous; the other prefixes begin real upper-case words (ASIAPACIFIC...).
    return key.startswith("AKIA") or any(c.isdigit() for c in key[4:])


def _v_slack(s: str, m: Match[str]) -> bool:
    return _bounded(s, m.start(), m.end(), after=False) and len(m.group(0)) >= 24


def _v_jwt(s: str, m: Match[str]) -> bool:
    tok = m.group(0)
    return (
        _bounded(s, m.start(), m.end(), after=False)
        and "." in tok
        and len(tok) >= 24
        and JwtTokenDetector.is_formally_valid(tok)
    )


def _v_random_tail(s: str, m: Match[str]) -> bool:
    if not _bounded(s, m.start(), m.end(), extra="_-"):
        return False
    return _looks_random(m.group(0).split(":", 1)[-1], 20)


def _v_discord(s: str, m: Match[str]) -> bool:
    return _bounded(s, m.start(), m.end(), extra="_-") and _classes(m.group(0)) == 3


_SK_KEY = re.compile(
    r"sk-(?P<sub>ant-(?:api|admin|sid)\d{2}-|ant-|proj-|svcacct-|admin-|None-)?(?P<tail>[A-Za-z0-9_\-]{20,400})"
)
_HEX = re.compile(r"^[0-9a-f]+$")


def _v_sk(s: str, m: Match[str]) -> bool:
    if m.re is not _SK_KEY:  # detect-secrets' OpenAIDetector (keys carrying the T3BlbkFJ marker)
        return _bounded(s, m.start(), m.end(), extra="_-", after=False)
    if not _bounded(s, m.start(), m.end(), extra="_-"):
        return False
    tail = m.group("tail")
    if _HEX.match(tail) and len(tail) >= 32:
        return True  # sk-<32 hex>: the key shape of several model providers
    min_len = 20 if m.group("sub") else 32
    return len(tail) >= min_len and _classes(tail) == 3 and _looks_random(tail, min_len)


def _v_mailchimp(s: str, m: Match[str]) -> bool:
    return _bounded(s, m.start(), m.end()) and _classes(m.group(0)) >= 2


def _v_azure(s: str, m: Match[str]) -> bool:
    value = m.group(0).split("=", 1)[1]
    return _bounded(s, m.start(), m.end(), after=False) and _classes(value) == 3


def _v_prefixed(s: str, m: Match[str]) -> bool:
    """A published prefix, then a random tail (not a documented x-filled example)."""
    tail = re.split(r"[_.\-]", m.group(0), maxsplit=1)[-1]
    return _bounded(s, m.start(), m.end(), after=False) and _classes(tail) >= 2 and _entropy(tail) >= 3.0


def _plugin(cls: type) -> list[Pattern[str]]:
    return list(cls().denylist)


# name -> (kind, literal triggers, patterns, validator). A long token is tried against a
# shape's patterns only when it contains one of the shape's literal triggers.
_Shape = tuple[str, tuple[str, ...], list[Pattern[str]], _Validator]
_SHAPES: tuple[_Shape, ...] = (
    (API_KEY, ("AKIA", "ASIA", "ABIA", "ACCA", "A3T"), _plugin(AWSKeyDetector)[:1], _v_aws),
    (TOKEN, ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"), _plugin(GitHubTokenDetector), _v_bounded),
    (TOKEN, ("github_pat_",), [re.compile(r"github_pat_[A-Za-z0-9_]{22,}")], _v_prefix_bounded),
    (
        TOKEN,
        (
            "glpat-",
            "gldt-",
            "glft-",
            "glsoat-",
            "glrt-",
            "glcbt-",
            "glimt-",
            "glptt-",
            "glagent-",
            "gloas-",
            "GR1348941",
        ),
        _plugin(GitLabTokenDetector),
        _v_prefix_bounded,
    ),
    (API_KEY, ("sk-",), [_SK_KEY], _v_sk),
    (API_KEY, ("T3BlbkFJ",), _plugin(OpenAIDetector), _v_sk),
    (
        API_KEY,
        ("k_live_", "k_test_"),
        [*_plugin(StripeDetector), re.compile(r"[rs]k_test_[0-9a-zA-Z]{24,}")],
        _v_prefix_bounded,
    ),
    (TOKEN, ("xox", "XOX", "hooks.slack.com/"), _plugin(SlackDetector), _v_slack),
    (API_KEY, ("AIza",), [re.compile(r"AIza[0-9A-Za-z_\-]{35}")], _v_bounded),
    (TOKEN, ("eyJ",), _plugin(JwtTokenDetector), _v_jwt),
    (API_KEY, ("SG.",), _plugin(SendGridDetector), _v_prefix_bounded),
    (API_KEY, ("-us",), _plugin(MailchimpDetector), _v_mailchimp),
    (API_KEY, ("sq0csp-",), _plugin(SquareOAuthDetector), _v_prefix_bounded),
    (API_KEY, ("key-",), [re.compile(r"key-[0-9a-f]{32}")], _v_bounded),  # Mailgun
    # Prefixed keys of other common services (the prefix is the service's published format).
    (
        TOKEN,
        ("hf_", "whsec_", "glc_", "shpat_", "shpss_", "shpca_", "shppa_", "xapp-", "ya29.", "sntrys_", "dp."),
        [
            re.compile(r"hf_[A-Za-z]{34,}"),  # Hugging Face
            re.compile(r"whsec_[A-Za-z0-9+/=]{24,}"),  # webhook signing secrets
            re.compile(r"glc_[A-Za-z0-9+/=_]{32,}"),  # Grafana Cloud
            re.compile(r"shp(?:at|ss|ca|pa)_[a-fA-F0-9]{32}"),  # Shopify
            re.compile(r"xapp-\d-[A-Z0-9]+-\d+-[a-z0-9]{32,}"),  # Slack app-level
            re.compile(r"ya29\.[A-Za-z0-9_\-]{30,}"),  # Google OAuth access token
            re.compile(r"sntrys_[A-Za-z0-9+/=_]{40,}"),  # Sentry
            re.compile(r"dp\.(?:pt|st|sa|ct|scim|audit)\.[A-Za-z0-9]{40,}"),  # Doppler
        ],
        _v_prefixed,
    ),
    (
        API_KEY,
        (
            "dapi",
            "dop_v1_",
            "doo_v1_",
            "dor_v1_",
            "gsk_",
            "pplx-",
            "r8_",
            "PMAK-",
            "NRAK-",
            "lin_api_",
            "ntn_",
            "secret_",
            "xai-",
            "AGE-SECRET-KEY-1",
            "GOCSPX-",
            "ATATT3",
            "sq0atp-",
        ),
        [
            re.compile(r"dapi[0-9a-f]{32}(?:-\d)?"),  # Databricks
            re.compile(r"do[opr]_v1_[a-f0-9]{64}"),  # DigitalOcean
            re.compile(r"gsk_[A-Za-z0-9]{48,}"),  # Groq
            re.compile(r"pplx-[A-Za-z0-9]{40,}"),  # Perplexity
            re.compile(r"r8_[A-Za-z0-9]{37,}"),  # Replicate
            re.compile(r"PMAK-[a-f0-9]{24}-[a-f0-9]{34}"),  # Postman
            re.compile(r"NRAK-[A-Z0-9]{27}"),  # New Relic
            re.compile(r"lin_api_[A-Za-z0-9]{40}"),  # Linear
            re.compile(r"(?:ntn_|secret_)[A-Za-z0-9]{40,50}"),  # Notion
            re.compile(r"xai-[A-Za-z0-9]{60,}"),  # xAI
            re.compile(r"AGE-SECRET-KEY-1[0-9A-Z]{58}"),  # age
            re.compile(r"GOCSPX-[A-Za-z0-9_\-]{28}"),  # Google OAuth client secret
            re.compile(r"ATATT3[A-Za-z0-9_\-=]{100,}"),  # Atlassian
            re.compile(r"sq0atp-[A-Za-z0-9_\-]{22,}"),  # Square access token
        ],
        _v_prefixed,
    ),
    (
        TOKEN,
        ("_authToken=", "npm_"),
        [*_plugin(NpmDetector), re.compile(r"npm_[A-Za-z0-9]{36}")],
        _v_prefix_bounded,
    ),
    (TOKEN, ("pypi-AgE",), _plugin(PypiTokenDetector), _v_prefix_bounded),
    (
        API_KEY,
        ("AccountKey=", "SharedAccessKey=", "sig="),
        [
            *_plugin(AzureStorageKeyDetector),
            re.compile(r"(?:AccountKey|SharedAccessKey)=[A-Za-z0-9+/]{40,86}={0,2}"),
            re.compile(r"(?<=[?&])sig=[A-Za-z0-9%+/]{40,}"),  # a SAS token's signature
        ],
        _v_azure,
    ),
    (TOKEN, (":",), _plugin(TelegramBotTokenDetector), _v_random_tail),
    (TOKEN, (".",), _plugin(DiscordBotTokenDetector), _v_discord),
)

_LONG_TOKEN = 16  # no known key shape is shorter


# One literal-alternation pass over a long token says which shapes to try on it. Telegram
# (digits ':' ...) and Discord (three dot-separated parts) have no literal prefix, so they
# are gated on length and punctuation instead.
_TELEGRAM = len(_SHAPES) - 2
_DISCORD = len(_SHAPES) - 1
_TRIGGER_TO_SHAPE = {lit: i for i, shape in enumerate(_SHAPES[:_TELEGRAM]) for lit in shape[1]}
_TRIGGER = re.compile("|".join(re.escape(lit) for lit in _TRIGGER_TO_SHAPE))


# Patterns run in a window around each trigger, and at most a few windows per shape per
# token, so a pathological token ("sk-sk-sk-...", "eyJeyJ...") costs bounded work.
_BEFORE, _AFTER, _MAX_WINDOWS = 96, 1024, 8


_REPEAT_RUN = re.compile(r"(.)\1{7}")


def _is_filler(secret: str) -> bool:
    """ghp_xxxxxxxx..., AKIAXXXXXXXXXXXXXXXX: a documented shape, not a key."""
    return len(set(secret)) < 10 or _REPEAT_RUN.search(secret) is not None


def _shapes_in_token(tok: str) -> Iterator[str]:
    if tok.isalnum() and "A" not in tok and "dapi" not in tok:
        return  # words, hex digests: only AKIA.../AIza... keys can be bare alphanumerics
    n = len(tok)
    windows: dict[int, tuple[int, int]] = {}  # shape -> (windows used, covered up to)
    spans: list[tuple[int, int, int]] = [
        (_TRIGGER_TO_SHAPE[m.group(0)], m.start(), m.end()) for m in _TRIGGER.finditer(tok)
    ]
    if n >= 44 and ":" in tok:
        spans.append((_TELEGRAM, 0, 0))
    if n >= 59 and tok.count(".") >= 2:
        spans.append((_DISCORD, 0, 0))
    for shape, start, end in spans:
        used, covered = windows.get(shape, (0, -1))
        if used >= _MAX_WINDOWS or end <= covered:
            continue
        if shape >= _TELEGRAM:
            lo, hi = 0, min(n, 4096)
        else:
            lo, hi = max(0, start - _BEFORE), min(n, end + _AFTER)
        windows[shape] = (used + 1, hi - _BEFORE)
        kind, _triggers, patterns, ok = _SHAPES[shape]
        for pat in patterns:
            for m in pat.finditer(tok, lo, hi):
                if ok(tok, m) and not _is_filler(m.group(0)):
                    yield kind
                    break


# A cloud storage account key: 64 random bytes in base64 (88 characters ending in "==").
# SHA-512 digests and Ed25519 signatures have the same shape, so a digest word just before
# the value (or an SRI "sha512-" prefix) makes it one of those instead.
_B64_64 = re.compile(r"(?<![A-Za-z0-9+/\-])[A-Za-z0-9+/]{86}==(?![A-Za-z0-9+/=])")
_DIGEST_CTX = re.compile(
    r"sha-?(?:512|384|256|3)|integrity|digest|checksum|hash|signature|\bsig\b|signed|fingerprint|"
    r"nonce|salt|\biv\b|ed25519|public"
)


def _storage_key(text: str, low: str, at: int, tok: str) -> bool:
    for m in _B64_64.finditer(tok):
        key = m.group(0)
        if _classes(key) < 3 or _is_filler(key):
            continue
        start = at + m.start()
        if _DIGEST_CTX.search(low, max(0, start - 32), start):
            continue
        return True
    return False


# AWS secret access key next to an "aws ... key" name (the plugin's second pattern).
_AWS_SECRET = list(AWSKeyDetector().denylist)[1]


def _scan_aws_secret(text: str) -> Iterator[str]:
    for m in _AWS_SECRET.finditer(text):
        if _classes(m.group(1)) >= 2:
            yield API_KEY
            return


# --------------------------------------------------------------------------- telephony

# A telephony account SID ("AC" + 32 hex) or API key SID ("SK" + 32 hex) is an identifier on
# its own; with a 32-character secret in the same sentence it is a credential pair.
_TEL_SID = re.compile(r"(?:AC|SK)[0-9a-f]{32}(?![0-9A-Za-z])")
_TEL_SECRET = {
    "AC": re.compile(r"(?<![0-9A-Za-z])[0-9a-fA-F]{32}(?![0-9A-Za-z])"),
    "SK": re.compile(r"(?<![0-9A-Za-z])[0-9A-Za-z]{32}(?![0-9A-Za-z])"),
}
_SENTENCE_ENDS = (". ", ".\n", "\n\n", "? ", "! ")


def _sentence(text: str, a: int, b: int, reach: int = 240) -> tuple[int, int]:
    lo, hi = max(0, a - reach), min(len(text), b + reach)
    for end in _SENTENCE_ENDS:
        cut = text.rfind(end, lo, a)
        if cut >= 0:
            lo = cut + len(end)
        cut = text.find(end, b, hi)
        if cut >= 0:
            hi = cut
    return lo, hi


_MAX_SIDS = 64  # SIDs looked at per text: bounded work on a log full of them


def _scan_telephony(text: str) -> Iterator[str]:
    for prefix in ("AC", "SK"):
        i = text.find(prefix)
        seen = 0
        while i >= 0 and seen < _MAX_SIDS:
            m = _TEL_SID.match(text, i)
            if m and (i == 0 or not _is_alnum_ascii(text[i - 1])):
                seen += 1
                lo, hi = _sentence(text, i, m.end())
                for secret in _TEL_SECRET[prefix].finditer(text, lo, hi):
                    value = secret.group(0)
                    if _classes(value) >= 2 and not _is_filler(value) and _entropy(value) >= 3.0:
                        yield TOKEN
                        return
            i = text.find(prefix, i + 2)


# --------------------------------------------------------------------------- private keys

_PRIVATE_KEY_PATTERNS = [
    *_plugin(PrivateKeyDetector),
    re.compile(r"BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY"),
    re.compile(r"PuTTY-User-Key-File-\d"),
]


def _scan_private_key(text: str) -> Iterator[str]:
    for pat in _PRIVATE_KEY_PATTERNS:
        for m in pat.finditer(text):
            if m.group(0).startswith("PuTTY"):
                if text.startswith(":", m.end()):
                    yield PRIVATE_KEY
                    return
                continue
            # The PEM armour ("-----BEGIN ..."), not a prose mention of the header name,
            # and with key material under it (not "<redacted>", "...", "MIIE...").
            if text[max(0, m.start() - 6) : m.start()].rstrip(" ").endswith("---") and _pem_has_body(
                text, m.end()
            ):
                yield PRIVATE_KEY
                return


_B64_PIECE = re.compile(r"[A-Za-z0-9+/=]+")
_PEM_HEADER_LINE = re.compile(r"^[A-Za-z][A-Za-z-]*:")  # Proc-Type:, DEK-Info:, Version:, Comment:


def _pem_has_body(text: str, header_end: int) -> bool:
    """Key material under the armour, not a redacted body ("<redacted>", "...", "MIIE...", "xxxx").

    A closed block needs a line of 16+ base64 characters (real or JSON-escaped newlines). An
    unclosed one (a paste cut short, or a header at the very end) counts when what follows
    the header starts like base64; a marker or prose after it does not.
    """
    start = header_end
    while text.startswith("-", start) and start - header_end < 8:
        start += 1  # the BEGIN line's closing dashes
    stop = text.find("-----", start, start + 8000)  # the END line (or another armour line)
    closed = stop >= 0 and text.startswith("-----END", stop)
    body = text[start : stop if stop >= 0 else start + 8000].replace("\\n", "\n")
    lines = [ln.strip() for ln in body.split("\n")]
    lines = [ln for ln in lines if ln and not _PEM_HEADER_LINE.match(ln)]
    if not closed:
        if not lines:
            return True
        first = lines[0].split()[0]
        return (
            _B64_PIECE.fullmatch(first) is not None and _classes(first) >= 2 and not _REPEAT_RUN.search(first)
        )
    for line in lines:
        for piece in line.split():
            if len(piece) >= 16 and _B64_PIECE.fullmatch(piece) and len(set(piece)) >= 10:
                return True
    return False


# --------------------------------------------------------------------------- basic-auth URLs

_BASIC_AUTH = _plugin(BasicAuthDetector)[0]
_URL_USER_PASSWORD = re.compile(r"://[^\s:/?#\[\]@\"'<>]{1,64}:([^\s/?\[\]@\"'<>]{1,128})@")
_PASSWORD_ONLY_URL = re.compile(r"://:([^\s:/?#\[\]@]+)@")  # redis://:pw@host
_URL_DEFAULTS = frozenset({"guest", "user", "username", "login", "pass", "password", "secret"})


def _scan_url_credentials(text: str) -> Iterator[str]:
    for m in (
        *_BASIC_AUTH.finditer(text),
        *_URL_USER_PASSWORD.finditer(text),
        *_PASSWORD_ONLY_URL.finditer(text),
    ):
        password = m.group(1)
        if _is_placeholder(password) or password.lower() in _URL_DEFAULTS:
            continue
        scheme_end = text.rfind("://", 0, m.start(1))
        if scheme_end >= 0 and text[scheme_end + 3 : m.start(1) - 1] == password:
            continue  # postgres:postgres@, guest:guest@: a default, not a secret
        yield PASSWORD
        return


# user:password@host without a scheme: a Go/MySQL DSN ("app:pw@tcp(db:3306)/shop"), a URL
# pasted without it, an error message quoting one; and Oracle's user/password@db
# (sqlplus, jdbc:oracle:thin:, cx_Oracle.connect("...")).
_BARE_HOST = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][\w.\-]*)")
_IPV4 = re.compile(r"^\d{1,3}(?:\.\d{1,3}){3}$")
_PW_STOP = frozenset(" \t\n\r/:\"'`<>()[]{}\\,;|=")  # "@" may be in it: the last "@" ends it
# URI schemes without "//" and header names that come before "x:y@z" in mail and chat.
_NOT_USERS = frozenset(
    """
    mailto sip sips tel xmpp im skype callto urn git npm pkg docker file http https ssh ftp news geo data
    about cc bcc to from re fw fwd sender mail email contact
    """.split()  # noqa: SIM905
)
_DIGEST_HOSTS = frozenset({"sha1", "sha224", "sha256", "sha384", "sha512", "md5", "blake2b", "blake3"})
_ORACLE_CONTEXT = re.compile(
    r"sqlplus|sqlldr|expdp|impdp|\brman\b|dgmgrl|oracle|oracledb|jdbc:oracle|tnsnames|^\s*(?:sql>\s*)?conn(?:ect)?\b"
)
_MAX_ATS = 64  # "@" signs looked at per text


def _bare_credential_at(text: str, low: str, at: int) -> bool:
    j = at
    lo = max(0, at - 130)
    while j > lo and text[j - 1] not in _PW_STOP:
        j -= 1
    if j == at or j < 2 or text[j - 1] not in ":/" or text[at - 1] == "@":
        return False  # "@@": a versioned symbol (_ZN...Ev@@GLIBCXX_3.4), not a password ending in "@"
    sep, password = text[j - 1], text[j:at]
    u = j - 1
    while u > max(0, j - 66) and (text[u - 1].isalnum() or text[u - 1] in "_.-$#"):
        u -= 1
    user = text[u : j - 1]
    before = text[u - 1 : u]
    if not user or not user[0].isalpha() or before in ("/", "@", ".", "\\", "%", "+", "-"):
        return False  # scheme://user:pw@ is read by _scan_url_credentials; a path; a longer token
    if _is_placeholder(password) or password.lower() in _URL_DEFAULTS or password == user:
        return False
    if sep == "/":
        line_start = text.rfind("\n", 0, u) + 1
        line_end = text.find("\n", at)
        line = low[line_start : line_end if line_end >= 0 else len(low)]
        return _ORACLE_CONTEXT.search(line) is not None and _value_ok(PASSWORD, password, True, "assign", "")
    if before == ":" or user.lower() in _NOT_USERS:
        return False
    if text.startswith(("tcp(", "unix("), at + 1):
        return _value_ok(PASSWORD, password, True, "assign", "")  # Go DSN
    m = _BARE_HOST.match(text, at + 1)
    if m is None or m.group("host").lower() in _DIGEST_HOSTS:
        return False
    host, after = m.group("host"), text[m.end() : m.end() + 2]
    # A mail address has a dotted domain and nothing after it; a DSN's host is one word, an
    # IP, or has a port or a path after it.
    quoted = before in ("'", '"') and after[:1] == before  # "root:pw@pg01.corp.local" as one value
    hostlike = (
        "." not in host
        or _IPV4.match(host) is not None
        or after[:1] == "/"
        or (after[:1] == ":" and after[1:].isdigit())
        or quoted
    )
    if not hostlike or len(password) < 4 or not _credential_look(password) or _VERSION.match(password):
        return False
    return _value_ok(PASSWORD, password, True, "assign", "")


def _scan_bare_authority(text: str, low: str) -> Iterator[str]:
    at = text.find("@", 1)
    for _ in range(_MAX_ATS):
        if at < 0:
            return
        if _bare_credential_at(text, low, at):
            yield PASSWORD
            return
        at = text.find("@", at + 1)


# --------------------------------------------------------------------------- keyword rules

# detect-secrets KeywordDetector regexes: (pattern, quote group, value group, operator kind).
# They match at the keyword itself, so we anchor them (.match) at each keyword hit.
_DS_ASSIGN: tuple[tuple[Pattern[str], int, int, str], ...] = (
    (_ds_keyword.FOLLOWED_BY_COLON_EQUAL_SIGNS_REGEX, 3, 4, "assign"),
    (_ds_keyword.FOLLOWED_BY_EQUAL_SIGNS_REGEX, 4, 5, "assign"),
    (_ds_keyword.FOLLOWED_BY_ARROW_FUNCTION_SIGN_QUOTES_REQUIRED_REGEX, 3, 4, "assign"),
    (_ds_keyword.FOLLOWED_BY_COLON_REGEX, 3, 4, "colon"),
    (_ds_keyword.FOLLOWED_BY_QUOTES_AND_SEMICOLON_REGEX, 2, 3, "assign"),
)

_SEGMENT_START = re.compile(r"(?:^|(?<=[_.\-]))\w|(?<=[a-z])[A-Z]")
# After a name: something that can start an assignment.
_OPERATOR_AHEAD = re.compile(r"""["'\]]{0,2}\s*(?:[=:!(]|=>|["'`])""")


def _has_word(words: Pattern[str], s: str, lo: int = 0, hi: int | None = None) -> bool:
    """`words` (an alternation ending in \\b) occurs in s[lo:hi] as a whole word. The pattern
    has no leading \\b, which would keep the regex engine from skipping ahead by first letter."""
    for m in words.finditer(s, lo, len(s) if hi is None else hi):
        i = m.start()
        if i == 0 or not (s[i - 1].isalnum() or s[i - 1] == "_"):
            return True
    return False


def _alternation(words: Iterable[str]) -> str:
    """A regex alternation of lexicon words, as a prefix tree (the regex engine tries the
    branches of a flat alternation one by one; a tree shares their beginnings). A longer word
    is preferred to its prefix; a space matches any run of spaces; either apostrophe both."""
    trie: dict[str, Any] = {}
    for word in set(words):
        node = trie
        for ch in word.replace("’", "'"):
            node = node.setdefault(ch, {})
        node[""] = {}
    return _trie_pattern(trie)


def _trie_pattern(node: dict[str, Any]) -> str:
    branches = [
        _PIECES.get(ch, re.escape(ch)) + _trie_pattern(child) for ch, child in sorted(node.items()) if ch
    ]
    if not branches:
        return ""
    body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
    return f"(?:{body})?" if "" in node else body


_PIECES = {" ": r"\s+", "'": "['’]"}


# The nouns for "password" in every language of the lexicon (its name in the text, or its root).
_PW_WORDS = WORDS.union("password")
_ROOT_SECRET = re.compile(f"(?:{_alternation(_PW_WORDS)}|pass(?:word|wd|phrase)?|pwd|secret|token|apikey)")
# Nouns holding "pass" further in ("mot de passe", "palavra-passe"): the "pass" keyword finds
# them, and they are read from their first word. (noun, offset of "pass" in it)
_PASS_PHRASES = tuple((w, w.index("pass")) for w in _PW_WORDS if w.find("pass") > 0)
_PASS_NOUNS = tuple(w for w in _PW_WORDS if w.startswith("pass"))


def _search_roots(nouns: Iterable[str]) -> tuple[str, ...]:
    """What the keyword loop looks for to find these nouns: each noun, unless "pass" finds it,
    and forms sharing a 6-character beginning merged into it (contraseña / contrasena)."""
    roots: list[str] = []
    for noun in sorted(nouns, key=len):
        if "pass" in noun or any(r in noun for r in roots):
            continue
        for i, root in enumerate(roots):
            common = len(os.path.commonprefix([root, noun]))
            if common >= 6:
                roots[i] = noun[:common]
                break
        else:
            roots.append(noun)
    return tuple(roots)


_PW_ROOTS = _search_roots(_PW_WORDS)
_PW_KEYWORDS = frozenset({"pass", "pw", *_PW_WORDS, *_PW_ROOTS})


def _name_bounds(text: str, pos: int, end: int) -> tuple[int, int]:
    """The identifier (letters, digits, _ . -) around text[pos:end]."""
    start = pos
    while start > 0 and (text[start - 1].isalnum() or text[start - 1] in "_.-"):
        start -= 1
    while start < pos and text[start] in ".-":
        start += 1
    stop = end
    while stop < len(text) and (text[stop].isalnum() or text[stop] == "_"):
        stop += 1
    return start, stop


def _keyword_tail_ok(text: str, kw_end: int, stop: int) -> bool:
    """password_db / passwordHash / PASSWORD2 are names; passed / secretary / tokenizer are words."""
    if kw_end >= stop:
        return True
    nxt = text[kw_end]
    if nxt in "_-0123456789":
        return True
    if nxt.isupper() and text[kw_end - 1].islower():
        return True  # camelCase: passwordHash
    if text[kw_end - 1].isupper() and nxt.isupper():
        return True  # PASSWORDS / SECRETKEY (upper-case names)
    return text[kw_end:stop].lower() in ("s", "key", "phrase")


def _family(word: str, name: str) -> str:
    if word in _PW_KEYWORDS or "pass" in name or "pwd" in name:
        return PASSWORD
    if "token" in name:
        return TOKEN
    return API_KEY


# "hashed password: 5f4d..." is a digest, not the password.
_PREV_META = re.compile(
    r"(?:hashed|hash|encrypted|salted|masked|redacted|bcrypt|md5|sha1|sha256|sha-256|argon2|scrypt|pbkdf2)[\s_-]+$"
)
# "boarding pass: 12345678" is a ticket.
_PASS_NOUN = re.compile(
    r"(?:boarding|bus|train|rail|ski|season|day|hall|backstage|gym|guest|visitor|museum|park|access|"
    r"all-access|festival|event|parking|transit|travel|e)[\s-]+$"
)


def _short_name_password(text: str, low: str, start: int, pos: int, stop: int) -> bool:
    """`pass: ...` / `pw = ...` / `smtp_pass = ...`: short names, so stricter values."""
    if start < pos and not (text[pos - 1] in "_-." or (text[pos].isupper() and text[pos - 1].islower())):
        return False  # bypass / compass: the keyword is not a segment of the name
    if start == pos and low[pos:stop] == "pass" and _PASS_NOUN.search(low, max(0, pos - 16), pos):
        return False
    m = _OWN_VALUE.match(text, stop, min(len(text), stop + _MAX_VALUE))
    if m is None or m.group("is") or _crosses_line(text, stop, m.start("val")):
        return False
    quoted = bool(m.group("q"))
    value = m.group("val")
    if not quoted:
        value = _clean_unquoted(value)
        if not _credential_look(value):
            return False
    return _value_ok(PASSWORD, value, quoted, "assign", "")


def _value_ok(family: str, value: str, quoted: bool, op: str, rest: str, prose: bool = False) -> bool:
    """Is this literal value a secret? `rest` is the text after the value on its line;
    `prose`: read from a sentence, where a value is never a variable's name."""
    if not quoted:
        value = _clean_unquoted(value)
    # Cheapest rejections first.
    if len(value) < _MIN_LEN[family] or (family == TOKEN and _classes(value) < 2):
        return False
    if not quoted and _is_reference(value, prose):
        return False
    if _is_placeholder(value):
        return False
    if quoted and ("\n" in value or len(value) > 200):
        return False
    if _EMAIL.match(value) or _URLISH.match(value) or _PATHISH.match(value):
        return False
    if family != PASSWORD and any(c.isspace() for c in value):
        return False  # keys and tokens are one word; "Launch on Monday" is prose
    if family == TOKEN:
        return _looks_random(value, 16)
    if family == API_KEY:
        if quoted:
            return _classes(value) >= 2 or len(value) >= 16
        return _looks_random(value, 12) or (_classes(value) == 3 and len(value) >= 8)
    # passwords
    if len(value) < 4:
        return False
    if quoted or op == "assign":
        return True
    if _credential_look(value):
        return True
    if op == "colon":
        # "Wi-Fi password: swordfish" -- a bare word only when it ends the line.
        return not rest.strip(" \t.!*_`")
    return False


_MIN_LEN = {TOKEN: 16, API_KEY: 8, PASSWORD: 4}


def _crosses_line(text: str, a: int, b: int) -> bool:
    """An empty assignment (`PASSWORD=` at the end of a line) takes no value from the next line."""
    return text.find("\n", a, b) >= 0


def _line_rest(text: str, pos: int) -> str:
    nl = text.find("\n", pos, pos + _MAX_VALUE)
    return text[pos : nl if nl >= 0 else min(len(text), pos + 200)]


def _ds_assignments(text: str, starts: list[int], stop: int, family: str) -> bool:
    # The regexes read an unquoted value to the end of its line; a value never spans lines,
    # and 200 characters hold any password or key, so they get no further than that.
    eol = text.find("\n", stop, stop + 200)
    endpos = eol if eol >= 0 else min(len(text), stop + 200)
    for start in starts:
        for pat, qgroup, vgroup, op in _DS_ASSIGN:
            m = pat.match(text, start, endpos)
            if m is None or _crosses_line(text, stop, m.start(vgroup)):
                continue
            quoted = bool(m.group(qgroup))
            raw = m.group(vgroup)
            if quoted:
                value, rest_at = raw, m.end()
            else:
                value = _clean_unquoted(raw)
                rest_at = m.start(vgroup) + raw.find(value) + len(value) if value else m.end(vgroup)
            if _value_ok(family, value, quoted, op, _line_rest(text, rest_at)):
                return True
    return False


# Loom's own operator + value reader (token names, "is" statements, query strings, headers).
_OWN_VALUE = re.compile(
    r"""["'\]]{0,2}[*_]{0,2}
        (?:\s*(?P<op>:=|=>|==|=|:)|\s+(?P<is>is|was|will\s+be)(?:\s*[:=])?)
        [*_]{0,2}\s*(?P<q>["'`]?)(?P<val>[^\s"'`,;&<>(){}\[\]]{1,512})(?P=q)""",
    re.VERBOSE,
)
# The verbs meaning "is" (lexicon), as the operator of a statement: "das Passwort lautet: X".
# "to" is one only in PIN statements ("I changed my PIN to 8642"; Polish "mój PIN to 4821").
_COPULAS = tuple(w for w in WORDS.union("is_words") if w != "to" and "'" not in w and "’" not in w)
_COPULA_HEADS = tuple({w.split()[0] for w in _COPULAS})
_CONTRACTED = tuple(w for w in WORDS.union("is_words") if "'" in w or "’" in w)  # c'est, that's
_OPEN_QUOTES = "\"'`“‘„«‚"
_ANY_QUOTE = "\"'`“”‘’„«»‚"
_FILLERS = WORDS.union("fillers")  # "ist übrigens X", "is trouwens X", "c'est maintenant X"
# "password for the staging db is X", "**Password:** X", "Passwort lautet: X", "senha → X",
# "ich hab das Passwort geändert, es ist jetzt X". Words between the noun and the verb are
# taken lazily, so the first verb whose value is not itself a verb or a filler is the one read.
_PW_PROSE = re.compile(
    rf"""(?P<mid>(?:\s+[^\W\d_][\w@.'’-]*,?){{0,5}}?)(?:\s*\([^()\n]{{1,24}}\))?
        [*_]{{0,2}}\s*(?P<op>=>|->|→|:|=|[–—](?=\s)|\b(?:{_alternation(_COPULAS + _CONTRACTED)})\b(?:\s*:)?)
        (?:\s+(?:{_alternation(_FILLERS)})\b,?)?
        [*_]{{0,2}}\s*(?!(?:{_alternation(_COPULA_HEADS + _FILLERS)})\b)
        (?P<q>[{_OPEN_QUOTES}]?)(?P<val>[^\s{_ANY_QUOTE}]{{1,200}})(?P<q2>[{_ANY_QUOTE}]?)""",
    re.VERBOSE | re.IGNORECASE,
)
# `password Winter2021!`, `wachtwoord **89619361**`, `Passwort «Sommer!»`: no operator.
_PW_BARE = re.compile(
    rf"""[ \t]+(?P<md>[*_]{{0,2}})(?P<q>[{_OPEN_QUOTES}]?)(?P<val>[^\s{_ANY_QUOTE}]{{4,64}})(?P<q2>[{_ANY_QUOTE}]?)(?P=md)"""
    r"""(?=[\s.,;:!?)]|$)"""
)
# Words that follow "password" as a term, not as its value: "hash the password sha256".
_TECH_WORDS = re.compile(
    r"^(?:sha-?\d+|md5|utf-?\d+|base\d+|bcrypt|argon2\w*|pbkdf2\w*|scrypt|aes-?\d+|rsa-?\d+|x509|oauth2|"
    r"ipv[46]|http[s2]?|tls\d*|fido2|totp|hotp|2fa|mfa)$",
    re.IGNORECASE,
)
_COOKIE = re.compile(r"""cookie["']?\s*:\s*(?P<pairs>[^\n]{1,1000})""", re.IGNORECASE)
_COOKIE_PAIR = re.compile(r"""[\w.\-]+=(?P<val>[^;,\s"']{20,})""")


def _cookie_header(text: str, pos: int) -> bool:
    """`Cookie: session=<random>`: a session cookie is a bearer credential."""
    m = _COOKIE.match(text, pos, min(len(text), pos + 1100))
    if m is None:
        return False
    return any(_looks_random(p.group("val"), 20) for p in _COOKIE_PAIR.finditer(m.group("pairs")))


def _bare_password(text: str, stop: int) -> bool:
    """`password Winter2021!`: no operator, so only a value that is quoted or emphasised, or
    looks made up (letters and digits, or six digits or more)."""
    m = _PW_BARE.match(text, stop, min(len(text), stop + 80))
    if m is None:
        return False
    value = m.group("val")
    quoted = bool(m.group("md")) or (bool(m.group("q")) and bool(m.group("q2")))
    if not quoted:
        value = value.rstrip(_TRAILING_PUNCT)
        mixed = any(c.isdigit() for c in value) and any(c.isalpha() for c in value)
        if len(value) < 6 or not (mixed or value.isdigit()):
            return False
    if _VERSION.match(value) or _name_is_meta(value) or _TECH_WORDS.match(value) or _YEAR.match(value):
        return False
    if not quoted and _IMAGE_TAG.match(value):
        return False  # "... POSTGRES_PASSWORD postgres:16": an image, not the value
    return _value_ok(PASSWORD, value, quoted, "assign", "", prose=True)


_IMAGE_TAG = re.compile(r"^[a-z][\w./-]*:[\w.-]+$")


_VERSION = re.compile(r"^v?\d+(?:\.\d+)+")
_SQL_PASSWORD = re.compile(r"""\s+(?:by\s+)?'(?P<val>[^'\n]{1,200})'""", re.IGNORECASE)
_CLI_FLAG = re.compile(r"""[ =](?P<q>["']?)(?P<val>[^\s"']{1,200})(?P=q)""")


def _own_token_value(text: str, stop: int, family: str) -> bool:
    m = _OWN_VALUE.match(text, stop, min(len(text), stop + _MAX_VALUE))
    if m is None or _crosses_line(text, stop, m.start("val")):
        return False
    value = m.group("val")
    if not m.group("q"):
        value = value.rstrip(".")
    op = "prose" if m.group("is") else ("colon" if m.group("op") == ":" else "assign")
    return _value_ok(family, value, bool(m.group("q")), op, "")


# "I changed the password to X", "set the wifi password to X": the verb before the noun.
_CHANGED_TO = re.compile(r"""[ \t]+to[ \t]+[*_]{0,2}(?P<q>["'`“‘]?)(?P<val>[^\s"'`“”‘’]{4,200})""")
_CHANGE_VERB = re.compile(r"\b(?:changed|change|set|reset|updated|update)\b")


def _changed_to(text: str, low: str, start: int, stop: int) -> bool:
    m = _CHANGED_TO.match(text, stop, stop + 220)
    if m is None or not _CHANGE_VERB.search(low, max(0, start - 32), start):
        return False
    value = m.group("val")
    if not m.group("q"):
        value = value.rstrip(_TRAILING_PUNCT)
        if not _credential_look(value):
            return False
    return _value_ok(PASSWORD, value, bool(m.group("q")), "assign", "", prose=True)


def _prose_password(text: str, kw_end: int) -> bool:
    m = _PW_PROSE.match(text, kw_end, min(len(text), kw_end + 300))
    if m is None or _crosses_line(text, kw_end, m.start("val")):
        return False
    mid = m.group("mid").lower().split()
    if any(w.strip("'’") in _PROSE_MID_VETO for w in mid):
        return False
    if "\n" in m.group("mid"):
        return False
    value = m.group("val")
    emphasised = len(value) > 4 and value[:2] in ("**", "__") and value.endswith(value[:2])
    quoted = (bool(m.group("q")) and bool(m.group("q2"))) or emphasised
    if emphasised:
        value = value[2:-2]
    elif not quoted:
        value = value.rstrip(_TRAILING_PUNCT).lstrip("*_`\"'“‘")
    op_word = m.group("op").strip().lower()
    op = "colon" if op_word in _ARROWS else ("assign" if op_word == "=" else "prose")
    rest = _line_rest(text, m.end())
    if op == "prose" and not quoted and not _credential_look(value):
        return False
    if (
        op == "prose"
        and rest[:1] == " "
        and (
            re.match(r"\s+(?:characters?|chars?|digits?|letters?|long)\b", rest)
            or _UNIT_AFTER.match(rest.lower())
        )
    ):
        return False  # "la clave es 2048 bits"
    return _value_ok(PASSWORD, value, quoted, op if op != "prose" else "colon", rest, prose=True)


_ARROWS = (":", "->", "=>", "→", "–", "—")
_PROSE_MID_VETO = _META_SEGMENTS | frozenset(
    """
    must should cannot can can't needs need requires require has have does doesn't isn't
    wasn't must not contains contain includes include expired incorrect invalid wrong
    """.split()  # noqa: SIM905
)

_CURL_USER = re.compile(r"""-u(?:ser)?(?:\s+|=)(?P<q>["']?)[^\s:"']+:(?P<pw>[^\s"']+)(?P=q)""", re.IGNORECASE)
_BEARER = re.compile(r"bearer\s+(?P<val>[A-Za-z0-9_\-.+/=~]{16,})", re.IGNORECASE)
_AUTHZ = re.compile(
    r"""authorization["'\]]?\s*(?:=>|[:=])\s*[\[("'b]{0,3}\s*(?:(?P<scheme>basic|bearer|token|apikey|api-key|key|digest)\s+)?"""
    r"""(?P<val>[A-Za-z0-9_\-.+/=~]{8,})""",
    re.IGNORECASE,
)
# detect-secrets' *_?key names (api_key, auth_key, ...), plus access_key; and their prose forms.
_KEY_PREFIXES = tuple(
    p + sep
    for p in (
        "api",
        "auth",
        "service",
        "account",
        "db",
        "database",
        "priv",
        "private",
        "client",
        "access",
        "encryption",
        "signing",
        "master",
        "secret",
    )
    for sep in ("", "_", "-")
)
_KEY_PROSE_PREFIXES = tuple(p + sep for p in ("api", "access", "secret") for sep in (" ", "-", "_"))


def _basic_credentials(b64: str) -> bool:
    """Base64 of "user:password" (HTTP Basic, a registry's auth) whose password is a secret."""
    try:
        altchars = b"-_" if "-" in b64 or "_" in b64 else None
        raw = base64.b64decode(b64 + "=" * (-len(b64) % 4), altchars=altchars, validate=True)
        decoded = raw.decode("utf-8").rstrip("\r\n")  # `echo "user:pw" | base64` keeps the newline
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return False
    user, sep, password = decoded.partition(":")
    if not sep or not user or not password or not decoded.isprintable():
        return False
    if password == user or password.lower() in _URL_DEFAULTS or password in _RFC_EXAMPLES:
        return False
    return _value_ok(PASSWORD, password, True, "assign", "")


_RFC_EXAMPLES = frozenset({"open sesame"})  # RFC 7617's Aladdin:open sesame


def _authorization(text: str, pos: int) -> bool:
    m = _AUTHZ.match(text, pos, min(len(text), pos + _MAX_VALUE))
    if m is None:
        return False
    scheme = (m.group("scheme") or "").lower()
    value = m.group("val")
    if scheme == "basic":
        return _basic_credentials(value)
    return _looks_random(value, 16)


# ---- PINs

# A PIN noun (English, German, French, Spanish, Italian, Portuguese, Dutch, Swedish, Polish),
# words between it and its verb ("the PIN for the new card", "de mi tarjeta"), a separator or
# a verb meaning "is", then the number.
_PIN_VERB_WORDS = WORDS.union("is_words")
_PIN_VERBS = _alternation(_PIN_VERB_WORDS)
# A PIN noun other than "pin..." (geheimzahl, code PIN, código secreto, digicode), or a code
# named by what it opens: glued (Türcode, deurcode) or not ("garage code", "alarm-code").
_CODE_PLACES = WORDS.union("code_places")
# After the PIN noun: words, then a separator or a verb meaning "is", then the number.
_PIN_TAIL = (
    r"""
        (?P<suffix>[ -]?(?:code|koden|kode|kod|number|nummer|numero|número|no\.?|nr\.?|zahl|\#))?(?:'s|’s)?(?![^\W\d_])
        (?P<mid>(?:\s+(?!(?:"""
    + _alternation(w for w in _PIN_VERB_WORDS if w != "to")
    + r""")\b)[^\W\d_][\w'’-]*){0,6}?)
        \s*(?P<sep>:|=|\#|[-–—]\s|->|→|\b(?:"""
    + _PIN_VERBS
    + r""")\b)?
        (?:\s+(?:el|la|le|il|lo|o|a|het|de|der|die|das)\b)?
        [\s*_`"'“‘(«:]*
        (?P<num>\d{4,8})(?![\w]|[.,:/\-]\d)"""
)
# A PIN noun other than "pin..." (geheimzahl, code PIN, código secreto, digicode).
_PIN_KW = rf"pin|{_alternation(w for w in WORDS.union('pin') if not w.startswith('pin'))}"
_PIN = re.compile(r"(?P<kw>" + _PIN_KW + ")" + _PIN_TAIL, re.IGNORECASE | re.VERBOSE)
# A code named by what it opens, glued or not (Türcode, deurcode, garage code, alarm-code):
# _code_hit has checked the word before "code".
_PLACE_KW = r"[^\W\d_]+(?:-|[\s-]+)?code"
_PLACE_PIN = re.compile(r"(?P<kw>" + _PLACE_KW + ")" + _PIN_TAIL, re.IGNORECASE | re.VERBOSE)
_PIN_MID_VETO = frozenset(
    """
    count counts pitch spacing header headers out layout diameter length width size
    voltage current mapping assignment configuration config mode state chip chips
    connector gpio board socket package field label attempts limit policy retries tries
    expiry expires year this that these those it them message messages comment comments
    post posts note notes tab tabs thread threads issue issues item items doc docs page
    pages tweet chat channel version versions dependency dependencies packages numbering
    entry pad digit digits characters reset
    """.split()  # noqa: SIM905
)
_PIN_OWNER = re.compile(
    r"(?:^|\b)(?:"
    + _alternation(
        [
            *WORDS.union("owners"),
            *WORDS.languages["en"].code_places,
            *("the", "bank", "new", "neue", "old", "sim", "phone", "security", "account"),
            *("voicemail", "backup"),
        ]
    )
    + r")[\s'’s]*$",
    re.IGNORECASE,
)
_DEFAULT_NEAR = re.compile(r"(?:" + _alternation(WORDS.union("defaults")) + r")\b")
_POSTAL_CTX = re.compile(
    r"address|\baddr\b|city|district|\bdist\b|\bstate\b|india|nagar|\broad\b|\brd\b|street|post office|"
    r"delivery|deliver|shipping|courier|locality|colony|village|taluk|tehsil|bangalore|bengaluru|mumbai|"
    r"delhi|chennai|kolkata|hyderabad|pune|karnataka|maharashtra|kerala|gujarat|\bzip\b|postal"
)
_UNIT_AFTER = re.compile(
    r"\s*(?:%|bits?|bytes?|kb|mb|gb|ms|lines?|rows?|loc|chars?|characters?|words?|digits?|times|tries|"
    r"attempts|entries|users|ziffern|stellen|chiffres|caract|dígitos|digitos|cifre|cijfers|tekens|"
    r"euros?|eur|usd|dollars?|\$|€)\b"
)
_PIN_CHANGED = re.compile(r"\b(?:changed|change|set|reset|updated|update)\b")
_ELECTRONICS = re.compile(
    r"gpio|chip|header|connector|pinout|arduino|raspberry|breadboard|pcb|solder|wire|voltage|"
    r"socket|bga|mcu|microcontroller|resistor|jumper|\bled\b"
)


def _stated_pin(text: str, low: str, pos: int, statement: Pattern[str] = _PIN) -> bool:
    m = statement.match(text, pos, min(len(text), pos + 200))
    if m is None:
        return False
    mid = m.group("mid")
    if "\n" in mid or any(w.lower().strip("'’") in _PIN_MID_VETO for w in mid.split()):
        return False
    if len(m.group("num")) == 6 and _POSTAL_CTX.search(low, max(0, pos - 80), m.end() + 80):
        return False  # an Indian postal "PIN code" is six digits in an address
    if _UNIT_AFTER.match(low, m.end()):
        return False  # "the key is 2048 bits", "PIN pad holds 1000 entries"
    sep = (m.group("sep") or "").strip().lower()
    if sep == "to":
        # "I changed my PIN to 8642", "mój PIN to 4821"; not "pin the release to 2025".
        if mid.strip():
            return False
        year = len(m.group("num")) == 4 and m.group("num")[:2] in ("19", "20")
        return not year or _PIN_CHANGED.search(low, max(0, pos - 24), pos) is not None
    if mid.strip() and not sep:
        return False
    kw = m.group("kw")
    if not sep and not m.group("suffix") and kw.lower() in ("pin", "nip", "clave"):
        # "PIN 4821" / "my pin 4821"; but "pin 2024 goals" (the verb) and "GPIO pin 1234" are not.
        before = text[max(0, pos - 24) : pos]
        if not (kw.isupper() or _PIN_OWNER.search(before)):
            return False
        if _ELECTRONICS.search(low, max(0, pos - 40), pos):
            return False
    # "the default PIN is 0000", "el PIN por defecto es 0000": documented, not a secret.
    return not _has_word(_DEFAULT_NEAR, low, max(0, pos - 24), m.start("num"))


# Keywords that start a PIN noun other than "pin" and "code": (where the phrase starts,
# relative to the hit; what must follow for it to be one). "número secreto" is reached from
# the "secret" keyword, "code" and "codice" from "cod".
_PIN_NOUN_STARTS: dict[str, tuple[int, tuple[str, ...]]] = {
    "geheim": (0, ("geheimzahl", "geheimnummer", "geheimcode")),
    "nip": (0, ("nip",)),
    "clave": (0, ("clave",)),
    "digo": (-2, ("código", "codigo")),
}
# A PIN noun where it starts ("PIN-Code", "code PIN", "Türcode"): where the noun ends.
_PIN_NOUN = re.compile(
    rf"(?:{_PIN_KW}|{_PLACE_KW}|n[úu]mero\s+secreto)(?:[ -]?(?:code|koden|kode|kod|number|nummer|numero|número|zahl))?",
    re.IGNORECASE,
)

# "mon code est 4821", "code de la carte bleue : 4821": a bare "code" is a PIN only when its
# owner is named just before it or a card word sits between it and the number.
_PIN_VERBS_NOT_TO = _alternation(w for w in _PIN_VERB_WORDS if w != "to")
_CODE_STATED = re.compile(
    r"""(?:code|codice|c[óo]digo)(?![^\W\d_])
        (?P<mid>(?:\s+(?!(?:"""
    + _PIN_VERBS_NOT_TO
    + r""")\b)[^\W\d_][\w'’-]*){0,5}?)
        \s*(?::|=|\b(?:"""
    + _PIN_VERBS
    + r""")\b)(?:\s+(?:el|la|le|il|lo|o|a|het|de)\b)?\s*[*"'«]*\s*
        (?P<num>\d{4,8})(?![\w]|[.,:/\-]\d)""",
    re.IGNORECASE | re.VERBOSE,
)
_CODE_OWNER = re.compile(r"(?:^|\b)(?:" + _alternation(WORDS.without("owners", "en")) + r")\s+$")
# "le code est 4821", "der Code ist 4821", "o código é 4821": the code, in another language,
# stated as the clause's last word. (English "the code is ..." is too often source code.)
_CODE_ARTICLE = re.compile(r"(?:^|\b)(?:le|der|den|de|het|el|o|il)\s+$")
# What a code opens, in every language (a card, a door, a safe, an alarm).
_CARD_WORDS = re.compile(
    "(?:" + _alternation([*_CODE_PLACES, "geldautomaat", "débito", "debito", "crédito", "credito"]) + r")\b"
)
_CODE_VETO = re.compile(
    r"postal|promo|zip|error|erreur|fehler|errore|país|pais|barras|área|area|fiscal|verif|confirm|sms|"
    r"activation|activación|réduction|descuento|sconto|rabatt|source|status|http|exit|retour|produit|"
    r"product|produto|producto|article|artículo|cliente|client|commande|pedido|ordine|order"
)
_CODE_GLUED = frozenset(WORDS.union("code_prefixes")) | frozenset(w for w in _CODE_PLACES if " " not in w)


def _foreign_pin_hit(text: str, low: str, word: str, pos: int) -> str | None:
    shift, phrases = _PIN_NOUN_STARTS[word]
    start = pos + shift
    if start < 0 or not low.startswith(phrases, start):
        return None
    if start > 0 and low[start - 1].isalpha():
        return None
    end = start + len(word) - shift
    if word in ("nip", "clave") and end < len(low) and low[end].isalpha():
        return None
    return _pin_noun_hit(text, low, start, end, word == "digo")


def _pin_noun_hit(
    text: str, low: str, start: int, end: int, is_code: bool, place: bool = False
) -> str | None:
    """A PIN noun at text[start:end]: its number after it, or before it ("4821 ist meine PIN").
    `is_code`: a bare "code" (its owner or what it opens may make it one); `place`: a code
    named by what it opens (Türcode, garage code)."""
    statement = _PLACE_PIN if place else _PIN
    if _DIGIT_RUN4.search(text, end, end + 120) is not None and (
        _stated_pin(text, low, start, statement) or (is_code and _stated_code(text, low, start))
    ):
        return PIN
    if (
        _word_before(low, start) not in _BEFORE_NOUN
        or _DIGIT_RUN4.search(text, max(0, start - 100), start) is None
    ):
        return None  # most mentions: no determiner or verb before the noun, or no number
    if is_code and _CODE_VETO.search(_word_after(low, end)):
        return None  # "el código postal", "le code d'erreur"
    word_end = end
    while word_end < len(low) and (low[word_end].isalnum() or low[word_end] == "-"):
        word_end += 1  # PIN-Code, pincode
    if _ends_clause(low, word_end):
        end = word_end
    else:
        noun = _PIN_NOUN.match(low, start) if _word_after(low, word_end) in _NOUN_TAILS else None
        if noun is not None and noun.end() > word_end:
            end = noun.end()  # a noun of two words: code PIN, codice segreto, PIN code
        elif not (is_code and _has_word(_CARD_WORDS, _clause(low, end))):
            return None  # a bare "code" is too vague to take the number before it, unless it opens something
    return PIN if _value_before(text, low, start, end, PIN) else None


# Second words of two-word PIN nouns ("code PIN", "PIN code", "número secreto").
_NOUN_TAILS = frozenset(
    [w.split()[-1] for w in WORDS.union("pin") if " " in w]
    + ["code", "number", "nummer", "numero", "número", "zahl", "kod", "kode", "koden"]
)


def _word_after(low: str, end: int) -> str:
    m = _NEXT_WORD.match(low, end + (low[end : end + 1] == "-"))
    return (m.group("word") or "") if m else ""


def _code_hit(text: str, low: str, pos: int) -> str | None:
    """ "code" / "codice": a PIN when named so (code PIN, codice segreto), by what it opens
    (Türcode, deurcode, garage code, code de la porte) or by its owner (mon code est ...)."""
    size = 6 if low.startswith("codice", pos) else 4
    if size == 4 and not low.startswith("code", pos):
        return None  # codigo: the "digo" keyword reads it; codec, codex
    end = pos + size
    if end < len(low) and low[end].isalpha() and low[end] != "s":
        return None  # coded, coder, codename
    start = pos
    if pos > 0 and (low[pos - 1].isalpha() or low[pos - 1] == "-"):
        # Glued: Türcode, toegangscode, alarm-code; barcode, encode, postcode are not PINs.
        start = pos - 1 if low[pos - 1] == "-" else pos
        while start > 0 and pos - start < 24 and low[start - 1].isalpha():
            start -= 1
        if low[start:pos].rstrip("-") not in _CODE_GLUED:
            return None
    else:
        # "garage code", "alarm code": a place word just before.
        before = low[max(0, pos - 16) : pos].rstrip(" -")
        word_start = max(before.rfind(" "), before.rfind("\n")) + 1
        if before[word_start:] in _CODE_GLUED:
            start = max(0, pos - 16) + word_start
    return _pin_noun_hit(text, low, start, end, start == pos, place=start != pos)


def _stated_code(text: str, low: str, start: int) -> bool:
    m = _CODE_STATED.match(text, start, min(len(text), start + 160))
    if m is None:
        return _code_number(text, low, start)
    if "\n" in m.group("mid"):
        return False
    mid = low[m.start("mid") : m.end("mid")]
    if _CODE_VETO.search(mid) or _CODE_VETO.search(low, max(0, start - 16), start):
        return False  # "error code", "code postal", "zip code for the gate"
    if _UNIT_AFTER.match(low, m.end()):
        return False
    # English "my code is 1500" is usually about source code, so only the other languages' owners count.
    return (
        _has_word(_CARD_WORDS, mid)
        or _has_word(_CARD_WORDS, low, max(0, start - 24), start)  # "garage door code: ..."
        or _CODE_OWNER.search(low, max(0, start - 16), start) is not None
        or (
            not mid.strip()
            and _CODE_ARTICLE.search(low, max(0, start - 6), start) is not None
            and _YEAR.match(m.group("num")) is None
            and _ends_clause(low, m.end())
        )
    )


# "Die Alarmanlage hat den Code 7391": a code and its number, with what it opens in the sentence.
_CODE_NUMBER = re.compile(
    r"""(?:code|codice|c[óo]digo)\s+[*"'«]*(?P<num>\d{4,8})(?![\w]|[.,:/\-]\d)""", re.IGNORECASE
)


def _code_number(text: str, low: str, start: int) -> bool:
    m = _CODE_NUMBER.match(text, start, start + 40)
    if m is None or _YEAR.match(m.group("num")) or _UNIT_AFTER.match(low, m.end()):
        return False
    lo = max(0, start - 40)
    lo = max(lo, low.rfind(". ", lo, start) + 1, low.rfind("\n", lo, start) + 1)
    if _CODE_VETO.search(low, lo, start):
        return False
    return _has_word(_CARD_WORDS, low, lo, start) or _has_word(_CARD_WORDS, _clause(low, m.end()))


def _is_word_at(low: str, pos: int, end: int) -> bool:
    return (pos == 0 or not low[pos - 1].isalpha()) and (end >= len(low) or not low[end].isalpha())


_PIN_WORDS = ("pincode", "pin-code", "pin_code", "pinkod", "pinnummer")
# Cheap test that a clause after a password noun may state it: an operator, or "is" in a
# language of the lexicon (ist/lautet, est, es/era, è/é, is/wordt, är...).
_PROSE_MARKS = (":", "=", "→", "–", "—", "->")
_PROSE_WORDS = frozenset({"be", "to", *(w.split()[0] for w in _COPULAS + _CONTRACTED)})


def _may_state(window: str) -> bool:
    return any(mark in window for mark in _PROSE_MARKS) or not _PROSE_WORDS.isdisjoint(window.split())


def _clause(low: str, pos: int) -> str:
    """Up to 80 characters after pos, cut at the end of the line or sentence."""
    window = low[pos : pos + 80]
    for stop in ("\n", ". ", "? ", "! ", "; "):
        cut = window.find(stop)
        if cut >= 0:
            window = window[:cut]
    return window


def _pin_hit(text: str, low: str, pos: int, kw_end: int) -> str | None:
    if not (_is_word_at(low, pos, kw_end) or low.startswith(_PIN_WORDS, pos)):
        return None
    return _pin_noun_hit(text, low, pos, kw_end, False)


# ---- the value before its noun: "Sommer2024! ist mein Passwort", "4821 is mijn pincode",
# "Ete2024! c'est mon mot de passe", "use Kq7#mZ2p as the password".

_IS_BEFORE = frozenset(w for w in WORDS.union("is_words") if " " not in w and w != "to")
_AS_WORDS = frozenset(WORDS.union("as_words"))
_THIS_WORDS = frozenset(WORDS.union("this_words"))
_DETERMINERS = frozenset(WORDS.union("determiners"))
_PREPOSITIONS = frozenset(WORDS.union("prepositions"))
_CLAUSE_END = ".,;:!?)]}\n»\"'”’…"
_DATE_OR_TIME = re.compile(r"^\d{1,4}[-/.:]\d")
_YEAR = re.compile(r"^(?:19|20)\d\d$")
_DASHES = ("-", "–", "—", "=", "->", "→", ":")


_NEXT_WORD = re.compile(r"[ \t]*(?:(?P<word>[^\W\d_][^\W\d_'’]*)|(?P<other>.?))", re.DOTALL)


def _ends_clause(low: str, end: int) -> bool:
    """What follows low[:end] ends its clause, or is a preposition ("... mein Passwort für das WLAN")."""
    m = _NEXT_WORD.match(low, end)
    assert m is not None  # the pattern matches the empty string
    word = m.group("word")
    return word in _PREPOSITIONS if word else m.group("other") in _CLAUSE_END


def _unquote(raw: str) -> tuple[str, bool]:
    core = raw.rstrip(",;").strip("*_")
    if len(core) > 2 and core[0] in _OPEN_QUOTES and core[-1] in _ANY_QUOTE:
        return core[1:-1], True
    return core.rstrip(_TRAILING_PUNCT).lstrip("*_`\"'“‘„«¿¡([{"), False


_BEFORE_NOUN = _DETERMINERS | _IS_BEFORE | _AS_WORDS


def _word_before(low: str, start: int) -> str:
    """The token just before low[start] (after the space or line start before it)."""
    j = start
    while j > 0 and low[j - 1] == " ":
        j -= 1
    lo = max(0, j - 24)
    return low[max(low.rfind(" ", lo, j), low.rfind("\n", lo, j), lo - 1) + 1 : j]


def _value_before(text: str, low: str, start: int, end: int, kind: str) -> bool:
    """The noun at text[start:end] ends its clause, and before it stand a value, a verb
    meaning "is" (or "as") and at most three determiners."""
    if _word_before(low, start) not in _BEFORE_NOUN or not _ends_clause(low, end):
        return False
    if _clause(low, end)[-1:] == "?" or low[end:].lstrip(" ")[:1] == "?":
        return False  # "¿Cuál es la contraseña del wifi?": a question
    line_start = text.rfind("\n", max(0, start - 160), start) + 1
    words = text[max(line_start, start - 160) : start].split()
    i = len(words) - 1
    skipped = 0
    while i >= 0 and skipped < 3 and words[i].lower() in _DETERMINERS:
        i -= 1
        skipped += 1
    if i < 1:
        return False
    verb = words[i].lower()
    as_form = verb in _AS_WORDS
    if not as_form and verb not in _IS_BEFORE:
        return False
    i -= 1
    if i >= 1 and words[i].lower().rstrip(",") in _THIS_WORDS:
        i -= 1  # "X, das ist mein Passwort"
    if i >= 1 and words[i] in _DASHES:
        i -= 1
    if not as_form and i >= 1 and words[i - 1].lower() in _PREPOSITIONS:
        return False  # "seit 2020 ist das Passwort ...", "in 2019 was het wachtwoord ..."
    value, quoted = _unquote(words[i])
    if kind == PIN:
        return value.isdigit() and 4 <= len(value) <= 8 and _YEAR.match(value) is None
    if not 4 <= len(value) <= 64 or _YEAR.match(value) or _DATE_OR_TIME.match(value) or _VERSION.match(value):
        return False
    if not quoted and not _credential_look(value):
        return False
    return _value_ok(PASSWORD, value, quoted, "assign", "", prose=True)


# ---- code that hands a secret over without naming it in an assignment

# "password", "S3cret" as a call's two arguments (props.put, setenv, a UI test's
# page.fill('#password', ...)), a field then its value in a chained call
# (find_element(By.ID, "password").send_keys("...")), or a setter's one argument (setPassword("...")).
_PAIR_VALUE = re.compile(r"""(?:["']\])?["']\s*,\s*(?P<q>["'`])(?P<val>[^"'`\n]{1,200})(?P=q)\s*[,)]""")
_CHAINED_VALUE = re.compile(
    r"""(?:["']\])?["']\s*\)\s*\.\s*(?:type|fill|send_?keys|set_?value|val|input|press_?sequentially)\s*\(\s*"""
    r"""(?P<q>["'`])(?P<val>[^"'`\n]{1,200})(?P=q)""",
    re.IGNORECASE,
)
_SETTER_VALUE = re.compile(r"""\(\s*(?P<q>["'`])(?P<val>[^"'`\n]{1,200})(?P=q)\s*\)""")
_GETTER_SEGMENTS = frozenset(
    """
    get read load fetch lookup find retrieve resolve prompt ask input getpass has is remove delete del
    clear forget unset show print log
    """.split()  # noqa: SIM905
)


# The name is a call's first argument (or its second, after a literal), quoted or in a
# selector: put("password", ...), setenv('PGPASSWORD', ...), config.set("db", "password", ...),
# fill('#password', ...), fill('input[name="password"]', ...).
_ARGUMENT_NAME = re.compile(
    r"""\(\s*(?:[rbuf]?["'][^"'\n]{0,60}["']\s*,\s*)?[rbuf]?["'](?:[#.]|[^"'\n]{0,40}\[\w+=["']?)?"""
)


def _argument_name(text: str, start: int) -> bool:
    paren = text.rfind("(", max(0, start - 120), start)
    return paren >= 0 and _ARGUMENT_NAME.fullmatch(text, paren, start) is not None


def _quoted_name(text: str, start: int) -> bool:
    """The name starts a quoted string or a selector in one ('password', '#password', [name="password"])."""
    before = text[max(0, start - 2) : start]
    return before[-1:] in ("'", '"') or (before[-1:] in "#." and before[:1] in ("'", '"'))


def _literal_argument(text: str, start: int, stop: int, family: str, meta: bool) -> bool:
    if _quoted_name(text, start):
        m = _CHAINED_VALUE.match(text, stop, stop + 260)
        if m is None and not meta and _argument_name(text, start):
            m = _PAIR_VALUE.match(text, stop, stop + 260)
            if m is not None and not _credential_look(m.group("val")):
                return False  # ('user', 'password', 'host'): names in a tuple
    elif not meta and text.startswith("(", stop):
        name = text[start:stop]
        if any(seg.lower() in _GETTER_SEGMENTS for seg in _CAMEL_SPLIT.findall(name)):
            return False  # get_password("svc", "user"): a lookup, not the value
        m = _SETTER_VALUE.match(text, stop, stop + 260)
    else:
        return False
    if m is None or any(c.isspace() for c in m.group("val")):
        return False
    return _value_ok(family, m.group("val"), True, "assign", "")


def _positional_password(found: Candidate) -> bool:
    value = found.password
    if found.user is not None and value == found.user:
        return False  # ("test", "test"), ("sa", "sa"): a default pair
    if found.strict and not _credential_look(value):
        return False
    if len(value.split()) > (1 if found.strict else 4):
        return False  # a sentence; an app password may come in four groups ("abcd efgh ijkl mnop")
    return _value_ok(PASSWORD, value, True, "assign", "")


# ---- Authorization: Basic, and other base64 user:password pairs

# "Basic <b64>", "basic auth string: <b64>": the decoding says whether it is a user:password pair.
_BASIC_VALUE = re.compile(
    r"""basic(?:[\s_-]+[A-Za-z]+){0,3}?\s*[:=]?\s*["'`]?(?P<val>[A-Za-z0-9+/_-]{8,}={0,2})(?![A-Za-z0-9+/=_-])""",
    re.IGNORECASE,
)
# "auth": "<base64>" (a registry's config.json), _auth=<base64> (.npmrc)
_AUTH_VALUE = re.compile(r"""["']?\s*[:=]\s*["']?(?P<val>[A-Za-z0-9+/_-]{8,}={0,2})(?![A-Za-z0-9+/=_-])""")


def _auth_hit(text: str, low: str, pos: int) -> str | None:
    if low.startswith("authoriz", pos):
        if not _authorization(text, pos):
            return None
        return PASSWORD if "basic" in low[pos : pos + 40] else TOKEN
    end = pos + 4
    if end < len(low) and low[end].isalpha():
        return None  # author, authenticate
    m = _AUTH_VALUE.match(text, end, end + 400)
    if m is not None and _basic_credentials(m.group("val")):
        return PASSWORD
    m = _AUTH_CALL.match(text, end, end + 220)  # redis.auth("..."): a password as the one argument
    if m is not None:
        return PASSWORD if _positional_password(Candidate(m.group("val"), None, strict=True)) else None
    return None


_AUTH_CALL = re.compile(r"""\s*\(\s*(?P<q>["'`])(?P<val>[^"'`\n]{1,200})(?P=q)\s*\)""")


# "echo <b64> | base64 -d", base64.b64decode("<b64>"), Buffer.from("<b64>", "base64"): a blob
# decoded next to the word, whose content is a user:password pair.
_B64_NEAR = re.compile(r"(?<![A-Za-z0-9+/=_-])[A-Za-z0-9+/]{8,}={0,2}(?![A-Za-z0-9+/=_-])")


def _base64_hit(text: str, pos: int) -> str | None:
    for m in _B64_NEAR.finditer(text, max(0, pos - 120), min(len(text), pos + 126)):
        if m.end() - m.start() <= 200 and _basic_credentials(m.group(0)):
            return PASSWORD
    return None


def _basic_hit(text: str, low: str, pos: int) -> str | None:
    if pos > 0 and low[pos - 1].isalpha():
        return None  # VisualBasic
    m = _BASIC_VALUE.match(text, pos, pos + 600)
    return PASSWORD if m is not None and _basic_credentials(m.group("val")) else None


# ---- command lines: mysql -pX, docker login -p X, sshpass -p X, redis-cli -a X

_CLI_COMMAND = re.compile(
    r"(?<![^\s;&|`(])(?P<cmd>mysql\w*|mariadb\w*|docker|podman|nerdctl|helm|sshpass|redis-cli|mongo\w*)\b"
)
# command -> (the flag, how its value follows it: glued, or after a space or "=")
_CLI_FLAGS: dict[str, tuple[str, str]] = {
    "mysql": ("-p", r""),
    "mariadb": ("-p", r""),
    "docker": ("-p", r"(?:\s+|=)"),
    "podman": ("-p", r"(?:\s+|=)"),
    "nerdctl": ("-p", r"(?:\s+|=)"),
    "helm": ("-p", r"(?:\s+|=)"),
    "sshpass": ("-p", r"\s*"),
    "redis-cli": ("-a", r"\s+"),
    "mongo": ("-p", r"\s+"),
}
_CLI_VALUE = {
    sep: re.compile(sep + r"""(?P<val>'[^'\n]+'|"[^"\n]+"|[^\s'"]+)""")
    for sep in {s for _, s in _CLI_FLAGS.values()}
}


def _cli_password(text: str, low: str, pos: int, flag: str) -> bool:
    if pos == 0 or low[pos - 1] not in " \t":
        return False
    line_start = max(low.rfind("\n", 0, pos) + 1, pos - 300)
    command = None
    for found in _CLI_COMMAND.finditer(low, line_start, pos):
        command = found
    if command is None or any(c in low[command.end() : pos] for c in "|;&\n"):
        return False
    cmd = command.group("cmd")
    family = next((k for k in _CLI_FLAGS if cmd.startswith(k)), None)
    if family is None or _CLI_FLAGS[family][0] != flag:
        return False
    if family in ("docker", "podman", "nerdctl", "helm") and "login" not in low[command.end() : pos]:
        return False  # docker run -p 8080:80
    m = _CLI_VALUE[_CLI_FLAGS[family][1]].match(text, pos + 2, pos + 300)
    if m is None:
        return False
    raw = m.group("val")
    return _value_ok(PASSWORD, raw.strip("'\""), raw[:1] in "'\"", "assign", "")


# ---- a user and password pair: "Zugangsdaten: admin / Sommer2024!", "creds: deploy:Tr0ub4dor&3",
# "Benutzername und Passwort: admin / Sommer2024!" (the noun then both values).
_CRED_WORDS = frozenset(WORDS.union("credentials"))
_CRED_ROOTS = ("cred", "daten", "gegevens", "identifiant")  # what the keyword loop finds them by
_PAIR_AFTER = re.compile(
    r"""[^\S\n]*(?:\([^()\n]{1,24}\))?[^\S\n]*(?:[:=]|->|→)[^\S\n]*[*_`]{0,2}(?P<user>[\w.@\\+-]{1,64})"""
    r"""[^\S\n]*(?:/|\||,|:|[^\S\n]+(?:and|und|en|et|y|e|og|och)[^\S\n]+)[^\S\n]*[*_`"']{0,2}"""
    r"""(?P<pw>[^\s"'`()\[\]{}<>,;=]{4,64})(?=$|[\s)\]}>"'`,;*_])"""
)


def _pair_value(text: str, end: int) -> bool:
    m = _PAIR_AFTER.match(text, end, end + 200)
    if m is None:
        return False
    user, password = m.group("user"), m.group("pw").rstrip(_TRAILING_PUNCT)
    if password == user or _URLISH.match(user) or _EMAIL.match(password):
        return False
    if user.startswith(("$", "%", "{", "<", "(", "[")) or _is_env_reference(user):
        return False  # ${POSTGRES_PASSWORD:?Set it}: a variable and its message, not a pair
    # Made up, not words joined by symbols ("8-64 / letters+digits").
    made_up = any(c.isdigit() for c in password) or (
        password.lower() != password and password.upper() != password
    )
    return made_up and _value_ok(PASSWORD, password, False, "assign", "", prose=True)


def _credentials_hit(text: str, low: str, pos: int) -> str | None:
    start, end = pos, pos
    while start > 0 and pos - start < 16 and low[start - 1].isalpha():
        start -= 1  # Zugangsdaten, inloggegevens: found by their last part
    while end < len(low) and end - pos < 16 and low[end].isalpha():
        end += 1
    if low[start:end] not in _CRED_WORDS:
        return None
    return PASSWORD if _pair_value(text, end) else None


# ---- a Wi-Fi key: "WLAN-Schlüssel: K9xmP2qL7v", "la clé WiFi est K9x!mP2q", "wifi key = ..."
_KEY_NOUNS = frozenset(WORDS.union("key"))


def _wifi_hit(text: str, low: str, pos: int, end: int) -> str | None:
    if pos > 0 and low[pos - 1].isalpha():
        return None
    after = _NEXT_WORD.match(low, end + (low[end : end + 1] == "-"))
    if after is not None and after.group("word") in _KEY_NOUNS:
        value_from = after.end()
    elif _word_before(low, pos) in _KEY_NOUNS or (
        _word_before(low, pos) in _PREPOSITIONS
        and _word_before(low, pos - len(_word_before(low, pos)) - 1) in _KEY_NOUNS
    ):
        value_from = end  # "clé WiFi", "chave do wifi"
    else:
        return None  # "wifi: Home-5G" names the network, not its key
    return PASSWORD if _prose_password(text, value_from) else None


def _pass_phrase(low: str, pos: int) -> tuple[int, int] | None:
    """The noun holding the "pass" at pos further in ("mot de passe", "palavra-passe")."""
    for phrase, offset in _PASS_PHRASES:
        start = pos - offset
        if start >= 0 and low.startswith(phrase, start) and (start == 0 or not low[start - 1].isalpha()):
            return start, start + len(phrase)
    return None


def _keyword_hit(text: str, low: str, word: str, pos: int, end: int) -> str | None:
    """Judge one keyword occurrence; cheap rejections first (most hits are ordinary words)."""
    nxt = low[end : end + 1]
    if word == "pin":
        return _pin_hit(text, low, pos, end)
    if word == "pass":
        if low.startswith("passcode", pos):
            return _pin_hit(text, low, pos, pos + 8)
        phrase = _pass_phrase(low, pos)
        if phrase is not None:
            pos, end = phrase  # "mot de passe" is read from "mot"
        elif nxt.isalpha() and not low.startswith(_PASS_NOUNS, pos):
            return None  # passed, passenger, passport
    elif word == "key":
        prev = low[pos - 1 : pos]
        if not (prev.isalpha() or prev in ("_", "-", " ")):
            return None  # "key", ["key"], Key=key
        if not low.endswith(_KEY_PREFIXES, max(0, pos - 12), pos):
            # "my API key is ..." / "access key: ..." in prose; every other "key" is a word.
            if low.endswith(_KEY_PROSE_PREFIXES, max(0, pos - 8), pos) and _own_token_value(
                text, end, API_KEY
            ):
                return API_KEY
            return None
    elif word == "token":
        if nxt.isalpha() and nxt != "s":
            return None  # tokenizer
    elif word == "secret":
        if low.startswith("secreto", pos) and low.endswith(("número ", "numero "), max(0, pos - 7), pos):
            return _pin_noun_hit(text, low, pos - 7, pos + 7, False)  # número secreto
        if nxt.isalpha() and nxt not in "sk":
            return None  # secretary
    elif word == "pw":
        if nxt.isalpha() and nxt != "d":
            return None
    elif word == "bearer":
        m = _BEARER.match(text, pos, min(len(text), pos + _MAX_VALUE))
        return TOKEN if m and _looks_random(m.group("val").rstrip("."), 16) else None
    elif word == "auth":
        return _auth_hit(text, low, pos)
    elif word == "basic":
        return _basic_hit(text, low, pos)
    elif word == "base64":
        return _base64_hit(text, pos)
    elif word == "-u":
        # curl -u user:password / --user user:password
        m = _CURL_USER.match(text, pos, min(len(text), pos + 300))
        if (
            m
            and (pos == 0 or low[pos - 1] in " -\t")
            and _value_ok(PASSWORD, m.group("pw"), False, "assign", "")
        ):
            return PASSWORD
        return None
    elif word in ("-p", "-a"):
        return PASSWORD if _cli_password(text, low, pos, word) else None
    elif word == "identified":
        if low.startswith("identified by", pos):
            m = _SQL_PASSWORD.match(text, pos + 10, min(len(text), pos + 300))
            if m and _value_ok(PASSWORD, m.group("val"), True, "assign", ""):
                return PASSWORD
        return None
    elif word == "cookie":
        return TOKEN if _cookie_header(text, pos) else None
    elif word == "cod":
        return _code_hit(text, low, pos)
    elif word in _CRED_ROOTS:
        return _credentials_hit(text, low, pos)
    elif word in ("wifi", "wi-fi", "wlan"):
        return _wifi_hit(text, low, pos, end)
    elif word in _PIN_NOUN_STARTS:
        hit = _foreign_pin_hit(text, low, word, pos)
        if hit is not None or word not in _PW_ROOTS:
            return hit  # "clave" goes on as a password noun
    return _secret_name_hit(text, low, word, pos, end)


def _secret_name_hit(text: str, low: str, word: str, pos: int, end: int) -> str | None:
    """A name holding a secret word (password, DB_PASSWORD, contraseña, api_key, token...):
    what its operator, its clause or its call gives it."""
    root = _ROOT_SECRET.match(low, pos)
    if root is not None and not root.group(0).replace("_", "").isalnum():
        start, stop = pos, root.end()  # "mot de passe", "palavra-passe", "parola d'ordine"
    else:
        start, stop = _name_bounds(text, pos, end)
    # Where the keyword proper ends inside the name (password, passwd, secret, ...).
    kw_end = root.end() if root else end
    if word != "key" and not _keyword_tail_ok(text, kw_end, stop):
        return None
    if word == "mdp" and start < pos and text[pos - 1] not in "_-.":
        return None  # cmdp
    if text[max(0, start - 2) : start] == "${" or (
        text[start - 1 : start] == "%" and text.startswith("%", stop)
    ):
        return None  # ${DB_PASSWORD:?must be set}, %DB_PASSWORD%: a reference to the variable
    if text[start - 1 : start] == "$" and _OPERATOR_AHEAD.match(text, stop) is None:
        return None  # -e POSTGRES_PASSWORD=$POSTGRES_PASSWORD postgres:16: the variable used

    # Is anything that could carry a value next to the name? (Most hits stop here.)
    operator = _OPERATOR_AHEAD.match(text, stop) is not None
    flag = text[max(0, start - 2) : start] == "--"
    xml = start > 0 and text[start - 1] == "<" and text.startswith(">", stop)
    sql = "'" in low[stop : stop + 3]
    bare_name = stop == kw_end or low[kw_end:stop] == "s"
    window = _clause(low, stop) if bare_name else ""
    prose = bool(window) and _may_state(window)
    pw_word = low.startswith(_PW_WORDS, pos)
    bare = pw_word and bare_name and low[stop : stop + 1] == " "
    if pw_word and bare_name and _value_before(text, low, start, stop, PASSWORD):
        return PASSWORD  # "Sommer2024! ist mein Passwort"
    if not (operator or flag or xml or sql or prose or bare):
        return None

    name = text[start:stop]
    if _name_is_meta(name) or _PREV_META.search(low, max(0, start - 16), start):
        # '#password-field' in a UI test, then .type("..."): the field's name, then its value.
        if operator and _quoted_name(text, start):
            family = _family(word, low[start:stop])
            return family if _literal_argument(text, start, stop, family, meta=True) else None
        return None
    family = _family(word, low[start:stop])

    if flag:  # --password X / --api-key=X
        m = _CLI_FLAG.match(text, stop, min(len(text), stop + 300))
        if (
            m
            and not _crosses_line(text, stop, m.start("val"))
            and _value_ok(family, m.group("val"), bool(m.group("q")), "assign", "")
        ):
            return family

    if operator:
        # Anchor the detect-secrets regexes at every segment start of the name
        # (aws_api_key -> "api_key", dbPassword -> "dbPassword", "password").
        starts = sorted({pos, *(start + s.start() for s in _SEGMENT_START.finditer(name))})
        if family != TOKEN and _ds_assignments(text, starts, stop, family):
            return family
        if (family == TOKEN or word == "key") and _own_token_value(text, stop, family):
            return family
        if _literal_argument(text, start, stop, family, meta=False):
            return family  # props.put("password", "..."), setPassword("...")

    if family == PASSWORD and pw_word:
        if xml:  # <password>hunter2</password>
            close = text.find("<", stop + 1, stop + 1 + 200)
            if close > 0 and _value_ok(PASSWORD, text[stop + 1 : close], True, "assign", ""):
                return PASSWORD
        if prose and (
            _prose_password(text, stop) or _changed_to(text, low, start, stop) or _pair_value(text, stop)
        ):
            return PASSWORD
        if bare and _bare_password(text, stop):
            return PASSWORD  # "login admin / password Winter2021!"
        if sql:
            m = _SQL_PASSWORD.match(text, stop, min(len(text), stop + 300))
            if m and _value_ok(PASSWORD, m.group("val"), True, "assign", ""):
                return PASSWORD  # CREATE USER ... WITH PASSWORD '...'
    elif family == TOKEN and bare_name and not operator:
        if _own_token_value(text, stop, TOKEN):
            return TOKEN  # "the access token is ..."
    elif word == "secret" and bare_name and not operator:
        if _own_token_value(text, stop, API_KEY):
            return API_KEY  # "the secret is 8f14e45f..."
    elif (
        family == PASSWORD
        and low[pos:stop] in ("pass", "pw")
        and (_short_name_password(text, low, start, pos, stop) or _pair_value(text, stop))
    ):
        return PASSWORD  # pw: X, "login/pw = root / X"
    return None


# --------------------------------------------------------------------------- numbers

_DIGIT_RUN4 = re.compile(r"\d\d\d\d")

_CARD = re.compile(
    r"""\d(?:
        \d{12,18}
      | \d{3}(?P<s>[ -])\d{4}(?P=s)\d{4}(?P=s)\d{4}(?:(?P=s)\d{3})?
      | \d{3}(?P<t>[ -])\d{6}(?P=t)\d{4,5}
    )(?![\w]|[.,\-]\d)""",
    re.VERBOSE,
)
_CARD_CTX = re.compile(
    r"card|visa|master|amex|american express|discover|diners|jcb|unionpay|maestro|\bcc\b|credit|debit|cvv|cvc|\bpan\b"
)
_NOT_CARD_CTX = re.compile(
    r"order|invoice|tracking|shipment|ticket|transaction|\btxn|\bref|confirmation|booking|isbn|imei|"
    r"serial|\bid\b|account|acct|phone|\btel\b|fax|customer|member|\bpo\b|case|claim|sku|part|batch|\blot\b|"
    r"parcel|package|reservation|receipt|iban|routing|timestamp|epoch|snowflake|build|version"
)


def _plausible_iin(d: str) -> bool:
    n = len(d)
    p2, p3, p4 = int(d[:2]), int(d[:3]), int(d[:4])
    if d[0] == "4":
        return n in (13, 16, 19)  # Visa
    if 51 <= p2 <= 55 or 2221 <= p4 <= 2720:
        return n == 16  # Mastercard
    if p2 in (34, 37):
        return n == 15  # Amex
    if p4 == 6011 or 644 <= p3 <= 649 or p2 == 65:
        return 16 <= n <= 19  # Discover
    if 3528 <= p4 <= 3589:
        return 16 <= n <= 19  # JCB
    if 300 <= p3 <= 305 or p2 in (36, 38, 39) or p4 == 3095:
        return 14 <= n <= 19  # Diners
    if p2 == 62 or 2200 <= p4 <= 2204:
        return 16 <= n <= 19  # UnionPay, Mir
    if p2 in (50, 56, 57, 58, 63, 67, 68, 69):
        return 13 <= n <= 19  # Maestro
    return False


def _grouped_before(text: str, sep_at: int) -> bool:
    """The separator at sep_at follows a short digit-bearing group ("DE89 3704 ...")."""
    j = sep_at
    while j > 0 and _is_alnum_ascii(text[j - 1]) and sep_at - j < 5:
        j -= 1
    group = text[j:sep_at]
    return (
        0 < len(group) <= 4
        and any(c.isdigit() for c in group)
        and (j == 0 or not _is_alnum_ascii(text[j - 1]))
    )


def _glued_before(text: str, i: int) -> bool:
    """Whether the number found at `i` goes on from what stands before it (a word, an
    amount, a longer number), so is no number of its own."""
    if i == 0:
        return False
    prev = text[i - 1]
    if _is_alnum_ascii(prev) or prev in "_+/$€£@\\":
        return True
    return prev in ".,-" and i > 1 and _is_alnum_ascii(text[i - 2])


def _scan_cards(text: str, low: str, a: int, b: int) -> Iterator[str]:
    for m in _CARD.finditer(text, a, min(len(text), b + 2)):
        i = m.start()
        if _glued_before(text, i):
            continue
        sep = m.group("s") or m.group("t")
        if sep and i > 0 and text[i - 1] == sep and _grouped_before(text, i - 1):
            continue  # one group of a longer grouped number (IBAN, account numbers)
        digits = m.group(0).replace(" ", "").replace("-", "")
        if not (_plausible_iin(digits) and luhn.is_valid(digits)):
            continue
        if len(digits) == len(m.group(0)):
            ctx = low[max(0, i - 32) : i]
            if _NOT_CARD_CTX.search(ctx) and not _CARD_CTX.search(ctx):
                continue
        yield CARD
        return


_SSN_NUM = re.compile(r"\d{3}(?P<sep>-| |)\d{2}(?P=sep)\d{4}(?![\w]|[.,\-/:]\d)")
_SSN_CTX = re.compile(
    r"\bssns?\b|ssn[#:]|social[\s-]*security|\bsoc\.?\s*sec|\bss\s*#|\bss\s*(?:no|num)|s\.s\.n"
)
_NOT_SSN_CTX = re.compile(
    r"order|invoice|ticket|tracking|\bpart|sku|model|\bref|case\b|serial|routing|account|acct|phone|"
    r"\btel\b|fax|\bpo\b|confirmation|booking|isbn|item|product|catalog|\blot\b|batch|claim|version|"
    r"build|zip|\bein\b|itin|patent|docket|member|customer|employee|student|policy"
)


def _scan_ssn(text: str, low: str, a: int, b: int) -> Iterator[str]:
    for m in _SSN_NUM.finditer(text, a, min(len(text), b + 2)):
        i = m.start()
        if _glued_before(text, i):
            continue
        number = m.group(0)
        if not us_ssn.is_valid(number.replace(" ", "-") if m.group("sep") == " " else number):
            continue
        before = low[max(0, i - 48) : i]
        after = low[m.end() : m.end() + 24]
        in_context = bool(_SSN_CTX.search(before) or _SSN_CTX.search(after))
        if m.group("sep") != "-" and not in_context:
            continue  # 9 bare digits (or spaced) are an SSN only when called one
        if not in_context and _NOT_SSN_CTX.search(low, max(0, i - 32), i):
            continue
        yield SSN
        return


# --------------------------------------------------------------------------- tables

# A card number or SSN in a table row (CSV, TSV, Markdown, or columns aligned with spaces)
# has no word next to it; the column's header says what it is. The header is the top line
# of the block of lines that share the row's delimiter.
_CARD_COLUMNS = frozenset(
    """
    card cards cc ccn ccnum pan cardnumber creditcard debitcard kartennummer karte kreditkarte
    carte tarjeta carta cartão cartao kaart kaartnummer bankkaart visa mastercard amex
    """.split()  # noqa: SIM905
)
_SSN_COLUMNS = frozenset("ssn ssns ssno social socialsecurity sin".split())  # noqa: SIM905
_COLUMN_SPLIT = re.compile(r"[^\w]+|_")
_ALIGNED = re.compile(r"\S {2,}\S")
_ALIGNED_SPLIT = re.compile(r"\s{2,}")
_MD_RULE = re.compile(r"^\s*\|?\s*:?-{2,}")
_MAX_TABLE_LINES = 200


def _row_delimiter(line: str) -> str | None:
    for d in ("\t", "|", ";", ","):
        if d in line:
            return d
    return "  " if _ALIGNED.search(line) else None


def _cells(line: str, delim: str) -> list[str]:
    if delim == "|":
        return [c.strip() for c in line.strip().strip("|").split("|")]
    if delim == "  ":
        return _ALIGNED_SPLIT.split(line.strip())
    if delim == "\t":
        return [c.strip() for c in line.split("\t")]
    return [c.strip() for c in _csv_split(line, delim)]


def _csv_split(line: str, delim: str) -> list[str]:
    """One CSV line's cells (quoted cells may hold the delimiter); never raises on odd quoting."""
    if '"' not in line:
        return line.split(delim)  # what the csv module would answer, without its cost
    try:
        return next(csv.reader([line.replace("\r", " ")], delimiter=delim), [])
    except csv.Error:
        return line.split(delim)


def _has_delimiter(line: str, delim: str) -> bool:
    return _ALIGNED.search(line) is not None if delim == "  " else delim in line


_Named = dict[tuple[int, str, int, str], bool]


def _column_named(text: str, row_start: int, delim: str, index: int, kind: str, named: _Named) -> bool:
    """Does a line above the row, in its block, name column `index` as `kind`?

    The block is the run of lines above that share the row's delimiter (up to a blank line,
    an intro sentence without the delimiter, or a code fence). Usually its top line is the
    header, but an intro sentence holding the delimiter ("Sure, here it is:") may sit above
    it, so every line of the block is asked. `named` memoises the answer per line, so the
    rows of one table share one walk."""
    walked: list[int] = []
    found = False
    end = row_start - 1  # the "\n" ending the line above
    for _ in range(_MAX_TABLE_LINES):
        if end < 0:
            break
        start = text.rfind("\n", 0, end) + 1
        key = (start, delim, index, kind)
        if key in named:
            found = named[key]
            break
        line = text[start:end]
        if not line.strip() or not _has_delimiter(line, delim):
            break
        walked.append(start)
        if not _MD_RULE.match(line):
            cells = _cells(line, delim)
            if index < len(cells) and _column_kind(cells[index]) == kind:
                found = True
                break
        end = start - 1
    for start in walked:
        named[(start, delim, index, kind)] = found
    return found


def _column_kind(name: str) -> str | None:
    words = [w for w in _COLUMN_SPLIT.split(name.lower()) if w]
    joined = "".join(words)
    if any(w in _CARD_COLUMNS for w in words) or any(part in joined for part in _CARD_PARTS):
        return CARD  # card, pan, cc; Credit Card #, cardNumber, Kreditkartennummer
    if any(w in _SSN_COLUMNS for w in words) or "ssn" in joined or "socialsec" in joined:
        return SSN
    return None


_CARD_PARTS = ("card", "karte", "tarjeta", "carte", "carta", "cartão", "cartao", "kaart")


def _cell_kind(cell: str) -> str | None:
    if not 9 <= len(cell) <= 32:
        return None  # a card number with separators and quotes fits in 32 characters
    value = cell.strip("\"'`* ")
    digits = value.replace(" ", "").replace("-", "")
    if not digits.isdigit() or len(value) - len(digits) > 4:
        return None
    if 13 <= len(digits) <= 19 and _plausible_iin(digits) and luhn.is_valid(digits):
        return CARD
    if len(digits) == 9 and (us_ssn.is_valid(digits) or (digits[0] not in "08" and luhn.is_valid(digits))):
        return SSN  # a US SSN, or a Canadian SIN (Luhn) in a column called "sin"
    return None


def _cell_index(line: str, left: int, delim: str) -> int:
    """How many cells come before the one that starts after the delimiter at `left` (-1: the first)."""
    if left < 0:
        return 0
    before = line[: left + len(delim)]
    if delim == "  ":
        return len(_ALIGNED_SPLIT.split(before.strip()))
    if delim == "|":
        return before.count("|") - (1 if line.lstrip().startswith("|") else 0)
    if '"' in before:
        return len(_csv_split(before, delim)) - 1
    return before.count(delim)


def _scan_tables(text: str, regions: list[tuple[int, int]]) -> Iterator[str]:
    """Only the cell holding each long number is read; the header only when that cell validates."""
    named: _Named = {}
    for a, b in regions:
        while a < b and not text[a].isdigit():
            a += 1
        while b > a and not text[b - 1].isdigit():
            b -= 1
        row_start = text.rfind("\n", 0, a) + 1
        if row_start == 0:
            continue  # the first line has no header above it
        row_end = text.find("\n", b)
        line = text[row_start : row_end if row_end >= 0 else len(text)]
        delim = _row_delimiter(line)
        if delim is None:
            continue
        left = line.rfind(delim, 0, a - row_start)
        right = line.find(delim, b - row_start)
        kind = _cell_kind(line[left + len(delim) if left >= 0 else 0 : right if right >= 0 else len(line)])
        if kind is None:
            continue
        if _column_named(text, row_start, delim, _cell_index(line, left, delim), kind, named):
            yield kind
            return


# --------------------------------------------------------------------------- driver


# Cheap gates. str.find / bytes.translate run in C at memory speed, while a Python regex
# pass over 2,000 characters costs tens of microseconds (more with alternations), so the
# text is screened with literal searches first:
#   * keywords: one str.find loop per keyword over the lower-cased text;
#   * digits: the text mapped to a digit-class byte string (digit -> "0", space and "-"
#     kept, anything else -> "."), then searched for "0000 0000", "0000-0000", "00000000" (every
#     card shape holds one) and "000-00-0000";
#   * key shapes: the text mapped to a token-class byte string, then searched for runs of
#     16+ token characters; only those tokens are tried against the plugin patterns.
def _byte_table(default: bytes, mapping: dict[bytes, bytes]) -> bytes:
    table = bytearray(default * 256)
    for chars, to in mapping.items():
        for c in chars:
            table[c] = to[0]
    return bytes(table)


# Characters a key/token can be made of (plus URL and connection-string punctuation);
# quotes, brackets, commas, semicolons and whitespace end a token, so code such as
# rec["s3"]["object"]["key"] splits into short pieces that are never tried.
_TOKEN_CLASS = _byte_table(
    b" ",
    {b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.:/+=~@%?&#": b"x"},
)
_DIGIT_CLASS = _byte_table(b".", {b"0123456789": b"0", b" ": b" ", b"-": b"-"})
_LONG_RUN = b"x" * _LONG_TOKEN
_NUMBER_SEEDS = (b"00000000", b"0000 0000", b"0000-0000", b"000-00-0000", b"000 00 0000")
_KEYWORDS = tuple(
    dict.fromkeys(
        (
            "pass",
            "pw",
            "pin",
            "secret",
            "key",
            "token",
            "bearer",
            "auth",  # Authorization headers, "auth": "<base64>", redis.auth("...")
            "basic",
            "base64",
            *_PW_ROOTS,  # the nouns for "password" the words above do not find
            "cookie",
            *_PIN_NOUN_STARTS,
            "cod",  # code, codice, Türcode
            *_CRED_ROOTS,  # credentials, Zugangsdaten, inloggegevens, identifiants
            "wifi",
            "wi-fi",
            "wlan",
            "identified",
            "-u",
            "-p",  # mysql -pX, docker login -p X, sshpass -p X
            "-a",  # redis-cli -a X
        )
    )
)
_ALL_KEYWORDS = tuple((w, len(w)) for w in _KEYWORDS)
_ASCII_KEYWORDS = tuple((w, n) for w, n in _ALL_KEYWORDS if w.isascii())  # all a text of ASCII can hold
_SSN_WORDS = ("ssn", "soc", "ss#", "ss #")  # "soc" covers social, soc sec, soc. sec


def _number_regions(digits: bytes) -> list[tuple[int, int]]:
    """Spans of digits/spaces/dashes around every card- or SSN-like seed."""
    seeds = []
    for seed in _NUMBER_SEEDS:
        i = digits.find(seed)
        while i >= 0:
            seeds.append(i)
            i = digits.find(seed, i + len(seed))
    regions: list[tuple[int, int]] = []
    last_end = -1
    for i in sorted(seeds):
        if i < last_end:
            continue
        a = i
        while a > 0 and i - a < 24 and digits[a - 1] in b"0 -":
            a -= 1
        b = i
        n = len(digits)
        while b < n and b - i < 40 and digits[b] in b"0 -":
            b += 1
        regions.append((a, b))
        last_end = b
    return regions


def _scan(text: str) -> Iterator[str]:
    low = _lower_same_length(text)
    raw = text.encode("ascii", "replace")  # one byte per character, offsets kept

    for word, size in _ASCII_KEYWORDS if low.isascii() else _ALL_KEYWORDS:
        i = low.find(word)
        while i >= 0:
            kind = _keyword_hit(text, low, word, i, i + size)
            if kind:
                yield kind
            i = low.find(word, i + size)

    ws = raw.translate(_TOKEN_CLASS)
    i = ws.find(_LONG_RUN)
    while i >= 0:
        a = ws.rfind(b" ", 0, i) + 1
        b = ws.find(b" ", i)
        if b < 0:
            b = len(ws)
        tok = text[a:b]
        yield from _shapes_in_token(tok)
        if b - a >= 88 and "==" in tok and _storage_key(text, low, a, tok):
            yield API_KEY
        i = ws.find(_LONG_RUN, b)

    if "AC" in text or "SK" in text:
        yield from _scan_telephony(text)

    if "PRIVATE KEY" in text or "PuTTY-User-Key-File" in text:
        yield from _scan_private_key(text)
    if "@" in text:
        if "://" in text:
            yield from _scan_url_credentials(text)
        yield from _scan_bare_authority(text, low)
    if "(" in text:
        for found in positional_passwords(text):
            if _positional_password(found):
                yield PASSWORD
                break
    if "aws" in low:
        yield from _scan_aws_secret(text)

    digits = raw.translate(_DIGIT_CLASS)
    if b"0000" not in digits:
        return  # every card and SSN shape holds four digits in a row
    ssn_context = any(w in low for w in _SSN_WORDS)
    in_rows: list[tuple[int, int]] = []  # numbers that may be table cells
    for a, b in _number_regions(digits):
        count = digits.count(b"0", a, b)
        if count >= 9:
            in_rows.append((a, b))
        if count >= 13:
            yield from _scan_cards(text, low, a, b)
        # Bare/spaced SSNs need a context word (scanned below); 123-45-6789 needs a dash.
        if count >= 9 and not ssn_context and b"-" in digits[a:b]:
            yield from _scan_ssn(text, low, a, b)
    if ssn_context:
        # Bare ("SSN 123456789") and spaced ("123 45 6789") SSNs count only near such a word.
        yield from _scan_ssn(text, low, 0, len(text))
    if in_rows and "\n" in text:
        yield from _scan_tables(text, in_rows)


def reads_as_high(text: str) -> bool:
    """True when the text holds a high shape: an API key or token, a private key, a
    ``password=``-style assignment, a card number, an SSN or a stated PIN."""
    if not text:
        return False
    return next(_scan(text), None) is not None


def window_reads_as_high(text: str, shown_chars: int, extra: int = 1024) -> bool:
    """`reads_as_high` over the prefix a caller shows: ``text[: shown_chars + extra]``."""
    return reads_as_high(text[: max(0, shown_chars + extra)])


def high_reasons(text: str) -> list[str]:
    """The kinds of high shape found (in `KINDS` order). Never returns the secret itself."""
    if not text:
        return []
    found = set(_scan(text))
    return [k for k in KINDS if k in found]


_WORD = re.compile(r"\S+")
_MAX_HIGH_SPANS = 64  # spans located per text: bounded work on a text full of secrets


def _first_high_window(text: str, words: list[tuple[int, int]]) -> tuple[int, int] | None:
    """The shortest run of whole words that reads as high by itself: the fewest words
    from the start that read as high (a binary search: a prefix that reads as high keeps
    reading as high as it grows), then the most words dropped from their front."""
    if not words or not reads_as_high(text[: words[-1][1]]):
        return None
    lo, hi = 0, len(words) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if reads_as_high(text[: words[mid][1]]):
            hi = mid
        else:
            lo = mid + 1
    end = words[lo][1]
    first, last = 0, lo
    while first < last:
        mid = (first + last + 1) // 2
        if reads_as_high(text[words[mid][0] : end]):
            first = mid
        else:
            last = mid - 1
    return words[first][0], end


def high_spans(text: str) -> list[tuple[int, int]]:
    """The character spans ``(start, end)`` of `text` that read as high, in order: each
    the shortest run of whole (whitespace-separated) words that `reads_as_high` flags by
    itself. Built on the same detectors as `reads_as_high`, so what they flag is what is
    located: a span is taken out and the rest screened again, until nothing left reads
    as high (at most 64 spans). A shape that reads as high only with context beyond its
    words (a bare SSN next to the word "SSN") yields the words from that context on.
    When the text still reads as high once the spans are out, the whole text is one
    span (the caller removes everything rather than leave a secret)."""
    if not reads_as_high(text):
        return []
    spans: list[tuple[int, int]] = []
    # Located spans are blanked with spaces (same length, offsets kept) and not searched again.
    work = text
    for _ in range(_MAX_HIGH_SPANS):
        words = [(m.start(), m.end()) for m in _WORD.finditer(work)]
        found = _first_high_window(work, words)
        if found is None:
            break
        spans.append(found)
        a, b = found
        work = work[:a] + " " * (b - a) + work[b:]
    if reads_as_high(work):
        return [(0, len(text))]
    return sorted(spans)
