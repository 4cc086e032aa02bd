"""Writing the transcript's BM25 postings (``conversation_terms``, the index of
conversation.search's lexical leg; loom.store.transcript_terms reads it).

Every transcript insert writes its turns' postings first, tokenised here in Python
(:func:`loom.store.bm25.py_terms` and :func:`~loom.store.bm25.py_stem`, held equal to the
engine's expressions by a test). Migration 016 first kept them with a materialized view,
which ran the same tokeniser and stemmer as SQL expressions on every insert: that tripled
an append flush's insert (32 turns: about 40 ms without the view, 130 ms with it, under
load; the regular expressions per term cost most of it), while the same work in Python
costs a few milliseconds. Migration 019 drops the view.

Postings go in before the turns: a posting whose turn never landed (a crash between the
two inserts) is harmless, because the index only proposes and every candidate is checked
against the newest transcript row; a turn that landed without postings could never be
found by the lexical leg.

What enters is what the view let in: only a live recorded user or assistant turn or a
compaction summary that is not high. A high turn's terms are never stored. One row per
(namespace, term, document), plus the document's empty-term posting carrying its length
statistics and the text's first 2,048 characters (a hit's excerpt). A document is one
agent's copy of a turn with its text: ``cityHash64(thread_id, msg_id, agent, content)``,
computed here with ClickHouse's own CityHash (v1.0.2) and its way of combining the hashes
of several arguments.

Revisions the engine writes itself (a save claiming a turn, a saved-only turn becoming
recorded: loom.store.saved) rewrite their one row's postings with :func:`rewrite` in SQL,
from the newest transcript row, with the engine's own tokeniser.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

from clickhouse_cityhash.cityhash import CityHash64
from clickhouse_connect.driver.client import Client

from loom.store import bm25
from loom.store.clickhouse import insert_settings
from loom.store.rows import column, table, table_row
from loom.store.transcript_terms import HEAD_CHARS


class Turn(Protocol):
    """What the postings read of a transcript row (loom.store.conversations.Turn, whose
    module imports this one)."""

    # Whether the lexical leg covers it (:func:`indexed`).
    role: str
    is_summary: bool
    origin: str
    tombstoned: bool
    high_sensitivity: bool
    # What it indexes (:func:`indexed_text`); the content is also the excerpt and in the document id.
    content: str
    metadata: dict[str, Any]
    # What every posting of it copies (:data:`_PER_TURN`, the role too).
    namespace: str
    agent: str
    thread_id: str
    msg_id: str
    run_id: str
    user_id: str
    ts: datetime
    version: int


_INDEXED_ROLES = ("user", "assistant")
# How much of ``metadata.speaker`` is indexed: a name, not a paragraph smuggled in.
SPEAKER_CHARS = 64


@table_row
class Posting:
    """A row of loom.conversation_terms."""

    namespace: str = column("LowCardinality(String)")
    term: str = column("String")
    doc: int = column("UInt64")
    tf: int = column("UInt32")
    doc_len: int = column("UInt32")
    agent: str = column("LowCardinality(String)")
    thread_id: str = column("String")
    msg_id: str = column("String")
    role: str = column("LowCardinality(String)")
    run_id: str = column("String")
    user_id: str = column("String")
    ts: datetime = column("DateTime64(6, 'UTC')")
    head: str = column("String")
    version: int = column("UInt64")


TABLE = table("conversation_terms", Posting)

_MASK = (1 << 64) - 1
_K_MUL = 0x9DDFEA08EB382D69


def _hash128_to_64(low: int, high: int) -> int:
    a = ((low ^ high) * _K_MUL) & _MASK
    a ^= a >> 47
    b = ((high ^ a) * _K_MUL) & _MASK
    b ^= b >> 47
    return (b * _K_MUL) & _MASK


def city_hash64(*parts: str) -> int:
    """The engine's ``cityHash64(parts...)``: each string's CityHash64, folded left by
    CityHash's Hash128to64 (a test compares it with the engine's)."""
    h: int = CityHash64(parts[0].encode())
    for part in parts[1:]:
        h = _hash128_to_64(h, CityHash64(part.encode()))
    return h


def indexed(turn: Turn) -> bool:
    """Whether the lexical leg covers the turn (the condition migration 016's view had)."""
    return (
        not turn.tombstoned
        and not turn.high_sensitivity
        and turn.origin == "recorded"
        and (turn.role in _INDEXED_ROLES or turn.is_summary)
    )


def speaker_of(metadata: dict[str, Any] | None) -> str:
    """The speaker's name a turn's metadata gives: the first :data:`SPEAKER_CHARS`
    characters of ``metadata.speaker`` when it is a string ('' otherwise: another type
    is ignored). :data:`SPEAKER_SQL` is its twin in the engine."""
    speaker = metadata.get("speaker") if isinstance(metadata, dict) else None
    return speaker[:SPEAKER_CHARS] if isinstance(speaker, str) else ""


# JSONExtractString alone would give a number's digits: hence the JSONType check.
SPEAKER_SQL = (
    "if(JSONType(metadata, 'speaker') = 'String', "
    f"leftUTF8(JSONExtractString(metadata, 'speaker'), {SPEAKER_CHARS}), '')"
)


def indexed_text(turn: Turn) -> str:
    """What the lexical leg reads of a turn: its content, behind its speaker's name
    (:func:`speaker_of`) when it has one (questions name speakers: "What did Caroline
    say about ..."; the turns seldom repeat their own speaker's name). The excerpt
    (``head``) and the document id stay the content's alone."""
    speaker = speaker_of(turn.metadata)
    return f"{speaker} {turn.content}" if speaker else turn.content


def columns(turns: Sequence[Turn]) -> dict[str, list[Any]]:
    """The postings of the `turns` the lexical leg covers, column by column (one row per
    distinct term of a text, after its empty-term posting): built in bulk, since a flush
    of 32 turns has about 1,400 of them."""
    cols: dict[str, list[Any]] = {name: [] for name in TABLE.insert_names}
    for turn in turns:
        if not indexed(turn):
            continue
        terms = bm25.py_terms(indexed_text(turn))
        counted: Counter[str] = Counter()
        for term, n in Counter(terms).items():
            counted[bm25.py_stem(term)] += n
        n = len(counted) + 1
        cols["term"] += ["", *counted.keys()]
        cols["tf"] += [1, *counted.values()]
        cols["head"] += [turn.content[:HEAD_CHARS], *([""] * (n - 1))]
        cols["doc"] += [city_hash64(turn.thread_id, turn.msg_id, turn.agent, turn.content)] * n
        cols["doc_len"] += [len(terms)] * n
        for name in _PER_TURN:
            cols[name] += [getattr(turn, name)] * n
    return cols


# What every posting of a turn copies from it.
_PER_TURN = ("namespace", "agent", "thread_id", "msg_id", "role", "run_id", "user_id", "ts", "version")


def insert(ch: Client, turns: Sequence[Turn], *, dedup_token: str = "") -> None:
    """One INSERT of the postings of the `turns` the lexical leg covers (none for the
    rest). A retry with the same token cannot double its rows."""
    cols = columns(turns)
    if not cols["term"]:
        return
    token = f"{dedup_token}-terms" if dedup_token else ""
    TABLE.insert_columns(ch, cols, settings=insert_settings(ch, len(cols["term"]), (), token))


# The postings of transcript rows, written by the engine from the rows themselves (the
# statement migration 016's view ran on every insert, plus the speaker of
# :func:`indexed_text`),
# for the rows `where` names.
def _postings_select(where: str) -> str:
    return f"""
SELECT namespace, posting.1 AS term, doc, posting.2 AS tf, dl AS doc_len, agent, thread_id, msg_id, role, run_id,
       user_id, ts, posting.3 AS head, version
FROM (
    SELECT namespace, agent, thread_id, msg_id, role, run_id, user_id, ts, version,
           cityHash64(thread_id, msg_id, agent, content) AS doc,
           {SPEAKER_SQL} AS speaker,
           {bm25.stemmed_terms_sql("if(speaker = '', content, concat(speaker, ' ', content))")} AS terms,
           toUInt32(length(terms)) AS dl,
           arrayReduce('sumMap', [terms], [arrayMap(t -> toUInt32(1), terms)]) AS counted,
           arrayConcat([('', toUInt32(1), leftUTF8(content, {HEAD_CHARS}))],
                        arrayMap((t, n) -> (t, n, ''), counted.1, counted.2)) AS postings
    FROM conversations FINAL
    WHERE {where} AND NOT tombstoned AND NOT high_sensitivity AND origin = 'recorded'
      AND (role IN ('user', 'assistant') OR is_summary)
)
ARRAY JOIN postings AS posting
"""


_INSERT = f"INSERT INTO conversation_terms ({', '.join(TABLE.insert_names)}) "
_KEY = "namespace = {ns:String} AND agent = {ag:String} AND thread_id = {th:String} AND msg_id = {m:String}"
TRANSCRIPT_POSTINGS = _postings_select(_KEY)  # one turn copy's (tests compare it with :func:`columns`)


def rewrite(ch: Client, key: tuple[str, str, str, str]) -> None:
    """Write the postings of one turn's newest transcript row (ns, agent, thread, msg),
    if the lexical leg covers it, with that row's version and owner."""
    ch.command(
        _INSERT + TRANSCRIPT_POSTINGS, parameters={"ns": key[0], "ag": key[1], "th": key[2], "m": key[3]}
    )


def backfill(ch: Client, namespace: str) -> None:
    """Write the postings of every transcript row of `namespace`, in the engine: for rows
    a bulk load wrote straight into loom.conversations (its postings are then exactly
    what :func:`insert` would have written)."""
    ch.command(_INSERT + _postings_select("namespace = {ns:String}"), parameters={"ns": namespace})
