"""Loom's webhook signatures: how a delivery is signed, and how a receiver verifies it.

Every delivery carries the header ``Loom-Signature: t=<unix seconds>,v1=<hex>``, where
the hex is HMAC-SHA256, keyed with the namespace's webhook secret (the hex string
Loom showed at registration or rotation, used as its UTF-8 bytes), over
``"<t>." + <the raw request body>``. A receiver recomputes it over the raw body (before
any JSON parsing), compares in constant time, and refuses a ``t`` too far from its own
clock (a replayed delivery). Standard library only: a receiver may copy this file.

    from loom.sdk.webhooks import verify_signature, SignatureError
    try:
        verify_signature(request_body_bytes, request.headers["Loom-Signature"], secret)
    except SignatureError:
        return 400
"""

from __future__ import annotations

import hashlib
import hmac
import time

__all__ = ["HEADER", "SignatureError", "TOLERANCE_S", "sign", "signature_header", "verify_signature"]

HEADER = "Loom-Signature"
TOLERANCE_S = 300  # how far a delivery's t may be from the receiver's clock, by default


class SignatureError(ValueError):
    """The signature header is missing, malformed, stale or does not match the body."""


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The v1 signature (hex) of `body` sent at `timestamp`."""
    message = str(timestamp).encode() + b"." + body
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def signature_header(secret: str, body: bytes, timestamp: int | None = None) -> str:
    """The ``Loom-Signature`` header's value for `body` (now, unless `timestamp`)."""
    t = int(time.time()) if timestamp is None else timestamp
    return f"t={t},v1={sign(secret, t, body)}"


def _parse(header: str) -> tuple[int, list[str]]:
    t: int | None = None
    sigs: list[str] = []
    for part in header.split(","):
        name, _, value = part.strip().partition("=")
        if name == "t" and value.isdigit():
            t = int(value)
        elif name == "v1" and value:
            sigs.append(value)
    if t is None or not sigs:
        raise SignatureError("the signature header needs t=<unix seconds> and at least one v1=<hex>")
    return t, sigs


def verify_signature(
    body: bytes | str,
    header: str | None,
    secret: str,
    *,
    tolerance_s: int = TOLERANCE_S,
    now: float | None = None,
) -> int:
    """Check a delivery: returns its timestamp, or raises SignatureError. `body` is the
    raw request body as received; any v1 signature in the header may match (several
    are allowed, as Stripe allows them); ``tolerance_s <= 0`` skips the clock check."""
    if not header:
        raise SignatureError(f"no {HEADER} header")
    raw = body.encode() if isinstance(body, str) else body
    t, sigs = _parse(header)
    if tolerance_s > 0 and abs((time.time() if now is None else now) - t) > tolerance_s:
        raise SignatureError(
            "the signature's timestamp is outside the tolerance (a replay, or a skewed clock)"
        )
    expected = sign(secret, t, raw)
    if not any(hmac.compare_digest(expected, s) for s in sigs):
        raise SignatureError("no v1 signature matches the body")
    return t
