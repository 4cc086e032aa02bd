"""The hashing fake and the spy wrapper."""

from __future__ import annotations

import numpy as np
import pytest

from loom.providers import Embedder, EmbedderError, FakeEmbedder, SpyEmbedder


def test_identity_and_protocol() -> None:
    f = FakeEmbedder()
    assert f.model_id == "fake-hash-384" and f.dim == 384
    assert isinstance(f, Embedder)
    assert FakeEmbedder(dim=16).model_id == "fake-hash-16"


def test_deterministic_and_normalised() -> None:
    a = FakeEmbedder().embed(["Hello world", "hello, WORLD!", "something else", ""])
    b = FakeEmbedder().embed(["Hello world", "hello, WORLD!", "something else", ""])
    np.testing.assert_array_equal(a, b)
    assert a.shape == (4, 384) and a.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-6)
    np.testing.assert_array_equal(a[0], a[1])  # same words, case and punctuation aside


def test_shared_words_have_positive_cosine() -> None:
    v = FakeEmbedder().embed(["the red car", "a red bicycle", "quantum chromodynamics lecture"])
    assert float(v[0] @ v[1]) > 0.2
    assert float(v[0] @ v[1]) > float(v[0] @ v[2])
    assert float(v[0] @ v[2]) >= 0.0


def test_seed_changes_the_hashing() -> None:
    a = FakeEmbedder(seed=1).embed(["word"])
    b = FakeEmbedder(seed=2).embed(["word"])
    assert not np.array_equal(a, b)


def test_spy_records_batches() -> None:
    f = FakeEmbedder()
    f.embed(["a", "b"])
    f.embed(["c"])
    assert f.calls == [["a", "b"], ["c"]]
    assert f.texts == ["a", "b", "c"]
    f.reset()
    assert f.calls == []


def test_fail_and_fail_on() -> None:
    f = FakeEmbedder(fail=True)
    with pytest.raises(EmbedderError):
        f.embed(["x"])
    assert f.calls == [["x"]]
    g = FakeEmbedder(fail_on=lambda t: "poison" in t)
    assert g.embed(["fine"]).shape == (1, 384)
    with pytest.raises(EmbedderError, match="poison"):
        g.embed(["ok", "poison pill"])
    g.fail_on = None
    assert g.embed(["poison pill"]).shape == (1, 384)


def test_empty_input() -> None:
    assert FakeEmbedder().embed([]).shape == (0, 384)


def test_spy_wrapper_records_every_text() -> None:
    inner = FakeEmbedder(dim=32, fail_on=lambda t: t == "bad")
    spy = SpyEmbedder(inner)
    assert isinstance(spy, Embedder)
    assert spy.model_id == "fake-hash-32" and spy.dim == 32
    np.testing.assert_array_equal(spy.embed(["x", "y"]), FakeEmbedder(dim=32).embed(["x", "y"]))
    with pytest.raises(EmbedderError):
        spy.embed(["bad"])
    assert spy.calls == [["x", "y"], ["bad"]]
    assert spy.texts == ["x", "y", "bad"]
