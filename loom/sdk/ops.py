"""Every op as a typed method: the request is built and checked with the API's own edge
model (so a bad field fails here, before a round trip, with the rule the server would
name) and the answer is parsed into the API's response model.

Methods take the request's fields as keywords; `namespace` and `agent` default to the
Agent's. Grouped as the API groups them: `bot.conversation`, `bot.saved`, `bot.memory`,
`bot.briefs`, `bot.erasure`, `bot.namespaces`, `bot.ops`, `bot.settings`, `bot.webhooks`,
`bot.portability` (import and export; `loom import` / `loom export` drive them)
(signature checks for receivers: loom.sdk.webhooks.verify_signature).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError

from loom.api.models import briefs as b
from loom.api.models import compaction as k
from loom.api.models import conversation as c
from loom.api.models import deploy as d
from loom.api.models import erasure as e
from loom.api.models import health as h
from loom.api.models import memory as m
from loom.api.models import memory_answers as ma
from loom.api.models import namespaces as n
from loom.api.models import portability as pt
from loom.api.models import saved as s
from loom.api.models import search as q
from loom.api.models import settings as st
from loom.api.models import webhooks as w
from loom.sdk.transport import LoomError

if TYPE_CHECKING:
    from loom.sdk.agent import Agent

R = TypeVar("R", bound=BaseModel)


def request_body(agent: Agent, model: type[BaseModel], fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` checked by the API's request model, with the Agent's namespace and name
    where the model has them and the caller left them out; as the JSON the API reads."""
    body = dict(fields)
    for name, value in (("namespace", agent.namespace), ("agent", agent.name)):
        if name in model.model_fields and name not in body:
            body[name] = value
    try:
        checked = model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or None
        raise LoomError(422, "invalid_request", first["msg"], field, first["type"]) from None
    return checked.model_dump(mode="json", exclude_unset=True)


class _Group:
    def __init__(self, agent: Agent) -> None:
        self._agent = agent

    async def _op(
        self,
        op: str,
        request: type[BaseModel],
        response: type[R],
        fields: dict[str, Any],
        *,
        idempotent: bool = True,
    ) -> R:
        body = request_body(self._agent, request, fields)
        answer = await self._agent.transport.call(op, body, idempotent=idempotent)
        return response.model_validate(answer)


class Conversation(_Group):
    async def append(self, **fields: Any) -> c.AppendResponse:
        """One turn (idempotent by msg_id: retried on 503)."""
        return await self._op("conversation.append", c.AppendRequest, c.AppendResponse, fields)

    async def append_batch(self, **fields: Any) -> c.AppendBatchResponse:
        """`turns=[...]`, 1 to 500, one result each in order."""
        return await self._op("conversation.append", c.AppendRequest, c.AppendBatchResponse, fields)

    async def search(self, **fields: Any) -> q.SearchResponse:
        return await self._op("conversation.search", q.SearchRequest, q.SearchResponse, fields)

    async def create(self, **fields: Any) -> c.CreateResponse:
        return await self._op("conversation.create", c.CreateRequest, c.CreateResponse, fields)

    async def update(self, **fields: Any) -> c.ThreadOut:
        return await self._op("conversation.update", c.UpdateRequest, c.ThreadOut, fields)

    async def threads(self, **fields: Any) -> c.ThreadsResponse:
        return await self._op("conversation.threads", c.ThreadsRequest, c.ThreadsResponse, fields)

    async def get(self, **fields: Any) -> c.GetResponse:
        return await self._op("conversation.get", c.GetRequest, c.GetResponse, fields)

    async def list(self, **fields: Any) -> c.ListResponse:
        return await self._op("conversation.list", c.ListRequest, c.ListResponse, fields)

    async def high_turns(self, **fields: Any) -> c.HighTurnsResponse:
        return await self._op("conversation.high_turns", c.HighTurnsRequest, c.HighTurnsResponse, fields)

    async def reembed(self, **fields: Any) -> c.ReembedResponse:
        return await self._op("conversation.reembed", c.ReembedRequest, c.ReembedResponse, fields)

    async def compact(self, **fields: Any) -> k.CompactResponse:
        return await self._op(
            "conversation.compact", k.CompactRequest, k.CompactResponse, fields, idempotent=False
        )

    async def compact_status(self, **fields: Any) -> k.CompactStatusResponse:
        return await self._op(
            "conversation.compact_status", k.CompactStatusRequest, k.CompactStatusResponse, fields
        )

    async def delete(self, **fields: Any) -> e.DeleteResponse:
        return await self._op("conversation.delete", e.DeleteRequest, e.DeleteResponse, fields)

    async def delete_message(self, **fields: Any) -> e.DeleteMessageResponse:
        """Remove one turn and every copy of it, with a receipt (idempotent)."""
        return await self._op(
            "conversation.delete_message", e.DeleteMessageRequest, e.DeleteMessageResponse, fields
        )

    async def redact(self, **fields: Any) -> e.RedactResponse:
        """Replace spans of one turn (`spans`, `ranges` or `high=True`) with a placeholder (admin)."""
        return await self._op("conversation.redact", e.RedactRequest, e.RedactResponse, fields)

    async def set_logging(self, **fields: Any) -> n.NamespaceConfigResponse:
        return await self._op(
            "conversation.set_logging", n.SetLoggingRequest, n.NamespaceConfigResponse, fields
        )


