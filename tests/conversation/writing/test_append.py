"""conversation.append: recording switch, idempotency, batch form, embedding outcomes."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from loom.auth.principal import Principal, Role
from loom.ops.conversation import append
from loom.ops.conversation.common import derive_msg_id
from loom.providers.embedders import FakeEmbedder, SpyEmbedder
from tests.conversation.helpers import emb_row, emb_rows, turn, turn_rows

HIGH = "deploy with password=Tr0ub4dor&3xq tonight"


async def test_logging_off_keeps_nothing(call, mint, ns, recording, services):
    token = mint(ns, "writer")
    # No namespace row at all: recording is off (fails closed).
    r = await call("conversation.append", token, namespace=ns, thread_id="t", role="user", content="hi")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["stored"] is False and body["reason"] == "logging_disabled"
    assert body["embedding"] == "skipped:logging_disabled"
    # Switched off explicitly: the same, for the batch form too.
    recording(ns, False)
    r = await call(
        "conversation.append",
        token,
        namespace=ns,
        turns=[
            {"thread_id": "t", "role": "user", "content": "a"},
            {"thread_id": "t", "role": "tool", "content": "b"},
        ],
    )
    assert [x["reason"] for x in r.json()["results"]] == ["logging_disabled"] * 2
    assert r.json()["stored"] == 0
    # No client setting can override the owner's switch.
    r = await call(
        "conversation.append", token, namespace=ns, thread_id="t", role="user", content="hi", logging=True
    )
    assert r.status_code == 422
    assert turn_rows(services.ch, ns) == [] and emb_rows(services.ch, ns) == []
    # Turned on: the same turn is stored (the refused ones left no claim behind).
    recording(ns, True)
    r = await call("conversation.append", token, namespace=ns, thread_id="t", role="user", content="hi")
    assert r.json()["stored"] is True and r.json()["reason"] is None


async def test_user_turn_is_stored_and_embedded(call, ns, writer, services):
    content = "the staging cluster rebuild " * 120  # 3,360 characters
    r = await call(
        "conversation.append",
        writer,
        namespace=ns,
        thread_id="t1",
        role="user",
        content=content,
        msg_id="m1",
        reasoning="because friday",
        user_id="u1",
        run_id="r1",
        metadata={"source": "test"},
        tokens=42,
    )
    body = r.json()
    assert r.status_code == 200, r.text
    assert body == {
        "thread_id": "t1",
        "msg_id": "m1",
        "role": "user",
        "stored": True,
        "reason": None,
        "embedding": "embedded",
        "embedding_error": None,
        "namespace": ns,
        "agent": "default",
    }
    [row] = turn_rows(services.ch, ns)
    assert row["content"] == content and row["reasoning"] == "because friday"
    assert (row["user_id"], row["run_id"], row["tokens"], row["agent"]) == ("u1", "r1", 42, "default")
    assert row["metadata"] == '{"source":"test"}' and row["high_sensitivity"] is False
    emb = emb_row(services.ch, ns, "t1", "m1")
    assert emb is not None
    assert emb["text"] == content[:2048] and len(emb["text"]) == 2048
    fake = FakeEmbedder()
    assert emb["model"] == fake.model_id and emb["error"] == ""
    assert np.allclose(np.array(emb["embedding"], dtype=np.float32), fake.vector(content[:2048]), atol=1e-6)
    assert (emb["agent"], emb["role"], emb["run_id"], emb["user_id"]) == ("default", "user", "r1", "u1")
    # The first append created the thread.
    r = await call("conversation.get", writer, namespace=ns, thread_id="t1")
    assert r.status_code == 200 and r.json()["thread"]["turns"] == 1


async def test_system_and_tool_turns_are_never_embedded(call, ns, writer, services, worker_embedder):
    spy = worker_embedder(SpyEmbedder(FakeEmbedder()))
    for role in ("system", "tool"):
        r = await call(
            "conversation.append", writer, namespace=ns, thread_id="t", role=role, content=f"{role} says"
        )
        assert r.json()["stored"] is True and r.json()["embedding"] == "skipped:role"
    r = await call(
        "conversation.append", writer, namespace=ns, thread_id="t", role="assistant", content="   "
    )
    assert r.json()["stored"] is True and r.json()["embedding"] == "skipped:empty"
    assert len(turn_rows(services.ch, ns)) == 3
    assert emb_rows(services.ch, ns) == [] and spy.texts == []


async def test_duplicate_msg_id_per_agent(call, ns, writer, services):
    async def send(**kw):
        r = await call("conversation.append", writer, namespace=ns, thread_id="t", role="user", **kw)
        assert r.status_code == 200, r.text
        return r.json()

    assert (await send(content="first", msg_id="m"))["stored"] is True
    again = await send(content="first", msg_id="m")
    assert (
        again["stored"] is False
        and again["reason"] == "duplicate"
        and again["embedding"] == "skipped:duplicate"
    )
    changed = await send(content="other text, same id", msg_id="m")
    assert changed["reason"] == "duplicate"
    # Kept per (namespace, agent, thread): another agent's turn with that id lands.
    assert (await send(content="first", msg_id="m", agent="bot-2"))["stored"] is True
    rows = turn_rows(services.ch, ns)
    assert sorted((r["agent"], r["content"]) for r in rows) == [("bot-2", "first"), ("default", "first")]


async def test_derived_msg_id_and_shared_embedding(call, ns, writer, services, worker_embedder):
    spy = worker_embedder(SpyEmbedder(FakeEmbedder()))
    r1 = (
        await call(
            "conversation.append",
            writer,
            namespace=ns,
            thread_id="t",
            role="assistant",
            content="we moved invoices to the new ledger",
        )
    ).json()
    assert r1["msg_id"] == derive_msg_id("t", "assistant", "we moved invoices to the new ledger")
    assert r1["embedding"] == "embedded"
    # A client re-logging the same turn does not double the transcript.
    r2 = (
        await call(
            "conversation.append",
            writer,
            namespace=ns,
            thread_id="t",
            role="assistant",
            content="we moved invoices to the new ledger",
        )
    ).json()
    assert r2["reason"] == "duplicate" and r2["msg_id"] == r1["msg_id"]
    # Another role or thread is another turn.
    r3 = (
        await call(
            "conversation.append",
            writer,
            namespace=ns,
            thread_id="t",
            role="user",
            content="we moved invoices to the new ledger",
        )
    ).json()
    assert r3["stored"] is True and r3["msg_id"] != r1["msg_id"]
    calls_before = len(spy.calls)
    # A second agent logging the same turn gets the same id, and reuses the one embedding row.
    r4 = (
        await call(
            "conversation.append",
            writer,
            namespace=ns,
            agent="bot-2",
            thread_id="t",
            role="assistant",
            content="we moved invoices to the new ledger",
        )
    ).json()
    assert r4["stored"] is True and r4["msg_id"] == r1["msg_id"] and r4["embedding"] == "embedded"
    assert len(spy.calls) == calls_before  # no second model call
    rows = [e for e in emb_rows(services.ch, ns) if e["msg_id"] == r1["msg_id"]]
    assert len(rows) == 1 and rows[0]["agent"] == "default"  # one shared row
    assert len(turn_rows(services.ch, ns)) == 3


async def test_hundred_identical_appends_store_one_row(call, ns, writer, services, other_services, mint):
    body = dict(namespace=ns, thread_id="t", role="user", content="exactly once please")
    # Half through the API, half through a second "process" (its own append buffer).
    second = other_services()
    who = Principal("t", (ns,), Role.writer)
    api_calls = [call("conversation.append", writer, **body) for _ in range(50)]
    direct = [
        append(second, who, ns, "default", [turn("t", "user", "exactly once please")]) for _ in range(50)
    ]
    results = await asyncio.gather(*api_calls, *direct)
    from loom.ops.conversation import close_pipeline

    await close_pipeline(second)
    outcomes = [r.json() for r in results[:50]] + [r[0].__dict__ for r in results[50:]]
    assert sum(o["stored"] for o in outcomes) == 1
    assert sorted({o["reason"] for o in outcomes if not o["stored"]}) == ["duplicate"]
    assert len(turn_rows(services.ch, ns, final=False)) == 1  # not even an unmerged copy
    assert len(emb_rows(services.ch, ns)) == 1


async def test_batch_form(call, ns, writer, services):
    turns = [
        {"thread_id": "b", "role": "user", "content": "batch one", "msg_id": "1"},
        {"thread_id": "b", "role": "assistant", "content": "batch two", "msg_id": "2", "run_id": "r"},
        {"thread_id": "b", "role": "user", "content": "batch one again", "msg_id": "1"},  # duplicate in-batch
        {"thread_id": "b", "role": "tool", "content": "tool output", "metadata": {"tool": "grep"}},
        {"thread_id": "b2", "role": "user", "content": HIGH},
    ]
    r = await call("conversation.append", writer, namespace=ns, turns=turns)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["stored"] == 4 and len(body["results"]) == 5
    res = body["results"]
    assert [x["stored"] for x in res] == [True, True, False, True, True]
    assert res[2]["reason"] == "duplicate"
    assert [x["embedding"] for x in res] == [
        "embedded",
        "embedded",
        "skipped:duplicate",
        "skipped:role",
        "skipped:high_sensitivity",
    ]
    assert [x["thread_id"] for x in res] == ["b", "b", "b", "b", "b2"]
    # The batch keeps its order in the thread.
    r = await call("conversation.list", writer, namespace=ns, thread_id="b")
    assert [m["content"] for m in r.json()["messages"]] == ["batch one", "batch two", "tool output"]
    # Same rules on a re-sent batch: all duplicates.
    r = await call("conversation.append", writer, namespace=ns, turns=turns)
    assert r.json()["stored"] == 0
    assert {x["reason"] for x in r.json()["results"]} == {"duplicate"}


async def test_batch_request_shape_is_validated(call, ns, writer):
    one = {"thread_id": "t", "role": "user", "content": "x"}
    cases: list[dict[str, Any]] = [
        dict(turns=[one], thread_id="t"),  # both forms
        dict(turns=[one], content="x"),
        dict(),  # neither
        dict(thread_id="t", role="user"),  # single turn without content
        dict(turns=[]),  # empty batch
        dict(turns=[one] * 501),  # over 500
        dict(turns=[{**one, "role": "robot"}]),  # bad role
        dict(thread_id="t", role="user", content="x", bogus=1),
    ]
    for body in cases:
        r = await call("conversation.append", writer, namespace=ns, **body)
        assert r.status_code == 422, (body.keys(), r.text)
        assert r.json()["error"] == "invalid_request"
    r = await call("conversation.append", writer, namespace=ns, turns=[one] * 500)
    assert r.status_code == 200 and len(r.json()["results"]) == 500


async def test_failed_insert_releases_claims_and_a_retry_stores(call, ns, writer, services, monkeypatch):
    from loom.store import conversations as conv_store

    real = conv_store.insert

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(conv_store, "insert", broken)
    r = await call(
        "conversation.append", writer, namespace=ns, thread_id="t", role="tool", content="retry me"
    )
    assert r.status_code == 503 and r.json()["error"] == "unavailable"
    monkeypatch.setattr(conv_store, "insert", real)
    # The claim was released: the retry is not taken for a duplicate.
    r = await call(
        "conversation.append", writer, namespace=ns, thread_id="t", role="tool", content="retry me"
    )
    assert r.status_code == 200 and r.json()["stored"] is True
    assert len(turn_rows(services.ch, ns)) == 1


async def test_a_retried_insert_cannot_double_rows(call, ns, writer, services, monkeypatch):
    """The insert lands but its answer is lost (a connection error): the flush retries
    it with the same insert_deduplication_token, and the engine keeps one copy."""
    from clickhouse_connect.driver.exceptions import OperationalError

    from loom.store import conversations as conv_store

    real = conv_store.insert
    attempts = []

    def flaky(*args, **kwargs):
        attempts.append(kwargs.get("dedup_token"))
        real(*args, **kwargs)
        if len(attempts) == 1:
            raise OperationalError("connection reset after the insert")

    monkeypatch.setattr(conv_store, "insert", flaky)
    r = await call(
        "conversation.append",
        writer,
        namespace=ns,
        turns=[{"thread_id": "t", "role": "tool", "content": f"row {i}"} for i in range(3)],
    )
    assert r.status_code == 200 and r.json()["stored"] == 3
    assert len(attempts) == 2 and attempts[0] == attempts[1] and attempts[0]
    assert len(turn_rows(services.ch, ns, final=False)) == 3  # no unmerged second copy either


@pytest.mark.parametrize("read", ["recording", "landed"])
async def test_failed_read_releases_claims(call, ns, writer, services, monkeypatch, read):
    """The switch read fails, or (a re-log: the notes cannot rule it out) the ClickHouse
    existence read: nothing is kept and the retry stores the turn."""
    from loom.store import conversations as conv_store
    from loom.store import namespaces as ns_store

    turn = {"thread_id": "t", "role": "tool", "content": "again"}
    module = ns_store if read == "recording" else conv_store
    real = getattr(module, read)
    if read == "landed":  # noted by a first attempt that failed at its insert
        from loom.store import landed

        await landed.note(services.redis, [(ns, "default", "t", derive_msg_id("t", "tool", "again"))])
    monkeypatch.setattr(module, read, lambda *a, **k: (_ for _ in ()).throw(RuntimeError("timeout")))
    r = await call("conversation.append", writer, namespace=ns, **turn)
    assert r.status_code == 503
    monkeypatch.setattr(module, read, real)
    r = await call("conversation.append", writer, namespace=ns, **turn)
    assert r.json()["stored"] is True
