"""The stand-in server itself: routes, scripting order, recording."""

from __future__ import annotations

import contextlib

import httpx

from tests.providers.standin import Reply, StandInServer, embedding_for


def test_good_answers_and_recording(standin: StandInServer) -> None:
    r = httpx.post(f"{standin.url}/v1/embeddings", json={"model": "m", "input": ["a", "b"]})
    assert r.status_code == 200
    data = r.json()["data"]
    assert [d["index"] for d in data] == [0, 1]
    assert data[1]["embedding"] == embedding_for("b")
    r = httpx.post(
        f"{standin.url}/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        headers={"Authorization": "Bearer k"},
    )
    assert r.json()["choices"][0]["message"]["content"] == "stand-in reply to: hi"
    assert [q.path for q in standin.requests] == [standin.EMBEDDINGS, standin.CHAT]
    assert standin.requests_to(standin.CHAT)[0].bearer == "k"
    assert httpx.post(f"{standin.url}/v1/nope", json={}).status_code == 404


def test_queue_then_handler_then_default(standin: StandInServer) -> None:
    standin.enqueue(standin.CHAT, Reply.error(500, "first"), lambda req: standin.chat_ok("second"))
    standin.set_handler(standin.CHAT, Reply.error(401, "third"))
    body = {"model": "m", "messages": []}
    url = f"{standin.url}/v1/chat/completions"
    with httpx.Client() as c:
        assert c.post(url, json=body).json()["error"]["message"] == "first"
        assert c.post(url, json=body).json()["choices"][0]["message"]["content"] == "second"
        assert c.post(url, json=body).status_code == 401
        assert c.post(url, json=body).status_code == 401
        standin.set_handler(standin.CHAT, None)
        assert c.post(url, json=body).status_code == 200


def test_api_key_and_stop_during_delay() -> None:
    srv = StandInServer(api_key="secret").start()
    try:
        assert httpx.post(f"{srv.url}/v1/embeddings", json={"model": "m", "input": ["a"]}).status_code == 401
        ok = httpx.post(
            f"{srv.url}/v1/embeddings",
            json={"model": "m", "input": ["a"]},
            headers={"Authorization": "Bearer secret"},
        )
        assert ok.status_code == 200
        srv.enqueue(srv.EMBEDDINGS, Reply.json({}).delayed(30))
        with contextlib.suppress(httpx.TimeoutException):
            httpx.post(f"{srv.url}/v1/embeddings", json={}, timeout=0.2)
    finally:
        srv.stop()  # must not wait out the 30 s delay
