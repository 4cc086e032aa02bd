"""replicas.show's answer."""

from __future__ import annotations

from pydantic import AliasChoices, BaseModel, Field

from loom.models.common import RequestBody


class ReplicasShowRequest(RequestBody):
    pass


class ReplicaOut(BaseModel):
    replica_id: str
    kind: str
    build: str
    schema_version: int = Field(
        description="The newest migration the replica's build writes rows for.",
        validation_alias=AliasChoices("schema_version", "schema"),  # `schema` on the server's record
    )
    capabilities: list[str]
    host: str
    pid: int
    started_at: float = Field(description="Unix time.")
    seen_at: float = Field(description="Its last heartbeat (Unix time).")


class ReplicasShowResponse(BaseModel):
    capabilities: list[str] = Field(
        description="What every live replica declares, e.g. saved_state_preserved_in_compaction "
        "(saving is paused while a live replica lacks it)."
    )
    live: int = Field(description="Live replicas (API and worker processes with a recent heartbeat).")
    replicas: list[ReplicaOut] | None = Field(None, description="The replicas themselves (admins only).")
