"""conversation.compact against the stand-in chat server and the in-process worker
pool: the window rules, every reason, shared rows, defer, and races with append, save,
delete and another compaction."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from loom import redis_keys
from loom.clock import next_version
from loom.ops.conversation.lifecycle.compaction_gate import CompactionGate
from loom.providers.llm import OpenAICompatLLM
from loom.store import conversations as conv_store
from tests.conversation.conftest import SUMMARY
from tests.conversation.helpers import emb_rows, ok, save_turn, turn_rows
from tests.providers.standin import Reply, StandInServer
from workers.jobs import COMPACT_GATE

HIGH = "the prod login is password=Tr0ub4dor&3xq"


@pytest.fixture
def worker_settings(arq_worker: Any) -> Iterator[Any]:
    """set(**changes): the worker's settings for this test."""
    worker = arq_worker.ctx["loom"]
    before = worker.settings

    def _set(**changes: Any) -> None:
        worker.settings = before.model_copy(update=changes)

    yield _set
    worker.settings = before


def _text(i: int) -> str:
    return f"turn {i}: notes on the storage cluster plan, step {i} of the migration checklist"


async def _thread(
    call: Any,
    writer: str,
    ns: str,
    n: int,
    *,
    thread: str = "t",
    agent: str = "a",
    texts: dict[int, str] | None = None,
) -> list[str]:
    turns = [
        {
            "thread_id": thread,
            "role": "user" if i % 2 == 0 else "assistant",
            "content": (texts or {}).get(i, _text(i)),
        }
        for i in range(n)
    ]
    got = await ok(call, "conversation.append", writer, namespace=ns, agent=agent, turns=turns)
    assert all(r["stored"] for r in got["results"])
    return [r["msg_id"] for r in got["results"]]


async def _compact(call: Any, writer: str, ns: str, **kw: Any) -> dict[str, Any]:
    body = {"namespace": ns, "agent": "a", "thread_id": "t", **kw}
    return await ok(call, "conversation.compact", writer, **body)


def _turns(services: Any, ns: str, thread: str = "t", agent: str = "a") -> dict[str, dict[str, Any]]:
    return {
        r["msg_id"]: r for r in turn_rows(services.ch, ns) if r["thread_id"] == thread and r["agent"] == agent
    }


def _live(rows: dict[str, dict[str, Any]]) -> list[str]:
    return [m for m, r in rows.items() if not r["tombstoned"]]


def _prompt(standin: StandInServer, i: int = -1) -> str:
    return "\n".join(m["content"] for m in standin.requests_to(standin.CHAT)[i].json["messages"])


async def test_without_a_model_the_refusal_names_the_missing_provider(call, ns, writer):
    await _thread(call, writer, ns, 16)
    r = await call("conversation.compact", writer, namespace=ns, agent="a", thread_id="t")
    assert r.status_code == 409, r.text
    body = r.json()
    assert (
        body["error"] == "provider_not_configured"
        and "LLM" in body["message"]
        and "LOOM_LLM" in body["message"]
    )


async def test_a_namespace_whose_model_calls_are_off_is_refused(call, ns, writer, services, summarizer):
    from loom.store import namespaces

    await _thread(call, writer, ns, 16)
    namespaces.update(services.ch, ns, model_calls_enabled=False)
    r = await call("conversation.compact", writer, namespace=ns, agent="a", thread_id="t")
    assert r.status_code == 409 and r.json()["error"] == "model_calls_disabled"
    assert not summarizer.requests_to(summarizer.CHAT)


async def test_switching_model_calls_off_refuses_the_next_compaction_at_once(
    call, ns, writer, mint, services, summarizer
):
    """The op reads the switch from a cache (loom.store.namespace_cache); the policy op
    rewrites it, so a cached 'on' never outlives the change."""
    await _thread(call, writer, ns, 16)
    assert (await _compact(call, writer, ns))["messages_summarized"] == 6  # caches the row
    await ok(call, "namespace.set_policy", mint(ns, "admin"), namespace=ns, model_calls_enabled=False)
    await _thread(call, writer, ns, 16, thread="t2")
    r = await call("conversation.compact", writer, namespace=ns, agent="a", thread_id="t2")
    assert r.status_code == 409 and r.json()["error"] == "model_calls_disabled"


