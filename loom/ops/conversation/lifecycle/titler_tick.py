"""The conversation_titler's cadence, live: the worker pool's cron ticks every TICK_S
seconds, and a tick starts a pass only when the titler is switched on and at least
LOOM_CONVERSATION_TITLER_INTERVAL_SECONDS passed since the last pass started, both read
from ``svc.settings`` at the tick (so an admin's change applies without a restart).

The time of the last start is one Redis key, read and set in one Lua script with
Redis's own clock: of two workers ticking at once, one starts the pass (and the
titler's lease still keeps a slow pass from overlapping the next).
"""

from __future__ import annotations

from loom import redis_calls, redis_keys
from loom.ops.conversation.lifecycle.titling import PassReport, titler_pass
from loom.services import Services

TICK_S = 5  # the cron's period: a changed interval is honoured within this
LAST_PASS_KEY = redis_keys.TITLER_LAST_PASS

# KEYS[1] the last start (seconds, Redis's clock); ARGV[1] the interval in seconds.
# Returns 1 (and records now) when a pass is due, else 0.
_DUE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local last = tonumber(redis.call('GET', KEYS[1]) or '')
if last and now - last < tonumber(ARGV[1]) then
  return 0
end
redis.call('SET', KEYS[1], string.format('%.3f', now))
return 1
"""


async def due(svc: Services) -> bool:
    """Whether this tick starts a pass (and, if so, the start is recorded)."""
    cfg = svc.settings
    if not cfg.conversation_titler_enabled:
        return False
    interval = str(cfg.conversation_titler_interval_seconds)
    return bool(await redis_calls.eval(svc.redis, _DUE, [LAST_PASS_KEY], interval))


async def tick(svc: Services) -> PassReport:
    """One tick of the cron: a pass when one is due, else nothing (``ran`` false)."""
    if not await due(svc):
        return PassReport()
    return await titler_pass(svc)


__all__ = ["LAST_PASS_KEY", "TICK_S", "due", "tick"]
