"""The `loom` command: serve, worker, migrate, token, reembed, erasure export, retention show."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Annotated

import httpx
import typer
from rich.console import Console
from rich.table import Table

from loom.cli.erasure import erasure_app, retention_app
from loom.settings import Settings, SettingsError, load_settings

app = typer.Typer(help="Loom: the memory store for AI agents.", no_args_is_help=True, add_completion=False)
token_app = typer.Typer(help="Mint, list and revoke bearer tokens.", no_args_is_help=True)
app.add_typer(token_app, name="token")
app.add_typer(erasure_app, name="erasure")
app.add_typer(retention_app, name="retention")
console = Console(stderr=True)


def _settings() -> Settings:
    try:
        return load_settings()
    except SettingsError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None


@app.command()
def migrate() -> None:
    """Apply the schema migrations and the retention/tiering TTL (idempotent)."""
    from loom.embedded.backends import backends_for
    from loom.store.schema import prepare

    settings = _settings()
    with backends_for(settings, need_redis=False) as backends:
        report = prepare(settings, backends.clickhouse_url)
    console.print(f"applied: {', '.join(report.applied) or 'nothing new'}")
    console.print(f"retention: {report.storage.retention_days or 'keep forever'} days; "
                  f"tiering: {report.storage.tiering}")


@app.command()
def worker() -> None:
    """Run an arq worker (embedding and background jobs) until stopped."""
    from loom.embedded.backends import start_backends
    from workers.main import run_worker

    settings = _settings()
    backends = start_backends(settings)
    try:
        run_worker(settings, backends.clickhouse_url, backends.redis_url)
    finally:
        backends.stop()


def _child_env(settings: Settings, clickhouse_url: str, redis_url: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(LOOM_CLICKHOUSE_URL=clickhouse_url, LOOM_REDIS_URL=redis_url, LOOM_HOME=str(settings.home))
    return env


def _wait_healthy(url: str, procs: list[subprocess.Popen[bytes]], timeout: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            return False
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    return False


@app.command()
def serve(
    workers: Annotated[int, typer.Option(help="arq worker processes to start (0 for none).")] = 1,
    host: Annotated[str | None, typer.Option(help="Interface the API listens on (default LOOM_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Port the API listens on (default LOOM_PORT).",
                                             min=1, max=65535)] = None,
) -> None:
    """Run Loom: with no configuration, the embedded ClickHouse endpoint and Redis,
    migrations, an arq worker and the API on 127.0.0.1:7777. Ctrl-C stops everything."""
    from loom.embedded.backends import start_backends
    from loom.store.schema import prepare

    settings = _settings()
    overrides = {k: v for k, v in (("host", host), ("port", port)) if v is not None}
    settings = settings.model_copy(update=overrides) if overrides else settings
    started = time.monotonic()
    settings.home.mkdir(parents=True, exist_ok=True)
    backends = start_backends(settings)
    children: list[subprocess.Popen[bytes]] = []
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        report = prepare(settings, backends.clickhouse_url)
        if report.applied:
            console.print(f"migrations applied: {', '.join(report.applied)}")
        if settings.tiering_conversations_warm_days:
            console.print(f"tiering: {report.storage.tiering}")
        env = _child_env(settings, backends.clickhouse_url, backends.redis_url)
        for _ in range(workers if settings.clickhouse_embedded or settings.redis_embedded else 0):
            children.append(subprocess.Popen([sys.executable, "-m", "loom.cli.main", "worker"], env=env))
        # uvicorn picks httptools and uvloop (uvicorn[standard]) on its own: about a
        # tenth of a millisecond less per request than h11 and asyncio's loop.
        children.append(subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "loom.api.main:app", "--host", settings.host,
             "--port", str(settings.port), "--no-access-log", "--log-level", "warning"], env=env))
        base = f"http://{settings.host}:{settings.port}"
        if not _wait_healthy(f"{base}/healthz", children):
            console.print("[red]the API did not come up; see the log above[/red]")
            raise typer.Exit(1)
        console.print(f"[green]Loom is up[/green] in {time.monotonic() - started:.1f}s\n"
                      f"  API        {base}/v1/<op>\n  OpenAPI    {base}/docs\n"
                      f"  Health     {base}/healthz\n"
                      f"  Home       {settings.home}\nPress Ctrl-C to stop.")
        while not stopping and all(p.poll() is None for p in children):
            time.sleep(0.2)
    finally:
        for proc in reversed(children):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(children):
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        backends.stop()
        console.print("Loom stopped.")


@app.command()
def reembed(
    namespace: Annotated[str, typer.Option("--namespace", help="The namespace whose conversation vectors to rebuild.")],
    thread_id: Annotated[str, typer.Option("--thread-id", help="Only this thread's rows.")] = "",
    page_size: Annotated[int, typer.Option(help="Rows per model call.", min=1, max=4096)] = 256,
) -> None:
    """Re-embed a namespace's conversation turns from the text each embedding row keeps
    (2,048 characters, or 240 for rows of earlier builds), e.g. after a model change.
    Skips tombstoned rows and rows whose text reads as high. Uses LOOM_EMBEDDER here,
    in this process; runs with or without `loom serve`."""
    import asyncio

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from loom.embedded.backends import start_backends
    from loom.ops.conversation.embedding import model_from_embedder
    from loom.ops.conversation.reembedding import reembed_with
    from loom.services import open_services
    from loom.store import embeddings
    from loom.store.schema import prepare
    from workers.embedding import embedder_from_settings

    settings = _settings()
    backends = start_backends(settings)

    async def run() -> object:
        svc = await open_services(settings, backends.clickhouse_url, backends.redis_url)
        try:
            embedder = embedder_from_settings(settings, single_threaded=False)
            total = await svc.run(embeddings.count, svc.ch, namespace, thread_id or None)
            columns = (TextColumn("[bold]re-embedding[/bold] {task.description}"), BarColumn(),
                       MofNCompleteColumn(), TimeRemainingColumn())
            with Progress(*columns, console=console) as progress:
                task = progress.add_task(f"{namespace} ({embedder.model_id})", total=total)
                return await reembed_with(svc, namespace, model_from_embedder(lambda: embedder),
                                          thread_id=thread_id or None, page_size=page_size,
                                          progress=lambda n: progress.advance(task, n))
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
    namespace: Annotated[list[str], typer.Option("--namespace", help="Namespace the token grants (repeatable).")],
    role: Annotated[str, typer.Option(help="viewer | writer | admin")] = "viewer",
    read_scope: Annotated[str, typer.Option(help="all | own_user | own_session")] = "all",
    read_user_id: Annotated[str, typer.Option(help="The user an own_user token acts as.")] = "",
    read_session_id: Annotated[str, typer.Option(help="The session an own_session token acts in.")] = "",
    label: Annotated[str, typer.Option(help="A note for `loom token list`.")] = "",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Mint a token. It is printed once and stored only as a hash."""
    from loom.auth.tokens import mint
    from loom.errors import LoomError

    settings = _settings()
    with _admin_client(settings) as ch:
        try:
            minted = mint(ch, namespace, role, read_scope, read_user_id, read_session_id, label)
        except LoomError as exc:
            console.print(f"[red]{exc.message}[/red]")
            raise typer.Exit(2) from None
    if as_json:
        print(json.dumps({"token": minted.token, "token_id": minted.token_id, "namespaces": namespace,
                          "role": role, "read_scope": read_scope, "read_user_id": read_user_id}))
    else:
        print(minted.token)


