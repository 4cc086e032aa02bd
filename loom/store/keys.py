"""The keys rows are found by, named: a key is still a tuple (hashable, ordered, what
`key_sets` splits into parameter columns), and reads as what it holds."""

from __future__ import annotations

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