async def test_a_viewer_may_not_compact_and_bad_input_is_named(call, ns, writer, mint, summarizer):
    r = await call("conversation.compact", mint(ns, "viewer"), namespace=ns, agent="a", thread_id="t")
    assert r.status_code == 403
    r = await call("conversation.compact", writer, namespace=ns, agent="a", thread_id="t", keep_recent=-1)
    assert r.status_code == 422 and "keep_recent" in r.text


async def test_the_window_before_keep_recent_becomes_one_embedded_summary(
    call, ns, writer, services, summarizer
):
    ids = await _thread(call, writer, ns, 16)
    got = await _compact(call, writer, ns)
    assert got["messages_summarized"] == 6 and got["reason"] is None and got["summary_msg_id"]
    assert got["tokens_in"] > 0 and got["tokens_out"] > 0
    rows = _turns(services, ns)
    summary = rows[got["summary_msg_id"]]
    assert summary["role"] == "system" and summary["is_summary"] and summary["content"] == SUMMARY
    assert json.loads(summary["metadata"])["compacted_from"] == ids[:6]
    assert summary["ts"] == rows[ids[0]]["ts"]
    assert all(rows[m]["tombstoned"] and rows[m]["tombstone_reason"] == "compacted" for m in ids[:6])
    assert set(_live(rows)) == {*ids[6:], got["summary_msg_id"]}
    embs = {e["msg_id"]: e for e in emb_rows(services.ch, ns)}
    assert all(embs[m]["tombstoned"] for m in ids[:6])
    assert not embs[got["summary_msg_id"]]["tombstoned"] and embs[got["summary_msg_id"]]["is_summary"]
    # Only the window's turns were sent.
    prompt = _prompt(summarizer)
    assert all(_text(i) in prompt for i in range(6)) and all(_text(i) not in prompt for i in range(6, 16))
    hits = await ok(call, "conversation.search", writer, namespace=ns, namespace_scope="one", query=SUMMARY)
    found = [h["msg_id"] for h in hits["hits"]]
    assert got["summary_msg_id"] in found and not set(found) & set(ids[:6])
    listed = await ok(call, "conversation.list", writer, namespace=ns, agent="a", thread_id="t")
    assert [m["msg_id"] for m in listed["messages"]] == [got["summary_msg_id"], *ids[6:]]


async def test_fewer_than_min_to_compact_new_turns_are_left_alone(call, ns, writer, services, summarizer):
    ids = await _thread(call, writer, ns, 13)
    got = await _compact(call, writer, ns)
    assert got["reason"] == "below-min-to-compact" and got["messages_summarized"] == 0
    assert not summarizer.requests_to(summarizer.CHAT)
    assert set(_live(_turns(services, ns))) == set(ids)
    got = await _compact(call, writer, ns, keep_recent=5)
    assert got["messages_summarized"] == 8


async def test_high_and_saved_turns_stay_live_and_the_high_one_is_never_sent(
    call, ns, writer, services, summarizer
):
    ids = await _thread(call, writer, ns, 16, texts={2: HIGH})
    save_turn(services.ch, ns, "a", "t", ids[3])
    got = await _compact(call, writer, ns)
    assert got["messages_summarized"] == 4
    rows = _turns(services, ns)
    assert not rows[ids[2]]["tombstoned"] and not rows[ids[3]]["tombstoned"]
    assert json.loads(rows[got["summary_msg_id"]]["metadata"])["compacted_from"] == [
        ids[0],
        ids[1],
        ids[4],
        ids[5],
    ]
    prompt = _prompt(summarizer)
    assert HIGH not in prompt and _text(3) not in prompt


async def test_a_window_of_only_high_or_saved_turns_has_nothing_to_compact(
    call, ns, writer, services, summarizer
):
    ids = await _thread(call, writer, ns, 13, texts={0: HIGH, 1: HIGH + " again"})
    save_turn(services.ch, ns, "a", "t", ids[2])
    got = await _compact(call, writer, ns, min_to_compact=1)
    assert got["reason"] == "nothing-to-compact" and got["retry"] is False
    assert not summarizer.requests_to(summarizer.CHAT)


