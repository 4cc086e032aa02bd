"""The local stand-in chat server (tests/providers/standin.py) in a process of its own.

A real summarizer is another machine; run in the benchmark's own process, the stand-in's
request threads (each parsing a prompt of 200 turns) take the interpreter lock from the
event loop that times the requests, and the benchmark measures itself.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
from collections.abc import Iterator

from tests.providers.standin import StandInServer

# What the compaction benches' summarizer answers, and after how long (50 ms: a fast hosted model).
SUMMARY = "They planned the storage migration and agreed on a Friday cutover."
MODEL_DELAY_S = 0.05


def _serve(conn: multiprocessing.connection.Connection, reply: str, delay_s: float) -> None:
    """Sends the server's URL, answers every chat request with `reply` after `delay_s`,
    and stops when the pipe closes."""
    with StandInServer() as standin:
        standin.set_handler(standin.CHAT, lambda req: standin.chat_ok(reply).delayed(delay_s))
        conn.send(standin.url)
        with contextlib.suppress(EOFError):
            conn.recv()


@contextlib.contextmanager
def chat_standin(reply: str, delay_s: float) -> Iterator[str]:
    """The stand-in chat server's base URL while the block runs."""
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(theirs, reply, delay_s), daemon=True)
    proc.start()
    try:
        yield ours.recv()
    finally:
        ours.close()
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