# What every replica of a deploy must declare before a save is taken (loom.replicas).
SAVED_STATE = "saved_state_preserved_in_compaction"


class Saved(_Group):
    async def available(self) -> bool:
        """Whether saving is open now: false while a replica of a rolling deploy could
        lose saved state (a save then answers 503 replica_lacks_capability). A client
        hides its "save" action while this is false."""
        shared = await self._op("replicas.show", d.ReplicasShowRequest, d.ReplicasShowResponse, {})
        return SAVED_STATE in shared.capabilities

    async def save(self, **fields: Any) -> s.SaveResponse:
        return await self._op("conversation.save_message", s.SaveRequest, s.SaveResponse, fields)

    async def unsave(self, **fields: Any) -> s.UnsaveResponse:
        return await self._op("conversation.unsave_message", s.UnsaveRequest, s.UnsaveResponse, fields)

    async def list(self, **fields: Any) -> s.ListSavedResponse:
        return await self._op(
            "conversation.list_saved_messages", s.ListSavedRequest, s.ListSavedResponse, fields
        )

    async def status(self, **fields: Any) -> s.SavedStatusResponse:
        return await self._op(
            "conversation.saved_status", s.SavedStatusRequest, s.SavedStatusResponse, fields
        )

    async def search(self, **fields: Any) -> s.SearchSavedResponse:
        return await self._op(
            "conversation.search_saved_messages", s.SearchSavedRequest, s.SearchSavedResponse, fields
        )


