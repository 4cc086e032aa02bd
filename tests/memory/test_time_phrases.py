"""memory.search's time phrases: a time the question names bounds the facts' validity
(an as-of read for a window with an end, valid_from for a start-only window)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(120)


def _z(ts: str | None) -> str | None:
    return None if ts is None else ts.replace("+00:00", "Z")


async def _ok(call: Any, op: str, token: str, **body: Any) -> dict[str, Any]:
    r = await call(op, token, **body)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


async def _set(call: Any, token: str, ns: str, user: str, *facts: dict[str, Any]) -> None:
    for f in facts:  # one at a time: a key's second fact supersedes its first
        await _ok(call, "memory.set", token, namespace=ns, user_id=user, facts=[f])


async def _search(call: Any, token: str, ns: str, user: str, query: str, **extra: Any) -> dict[str, Any]:
    return await _ok(call, "memory.search", token, namespace=ns, user_id=user, query=query, **extra)


def _texts(got: dict[str, Any]) -> list[str]:
    return [h["text"] for h in got["hits"]]


async def test_a_month_in_the_query_reads_the_facts_as_they_stood_then(call, ns, mint):
    w = mint(ns, "writer")
    await _set(
        call,
        w,
        ns,
        "u1",
        {"text": "Lives in Berlin", "key": "home", "valid_from": "2025-01-01T00:00:00Z"},
        {"text": "Lives in Lisbon", "key": "home", "valid_from": "2025-09-01T00:00:00Z"},
    )
    got = await _search(call, w, ns, "u1", "where she lives in May 2025")
    assert _texts(got) == ["Lives in Berlin"]
    window = got["time_window"]
    assert window["phrase"] == "in May 2025" and window["applied"] and window["since"] is None
    assert _z(window["as_of"]).startswith("2025-05-31T23:59:59.999")  # just before June began
    # "ignore": the words only rank, the current fact answers.
    got = await _search(call, w, ns, "u1", "where she lives in May 2025", time_phrases="ignore")
    assert _texts(got) == ["Lives in Lisbon"] and got["time_window"] is None
    # An explicit as_of wins over the words.
    got = await _search(call, w, ns, "u1", "where she lives in May 2025", as_of="2025-10-01T00:00:00Z")
    assert _texts(got) == ["Lives in Lisbon"] and got["time_window"] is None


async def test_last_week_reads_the_fact_valid_last_week(call, ns, mint):
    w = mint(ns, "writer")
    now = datetime.now(UTC)
    monday = (now - timedelta(days=now.weekday())).replace(hour=0, minute=0, second=0, microsecond=0)
    await _set(
        call,
        w,
        ns,
        "u2",
        {"text": "Works at Acme", "key": "job", "valid_from": (now - timedelta(days=60)).isoformat()},
        {"text": "Works at Globex", "key": "job", "valid_from": monday.isoformat()},
    )
    got = await _search(call, w, ns, "u2", "where she works last week")
    assert _texts(got) == ["Works at Acme"] and got["time_window"]["phrase"] == "last week"
    assert _texts(await _search(call, w, ns, "u2", "where she works")) == ["Works at Globex"]


async def test_a_start_only_window_keeps_the_facts_that_began_since(call, ns, mint):
    w = mint(ns, "writer")
    await _set(
        call,
        w,
        ns,
        "u3",
        {"text": "Plays the piano", "valid_from": "2024-01-01T00:00:00Z"},
        {"text": "Plays the guitar", "valid_from": "2025-04-01T00:00:00Z"},
    )
    got = await _search(call, w, ns, "u3", "plays what since March 2025")
    assert _texts(got) == ["Plays the guitar"]
    window = got["time_window"]
    assert window["as_of"] is None and _z(window["since"]).startswith("2025-03-01T00:00:00")
    got = await _search(call, w, ns, "u3", "plays what since March 2025", time_phrases="ignore")
    assert sorted(_texts(got)) == ["Plays the guitar", "Plays the piano"]


async def test_no_window_for_when_questions_anchors_or_an_empty_window(call, ns, mint):
    w = mint(ns, "writer")
    await _set(
        call,
        w,
        ns,
        "u4",
        {"text": "Lives in Berlin", "key": "home", "valid_from": "2025-01-01T00:00:00Z"},
        {"text": "Lives in Lisbon", "key": "home", "valid_from": "2025-09-01T00:00:00Z"},
    )
    for query in ("when did she live in Lisbon in May 2025", "where she lives before the move"):
        got = await _search(call, w, ns, "u4", query)
        assert _texts(got) == ["Lives in Lisbon"] and got["time_window"] is None, query
    # Nothing held in 1999: the search answers without the window, and says so.
    got = await _search(call, w, ns, "u4", "where she lives in 1999")
    assert _texts(got) == ["Lives in Lisbon"]
    assert got["time_window"]["phrase"] == "in 1999" and not got["time_window"]["applied"]


async def test_time_phrases_takes_filter_or_ignore(call, ns, mint):
    w = mint(ns, "writer")
    r = await call("memory.search", w, namespace=ns, user_id="u5", query="x last week", time_phrases="boost")
    assert r.status_code == 422 and r.json()["field"] == "time_phrases", r.text
