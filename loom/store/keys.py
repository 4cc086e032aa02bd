"""The keys rows are found by, named: a key is still a tuple (hashable, ordered, what
`key_sets` splits into parameter columns), and reads as what it holds; and a turn's
address (:class:`TurnRef`), which the answers about a turn start with."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple


class TurnKey(NamedTuple):
    """One agent's copy of a turn: a transcript row's key."""

    namespace: str
    agent: str
    thread_id: str
    msg_id: str


class ThreadKey(NamedTuple):
    namespace: str
    agent: str
    thread_id: str


class EmbKey(NamedTuple):
    """A turn's embedding row, shared by every agent's copy of the turn."""

    namespace: str
    thread_id: str
    msg_id: str


class UserKey(NamedTuple):
    namespace: str
    user_id: str


@dataclass(frozen=True)
class EmbRef:
    """An embedding row's address: what a re-embed candidate (loom.store.embeddings) and
    a re-embed job's item (loom.jobs) carry before their own fields."""

    namespace: str
    thread_id: str
    msg_id: str

    @property
    def key(self) -> EmbKey:
        return EmbKey(self.namespace, self.thread_id, self.msg_id)


@dataclass(frozen=True)
class TurnRef:
    """A turn's address and whose it is: its key, role, run, owner and time. What a
    search hit, a text match and an embedding job's turn each carry before their own
    fields."""

    namespace: str
    agent: str
    thread_id: str
    msg_id: str
    role: str
    run_id: str
    user_id: str
    ts: datetime

    @property
    def turn_key(self) -> TurnKey:
        return TurnKey(self.namespace, self.agent, self.thread_id, self.msg_id)

    @property
    def emb_key(self) -> EmbKey:
        return EmbKey(self.namespace, self.thread_id, self.msg_id)
