"""The default embedder: the real all-MiniLM-L6-v2 int8 ONNX model."""

from __future__ import annotations

import pickle
import threading
from pathlib import Path

import numpy as np
import pytest

from loom.providers import EmbedderError, MiniLMEmbedder
from loom.providers.embedders.minilm import TOKENIZER_PATH


@pytest.fixture(scope="module")
def minilm() -> MiniLMEmbedder:
    e = MiniLMEmbedder()
    e.load()
    return e


def cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b))


def test_identity() -> None:
    e = MiniLMEmbedder()
    assert e.model_id == "all-MiniLM-L6-v2-onnx-int8"
    assert e.dim == 384
    assert TOKENIZER_PATH.is_file()


def test_shape_dtype_and_unit_norm(minilm: MiniLMEmbedder) -> None:
    v = minilm.embed(["hello world", "Loom keeps memories for agents.", ""])
    assert v.shape == (3, 384)
    assert v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)


def test_deterministic_across_calls_and_instances(minilm: MiniLMEmbedder) -> None:
    text = ["The quick brown fox jumps over the lazy dog."]
    a = minilm.embed(text)
    b = minilm.embed(text)
    c = MiniLMEmbedder(intra_op_num_threads=1).embed(text)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(a, c, atol=1e-5)


def test_rows_in_input_order_across_batches(minilm: MiniLMEmbedder) -> None:
    # Mixed lengths and more than one internal batch: rows must still follow the input.
    texts = [("word " * (i * 7 % 50)) + f"item number {i}" for i in range(75)]
    batch = minilm.embed(texts)
    singles = np.stack([minilm.embed([t])[0] for t in texts])
    assert batch.shape == (75, 384)
    np.testing.assert_allclose(batch, singles, atol=1e-4)
    assert len({v.tobytes() for v in batch}) == 75


def test_paraphrase_scores_higher_than_unrelated(minilm: MiniLMEmbedder) -> None:
    q, para, other = minilm.embed(
        [
            "How do I reset my password?",
            "I forgot my login password, how can I change it?",
            "The weather is sunny in Madrid",
        ]
    )
    assert cos(q, para) > cos(q, other) + 0.3
    assert cos(q, para) > 0.6


def test_empty_list_does_not_load_the_model() -> None:
    e = MiniLMEmbedder()
    out = e.embed([])
    assert out.shape == (0, 384)
    assert out.dtype == np.float32
    assert not e.loaded


def test_long_text_is_truncated_at_256_tokens(minilm: MiniLMEmbedder) -> None:
    head = " ".join(f"memory{i}" for i in range(400))  # far more than 256 tokens
    long = head + " " + "tail words that fall beyond the truncation point " * 200
    assert len(long) > 10_000
    a, b = minilm.embed([long, head])
    np.testing.assert_allclose(a, b, atol=1e-5)  # the tail was cut off
    tokens = minilm._tokenizer.encode(long)
    assert len(tokens.ids) == 256


def test_ten_thousand_chars_work(minilm: MiniLMEmbedder) -> None:
    text = ("Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 200)[:10_000]
    v = minilm.embed([text, "short one"])
    assert v.shape == (2, 384)
    assert np.all(np.isfinite(v))


def test_bare_string_and_non_str_rejected(minilm: MiniLMEmbedder) -> None:
    with pytest.raises(TypeError):
        minilm.embed("not a list")
    with pytest.raises(TypeError):
        minilm.embed(["ok", 3])  # type: ignore[list-item]


def test_threads_share_one_instance() -> None:
    e = MiniLMEmbedder()
    texts = [f"concurrent text {i}" for i in range(8)]
    expected = MiniLMEmbedder().embed(texts)
    results: dict[int, np.ndarray] = {}

    def run(k: int) -> None:
        results[k] = e.embed(texts)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in range(4):
        np.testing.assert_allclose(results[k], expected, atol=1e-5)


def test_pickles_without_its_session(minilm: MiniLMEmbedder) -> None:
    copy = pickle.loads(pickle.dumps(minilm))
    assert not copy.loaded
    np.testing.assert_allclose(copy.embed(["pickled"]), minilm.embed(["pickled"]), atol=1e-6)


def test_model_file_is_verified(tmp_path: Path) -> None:
    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(EmbedderError, match="bytes, expected"):
        MiniLMEmbedder(model_path=bad).embed(["x"])
    # Without verification the broken file still fails, as an EmbedderError.
    with pytest.raises(EmbedderError, match="could not load"):
        MiniLMEmbedder(model_path=bad, verify=False).embed(["x"])


def test_options_validated() -> None:
    with pytest.raises(ValueError):
        MiniLMEmbedder(intra_op_num_threads=0)
    with pytest.raises(ValueError):
        MiniLMEmbedder(max_length=1000)


def test_tokenizer_overrides(minilm: MiniLMEmbedder) -> None:
    # The shipped tokenizer.json pads to a fixed 128 and truncates at 128; ours does neither.
    assert minilm._tokenizer.encode("hello world").ids == [101, 7592, 2088, 102]
    assert minilm._tokenizer.truncation["max_length"] == 256
    assert minilm._tokenizer.padding is None
