"""`loom ingest-transcript`: append a transcript file's turns to a thread, through the
API's batch append (so every rule of conversation.append holds: recording, roles,
duplicates, what is embedded), with a progress bar and a summary.

A re-run adds nothing: each turn's msg_id is stable (loom.sdk.transcripts), and an
append of a (thread, msg_id) that landed answers `duplicate`. Batches are retried on
503 and connection errors (appends are idempotent by msg_id).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from loom.sdk.transcripts import (
    FORMATS,
    TranscriptError,
    TranscriptTurn,
    derived_thread_id,
    detect_format,
    parse,
)
from loom.sdk.transport import ENV_TOKEN, ENV_URL, LoomError, Transport

console = Console(stderr=True)

BATCH_TURNS = 200  # at most 500 per append; fewer keeps each request well under the body limit
BATCH_CHARS = 1_000_000  # ... and so does a bound on the text one batch carries


@dataclass
class Summary:
    thread_id: str
    turns: int
    by_role: dict[str, int]
    outcomes: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {"thread_id": self.thread_id, "turns": self.turns, "by_role": self.by_role, **self.outcomes}


def batches(turns: Sequence[TranscriptTurn]) -> Iterator[list[TranscriptTurn]]:
    batch: list[TranscriptTurn] = []
    chars = 0
    for t in turns:
        if batch and (len(batch) == BATCH_TURNS or chars + len(t.content) > BATCH_CHARS):
            yield batch
            batch, chars = [], 0
        batch.append(t)
        chars += len(t.content)
    if batch:
        yield batch


def outcome(result: dict[str, Any]) -> str:
    """One word per turn for the summary: stored, duplicate, logging_disabled, deleted;
    a stored turn that reads as high is counted as skipped_high (kept, not embedded)."""
    if not result["stored"]:
        return str(result.get("reason") or "not_stored")
    return "skipped_high" if result.get("embedding") == "skipped:high_sensitivity" else "stored"


async def send(
    transport: Transport,
    namespace: str,
    agent: str,
    thread_id: str,
    turns: Sequence[TranscriptTurn],
    extra: dict[str, str],
    progress: Progress,
) -> Counter[str]:
    counts: Counter[str] = Counter()
    task = progress.add_task(thread_id, total=len(turns))
    for batch in batches(turns):
        body = {
            "namespace": namespace,
            "agent": agent,
            "turns": [
                {"thread_id": thread_id, "msg_id": t.msg_id, "role": t.role, "content": t.content, **extra}
                for t in batch
            ],
        }
        answer = await transport.call("conversation.append", body)
        counts.update(outcome(r) for r in answer["results"])
        progress.advance(task, len(batch))
    return counts


def _read(path: Path) -> str:
    try:
        return sys.stdin.read() if str(path) == "-" else path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TranscriptError(f"cannot read it: {exc.strerror or type(exc).__name__}") from None
    except UnicodeDecodeError:
        raise TranscriptError("cannot read it: not UTF-8 text") from None


def ingest_transcript(
    namespace: Annotated[str, typer.Option("--namespace", help="The namespace to append to.")],
    file: Annotated[
        Path, typer.Option("--file", help="A .md, .json, .jsonl or Codex session transcript ('-': stdin).")
    ],
    thread_id: Annotated[
        str | None, typer.Option("--thread-id", help="The thread (default: derived from the file).")
    ] = None,
    agent: Annotated[str, typer.Option(help="The agent the turns are logged as.")] = "default",
    user_id: Annotated[str, typer.Option("--user-id", help="The user the turns belong to.")] = "",
    run_id: Annotated[str, typer.Option("--run-id", help="A run id for every turn.")] = "",
    fmt: Annotated[
        str | None, typer.Option("--format", help=f"One of {', '.join(FORMATS)} (default: from the file).")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count the turns; send nothing.")] = False,
    url: Annotated[str | None, typer.Option(help=f"Loom's API (default: {ENV_URL}, else local).")] = None,
    token: Annotated[str | None, typer.Option(help=f"A writer token (default: {ENV_TOKEN}).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Append a transcript's turns to one thread: Markdown with '# user' / '# assistant'
    sections, a JSON array of {role, content}, or JSONL. Re-running adds nothing."""
    if fmt is not None and fmt not in FORMATS:
        _fail(f"--format must be one of {', '.join(FORMATS)}", 2)
    try:
        text = _read(file)
        turns = parse(text, fmt or detect_format(file, text))
    except TranscriptError as exc:
        _fail(f"{file}: {exc}", 2)
    thread = thread_id or derived_thread_id(Path("stdin") if str(file) == "-" else file)
    summary = Summary(thread, len(turns), dict(Counter(t.role for t in turns)))
    if not dry_run:
        extra = {k: v for k, v in (("user_id", user_id), ("run_id", run_id)) if v}
        try:
            summary.outcomes = asyncio.run(_send_all(namespace, agent, thread, turns, extra, url, token))
        except LoomError as exc:
            _fail(str(exc), 1)
    _print(summary, dry_run, as_json)


async def _send_all(
    namespace: str,
    agent: str,
    thread_id: str,
    turns: Sequence[TranscriptTurn],
    extra: dict[str, str],
    url: str | None,
    token: str | None,
) -> Counter[str]:
    transport = Transport(url, token)
    columns = (TextColumn("[bold]ingesting[/bold] {task.description}"), BarColumn(), MofNCompleteColumn())
    try:
        with Progress(*columns, console=console, transient=True) as progress:
            return await send(transport, namespace, agent, thread_id, turns, extra, progress)
    finally:
        await transport.aclose()


def _print(summary: Summary, dry_run: bool, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"dry_run": dry_run, **summary.as_dict()}))
        return
    roles = ", ".join(f"{n} {role}" for role, n in summary.by_role.items())
    print(f"thread {summary.thread_id}: {summary.turns} turns ({roles})")
    if dry_run:
        print("dry run: nothing sent")
    else:
        print(", ".join(f"{word} {n}" for word, n in sorted(summary.outcomes.items())))


def _fail(message: str, code: int) -> NoReturn:
    console.print(f"[red]{message}[/red]", highlight=False, soft_wrap=True)
    raise typer.Exit(code)
