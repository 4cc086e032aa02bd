"""Who is calling: the verified token, and the rules of what it may touch."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import IntEnum

from loom.errors import Forbidden


class Role(IntEnum):
    viewer = 1
    writer = 2
    admin = 3


READ_SCOPES = ("all", "own_user", "own_session")
ME = "@me"


@dataclass(frozen=True)
class Principal:
    token_id: str
    namespaces: tuple[str, ...]
    role: Role
    read_scope: str = "all"
    read_user_id: str = ""
    read_session_id: str = ""
    expires_at: datetime | None = None  # None: the token never expires

    def expired(self, now: datetime) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    @property
    def bounded(self) -> bool:
        """Pinned to one user (or one session): an end-user token."""
        return self.read_scope != "all"

    def require_role(self, role: Role) -> None:
        if self.role < role:
            raise Forbidden(
                f"this op needs the {role.name} role; the token has {self.role.name}", rule="role"
            )

    def namespace(self, requested: str) -> str:
        """Resolve a request's namespace (or `@me`) to one this token may use."""
        if requested == ME:
            if not self.bounded:
                raise Forbidden(
                    "namespace '@me' is for tokens bound to one user", field="namespace", rule="scope"
                )
            if len(self.namespaces) != 1:
                raise Forbidden(
                    "'@me' needs a token bound to exactly one namespace", field="namespace", rule="scope"
                )
            return self.namespaces[0]
        if requested not in self.namespaces:
            raise Forbidden(
                f"the token does not grant namespace {requested!r}", field="namespace", rule="scope"
            )
        return requested
