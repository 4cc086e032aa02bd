"""loom.sensitivity.high_spans: where a text reads as high (what conversation.redact's
``high: true`` replaces)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loom.ops.conversation.lifecycle.redacting import splice
from loom.sensitivity import high_spans, reads_as_high

DATA = Path(__file__).parent / "data"
CORPORA = [DATA / "sensitivity_corpus.jsonl", DATA / "sensitivity_families.jsonl"]


def test_spans_are_the_secrets_and_nothing_around_them():
    key = "sk-proj-" + "Q7wErT9yUiOp3aSdF5gHjK1lZxCvBnM8qWe2"
    text = f"my deploy key is {key} and the card 4111 1111 1111 1111 expires soon"
    spans = high_spans(text)
    assert [text[a:b] for a, b in spans] == [key, "4111 1111 1111 1111"]
    assert high_spans("nothing here but otters") == []


@pytest.mark.parametrize("corpus", CORPORA, ids=lambda p: p.stem)
def test_every_high_example_of_the_corpus_no_longer_reads_as_high_once_its_spans_are_replaced(corpus: Path):
    rows = [json.loads(line) for line in corpus.read_text().splitlines() if line.strip()]
    high = [r["text"] for r in rows if r["label"] == "high"]
    assert len(high) > 100
    long_whole = 0
    for text in high:
        spans = high_spans(text)
        assert spans, text[:40]
        assert not reads_as_high(splice(text, spans, "[redacted]"))
        # In a text of a dozen words or more, the secret is located, not the whole text taken.
        long_whole += len(text.split()) >= 12 and spans == [(0, len(text))]
    assert long_whole == 0
