"""Logs: Loom's own as structured JSON lines (structlog) with the request id bound per
request; every library's through the standard logging module, one line each, led by its
UTC time. Both go to standard error.

What the console shows by default: warnings and errors, and Loom's own info lines (a
process starting, a change applied). The libraries' routine lines (an HTTP request the
dashboard makes to its own API, each job's start and end, an MCP session opening) show
only with `verbose` (`loom serve --verbose`, LOOM_LOG_VERBOSE), and so do Loom's debug
lines. A client that closes its MCP stream is a normal end: one debug line, never a
traceback.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

import anyio
import structlog

TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
LINE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Libraries whose info lines are routine: warnings and errors only, unless verbose.
ROUTINE = ("httpx", "httpcore", "mcp", "arq", "uvicorn", "uvicorn.error", "uvicorn.access", "asyncio")

# What a stream raises once the other end has gone: a client that closed its connection.
CLOSED_STREAM = (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream)


class ClosedStreamIsNoError(logging.Filter):
    """The MCP server logs a client's disconnect as an error with its traceback ("Error
    in standalone SSE writer: ClosedResourceError"). That is how every session ends:
    one debug line (shown when verbose), never the traceback."""

    MARK = "loom_closed_stream"  # set on a record once it was made the debug line

    def __init__(self, verbose: bool) -> None:
        super().__init__()
        self.verbose = verbose

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        closed = record.name.startswith("mcp.") and isinstance(exc, CLOSED_STREAM)
        if not closed and not getattr(record, self.MARK, False):
            return True
        if not self.verbose:
            return False
        if closed:
            record.msg, record.args = (
                f"the client closed its stream, a normal end ({record.getMessage()})",
                None,
            )
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            record.exc_info = record.exc_text = None
            setattr(record, self.MARK, True)
        return True


class _UtcFormatter(logging.Formatter):
    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        return time.strftime(datefmt or TIME_FORMAT, time.gmtime(record.created))


def console_handler(verbose: bool, stream: TextIO | None = None) -> logging.Handler:
    """The one handler of the standard logging module: a line each, led by its UTC time."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(_UtcFormatter(LINE_FORMAT, TIME_FORMAT))
    handler.addFilter(ClosedStreamIsNoError(verbose))
    return handler


def configure(level: str = "INFO", *, verbose: bool = False) -> None:
    """Set up both kinds of log for this process (idempotent: the last call wins)."""
    root = logging.getLogger()
    root.handlers[:] = [console_handler(verbose)]
    root.setLevel(level.upper())
    for name in ROUTINE:
        logging.getLogger(name).setLevel(logging.INFO if verbose else logging.WARNING)
    own = logging.DEBUG if verbose else logging.getLevelName(level.upper())
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(own),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )


def get(name: str) -> structlog.stdlib.BoundLogger:
    logger: structlog.stdlib.BoundLogger = structlog.get_logger(name)
    return logger
