"""What a failure may say, and to whom.

A failure's text that is stored in a row (an embedding row's ``error``) or returned to
a client (an append's ``embedding_error``, a re-embed report) is a stable code and a
short fixed message, ``"<code>: <message>"``, built here and nowhere else. It never
carries an exception's own text: a driver's message can hold the internal query's
parameters (other namespaces' thread and message ids, when a flush spanned several),
the internal URL and port; a provider's can echo the text it was sent.

The exception itself is for the server's log only, through :func:`detail`, which keeps
its type and message but drops URL query strings (where a driver puts query
parameters) and any response body a provider sent back (which may echo the text), so
that no turn's content reaches a log line either.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

# The codes (stable: clients may match on them).
EMBEDDER_UNAVAILABLE: Final = "embedder_unavailable"  # the embedding provider failed or was unreachable
EMBEDDER_TIMEOUT: Final = "embedder_timeout"  # no embedding came back within the wait
BACKEND_UNAVAILABLE: Final = "backend_unavailable"  # the store or the queue failed
INTERNAL_ERROR: Final = "internal_error"  # anything else

_MESSAGES: Final = {
    EMBEDDER_UNAVAILABLE: "the embedding provider could not embed the text",
    EMBEDDER_TIMEOUT: "no embedding came back in time",
    BACKEND_UNAVAILABLE: "the store or the queue was unavailable",
    INTERNAL_ERROR: "the embedding could not be completed",
}
CODES: Final = frozenset(_MESSAGES)

_DETAIL_CHARS = 300
_QUERY_STRING = re.compile(
    r"((?:\b[a-z][a-z0-9+.-]*://|(?<![\w/.])/)[^\s?'\"()<>]*)\?[^\s'\"()<>]*", re.IGNORECASE
)
_PARAMS = re.compile(r"\b(param_\w+|query)=[^\s&'\"()<>]*", re.IGNORECASE)
# A provider's answer (loom.providers._http): "HTTP 400 Bad Request: <its body>" and
# "response is not valid JSON (...): '<its body>'" may echo the text that was sent.
_PROVIDER_BODY = re.compile(r"(HTTP \d{3}[^:]*|response is not valid JSON)\b.*", re.DOTALL)
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_ECHO = 12  # a run of this many characters of a text sent, found in a message: it quotes the text


def text(code: str) -> str:
    """The stored and answered text of a failure: its code and fixed message."""
    return f"{code}: {_MESSAGES.get(code, _MESSAGES[INTERNAL_ERROR])}"


def code_of(failure_text: str) -> str:
    """The code a failure text starts with ('' for none)."""
    head = failure_text.split(":", 1)[0].strip()
    return head if head in CODES else ""


def safe(failure_text: str | None) -> str:
    """A failure text fit to store or answer: the fixed text of the code it starts
    with, or internal_error's (anything else, such as a text an earlier build stored,
    is never passed on)."""
    return text(code_of(failure_text or "") or INTERNAL_ERROR)


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in seen and len(seen) < 8:
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    return seen


def _is_timeout(exc: BaseException) -> bool:
    import httpx

    return any(isinstance(e, TimeoutError | httpx.TimeoutException) for e in _chain(exc))


def embed_failure(exc: BaseException) -> str:
    """The text of a failed model call (the provider, local or remote, raised)."""
    return text(EMBEDDER_TIMEOUT if _is_timeout(exc) else EMBEDDER_UNAVAILABLE)


def failure(exc: BaseException) -> str:
    """The text of any other failure around an embedding (queueing it, waiting for it,
    writing it): the store, Redis or a lease is backend_unavailable, a wait that ran
    out embedder_timeout, anything else internal_error."""
    from clickhouse_connect.driver.exceptions import ClickHouseError
    from redis.exceptions import RedisError

    from loom.leases import LeaseLost, LeaseTimeout

    chain = _chain(exc)
    if any(isinstance(e, ClickHouseError | RedisError | LeaseTimeout | LeaseLost) for e in chain):
        return text(BACKEND_UNAVAILABLE)
    if _is_timeout(exc):
        return text(EMBEDDER_TIMEOUT)
    if any(isinstance(e, OSError) for e in chain):  # a connection refused or reset
        return text(BACKEND_UNAVAILABLE)
    return text(INTERNAL_ERROR)


def _quotes(message: str, texts: Sequence[str]) -> bool:
    runs = {message[i : i + _ECHO] for i in range(max(0, len(message) - _ECHO + 1))}
    return any(t[i : i + _ECHO] in runs for t in texts for i in range(max(0, len(t) - _ECHO + 1)))


def detail(exc: BaseException, *, sent: Sequence[str] = ()) -> str:
    """For the server's log only: the exception's type and message, without URL query
    strings, query parameters or a provider's response body, and truncated. For a
    provider's failure, `sent` names the texts it was sent: quoted parts of its message
    are withheld, and the whole message if it still holds a run of any of them."""
    message = str(exc)
    message = _QUERY_STRING.sub(r"\1?…", message)
    message = _PARAMS.sub(r"\1=…", message)
    message = _PROVIDER_BODY.sub(r"\1 (body withheld)", message)
    if sent:
        message = _QUOTED.sub("'…'", message)
        if _quotes(message, sent):
            message = "(message withheld: it quotes the text sent)"
    out = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return out if len(out) <= _DETAIL_CHARS else out[:_DETAIL_CHARS] + "…"


__all__ = [
    "BACKEND_UNAVAILABLE",
    "CODES",
    "EMBEDDER_TIMEOUT",
    "EMBEDDER_UNAVAILABLE",
    "INTERNAL_ERROR",
    "code_of",
    "detail",
    "embed_failure",
    "failure",
    "safe",
    "text",
]
