"""memory.search's time phrases: a time the question names bounds the facts' validity.

The phrase is read by the parser conversation.search uses (loom.query_time); here the
window it sets becomes a read over validity:

* a window with an end ("in May 2025", "last week", "before 3 March 2024"): the facts
  as they stood just before that end (an as-of read, superseded facts included), never
  later than now;
* a window with a start only ("since March", "in the last two weeks"): the current
  facts that became true at or after that start. The search ranks a deeper pool
  (SINCE_DEPTH times the page, at most SINCE_MAX) and keeps the page from it.

A question asking for a time ("when did ...") and an anchor ("before the move") set no
window: a fact has no turn time to resolve an event against. When the window holds no
fact the search answers without it (``applied`` False): the question may not have meant
one. An explicit `as_of` wins over the words.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from loom import query_time
from loom.errors import InvalidRequest

TIME_FILTER = "filter"
TIME_PHRASES = (TIME_FILTER, "ignore")
SINCE_DEPTH = 5  # the pool a since-only window is cut from, in pages
SINCE_MAX = 500
_TICK = timedelta(microseconds=1)


@dataclass(frozen=True)
class FactWindow:
    """What a query's time phrase asks of the facts: read `as_of` (None: now), keep those
    with valid_from >= `since` (None: all); `applied` False when the window held no
    fact and the search answered without it."""

    phrase: str
    as_of: datetime | None
    since: datetime | None
    applied: bool = True


def check(time_phrases: str) -> None:
    if time_phrases not in TIME_PHRASES:
        raise InvalidRequest(
            f"time_phrases must be one of {', '.join(TIME_PHRASES)}", field="time_phrases", rule="one_of"
        )


def of(query: str, now: datetime) -> FactWindow | None:
    """The window the query's words set over the facts, or None."""
    if query_time.asks_when(query):
        return None
    found = query_time.window(query, now)
    if found is None or found.anchor:
        return None
    if found.until is not None:
        return FactWindow(found.phrase, min(found.until - _TICK, now), None)
    if found.since is not None:
        return FactWindow(found.phrase, None, found.since)
    return None


def pool(limit: int, window: FactWindow) -> int:
    """How many hits to rank before the window keeps `limit` of them."""
    return limit if window.since is None else max(limit, min(limit * SINCE_DEPTH, SINCE_MAX))


def keeps(window: FactWindow, valid_from: datetime) -> bool:
    return window.since is None or valid_from >= window.since
