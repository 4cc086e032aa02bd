"""Re-embedding: from exactly the text each row keeps (2,048 or an earlier build's 240
characters), skipping tombstoned rows and tombstoning the rows of turns that read as
high (their kept text, or their transcript row beyond it); op and CLI."""

from __future__ import annotations

import asyncio
import os
import sys
from datetime import UTC, datetime

import numpy as np

from loom.clock import next_version
from loom.providers.embedders import FakeEmbedder, SpyEmbedder
from loom.store import embeddings as emb_store
from tests.conversation.helpers import emb_row, raise_marks

LEGACY_MODEL = "legacy-model-v0"


def _legacy(ns: str, thread_id: str, msg_id: str, text: str, **kw) -> emb_store.EmbeddingRow:
    vec = np.random.default_rng(1).standard_normal(16).astype(np.float32)
    return emb_store.EmbeddingRow(
        ns,
        thread_id,
        msg_id,
        "default",
        "user",
        "",
        "",
        datetime.now(UTC),
        text,
        vec / np.linalg.norm(vec),
        LEGACY_MODEL,
        version=next_version(),
        **kw,
    )


def _seed_legacy(services, ns: str) -> dict[str, str]:
    """Rows as an earlier build wrote them: 240 characters of text and an old model."""
    texts = {
        "a": ("legacy turn about the billing migration " * 10)[:240],
        "b": ("an assistant answer kept only in part " * 10)[:240],
        "dead": ("a turn deleted since " * 20)[:240],
        "high": ("the admin password=Tr0ub4dor&3xq was pasted here " * 6)[:240],
    }
    rows = [_legacy(ns, "legacy", m, t, tombstoned=(m == "dead")) for m, t in texts.items()]
    emb_store.insert(services.ch, rows)
    raise_marks(services.ch, ns)  # as migration 006 did for rows of earlier builds
    return texts


async def test_reembed_rebuilds_from_the_kept_text(call, ns, writer, mint, services, worker_embedder):
    texts = _seed_legacy(services, ns)
    long_turn = "a current build's turn " * 150  # > 2,048 characters
    r = await call(
        "conversation.append",
        writer,
        namespace=ns,
        thread_id="now",
        role="user",
        content=long_turn,
        msg_id="n",
    )
    assert r.json()["embedding"] == "embedded"
    # A failed embed (fail-open) is retried only by an admin's re-embed.
    worker_embedder(FakeEmbedder(fail=True))
    r = await call(
        "conversation.append",
        writer,
        namespace=ns,
        thread_id="now",
        role="user",
        content="this one failed",
        msg_id="f",
    )
    assert r.json()["embedding"] == "failed"

    new_model = FakeEmbedder(seed=7, model_id="fake-v2")  # "after a model change"
    spy = worker_embedder(SpyEmbedder(new_model))
    r = await call("conversation.reembed", mint(ns, "admin"), namespace=ns)
    assert r.status_code == 200, r.text
    report = r.json()
    assert report == {
        "namespace": ns,
        "scanned": 6,
        "reembedded": 4,
        "skipped_tombstoned": 1,
        "skipped_high": 1,
        "skipped_changed": 0,
        "failed": 0,
        "errors": [],
    }
    assert sorted(spy.texts) == sorted([texts["a"], texts["b"], long_turn[:2048], "this one failed"])
    for msg_id in ("a", "b"):
        row = emb_row(services.ch, ns, "legacy", msg_id)
        assert row["text"] == texts[msg_id] and len(row["text"]) == 240  # the text stays as it was
        assert row["model"] == "fake-v2" and row["error"] == ""
        assert np.allclose(row["embedding"], new_model.vector(texts[msg_id]), atol=1e-6)
    row = emb_row(services.ch, ns, "now", "n")
    assert row["model"] == "fake-v2" and np.allclose(
        row["embedding"], new_model.vector(long_turn[:2048]), atol=1e-6
    )
    row = emb_row(services.ch, ns, "now", "f")
    assert row["error"] == "" and len(row["embedding"]) == new_model.dim
    assert emb_row(services.ch, ns, "legacy", "dead")["model"] == LEGACY_MODEL  # untouched
    high = emb_row(services.ch, ns, "legacy", "high")  # tombstoned
    assert high["tombstoned"] is True and high["text"] == "" and len(high["embedding"]) == 0
    assert not any("Tr0ub4dor" in t for t in spy.texts)


async def test_loom_reembed_cli(ns, services):
    texts = _seed_legacy(services, ns)
    cfg = services.settings
    env = {
        **os.environ,
        "LOOM_HOME": str(cfg.home),
        "LOOM_CLICKHOUSE_URL": cfg.clickhouse_url,
        "LOOM_REDIS_URL": cfg.redis_url,
        "LOOM_CLICKHOUSE_DATABASE": cfg.clickhouse_database,
        "LOOM_EMBEDDER": "fake",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "loom.cli.main",
        "reembed",
        "--namespace",
        ns,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    assert "reembedded=2" in err.decode() and "skipped_high=1" in err.decode()
    fake = FakeEmbedder()
    for msg_id in ("a", "b"):
        row = emb_row(services.ch, ns, "legacy", msg_id)
        assert row["model"] == fake.model_id
        assert np.allclose(row["embedding"], fake.vector(texts[msg_id]), atol=1e-6)
    assert emb_row(services.ch, ns, "legacy", "high")["tombstoned"] is True
    assert emb_row(services.ch, ns, "legacy", "dead")["model"] == LEGACY_MODEL


async def test_reembed_never_sends_a_turn_whose_transcript_reads_as_high(
    call, ns, mint, services, worker_embedder
):
    """The kept 2,048 (or 240) characters look clean, the high part lies beyond them: an
    earlier build screened less and embedded the turn. The re-embed sends neither to the
    model and tombstones both embedding rows."""
    from loom.clock import utcnow
    from loom.store import conversations as conv_store

    clean = "notes on the quarterly infrastructure review and the capacity plan " * 40  # > 2,048
    turns = {
        "long": clean + " and the db password=Tr0ub4dor&3xq for prod",
        "legacy": clean[:300] + " my card is 4111 1111 1111 1111",
        "plain": "a plain turn about the capacity plan",
    }
    now = utcnow()
    conv_store.insert(
        services.ch,
        [
            conv_store.Turn(
                namespace=ns,
                agent="default",
                thread_id="t",
                msg_id=m,
                ts=now,
                role="user",
                content=c,
                version=next_version(),
            )
            for m, c in turns.items()
        ],
    )
    kept = {"long": turns["long"][:2048], "legacy": turns["legacy"][:240], "plain": turns["plain"]}
    emb_store.insert(services.ch, [_legacy(ns, "t", m, text) for m, text in kept.items()])
    raise_marks(services.ch, ns)
    spy = worker_embedder(SpyEmbedder(FakeEmbedder(seed=7, model_id="fake-v2")))
    r = await call("conversation.reembed", mint(ns, "admin"), namespace=ns)
    assert r.status_code == 200, r.text
    report = r.json()
    assert report["reembedded"] == 1 and report["skipped_high"] == 2, report
    assert spy.texts == [kept["plain"]]
    for m in ("long", "legacy"):
        row = emb_row(services.ch, ns, "t", m)
        assert row["tombstoned"] is True and row["text"] == "" and len(row["embedding"]) == 0
    assert emb_row(services.ch, ns, "t", "plain")["model"] == "fake-v2"
