"""`loom reembed --model`: a namespace's vectors of a second model are built beside the
ones search uses, and a search never compares its query with another model's vectors,
before, during or after the re-embed."""

from __future__ import annotations

import numpy as np

from loom.ops.conversation.lifecycle.reembedding import Walk, reembed_to_model
from loom.ops.embedding import inline
from loom.providers.embedders import FakeEmbedder
from loom.store import vector_models
from tests.conversation.helpers import append_turn, emb_row, ok, raise_marks

TURNS = {
    "t1": ["the invoices moved to the new ledger", "ledger migration finished on friday"],
    "t2": ["billing ledger questions from finance", "the old ledger is read only now"],
}
QUERY = "ledger invoices"


async def _search(call, token, ns):
    return await ok(call, "conversation.search", token, namespace=ns, query=QUERY, limit=10)


def _expected(model: FakeEmbedder, texts: dict[str, str]) -> dict[str, float]:
    q = model.vector(QUERY)
    return {m: round(float(model.vector(t) @ q), 6) for m, t in texts.items()}


async def test_a_namespace_mid_reembed_answers_from_one_model_only(call, ns, writer, mint, services):
    current = FakeEmbedder()  # the suite's embedder: the worker's and the API's
    target = FakeEmbedder(seed=7, model_id="fake-target")
    texts: dict[str, str] = {}
    for thread, contents in TURNS.items():
        for i, content in enumerate(contents):
            await append_turn(call, writer, ns, "default", thread, "user", content, msg_id=f"{thread}-{i}")
            texts[f"{thread}-{i}"] = content
    viewer = mint(ns, "viewer")
    before = await _search(call, viewer, ns)
    assert before["embedding_model"] == current.model_id

    # Half-way: only thread t1 has vectors of the target model.
    half = await reembed_to_model(services, Walk(ns, "t1"), target)
    assert half.reembedded == 2 and half.failed == 0
    assert vector_models.coverage(services.ch, ns) == {current.model_id: 4, "fake-target": 2}
    staged = services.ch.query(
        "SELECT msg_id, version, embedding FROM conversation_vectors_384 FINAL "
        "WHERE namespace = {ns:String} AND model = 'fake-target' ORDER BY msg_id",
        parameters={"ns": ns},
    ).result_rows
    for msg_id, version, vector in staged:  # the target's vector of the embedding row's very version
        assert version == emb_row(services.ch, ns, "t1", msg_id)["version"]
        assert np.allclose(vector, target.vector(texts[msg_id]), atol=1e-2)  # kept as bf16
    raise_marks(services.ch, ns)  # verify every candidate, as after any change
    during = await _search(call, viewer, ns)
    assert during["embedding_model"] == current.model_id
    assert during["hits"] == before["hits"]  # the current model's vectors, all of them, and nothing else
    want = _expected(current, texts)
    assert {h["msg_id"]: h["similarity"] for h in during["hits"]} == {
        m: s for m, s in want.items() if s >= services.settings.conversation_search_min_similarity
    }

    # The process switches to the target model: only its vectors answer, so only t1.
    previous = inline.install(services, target)
    try:
        switched = await _search(call, viewer, ns)
        assert switched["embedding_model"] == "fake-target"
        want_t = {m: s for m, s in _expected(target, texts).items() if m.startswith("t1")}
        assert {h["msg_id"]: h["similarity"] for h in switched["hits"]} == {
            m: s for m, s in want_t.items() if s >= services.settings.conversation_search_min_similarity
        }
        # The rest of the namespace, then a catch-up run that finds nothing left to do.
        rest = await reembed_to_model(services, Walk(ns), target)
        assert (rest.reembedded, rest.skipped_current) == (2, 2)
        again = await reembed_to_model(services, Walk(ns), target)
        assert (again.reembedded, again.skipped_current) == (0, 4)
        done = await _search(call, viewer, ns)
        assert {h["msg_id"] for h in done["hits"]} == {
            m
            for m, s in _expected(target, texts).items()
            if s >= services.settings.conversation_search_min_similarity
        }
        # A turn deleted after its target vector was built is never answered by it.
        admin = mint(ns, "admin")
        await ok(call, "conversation.delete", admin, namespace=ns, thread_id="t2", confirm_thread_id="t2")
        gone = await _search(call, viewer, ns)
        assert all(h["thread_id"] == "t1" for h in gone["hits"])
    finally:
        inline.install(services, previous)
