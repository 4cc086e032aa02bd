"""What the read index holds, how events change it, and when a search may trust it.

Namespaces are loaded from ClickHouse (loom.store.read_index.rows) one at a time in
the background: at start (every namespace with embedding rows, largest first, while the
budget holds), when a search asks for one the index does not hold, and again after a
namespace-wide mark (an erasure). Events for a namespace being loaded are kept aside
and applied once its rows are in, by version (loom.read_index.vectors), so an event the
read already saw changes nothing and one it missed is not lost. A thread whose marks
were raised (its rows rewritten or removed) is re-read the same way.

When a candidate may be answered as the index holds it (:meth:`ReadIndex.trusted`):
every writer that rewrites or removes existing rows raises its threads' search marks
(loom.store.search_marks) before and after its writes, and the mark's value is the
writer's clock plus CLOCK_MARGIN_NS. The index trusts a thread when

* its mark is older than HOLD_NS: no change began or ended there within the hold, so
  none is still writing (a change's writes lie between its two raises), and
* the index read the thread (or its namespace) after that change ended: the
  re-read the mark's own event started, or a load.

Otherwise the candidate is verified against the engine as the engine's own path
verifies it. The marks are read after the candidates are ranked (as that path reads
them): a change that began before the read is doubted, one that began after it is
ordered after the search. A thread whose mark is old but newer than the index's read
(an event lost) is re-read. Retention's TTL is judged by the caller, by time.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from loom.read_index.feed import Row
from loom.read_index.vectors import Found, NamespaceVectors, Wanted
from loom.store.search_marks import CLOCK_MARGIN_NS, WHOLE

log = logging.getLogger(__name__)

HOLD_NS = 60 * 1_000_000_000
LAG_WINDOW = 10_000  # events whose lag the p99 is taken over
REFUSED_RETRY_S = 600.0

Reader = Callable[[str, str | None], Awaitable[list[Row]]]  # (namespace, thread or None) -> rows


@dataclass
class Held:
    """One namespace in memory."""

    vectors: NamespaceVectors
    loaded_at: int  # time.time_ns() when its read began
    fresh: dict[str, int] = field(default_factory=dict)  # thread -> when its last re-read began
    rereading: dict[str, list[Row]] = field(default_factory=dict)  # thread -> events met meanwhile


@dataclass
class Stats:
    events: int = 0
    searches: int = 0
    served: int = 0  # namespaces a search was answered for from the index
    missed: int = 0  # namespaces a search had to leave to the engine
    loads: int = 0
    last_load_s: float = 0.0
    last_load_rows: int = 0
    gaps: int = 0
    lags_ms: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=LAG_WINDOW))

    def lag_p(self, q: float) -> float:
        return float(np.percentile(np.asarray(self.lags_ms), q)) if self.lags_ms else 0.0


class ReadIndex:
    def __init__(self, read: Reader, budget_bytes: int) -> None:
        self.read = read
        self.budget = budget_bytes
        self.held: OrderedDict[str, Held] = OrderedDict()  # least recently searched first
        self.loading: dict[str, list[Row]] = {}  # namespace -> events met while it loads
        self.queue: list[str] = []
        self.refused: dict[str, float] = {}  # namespace -> when it may be tried again
        # Every namespace that had rows when the index last listed them, and every one it
        # let go since: a namespace outside it had none then, so all its rows come as
        # events, and the index holds it from its first event (None: no listing yet).
        self.listed: set[str] | None = None
        self.stats = Stats()
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()

    # -- size --------------------------------------------------------------------------

    @property
    def nbytes(self) -> int:
        return sum(h.vectors.nbytes for h in self.held.values())

    @property
    def rows(self) -> int:
        return sum(len(h.vectors) for h in self.held.values())

    def _fit(self, keep: str) -> None:
        """Leave the least recently searched namespaces to the engine until within budget."""
        total = self.nbytes
        for ns in list(self.held):
            if total <= self.budget:
                break
            if ns == keep:
                continue
            total -= self.held.pop(ns).vectors.nbytes
            self._known(ns)
            log.info("read index: namespace left to the engine (budget)", extra={"namespace": ns})

    # -- events ------------------------------------------------------------------------

    def _known(self, ns: str) -> None:
        if self.listed is not None:
            self.listed.add(ns)

    def listing(self, namespaces: list[str]) -> None:
        """The namespaces with rows now: each is loaded (in the order given)."""
        self.listed = set(namespaces) | set(self.held) | set(self.loading) | set(self.queue)
        for ns in namespaces:
            self.want(ns)

    def _held_or_new(self, ns: str) -> Held | None:
        held = self.held.get(ns)
        if held is None and self.listed is not None and ns not in self.listed:
            held = self.held[ns] = Held(NamespaceVectors(), time.time_ns())
        return held

    def apply_rows(self, rows: list[Row], published_ms: int) -> None:
        now_ms = time.time() * 1000
        for r in rows:
            held = (
                self.held.get(r.namespace) if r.namespace in self.loading else self._held_or_new(r.namespace)
            )
            if held is not None:
                held.vectors.apply(r)
                pending = held.rereading.get(r.thread_id)
                if pending is not None:
                    pending.append(r)
            elif r.namespace in self.loading:
                self.loading[r.namespace].append(r)
        self.stats.events += 1
        self.stats.lags_ms.append(max(0.0, now_ms - published_ms))

    def apply_marks(self, pairs: list[tuple[str, str]], published_ms: int) -> None:
        for ns, thread in pairs:
            if thread == WHOLE:  # read the namespace again, whatever the index held of it
                self.held.pop(ns, None)
                self.loading.pop(ns, None)
                self._known(ns)
                self.want(ns)
            elif ns in self.held:
                self.reread(ns, thread)
        self.stats.events += 1
        self.stats.lags_ms.append(max(0.0, time.time() * 1000 - published_ms))

    def forget_all(self) -> None:
        """A gap in the stream: nothing held can be vouched for; load everything again."""
        self.held.clear()
        self.loading.clear()
        self.queue.clear()
        self.listed = None  # until the caller lists the namespaces again
        self.stats.gaps += 1

    # -- loads -------------------------------------------------------------------------

    def want(self, ns: str) -> None:
        """Load the namespace in the background (once; not while refused)."""
        if ns in self.held or ns in self.loading or ns in self.queue:
            return
        if self.refused.get(ns, 0.0) > time.monotonic():
            return
        self._known(ns)
        self.queue.append(ns)
        self._wake.set()

    async def loader(self) -> None:
        """Load the wanted namespaces one after another (each is CPU for the whole box)."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self.queue:
                await self._load(self.queue.pop(0))

    async def _load(self, ns: str) -> None:
        self.loading[ns] = []
        began, started = time.time_ns(), time.monotonic()
        try:
            rows = await self.read(ns, None)
        except Exception:  # noqa: BLE001 - searches of it go on reading the engine
            log.exception("read index: loading a namespace failed")
            self.loading.pop(ns, None)
            self.refused[ns] = time.monotonic() + 5.0
            return
        met = self.loading.pop(ns, None)
        if met is None:
            return  # forgotten meanwhile (a gap, a namespace-wide change): wanted again
        vectors = NamespaceVectors()
        vectors.load(rows)
        for r in met:
            vectors.apply(r)
        if vectors.nbytes > self.budget:
            self.refused[ns] = time.monotonic() + REFUSED_RETRY_S
            log.warning("read index: a namespace larger than the whole budget is left to the engine")
            return
        self.held[ns] = Held(vectors, began)
        self._fit(keep=ns)
        self.stats.loads += 1
        self.stats.last_load_s = time.monotonic() - started
        self.stats.last_load_rows = len(vectors)

    def reread(self, ns: str, thread: str) -> None:
        held = self.held.get(ns)
        if held is None or thread in held.rereading:
            return
        held.rereading[thread] = []
        task = asyncio.ensure_future(self._reread(ns, thread, held))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _reread(self, ns: str, thread: str, held: Held) -> None:
        began = time.time_ns()
        try:
            rows = await self.read(ns, thread)
        except Exception:  # noqa: BLE001 - the thread stays doubted until a re-read succeeds
            log.exception("read index: re-reading a thread failed")
            held.rereading.pop(thread, None)
            return
        met = held.rereading.pop(thread, [])
        held.vectors.replace_thread(thread, rows)
        for r in met:
            held.vectors.apply(r)
        held.fresh[thread] = began

    # -- searches ------------------------------------------------------------------------

    def search(
        self, namespaces: list[str], query: np.ndarray, wanted: Wanted, limit: int
    ) -> tuple[list[tuple[str, Found]], list[str]]:
        """The best `limit` rows of the held namespaces, best first, and the namespaces
        not held (their loads wanted)."""
        found: list[tuple[str, Found]] = []
        missing: list[str] = []
        self.stats.searches += 1
        for ns in namespaces:
            held = None if ns in self.loading else self._held_or_new(ns)
            if held is None:
                missing.append(ns)
                self.want(ns)
                continue
            if wanted.model is not None and not held.vectors.made_only_by(wanted.model):
                missing.append(ns)  # another model's vectors: the engine compares by model
                continue
            self.held.move_to_end(ns)
            rows, _ = held.vectors.search(query, wanted, limit)
            found += [(ns, f) for f in rows]
        self.stats.served += len(namespaces) - len(missing)
        self.stats.missed += len(missing)
        found.sort(key=lambda nf: (-nf[1].similarity, nf[0], nf[1].thread_id, nf[1].msg_id))
        return found[:limit], missing

    def trusted(self, ns: str, thread: str, mark: int, now_ns: int) -> bool:
        """May a row of the thread be answered as held? (module docstring)"""
        held = self.held.get(ns)
        if held is None or thread in held.rereading or mark < 0:
            return False
        fresh = max(held.loaded_at, held.fresh.get(thread, 0))
        if fresh < mark - CLOCK_MARGIN_NS and now_ns > mark + HOLD_NS:
            self.reread(ns, thread)  # a change the index never heard of: read it now
            return False
        return now_ns > mark + HOLD_NS and fresh >= mark - CLOCK_MARGIN_NS
