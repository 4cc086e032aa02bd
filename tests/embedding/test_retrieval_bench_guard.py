"""The retrieval study (bench/studies/retrieval.py) stops before scoring a load whose turns failed to embed: their
recall would measure the failures (stored fail-open, never embedded again), not the model."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from bench.studies.retrieval import failed_embeddings, require_embedded
from loom.clock import next_version
from loom.store import embeddings as emb_store


def _row(ns: str, msg_id: str, error: str = "", tombstoned: bool = False) -> emb_store.EmbeddingRow:
    return emb_store.EmbeddingRow(
        namespace=ns,
        thread_id="t",
        msg_id=msg_id,
        agent="bench",
        role="user",
        run_id="",
        user_id="",
        ts=datetime.now(UTC),
        text="a turn",
        embedding=[] if error else [0.6, 0.8],
        model="" if error else "m",
        error=error,
        tombstoned=tombstoned,
        version=next_version(),
    )


def test_failed_embeddings_stop_the_study_counted_per_error(services: Any, ns: str) -> None:
    clean, other = ns + "-ok", ns + "-other"
    emb_store.insert(
        services.ch,
        [
            _row(ns, "m1", "embedder_timeout: no embedding came back in time"),
            _row(ns, "m2", "embedder_timeout: no embedding came back in time"),
            _row(ns, "m3", "embedder_unavailable: down"),
            _row(ns, "m4"),
            _row(ns, "m5", "embedder_unavailable: down", tombstoned=True),  # deleted: not scored
            _row(clean, "m1"),
            _row(other, "m1", "embedder_timeout: no embedding came back in time"),  # not loaded here
        ],
    )
    assert failed_embeddings(services.ch, [ns, clean]) == {
        "embedder_timeout: no embedding came back in time": 2,
        "embedder_unavailable: down": 1,
    }
    with pytest.raises(SystemExit, match=r"3 loaded turns failed to embed \(2 x 'embedder_timeout"):
        require_embedded(services.ch, [ns, clean])
    require_embedded(services.ch, [clean])  # every turn has its vector: the study goes on