async def test_a_summary_that_cannot_be_embedded_compacts_nothing(
    call, ns, writer, services, summarizer, worker_embedder
):
    ids = await _thread(call, writer, ns, 16)

    class Broken:
        model_id, dim = "broken", 384

        def embed(self, texts):
            raise RuntimeError("the embedder is down")

    worker_embedder(Broken())
    got = await _compact(call, writer, ns)
    assert got["reason"] == "embed-failed" and got["retry"] is True and got["summary_msg_id"] is None
    rows = _turns(services, ns)
    assert set(_live(rows)) == set(ids) and not any(r["is_summary"] for r in rows.values())


async def test_a_summary_that_reads_as_high_is_refused_and_not_worth_a_retry(
    call, ns, writer, services, summarizer
):
    ids = await _thread(call, writer, ns, 16)
    summarizer.set_handler(summarizer.CHAT, lambda req: summarizer.chat_ok(f"they shared it: {HIGH}"))
    got = await _compact(call, writer, ns)
    assert got["reason"] == "summary-high-sensitivity" and got["retry"] is False
    assert "not worth a retry" in got["note"]
    rows = _turns(services, ns)
    assert set(_live(rows)) == set(ids)
    assert all(e["msg_id"] in ids for e in emb_rows(services.ch, ns))


@pytest.mark.parametrize("reply", [Reply.error(500, "boom"), Reply.malformed(), Reply.json({"choices": []})])
async def test_a_failing_summarizer_compacts_nothing(call, ns, writer, services, summarizer, reply):
    ids = await _thread(call, writer, ns, 16)
    summarizer.set_handler(summarizer.CHAT, reply)
    got = await _compact(call, writer, ns)
    assert got["reason"] == "summarizer-failed" and got["retry"] is True
    assert set(_live(_turns(services, ns))) == set(ids)


async def test_a_slow_summarizer_times_out_into_a_reason(call, ns, writer, services, summarizer, arq_worker):
    ids = await _thread(call, writer, ns, 16)
    worker = arq_worker.ctx["loom"]
    worker.llm = OpenAICompatLLM(base_url=summarizer.url, model="stand-in", timeout=0.3)
    summarizer.set_handler(summarizer.CHAT, lambda req: summarizer.chat_ok(SUMMARY).delayed(1.0))
    got = await _compact(call, writer, ns)
    assert got["reason"] == "summarizer-failed"
    assert set(_live(_turns(services, ns))) == set(ids)


async def test_an_earlier_summary_at_the_start_folds_in_and_is_replaced(
    call, ns, writer, services, summarizer
):
    ids = await _thread(call, writer, ns, 16)
    first = await _compact(call, writer, ns)
    more = await _thread(
        call, writer, ns, 6, texts={i: f"later turn {i} about the cutover" for i in range(6)}
    )
    summarizer.set_handler(summarizer.CHAT, lambda req: summarizer.chat_ok("second summary of the cutover"))
    got = await _compact(call, writer, ns)
    # The window: the first summary, then ids[6:12]; it does not count.
    assert got["messages_summarized"] == 6 and got["summaries_replaced"] == 1
    prompt = _prompt(summarizer)
    assert "Earlier summaries:\n" + SUMMARY in prompt
    rows = _turns(services, ns)
    assert rows[first["summary_msg_id"]]["tombstoned"]
    assert json.loads(rows[got["summary_msg_id"]]["metadata"])["compacted_from"] == [
        first["summary_msg_id"],
        *ids[6:12],
    ]
    assert set(_live(rows)) == {got["summary_msg_id"], *ids[12:], *more}


