"""The one authorization table: complete for every served op, enforced by the one
dependency, rendered as docs/security.md; tokens' lifetimes."""

from __future__ import annotations

import re
import time
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi import APIRouter, FastAPI

from loom.api.app import ROUTERS, create_app, verify_policy
from loom.api.deps import Caller
from loom.auth import policy
from loom.auth import tokens as token_ops
from loom.errors import InvalidRequest

REPO = Path(__file__).resolve().parents[2]


def _app_with(extra: APIRouter) -> FastAPI:
    app = FastAPI()
    for router in [*ROUTERS, extra]:
        app.include_router(router)
    return app


def test_the_app_starts_with_every_op_in_the_table() -> None:
    paths = {p for p in create_app().openapi()["paths"] if p.startswith("/v1/")}
    assert {p.removeprefix("/v1/") for p in paths} == set(policy.POLICY)


def test_an_op_with_no_entry_is_not_served_and_the_error_names_it() -> None:
    extra = APIRouter(prefix="/v1")

    @extra.post("/brand.new")
    async def brand_new(who: Caller) -> dict[str, str]:
        return {}

    with pytest.raises(policy.PolicyError, match=r"'brand\.new' is served but has no entry"):
        verify_policy(_app_with(extra))


def test_a_route_without_the_dependency_is_not_served() -> None:
    extra = APIRouter(prefix="/v1")

    @extra.post("/conversation.get")
    async def unguarded() -> dict[str, str]:
        return {}

    app = FastAPI()
    for router in [extra, *ROUTERS]:
        app.include_router(router)
    with pytest.raises(policy.PolicyError, match="without the authorization dependency"):
        verify_policy(app)


def test_an_entry_no_route_serves_is_refused_too() -> None:
    served = [(op, True) for op in policy.POLICY if op != "memory.ask"]
    with pytest.raises(policy.PolicyError, match="memory.ask"):
        policy.verify_routes(served)


def test_no_route_checks_roles_or_scopes_by_hand() -> None:
    for path in (REPO / "loom" / "api" / "routes").glob("*.py"):
        text = path.read_text()
        for pattern in (r"\.bounded\b", r"read_scope", r"require_role", r"\brequire\(", r"Role\."):
            assert not re.search(pattern, text), f"{path.name} checks {pattern} itself: use loom.auth.policy"


def test_docs_security_is_rendered_from_the_table() -> None:
    committed = (REPO / "docs" / "security.md").read_text()
    assert committed == policy.render_markdown(), "regenerate: python -m loom.auth.policy > docs/security.md"


def test_a_lifetime_is_parsed_and_a_bad_one_named() -> None:
    assert token_ops.parse_lifetime("30d") == timedelta(days=30)
    assert token_ops.parse_lifetime("90m") == timedelta(minutes=90)
    for bad in ("0d", "30", "1w", "-1h", ""):
        with pytest.raises(InvalidRequest) as err:
            token_ops.parse_lifetime(bad)
        assert err.value.field == "expires_in"


async def test_an_expired_token_is_refused_even_from_the_cache(call, services, ns) -> None:
    minted = token_ops.mint(services.ch, [ns], "viewer", expires_in=timedelta(milliseconds=400))
    r = await call("namespace.get_config", minted.token, namespace=ns)
    assert r.status_code == 200  # verified, and now cached for a few seconds
    time.sleep(0.5)
    r = await call("namespace.get_config", minted.token, namespace=ns)
    assert r.status_code == 401 and "expired" in r.json()["message"]
