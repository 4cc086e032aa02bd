"""retention.show (admin) and `loom retention show`: the retention and tiering in
force, as the server reports it (not as the settings say they should be).

LOOM_RETENTION_CONVERSATIONS_DAYS is the TTL of loom.conversations and of the tables
derived from a transcript's text or terms (saved_docs, saved_terms, conversation_terms); embedding rows
never expire. LOOM_TIERING_CONVERSATIONS_WARM_DAYS moves transcript parts to the
'warm' volume, and applies only where the table's storage policy has one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from clickhouse_connect.driver.client import Client

from loom.auth.principal import Principal, Role
from loom.services import Services
from loom.settings import Settings
from loom.store import retention as store

TIERED_TABLE = "conversations"
WARM = "warm"


@dataclass
class Tiering:
    warm_days: int
    applies: bool
    why: str


@dataclass(kw_only=True)
class RetentionReport:
    retention_days: int
    tiering: Tiering
    tables: list[store.TableStorage] = field(default_factory=list)


def report(ch: Client, settings: Settings) -> RetentionReport:
    found = store.tables(ch)
    conv = next((t for t in found if t.table == TIERED_TABLE), None)
    warm_days = settings.tiering_conversations_warm_days
    if warm_days <= 0:
        tiering = Tiering(warm_days, False, "off (LOOM_TIERING_CONVERSATIONS_WARM_DAYS is 0)")
    elif conv is None or WARM not in conv.volumes:
        policy = conv.storage_policy if conv else "?"
        tiering = Tiering(warm_days, False, f"not applicable: storage policy {policy!r} has no 'warm' volume")
    elif "TO VOLUME 'warm'" not in conv.ttl:
        tiering = Tiering(
            warm_days,
            False,
            "not in force: the table's TTL has no move to 'warm' yet (settings.set applies it at once, "
            "start-up applies the environment's)",
        )
    else:
        tiering = Tiering(warm_days, True, f"parts older than {warm_days} days move to 'warm'")
    return RetentionReport(
        retention_days=settings.retention_conversations_days, tiering=tiering, tables=found
    )


async def show(svc: Services, who: Principal) -> RetentionReport:
    """retention.show (admin)."""
    who.require_role(Role.admin)
    return await svc.run(report, svc.ch, svc.settings)
