"""replicas.show: the live replicas of a deploy and the capabilities they all share.

Every token may ask what the deploy shares (a client hides "save" while saving is
paused); only an admin sees the replicas themselves (hosts, builds, schemas).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from loom import replicas
from loom.auth.principal import Principal, Role
from loom.services import Services


@dataclass(kw_only=True)
class DeployView:
    capabilities: list[str]  # what every live replica declares
    live: int
    replicas: list[replicas.Replica] | None = field(default=None)  # admins only


async def show(svc: Services, who: Principal) -> DeployView:
    """replicas.show (viewer; the replica list for an admin)."""
    who.require_role(Role.viewer)
    found = await replicas.live(svc.redis)
    listed = found if who.role >= Role.admin and not who.bounded else None
    return DeployView(capabilities=sorted(replicas.shared_by(found)), live=len(found), replicas=listed)
