"""Error text: what answers and rows carry is a stable code and a fixed message, never a
driver's or a provider's own text (which named the internal URL and port and the
internal query's parameters: other namespaces' thread and message ids); logs carry the
redacted detail and never a turn's content."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import structlog

from loom import failures
from loom.providers.embedders import EmbedderError, FakeEmbedder
from loom.providers.embedders.base import Vectors
from loom.store.clickhouse import connect
from tests.conversation.helpers import emb_rows, ok
from tests.relay import Relay

UNAVAILABLE = "embedder_unavailable: the embedding provider could not embed the text"
BACKEND = "backend_unavailable: the store or the queue was unavailable"


@contextlib.contextmanager
def worker_endpoint_killed(arq_worker: Any) -> Iterator[Relay]:
    """The worker's ClickHouse client talks through a relay that is then killed."""
    wsvc = arq_worker.ctx["loom"]
    proxy = Relay(wsvc.settings.clickhouse_url)
    original = wsvc.ch
    wsvc.ch = connect(f"http://127.0.0.1:{proxy.port}", database=wsvc.settings.clickhouse_database)
    proxy.kill()
    try:
        yield proxy
    finally:
        wsvc.ch = original


class _Leaky:
    """An embedder whose failure text names another namespace's ids, an internal URL
    and port, and echoes the text it was sent (as some providers do)."""

    model_id = "leaky"
    dim = 384

    def __init__(self, secret: str) -> None:
        self.secret = secret

    def embed(self, texts: Sequence[str]) -> Vectors:
        raise EmbedderError(
            f"upstream http://10.9.8.7:6543/v1/embeddings?{self.secret} failed: HTTP 400 Bad "
            f"Request: cannot embed {texts!r} for {self.secret}"
        )


def _ids(ns: str) -> list[str]:
    return [ns, f"thread-{ns}", f"msg-{ns}"]