class Memory(_Group):
    async def set(self, **fields: Any) -> m.MemorySetResponse:
        return await self._op("memory.set", m.MemorySetRequest, m.MemorySetResponse, fields, idempotent=False)

    async def search(self, **fields: Any) -> m.MemorySearchResponse:
        return await self._op("memory.search", m.MemorySearchRequest, m.MemorySearchResponse, fields)

    async def list(self, **fields: Any) -> m.MemoryListResponse:
        return await self._op("memory.list", m.MemoryListRequest, m.MemoryListResponse, fields)

    async def delete(self, **fields: Any) -> m.MemoryDeleteResponse:
        return await self._op("memory.delete", m.MemoryDeleteRequest, m.MemoryDeleteResponse, fields)

    async def history(self, **fields: Any) -> m.MemoryHistoryResponse:
        """memory.history: one fact's chain of versions, oldest to newest."""
        return await self._op("memory.history", m.MemoryHistoryRequest, m.MemoryHistoryResponse, fields)

    async def profile(self, **fields: Any) -> m.MemoryProfileResponse:
        """memory.profile: the user's sectioned profile (rebuilt first when stale)."""
        return await self._op("memory.profile", m.MemoryProfileRequest, m.MemoryProfileResponse, fields)

    async def set_from_messages(self, **fields: Any) -> m.SetFromMessagesResponse:
        return await self._op(
            "memory.set_from_messages",
            m.SetFromMessagesRequest,
            m.SetFromMessagesResponse,
            fields,
            idempotent=False,
        )

    async def recall(self, **fields: Any) -> m.RecallResponse:
        return await self._op("memory.recall", m.RecallRequest, m.RecallResponse, fields)

    async def observe(self, **fields: Any) -> m.ObserveRecordResponse:
        """observe.record: idempotent when `obs_id` is given."""
        retry = "obs_id" in fields
        return await self._op(
            "observe.record", m.ObserveRecordRequest, m.ObserveRecordResponse, fields, idempotent=retry
        )

    async def crystallize(self, **fields: Any) -> m.SetFromMessagesResponse:
        return await self._op(
            "observe.crystallize",
            m.ObserveCrystallizeRequest,
            m.SetFromMessagesResponse,
            fields,
            idempotent=False,
        )

    async def context_pack(self, **fields: Any) -> m.ContextPackResponse:
        return await self._op("context.pack", m.ContextPackRequest, m.ContextPackResponse, fields)

    async def search_all(self, **fields: Any) -> m.UnifiedSearchResponse:
        """The unified `search`: the user's memory and recorded conversations in one answer
        (never briefs: a brief does not compete with facts in recall)."""
        return await self._op("search", m.UnifiedSearchRequest, m.UnifiedSearchResponse, fields)

    async def ask(self, **fields: Any) -> ma.MemoryAskResponse:
        """memory.ask: `question=...` about the user, answered with citations (or, with no
        model, the ranked context and a `reason`)."""
        return await self._op("memory.ask", ma.MemoryAskRequest, ma.MemoryAskResponse, fields)

    async def job_status(self, **fields: Any) -> ma.JobStatusResponse:
        """memory.job_status: `job_id=` of a deferred set_from_messages."""
        return await self._op("memory.job_status", ma.JobStatusRequest, ma.JobStatusResponse, fields)


class Briefs(_Group):
    async def save(self, **fields: Any) -> b.BriefSaveResponse:
        """session.brief_save; a retry of the same (session_id, event_cursor) writes nothing,
        so only such a save is retried on 503."""
        retry = bool(fields.get("event_cursor")) or "if_revision" in fields
        return await self._op(
            "session.brief_save", b.BriefSaveRequest, b.BriefSaveResponse, fields, idempotent=retry
        )

    async def get(self, **fields: Any) -> b.BriefGetResponse:
        return await self._op("session.brief_get", b.BriefGetRequest, b.BriefGetResponse, fields)

    async def list(self, **fields: Any) -> b.BriefListResponse:
        return await self._op("session.brief_list", b.BriefListRequest, b.BriefListResponse, fields)

    async def delete(self, **fields: Any) -> b.BriefDeleteResponse:
        return await self._op("session.brief_delete", b.BriefDeleteRequest, b.BriefDeleteResponse, fields)


class Namespace(_Group):
    async def get_config(self, **fields: Any) -> n.NamespaceConfigResponse:
        return await self._op("namespace.get_config", n.GetConfigRequest, n.NamespaceConfigResponse, fields)

    async def set_policy(self, **fields: Any) -> n.NamespaceConfigResponse:
        return await self._op("namespace.set_policy", n.SetPolicyRequest, n.NamespaceConfigResponse, fields)


