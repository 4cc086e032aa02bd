"""Minting and verifying bearer tokens. Tokens are `loom_<id>_<secret>`; only the
sha256 of the secret is stored, so a leaked table cannot be replayed."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
import time
from dataclasses import dataclass
from datetime import UTC, timedelta

from clickhouse_connect.driver.client import Client

from loom.auth.principal import READ_SCOPES, Principal, Role
from loom.clock import utcnow
from loom.errors import InvalidRequest
from loom.store import tokens as store

_TOKEN = re.compile(r"^loom_([a-f0-9]{16})_([A-Za-z0-9_-]{20,})$")
NAMESPACE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class Minted:
    token: str
    token_id: str


def mint(
    ch: Client,
    namespaces: list[str],
    role: str,
    read_scope: str = "all",
    read_user_id: str = "",
    read_session_id: str = "",
    label: str = "",
    expires_in: timedelta | None = None,
) -> Minted:
    if not namespaces:
        raise InvalidRequest("at least one namespace is needed", field="namespace")
    for ns in namespaces:
        if not NAMESPACE_RE.match(ns):
            raise InvalidRequest(f"bad namespace {ns!r}: letters, digits and _.:- only", field="namespace")
    if role not in Role.__members__:
        raise InvalidRequest(f"role must be viewer, writer or admin, not {role!r}", field="role")
    if read_scope not in READ_SCOPES:
        raise InvalidRequest(f"read scope must be one of {', '.join(READ_SCOPES)}", field="read_scope")
    if read_scope == "own_user" and not read_user_id:
        raise InvalidRequest("--read-scope own_user needs --read-user-id", field="read_user_id")
    if read_scope == "own_session" and not read_session_id:
        raise InvalidRequest("--read-scope own_session needs --read-session-id", field="read_session_id")
    if expires_in is not None and expires_in <= timedelta(0):
        raise InvalidRequest("a token's lifetime must be positive", field="expires_in")
    token_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    store.insert(
        ch,
        store.TokenRow(
            token_id=token_id,
            token_hash=_hash(secret),
            namespaces=namespaces,
            role=role,
            read_scope=read_scope,
            read_user_id=read_user_id,
            read_session_id=read_session_id,
            label=label,
            created_at=utcnow(),
            revoked=False,
            expires_at=utcnow() + expires_in if expires_in is not None else None,
        ),
    )
    return Minted(f"loom_{token_id}_{secret}", token_id)


def revoke(ch: Client, token_id: str) -> bool:
    row = store.get(ch, token_id)
    if row is None:
        return False
    store.insert(ch, store.TokenRow(**{**row.__dict__, "revoked": True}))
    _cache.clear()
    return True


class _Cache:
    """Verified tokens for a few seconds, so auth is not a query per request.
    A revoke in another process takes effect within TTL seconds."""

    TTL = 5.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[str, tuple[float, Principal | None]] = {}

    def get(self, token: str) -> tuple[bool, Principal | None]:
        with self._lock:
            hit = self._items.get(token)
        if hit and hit[0] > time.monotonic():
            who = hit[1]
            # A token verified a moment ago may have expired since.
            return True, None if who is not None and who.expired(utcnow()) else who
        return False, None

    def put(self, token: str, principal: Principal | None) -> None:
        with self._lock:
            if len(self._items) > 10_000:
                self._items.clear()
            self._items[token] = (time.monotonic() + self.TTL, principal)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


_cache = _Cache()


def cached(token: str) -> tuple[bool, Principal | None]:
    """(True, principal) if `token` was verified within the cache TTL: no I/O, so the
    API checks this on its event loop and only hops to a thread on a miss."""
    return _cache.get(token)


def verify(ch: Client, token: str) -> Principal | None:
    hit, principal = _cache.get(token)
    if hit:
        return principal
    principal = _lookup(ch, token)
    _cache.put(token, principal)
    return principal


def _lookup(ch: Client, token: str) -> Principal | None:
    m = _TOKEN.match(token)
    if not m:
        return None
    row = store.get(ch, m.group(1))
    if row is None or row.revoked or not hmac.compare_digest(row.token_hash, _hash(m.group(2))):
        return None
    who = Principal(
        row.token_id,
        tuple(row.namespaces),
        Role[row.role],
        row.read_scope,
        row.read_user_id,
        row.read_session_id,
        row.expires_at.replace(tzinfo=UTC) if row.expires_at is not None else None,
    )
    return None if who.expired(utcnow()) else who


_LIFETIME = re.compile(r"^(\d+)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_lifetime(text: str) -> timedelta:
    """`30d`, `12h`, `90m` or `3600s` as a timedelta; InvalidRequest otherwise."""
    m = _LIFETIME.match(text.strip())
    if not m or int(m.group(1)) == 0:
        raise InvalidRequest(
            f"a lifetime is a positive number and a unit (s, m, h, d), such as 30d, not {text!r}",
            field="expires_in",
        )
    return timedelta(**{_UNITS[m.group(2)]: int(m.group(1))})
