"""The SDK's one way to call Loom over HTTP: `POST /v1/<op>` with a bearer token, the
API's error body raised as :class:`LoomError`, and retries where a retry is safe.

A retry is safe for an idempotent call (every read; an append, which is idempotent by
its msg_id; a save, by its message id). The API answers 503 with `Retry-After` while a
backend restarts; a connection error means the API itself is restarting. Either is
retried with backoff (honouring `Retry-After`, capped), a few times, then raised.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, TypedDict

import httpx

# The client's environment (the server's settings are loom.settings; these are read by
# clients only: the SDK, `loom ingest-transcript`, the capture hooks).
ENV_URL = "LOOM_URL"
ENV_TOKEN = "LOOM_TOKEN"
CLIENT_ENV = (ENV_URL, ENV_TOKEN)
DEFAULT_URL = "http://127.0.0.1:7777"

RETRY_STATUSES = frozenset({502, 503, 504})
RETRY_ERRORS = (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
FIRST_BACKOFF_S = 0.25
MAX_BACKOFF_S = 5.0


class LoomError(Exception):
    """An op refused or failed: the API's `error` code, `message`, and the `field` and
    `rule` a 4xx names (None when the call never got an answer: status 0)."""

    def __init__(
        self, status: int, error: str, message: str, field: str | None = None, rule: str | None = None
    ) -> None:
        super().__init__(f"{status} {error}: {message}" + (f" ({field}: {rule})" if field else ""))
        self.status, self.error, self.message, self.field, self.rule = status, error, message, field, rule


@dataclass(frozen=True)
class Retry:
    attempts: int = 5  # in all, the first included
    first_backoff_s: float = FIRST_BACKOFF_S
    max_backoff_s: float = MAX_BACKOFF_S


class Connection(TypedDict, total=False):
    """How an Agent reaches the API: Transport's keyword arguments, which Agent (and
    SyncAgent) take as they are and hand on."""

    base_url: str | None
    token: str | None
    timeout_s: float
    retry: Retry | None
    http_transport: httpx.AsyncBaseTransport | None


def resolve_url(base_url: str | None) -> str:
    return (base_url or os.environ.get(ENV_URL) or DEFAULT_URL).rstrip("/")


def resolve_token(token: str | None) -> str:
    found = token or os.environ.get(ENV_TOKEN, "")
    if not found:
        raise LoomError(0, "no_token", f"no token: pass one, or set {ENV_TOKEN}")
    return found


class Transport:
    """One base URL and token; `call` is one op."""

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        *,
        timeout_s: float = 60.0,
        retry: Retry | None = None,
        http_transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        # http_transport: how requests travel (default: the network); the dashboard passes
        # an in-process one to call the API it is part of.
        self.base_url = resolve_url(base_url)
        self.retry = retry or Retry()
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {resolve_token(token)}"},
            timeout=timeout_s,
            transport=http_transport,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def call(self, op: str, body: dict[str, Any] | bytes, *, idempotent: bool = True) -> dict[str, Any]:
        """POST the op; its JSON answer, or LoomError (after retries, when `idempotent`).
        `body` may be the JSON already encoded (a bulk client encodes its batches itself)."""
        attempts = self.retry.attempts if idempotent else 1
        backoff = self.retry.first_backoff_s
        sent: dict[str, Any] = (
            {"content": body, "headers": {"content-type": "application/json"}}
            if isinstance(body, bytes)
            else {"json": body}
        )
        for attempt in range(1, attempts + 1):
            last = attempt == attempts
            try:
                r = await self._http.post(f"/v1/{op}", **sent)
            except RETRY_ERRORS as exc:
                if last:
                    raise LoomError(0, "unreachable", f"{self.base_url}: {type(exc).__name__}") from None
            else:
                if r.status_code < 400:
                    answer: dict[str, Any] = r.json()
                    return answer
                if r.status_code not in RETRY_STATUSES or last:
                    raise error_from(r)
                backoff = max(backoff, _retry_after(r))
            await asyncio.sleep(min(backoff, self.retry.max_backoff_s))
            backoff *= 2
        raise AssertionError("unreachable")  # the loop returns or raises

    async def stream_lines(self, op: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """POST the op and yield its NDJSON answer line by line (not retried: a stream
        half read cannot be resumed; the caller runs it again)."""
        try:
            async with self._http.stream("POST", f"/v1/{op}", json=body) as r:
                if r.status_code >= 400:
                    await r.aread()
                    raise error_from(r)
                async for line in r.aiter_lines():
                    if line.strip():
                        yield json.loads(line)
        except RETRY_ERRORS as exc:
            raise LoomError(0, "unreachable", f"{self.base_url}: {type(exc).__name__}") from None

    async def stream_bytes(self, op: str, body: dict[str, Any]) -> AsyncIterator[bytes]:
        """POST the op and yield its answer's bytes as they come, as sent (a compressed
        export stays compressed); not retried, as stream_lines."""
        try:
            async with self._http.stream("POST", f"/v1/{op}", json=body, timeout=None) as r:
                if r.status_code >= 400:
                    await r.aread()
                    raise error_from(r)
                async for chunk in r.aiter_raw():
                    yield chunk
        except RETRY_ERRORS as exc:
            raise LoomError(0, "unreachable", f"{self.base_url}: {type(exc).__name__}") from None


def _retry_after(r: httpx.Response) -> float:
    try:
        return float(r.headers.get("retry-after", "0"))
    except ValueError:
        return 0.0


def error_from(r: httpx.Response) -> LoomError:
    """The LoomError an API answer of status >= 400 carries (its JSON error body)."""
    try:
        body = r.json()
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    return LoomError(
        r.status_code,
        str(body.get("error") or "http_error"),
        str(body.get("message") or r.reason_phrase),
        body.get("field"),
        body.get("rule"),
    )
