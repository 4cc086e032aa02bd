"""Fields and bases every request shares."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from loom.errors import InvalidRequest
from loom.models.bounds import SURROGATE_RULE, lone_surrogate_at

Namespace = Annotated[
    str,
    Field(
        min_length=1,
        max_length=128,
        pattern=r"^(@me|[A-Za-z0-9][A-Za-z0-9_.:-]{0,127})$",
        description="A namespace the token grants, or `@me` for a token bound to one user.",
    ),
]
AgentId = Annotated[
    str,
    Field(
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:@/-]{0,127}$",
        description="The calling agent's identity inside the namespace.",
    ),
]
# A listing's page: at most 500 rows, from at most 100,000 rows in.
PageSize = Annotated[int, Field(ge=1, le=500)]
PageOffset = Annotated[int, Field(ge=0, le=100_000)]


def _with_zone(dt: datetime) -> datetime:
    # The store hands back naive UTC times; an answer always says its zone (RFC 3339).
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)


Timestamp = Annotated[
    datetime,
    AfterValidator(_with_zone),
    Field(description="RFC 3339, UTC, e.g. 2026-12-01T21:30:00.123456Z."),
]


class StrictModel(BaseModel):
    """Unknown fields are an error that names the field, never silently dropped."""

    model_config = ConfigDict(extra="forbid")


class RequestBody(StrictModel):
    """A request body: every string in it, at any depth, is valid Unicode."""

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        where = lone_surrogate_at(data)
        if where is not None:
            # Not a ValueError: pydantic lets it through, and the API answers it as the
            # 422 it is, naming the field.
            raise InvalidRequest(f"{where}: {SURROGATE_RULE}", field=where, rule="unicode")
        return data


class NamespacedRequest(RequestBody):
    namespace: Namespace
