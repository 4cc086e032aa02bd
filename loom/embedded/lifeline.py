"""Children that die with their parent.

A process Loom starts (the embedded ClickHouse endpoint, redis-server, the API, a
worker) must not outlive the process that started it: a `kill -9` of `loom serve`
would otherwise leave them running on LOOM_HOME, holding its data directory, socket
and port. On Linux the kernel does this for us: prctl(PR_SET_PDEATHSIG) asks it to
signal the child when its parent dies. Elsewhere there is no equivalent; the next
`loom serve` then stops what it finds (loom.embedded.backends.clear_orphans).

The signal is SIGTERM: each child then stops as it does on a normal stop (redis-server
flushes its append-only file, the endpoint closes its engine, uvicorn and arq finish
what is in flight).

The kernel sends it when the parent *thread* that forked the child exits, so start
children from a thread that lives as long as the process (the main thread).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: signal.Signals = signal.SIGTERM) -> Callable[[], None] | None:
    """A `preexec_fn` for subprocess.Popen that sets the child's parent-death signal;
    None where the platform has none (Popen then runs nothing)."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here, not after fork
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl: nobody will signal us
            os.kill(os.getpid(), sig)

    return preexec
