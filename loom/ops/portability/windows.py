"""Which stored turns an import's background embedding owns.

An import stores its turns with no embedding job (loom.ops.portability.embedding embeds
them later, at the model's rate). The embedding recovery pass embeds every turn that
landed with no embedding row once it is older than its grace; left alone, it would
embed an import's backlog a second time, racing the import's own pass. So each import
registers a window in Redis before it inserts anything: its namespace, its token (the
turns' ``appended_by``) and the span of server insert times its turns land in. The
recovery pass leaves the turns inside a window to the import's pass, which goes
through exactly those; once that pass is done the window is removed and the recovery
pass covers the namespace again (whatever it passed meanwhile was the import's).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from redis.asyncio import Redis

from loom import redis_calls, redis_keys

KEY = redis_keys.IMPORT_WINDOWS


@dataclass(frozen=True)
class Window:
    job_id: str
    namespace: str
    token_id: str
    start_ms: int
    end_ms: int

    def covers(self, namespace: str, appended_by: str, created_at: datetime) -> bool:
        return (
            namespace == self.namespace
            and appended_by == self.token_id
            and self.start_ms <= _ms(created_at) <= self.end_ms
        )


def _ms(at: datetime) -> int:
    aware = at if at.tzinfo is not None else at.replace(tzinfo=UTC)
    return int(aware.timestamp() * 1000)


async def put(
    redis: Redis, job_id: str, namespace: str, token_id: str, start: datetime, end: datetime
) -> None:
    value = {"ns": namespace, "token": token_id, "start": _ms(start), "end": _ms(end)}
    await redis_calls.hset(redis, KEY, job_id, json.dumps(value))


async def remove(redis: Redis, job_id: str) -> None:
    await redis_calls.hdel(redis, KEY, job_id)


async def read(redis: Redis) -> list[Window]:
    raw = await redis_calls.hgetall(redis, KEY)
    out = []
    for job, value in raw.items():
        try:
            v = json.loads(value)
            out.append(Window(_text(job), v["ns"], v["token"], int(v["start"]), int(v["end"])))
        except (ValueError, KeyError, TypeError):
            continue  # not one this build wrote: nothing is withheld from the recovery pass
    return out


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def covered(windows: list[Window], namespace: str, appended_by: str, created_at: datetime) -> bool:
    return any(w.covers(namespace, appended_by, created_at) for w in windows)
