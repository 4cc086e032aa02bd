"""The `loom` command: serve, worker, migrate, token, reembed, erasure export, retention show,
ingest-transcript, import, export, mcp."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from loom import logging as loom_logging
from loom.cli.common import admin_client, console, progress_bar, settings_or_exit
from loom.cli.erasure import erasure_app, retention_app
from loom.cli.ingest import ingest_transcript
from loom.cli.mcp import mcp_stdio
from loom.cli.portability import export_file, import_file
from loom.settings import Settings

if TYPE_CHECKING:
    from loom.supervisor import Supervisor

app = typer.Typer(help="Loom: the memory store for AI agents.", no_args_is_help=True, add_completion=False)
token_app = typer.Typer(help="Mint, list and revoke bearer tokens.", no_args_is_help=True)
app.add_typer(token_app, name="token")
app.add_typer(erasure_app, name="erasure")
app.add_typer(retention_app, name="retention")
app.command("ingest-transcript")(ingest_transcript)
app.command("import")(import_file)
app.command("export")(export_file)
app.command("mcp")(mcp_stdio)


@app.command()
def migrate(
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Apply a migration that changes what writers write while older writers are live."
        ),
    ] = False,
) -> None:
    """Apply the schema migrations and the retention/tiering TTL (idempotent). With
    LOOM_REDIS_URL set, a migration that changes what writers write waits until no live
    replica writes an older schema."""
    from clickhouse_schema.runner import MigrationBlocked, SchemaTooNew
    from loom.embedded.backends import backends_for
    from loom.store.schema import prepare

    settings = settings_or_exit()
    with backends_for(settings, need_redis=False) as backends:
        try:
            report = prepare(settings, backends.clickhouse_url, redis_url=settings.redis_url, force=force)
        except (MigrationBlocked, SchemaTooNew) as exc:
            console.print(f"[red]{exc}[/red]")
            raise typer.Exit(2) from None
    console.print(f"applied: {', '.join(report.applied) or 'nothing new'}")
    console.print(
        f"retention: {report.storage.retention_days or 'keep forever'} days; "
        f"tiering: {report.storage.tiering}"
    )


@app.command()
def worker() -> None:
    """Run an arq worker (embedding and background jobs) until stopped."""
    from workers.process import run

    run(settings_or_exit())


@app.command()
def serve(
    workers: Annotated[int, typer.Option(help="arq worker processes to start (0 for none).")] = 1,
    host: Annotated[
        str | None, typer.Option(help="Interface the API listens on (default LOOM_HOST).")
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="Port the API listens on (default LOOM_PORT).", min=1, max=65535)
    ] = None,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            help="Every line: each request, each job's start and end, MCP sessions, debug lines "
            "(default: start-up steps, warnings and errors; LOOM_LOG_VERBOSE).",
        ),
    ] = False,
) -> None:
    """Run Loom: with no configuration, the embedded ClickHouse endpoint and Redis,
    migrations, an arq worker and the API on 127.0.0.1:7777, each restarted if it dies
    (loom.supervisor). Ctrl-C stops everything, the API first."""
    from loom.embedded.backends import BackendInUse
    from loom.supervisor import HomeInUse, Supervisor

    settings = settings_or_exit()
    overrides: dict[str, object] = {k: v for k, v in (("host", host), ("port", port)) if v is not None}
    if verbose:
        overrides["log_verbose"] = True
    settings = settings.model_copy(update=overrides) if overrides else settings
    started = time.monotonic()
    sup = Supervisor(settings)
    sup.install_signal_handlers()
    try:
        sup.take_home(say)
    except (HomeInUse, BackendInUse) as exc:
        say(f"[red]{exc}[/red]")
        raise typer.Exit(1) from None
    failure = "the start-up failed"
    try:
        failure = _serve_until_stopped(sup, settings, workers, started)
    finally:
        sup.stop()
        say(f"[red]Loom stopped: {failure}[/red]" if failure else "Loom stopped.")
    # Every child is stopped and nothing is left to flush: skip the interpreter's
    # teardown of its modules, which takes seconds on a busy machine.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1 if failure else 0)


def _serve_until_stopped(sup: Supervisor, settings: Settings, workers: int, started: float) -> str:
    """Start everything, then supervise until stopped; why Loom failed, or "" after a stop."""
    from clickhouse_schema.runner import MigrationBlocked, SchemaTooNew
    from loom.store.schema import prepare

    # The API and the workers import their modules meanwhile (loom.start_gate).
    sup.start_services(workers if settings.clickhouse_embedded or settings.redis_embedded else 0)
    clickhouse_url, redis_url = sup.start_backends()
    say(
        f"backends ready: ClickHouse ({_where(settings.clickhouse_embedded)}), Redis ({_where(settings.redis_embedded)})"
    )
    try:
        report = prepare(settings, clickhouse_url, redis_url=redis_url)
    except (MigrationBlocked, SchemaTooNew) as exc:
        return str(exc)
    say(f"migrations applied: {_span(report.applied)}" if report.applied else "schema current")
    if settings.tiering_conversations_warm_days:
        say(f"tiering: {report.storage.tiering}")
    sup.release_services(clickhouse_url, redis_url)
    base = f"http://{settings.host}:{settings.port}"
    if (why := sup.wait_healthy(f"{base}/healthz")) is not None:
        return "" if sup.stop_requested else f"the API did not come up ({why}); see the log above"
    say(
        f"[green]Loom is up[/green] in {time.monotonic() - started:.1f}s\n"
        f"  API        {base}/v1/<op>\n  OpenAPI    {base}/docs\n"
        f"  Dashboard  {base}/dashboard\n"
        f"  Health     {base}/healthz\n"
        f"  Home       {settings.home}\nPress Ctrl-C to stop."
    )
    sup.supervise()
    return sup.give_up_message()


def say(text: str) -> None:
    """One line of `loom serve`'s own on the console, led by its UTC time as every log
    line is, never wrapped."""
    stamp = time.strftime(loom_logging.TIME_FORMAT, time.gmtime())
    console.print(f"{stamp} {text}", soft_wrap=True, highlight=False)


def _where(embedded: bool) -> str:
    return "embedded" if embedded else "external"


def _span(names: list[str]) -> str:
    """A list of migrations on one line: all of a few, the count and ends of many."""
    return ", ".join(names) if len(names) <= 3 else f"{len(names)} ({names[0]} … {names[-1]})"


@app.command()
def reembed(
    namespace: Annotated[
        str, typer.Option("--namespace", help="The namespace whose conversation vectors to rebuild.")
    ],
    thread_id: Annotated[str, typer.Option("--thread-id", help="Only this thread's rows.")] = "",
    page_size: Annotated[int, typer.Option(help="Rows per model call.", min=1, max=4096)] = 256,
    model: Annotated[
        str,
        typer.Option(
            "--model",
            help="Build the vectors of this bundled model (minilm, e5-small) beside the ones search uses "
            "now, instead of rewriting them with LOOM_EMBEDDER's.",
        ),
    ] = "",
) -> None:
    """Re-embed a namespace's conversation turns from the text each embedding row keeps
    (2,048 characters, or 240 for rows of earlier builds), e.g. after a model change.
    Skips tombstoned rows and rows whose text reads as high. Uses LOOM_EMBEDDER here,
    in this process; runs with or without `loom serve`.

    With --model, the namespace's vectors of that model are built beside the current
    ones while `loom serve` keeps answering from its own model's (a search never
    compares vectors of two models); switch LOOM_EMBEDDER to it when this is done, then
    run it once more to catch up with the turns appended meanwhile."""
    import asyncio

    from loom.embedded.backends import start_backends
    from loom.ops.conversation.lifecycle.reembedding import Walk, reembed_to_model, reembed_with
    from loom.ops.embedding.writer import model_from_embedder
    from loom.providers.embedders import build_embedder
    from loom.services import open_services
    from loom.store import embeddings
    from loom.store.schema import prepare
    from workers.embed_jobs import embedder_from_settings

    settings = settings_or_exit()
    backends = start_backends(settings)

    async def run() -> object:
        svc = await open_services(settings, backends.clickhouse_url, backends.redis_url)
        try:
            embedder = (
                build_embedder(model) if model else embedder_from_settings(settings, single_threaded=False)
            )
            total = await svc.run(embeddings.count, svc.ch, namespace, thread_id or None)
            with progress_bar("re-embedding") as progress:
                task = progress.add_task(f"{namespace} ({embedder.model_id})", total=total)
                walk = Walk(namespace, thread_id or None, page_size, lambda n: progress.advance(task, n))
                if model:
                    return await reembed_to_model(svc, walk, embedder)
                return await reembed_with(svc, walk, model_from_embedder(lambda: embedder))
        finally:
            await svc.close()

    try:
        prepare(settings, backends.clickhouse_url)
        report = asyncio.run(run())
    finally:
        backends.stop()
    fields = report.__dict__
    console.print(" ".join(f"{k}={v}" for k, v in fields.items() if k not in ("namespace", "errors")))
    for error in fields.get("errors", [])[:5]:
        console.print(f"[red]{error}[/red]")
    if fields.get("failed"):
        raise typer.Exit(1)


@token_app.command("mint")
def token_mint(
    namespace: Annotated[
        list[str], typer.Option("--namespace", help="Namespace the token grants (repeatable).")
    ],
    role: Annotated[str, typer.Option(help="viewer | writer | admin")] = "viewer",
    read_scope: Annotated[str, typer.Option(help="all | own_user | own_session")] = "all",
    read_user_id: Annotated[str, typer.Option(help="The user an own_user token acts as.")] = "",
    read_session_id: Annotated[str, typer.Option(help="The session an own_session token acts in.")] = "",
    label: Annotated[str, typer.Option(help="A note for `loom token list`.")] = "",
    expires_in: Annotated[
        str, typer.Option(help="Lifetime, such as 30d, 12h, 90m or 3600s (default: never expires).")
    ] = "",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Mint a token. It is printed once and stored only as a hash."""
    from loom.auth.tokens import mint, parse_lifetime
    from loom.errors import LoomError

    settings = settings_or_exit()
    with admin_client(settings) as ch:
        try:
            lifetime = parse_lifetime(expires_in) if expires_in else None
            minted = mint(
                ch, namespace, role, read_scope, read_user_id, read_session_id, label, expires_in=lifetime
            )
        except LoomError as exc:
            console.print(f"[red]{exc.message}[/red]")
            raise typer.Exit(2) from None
    if as_json:
        print(
            json.dumps(
                {
                    "token": minted.token,
                    "token_id": minted.token_id,
                    "namespaces": namespace,
                    "role": role,
                    "read_scope": read_scope,
                    "read_user_id": read_user_id,
                }
            )
        )
    else:
        print(minted.token)


@token_app.command("list")
def token_list(include_revoked: bool = False) -> None:
    """List tokens (never their secrets)."""
    from loom.store import tokens as store

    settings = settings_or_exit()
    with admin_client(settings) as ch:
        rows = store.list_all(ch, include_revoked)
    table = Table("namespaces", "role", "read_scope", "user", "label", "created", "revoked")
    table.add_column("token_id", no_wrap=True, min_width=16)
    for r in rows:
        table.add_row(
            ",".join(r.namespaces),
            r.role,
            r.read_scope,
            r.read_user_id or r.read_session_id,
            r.label,
            r.created_at.isoformat(timespec="seconds"),
            "yes" if r.revoked else "",
            r.token_id,
        )
    Console().print(table)


@token_app.command("revoke")
def token_revoke(token_id: str) -> None:
    """Revoke a token by id (takes effect within seconds everywhere)."""
    from loom.auth.tokens import revoke

    settings = settings_or_exit()
    with admin_client(settings) as ch:
        if not revoke(ch, token_id):
            console.print(f"[red]no token {token_id}[/red]")
            raise typer.Exit(1)
    console.print(f"revoked {token_id}")


if __name__ == "__main__":
    app()
