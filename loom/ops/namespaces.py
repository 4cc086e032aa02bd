"""Namespace-level switches: the owner's recording choice."""

from __future__ import annotations

from loom.auth.principal import Principal, Role
from loom.services import Services
from loom.store import namespaces as store
from loom.store import recording_cache


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


async def _update(svc: Services, namespace: str, **changes: object) -> store.NamespaceConfig:
    """Every write of a namespace's row rewrites its recording switch: the cached switch
    goes before the write and the new one is cached after (loom.store.recording_cache)."""
    await recording_cache.forget(svc.redis, namespace)
    config = await svc.run(store.update, svc.ch, namespace, **changes)
    await recording_cache.publish(svc.redis, namespace, config.conversation_logging_enabled)
    return config
