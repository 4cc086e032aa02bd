"""The embedding recovery pass: turns a crash left with no embedding row are embedded.

A crash between an append flush's insert and its embedding is played by writing
transcript rows directly, with no embedding row (the state such a crash leaves)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from loom import jobs
from loom.auth.principal import Principal, Role
from loom.clock import next_version, utcnow
from loom.jobs import EmbedTurn
from loom.leases import Lease
from loom.ops.conversation import append
from loom.ops.embedding.recovery import LEASE_KEY, RecoveryReport, recover
from loom.ops.embedding.writer import EmbedPipeline, model_from_embedder, write_deadline_ns
from loom.providers.embedders import FakeEmbedder, SpyEmbedder
from loom.sensitivity import reads_as_high
from loom.store import conversations as conv_store
from loom.store import embed_recovery
from loom.store import embeddings as emb_store
from tests.conversation.conftest import wait_for
from tests.conversation.helpers import emb_row, emb_rows, ok, save_turn, tombstone_turn, turn

HIGH = "the prod login is password=Tr0ub4dor&3xq"


def orphan(
    ch: Any,
    ns: str,
    msg_id: str,
    content: str,
    *,
    role: str = "user",
    thread_id: str = "t",
    agent: str = "default",
    user_id: str = "",
    created_ago_s: float = 0.0,
) -> None:
    """A transcript row as a flush inserts it, and nothing else: no embedding row. With
    `created_ago_s`, its server insert time lies that far back."""
    turn = conv_store.Turn(
        namespace=ns,
        agent=agent,
        thread_id=thread_id,
        msg_id=msg_id,
        ts=utcnow(),
        role=role,
        content=content,
        user_id=user_id,
        high_sensitivity=reads_as_high(content),
        version=next_version(),
    )
    if not created_ago_s:
        conv_store.insert(ch, [turn])
        return
    when = datetime.now(UTC) - timedelta(seconds=created_ago_s)
    ch.insert(
        "conversations",
        [[*turn.row(), when]],
        column_names=[*conv_store.COLUMNS, "created_at"],
        column_type_names=[*conv_store.COLUMN_TYPES, "DateTime64(3, 'UTC')"],
    )


def rewind(ch: Any, seconds: float = 0.0) -> None:
    """The pass is caught up to `seconds` ago (the server's clock): it goes on with the
    rows inserted since (this test's, not those earlier tests left)."""
    embed_recovery.save_position(
        ch, embed_recovery.Position(embed_recovery.horizon(ch, seconds)), next_version()
    )


async def run_pass(services: Any, embedder: Any, **kw: Any) -> RecoveryReport:
    kw.setdefault("grace_s", 0.0)
    report = await recover(services, model_from_embedder(lambda: embedder), **kw)
    assert report.ran
    return report


async def test_turns_left_without_an_embedding_row_are_embedded(call, ns, writer, services):
    ch = services.ch
    rewind(ch)
    orphan(ch, ns, "u", "the staging cluster rebuild")
    orphan(ch, ns, "a", "rebuilt it with the new disks", role="assistant")
    orphan(ch, ns, "s", "system prompt", role="system")
    orphan(ch, ns, "tool", "tool output", role="tool")
    orphan(ch, ns, "h", HIGH)
    orphan(ch, ns, "e", "   ")
    orphan(ch, ns, "gone", "a turn deleted since")
    tombstone_turn(ch, ns, "default", "t", "gone")
    orphan(ch, ns, "saved", "a saved message", user_id="u1")
    save_turn(ch, ns, "default", "t", "saved")
    # A failed embed has its error row: it is the record, and nothing retries it.
    orphan(ch, ns, "f", "an embed that failed")
    emb_store.insert(
        ch,
        [
            emb_store.EmbeddingRow(
                ns,
                "t",
                "f",
                "default",
                "user",
                "",
                "",
                utcnow(),
                "an embed that failed",
                [],
                "",
                "embedder_unavailable: x",
                version=next_version(),
            )
        ],
    )
    failed_before = emb_row(ch, ns, "t", "f")
    spy = SpyEmbedder(FakeEmbedder())

    report = await run_pass(services, spy)

    assert report.caught_up and report.embedded == 3 and report.failed == 0
    assert report.skipped_high == 1 and report.skipped_empty == 1 and report.skipped_deleted >= 1
    rows = {r["msg_id"]: r for r in emb_rows(ch, ns)}
    assert set(rows) == {"u", "a", "saved", "f"}
    for msg_id, text in (("u", "the staging cluster rebuild"), ("a", "rebuilt it with the new disks")):
        assert rows[msg_id]["text"] == text and rows[msg_id]["error"] == ""
        assert np.allclose(rows[msg_id]["embedding"], FakeEmbedder().vector(text), atol=1e-6)
    assert rows["a"]["role"] == "assistant" and rows["u"]["model"] == FakeEmbedder().model_id
    assert rows["saved"]["is_saved"] is True and rows["saved"]["user_id"] == "u1"
    assert rows["f"] == failed_before  # not retried
    sent = spy.texts
    assert sorted(sent) == sorted(
        ["the staging cluster rebuild", "rebuilt it with the new disks", "a saved message"]
    )
    assert not any("Tr0ub4dor" in s for s in sent)
    # Idempotent: a second pass finds nothing to do and calls nothing.
    again = await run_pass(services, spy)
    assert again.embedded == 0 and len(spy.texts) == len(sent)
    rewind(ch, 60)  # looked at again: found embedded, left alone
    again = await run_pass(services, spy)
    # (the minute rewound may hold other tests' rows: only this namespace's are checked)
    assert again.skipped_present >= 3 and not set(spy.texts[len(sent) :]) & set(sent)
    assert {r["msg_id"]: r for r in emb_rows(ch, ns)} == rows
    # The recovered turn is found by search, and a retried append is still a duplicate.
    hits = await ok(
        call,
        "conversation.search",
        writer,
        query="staging cluster rebuild",
        namespace_scope="one",
        namespace=ns,
    )
    assert hits["mode"] == "vector" and hits["hits"][0]["msg_id"] == "u"
    r = await ok(
        call,
        "conversation.append",
        writer,
        namespace=ns,
        thread_id="t",
        role="user",
        content="the staging cluster rebuild",
        msg_id="u",
    )
    assert r["reason"] == "duplicate"


async def test_turns_younger_than_the_grace_wait_for_a_later_pass(ns, services):
    ch = services.ch
    rewind(ch)
    orphan(ch, ns, "m", "still within its grace")
    first = await run_pass(services, FakeEmbedder(), grace_s=3600)
    assert first.embedded == 0 and emb_rows(ch, ns) == []
    # The position did not move past it: a later pass (its grace now over) embeds it.
    second = await run_pass(services, FakeEmbedder())
    assert second.embedded == 1 and [r["msg_id"] for r in emb_rows(ch, ns)] == ["m"]


async def test_the_default_grace_takes_turns_inserted_long_enough_ago(ns, services):
    ch = services.ch
    grace = services.settings.recovery_grace_seconds
    assert grace == max(
        services.settings.embed_recovery_grace_seconds, services.settings.embed_wait_seconds + 5
    )
    rewind(ch, grace + 60)
    orphan(ch, ns, "old", "inserted before the grace", created_ago_s=grace + 30)
    orphan(ch, ns, "new", "inserted just now")
    report = await recover(services, model_from_embedder(FakeEmbedder))
    assert report.ran and report.embedded >= 1
    assert [r["msg_id"] for r in emb_rows(ch, ns)] == ["old"]


async def test_a_pass_is_bounded_and_the_next_one_goes_on(ns, services):
    ch = services.ch
    rewind(ch)
    for i in range(7):
        orphan(ch, ns, f"m{i}", f"turn number {i}", thread_id=f"t{i % 3}")
    first = await run_pass(services, FakeEmbedder(), page=3, max_pages=2)
    assert first.scanned == 6 and not first.caught_up and first.embedded == 6
    second = await run_pass(services, FakeEmbedder(), page=3, max_pages=2)
    assert second.caught_up and second.embedded == 1
    assert len(emb_rows(ch, ns)) == 7


async def test_one_runner_at_a_time(ns, services):
    ch = services.ch
    rewind(ch)
    orphan(ch, ns, "m", "one runner embeds me")
    other = Lease(services.redis, LEASE_KEY, 10_000)
    assert await other.try_acquire()
    try:
        report = await recover(services, model_from_embedder(FakeEmbedder), grace_s=0)
        assert report.ran is False and emb_rows(ch, ns) == []
    finally:
        await other.release()
    # Two passes at once: one runs, the other stands aside.
    slow = FakeEmbedder(delay_seconds=0.5)
    both = await asyncio.gather(
        recover(services, model_from_embedder(lambda: slow), grace_s=0),
        recover(services, model_from_embedder(lambda: slow), grace_s=0),
    )
    assert sorted(r.ran for r in both) == [False, True] and sum(r.embedded for r in both) == 1
    assert len(emb_rows(ch, ns)) == 1
    assert await services.redis.get(LEASE_KEY) is None  # released


async def test_an_append_embedding_landing_meanwhile_is_kept(ns, writer, services, worker_embedder):
    """The pass looks a turn up, calls its model; the append's own vector lands during
    that call: under the thread lease the pass finds it and writes nothing."""
    ch = services.ch
    rewind(ch)
    worker_embedder(FakeEmbedder(delay_seconds=0.6))
    who = Principal("t", (ns,), Role.writer)
    appending = asyncio.create_task(
        append(services, who, ns, "default", [turn("t", "user", "racing", msg_id="m")])
    )

    async def inserted() -> bool:
        return bool(
            ch.query(
                "SELECT count() FROM conversations WHERE namespace = {ns:String}", parameters={"ns": ns}
            ).result_rows[0][0]
        )

    assert await wait_for(inserted, timeout=5)
    report = await run_pass(services, FakeEmbedder(seed=7, delay_seconds=1.5))
    [res] = await appending
    assert res.embedding == "embedded"
    assert report.embedded == 0 and report.skipped_present == 1
    # The pass's vector (another seed) would have won as the newer version.
    assert np.allclose(emb_row(ch, ns, "t", "m")["embedding"], FakeEmbedder().vector("racing"), atol=1e-6)


async def test_an_append_job_past_its_deadline_writes_nothing(ns, services, arq_worker):
    """The other order: the pass wrote first, then the append's job comes (past the
    grace, so the pass may have run): it leaves the row alone."""
    ch = services.ch
    settings = services.settings
    now = time.time_ns()
    deadline = write_deadline_ns(settings, now) - now
    assert deadline == int((settings.recovery_grace_seconds - 5.0) * 1e9)
    assert deadline >= settings.embed_wait_seconds * 1e9  # never cuts an append's own wait short
    rewind(ch)
    orphan(ch, ns, "m", "late job")
    await run_pass(services, FakeEmbedder())
    before = emb_row(ch, ns, "t", "m")
    from workers import embed_jobs

    turn = EmbedTurn(ns, "default", "t", "m", "user", "", "", utcnow(), "late job")
    stale = now - 2 * int(settings.recovery_grace_seconds * 1e9)
    payload = jobs.build(jobs.EmbedTurnsJob, turns=[turn], at=stale)
    result = await embed_jobs.embed_turns(arq_worker.ctx, payload)
    assert result["outcomes"] == [["failed", "embedder_timeout: no embedding came back in time"]]
    assert emb_row(ch, ns, "t", "m") == before  # not even a newer version
    # A job within its deadline writes as before.
    pipeline = EmbedPipeline(services, model_from_embedder(FakeEmbedder))
    try:
        [out] = await pipeline.embed_turns([turn], not_after_ns=time.time_ns() + 10**10)
    finally:
        await pipeline.close()
    assert out.status == "embedded" and emb_row(ch, ns, "t", "m")["version"] > before["version"]


async def test_a_model_failure_is_recorded_as_an_append_would(ns, services):
    ch = services.ch
    rewind(ch)
    orphan(ch, ns, "m", "the model is down")
    report = await run_pass(services, FakeEmbedder(fail=True))
    assert report.failed == 1
    row = emb_row(ch, ns, "t", "m")
    assert (
        row["embedding"] == []
        and row["error"] == "embedder_unavailable: the embedding provider could not embed the text"
    )
    # It is a failed embed now: the next pass does not retry it.
    rewind(ch)
    assert (await run_pass(services, FakeEmbedder())).embedded == 0
    assert emb_row(ch, ns, "t", "m")["error"] != ""


async def test_the_worker_runs_a_pass_at_start_up(ns, services):
    """A fresh worker process runs the pass as it starts (arq cron, run at start-up),
    with its settings' grace, then every LOOM_EMBED_RECOVERY_INTERVAL_SECONDS."""
    from workers.main import build_worker, cron_jobs, every

    ch = services.ch
    settings = services.settings
    job = next(j for j in cron_jobs(settings) if j.name == "recover_embeddings")
    assert job.run_at_startup and job.name == "recover_embeddings"
    assert every(60) == ({0}, set(range(60))) and every(15) == ({0, 15, 30, 45}, None)
    assert every(7) == ({0, 6, 12, 18, 24, 30, 36, 42, 48, 54}, None) and every(600)[1] == set(
        range(0, 60, 10)
    )
    grace = settings.recovery_grace_seconds
    rewind(ch, grace + 60)
    orphan(ch, ns, "m", "left by a crash", created_ago_s=grace + 30)
    # A queue of its own: the suite's worker (built without cron jobs) must not take the job.
    worker = build_worker(
        settings,
        settings.clickhouse_url,
        settings.redis_url,
        handle_signals=False,
        queue_name=f"loom:queue:{ns}",
    )
    task = asyncio.create_task(worker.async_run())
    try:

        async def embedded() -> bool:
            return emb_row(ch, ns, "t", "m") is not None

        assert await wait_for(embedded, timeout=20)
    finally:
        await worker.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert emb_row(ch, ns, "t", "m")["error"] == ""


async def test_the_first_pass_sweeps_what_the_table_held_then_goes_on_by_insert_time(services):
    """No position yet (a deployment whose turns predate the pass): the first pass
    sweeps the table in key order, over several passes if need be, then goes on in
    insert-time order from the horizon it started at. A database of its own."""
    import dataclasses

    from loom.store.clickhouse import connect
    from loom.store.schema import prepare

    settings = services.settings.model_copy(
        update={"clickhouse_database": f"{services.settings.clickhouse_database}_sweep"}
    )
    prepare(settings, settings.clickhouse_url)
    ch = connect(settings.clickhouse_url, database=settings.clickhouse_database)
    svc = dataclasses.replace(services, settings=settings, ch=ch, extras={})
    for i in range(5):
        orphan(ch, f"ns{i % 2}", f"m{i}", f"an old turn {i}", thread_id=f"t{i}")
    first = await run_pass(svc, FakeEmbedder(), page=2, max_pages=2)
    assert first.scanned == 4 and first.embedded == 4 and not first.caught_up
    assert (
        embed_recovery.position(ch) is None and embed_recovery.position(ch, embed_recovery.SWEEP) is not None
    )
    orphan(ch, "ns0", "late", "inserted during the sweep")
    second = await run_pass(svc, FakeEmbedder(), page=2, max_pages=2)
    # The sweep's last page (one turn, the late one is past its horizon), then insert-time order.
    assert second.caught_up and second.embedded == 2
    assert embed_recovery.position(ch) is not None
    [[embedded]] = ch.query("SELECT count() FROM conversation_embeddings FINAL WHERE error = ''").result_rows
    assert embedded == 6
    third = await run_pass(svc, FakeEmbedder(), page=2, max_pages=2)
    assert third.embedded == 0 and third.caught_up
    ch.command(f"DROP DATABASE IF EXISTS {settings.clickhouse_database}")


async def test_the_pass_reads_a_turn_behind_its_speakers_name_with_the_prefix_on(ns, services):
    ch = services.ch
    rewind(ch)
    turns = [
        conv_store.Turn(
            namespace=ns,
            agent="default",
            thread_id="t",
            msg_id=msg_id,
            ts=utcnow(),
            role="user",
            content=content,
            metadata={"speaker": speaker},
            version=next_version(),
        )  # fmt: skip
        for msg_id, content, speaker in (("c", "I went to the support group", "Caroline"), ("n", "it met", 7))
    ]
    conv_store.insert(ch, turns)
    landed = embed_recovery.landed_after(
        ch, embed_recovery.position(ch), embed_recovery.horizon(ch, 0), limit=1000, chars=100
    )
    assert {r.position.msg_id: r.speaker for r in landed if r.position.namespace == ns} == {
        "c": "Caroline",
        "n": "",
    }
    spy = SpyEmbedder(FakeEmbedder())
    before = services.settings
    services.settings = before.model_copy(update={"embed_speaker_prefix": True})
    try:
        await run_pass(services, spy)
    finally:
        services.settings = before
    assert sorted(spy.texts) == ["Caroline: I went to the support group", "User: it met"]
    assert emb_row(ch, ns, "t", "c")["text"] == "I went to the support group"
