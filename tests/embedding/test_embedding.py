"""The append's embedding: sensitivity, fail-open, removal and saving while it runs."""

from __future__ import annotations

import asyncio
import time

import numpy as np

from loom.auth.principal import Principal, Role
from loom.ops.conversation import append, close_pipeline, reembed
from loom.providers.embedders import FakeEmbedder, SpyEmbedder
from tests.conversation.conftest import wait_for
from tests.conversation.helpers import emb_row, emb_rows, save_turn, tombstone_turn, turn, turn_rows

HIGH_TEXTS = [
    "sure, the prod login is password=Tr0ub4dor&3xq",
    "charge my card 4111 1111 1111 1111 please",
    "use this key: sk-proj-4fJ9kQ2mZx8LwP1vN7bR3tY6uH0eD5sA",
    "my PIN is 4821",
]


async def test_high_text_never_reaches_the_embedder(call, ns, writer, mint, services, worker_embedder):
    spy = worker_embedder(SpyEmbedder(FakeEmbedder()))
    results = []
    for i, text in enumerate(HIGH_TEXTS[:2]):
        r = await call(
            "conversation.append",
            writer,
            namespace=ns,
            thread_id="t",
            role="user",
            content=text,
            msg_id=f"h{i}",
        )
        results.append(r.json())
    # The batch form, and a secret past the 2,048 characters that would be embedded.
    long_tail = "plain words " * 250 + HIGH_TEXTS[2]
    r = await call(
        "conversation.append",
        writer,
        namespace=ns,
        turns=[
            {"thread_id": "t", "role": "assistant", "content": HIGH_TEXTS[3], "msg_id": "h2"},
            {"thread_id": "t", "role": "user", "content": long_tail, "msg_id": "h3"},
            {"thread_id": "t", "role": "user", "content": "a plain turn", "msg_id": "p"},
        ],
    )
    results += r.json()["results"]
    assert [x["stored"] for x in results] == [True] * 5
    assert [x["embedding"] for x in results] == ["skipped:high_sensitivity"] * 4 + ["embedded"]
    rows = {row["msg_id"]: row for row in turn_rows(services.ch, ns)}
    assert all(rows[m]["high_sensitivity"] for m in ("h0", "h1", "h2", "h3"))
    assert rows["h3"]["content"] == long_tail  # stored as written
    assert [e["msg_id"] for e in emb_rows(services.ch, ns)] == ["p"]  # no embedding row for them
    # An admin re-embed over the namespace does not send them either.
    admin = Principal("t", (ns,), Role.admin)
    report = await reembed(services, admin, ns)
    assert report.reembedded == 1
    sent = spy.texts
    assert "a plain turn" in sent
    for text in HIGH_TEXTS:
        assert not any(text in s or s in text for s in sent), text
    assert not any("Tr0ub4dor" in s or "4111" in s or "sk-proj" in s or "4821" in s for s in sent)
    # get and list still serve the turns verbatim.
    r = await call("conversation.list", writer, namespace=ns, thread_id="t")
    assert [m["content"] for m in r.json()["messages"]][:2] == HIGH_TEXTS[:2]
    assert r.json()["messages"][0]["high_sensitivity"] is True


async def test_failing_embedder_fails_open(call, ns, writer, services, worker_embedder):
    failing = worker_embedder(FakeEmbedder(fail=True))
    r = await call(
        "conversation.append",
        writer,
        namespace=ns,
        thread_id="t",
        role="user",
        content="will fail",
        msg_id="m",
    )
    body = r.json()
    assert r.status_code == 200
    assert body["stored"] is True and body["embedding"] == "failed"
    # A stable code and a fixed message, never the provider's own text.
    assert body["embedding_error"] == "embedder_unavailable: the embedding provider could not embed the text"
    assert len(turn_rows(services.ch, ns)) == 1
    row = emb_row(services.ch, ns, "t", "m")
    assert row is not None and row["embedding"] == [] and row["error"] == body["embedding_error"]
    assert row["text"] == "will fail"
    # Nothing retries it on its own.
    calls = len(failing.calls)
    await asyncio.sleep(0.5)
    assert len(failing.calls) == calls == 1
    worker_embedder(FakeEmbedder())
    r = await call(
        "conversation.append",
        writer,
        namespace=ns,
        thread_id="t",
        role="user",
        content="will fail",
        msg_id="m",
    )
    assert r.json()["reason"] == "duplicate"
    assert emb_row(services.ch, ns, "t", "m")["error"] != ""


async def test_slow_embedder_past_the_wait_fails_open_and_the_late_vector_wins(
    ns, writer, services, other_services, worker_embedder
):
    slow = worker_embedder(FakeEmbedder(delay_seconds=1.2))
    svc = other_services(embed_wait_seconds=0.3)
    who = Principal("t", (ns,), Role.writer)
    started = time.monotonic()
    [res] = await append(svc, who, ns, "default", [turn("t", "user", "slow but sure", msg_id="m")])
    waited = time.monotonic() - started
    assert 0.3 <= waited < 1.0
    assert res.stored is True and res.embedding == "failed"
    assert res.embedding_error == "embedder_timeout: no embedding came back in time"
    row = emb_row(services.ch, ns, "t", "m")
    assert row is not None and row["embedding"] == [] and row["error"] == res.embedding_error
    assert len(turn_rows(services.ch, ns)) == 1
    # The worker finishes later: its vector lands over the API's error row (version order).

    async def landed() -> bool:
        r = emb_row(services.ch, ns, "t", "m")
        return r is not None and r["error"] == ""

    assert await wait_for(landed, timeout=5)
    row = emb_row(services.ch, ns, "t", "m")
    assert np.allclose(row["embedding"], FakeEmbedder().vector("slow but sure"), atol=1e-6)
    await asyncio.sleep(0.3)
    assert len(slow.calls) == 1  # never retried
    await close_pipeline(svc)