async def test_an_earlier_summary_beyond_the_allowance_stays_live(
    call, ns, writer, services, summarizer, worker_settings
):
    ids = await _thread(call, writer, ns, 16)
    first = await _compact(call, writer, ns)
    await _thread(call, writer, ns, 6, texts={i: f"later turn {i} about the cutover" for i in range(6)})
    worker_settings(compact_summary_allowance_chars=10)
    got = await _compact(call, writer, ns)
    assert got["messages_summarized"] == 6 and got["summaries_replaced"] == 0
    assert SUMMARY not in _prompt(summarizer)
    rows = _turns(services, ns)
    assert not rows[first["summary_msg_id"]]["tombstoned"]
    assert json.loads(rows[got["summary_msg_id"]]["metadata"])["compacted_from"] == ids[6:12]


def _summary_row(
    services: Any, ns: str, msg_id: str, ts: Any, content: str, compacted_from: list[str]
) -> None:
    conv_store.insert(
        services.ch,
        [
            conv_store.Turn(
                namespace=ns,
                agent="a",
                thread_id="t",
                msg_id=msg_id,
                ts=ts,
                role="system",
                content=content,
                metadata={"compacted_from": compacted_from},
                is_summary=True,
                version=next_version(),
            )
        ],
    )


async def test_a_failed_runs_summary_is_replaced_unread(call, ns, writer, services, summarizer):
    ids = await _thread(call, writer, ns, 16)
    rows = _turns(services, ns)
    # A run that wrote its summary and died before its tombstones.
    _summary_row(services, ns, "s_failed", rows[ids[0]]["ts"], "LEFT BY A FAILED RUN", ids[:4])
    got = await _compact(call, writer, ns)
    assert got["messages_summarized"] == 6 and got["summaries_replaced"] == 1
    assert "LEFT BY A FAILED RUN" not in _prompt(summarizer)
    rows = _turns(services, ns)
    assert rows["s_failed"]["tombstoned"]
    assert set(_live(rows)) == {got["summary_msg_id"], *ids[6:]}


async def test_a_summary_further_in_takes_budget_and_is_replaced(call, ns, writer, services, summarizer):
    ids = await _thread(call, writer, ns, 16)
    rows = _turns(services, ns)
    # A summary between the window's turns (its own turns long gone): sent like a turn.
    _summary_row(
        services, ns, "s_mid", rows[ids[3]]["ts"], "AN OLDER SUMMARY IN THE MIDDLE", ["gone1", "gone2"]
    )
    got = await _compact(call, writer, ns)
    # 17 live: the window is the 7 oldest (6 turns and the summary).
    assert got["messages_summarized"] == 6 and got["summaries_replaced"] == 1
    prompt = _prompt(summarizer)
    assert (
        "[system summary] AN OLDER SUMMARY IN THE MIDDLE" in prompt and "Earlier summaries:\n" not in prompt
    )
    assert _turns(services, ns)["s_mid"]["tombstoned"]


async def test_only_the_oldest_turns_that_fit_the_budget_are_summarised(
    call, ns, writer, services, summarizer, worker_settings
):
    long = {i: f"{i} " + "long text about the capacity plan " * 40 for i in range(8)}  # ~1,350 chars each
    ids = await _thread(call, writer, ns, 18, texts=long)
    worker_settings(compact_prompt_budget_chars=5_500)
    got = await _compact(call, writer, ns)
    assert got["messages_summarized"] == 4
    assert json.loads(_turns(services, ns)[got["summary_msg_id"]]["metadata"])["compacted_from"] == ids[:4]


async def test_a_turn_another_agent_holds_live_keeps_its_embedding(call, ns, writer, services, summarizer):
    ids = await _thread(call, writer, ns, 16)
    same = await _thread(call, writer, ns, 16, agent="b")
    assert same == ids  # derived msg_ids: the two agents share one embedding row per turn
    got = await _compact(call, writer, ns)
    assert got["messages_summarized"] == 6
    embs = {e["msg_id"]: e for e in emb_rows(services.ch, ns)}
    assert all(not embs[m]["tombstoned"] and embs[m]["agent"] == "b" for m in ids[:6])
    # The row passes on with its vector (the retirement reads the thread's rows without
    # theirs and reads again only those it hands over).
    dims = services.ch.query(
        "SELECT msg_id, length(embedding) AS dims FROM conversation_embeddings FINAL "
        "WHERE namespace = {ns:String} AND msg_id IN {ids:Array(String)}",
        parameters={"ns": ns, "ids": ids[:6]},
    ).named_results()
    assert sorted(r["msg_id"] for r in dims if r["dims"] > 0) == sorted(ids[:6])
    # b's search still finds its turn; a's rows of it are gone.
    assert all(not r["tombstoned"] for r in _turns(services, ns, agent="b").values())


