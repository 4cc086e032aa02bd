"""The words loom.sensitivity reads a stated secret by, in every language it knows.

The lists are data (sensitivity_words.json, beside this module): per language, the nouns
for a password and a PIN, what a "code" opens, the verbs meaning "is", the determiners and
possessives that sit between such a verb and the noun, the prepositions that may follow the
noun, the adverbs that may stand between the verb and the value, the words that call a PIN
the documented default, the nouns for a user and password pair and for a Wi-Fi key, and the
words a template value is made of (``your_password_here``,
``tu_contraseña_aquí``). ``credential_calls`` names the calls that take a password as a
positional argument, and where. Adding a language is adding a block there (and its tests in
tests/test_sensitivity_languages.py); the rules in loom/sensitivity.py read the union.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PATH = Path(__file__).with_name("sensitivity_words.json")

AFTER_USER = "after_user"  # (host[, port], user, password, ...) or (user, password, ...)

# Where the password sits in a call: by the number of positional arguments, or AFTER_USER.
CallRule = dict[int, int] | str


@dataclass(frozen=True)
class Language:
    password: tuple[str, ...]
    pin: tuple[str, ...]
    code_places: tuple[str, ...]
    code_prefixes: tuple[str, ...]
    is_words: tuple[str, ...]
    as_words: tuple[str, ...]
    this_words: tuple[str, ...]
    determiners: tuple[str, ...]
    owners: tuple[str, ...]
    placeholder: tuple[str, ...]
    prepositions: tuple[str, ...]
    fillers: tuple[str, ...]
    defaults: tuple[str, ...]
    credentials: tuple[str, ...]
    key: tuple[str, ...]


_FIELDS = {
    "password": "password",
    "pin": "pin",
    "code_places": "code_places",
    "code_prefixes": "code_prefixes",
    "is": "is_words",
    "as": "as_words",
    "this": "this_words",
    "determiners": "determiners",
    "owners": "owners",
    "placeholder": "placeholder",
    "prepositions": "prepositions",
    "fillers": "fillers",
    "defaults": "defaults",
    "credentials": "credentials",
    "key": "key",
}


@dataclass(frozen=True)
class Lexicon:
    languages: dict[str, Language]
    calls: dict[str, CallRule]

    def union(self, field: str) -> tuple[str, ...]:
        """Every language's words of one field, deduplicated, longest first (for regex alternations)."""
        words = {w for lang in self.languages.values() for w in getattr(lang, field)}
        return tuple(sorted(words, key=lambda w: (-len(w), w)))

    def without(self, field: str, language: str) -> tuple[str, ...]:
        """One field's words in every language but one."""
        words = {w for code, lang in self.languages.items() if code != language for w in getattr(lang, field)}
        return tuple(sorted(words, key=lambda w: (-len(w), w)))


def _language(code: str, raw: dict[str, Any]) -> Language:
    missing = set(_FIELDS) - set(raw)
    if missing:
        raise ValueError(f"{PATH.name}: language {code!r} lacks {sorted(missing)}")
    fields: dict[str, tuple[str, ...]] = {}
    for key, attr in _FIELDS.items():
        words = raw[key]
        if not all(isinstance(w, str) and w and w == w.lower() for w in words):
            raise ValueError(f"{PATH.name}: {code}.{key} must hold non-empty lower-case strings")
        fields[attr] = tuple(words)
    return Language(**fields)


def _call_rule(name: str, raw: Any) -> CallRule:
    if raw == AFTER_USER:
        return AFTER_USER
    if not isinstance(raw, dict) or not all(
        k.isdigit() and isinstance(v, int) and 0 <= v < int(k) for k, v in raw.items()
    ):
        raise ValueError(
            f"{PATH.name}: credential_calls.{name} must map an argument count to an index below it"
        )
    return {int(k): v for k, v in raw.items()}


def load(path: Path = PATH) -> Lexicon:
    raw = json.loads(path.read_text(encoding="utf-8"))
    languages = {code: _language(code, block) for code, block in raw["languages"].items()}
    calls = {
        name: _call_rule(name, rule) for name, rule in raw["credential_calls"].items() if name != "_about"
    }
    return Lexicon(languages=languages, calls=calls)


WORDS = load()
