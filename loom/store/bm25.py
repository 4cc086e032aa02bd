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

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from clickhouse_connect.driver.client import Client

from loom.store.rows import decoded, named, scalar

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
# out for `content` (tests/conversation/saved/test_saved_index.py checks they match).
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


# -- stems (the transcript's index, clickhouse_schema/016_transcript_terms.sql) --------
#
# A light English stemmer, in SQL and (py_stem) in Python: the transcript's postings are
# written with the Python one (loom.store.transcript_postings) and, for the engine's own
# revisions and bulk loads, with the SQL one (the engine's own `stem()` needs its NLP
# data, which the embedded engine does not ship). Only terms of ASCII letters are stemmed (a compound "inc-48213", a number,
# another script stay as they are), in two passes:
#   1. plurals: -sses/-xes/-ches/-shes/-zzes lose "es", -ies becomes -y (not -aies,
#      -eies), -es otherwise loses "s" (not -aes, -ees, -oes), -s is dropped (not -us,
#      -ss); terms of 3 letters or fewer are kept;
#   2. -ing (7 letters or more) and -ed (6 or more) are dropped, and a doubled final
#      consonant left behind is undone ("running" -> "run", "stopped" -> "stop").
# So "meetings", "meeting" and "meet" share a posting; so may a few unrelated words
# ("evening" -> "even"), which BM25's statistics then weigh as one term.
def _cut(n: int) -> str:
    return f"substring(t, 1, length(t) - {n})"


_DOUBLED = "'(bb|dd|gg|mm|nn|pp|rr|tt)$'"
_PLURAL = (
    "multiIf(length(t) <= 3 OR NOT match(t, '^[a-z]+$'), t, "
    f"endsWith(t, 'sses') OR match(t, '(x|ch|sh|zz)es$'), {_cut(2)}, "
    f"endsWith(t, 'ies') AND NOT match(t, '[ae]ies$'), concat({_cut(3)}, 'y'), "
    f"match(t, '[^aeo]es$'), {_cut(1)}, "
    f"endsWith(t, 's') AND NOT match(t, '(us|ss)$'), {_cut(1)}, t)"
)
_SUFFIX = (
    "multiIf(length(t) <= 5 OR NOT match(t, '^[a-z]+$'), t, "
    f"endsWith(t, 'ing') AND length(t) >= 7, if(match({_cut(3)}, {_DOUBLED}), {_cut(4)}, {_cut(3)}), "
    f"endsWith(t, 'ed'), if(match({_cut(2)}, {_DOUBLED}), {_cut(3)}, {_cut(2)}), t)"
)


def stems_sql(terms: str) -> str:
    """The stems of the SQL array of terms `terms` (see above)."""
    return f"arrayMap(t -> {_SUFFIX}, arrayMap(t -> {_PLURAL}, {terms}))"


def stemmed_terms_sql(expr: str) -> str:
    """The tokeniser, then the stemmer: what the transcript's index holds of a text."""
    return stems_sql(terms_sql(expr))


# English stop-words, dropped from a QUERY's terms (never from the index): "what did I
# say about the dog" looks for "say" and "dog", not for every turn holding "i" and
# "the". A query made of stop-words alone keeps them all (there is nothing else to look
# for). The list is the common function words; it is short on purpose (no "time",
# "new", "like": words a question may really be about).
_STOP_TEXT = """
a about above after again against all am an and any are as at be because been before being below
between both but by can could did do does doing down during each few for from further had has have
having he her here hers herself him himself his how i if in into is it its itself just me more most
my myself no nor not now of off on once only or other our ours ourselves out over own same she should
so some such than that the their theirs them themselves then there these they this those through to
too under until up very was we were what when where which while who whom why will with would you
your yours yourself yourselves s t don didn doesn isn wasn ll ve re d m
"""
STOP_WORDS: tuple[str, ...] = tuple(sorted(set(_STOP_TEXT.split())))


def query_terms_sql(query_param: str, *, stem: bool) -> str:
    """The SQL array of a query's distinct terms: tokenised as the index is, stop-words
    dropped (all kept when nothing else is left), stemmed where the index is, at most
    MAX_QUERY_TERMS. `query_param` is the query's SQL expression; the stop-words are the
    parameter {stop:Array(String)} (:func:`stop_words_param`)."""
    raw = f"arrayDistinct({terms_sql(query_param)})"
    kept = f"arrayFilter(t -> NOT has({{stop:Array(String)}}, t), {raw})"
    chosen = f"if(empty({kept}), {raw}, {kept})"
    out = f"arrayDistinct({stems_sql(chosen)})" if stem else chosen
    return f"arraySlice({out}, 1, {MAX_QUERY_TERMS})"


