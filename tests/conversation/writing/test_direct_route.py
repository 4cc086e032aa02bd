"""conversation.append is served by loom.api.direct.DirectRoute: every answer must be
the one FastAPI's own handler gives for the same declaration."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from loom.api import errors
from loom.api.direct import DirectRoute
from loom.api.gate import Gate
from loom.api.routes.conversation import reading as conversation
from loom.models.conversation.reading import AppendBatchResponse, AppendResponse

PATH = "/v1/conversation.append"


@pytest.fixture
async def reference(services: Any) -> AsyncIterator[httpx.AsyncClient]:
    """The same endpoint on FastAPI's standard route class (behind the same gate)."""
    app = FastAPI()
    errors.install(app)
    app.add_middleware(Gate)
    app.add_api_route(
        PATH, conversation.append, methods=["POST"], response_model=AppendResponse | AppendBatchResponse
    )
    app.state.services = services
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://ref.test"
    ) as client:
        yield client


def test_the_append_route_is_direct():
    route = next(r for r in conversation.router.routes if getattr(r, "path", "") == PATH)
    assert isinstance(route, DirectRoute)


async def test_answers_match_fastapis_own_handler(api, reference, ns, writer, mint):
    viewer = mint(ns, "viewer")
    good = json.dumps({"namespace": ns, "thread_id": "t", "role": "tool", "content": "x"})
    auth = {"Authorization": f"Bearer {writer}"}
    as_json = {"Content-Type": "application/json"}
    cases: list[tuple[str, dict[str, str], str | bytes]] = [
        ("malformed JSON", {**auth, **as_json}, "{not json"),
        ("malformed JSON, no token", as_json, "{not json"),
        ("no token", as_json, good),
        ("bad token", {"Authorization": "Bearer loom_0000000000000000_nope-nope-nope-nope", **as_json}, good),
        ("viewer", {"Authorization": f"Bearer {viewer}", **as_json}, good),
        ("other namespace", {**auth, **as_json}, good.replace(ns, "elsewhere")),
        ("no content type", auth, good),
        ("text/plain", {**auth, "Content-Type": "text/plain"}, good),
        ("empty body", {**auth, **as_json}, b""),
        ("a list", {**auth, **as_json}, "[1, 2]"),
        (
            "missing content",
            {**auth, **as_json},
            json.dumps({"namespace": ns, "thread_id": "t", "role": "user"}),
        ),
        ("unknown field", {**auth, **as_json}, json.dumps({"namespace": ns, "turns": [], "bogus": 1})),
        (
            "bad role, no token",
            as_json,
            json.dumps({"namespace": ns, "thread_id": "t", "role": "x", "content": "y"}),
        ),
    ]
    for name, headers, body in cases:
        got = await api.post(PATH, content=body, headers=headers)
        want = await reference.post(PATH, content=body, headers=headers)
        if got.status_code == want.status_code == 200:
            # JSON without a JSON content type is accepted: the second handler's turn is then
            # the first one's duplicate; the answers' shapes are what must match.
            assert set(got.json()) == set(want.json()) and want.json()["reason"] == "duplicate", name
            continue
        assert (got.status_code, got.json()) == (want.status_code, want.json()), name


async def test_a_stored_turn_answers_as_before(api, reference, ns, writer):
    headers = {"Authorization": f"Bearer {writer}"}
    got = await api.post(
        PATH, json={"namespace": ns, "thread_id": "t", "role": "tool", "content": "one"}, headers=headers
    )
    want = await reference.post(
        PATH, json={"namespace": ns, "thread_id": "t", "role": "tool", "content": "two"}, headers=headers
    )
    assert got.status_code == want.status_code == 200
    assert set(got.json()) == set(want.json()) and got.json()["stored"] is want.json()["stored"] is True
