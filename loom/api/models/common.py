"""Fields and bases every request shares."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

Namespace = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^(@me|[A-Za-z0-9][A-Za-z0-9_.:-]{0,127})$",
                                 description="A namespace the token grants, or `@me` for a token bound to one user.")]
AgentId = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:@/-]{0,127}$",
                               description="The calling agent's identity inside the namespace.")]


class StrictModel(BaseModel):
    """Unknown fields are an error that names the field, never silently dropped."""

    model_config = ConfigDict(extra="forbid")


class NamespacedRequest(StrictModel):
    namespace: Namespace
