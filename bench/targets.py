"""The systems under test. The harness drives every target through the same calls, over HTTP,
and times each call from the outside (so both sides pay for their HTTP layer).

A target is a :class:`Target`. The harness calls, per run::

    await t.start(ctx)                      # bring the system up (processes, schema, HTTP client)
    for each scale:
        await t.reset()                     # an empty store
        await t.bulk_load(ds.turns, ds.vectors, ds.has_vec)   # untimed, precomputed vectors
        await t.finish_load()               # timed: index builds, merges, vacuum
        await t.bytes_on_disk()
        await t.prepare_search(...)         # optional tuning at equal recall
        await t.search(...) / t.saved_search(...)      # timed, concurrently
        await t.append(turn, embed=...)                # timed, concurrently
        await t.settle()                               # timed with the appends
        await t.erase_user(...)                        # timed
        await t.reset()                     # free the store before the other side runs
    await t.stop()

A method that raises :class:`NotImplementedError` makes the harness skip that figure for that
target with a "not wired" note (from :meth:`start`: the whole target).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.httpclient import HttpError, LeanClient

Turn = dict[str, Any]


@dataclass
class RunContext:
    """What a target may need to know about the run."""

    quick: bool
    concurrency: int
    seed: int
    repo: Path
    keep: bool = False
    pg_source: str = "auto"
    loom_url: str | None = None
    loom_token: str | None = None
    client: str = "lean"  # load client: "lean" (bench.httpclient) or "httpx"
    log: Any = print
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class AppendResult:
    stored: bool
    reason: str | None = None


class Target(ABC):
    """One system under test. All timed operations are single HTTP calls to its API."""

    name: str = "target"  # "loom" or "baseline": the column of the report

    # -- lifecycle ------------------------------------------------------------------------

    @abstractmethod
    async def start(self, ctx: RunContext) -> None:
        """Bring the system up and make it ready to load data."""

    @abstractmethod
    async def stop(self) -> None:
        """Stop everything :meth:`start` started and delete temporary data. Idempotent."""

    def close_now(self) -> None:  # noqa: B027 - optional hook, empty by default
        """Synchronous best-effort teardown, called after Ctrl-C if :meth:`stop` did not run."""

    def facts(self) -> dict[str, Any]:
        """Versions and settings worth recording in the results JSON."""
        return {}

    # -- data -----------------------------------------------------------------------------

    @abstractmethod
    async def reset(self) -> None:
        """Make the store empty (between scales, and after one to free the machine)."""

    @abstractmethod
    async def bulk_load(self, turns: Sequence[Turn], vectors: np.ndarray, has_vec: np.ndarray) -> None:
        """Load ``turns`` with precomputed vectors (``vectors[i]`` for ``turns[i]`` where
        ``has_vec[i]``; user/assistant turns, embedded on their first 2,048 characters).
        A turn carrying ``saved_at`` is a saved message of its ``user_id``. Not timed."""

    async def finish_load(self) -> dict[str, Any]:
        """Index builds, merges, vacuum: whatever makes the loaded data ready and compact.
        Timed by the harness (reported as "index build"). Returns notes for the JSON."""
        return {}

    @abstractmethod
    async def bytes_on_disk(self) -> dict[str, Any]:
        """``{"total_bytes": int, "rows": int, ...detail}`` for the conversation data (text,
        vectors and their indexes), after :meth:`finish_load`."""

    async def prepare_search(
        self, namespace: str, query_vectors: np.ndarray, truth: list[list[str]], target_recall: float
    ) -> dict[str, Any]:
        """Optional tuning so recall@10 reaches ``target_recall`` (on held-out queries). Returns notes."""
        return {}

    # -- timed operations -----------------------------------------------------------------

    @abstractmethod
    async def append(self, turn: Turn, *, embed: bool) -> AppendResult:
        """Append one turn (``conversation.append``). ``embed=False`` asks for a turn that is
        stored without an embedding (the plain write path); ``embed=True`` for the normal path
        where user/assistant turns are embedded."""

    async def settle(self) -> None:  # noqa: B027 - optional hook, empty by default
        """Return once every turn appended so far is stored and, where asked for, embedded and
        searchable (a system that embeds in the background waits for its queue here). The
        harness counts this wait in the append throughput; the baseline embeds in the request."""

    @abstractmethod
    async def search(self, namespace: str, query: str | np.ndarray, k: int) -> list[str]:
        """Vector search in one namespace with the 0.30 cosine floor; the ranked ``msg_id``s."""

    @abstractmethod
    async def saved_search(self, namespace: str, user_id: str, query: str, k: int) -> list[str]:
        """Hybrid search over one user's saved messages; the ranked ``msg_id``s."""

    @abstractmethod
    async def erase_user(self, namespace: str, user_id: str) -> int:
        """Remove every conversation row of ``user_id`` in ``namespace``; the rows removed."""


class HttpTarget(Target):
    """A target whose operations are JSON POSTs to one base URL with a bearer token, sent with
    the lean keep-alive client (:mod:`bench.httpclient`) or, with ``--client httpx``, httpx."""

    base_url: str = ""
    token: str = ""
    client_kind: str = "lean"
    client: Any = None

    def open_client(self, concurrency: int, kind: str = "lean") -> None:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self.client_kind = kind
        if kind == "httpx":
            limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
            self.client = httpx.AsyncClient(
                base_url=self.base_url, limits=limits, timeout=httpx.Timeout(120.0), headers=headers
            )
        else:
            self.client = LeanClient(self.base_url, headers)

    async def close_client(self) -> None:
        if self.client is not None:
            await self.client.aclose()
            self.client = None

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        assert self.client is not None, "start() first"
        if self.client_kind == "httpx":
            r = await self.client.post(path, json=body)
            if r.status_code >= 400:
                raise RuntimeError(f"{self.name} {path}: HTTP {r.status_code}: {r.text[:300]}")
            out: dict[str, Any] = r.json()
            return out
        try:
            res: dict[str, Any] = await self.client.post_json(path, body)
        except HttpError as exc:
            raise RuntimeError(f"{self.name} {path}: {exc}") from None
        return res


# Loom is in bench/loom_target.py (it imports the classes above); ``from bench.targets import
# LoomTarget`` keeps working through the module __getattr__ below, without an import cycle.


def __getattr__(name: str) -> Any:
    if name == "LoomTarget":
        from bench.loom_target import LoomTarget

        return LoomTarget
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
