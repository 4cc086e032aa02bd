"""Requests and responses of settings.get and settings.set (the live settings)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from loom.models.common import RequestBody, Timestamp

# A JSON number or boolean of the setting's type, a string read as the environment
# would read it ("240", "true"), or null: clear the override.
SettingValue = StrictBool | StrictInt | StrictFloat | StrictStr | None
SettingName = Annotated[str, Field(min_length=1, max_length=128)]


class SettingsGetRequest(RequestBody):
    pass


class SettingsSetRequest(RequestBody):
    values: dict[SettingName, Annotated[SettingValue, Field(union_mode="left_to_right")]] = Field(
        max_length=64,
        description=(
            'Live settings by their LOOM_ name, e.g. {"LOOM_CONVERSATION_SEARCH_EXCERPT_CHARS": 400}; '
            "null clears the override (the environment's value applies again). Checked whole: one bad "
            "value and nothing is stored (422 naming `values.LOOM_...` and the rule)."
        ),
    )
    confirm_shorter_retention: bool = Field(
        False,
        description="Required (true) to shorten LOOM_RETENTION_CONVERSATIONS_DAYS: the older turns are deleted.",
    )


class SettingOut(BaseModel):
    name: str = Field(description="The LOOM_ name.")
    label: str = Field(description='What a person calls it, e.g. "Search: excerpt length".')
    value: bool | int | float | str = Field(description="The value in force.")
    default: bool | int | float | str = Field(description="What the environment (or Loom's default) gives.")
    source: Literal["default", "environment", "override"]
    type: Literal["float", "int", "bool", "str"]
    group: str = Field(description="Conversations, Retention and storage tiering, Context or Mcp.")
    min: float | None = None
    max: float | None = None
    description: str
    updated_at: Timestamp | None = Field(None, description="When the override was stored.")
    updated_by: str = Field("", description="The id of the token that stored the override.")


class ProcessOut(BaseModel):
    process: str = Field(description='"api:<host>:<pid>" or "worker:<host>:<pid>".')
    version: int = Field(description="The overrides' version it applied last.")
    overrides: dict[str, bool | int | float | str] = Field(description="The overrides it has in force.")


class ChangeOut(BaseModel):
    changed_at: Timestamp
    name: str = Field(description="The LOOM_ name.")
    old_value: bool | int | float | str | None = Field(description="The value in force before.")
    new_value: bool | int | float | str | None = Field(description="The value in force after.")
    changed_by: str = Field(description="The id of the token that changed it.")


class SettingsResponse(BaseModel):
    settings: list[SettingOut]
    version: int = Field(description="The overrides' current version (every settings.set moves it).")
    processes: list[ProcessOut] = Field(
        description="Each running API and worker process and the version it applied last: a change is "
        "in force everywhere once every process shows its version."
    )
    changes: list[ChangeOut] = Field(description="The audit trail: the latest changes, newest first.")
