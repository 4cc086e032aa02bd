"""`loom import FILE --namespace NS` and `loom export --namespace NS --output FILE`: a
history in, a namespace out, through a running Loom's API (LOOM_URL and an admin
LOOM_TOKEN, as the SDK and `loom ingest-transcript` read them).

Import: the file is read as a stream (loom.portability: gzip, zstd or a zip holding
conversations.json are opened as they are), its format told from its content unless
`--format` names it, and its records sent in numbered batches (import.write). Each
batch is committed whole before the next is sent, so an import that was cut short (this
command, the server) resumes from its last committed batch when run again on the same
file. A bad record (an unknown role, a text over the limit, a line that is not JSON) is
reported with its position; `--on-error stop` (default) ends the import before that
record's batch is written, `--on-error skip` leaves the record out and goes on. A file
that cannot be parsed on ends the import where it broke. A summary ends every run.

Export: export.start's stream is written to the file as sent (gzip by default, zstd or
plain NDJSON by `--compression`), and read back as it goes to count its rows and check
its checksum.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import queue
import re
import threading
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, NoReturn

import orjson
import typer
import zstandard
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)

from loom.models.portability import MAX_RECORDS
from loom.portability import files, readers
from loom.sdk.transport import ENV_TOKEN, ENV_URL, LoomError, Transport

console = Console(stderr=True)

FORMATS = ("chatgpt", "claude", "openai", "loom", "markdown", "json", "jsonl", "codex")
BATCH_RECORDS = 1_000
BATCH_BYTES = 4 << 20  # well under the API's 8 MiB body limit
_RECORD_FIELD = re.compile(r"^records\.(\d+)")


@dataclass
class Batch:
    """One import.write's records (each also JSON-encoded: the body is sent as bytes),
    the bad records left out of it, and where the source is read up to after it."""

    records: list[dict[str, Any]] = field(default_factory=list)
    encoded: list[bytes] = field(default_factory=list)
    errors: list[dict[str, str]] = field(default_factory=list)
    bytes: int = 0
    units: int = 0
    position: str = ""
    final: str | None = None

    def add(self, rec: dict[str, Any]) -> None:
        raw = orjson.dumps(rec)
        self.records.append(rec)
        self.encoded.append(raw)
        self.bytes += len(raw)

    def drop(self, i: int) -> None:
        del self.records[i], self.encoded[i]

    def full(self, limit: int) -> bool:
        return len(self.records) >= limit or self.bytes >= BATCH_BYTES


@dataclass
class Run:
    """What this run did (the job's own counts come back from the server)."""

    job: dict[str, Any] = field(default_factory=dict)
    sent: int = 0
    bad: list[readers.Bad] = field(default_factory=list)
    stopped: str = ""  # why the import stopped early ('' when it did not)


class Stop(Exception):
    """The import ends here (a bad record with --on-error stop, or a broken file)."""

    def __init__(self, bad: readers.Bad) -> None:
        super().__init__(f"{bad.pos}: {bad.message}")
        self.bad = bad


def _position(unit: int, sub: int) -> str:
    return json.dumps({"unit": unit, "sub": sub})


def _resume_at(position: str) -> tuple[int, int]:
    try:
        p = json.loads(position) if position else {}
        return int(p.get("unit", 0)), int(p.get("sub", 0))
    except (ValueError, TypeError, AttributeError):
        return 0, 0


def _error(bad: readers.Bad) -> dict[str, str]:
    return {"pos": bad.pos[:200], "message": bad.message[:500]}


def batches(
    units: Iterator[readers.Unit],
    position: str,
    limit: int,
    on_bad: Callable[[readers.Bad], None],
    advance: Callable[[int], None],
) -> Iterator[Batch]:
    """The batches to send from `position` on (a resumed job skips what it committed);
    the last one is final. `on_bad` raises Stop when the import stops at a bad record:
    the batch it is in is then never sent."""
    start_unit, start_sub = _resume_at(position)
    batch = Batch()
    position = position or _position(0, 0)
    for unit in units:
        if unit.index < start_unit:
            advance(0)
            continue
        skip = start_sub if unit.index == start_unit else 0
        for b in unit.bad:
            on_bad(b)
            batch.errors.append(_error(b))
        for k, rec in enumerate(unit.records):
            if k < skip:
                continue
            batch.add(rec)
            if batch.full(limit) and k + 1 < len(unit.records):
                batch.position = _position(unit.index, k + 1)
                yield batch
                batch = Batch()
        batch.units += 1
        position = _position(unit.index + 1, 0)
        advance(len(unit.records))
        if batch.full(limit):
            batch.position = position
            yield batch
            batch = Batch()
    batch.position, batch.final = position, "done"
    yield batch


_END = object()


class Importer:
    """Sends the batches in order, each once its predecessor is committed; the next ones
    are read and encoded meanwhile, in a thread of their own (the file's parsing and the
    server's writing overlap)."""

    def __init__(self, transport: Transport, job: dict[str, Any], on_error: str, batch_records: int) -> None:
        self.transport = transport
        self.job = job
        self.on_error = on_error
        self.batch_records = batch_records
        self.seq = int(job["next_seq"])
        self.run = Run(job=job)

    def bad(self, bad: readers.Bad) -> None:
        self.run.bad.append(bad)
        console.print(f"[yellow]{bad.pos}: {bad.message}[/yellow]", highlight=False, soft_wrap=True)
        if self.on_error == "stop":
            raise Stop(bad)

    def _body(self, batch: Batch) -> bytes:
        head = {
            "job_id": self.job["job_id"],
            "seq": self.seq,
            "position": batch.position,
            "errors": batch.errors,
            "units": batch.units,
            **({"final": batch.final} if batch.final else {}),
        }
        return orjson.dumps(head)[:-1] + b',"records":[' + b",".join(batch.encoded) + b"]}"

    async def send(self, batch: Batch) -> None:
        """One batch, committed; a record the server refuses (422 naming records.N) is
        handled as a bad record, and the rest of the batch sent again."""
        while True:
            try:
                answer = await self.transport.call("import.write", self._body(batch))
            except LoomError as exc:
                m = _RECORD_FIELD.match(exc.field or "") if exc.status == 422 else None
                if m is None or int(m.group(1)) >= len(batch.records):
                    raise
                i = int(m.group(1))
                bad = readers.Bad(str(batch.records[i].get("pos") or f"record {i}"), exc.message)
                self.bad(bad)  # raises Stop with --on-error stop: nothing of the batch written
                batch.errors.append(_error(bad))
                batch.drop(i)
                continue
            self.job = answer["job"]
            self.run.job = self.job
            self.run.sent += len(batch.records)
            self.seq += 1
            return

    async def feed(self, units: Iterator[readers.Unit], advance: Callable[[int], None]) -> None:
        ahead: queue.Queue[Any] = queue.Queue(maxsize=2)

        def produce() -> None:
            try:
                for b in batches(units, self.job.get("position", ""), self.batch_records, self.bad, advance):
                    ahead.put(b)
                ahead.put(_END)
            except Exception as exc:  # Stop, a broken file: the sender raises it in order
                ahead.put(exc)

        threading.Thread(target=produce, name="import-reader", daemon=True).start()
        while True:
            item = await asyncio.to_thread(ahead.get)
            if item is _END:
                return
            if isinstance(item, Exception):
                raise item
            await self.send(item)


async def _import(
    path: Path,
    namespace: str,
    fmt: str,
    mapping: readers.Mapping,
    on_error: str,
    batch_records: int,
    url: str | None,
    token: str | None,
) -> Run:
    transport = Transport(url, token, timeout_s=300.0)
    try:
        with files.open_source(path) as opened:
            stream = files.buffered(opened.stream)
            options = {k: v for k, v in vars(mapping).items() if v} | {"on_error": on_error}
            job = await transport.call(
                "import.start",
                {
                    "namespace": namespace,
                    "source": path.name[:512],
                    "fingerprint": files.fingerprint(path),
                    "format": fmt,
                    "options": options,
                },
            )
            importer = Importer(transport, job, on_error, batch_records)
            if job.get("next_seq"):
                console.print(f"resuming import {job['job_id']} at batch {job['next_seq']}", highlight=False)
            await _feed_with_progress(importer, stream, opened, fmt, mapping, path)
            return importer.run
    finally:
        await transport.aclose()


async def _feed_with_progress(
    importer: Importer, stream: Any, opened: files.Opened, fmt: str, mapping: readers.Mapping, path: Path
) -> None:
    columns = (
        TextColumn("[bold]importing[/bold] {task.description}"),
        BarColumn(),
        DownloadColumn(),
        TextColumn("{task.fields[records]} records"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=True) as progress:
        task: TaskID = progress.add_task(path.name, total=opened.size, records=0)
        read = 0

        def advance(n: int) -> None:  # called from the reading thread
            nonlocal read
            read += n
            progress.update(task, completed=min(opened.raw.tell(), opened.size), records=read)

        try:
            await importer.feed(readers.read(fmt, stream, mapping, path), advance)
        except files.SourceError as exc:
            bad = readers.Bad(exc.pos or "file", exc.message)
            importer.run.bad.append(bad)
            console.print(f"[red]{bad.pos}: {bad.message}[/red]", highlight=False, soft_wrap=True)
            await _stop(importer, bad)
        except Stop as stop:
            await _stop(importer, stop.bad)


async def _stop(importer: Importer, bad: readers.Bad) -> None:
    """End the job stopped, at its last committed batch (the batch of the bad record is
    not written), the error recorded with its position."""
    importer.run.stopped = f"{bad.pos}: {bad.message}"
    position = importer.job.get("position") or _position(0, 0)
    await importer.send(Batch(errors=[_error(bad)], position=position, final="stopped"))


def import_file(
    file: Annotated[
        Path,
        typer.Argument(
            help="The file: a chat app's export (.json or its .zip), JSONL, a Loom export, a transcript."
        ),
    ],
    namespace: Annotated[str, typer.Option("--namespace", help="The namespace to import into.")],
    fmt: Annotated[
        str | None,
        typer.Option("--format", help=f"One of {', '.join(FORMATS)} (default: told from the content)."),
    ] = None,
    agent: Annotated[
        str | None,
        typer.Option(
            help="The agent the turns are logged as (default: 'default'; a Loom export keeps its own)."
        ),
    ] = None,
    user_id: Annotated[
        str | None, typer.Option("--user-id", help="The user every imported turn belongs to.")
    ] = None,
    thread_prefix: Annotated[str, typer.Option("--thread-prefix", help="Prefixed to every thread id.")] = "",
    thread_id: Annotated[
        str | None, typer.Option("--thread-id", help="Every turn into this one thread.")
    ] = None,
    on_error: Annotated[
        str, typer.Option("--on-error", help="At a bad record: stop (default) or skip it.")
    ] = "stop",
    batch: Annotated[int, typer.Option(help="Records per batch.", min=1, max=MAX_RECORDS)] = BATCH_RECORDS,
    url: Annotated[str | None, typer.Option(help=f"Loom's API (default: {ENV_URL}, else local).")] = None,
    token: Annotated[str | None, typer.Option(help=f"An admin token (default: {ENV_TOKEN}).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Import a history: ChatGPT's or Claude's data export (conversations.json, or the
    .zip), OpenAI-style messages JSONL, a Loom export, or a transcript. Running it again
    on the same file resumes an unfinished import, or adds nothing to a finished one."""
    if on_error not in ("stop", "skip"):
        _fail("--on-error must be stop or skip", 2)
    if fmt is not None and fmt not in FORMATS:
        _fail(f"--format must be one of {', '.join(FORMATS)}", 2)
    if not file.is_file():
        _fail(f"{file}: no such file", 2)
    try:
        with files.open_source(file) as opened:
            found = fmt or files.detect(files.peek(files.buffered(opened.stream)), file)
    except files.SourceError as exc:
        _fail(f"{file}: {exc}", 2)
    except OSError as exc:
        _fail(f"{file}: cannot read it ({exc.strerror or type(exc).__name__})", 2)
    mapping = readers.Mapping(agent=agent, user_id=user_id, thread_prefix=thread_prefix, thread_id=thread_id)
    try:
        run = asyncio.run(_import(file, namespace, found, mapping, on_error, batch, url, token))
    except LoomError as exc:
        _fail(str(exc), 1)
    _summary(file, found, run, as_json)
    if run.stopped:
        raise typer.Exit(3)


def _summary(file: Path, fmt: str, run: Run, as_json: bool) -> None:
    job = run.job
    summary = {
        "job_id": job.get("job_id"),
        "format": fmt,
        "state": job.get("state"),
        "units": job.get("units"),
        "counts": job.get("counts", {}),
        "errors": [{"pos": b.pos, "message": b.message} for b in run.bad],
        "embedding": job.get("embedding", {}),
        "stopped": run.stopped or None,
    }
    if as_json:
        print(json.dumps(summary))
        return
    counts = Counter(job.get("counts", {}))
    print(f"{file.name} ({fmt}): {job.get('state')}, {job.get('units', 0)} conversations/lines read")
    turns = ", ".join(
        f"{word} {counts[word]}"
        for word in ("read", "stored", "duplicate", "logging_disabled", "high", "skipped")
        if counts[word]
    )
    print(f"turns: {turns or 'none'}")
    others = ", ".join(
        f"{k} {v}"
        for k, v in sorted(counts.items())
        if k not in ("read", "stored", "duplicate", "logging_disabled", "high", "skipped", "deferred") and v
    )
    if others:
        print(f"other rows: {others}")
    if run.bad:
        print(f"{len(run.bad)} bad record(s); the first: {run.bad[0].pos}: {run.bad[0].message}")
    if run.stopped:
        print(f"stopped at {run.stopped} (the batches before it are in; fix the file and run again)")
    emb = job.get("embedding", {})
    if emb.get("to_embed"):
        print(
            f"embedding in the background: {emb.get('embedded', 0)} of {emb['to_embed']} turns "
            f"(import.status {job.get('job_id')}, or the dashboard's Imports page)"
        )


# -- export --------------------------------------------------------------------------------


class _Reader:
    """Reads an export back as it is written: decompresses, counts the body lines and
    checks the end line's checksum."""

    def __init__(self, compression: str) -> None:
        self._decompress: Callable[[bytes], bytes] = bytes
        if compression == "gzip":
            self._decompress = zlib.decompressobj(31).decompress
        elif compression == "zstd":
            self._decompress = zstandard.ZstdDecompressor().decompressobj().decompress
        self.pending = b""
        self.digest = hashlib.sha256()
        self.rows = 0
        self.total = 0
        self.end: dict[str, Any] | None = None
        self.header: dict[str, Any] | None = None

    def feed(self, chunk: bytes) -> None:
        data = self.pending + self._decompress(chunk)
        *done, self.pending = data.split(b"\n")
        for raw in done:
            self._line(raw + b"\n")

    def _line(self, raw: bytes) -> None:
        if self.header is None:
            self.header = orjson.loads(raw)
            self.total = sum(int(v) for v in self.header.get("counts", {}).values())
            return
        if raw.startswith(b'{"kind":"end"'):
            self.end = orjson.loads(raw)
            return
        self.digest.update(raw)
        self.rows += 1

    def check(self) -> None:
        if self.end is None:
            raise LoomError(0, "export_incomplete", "the export ended before its end line")
        if self.end.get("sha256") != self.digest.hexdigest() or self.end.get("rows") != self.rows:
            raise LoomError(0, "export_corrupt", "the export's checksum does not match its lines")


async def _export(output: Path, body: dict[str, Any], url: str | None, token: str | None) -> _Reader:
    transport = Transport(url, token)
    reader = _Reader(body["compression"])
    columns = (
        TextColumn("[bold]exporting[/bold] {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("rows"),
        TimeRemainingColumn(),
    )
    try:
        with output.open("wb") as out, Progress(*columns, console=console, transient=True) as progress:
            task = progress.add_task(body["namespace"], total=None)
            async for chunk in transport.stream_bytes("export.start", body):
                out.write(chunk)
                reader.feed(chunk)
                progress.update(task, completed=reader.rows, total=reader.total or None)
        reader.check()
        return reader
    finally:
        await transport.aclose()


def export_file(
    namespace: Annotated[str, typer.Option("--namespace", help="The namespace to export.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="The file to write.")],
    user_id: Annotated[str | None, typer.Option("--user-id", help="Only this user's rows.")] = None,
    thread_id: Annotated[str | None, typer.Option("--thread-id", help="Only this thread.")] = None,
    agent: Annotated[str | None, typer.Option(help="With --thread-id: only this agent's copy.")] = None,
    compression: Annotated[str, typer.Option(help="gzip (default), zstd or none.")] = "gzip",
    url: Annotated[str | None, typer.Option(help=f"Loom's API (default: {ENV_URL}, else local).")] = None,
    token: Annotated[str | None, typer.Option(help=f"An admin token (default: {ENV_TOKEN}).")] = None,
) -> None:
    """Export a namespace (or one user's rows, or one thread) in Loom's export format
    (docs/export-format.md): threads, turns with their tombstones and redactions, saved
    marks, briefs and their revisions, facts with their history and evidence, and the
    namespace's settings. `loom import` reads it back."""
    if compression not in ("gzip", "zstd", "none"):
        _fail("--compression must be gzip, zstd or none", 2)
    body: dict[str, Any] = {"namespace": namespace, "compression": compression}
    body |= {k: v for k, v in (("user_id", user_id), ("thread_id", thread_id), ("thread_agent", agent)) if v}
    try:
        reader = asyncio.run(_export(output, body, url, token))
    except LoomError as exc:
        _fail(str(exc), 1)
    except OSError as exc:
        _fail(f"{output}: cannot write it ({exc.strerror or type(exc).__name__})", 2)
    assert reader.end is not None
    print(f"{output}: {reader.rows} rows, sha256 {reader.end['sha256']} ({compression})")


def _fail(message: str, code: int) -> NoReturn:
    console.print(f"[red]{message}[/red]", highlight=False, soft_wrap=True)
    raise typer.Exit(code)
