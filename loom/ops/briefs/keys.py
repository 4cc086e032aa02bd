"""Brief keys: validation, the automatic key, and how each kind of token sees keys.

* An empty ``brief_key`` becomes ``auto/<project>/<branch>`` (a missing one of the two
  is written ``-``), or ``session/<session_id>`` when neither is known. Characters a key
  may not hold are replaced by ``-`` in those derived keys, which are cut to 160.
* Keys match :data:`KEY_RE`; anything else is a 400 naming ``brief_key``.
* A token bound to one user (``own_user``) stores its briefs as ``~<user>~<key>``, one
  bound to a session (``own_session``) as ``~<user>~<session>~<key>``; both see and send
  ``<key>`` and see only their own briefs. Sending a key with ``~`` is a 403.
* A namespace-wide token sees every brief, bounded ones with their prefix, and may get
  or delete (not save) a prefixed key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from loom.auth.principal import Principal
from loom.errors import Forbidden, InvalidRequest

KEY_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.:/@+-]{0,159}"
KEY_RE = re.compile(rf"^{KEY_PATTERN}$")
PREFIXED_RE = re.compile(rf"^~([^~]*)~(?:([^~]+)~)?({KEY_PATTERN})$")
_BAD_CHARS = re.compile(r"[^A-Za-z0-9_.:/@+-]")


def _slug(part: str) -> str:
    return _BAD_CHARS.sub("-", part.strip()) or "-"


def derive_key(brief_key: str, project: str, branch: str, session_id: str) -> str:
    """The key a save or get addresses: the one given, else the automatic one."""
    if brief_key:
        return brief_key
    if project or branch:
        return f"auto/{_slug(project)}/{_slug(branch)}"[:160]
    if session_id:
        return f"session/{_slug(session_id)}"[:160]
    raise InvalidRequest(
        "give brief_key, or project/branch, or session_id to name the brief",
        field="brief_key",
        rule="required",
    )


def check_key(key: str, field: str = "brief_key") -> str:
    if not KEY_RE.match(key):
        raise InvalidRequest(
            f"brief_key {key[:200]!r} must match ^{KEY_PATTERN}$", field=field, rule="pattern"
        )
    return key


@dataclass(frozen=True)
class KeyScope:
    """How one principal's keys map to stored keys. ``prefix`` is '' for a namespace-wide token."""

    prefix: str = ""
    session_bound: bool = False

    @classmethod
    def of(cls, who: Principal) -> KeyScope:
        if not who.bounded:
            return cls()
        user, session = who.read_user_id, who.read_session_id
        if "~" in user or "~" in session:
            raise Forbidden(
                "a token whose user or session id holds '~' cannot keep briefs", rule="read_scope"
            )
        if who.read_scope == "own_session":
            return cls(f"~{user}~{session}~", True)
        return cls(f"~{user}~")

    @property
    def bounded(self) -> bool:
        return bool(self.prefix)

    def for_write(self, key: str) -> str:
        """The stored key a save writes (a `~` key is never accepted here)."""
        if "~" in key:
            self._refuse_tilde()
            check_key(key)
        return self.prefix + check_key(key)

    def for_read(self, key: str) -> str:
        """The stored key a get or delete addresses."""
        if "~" in key:
            if self.bounded:
                self._refuse_tilde()
            if not PREFIXED_RE.match(key):
                raise InvalidRequest(
                    "a prefixed key is ~<user>~<key> or ~<user>~<session>~<key>",
                    field="brief_key",
                    rule="pattern",
                )
            return key
        return self.prefix + check_key(key)

    def _refuse_tilde(self) -> None:
        if self.bounded:
            raise Forbidden(
                "a token bound to one user or session cannot send a '~' key", field="brief_key", rule="scope"
            )

    def show(self, stored: str) -> str:
        """The key as this principal sees it."""
        if self.prefix and stored.startswith(self.prefix):
            return stored[len(self.prefix) :]
        return stored

    def visible(self, stored: str) -> bool:
        if not self.prefix:
            return True
        return stored.startswith(self.prefix) and "~" not in stored[len(self.prefix) :]
