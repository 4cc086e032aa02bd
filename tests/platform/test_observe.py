"""Per-request observation (loom/api/observe.py): the request id and the metrics."""

from __future__ import annotations

from prometheus_client import REGISTRY


def _count(route: str, status: str) -> float:
    return REGISTRY.get_sample_value("loom_requests_total", {"route": route, "status": status}) or 0.0


def _observed(route: str) -> float:
    return REGISTRY.get_sample_value("loom_request_seconds_count", {"route": route}) or 0.0


async def test_request_id_is_echoed_or_made(api, mint, ns):
    token = mint(ns, "admin")
    headers = {"Authorization": f"Bearer {token}"}
    body = {"namespace": ns, "enabled": True}
    r = await api.post(
        "/v1/conversation.set_logging", json=body, headers={**headers, "x-request-id": "req-42"}
    )
    assert r.status_code == 200 and r.headers["x-request-id"] == "req-42"
    first = (await api.post("/v1/conversation.set_logging", json=body, headers=headers)).headers[
        "x-request-id"
    ]
    second = (await api.post("/v1/conversation.set_logging", json=body, headers=headers)).headers[
        "x-request-id"
    ]
    assert first and second and first != second
    assert (await api.get("/healthz")).headers["x-request-id"]  # every route, not only /v1


async def test_v1_requests_are_counted_and_timed_per_route_and_status(api, mint, ns):
    route = "/v1/conversation.set_logging"
    ok, refused, timed = _count(route, "200"), _count(route, "401"), _observed(route)
    token = mint(ns, "admin")
    assert (
        await api.post(
            route, json={"namespace": ns, "enabled": True}, headers={"Authorization": f"Bearer {token}"}
        )
    ).status_code == 200
    assert (await api.post(route, json={"namespace": ns, "enabled": True})).status_code == 401
    assert _count(route, "200") == ok + 1 and _count(route, "401") == refused + 1
    assert _observed(route) == timed + 2
    healthz = _count("/healthz", "200")
    await api.get("/healthz")
    assert _count("/healthz", "200") == healthz == 0.0  # only /v1 routes are counted
