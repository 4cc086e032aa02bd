"""The fields the dashboard's forms post, with the limits FastAPI checks them against
(one definition for every page that posts them)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Form
from pydantic import BaseModel, Field

Namespace = Annotated[str, Form()]
Name = Annotated[str, Form(max_length=256)]  # an id or a name: agent, thread, message, user
Text = Annotated[str, Form(max_length=100_000)]  # a message's text, or a span of it


class MessageForm(BaseModel):
    """One message, as the Saved panel's forms name it (unsave posts this; save, more)."""

    ns: str
    conversation_id: str = Field(max_length=256)
    message_id: str = Field(max_length=256)
    agent: str = Field("default", max_length=256)
    user: str = Field("", max_length=256)


class SaveForm(MessageForm):
    """A save: content only for a message not in the transcript yet (the op's rule)."""

    content: str = Field("", max_length=100_000)
    role: str = Field("user", max_length=32)