async def test_the_retirement_reads_in_one_statement_what_the_three_reads_gave(
    call, ns, writer, services, summarizer
):
    from dataclasses import replace

    from loom.ops.conversation.common import EMBED_CHARS
    from loom.store import compaction as store
    from loom.store import deletion

    await _thread(call, writer, ns, 12)
    await _thread(call, writer, ns, 6, agent="b")
    ids = await _thread(call, writer, ns, 4, thread="other")
    got = await _compact(call, writer, ns, keep_recent=4)
    assert got["messages_summarized"] == 8
    now = store.thread_now(services.ch, ns, "t", EMBED_CHARS)
    assert now.copies == deletion.copies(services.ch, ns, "t", EMBED_CHARS)
    versions: dict[str, dict[str, int]] = {}
    for r in turn_rows(services.ch, ns):
        if r["thread_id"] == "t":
            versions.setdefault(r["msg_id"], {})[r["agent"]] = r["version"]
    assert {m: {a: c.version for a, c in by.items()} for m, by in now.copies.items()} == versions
    rows = deletion.thread_embeddings(services.ch, ns, "t", vectors=False)
    assert len(rows) == len(now.rows) > 0

    def key(r: Any) -> str:
        return str(r.msg_id)

    for mine, theirs in zip(sorted(now.rows, key=key), sorted(rows, key=key), strict=True):
        assert replace(mine, embedding=[]) == replace(theirs, embedding=[])
    assert all(r.msg_id not in ids for r in now.rows)


async def test_a_window_turn_rewritten_while_summarised_compacts_nothing(
    call, ns, writer, services, summarizer
):
    """A newer version of a window's turn, even one that reads the same (same text and
    flags), is a change: the retirement checks the version the window read."""
    from dataclasses import replace

    from loom.store import compaction as store

    ids = await _thread(call, writer, ns, 16)
    _slow(summarizer)
    sent = len(summarizer.requests_to(summarizer.CHAT))
    task = asyncio.create_task(_compact(call, writer, ns))
    while len(summarizer.requests_to(summarizer.CHAT)) == sent:  # the window is read
        await asyncio.sleep(0.01)
    turn = next(t for t in store.live_turns(services.ch, ns, "a", "t") if t.msg_id == ids[2])
    conv_store.insert(services.ch, [replace(turn, version=next_version())])
    got = await task
    assert got["reason"] == "window-changed" and got["retry"] is True
    assert set(_live(_turns(services, ns))) == set(ids)


class _CountingGate(CompactionGate):
    def __init__(self, concurrency: int) -> None:
        super().__init__(concurrency, pace=0.0)
        self.held = self.most = self.taken = 0

    async def __aenter__(self) -> None:
        await super().__aenter__()
        self.held += 1
        self.taken += 1
        self.most = max(self.most, self.held)

    async def __aexit__(self, *exc: Any) -> None:
        self.held -= 1
        await super().__aexit__(*exc)


async def test_the_gate_bounds_the_compactions_doing_store_work_at_once(
    call, ns, writer, services, summarizer, arq_worker
):
    for th in ("g1", "g2", "g3"):
        await _thread(call, writer, ns, 16, thread=th)
    # Where the worker keeps its one gate: every job (each with its own copy of arq's
    # ctx) must find this one.
    extras = arq_worker.ctx["loom"].extras
    gate = extras[COMPACT_GATE] = _CountingGate(1)
    try:
        got = await asyncio.gather(*(_compact(call, writer, ns, thread_id=th) for th in ("g1", "g2", "g3")))
    finally:
        extras.pop(COMPACT_GATE, None)
    assert all(g["messages_summarized"] == 6 for g in got)
    assert gate.taken == 6 and gate.most == 1  # the window read and the retirement of each


