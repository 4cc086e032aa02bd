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
"""

from __future__ import annotations

from collections.abc import Sequence

from redis.asyncio import Redis

from loom import redis_keys

TTL_S = 3_600

ThreadKey = tuple[str, str, str]  # (namespace, agent, thread_id)


def key(namespace: str) -> str:
    return redis_keys.fences(namespace)


def _field(agent: str, thread_id: str) -> str:
    return f"{agent}\x00{thread_id}"


async def set_fence(redis: Redis, thread: ThreadKey, version: int) -> None:
    """Every turn of the thread stamped before `version` is deleted."""
    ns, agent, thread_id = thread
    pipe = redis.pipeline(transaction=False)
    pipe.hset(key(ns), _field(agent, thread_id), str(version))
    pipe.expire(key(ns), TTL_S)
    await pipe.execute()


async def fences(redis: Redis, threads: Sequence[ThreadKey]) -> dict[ThreadKey, int]:
    """The fence of each thread that has one (one round trip)."""
    if not threads:
        return {}
    by_ns: dict[str, list[ThreadKey]] = {}
    for t in threads:
        by_ns.setdefault(t[0], []).append(t)
    pipe = redis.pipeline(transaction=False)
    for ns, ts in by_ns.items():
        pipe.hmget(key(ns), [_field(t[1], t[2]) for t in ts])
    got = await pipe.execute()
    out: dict[ThreadKey, int] = {}
    for ts, values in zip(by_ns.values(), got, strict=True):
        for t, v in zip(ts, values, strict=True):
            if v is not None:
                out[t] = int(v)
    return out
