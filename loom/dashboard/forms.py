"""The fields the dashboard's forms post, with the limits FastAPI checks them against
(one definition for every page that posts them)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Form

Namespace = Annotated[str, Form()]
Name = Annotated[str, Form(max_length=256)]  # an id or a name: agent, thread, message, user
Text = Annotated[str, Form(max_length=100_000)]  # a message's text, or a span of it
