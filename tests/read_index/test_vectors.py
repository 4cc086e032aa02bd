"""loom.read_index.vectors: one namespace's rows, by version, ranked exactly."""

from __future__ import annotations

import numpy as np

from loom.read_index.feed import Row, decode_rows, encode_rows
from loom.read_index.vectors import NamespaceVectors, Wanted


def _row(thread: str, msg: str, version: int, vec: list[float] | None, **kw: str) -> Row:
    v = None if vec is None else np.asarray(vec, dtype=np.float32)
    return Row(
        "ns",
        thread,
        msg,
        version,
        kw.get("agent", "a"),
        kw.get("role", "user"),
        kw.get("run_id", ""),
        "",
        0,
        f"text {msg}",
        kw.get("model", "m"),
        v,
    )


def test_the_newest_version_wins_whatever_the_order_of_arrival():
    v = NamespaceVectors()
    assert v.apply(_row("t", "m", 5, [1, 0]))
    assert not v.apply(_row("t", "m", 3, [0, 1]))  # older: nothing changes
    found, _ = v.search(np.array([1, 0], dtype=np.float32), Wanted(), 10)
    assert [(f.msg_id, f.version) for f in found] == [("m", 5)]
    assert v.apply(_row("t", "m", 7, None))  # a tombstone (or a failed embed) removes it
    assert v.search(np.array([1, 0], dtype=np.float32), Wanted(), 10)[0] == []
    assert not v.apply(_row("t", "m", 6, [1, 0]))  # a late older vector does not bring it back
    assert len(v) == 0


def test_ranking_is_exact_cosine_with_filters():
    rng = np.random.default_rng(1)
    vecs = rng.standard_normal((200, 8)).astype(np.float32)
    v = NamespaceVectors()
    for i, vec in enumerate(vecs):
        v.apply(_row(f"t{i % 3}", f"m{i}", 1, vec.tolist(), role="user" if i % 2 else "assistant"))
    q = rng.standard_normal(8).astype(np.float32)
    sims = (vecs / np.linalg.norm(vecs, axis=1, keepdims=True)) @ (q / np.linalg.norm(q))
    found, n = v.search(q, Wanted(), 5)
    assert n == 200 and [f.msg_id for f in found] == [f"m{i}" for i in np.argsort(-sims)[:5]]
    assert np.allclose([f.similarity for f in found], np.sort(sims)[::-1][:5], atol=1e-5)
    only = [i for i in range(200) if i % 3 == 1 and i % 2 == 1]
    found, n = v.search(q, Wanted(thread_id="t1", role="user"), 3)
    assert n == len(only)
    assert [f.msg_id for f in found] == [f"m{i}" for i in sorted(only, key=lambda i: -sims[i])[:3]]
    assert v.search(q, Wanted(agent="nobody"), 3) == ([], 0)


def test_a_namespace_is_served_to_a_query_only_when_its_model_made_every_live_vector():
    v = NamespaceVectors()
    assert v.made_only_by("m") and v.made_only_by("other")  # nothing held: nothing to miss
    v.apply(_row("t", "a", 1, [1, 0]))
    v.apply(_row("t", "b", 1, [0, 1], model="e5"))
    assert not v.made_only_by("m") and not v.made_only_by("e5") and not v.made_only_by("x")
    v.apply(_row("t", "b", 2, [0, 1]))  # re-embedded by m: the namespace is m's again
    assert v.made_only_by("m") and not v.made_only_by("e5")
    v.apply(_row("t", "a", 2, None))
    v.apply(_row("t", "b", 3, None))  # nothing live: any model may be answered (with nothing)
    assert v.made_only_by("e5")


def test_a_thread_read_again_drops_what_the_store_no_longer_holds():
    v = NamespaceVectors()
    v.apply(_row("t", "a", 1, [1, 0]))
    v.apply(_row("t", "b", 1, [0, 1]))
    v.apply(_row("u", "c", 1, [1, 1]))
    v.replace_thread("t", [_row("t", "a", 2, [1, 0])])  # b was removed by a DELETE
    found, _ = v.search(np.array([1, 1], dtype=np.float32), Wanted(), 10)
    assert sorted(f.msg_id for f in found) == ["a", "c"]
    assert v.where[("t", "a")] and v.rows[v.where[("t", "a")]].version == 2


def test_slots_are_reused_and_the_size_follows_the_rows():
    v = NamespaceVectors()
    for i in range(100):
        v.apply(_row("t", f"m{i}", 1, [1.0, float(i)]))
    full = v.nbytes
    for i in range(50):
        v.apply(_row("t", f"m{i}", 2, None))
    for i in range(50):
        v.apply(_row("u", f"n{i}", 1, [float(i), 1.0]))
    assert v.matrices[2].n == 100  # the removed rows' slots took the new ones
    assert len(v) == 100 and v.nbytes >= full


def test_an_event_carries_only_live_recorded_vectors():
    from datetime import UTC, datetime

    from loom.store.embeddings import EmbeddingRow

    ts = datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
    rows = [
        EmbeddingRow("ns", "t", "live", "a", "user", "r", "u", ts, "hello", [0.5, 0.5], "m", version=3),
        EmbeddingRow("ns", "t", "dead", "a", "user", "", "", ts, "gone", [0.5, 0.5], "m", tombstoned=True),
        EmbeddingRow("ns", "t", "failed", "a", "user", "", "", ts, "x", [], "m", error="embedder_error: x"),
        EmbeddingRow("ns", "t", "saved", "a", "user", "", "", ts, "x", [1.0, 0.0], "m", origin="saved"),
    ]
    back = {r.msg_id: r for r in decode_rows(encode_rows(rows))}
    assert back["live"].vector is not None and back["live"].vector.tolist() == [0.5, 0.5]
    assert back["live"].ts_us == int(ts.timestamp() * 1_000_000) and back["live"].version == 3
    assert all(back[k].vector is None and back[k].text == "" for k in ("dead", "failed", "saved"))


def test_a_bulk_load_holds_what_applying_row_by_row_holds():
    rng = np.random.default_rng(3)
    rows = [
        _row(
            f"t{i % 4}",
            f"m{i}",
            i,
            None if i % 7 == 0 else rng.standard_normal(6).tolist(),
            run_id=f"r{i % 3}",
        )
        for i in range(300)
    ]
    rows.append(_row("t0", "zero", 1, [0.0] * 6))
    one, bulk = NamespaceVectors(), NamespaceVectors()
    for r in rows:
        one.apply(r)
    bulk.load(rows)
    q = rng.standard_normal(6).astype(np.float32)
    for wanted in (Wanted(), Wanted(thread_id="t2"), Wanted(run_id="r1", role="user")):
        a, na = one.search(q, wanted, 20)
        b, nb = bulk.search(q, wanted, 20)
        assert na == nb and [(f.msg_id, round(f.similarity, 5)) for f in a] == [
            (f.msg_id, round(f.similarity, 5)) for f in b
        ]
    assert len(bulk) == len(one) == 300 - 43 and bulk.versions == one.versions
    bulk.apply(_row("t1", "m1", 999, None))  # later events apply as before
    assert ("t1", "m1") not in bulk.where
