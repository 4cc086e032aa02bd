"""Applies the numbered migrations in this folder, each once, in order.

Safe from two processes at once: every statement is idempotent (IF NOT EXISTS /
IF EXISTS) and the record of an applied migration is a ReplacingMergeTree row keyed
by its number, so a second runner re-applies nothing harmful and records nothing twice.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from clickhouse_connect.driver.client import Client

MIGRATIONS_DIR = Path(__file__).parent
_FILE = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")
_ENGINE = re.compile(r"ENGINE\s*=\s*(\w*MergeTree)\s*(\(([^)]*)\))?")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

MIGRATIONS_TABLE = "schema_migrations"
# A migration that changes what writers must write carries this line: while a live
# replica writes an older schema, applying it would let that replica write rows the new
# schema's readers misread, so the runner refuses until it is gone (or is forced).
WRITERS_MUST_UPGRADE = "-- loom: writers-must-upgrade"


class SchemaTooNew(RuntimeError):
    """The database holds migrations this build does not know: it must not write there."""


class MigrationBlocked(RuntimeError):
    """A live replica writes an older schema than a writers-must-upgrade migration needs."""


@dataclass(frozen=True)
class Migration:
    number: int
    name: str
    path: Path

    def statements(self, cluster: str = "") -> list[str]:
        return split_statements(fill_run(render(self.path.read_text(), cluster)))

    @property
    def writers_must_upgrade(self) -> bool:
        return any(line.strip() == WRITERS_MUST_UPGRADE for line in self.path.read_text().splitlines())


def discover(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    found = []
    for path in sorted(directory.glob("*.sql")):
        m = _FILE.match(path.name)
        if not m:
            raise ValueError(f"migration file name must be NNN_name.sql: {path.name}")
        found.append(Migration(int(m.group(1)), m.group(2), path))
    numbers = [m.number for m in found]
    if len(set(numbers)) != len(numbers):
        raise ValueError(f"duplicate migration numbers in {directory}")
    return found


def _replicated(match: re.Match[str]) -> str:
    engine, args = match.group(1), (match.group(3) or "").strip()
    path = "'/clickhouse/tables/{shard}/{database}/{table}', '{replica}'"
    return f"ENGINE = Replicated{engine}({path}{', ' + args if args else ''})"


def render(sql: str, cluster: str = "") -> str:
    """Fill `{on_cluster}`; with a cluster, make every MergeTree engine Replicated."""
    if not cluster:
        return sql.replace("{on_cluster}", "")
    if not _IDENT.match(cluster):
        raise ValueError(f"LOOM_CLICKHOUSE_CLUSTER must be a plain identifier, got {cluster!r}")
    sql = sql.replace("{on_cluster}", f"ON CLUSTER {cluster}")
    return _ENGINE.sub(_replicated, sql)


def fill_run(sql: str) -> str:
    """Fill `{run}` with a token unique to this application of the migration: a table
    rebuild names its copy with it, so two processes migrating at once never share one."""
    return sql.replace("{run}", secrets.token_hex(4))


def split_statements(sql: str) -> list[str]:
    lines = [line for line in sql.splitlines() if not line.strip().startswith("--")]
    body = "\n".join(lines)
    return [s.strip() for s in body.split(";\n") if s.strip().rstrip(";").strip()]


def _ensure_table(client: Client, cluster: str) -> None:
    client.command(
        render(
            f"CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} {{on_cluster}} "
            "(number UInt32, name String, applied_at DateTime64(3, 'UTC') DEFAULT now64(3)) "
            "ENGINE = ReplacingMergeTree ORDER BY number",
            cluster,
        )
    )


def applied(client: Client) -> set[int]:
    rows = client.query(f"SELECT DISTINCT number FROM {MIGRATIONS_TABLE}").result_rows
    return {int(r[0]) for r in rows}


def newest_known() -> int:
    """The newest migration this build knows: the schema it writes."""
    return max(m.number for m in discover())


def check_not_newer(client: Client) -> None:
    """Refuse a database migrated by a newer build (its writers write what this build's
    readers and writers do not know)."""
    done = applied(client) if _has_table(client) else set()
    unknown = sorted(n for n in done if n > newest_known())
    if unknown:
        raise SchemaTooNew(
            f"the database's schema is at migration {unknown[-1]:03d}, newer than this build knows "
            f"({newest_known():03d}); run a build of Loom at least as new"
        )


def _has_table(client: Client) -> bool:
    return bool(client.command(f"EXISTS TABLE {MIGRATIONS_TABLE}"))


# Who writes an older schema than `number` (a description per live replica).
Blockers = Callable[[int], list[str]]


def migrate(
    client: Client, cluster: str = "", *, blockers: Blockers | None = None, force: bool = False
) -> list[Migration]:
    """Apply what is missing; returns the migrations this call applied. A
    writers-must-upgrade migration waits for every older live writer to be gone
    (MigrationBlocked), unless `force` (then it is logged by the caller)."""
    _ensure_table(client, cluster)
    check_not_newer(client)
    done = applied(client)
    ran: list[Migration] = []
    for migration in discover():
        if migration.number in done:
            continue
        if migration.writers_must_upgrade and blockers is not None and not force:
            older = blockers(migration.number)
            if older:
                raise MigrationBlocked(
                    f"migration {migration.number:03d}_{migration.name} changes what writers write, "
                    f"and live replicas write an older schema: {', '.join(older)}; roll them first "
                    "(or force it: `loom migrate --force`)"
                )
        for statement in migration.statements(cluster):
            client.command(statement)
        client.insert(
            MIGRATIONS_TABLE,
            [[migration.number, migration.name]],
            column_names=["number", "name"],
            settings={"insert_deduplication_token": f"migration-{migration.number}"},
        )
        ran.append(migration)
    return ran


# --- retention and tiering of loom.conversations (applied at every start-up) --------

# Tables that hold a transcript's text or terms (the saved-message indexes, the
# transcript's postings of migration 016): they carry the transcript's retention TTL. A
# later index of transcript text joins this list.
DERIVED_TEXT_TABLES = ("saved_docs", "saved_terms", "conversation_terms")


@dataclass(frozen=True)
class StorageReport:
    retention_days: int
    warm_days: int
    tiering: str  # "off" | "applied" | "not applicable: <why>"


def _has_warm_volume(client: Client, table: str) -> bool:
    rows = client.query(
        "SELECT count() FROM system.storage_policies AS p "
        "INNER JOIN system.tables AS t ON t.storage_policy = p.policy_name "
        "WHERE t.database = currentDatabase() AND t.name = {t:String} AND p.volume_name = 'warm'",
        parameters={"t": table},
    ).result_rows
    return bool(rows and rows[0][0])


def conversations_ttl(retention_days: int, warm_days: int) -> list[str]:
    """The TTL clauses of loom.conversations: a move to the 'warm' volume (only where the
    table's storage policy has one) and the retention delete."""
    clauses: list[str] = []
    if warm_days > 0:
        clauses.append(f"toDateTime(ts) + INTERVAL {int(warm_days)} DAY TO VOLUME 'warm'")
    if retention_days > 0:
        clauses.append(f"toDateTime(ts) + INTERVAL {int(retention_days)} DAY DELETE")
    return clauses


def apply_storage_rules(
    client: Client, retention_days: int, warm_days: int, cluster: str = ""
) -> StorageReport:
    """Set or remove the TTL of the conversations table only (embeddings never expire)."""
    tiering = "off"
    warm = False
    if warm_days > 0:
        warm = _has_warm_volume(client, "conversations")
        tiering = (
            "applied"
            if warm
            else "not applicable: the conversations table's storage policy has no 'warm' volume"
        )
    clauses = conversations_ttl(retention_days, warm_days if warm else 0)
    on_cluster = render(" {on_cluster}", cluster)
    if clauses:
        client.command(f"ALTER TABLE conversations{on_cluster} MODIFY TTL {', '.join(clauses)}")
    elif _has_ttl(client, "conversations"):
        client.command(f"ALTER TABLE conversations{on_cluster} REMOVE TTL")
    # The tables derived from a transcript's text or terms never outlive its row: the
    # same TTL, on the same message time (the embedding rows, which are not derived from
    # the transcript row's lifetime, keep none).
    for table in DERIVED_TEXT_TABLES:
        if retention_days > 0:
            client.command(
                f"ALTER TABLE {table}{on_cluster} MODIFY TTL "
                f"toDateTime(ts) + INTERVAL {int(retention_days)} DAY DELETE"
            )
        elif _has_ttl(client, table):
            client.command(f"ALTER TABLE {table}{on_cluster} REMOVE TTL")
    return StorageReport(retention_days, warm_days, tiering)


def _has_ttl(client: Client, table: str) -> bool:
    rows = client.query(
        "SELECT create_table_query FROM system.tables WHERE database = currentDatabase() AND name = {t:String}",
        parameters={"t": table},
    ).result_rows
    return bool(rows) and " TTL " in str(rows[0][0])


def wait_for(client: Client, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.command("SELECT 1")
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