@token_app.command("list")
def token_list(include_revoked: bool = False) -> None:
    """List tokens (never their secrets)."""
    from loom.store import tokens as store

    settings = _settings()
    with _admin_client(settings) as ch:
        rows = store.list_all(ch, include_revoked)
    table = Table("namespaces", "role", "read_scope", "user", "label", "created", "revoked")
    table.add_column("token_id", no_wrap=True, min_width=16)
    for r in rows:
        table.add_row(",".join(r.namespaces), r.role, r.read_scope, r.read_user_id or r.read_session_id,
                      r.label, r.created_at.isoformat(timespec="seconds"), "yes" if r.revoked else "", r.token_id)
    Console().print(table)


@token_app.command("revoke")
def token_revoke(token_id: str) -> None:
    """Revoke a token by id (takes effect within seconds everywhere)."""
    from loom.auth.tokens import revoke

    settings = _settings()
    with _admin_client(settings) as ch:
        if not revoke(ch, token_id):
            console.print(f"[red]no token {token_id}[/red]")
            raise typer.Exit(1)
    console.print(f"revoked {token_id}")


class _admin_client:
    """A ClickHouse client for an admin command: uses a running `loom serve`'s
    embedded endpoint if there is one, else starts the engine for the command."""

    def __init__(self, settings: Settings):
        self.settings = settings

    def __enter__(self):  # type: ignore[no-untyped-def]
        from loom.embedded.backends import start_backends
        from loom.store.clickhouse import connect
        from loom.store.schema import prepare

        self.backends = start_backends(self.settings, need_redis=False)
        try:
            prepare(self.settings, self.backends.clickhouse_url)
            self.ch = connect(self.backends.clickhouse_url, database=self.settings.clickhouse_database,
                              user=self.settings.clickhouse_user, password=self.settings.clickhouse_password)
        except BaseException:
            self.backends.stop()
            raise
        return self.ch

    def __exit__(self, *exc: object) -> None:
        self.ch.close()
        self.backends.stop()


if __name__ == "__main__":
    app()