class Erasure(_Group):
    async def request(self, **fields: Any) -> e.ErasureResponse:
        return await self._op("erasure.request", e.ErasureRequest, e.ErasureResponse, fields)

    async def status(self, **fields: Any) -> e.ErasureResponse:
        return await self._op("erasure.status", e.ErasureStatusRequest, e.ErasureResponse, fields)

    async def retention(self) -> e.RetentionShowResponse:
        return await self._op("retention.show", e.RetentionShowRequest, e.RetentionShowResponse, {})

    async def export(self, **fields: Any) -> AsyncIterator[dict[str, Any]]:
        """The user's rows as they stream (one dict per NDJSON line: a header, the rows,
        an `end` line), never held whole in memory."""
        body = request_body(self._agent, e.ExportRequest, fields)
        async for row in self._agent.transport.stream_lines("erasure.export", body):
            yield row


class Portability(_Group):
    async def import_start(self, **fields: Any) -> pt.ImportJobOut:
        return await self._op("import.start", pt.ImportStartRequest, pt.ImportJobOut, fields)

    async def import_write(self, **fields: Any) -> pt.ImportWriteResponse:
        """One batch (idempotent by its seq: retried on 503)."""
        return await self._op("import.write", pt.ImportWriteRequest, pt.ImportWriteResponse, fields)

    async def import_status(self, **fields: Any) -> pt.ImportStatusResponse:
        return await self._op("import.status", pt.ImportStatusRequest, pt.ImportStatusResponse, fields)

    async def export(self, **fields: Any) -> AsyncIterator[bytes]:
        """The export's bytes as they stream, compressed as asked (gzip by default)."""
        body = request_body(self._agent, pt.ExportStartRequest, fields)
        async for chunk in self._agent.transport.stream_bytes("export.start", body):
            yield chunk


class Ops(_Group):
    async def health(self) -> h.HealthShowResponse:
        """health.show (admin): the backends, the job queue, the embedding outcomes, the rates."""
        return await self._op("health.show", h.HealthShowRequest, h.HealthShowResponse, {})

    async def replicas(self) -> d.ReplicasShowResponse:
        """replicas.show: what every live replica shares (and, for an admin, the replicas)."""
        return await self._op("replicas.show", d.ReplicasShowRequest, d.ReplicasShowResponse, {})


class Settings(_Group):
    """The live settings (admin, a token not bound to one user)."""

    async def get(self) -> st.SettingsResponse:
        return await self._op("settings.get", st.SettingsGetRequest, st.SettingsResponse, {})

    async def set(self, **fields: Any) -> st.SettingsResponse:
        """`values={"LOOM_...": value or None}`; None clears the override."""
        return await self._op("settings.set", st.SettingsSetRequest, st.SettingsResponse, fields)


class Webhooks(_Group):
    """The namespace's signed webhooks (admin, a token not bound to one user)."""

    async def register(self, **fields: Any) -> w.WebhookRegisterResponse:
        """`url=`, optional `events=[...]`; the namespace's first registration answers its secret."""
        return await self._op(
            "webhook.register", w.WebhookRegisterRequest, w.WebhookRegisterResponse, fields, idempotent=False
        )

    async def list(self) -> w.WebhookListResponse:
        return await self._op("webhook.list", w.WebhookListRequest, w.WebhookListResponse, {})

    async def delete(self, **fields: Any) -> w.WebhookDeleteResponse:
        return await self._op("webhook.delete", w.WebhookDeleteRequest, w.WebhookDeleteResponse, fields)

    async def rotate_secret(self) -> w.WebhookRotateResponse:
        return await self._op(
            "webhook.rotate_secret", w.WebhookRotateRequest, w.WebhookRotateResponse, {}, idempotent=False
        )

    async def deliveries(self, **fields: Any) -> w.WebhookDeliveriesResponse:
        """The delivery log, newest attempt first (`webhook_id`, `event_id`, `limit`)."""
        return await self._op(
            "webhook.deliveries", w.WebhookDeliveriesRequest, w.WebhookDeliveriesResponse, fields
        )
