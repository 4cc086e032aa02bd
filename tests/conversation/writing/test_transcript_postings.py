"""The transcript's postings are written in Python by every transcript insert
(loom.store.transcript_postings): they must be exactly the rows the engine's own
tokeniser, stemmer and hash write (migration 016's statement, kept for revisions), or
the lexical leg would miss turns or fail their check against the transcript."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any

from loom.clock import next_version
from loom.store import conversations as conv_store
from loom.store import transcript_postings
from loom.store.rows import named
from tests.memory.test_tokeniser import CORPUS

_COMPARED = (
    "term",
    "doc",
    "tf",
    "doc_len",
    "agent",
    "thread_id",
    "msg_id",
    "role",
    "run_id",
    "user_id",
    "head",
)


def _engine_postings(ch: Any, key: tuple[str, str, str, str]) -> list[tuple[Any, ...]]:
    rows = ch.query(
        transcript_postings.TRANSCRIPT_POSTINGS,
        parameters={"ns": key[0], "ag": key[1], "th": key[2], "m": key[3]},
    )
    return sorted(tuple(r[c] for c in _COMPARED) for r in named(rows))


def _python_postings(turn: conv_store.Turn) -> list[tuple[Any, ...]]:
    cols = transcript_postings.columns([turn])
    return sorted(zip(*(cols[c] for c in _COMPARED), strict=True))


def test_city_hash_equals_the_engines(services: Any) -> None:
    rnd = random.Random(5)
    alphabet = "abc xyz-_.'\\\"\n\tÉé日本🙂\x00"
    cases = [("", "", "", ""), ("t", "m", "a", "x" * 5000)]
    cases += [
        tuple("".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 90))) for _ in range(4))
        for _ in range(60)
    ]
    for parts in cases:
        got = services.ch.query(
            "SELECT cityHash64({a:String}, {b:String}, {c:String}, {d:String}) AS h",
            parameters=dict(zip("abcd", parts, strict=True)),
        )
        assert int(next(named(got))["h"]) == transcript_postings.city_hash64(*parts), parts


def test_python_postings_equal_the_engines(services: Any, ns: str) -> None:
    texts = [*CORPUS, "Running runs ran; the dogs' shoes were stopped, hopping and hoped " * 3, "é" * 3000]
    turns = [
        conv_store.Turn(
            namespace=ns,
            agent="default" if i % 3 else "other",
            thread_id=f"t{i % 4}",
            msg_id=f"m{i}",
            ts=datetime.now(UTC),
            role="user" if i % 2 else "assistant",
            content=text,
            user_id="u1" if i % 5 == 0 else "",
            run_id="r1" if i % 7 == 0 else "",
            version=next_version(),
        )
        for i, text in enumerate(texts)
    ]
    conv_store.insert(services.ch, turns)
    for turn in turns:
        assert _python_postings(turn) == _engine_postings(services.ch, turn.key), turn.content[:40]


# metadata.speaker: a string is indexed (its first 64 characters), anything else is not.
SPEAKERS: list[Any] = [
    "Caroline",
    "Zoë O'Brien-Smith",
    '日本 🙂 "quoted" \\ back',
    "Melanie " * 20,  # past 64 characters
    "",
    "   ",
    7,
    None,
    ["Caroline"],
    {"name": "Caroline"},
    True,
]


def test_python_postings_equal_the_engines_with_a_speaker(services: Any, ns: str) -> None:
    turns = [
        conv_store.Turn(
            namespace=ns,
            agent="default",
            thread_id="t",
            msg_id=f"s{i}",
            ts=datetime.now(UTC),
            role="user",
            content="I went to the support group yesterday",
            metadata={"speaker": speaker, "other": "Zanzibar"},
            version=next_version(),
        )
        for i, speaker in enumerate(SPEAKERS)
    ]
    conv_store.insert(services.ch, turns)
    for turn in turns:
        assert _python_postings(turn) == _engine_postings(services.ch, turn.key), turn.metadata
    by_id = {t.msg_id: _python_postings(t) for t in turns}
    terms = {msg_id: {row[0] for row in rows} for msg_id, rows in by_id.items()}
    content_only = terms["s4"]  # the empty speaker
    assert terms["s0"] == content_only | {"caroline"}
    assert all(terms[f"s{i}"] == content_only for i in range(4, len(SPEAKERS)))
    assert "zanzibar" not in content_only  # only the speaker key is read
    lengths = {msg_id: rows[0][3] for msg_id, rows in by_id.items()}
    assert lengths["s0"] == lengths["s4"] + 1 and lengths["s3"] == lengths["s4"] + 8  # 64 characters: 8 names
    # The excerpt and the document id stay the content's alone.
    for t in turns:
        rows = by_id[t.msg_id]
        assert {row[-1] for row in rows} == {"", t.content}
        assert {row[1] for row in rows} == {
            transcript_postings.city_hash64(t.thread_id, t.msg_id, t.agent, t.content)
        }
    rewritten = _engine_postings(services.ch, turns[0].key)
    transcript_postings.rewrite(services.ch, turns[0].key)
    assert _engine_postings(services.ch, turns[0].key) == rewritten


def test_only_what_the_lexical_leg_covers_gets_postings(services: Any, ns: str) -> None:
    def turn(msg_id: str, **kw: Any) -> conv_store.Turn:
        base: dict[str, Any] = {"role": "user", "content": f"plain words of {msg_id}"}
        return conv_store.Turn(
            namespace=ns, agent="default", thread_id="t", msg_id=msg_id, ts=datetime.now(UTC),
            version=next_version(), **{**base, **kw},
        )  # fmt: skip

    turns = [
        turn("user"),
        turn("summary", role="system", is_summary=True),
        turn("tool", role="tool"),
        turn("system", role="system"),
        turn("high", high_sensitivity=True),
        turn("saved", origin=conv_store.SAVED_ONLY),
        turn("gone", tombstoned=True),
    ]
    conv_store.insert(services.ch, turns)
    rows = services.ch.query(
        "SELECT DISTINCT msg_id FROM conversation_terms WHERE namespace = {ns:String} ORDER BY msg_id",
        parameters={"ns": ns},
    )
    assert [r["msg_id"] for r in named(rows)] == ["summary", "user"]
    for t in turns:
        assert _python_postings(t) == _engine_postings(services.ch, t.key)
