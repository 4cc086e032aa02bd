"""Append and search rates from the process's own counters (health.show).

Prometheus counters are totals since the process started; a rate needs two readings.
`Sampler` keeps a short ring of (monotonic time, totals) readings, taken by every
health.show and by a light background task of the API (`sample_every`, every
SAMPLE_EVERY_S), and answers the rate over the last WINDOW_S (or over the readings it
has, with the window's true length in the answer).

The figures are this process's: an API runs in one process, a deployment of several
API processes has one sampler each (Prometheus, scraping /metrics, sums them).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import REGISTRY

from loom import logging as loom_logging

log = loom_logging.get("loom.rates")

# The metrics read (loom.api.observe REQUESTS, loom.ops.conversation.writing.appending APPENDED
# and EMBEDDINGS), by sample name: the registry is asked for these alone.
REQUESTS_TOTAL = "loom_requests_total"
APPENDED_TOTAL = "loom_append_turns_total"
EMBEDDINGS_TOTAL = "loom_append_embeddings_total"
APPEND_ROUTES = frozenset({"/v1/conversation.append"})
SEARCH_ROUTES = frozenset({"/v1/conversation.search", "/v1/conversation.search_saved_messages"})

WINDOW_S = 60.0
SAMPLE_EVERY_S = 10.0
MIN_SPACING_S = 1.0  # readings closer than this are not kept (a busy dashboard adds none)
_KEPT = int(WINDOW_S / MIN_SPACING_S) + 8


@dataclass(frozen=True)
class Totals:
    append_requests: float = 0.0
    search_requests: float = 0.0
    appended: dict[str, float] = field(default_factory=dict)  # turns, by append outcome
    embeddings: dict[str, float] = field(default_factory=dict)  # turns, by embedding outcome

    @property
    def turns_stored(self) -> float:
        return self.appended.get("stored", 0.0)


@dataclass(frozen=True)
class Rates:
    window_s: float  # what the rates are over (0: one reading only, no rate yet)
    append_requests_per_s: float | None
    turns_stored_per_s: float | None
    searches_per_s: float | None


def read_totals() -> Totals:
    """The counters' current totals (a restricted collect: these metrics only)."""
    appends = searches = 0.0
    appended: dict[str, float] = {}
    embeddings: dict[str, float] = {}
    wanted = [REQUESTS_TOTAL, APPENDED_TOTAL, EMBEDDINGS_TOTAL]
    for metric in REGISTRY.restricted_registry(wanted).collect():
        for s in metric.samples:
            if s.name == REQUESTS_TOTAL:
                route = s.labels.get("route", "")
                if route in APPEND_ROUTES:
                    appends += s.value
                elif route in SEARCH_ROUTES:
                    searches += s.value
            elif s.name == APPENDED_TOTAL:
                appended[s.labels["outcome"]] = s.value
            elif s.name == EMBEDDINGS_TOTAL:
                embeddings[s.labels["outcome"]] = s.value
    return Totals(appends, searches, appended, embeddings)


class Sampler:
    def __init__(
        self,
        read: Callable[[], Totals] = read_totals,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read, self._clock = read, clock
        self._ring: deque[tuple[float, Totals]] = deque(maxlen=_KEPT)

    def sample(self) -> tuple[float, Totals]:
        """A reading now, kept unless the last kept one is under MIN_SPACING_S old."""
        at, totals = self._clock(), self._read()
        if not self._ring or at - self._ring[-1][0] >= MIN_SPACING_S:
            self._ring.append((at, totals))
        return at, totals

    def rates(self) -> tuple[Rates, Totals]:
        """The rates over the last WINDOW_S (from a reading now), and the totals now."""
        at, now = self.sample()
        then_at, then = self._oldest_within(at)
        span = at - then_at
        if span <= 0:
            return Rates(0.0, None, None, None), now

        def per_s(a: float, b: float) -> float:
            return round(max(0.0, a - b) / span, 3)  # a counter never goes back; guard anyway

        return (
            Rates(
                window_s=round(span, 1),
                append_requests_per_s=per_s(now.append_requests, then.append_requests),
                turns_stored_per_s=per_s(now.turns_stored, then.turns_stored),
                searches_per_s=per_s(now.search_requests, then.search_requests),
            ),
            now,
        )

    def _oldest_within(self, at: float) -> tuple[float, Totals]:
        """The oldest reading of the window; with none in it but the current one, the
        newest before it (a longer window, answered as such); none at all: the current."""
        older = [(then_at, then) for then_at, then in self._ring if then_at < at]
        if not older:
            return self._ring[-1]
        within = [r for r in older if at - r[0] <= WINDOW_S]
        return within[0] if within else older[-1]


SAMPLER = Sampler()


async def sample_every(interval_s: float = SAMPLE_EVERY_S, sampler: Sampler = SAMPLER) -> None:
    """The API's background readings (a task of its lifespan; cancelled at shutdown)."""
    while True:
        try:
            sampler.sample()
        except Exception as exc:  # a reading missed widens the window; it must not end the task
            log.warning("could not read the request counters", error=type(exc).__name__)
        await asyncio.sleep(interval_s)
