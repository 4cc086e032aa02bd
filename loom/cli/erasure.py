"""`loom erasure export` and `loom retention show`: admin commands run on the machine
(like `loom token mint`), against a running `loom serve`'s engine or the configured
ClickHouse, with or without the API."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
from rich.console import Console

from loom.cli.common import admin_client, console, progress_bar, settings_or_exit

erasure_app = typer.Typer(help="Export a user's rows (erasure.request is an API op).", no_args_is_help=True)
retention_app = typer.Typer(help="Retention and tiering in force.", no_args_is_help=True)


@erasure_app.command("export")
def export(
    user: Annotated[str, typer.Option("--user", help="The user whose rows to export.")],
    namespace: Annotated[
        list[str], typer.Option("--namespace", help="A namespace to export from (repeatable).")
    ],
    include_tombstoned: Annotated[
        bool, typer.Option(help="Include tombstoned (deleted, compacted) turns.")
    ] = True,
    page_rows: Annotated[int, typer.Option(help="Rows per page read.", min=1, max=100_000)] = 5_000,
) -> None:
    """Write a user's rows as NDJSON to stdout (what erasure.export streams: a header,
    transcript rows, briefs and revisions, an `end` line; never embedding rows), with a
    progress bar on stderr: `loom erasure export --user U --namespace NS > file.ndjson`."""
    from loom.ops.erasure.exporting import PAGE_ROWS, header, trailer
    from loom.store import export as store

    out = sys.stdout.buffer
    with admin_client(settings_or_exit()) as ch:
        total = sum(store.count_turns(ch, ns, user, include_tombstoned) for ns in namespace)
        out.write(header(user, namespace, include_tombstoned))
        rows = 0
        with progress_bar("exporting") as progress:
            task = progress.add_task(user, total=total)
            for body, n in store.user_rows(ch, user, namespace, include_tombstoned, page_rows or PAGE_ROWS):
                out.write(body)
                rows += n
                progress.update(task, completed=min(rows, total))
        out.write(trailer(rows))
        out.flush()
    console.print(f"{rows} rows")


@retention_app.command("show")
def show(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Each table's TTL and storage policy as the server reports them, and whether
    tiering (LOOM_TIERING_CONVERSATIONS_WARM_DAYS) applies."""
    from dataclasses import asdict

    from rich.table import Table

    from loom.ops.erasure.retention import report

    settings = settings_or_exit()
    with admin_client(settings) as ch:
        found = report(ch, settings)
    if as_json:
        print(json.dumps(asdict(found), indent=2))
        return
    table = Table("table", "TTL", "storage policy", "volumes")
    for t in found.tables:
        table.add_row(t.table, t.ttl or "-", t.storage_policy, ", ".join(t.volumes))
    Console().print(table)
    print(f"retention: {found.retention_days or 'keep forever'} days (LOOM_RETENTION_CONVERSATIONS_DAYS)")
    print(f"tiering: {'applies' if found.tiering.applies else 'does not apply'}: {found.tiering.why}")
