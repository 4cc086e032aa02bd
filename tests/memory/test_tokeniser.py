"""The Python tokeniser (loom.store.bm25.py_terms) equals the SQL one the postings are
written with (bm25.TERMS), term for term and in order: a search ranked in the API
process with no round trip must find exactly the terms the server would."""

from __future__ import annotations

from typing import Any

from loom.store import bm25

CORPUS = [
    "",
    "   ",
    "Drinks coffee every morning in Kyoto",
    "inc-48213 billing_ledger_v2 db.prod.example.com user@example.org #general a-b_c.d",
    "a-b_c.d-e:f/g@h#i -leading trailing- ..dots.. a--b a_-_b",
    "path/to/file.txt http://host:8080/x?y=z&w=1",
    "“Quoted” ‘single’ «guillemets» em—dash en–dash ellipsis… bullet•dot·mid",
    "Ünïcödé ÅNGSTRÖM straße İstanbul ΣΊΣΥΦΟΣ Ωμέγα ПРИВЕТ мир",
    "日本語のテキスト 中文 한국어 emoji 🙂 mixed😀text",
    "x" * 64 + " " + "y" * 65 + " " + "é" * 32 + " " + "é" * 33 + " " + "日" * 21 + " " + "日" * 22,
    "a" * 30 + "-" + "b" * 30 + " " + "c" * 40 + "." + "d" * 40,
    "tabs\tand\nnewlines\r\nand\x00nul and \x7f del",
    "numbers 3.14 1,000 2026-12-02 v1.2.3 10:30 ~tilde ^caret `tick` |pipe| [br] {cu} \\back",
    "MiXeD CaSe ÀÉÎÕÜ ǅ ǈ ǋ ﬁ ﬀ Ⅻ ⓐ",
    "apostrophe's don't l'été rock'n'roll",
    "under_score __dunder__ _lead trail_ a__b",
    "a@b@c #tag#tag :colon: a:b:c 1/2/3",
]


def test_python_tokeniser_equals_sql(services: Any) -> None:
    sql = bm25.query_terms(services.ch, CORPUS)
    for text, want in zip(CORPUS, sql, strict=True):
        assert bm25.py_terms(text) == want, text
    # the query's terms: distinct, first seen first, stop-words dropped, at most MAX_QUERY_TERMS
    for query in (" ".join(f"w{i} the w{i}" for i in range(100)), "what did I say", *CORPUS):
        for stem in (False, True):
            ref = services.ch.query(
                f"SELECT {bm25.query_terms_sql('{q:String}', stem=stem)}",
                parameters={"q": query, "stop": bm25.stop_words_param()},
            ).result_rows[0][0]
            assert bm25.py_query_terms(query, stem=stem) == list(ref), (query, stem)
