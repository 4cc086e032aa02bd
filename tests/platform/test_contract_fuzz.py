"""The OpenAPI contract, fuzzed: schemathesis generates valid and invalid bodies for
every operation the API documents and sends them to a real API (uvicorn, on the suite's
ClickHouse endpoint and Redis, the session's arq worker embedding) with an admin token.

Zero server errors (any 5xx except the ops' own `unavailable` 503, which says "retry"),
and every answer conforms to the document: a documented status, its content type, its
body schema and its headers. The number of examples per operation is bounded so the
run stays well under two minutes.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from loom.settings import Settings
from tests.platform.served import serve

EXAMPLES = {GenerationMode.POSITIVE: 10, GenerationMode.NEGATIVE: 5}
CHECKS = [
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]


def _fuzz(base_url: str, token: str, ns: str) -> tuple[int, list[str]]:
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    headers = {"Authorization": f"Bearer {token}"}
    failures: list[str] = []
    sent = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode, examples in EXAMPLES.items():
            try:
                sent += _fuzz_one(operation, mode, examples, base_url, headers, ns, failures)
            except Unsatisfiable:  # nothing to negate (an operation without a body)
                continue
    return sent, failures


def _fuzz_one(
    operation: Any,
    mode: GenerationMode,
    examples: int,
    base_url: str,
    headers: dict[str, str],
    ns: str,
    failures: list[str],
) -> int:
    sent = 0

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        nonlocal sent
        if isinstance(case.body, dict) and "namespace" in case.body:
            case.body["namespace"] = ns  # the token's namespace: reach the ops, not only the 403
        response = case.call(base_url=base_url, headers=headers, timeout=60)
        sent += 1
        where = f"{case.method} {case.path} [{mode.value}] {str(case.body)[:200]!r}"
        if response.status_code >= 500 and not (
            response.status_code == 503 and response.json().get("error") == "unavailable"
        ):
            failures.append(f"{where}: {response.status_code} {response.text[:300]}")
            return
        try:
            case.validate_response(response, checks=CHECKS, headers=headers)
        except (Exception, FailureGroup) as exc:  # schema violations: collected, reported together
            failures.append(f"{where}: {type(exc).__name__}: {str(exc)[:500]}")

    run()
    return sent


async def _clear_live_settings(svc: Any) -> None:
    """settings.set was fuzzed with valid values too: the overrides it stored would reach
    every later test's processes (their followers), so they are cleared here."""
    from loom.auth.principal import Principal, Role
    from loom.ops.platform import live_settings
    from loom.ops.platform import settings as settings_ops

    admin = Principal("contract-fuzz", ("-",), Role.admin)
    await settings_ops.update(
        svc, admin, {live_settings.env_name(f): None for f in live_settings.LIVE_SETTINGS}
    )


@pytest.mark.timeout(240)
async def test_the_openapi_contract_holds_under_fuzzing(
    schema: Settings, arq_worker: Any, mint: Any, ns: str
):
    token = mint(ns, "admin")
    try:
        with serve(schema) as base_url:
            # In a thread: the session loop keeps running the arq worker that embeds appends.
            sent, failures = await asyncio.to_thread(_fuzz, base_url, token, ns)
    finally:
        await _clear_live_settings(arq_worker.ctx["loom"])
    assert sent >= 200, sent
    assert failures == [], "\n".join(failures[:20])
