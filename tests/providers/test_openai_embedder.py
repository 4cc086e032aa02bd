"""The OpenAI-compatible embedder against the local stand-in server."""

from __future__ import annotations

import time

import numpy as np
import pytest

from loom.providers import EmbedderError, OpenAICompatEmbedder
from tests.providers.standin import Reply, StandInServer, embedding_for


def unit(v: list[float]) -> np.ndarray:
    a = np.asarray(v, dtype=np.float32)
    return a / np.linalg.norm(a)


def make(srv: StandInServer, **kw: object) -> OpenAICompatEmbedder:
    opts: dict = {"base_url": srv.url, "model": "emb-model", "dim": 384, "timeout": 2.0}
    opts.update(kw)
    return OpenAICompatEmbedder(**opts)


def test_good_answer_is_normalised_and_what_was_sent(standin: StandInServer) -> None:
    e = make(standin, api_key="sk-test")
    out = e.embed(["alpha", "beta"])
    assert out.shape == (2, 384) and out.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(out[0], unit(embedding_for("alpha")), atol=1e-6)
    np.testing.assert_allclose(out[1], unit(embedding_for("beta")), atol=1e-6)
    (req,) = standin.requests
    assert req.method == "POST" and req.path == "/v1/embeddings"
    assert req.json == {"model": "emb-model", "input": ["alpha", "beta"]}
    assert req.headers["authorization"] == "Bearer sk-test"
    assert req.headers["content-type"].startswith("application/json")
    assert e.model_id == "emb-model" and e.dim == 384
    e.close()


def test_rows_follow_index_not_position(standin: StandInServer) -> None:
    standin.set_handler(standin.EMBEDDINGS, lambda req: standin.embeddings_ok(req, reverse=True))
    out = make(standin).embed(["one", "two", "three"])
    for row, text in zip(out, ["one", "two", "three"], strict=True):
        np.testing.assert_allclose(row, unit(embedding_for(text)), atol=1e-6)


def test_base_url_with_v1_is_not_doubled(standin: StandInServer) -> None:
    for base in (standin.url + "/v1", standin.url + "/v1/", standin.url + "/"):
        make(standin, base_url=base).embed(["x"])
    assert [r.path for r in standin.requests] == ["/v1/embeddings"] * 3


def test_no_key_no_authorization_header(standin: StandInServer) -> None:
    make(standin).embed(["x"])
    assert "authorization" not in standin.requests[0].headers


def test_batches_large_inputs_and_reuses_the_client(standin: StandInServer) -> None:
    e = make(standin, batch_size=4)
    texts = [f"t{i}" for i in range(10)]
    out = e.embed(texts)
    assert [len(r.json["input"]) for r in standin.requests] == [4, 4, 2]
    np.testing.assert_allclose(out[9], unit(embedding_for("t9")), atol=1e-6)
    client = e._client
    e.embed(["again"])
    assert e._client is client


def test_empty_input_sends_nothing(standin: StandInServer) -> None:
    assert make(standin).embed([]).shape == (0, 384)
    assert standin.requests == []


@pytest.mark.parametrize(
    ("reply", "match"),
    [
        (Reply.malformed(), "not valid JSON"),
        (Reply.text("<html>gateway</html>", content_type="text/html"), "not valid JSON"),
        (Reply.json({"object": "list"}), "no 'data' list"),
        (Reply.json({"data": [{"index": 0}]}), "not a list of finite numbers"),
        (Reply.json({"data": [{"index": 0, "embedding": ["a"] * 384}]}), "not a list of finite numbers"),
        (Reply.json({"data": [{"index": 5, "embedding": [1.0] * 384}]}), "index is 5"),
        (Reply.json({"data": [{"index": 0, "embedding": [0.0] * 384}]}), "zero-length"),
        (Reply.json({"data": []}), "sent 1 texts, got 0"),
        (Reply.json([1, 2, 3]), "no 'data' list"),
    ],
)
def test_malformed_bodies(standin: StandInServer, reply: Reply, match: str) -> None:
    standin.enqueue(standin.EMBEDDINGS, reply)
    with pytest.raises(EmbedderError, match=match):
        make(standin).embed(["x"])


def test_duplicate_index(standin: StandInServer) -> None:
    standin.enqueue(
        standin.EMBEDDINGS,
        Reply.json(
            {"data": [{"index": 0, "embedding": [1.0] * 384}, {"index": 0, "embedding": [1.0] * 384}]}
        ),
    )
    with pytest.raises(EmbedderError, match="appears twice"):
        make(standin).embed(["x", "y"])


@pytest.mark.parametrize("status", [400, 401, 429, 500, 503])
def test_http_errors(standin: StandInServer, status: int) -> None:
    standin.enqueue(standin.EMBEDDINGS, Reply.error(status, f"server says {status}"))
    with pytest.raises(EmbedderError, match=f"HTTP {status}.*server says {status}"):
        make(standin).embed(["x"])


def test_error_without_json_body(standin: StandInServer) -> None:
    standin.enqueue(standin.EMBEDDINGS, Reply.text("upstream exploded", status=502))
    with pytest.raises(EmbedderError, match="HTTP 502.*upstream exploded"):
        make(standin).embed(["x"])


def test_timeout(standin: StandInServer) -> None:
    standin.enqueue(standin.EMBEDDINGS, Reply.json({}).delayed(5))
    e = make(standin, timeout=0.3)
    t0 = time.monotonic()
    with pytest.raises(EmbedderError, match="timed out after 0.3s"):
        e.embed(["x"])
    assert time.monotonic() - t0 < 3
    # The next request works on the same embedder.
    assert e.embed(["y"]).shape == (1, 384)


def test_dimension_mismatch(standin: StandInServer) -> None:
    srv_dim = StandInServer(embedding_dim=768).start()
    try:
        with pytest.raises(EmbedderError, match="dimension mismatch, got 768-d vectors, expected 384"):
            make(srv_dim, dim=384).embed(["x"])
        assert make(srv_dim, dim=768).embed(["x"]).shape == (1, 768)
    finally:
        srv_dim.stop()


def test_connection_refused() -> None:
    srv = StandInServer().start()
    url = srv.url
    srv.stop()
    with pytest.raises(EmbedderError, match="request failed"):
        OpenAICompatEmbedder(base_url=url, model="m", timeout=1).embed(["x"])


def test_dim_defaults() -> None:
    assert OpenAICompatEmbedder(base_url="http://h", model="text-embedding-3-small").dim == 1536
    assert OpenAICompatEmbedder(base_url="http://h", model="whatever").dim == 384
    e = OpenAICompatEmbedder(base_url="http://h", model="m", model_id="custom-id")
    assert e.model_id == "custom-id"
    with pytest.raises(ValueError):
        OpenAICompatEmbedder(base_url="h:1", model="m")
    with pytest.raises(ValueError):
        OpenAICompatEmbedder(base_url="http://h", model="")
