"""Deletion fences: what closes the race between conversation.delete and an append
whose insert lands after the delete read the thread.

A delete stamps a version D (loom.clock.next_version) and, before it reads the thread,
records D for the (agent, thread_id) in the namespace's fence hash
(``loom:deleted:{namespace}``). Every append flush reads the fences of its turns'
threads *after* its insert is durable: a turn stamped before D is deleted, and the
flush tombstones it itself, before any vector can be written for it. Either the flush's
read comes after the fence was recorded (it sees the fence), or its insert landed before
that and so before the delete's read (the delete sees the row). The hash outlives any
flush in flight (it expires an hour after the namespace's last delete); a fence only
ever concerns turns stamped before it, so one kept longer changes nothing.

Erasure fences: the same for a user erasure, per (namespace, user_id), in the same hash
(a field no (agent, thread) can have: agents are never empty). An erasure first sets
its user's fence a horizon ahead (every turn of the user stamped before it is erased:
a flush landing while the erasure reads or tombstones erases its own turns), and once
the user's rows are tombstoned lowers it to the version it answered at: a turn of the
user stamped before the answer is erased wherever it lands, one stamped after is new.
"""

from __future__ import annotations

from collections.abc import Sequence

from redis.asyncio import Redis

from loom import redis_keys
from loom.store.keys import ThreadKey, UserKey

TTL_S = 3_600


def key(namespace: str) -> str:
    return redis_keys.fences(namespace)


def _field(agent: str, thread_id: str) -> str:
    return f"{agent}\x00{thread_id}"


def _user_field(user_id: str) -> str:
    return f"\x00user\x00{user_id}"


async def set_fence(redis: Redis, thread: ThreadKey, version: int) -> None:
    """Every turn of the thread stamped before `version` is deleted."""
    ns, agent, thread_id = thread
    pipe = redis.pipeline(transaction=False)
    pipe.hset(key(ns), _field(agent, thread_id), str(version))
    pipe.expire(key(ns), TTL_S)
    await pipe.execute()


async def set_user_fence(redis: Redis, namespace: str, user_id: str, version: int) -> None:
    """Every turn of the user in the namespace stamped before `version` is erased. Set
    (not raised): an erasure lowers its own horizon to its answer's version."""
    pipe = redis.pipeline(transaction=False)
    pipe.hset(key(namespace), _user_field(user_id), str(version))
    pipe.expire(key(namespace), TTL_S)
    await pipe.execute()


async def fences(redis: Redis, threads: Sequence[ThreadKey]) -> dict[ThreadKey, int]:
    """The fence of each thread that has one (one round trip)."""
    return (await all_fences(redis, threads, []))[0]


async def all_fences(
    redis: Redis, threads: Sequence[ThreadKey], users: Sequence[UserKey]
) -> tuple[dict[ThreadKey, int], dict[UserKey, int]]:
    """The deletion fences of the threads and the erasure fences of the users that have
    one, in one round trip."""
    thread_ns: dict[str, list[ThreadKey]] = {}
    for t in threads:
        thread_ns.setdefault(t[0], []).append(t)
    user_ns: dict[str, list[UserKey]] = {}
    for u in users:
        user_ns.setdefault(u[0], []).append(u)
    if not thread_ns and not user_ns:
        return {}, {}
    pipe = redis.pipeline(transaction=False)
    for ns, ts in thread_ns.items():
        pipe.hmget(key(ns), [_field(t[1], t[2]) for t in ts])
    for ns, us in user_ns.items():
        pipe.hmget(key(ns), [_user_field(u[1]) for u in us])
    got = iter(await pipe.execute())
    by_thread = {t: int(v) for ts in thread_ns.values() for t, v in zip(ts, next(got), strict=True) if v}
    by_user = {u: int(v) for us in user_ns.values() for u, v in zip(us, next(got), strict=True) if v}
    return by_thread, by_user
