"""Job payloads (loom.jobs): typed, versioned, read by name; what another build sends
is refused loudly, never misread."""

from __future__ import annotations

import json
import pickle
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from loom import jobs, redis_keys
from loom.jobs import EmbedTurn, PayloadRefused, ReembedItem
from loom.queue import QUEUE, wake_workers

TS = datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
TURN = EmbedTurn(
    namespace="ns",
    agent="a",
    thread_id="t",
    msg_id="m",
    role="user",
    run_id="r",
    user_id="u",
    ts=TS,
    text="hello",
    is_summary=False,
)


def _wire(payload: dict[str, Any]) -> dict[str, Any]:
    """What arq carries: the payload pickled and unpickled."""
    return pickle.loads(pickle.dumps(payload))  # type: ignore[no-any-return]


def test_an_embedding_job_round_trips_by_name() -> None:
    payload = _wire(jobs.build(jobs.EmbedTurnsJob, job="j", reply="r", turns=[TURN], at=7, gate="g"))
    assert payload["v"] == 1 and payload["turns"][0]["msg_id"] == "m"  # by name on the wire
    job = jobs.read(jobs.EmbedTurnsJob, payload)
    assert job.turns == [TURN] and isinstance(job.turns[0], EmbedTurn)
    assert (job.job, job.reply, job.at, job.gate) == ("j", "r", 7, "g")


def test_the_other_jobs_round_trip() -> None:
    item = ReembedItem(namespace="ns", thread_id="t", msg_id="m", text="x")
    assert jobs.read(jobs.ReembedRowsJob, _wire(jobs.build(jobs.ReembedRowsJob, rows=[item]))).rows == [item]
    erase = jobs.read(jobs.ErasureRemoveJob, _wire(jobs.build(jobs.ErasureRemoveJob, erasure_id="e1")))
    assert erase.erasure_id == "e1"


@pytest.mark.parametrize("version", [0, 2, 99, "1", None])
def test_an_unknown_payload_version_is_refused(version: Any) -> None:
    payload = jobs.build(jobs.EmbedTurnsJob, turns=[TURN])
    payload["v"] = version
    with pytest.raises(PayloadRefused) as refused:
        jobs.read(jobs.EmbedTurnsJob, payload)
    assert str(refused.value) == (
        f"embed_turns payload version {version!r} refused: this worker reads version 1 "
        "(the enqueuing process runs another build)"
    )


def test_an_earlier_builds_positional_payload_is_refused() -> None:
    legacy = {"turns": [("ns", "a", "t", "m", "user", "r", "u", TS, "hello", False)], "at": 1}
    with pytest.raises(PayloadRefused, match="version None refused"):
        jobs.read(jobs.EmbedTurnsJob, legacy)
    with pytest.raises(PayloadRefused, match="version None refused"):
        jobs.read(jobs.ErasureRemoveJob, {"erasure_id": "e1"})


def test_a_turn_sent_by_position_fails_loudly_even_at_the_right_version() -> None:
    payload = {"v": 1, "turns": [("ns", "a", "t", "m", "user", "r", "u", TS, "hello", False)]}
    with pytest.raises(PayloadRefused, match=r"turns\.0: dataclass_type"):
        jobs.read(jobs.EmbedTurnsJob, payload)


def test_a_renamed_or_missing_field_fails_loudly_and_names_it_never_its_value() -> None:
    payload = jobs.build(jobs.EmbedTurnsJob, turns=[TURN])
    payload["turns"][0]["message_id"] = payload["turns"][0].pop("msg_id")  # a newer build's rename
    payload["deadline"] = 5  # a field this build does not know
    with pytest.raises(PayloadRefused) as refused:
        jobs.read(jobs.EmbedTurnsJob, payload)
    message = str(refused.value)
    assert "turns.0.msg_id: missing" in message
    assert "deadline: extra_forbidden" in message
    assert "hello" not in message  # no turn's text in a log line or error


async def test_a_worker_refuses_an_unknown_version_and_answers_the_api_at_once(
    services: Any, arq_worker: Any
) -> None:
    """Through the real queue and worker: the job fails, and the awaiting API process
    gets an error reply at once (it fails open now, not when its wait runs out)."""
    reply = redis_keys.reply(uuid.uuid4().hex)
    payload = jobs.build(jobs.EmbedTurnsJob, job="j1", reply=reply, turns=[TURN])
    payload["v"] = 2
    job = await services.arq.enqueue_job(
        jobs.EMBED_TURNS, payload, _job_id=uuid.uuid4().hex, _queue_name=QUEUE
    )
    await wake_workers(services.redis)
    popped = await services.redis.blpop([reply], timeout=10)
    assert popped is not None
    msg = json.loads(popped[1])
    assert msg["job"] == "j1" and msg["error"].startswith("internal_error")
    with pytest.raises(PayloadRefused, match="embed_turns payload version 2 refused"):
        await job.result(timeout=10)


def test_arq_log_keeps_no_job_data_and_not_the_titler_tick() -> None:
    import logging

    from workers.main import _ARQ_FILTER, _NoJobData

    def record(msg: str, args: tuple[object, ...]) -> logging.LogRecord:
        return logging.LogRecord("arq.worker", logging.INFO, __file__, 1, msg, args, None)

    embed = record(_NoJobData.START, (0.1, "abc:embed_turns", "'my secret text'", ""))
    assert _ARQ_FILTER.filter(embed) and "secret" not in embed.getMessage()
    done = record(_NoJobData.RESULT, (0.1, "abc:embed_turns", "{'text': 'secret'}"))
    assert _ARQ_FILTER.filter(done) and "secret" not in done.getMessage()
    tick = record(_NoJobData.START, (0.1, "cron:conversation_titler", "", ""))
    assert not _ARQ_FILTER.filter(tick)  # every 5 s: kept off the console
    assert not _ARQ_FILTER.filter(record(_NoJobData.RESULT, (0.0, "cron:conversation_titler", "None")))
