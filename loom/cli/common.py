"""What every admin command shares: the settings (or a clean exit) and a ClickHouse client."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from loom.settings import Settings, SettingsError, load_settings

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

console = Console(stderr=True)


def progress_bar(doing: str) -> Progress:
    """A long command's progress on stderr: `doing` what, how many of how many, the time left."""
    return Progress(
        TextColumn(f"[bold]{doing}[/bold] {{task.description}}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
    )


def settings_or_exit() -> Settings:
    try:
        return load_settings()
    except SettingsError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None


@contextmanager
def admin_client(settings: Settings) -> Iterator[Client]:
    """A ClickHouse client for an admin command: uses a running `loom serve`'s
    embedded endpoint if there is one, else starts the engine for the command."""
    # Imported here, not at the top: `loom --help` and the client-side commands never
    # load the engine's modules.
    from loom.embedded.backends import start_backends
    from loom.store.clickhouse import connect
    from loom.store.schema import prepare

    backends = start_backends(settings, need_redis=False)
    try:
        prepare(settings, backends.clickhouse_url)
        ch = connect(
            backends.clickhouse_url,
            database=settings.clickhouse_database,
            user=settings.clickhouse_user,
            password=settings.clickhouse_password,
        )
    except BaseException:
        backends.stop()
        raise
    try:
        yield ch
    finally:
        ch.close()
        backends.stop()
