"""Shared rules of the conversation plane: roles, derived msg_ids, cursors, limits."""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import UTC, datetime
from typing import Any

from loom.errors import InvalidRequest
from loom.limits import MAX_LEXICAL_WEIGHT, MIN_LEXICAL_WEIGHT

ROLES = ("user", "assistant", "system", "tool")
EMBEDDED_ROLES = frozenset({"user", "assistant"})
EMBED_CHARS = 2_048  # a turn's embedding row keeps (and is built from) this many characters
LEGACY_EMBED_CHARS = 240  # what earlier builds kept
TITLE_REFUSED = "title_refused"

# Reason codes of an append that stored nothing (stable strings clients match on: never change one).
LOGGING_DISABLED = "logging_disabled"
DUPLICATE = "duplicate"
DELETED = "deleted"
ERASED = "erased"  # the tombstone reason of a user erasure

# The fields an embedding row shares with the transcript row of the turn it serves: the
# turn's key, who said it, and how that copy is kept (saved, and recorded or saved only).
TURN_KEY = ("namespace", "thread_id", "msg_id")
SPEAKER = ("agent", "role", "run_id", "user_id")
KEPT = ("is_saved", "saved_at", "origin")

# Embedding outcomes an append answers with.
EMBEDDED = "embedded"
FAILED = "failed"


def picked(row: object, *names: str) -> dict[str, Any]:
    """The named fields of `row`, by name: what one row copies from another."""
    return {name: getattr(row, name) for name in names}


def skipped(why: str) -> str:
    return f"skipped:{why}"


def derive_msg_id(thread_id: str, role: str, content: str) -> str:
    """The id of a turn sent without one: a hash of thread, role and content (not the
    agent), so a re-logged turn is a duplicate and two agents logging the same turn
    share the id (and so the one embedding row)."""
    h = hashlib.sha256()
    for part in (thread_id, role, content):
        data = part.encode("utf-8")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return "h_" + h.hexdigest()[:32]


def embed_text(content: str) -> str:
    return content[:EMBED_CHARS]


SPEAKERS = {"user": "User", "assistant": "Assistant"}


def model_text(text: str, role: str, is_summary: bool, speaker_prefix: bool, speaker: str = "") -> str:
    """What the embedding model reads of a turn: its kept text, behind its speaker when
    LOOM_EMBED_SPEAKER_PREFIX is on: the speaker's name where the turn's metadata gives
    one (`speaker`: transcript_postings.speaker_of, "Caroline: ..."), else its role
    ("User: ...", "Assistant: ..."); a summary is "Summary: ...". A question naming who
    said something ("what did Caroline say about ...") then meets the turn nearer. Only
    the model's input changes: the embedding row keeps the text itself (the excerpt, a
    re-embed's source and the duplicate check read it)."""
    if not speaker_prefix:
        return text
    label = "Summary" if is_summary else (speaker or SPEAKERS.get(role))
    return f"{label}: {text}" if label else text


def as_utc(dt: datetime) -> datetime:
    """ClickHouse returns naive UTC datetimes; make them aware."""
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)


def micros(dt: datetime) -> int:
    dt = as_utc(dt)
    return (int(dt.replace(microsecond=0).timestamp()) * 1_000_000) + dt.microsecond


def encode_cursor(payload: dict[str, Any]) -> str:
    raw = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, *, expect: dict[str, Any]) -> dict[str, Any]:
    """A cursor this server issued for the same listing (`expect` names what must match)."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        payload = json.loads(raw)
        if not isinstance(payload, dict):
            raise ValueError("not an object")
    except ValueError:
        raise InvalidRequest("cursor is not one this server issued", field="cursor", rule="opaque") from None
    for key, value in expect.items():
        if payload.get(key) != value:
            raise InvalidRequest(
                "cursor belongs to another listing (thread, order or filter changed)",
                field="cursor",
                rule="same_listing",
            )
    return payload


def check_lexical_weight(lexical_weight: float) -> None:
    """The range of hybrid mode's lexical_weight (both conversation searches)."""
    if not MIN_LEXICAL_WEIGHT <= lexical_weight <= MAX_LEXICAL_WEIGHT:
        raise InvalidRequest(
            f"lexical_weight must be between {MIN_LEXICAL_WEIGHT:g} and {MAX_LEXICAL_WEIGHT:g}",
            field="lexical_weight",
            rule="range",
        )


RRF_K = 60  # reciprocal rank fusion's k


def rrf_score(vector_rank: int | None, lexical_rank: int | None, lexical_weight: float) -> float:
    """Hybrid mode's fused score (both conversation searches): the lexical leg's
    1 / (k + rank) weighted by lexical_weight, the vector leg's by 1 - lexical_weight."""
    score = (1.0 - lexical_weight) / (RRF_K + vector_rank) if vector_rank else 0.0
    return score + (lexical_weight / (RRF_K + lexical_rank) if lexical_rank else 0.0)