async def test_defer_answers_a_job_id_to_poll(call, ns, writer, services, summarizer, mint):
    await _thread(call, writer, ns, 16)
    got = await _compact(call, writer, ns, defer=True)
    assert got["job_id"] and got["summary_msg_id"] is None
    for _ in range(200):
        status = await ok(call, "conversation.compact_status", writer, namespace=ns, job_id=got["job_id"])
        if status["state"] == "complete":
            break
        await asyncio.sleep(0.05)
    assert status["state"] == "complete" and status["result"]["messages_summarized"] == 6
    # The worker pushed the answer for an awaiting API too (none pops it here).
    pushed = await services.redis.lrange(redis_keys.compact_done(got["job_id"]), 0, -1)
    assert [json.loads(m)["summary_msg_id"] for m in pushed] == [status["result"]["summary_msg_id"]]
    other = mint(f"{ns}x", "writer")
    r = await call("conversation.compact_status", other, namespace=f"{ns}x", job_id=got["job_id"])
    assert r.status_code == 404


def _slow(standin: StandInServer, seconds: float = 0.6) -> None:
    standin.set_handler(standin.CHAT, lambda req: standin.chat_ok(SUMMARY).delayed(seconds))


async def test_two_concurrent_compactions_one_wins_the_other_answers_a_reason(
    call, ns, writer, services, summarizer
):
    ids = await _thread(call, writer, ns, 16)
    _slow(summarizer, 0.3)
    a, b = await asyncio.gather(_compact(call, writer, ns), _compact(call, writer, ns))
    winners = [g for g in (a, b) if g["summary_msg_id"]]
    assert len(winners) == 1
    loser = b if winners[0] is a else a
    assert loser["reason"] in ("window-changed", "nothing-to-compact", "below-min-to-compact")
    rows = _turns(services, ns)
    assert set(_live(rows)) == {winners[0]["summary_msg_id"], *ids[6:]}
    assert sum(1 for r in rows.values() if r["is_summary"]) == 1


async def test_compact_racing_an_append_keeps_the_new_turn(call, ns, writer, services, summarizer):
    ids = await _thread(call, writer, ns, 16)
    _slow(summarizer)
    task = asyncio.create_task(_compact(call, writer, ns))
    await asyncio.sleep(0.2)
    new = await _thread(call, writer, ns, 2, texts={0: "appended meanwhile", 1: "and its answer"})
    got = await task
    assert got["messages_summarized"] == 6
    assert set(_live(_turns(services, ns))) == {got["summary_msg_id"], *ids[6:], *new}


async def test_compact_racing_a_save_compacts_nothing(call, ns, writer, services, summarizer):
    ids = await _thread(call, writer, ns, 16)
    _slow(summarizer)
    task = asyncio.create_task(_compact(call, writer, ns))
    await asyncio.sleep(0.2)
    await ok(
        call,
        "conversation.save_message",
        writer,
        namespace=ns,
        user_id="alice",
        conversation_id="t",
        message_id=ids[1],
        agent="a",
    )
    got = await task
    assert got["reason"] == "window-changed" and got["retry"] is True
    rows = _turns(services, ns)
    assert set(_live(rows)) == set(ids) and rows[ids[1]]["is_saved"]


async def test_compact_racing_a_delete_writes_no_summary(call, ns, writer, services, summarizer, mint):
    await _thread(call, writer, ns, 16)
    _slow(summarizer)
    task = asyncio.create_task(_compact(call, writer, ns))
    await asyncio.sleep(0.2)
    await ok(
        call,
        "conversation.delete",
        mint(ns, "admin"),
        namespace=ns,
        agent="a",
        thread_id="t",
        confirm_thread_id="t",
    )
    got = await task
    assert got["reason"] == "window-changed"
    rows = _turns(services, ns)
    assert not _live(rows) and not any(r["is_summary"] for r in rows.values())
    assert all(e["tombstoned"] for e in emb_rows(services.ch, ns))