async def test_removed_while_embedding_answers_deleted(ns, writer, services, worker_embedder):
    worker_embedder(FakeEmbedder(delay_seconds=0.8))
    who = Principal("t", (ns,), Role.writer)
    task = asyncio.create_task(
        append(
            services,
            who,
            ns,
            "default",
            [
                turn("t", "user", "soon gone", msg_id="m"),
                turn("t", "user", "stays", msg_id="k"),
            ],
        )
    )

    async def landed() -> bool:
        return len(turn_rows(services.ch, ns)) == 2

    assert await wait_for(landed, timeout=5)
    assert not task.done()
    tombstone_turn(services.ch, ns, "default", "t", "m")  # delete/compaction, meanwhile
    gone, kept = await task
    assert gone.stored is False and gone.reason == "deleted" and gone.embedding == "skipped:deleted"
    assert kept.stored is True and kept.embedding == "embedded"
    assert [e["msg_id"] for e in emb_rows(services.ch, ns)] == ["k"]  # no late vector


async def test_saved_while_embedding_flags_the_embedding_row(ns, writer, services, worker_embedder):
    worker_embedder(FakeEmbedder(delay_seconds=0.6))
    who = Principal("t", (ns,), Role.writer)
    task = asyncio.create_task(
        append(services, who, ns, "default", [turn("t", "user", "keep me", msg_id="m")])
    )

    async def landed() -> bool:
        return len(turn_rows(services.ch, ns)) == 1

    assert await wait_for(landed, timeout=5)
    save_turn(services.ch, ns, "default", "t", "m")
    [res] = await task
    assert res.stored is True and res.embedding == "embedded"
    row = emb_row(services.ch, ns, "t", "m")
    assert row["is_saved"] is True and row["saved_at"] is not None


async def test_a_long_batch_is_embedded_in_parts(call, ns, writer, services, worker_embedder):
    spy = worker_embedder(SpyEmbedder(FakeEmbedder()))
    turns = [
        {
            "thread_id": "ingest",
            "role": "user" if i % 2 else "assistant",
            "content": f"ingested turn number {i}",
        }
        for i in range(300)
    ]  # more than one reply part (256)
    r = await call("conversation.append", writer, namespace=ns, turns=turns)
    assert r.status_code == 200, r.text
    assert r.json()["stored"] == 300
    assert {x["embedding"] for x in r.json()["results"]} == {"embedded"}
    assert len(emb_rows(services.ch, ns)) == 300
    assert sorted(spy.texts) == sorted(t["content"] for t in turns)
    assert max(len(c) for c in spy.calls) <= 8  # the worker's model calls stay small


# -- the insert gate: the model works while the rows are inserted ----------------------


async def test_the_model_starts_before_the_insert_but_no_vector_lands_before_the_row(
    ns, writer, services, worker_embedder, monkeypatch
):
    """The job is enqueued while the flush's insert runs; the worker writes the vector
    only after the flush opened the gate, so the embedding row never precedes its turn."""
    from loom.store import conversations as conv_store

    spy = worker_embedder(SpyEmbedder(FakeEmbedder()))
    real = conv_store.insert
    seen_by_model_before_insert: list[bool] = []

    def slow_insert(*args, **kwargs):
        time.sleep(0.5)  # the model call finishes meanwhile
        seen_by_model_before_insert.append("gated turn" in spy.texts)
        assert emb_rows(services.ch, ns) == []  # the vector waits for the gate
        real(*args, **kwargs)

    monkeypatch.setattr(conv_store, "insert", slow_insert)
    who = Principal("t", (ns,), Role.writer)
    [res] = await append(services, who, ns, "default", [turn("t", "user", "gated turn", msg_id="m")])
    assert res.stored and res.embedding == "embedded"
    assert seen_by_model_before_insert == [True]
    assert [e["msg_id"] for e in emb_rows(services.ch, ns)] == ["m"]


async def test_a_failed_insert_shuts_the_gate_and_no_vector_is_written(
    call, ns, writer, services, worker_embedder, monkeypatch
):
    from loom.store import conversations as conv_store

    worker_embedder(FakeEmbedder(delay_seconds=0.2))

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(conv_store, "insert", broken)
    r = await call(
        "conversation.append", writer, namespace=ns, thread_id="t", role="user", content="never kept"
    )
    assert r.status_code == 503
    await asyncio.sleep(0.6)  # the worker's model call is over by now
    assert emb_rows(services.ch, ns) == [] and turn_rows(services.ch, ns) == []


async def test_the_gate_answers_late_readers_and_gives_up_alone(services):
    from loom.ops.embedding.client import open_gate, wait_gate

    gate = f"g-{time.time_ns()}"
    waiting = asyncio.ensure_future(wait_gate(services.redis, gate, 5))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    await open_gate(services.redis, gate, durable=True)
    assert await asyncio.wait_for(waiting, 2) is True
    assert await wait_gate(services.redis, gate, 0.1) is True  # a retried job reads it too
    shut = f"s-{time.time_ns()}"
    await open_gate(services.redis, shut, durable=False)
    assert await wait_gate(services.redis, shut, 0.1) is False
    t0 = time.monotonic()
    assert await wait_gate(services.redis, f"never-{time.time_ns()}", 0.3) is False  # the API went away
    assert time.monotonic() - t0 < 2