def stop_words_param() -> list[str]:
    return list(STOP_WORDS)


# -- the same, in Python, for a query -------------------------------------------------
#
# Tokenising a short query in SQL costs the engine ~11 ms of CPU (its regular
# expressions; measured on the 100k-turn bench set), a fifth of a lexical search. The
# transcript's lexical leg therefore computes a query's terms here, by the same rules;
# tests/conversation/reading/test_search_modes.py checks both give the same terms on a varied
# text. The transcript's postings are written with these too (loom.store.transcript_postings),
# and tests/conversation/writing/test_transcript_postings.py holds them equal to the engine's.
_PY_CLASS = r"[^\x00-\x2f\x3a-\x40\x5b-\x60\x7b-\x7f]+"
_PY_WORD = re.compile(_PY_CLASS)
_PY_COMPOUND = re.compile(f"{_PY_CLASS}(?:[-_./:@#]{_PY_CLASS})+")
_PY_SPACES = str.maketrans("“”‘’«»—–…•·", "           ")
_ASCII_WORD = re.compile(r"[a-z]+")
_DOUBLED_PY = re.compile(r"(bb|dd|gg|mm|nn|pp|rr|tt)$")


def py_terms(text: str) -> list[str]:
    """:data:`TERMS`, in Python (the terms of a text, in the engine's order)."""
    t = text.lower().translate(_PY_SPACES)
    found = _PY_WORD.findall(t) + _PY_COMPOUND.findall(t)
    return [x for x in found if len(x.encode()) <= MAX_TERM_CHARS]


def _py_plural(t: str) -> str:
    if len(t) <= 3 or not _ASCII_WORD.fullmatch(t):
        return t
    if t.endswith("sses") or re.search(r"(x|ch|sh|zz)es$", t):
        return t[:-2]
    if t.endswith("ies") and not re.search(r"[ae]ies$", t):
        return t[:-3] + "y"
    if re.search(r"[^aeo]es$", t):
        return t[:-1]
    if t.endswith("s") and not re.search(r"(us|ss)$", t):
        return t[:-1]
    return t


def _py_suffix(t: str) -> str:
    if len(t) <= 5 or not _ASCII_WORD.fullmatch(t):
        return t
    for suffix, min_len in (("ing", 7), ("ed", 0)):
        if t.endswith(suffix) and len(t) >= min_len:
            stem = t[: -len(suffix)]
            return stem[:-1] if _DOUBLED_PY.search(stem) else stem
    return t


@functools.lru_cache(maxsize=1 << 15)
def py_stem(term: str) -> str:
    """:func:`stems_sql` for one term, in Python. Cached: a text's words are mostly a
    small vocabulary, and its regular expressions were most of a flush's postings."""
    return _py_suffix(_py_plural(term))


_STOP = frozenset(STOP_WORDS)


def py_query_terms(query: str, *, stem: bool) -> list[str]:
    """:func:`query_terms_sql`, in Python."""
    raw = list(dict.fromkeys(py_terms(query)))
    chosen = [t for t in raw if t not in _STOP] or raw
    out = list(dict.fromkeys(py_stem(t) for t in chosen)) if stem else chosen
    return out[:MAX_QUERY_TERMS]


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
WITH {query_terms_sql("{q:String}", stem=False)} AS qterms
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
    params: dict[str, Any] = {
        "ns": namespace,
        "user": user_id,
        "q": query,
        "lim": limit,
        "stop": stop_words_param(),
    }
    thread_filter = ""
    if thread_id is not None:
        thread_filter = "AND thread_id = {th:String}"
        params["th"] = thread_id
    sql = _SEARCH.replace("{thread_filter}", thread_filter)
    rows = ch.query(sql, parameters=params)
    return [
        decoded(LexicalHit, r, {"score": "best"}, matched=tuple(r["terms"]))
        for r in named(rows)
        if r["best"] > 0
    ]


def query_terms(ch: Client, texts: Sequence[str]) -> list[list[str]]:
    """How the index tokenises each text (the same SQL): for tests and diagnostics."""
    found = scalar(ch, f"SELECT arrayMap(s -> {terms_sql('s')}, {{ts:Array(String)}})", {"ts": list(texts)})
    return [list(terms) for terms in found]
