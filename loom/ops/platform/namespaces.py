"""Namespace-level switches: the owner's recording choice, the model-call policy."""

from __future__ import annotations

import asyncio

from loom.auth.principal import Principal, Role
from loom.services import Services
from loom.store import namespace_cache, recording_cache
from loom.store import namespaces as store


async def set_logging(svc: Services, who: Principal, namespace: str, enabled: bool) -> store.NamespaceConfig:
    """conversation.set_logging (admin): switch transcript recording on or off."""
    who.require_role(Role.admin)
    ns = who.namespace(namespace)
    return await _update(svc, ns, conversation_logging_enabled=enabled)


async def get_config(svc: Services, who: Principal, namespace: str) -> store.NamespaceConfig:
    who.require_role(Role.viewer)
    ns = who.namespace(namespace)
    return await svc.run(store.get, svc.ch, ns)


async def set_model_calls(
    svc: Services, who: Principal, namespace: str, enabled: bool, extraction_policy: str | None = None
) -> store.NamespaceConfig:
    """namespace.set_policy (admin): the owner's model-call switch and the operator's extraction policy."""
    who.require_role(Role.admin)
    ns = who.namespace(namespace)
    changes: dict[str, object] = {"model_calls_enabled": enabled}
    if extraction_policy is not None:
        changes["extraction_policy"] = extraction_policy
    return await _update(svc, ns, **changes)


async def config(svc: Services, namespace: str) -> store.NamespaceConfig:
    """The namespace's row: from the Redis cache, from ClickHouse on a miss."""
    got = await namespace_cache.cached(svc.redis, namespace)
    if got is None:
        got = await svc.run(store.get, svc.ch, namespace)
        await namespace_cache.remember(svc.redis, got)
    return got


async def _update(svc: Services, namespace: str, **changes: object) -> store.NamespaceConfig:
    """Every write of a namespace's row rewrites its cached copies: they go before the
    write and the new ones are cached after (loom.store.recording_cache)."""
    await asyncio.gather(
        recording_cache.forget(svc.redis, namespace), namespace_cache.forget(svc.redis, namespace)
    )
    config = await svc.run(store.update, svc.ch, namespace, **changes)
    await asyncio.gather(
        recording_cache.publish(svc.redis, namespace, config.conversation_logging_enabled),
        namespace_cache.publish(svc.redis, config),
    )
    return config