async def _append_both(call: Any, tokens: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Both namespaces append at once (their turns share a flush and a job)."""

    async def one(ns: str) -> dict[str, Any]:
        return await ok(
            call,
            "conversation.append",
            tokens[ns],
            namespace=ns,
            thread_id=f"thread-{ns}",
            role="user",
            content=f"private words of {ns}",
            msg_id=f"msg-{ns}",
        )

    names = list(tokens)
    answers = await asyncio.gather(*(one(ns) for ns in names))
    return dict(zip(names, answers, strict=True))


def _assert_clean(ns: str, other: str, texts: Sequence[str], forbidden: Sequence[str]) -> None:
    for text in texts:
        for bad in [*_ids(other), *forbidden]:
            assert bad not in text, (ns, bad, text)


@contextlib.contextmanager
def _two_namespaces(mint: Any, recording: Any) -> Iterator[dict[str, str]]:
    import secrets

    names = [f"ta{secrets.token_hex(5)}", f"tb{secrets.token_hex(5)}"]
    for n in names:
        recording(n, True)
    yield {n: mint(n, "writer") for n in names}


async def test_a_dead_endpoint_leaks_nothing_across_namespaces(call, mint, recording, services, arq_worker):
    with _two_namespaces(mint, recording) as tokens:
        a, b = tokens
        with structlog.testing.capture_logs() as logs, worker_endpoint_killed(arq_worker) as proxy:
            answers = await _append_both(call, tokens)
        port = str(proxy.port)
        for ns, other in ((a, b), (b, a)):
            body = answers[ns]
            assert body["stored"] is True and body["embedding"] == "failed"
            assert body["embedding_error"] == BACKEND
            rows = emb_rows(services.ch, ns)
            assert [r["error"] for r in rows] == [BACKEND]
            _assert_clean(
                ns,
                other,
                [json.dumps(body), json.dumps([r["error"] for r in rows])],
                [port, "127.0.0.1", "http", "param_", "Error"],
            )
        # The detail went to the server's log, without the query's parameters.
        failed = [e for e in logs if e["event"] == "embed_turns failed"]
        assert failed and port in failed[0]["error"] and "OperationalError" in failed[0]["error"]
        for e in failed:
            _assert_clean(a, b, [e["error"]], ["param_"])
            _assert_clean(b, a, [e["error"]], [])


async def test_a_provider_error_text_is_never_passed_on(
    call, mint, recording, services, worker_embedder, api_embedder
):
    with _two_namespaces(mint, recording) as tokens:
        a, b = tokens
        secret = f"ns={b}&msg=msg-{b}"
        worker_embedder(_Leaky(secret))
        answers = await _append_both(call, tokens)
        for ns, other in ((a, b), (b, a)):
            assert answers[ns]["embedding_error"] == UNAVAILABLE
            assert [r["error"] for r in emb_rows(services.ch, ns)] == [UNAVAILABLE]
            _assert_clean(ns, other, [json.dumps(answers[ns])], ["10.9.8.7", "6543", "private words"])
        # The API's own embedder: a saved message records the code; search falls back.
        api_embedder(_Leaky(secret))
        saved = await ok(
            call,
            "conversation.save_message",
            tokens[a],
            namespace=a,
            user_id="alice",
            conversation_id="c",
            message_id="s",
            role="user",
            content="a message to keep",
        )
        assert saved["reason"] == "embed_failed"
        row = next(r for r in emb_rows(services.ch, a) if r["msg_id"] == "s")
        assert row["error"] == UNAVAILABLE
        search = await call("conversation.search", mint(a, "viewer"), query="private words")
        assert search.status_code == 200 and search.json()["fallback_reason"] == "embedder_error"
        _assert_clean(a, b, [search.text], ["10.9.8.7", "6543"])


async def test_stored_or_answered_text_is_a_known_code(services):
    """Whatever reaches a failure text's constructor, only fixed texts come out."""
    assert (
        failures.safe("OperationalError: Error HTTPConnectionPool(host='10.0.0.1', port=8123)")
        == "internal_error: the embedding could not be completed"
    )
    assert failures.safe(BACKEND) == BACKEND
    assert failures.embed_failure(TimeoutError("slow")) == "embedder_timeout: no embedding came back in time"
    assert failures.failure(ConnectionRefusedError("refused")) == BACKEND
    detail = failures.detail(
        RuntimeError(
            "url: /?query_id=1&param_ns=tb1&param_th=x (http://h:1/?param_m=y) "
            "HTTP 400 Bad Request: echo of the turn"
        )
    )
    assert "tb1" not in detail and "param_m=y" not in detail and "echo of the turn" not in detail
    assert detail.startswith("RuntimeError: url: /?… (http://h:1/?…) HTTP 400 Bad Request (body withheld)")
    # A provider that quotes (or merely repeats) what it was sent: withheld.
    sent = ["the quarterly numbers are in the blue folder"]
    assert "quarterly" not in failures.detail(ValueError("cannot embed 'the quarterly numbers'"), sent=sent)
    assert "quarterly" not in failures.detail(ValueError("bad input: quarterly numbers are in"), sent=sent)
    assert (
        failures.detail(ValueError("rate limited, retry in 3 s"), sent=sent)
        == "ValueError: rate limited, retry in 3 s"
    )


async def test_no_turn_content_reaches_a_log_line(
    call, ns, writer, mint, services, worker_embedder, api_embedder, caplog
):
    """Appends (embedded and failing), a re-embed through the worker, a search and a save
    whose embedder fails: neither the worker's job log nor any log event carries text."""
    contents = [f"zebra-{i} confidential paragraph" for i in range(3)]
    caplog.set_level(logging.INFO)
    with structlog.testing.capture_logs() as logs:
        for i, text in enumerate(contents[:2]):
            await ok(
                call,
                "conversation.append",
                writer,
                namespace=ns,
                thread_id="t",
                role="user",
                content=text,
                msg_id=f"m{i}",
            )
        worker_embedder(FakeEmbedder(fail_on=lambda t: "zebra-2" in t))
        failed = await ok(
            call,
            "conversation.append",
            writer,
            namespace=ns,
            thread_id="t",
            role="user",
            content=contents[2],
            msg_id="m2",
        )
        assert failed["embedding"] == "failed"
        worker_embedder(FakeEmbedder())
        await ok(call, "conversation.reembed", mint(ns, "admin"), namespace=ns)
        api_embedder(_Leaky("x"))
        await ok(call, "conversation.search", mint(ns, "viewer"), query="zebra-0 confidential paragraph")
        await ok(
            call,
            "conversation.save_message",
            writer,
            namespace=ns,
            user_id="alice",
            conversation_id="t",
            message_id="m0",
        )
    lines = [r.getMessage() for r in caplog.records] + [json.dumps(e, default=str) for e in logs]
    jobs = [
        r.getMessage() for r in caplog.records if r.name == "arq.worker" and "embed_turns" in r.getMessage()
    ]
    assert any("→" in line for line in jobs), "the worker's job log was not captured"
    assert any("reembed_rows" in r.getMessage() for r in caplog.records)
    for line in lines:
        for text in contents:
            for piece in (text, text[:12], "confidential"):
                assert piece not in line, line
