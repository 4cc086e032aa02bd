"""Shared helpers of the brief tests."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from loom.auth.principal import Principal
from loom.models.session import (
    BriefDeleteRequest,
    BriefEvent,
    BriefGetRequest,
    BriefGetResponse,
    BriefListRequest,
    BriefSaveRequest,
    BriefSaveResponse,
)
from loom.ops import briefs as ops
from loom.ops.briefs.events import Event
from loom.services import Services
from loom.settings import Settings


def ev(kind: str, text: str = "", **kw: Any) -> Event:
    return Event(kind, text, **kw)


def answer(**fields: Any) -> str:
    """A model answer that follows the contract."""
    return json.dumps(fields)


def notes(n: int, size: int = 100, tag: str = "n") -> list[Event]:
    """n note events whose rendered line plus newline is exactly `size` characters."""
    head = len("[note]: ") + 1
    return [Event("note", f"{tag}{i:04d}" + "x" * (size - head - len(tag) - 4)) for i in range(n)]


# The ops take their request models; these build them from keywords, as the tests name them.
async def brief_save(
    svc: Services, who: Principal, ns: str, *, settings: Settings | None = None, **fields: Any
) -> BriefSaveResponse:
    events = [BriefEvent(**asdict(e)) for e in fields.pop("events", [])]
    req = BriefSaveRequest(namespace=ns, events=events, **fields)
    return await ops.save(svc, who, req, settings=settings)


async def brief_get(svc: Services, who: Principal, ns: str, **fields: Any) -> BriefGetResponse:
    return await ops.brief_get(svc, who, BriefGetRequest(namespace=ns, **fields))


async def brief_list(svc: Services, who: Principal, ns: str, **fields: Any) -> list[ops.ListItem]:
    return await ops.brief_list(svc, who, BriefListRequest(namespace=ns, **fields))


async def brief_delete(svc: Services, who: Principal, ns: str, **fields: Any) -> bool:
    return await ops.brief_delete(svc, who, BriefDeleteRequest(namespace=ns, **fields))
