"""BM25 over one user's saved messages, scored inside ClickHouse.

The index is ClickHouse's own (clickhouse_schema/003_saved.sql): ``saved_terms`` holds
one posting per (user, term, doc), a doc being a saved message copy with its text, and
``saved_docs`` one row per saved message copy, both fed by materialized views from inserts into loom.conversations, so
every writer keeps them current. A query reads only its terms' postings, joins them to
the user's live saved rows (which is also where N and avgdl come from), and scores:

    score(d) = sum over query terms t in d of
               idf(t) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))
    idf(t)   = ln(1 + (N - df + 0.5) / (df + 0.5))

with N, df and avgdl computed per query over the corpus searched (the user's live,
saved, not-high messages, or one conversation's). The text is the whole message, not
the 2,048 characters the vector is built from.

Hits are ranked by how many distinct query terms they hold, then by score
(:func:`rank_key`): BM25's length normalisation alone lets a short message holding
three common words of a phrase outrank the long answer that holds the whole phrase deep
inside (a phrase deep in a long saved answer still ranks).

The index is a candidate generator, never the truth: callers re-check hits against
loom.conversations (see loom.store.saved.verify).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from clickhouse_connect.driver.client import Client

from loom.store.rows import named, scalar

K1 = 1.2
B = 0.75
MAX_TERM_CHARS = 64
MAX_QUERY_TERMS = 64

# The tokeniser, as SQL over the expression `{x}`: lowercased runs of characters that
# are not ASCII punctuation, space or control (so letters and digits of any script),
# plus the compounds they form with - _ . / : @ # (a ticket id "inc-48213", a table
# "billing_ledger_v2", a host name), a few Unicode quotes and dashes read as spaces.
# Byte-range classes on purpose: Unicode property classes (\p{L}) cost the engine
# ~20 ms to compile per query and per insert. 003_saved.sql spells the same expression
# out for `content` (tests/conversation/test_saved_index.py checks they match).
_WORD = r"[^\\x00-\\x2f\\x3a-\\x40\\x5b-\\x60\\x7b-\\x7f]+"
_NORMALISED = "translateUTF8(lowerUTF8({x}), '“”‘’«»—–…•·', '           ')"
TERMS = (
    "arrayFilter(t -> length(t) <= " + str(MAX_TERM_CHARS) + ", arrayConcat("
    f"extractAll({_NORMALISED}, '{_WORD}'), "
    f"extractAll({_NORMALISED}, '{_WORD}(?:[-_./:@#]{_WORD})+')))"
)


def terms_sql(expr: str) -> str:
    """The tokeniser applied to the SQL expression `expr`."""
    return TERMS.replace("{x}", expr)


# The same tokeniser in Python, for a search that ranks in the API process with no round
# trip (loom.ops.memory.scan_cache): lowercase, the quotes and dashes read as spaces,
# every word run, then every compound, words longer than MAX_TERM_CHARS *bytes* dropped
# (the server's length() counts bytes). A non-ASCII character is a word character in both
# (the class excludes ASCII punctuation, space and control only).
# tests/memory/test_tokeniser.py holds it equal to the SQL over a varied corpus.
_PY_WORD = r"[^\x00-\x2f\x3a-\x40\x5b-\x60\x7b-\x7f]+"
_PY_SIMPLE = re.compile(_PY_WORD)
_PY_COMPOUND = re.compile(_PY_WORD + r"(?:[-_./:@#]" + _PY_WORD + ")+")
_PY_SPACES = str.maketrans("“”‘’«»—–…•·", " " * 11)


def terms(text: str) -> list[str]:
    """What :data:`TERMS` answers for `text`, in the same order."""
    norm = text.lower().translate(_PY_SPACES)
    found = _PY_SIMPLE.findall(norm) + _PY_COMPOUND.findall(norm)
    return [t for t in found if len(t) <= MAX_TERM_CHARS // 4 or len(t.encode()) <= MAX_TERM_CHARS]


def query_terms_py(query: str) -> list[str]:
    """The query's distinct terms in first-seen order, at most MAX_QUERY_TERMS (what
    `arraySlice(arrayDistinct(TERMS), 1, MAX_QUERY_TERMS)` answers)."""
    return list(dict.fromkeys(terms(query)))[:MAX_QUERY_TERMS]


@dataclass(frozen=True)
class LexicalHit:
    thread_id: str
    msg_id: str
    agent: str
    score: float
    matched: tuple[str, ...]  # the query terms the message holds (for the excerpt)


def rank_key(matched: Sequence[str], score: float) -> tuple[int, float]:
    """Sort key of a lexical hit, best first: more query terms held, then BM25."""
    return (-len(matched), -score)


# Postings of the query's terms (narrow rows: term, doc id, tf), joined to the user's
# live saved rows they belong to (a posting of an older text, or of a row no longer
# saved, finds no partner). N and avgdl come from the same rows in the same pass
# (window functions over `docs`), df from the joined postings.
_SEARCH = f"""
WITH arraySlice(arrayDistinct({terms_sql("{q:String}")}), 1, {MAX_QUERY_TERMS}) AS qterms
SELECT thread_id, msg_id, argMax(agent, score) AS agent, max(score) AS best, argMax(matched, score) AS terms
FROM (
    SELECT any(thread_id) AS thread_id, any(msg_id) AS msg_id, any(agent) AS agent,
           sum(log(1 + (n - df + 0.5) / (df + 0.5)) * tf * ({K1} + 1)
               / (tf + {K1} * (1 - {B} + {B} * dl / avgdl))) AS score,
           groupArray(term) AS matched
    FROM (
        SELECT p.term AS term, p.doc AS doc, p.tf AS tf, d.thread_id AS thread_id, d.msg_id AS msg_id,
               d.agent AS agent, d.doc_len AS dl, d.n AS n, d.avgdl AS avgdl,
               count() OVER (PARTITION BY p.term) AS df
        FROM (
            SELECT term, doc, any(tf) AS tf
            FROM saved_terms
            WHERE namespace = {{ns:String}} AND user_id = {{user:String}} AND has(qterms, term)
            GROUP BY term, doc
        ) AS p
        INNER JOIN (
            SELECT doc, thread_id, msg_id, toString(agent) AS agent, doc_len, count() OVER () AS n,
                   avg(doc_len) OVER () AS avgdl
            FROM saved_docs FINAL
            WHERE namespace = {{ns:String}} AND user_id = {{user:String}} {{thread_filter}}
              AND is_saved AND NOT tombstoned AND NOT high_sensitivity
        ) AS d ON p.doc = d.doc
    )
    GROUP BY doc
)
GROUP BY thread_id, msg_id
ORDER BY length(terms) DESC, best DESC, thread_id, msg_id
LIMIT {{lim:UInt32}}
"""


def search(
    ch: Client, namespace: str, user_id: str, query: str, *, limit: int, thread_id: str | None = None
) -> list[LexicalHit]:
    """The user's saved messages by BM25 of `query`, best first (at most `limit`).
    A message saved under two agents counts once, by its better copy."""
    params: dict[str, Any] = {"ns": namespace, "user": user_id, "q": query, "lim": limit}
    thread_filter = ""
    if thread_id is not None:
        thread_filter = "AND thread_id = {th:String}"
        params["th"] = thread_id
    sql = _SEARCH.replace("{thread_filter}", thread_filter)
    rows = ch.query(sql, parameters=params)
    return [
        LexicalHit(
            thread_id=r["thread_id"],
            msg_id=r["msg_id"],
            agent=r["agent"],
            score=float(r["best"]),
            matched=tuple(r["terms"]),
        )
        for r in named(rows)
        if r["best"] > 0
    ]


def query_terms(ch: Client, texts: Sequence[str]) -> list[list[str]]:
    """How the index tokenises each text (the same SQL): for tests and diagnostics."""
    found = scalar(ch, f"SELECT arrayMap(s -> {terms_sql('s')}, {{ts:Array(String)}})", {"ts": list(texts)})
    return [list(terms) for terms in found]
