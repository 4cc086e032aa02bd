"""Facts that know time: validity, supersession (memory.set on a key, an extraction's
UPDATE over the stand-in LLM), as_of reads, memory.history, and forgetting a chain."""

from __future__ import annotations

from typing import Any

import pytest

from loom.ops.memory.validity import stated_times
from tests.memory.conftest import api_over
from tests.memory.test_extraction import Model, _by_text, _svc
from tests.providers.standin import StandInServer

pytestmark = pytest.mark.timeout(120)

JAN, MAR, JUN, SEP = (
    "2026-01-01T00:00:00Z",
    "2026-03-01T00:00:00Z",
    "2026-06-01T00:00:00Z",
    "2026-09-01T00:00:00Z",
)


def _z(ts: str) -> str:
    return ts.replace("+00:00", "Z")


async def _ok(call: Any, op: str, token: str, **body: Any) -> dict[str, Any]:
    r = await call(op, token, **body)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


async def test_a_key_set_again_supersedes_and_as_of_answers_the_old_fact(call, ns, mint):
    w = mint(ns, "writer")
    first = (
        await _ok(
            call,
            "memory.set",
            w,
            namespace=ns,
            user_id="u1",
            facts=[{"text": "Lives in Berlin", "key": "home", "valid_from": JAN}],
        )
    )["results"][0]
    second = (
        await _ok(
            call,
            "memory.set",
            w,
            namespace=ns,
            user_id="u1",
            facts=[{"text": "Lives in Lisbon", "key": "home", "valid_from": JUN}],
        )
    )["results"][0]
    old, new = first["memory_id"], second["memory_id"]
    assert new != old and second["supersedes"] == old and second["updated"]
    # By default: the current fact only.
    hits = (await _ok(call, "memory.search", w, namespace=ns, user_id="u1", query="lives"))["hits"]
    assert [(h["text"], h["supersedes"], h["superseded_by"]) for h in hits] == [
        ("Lives in Lisbon", old, None)
    ]
    assert _z(hits[0]["valid_from"]).startswith("2026-06-01T00:00:00") and hits[0]["valid_until"] is None
    facts = (await _ok(call, "memory.list", w, namespace=ns, user_id="u1"))["facts"]
    assert [f["memory_id"] for f in facts] == [new]
    # As of March: the old fact, closed where the new one began.
    for op, extra in (("memory.search", {"query": "lives"}), ("memory.list", {})):
        got = await _ok(call, op, w, namespace=ns, user_id="u1", as_of=MAR, **extra)
        rows = got.get("hits", got.get("facts"))
        assert [(f["text"], f["superseded_by"]) for f in rows] == [("Lives in Berlin", new)], op
        assert _z(rows[0]["valid_until"]).startswith("2026-06-01T00:00:00")
    # Before anything was true: nothing; after: the new one.
    assert (await _ok(call, "memory.list", w, namespace=ns, user_id="u1", as_of="2025-01-01T00:00:00Z"))[
        "facts"
    ] == []
    got = await _ok(call, "memory.list", w, namespace=ns, user_id="u1", as_of=SEP)
    assert [f["memory_id"] for f in got["facts"]] == [new]
    # The chain, oldest first, from either end.
    for mid in (old, new):
        chain = (await _ok(call, "memory.history", w, namespace=ns, user_id="u1", memory_id=mid))["chain"]
        assert [(c["memory_id"], c["text"], c["current"]) for c in chain] == [
            (old, "Lives in Berlin", False),
            (new, "Lives in Lisbon", True),
        ]
        assert chain[0]["source"] == "set" and chain[1]["supersedes"] == old


async def test_an_extraction_update_supersedes_and_a_delete_closes_at_the_evidence_time(
    make_svc, ns, mint, services
):
    w = mint(ns, "writer")
    with StandInServer() as srv:
        async with api_over(_svc(make_svc, srv)) as call:
            await _ok(
                call,
                "memory.set",
                w,
                namespace=ns,
                user_id="u1",
                facts=[
                    {"text": "Lives in Berlin", "valid_from": JAN},
                    {"text": "Drinks coffee every morning", "valid_from": JAN},
                ],
            )
            ids = {
                f["text"]: f["memory_id"]
                for f in (await _ok(call, "memory.list", w, namespace=ns, user_id="u1"))["facts"]
            }
            srv.chat_reply = Model(
                ["Lives in Lisbon", "Does not drink coffee"],
                lambda existing, new: [
                    {"event": "UPDATE", "id": _by_text(existing, "Berlin"), "text": "Lives in Lisbon"},
                    {"event": "DELETE", "id": _by_text(existing, "coffee")},
                ],
            )
            said = "2026-05-01T10:00:00Z"
            body = await _ok(
                call,
                "memory.set_from_messages",
                w,
                namespace=ns,
                user_id="u1",
                messages=[{"role": "user", "content": "I moved to Lisbon and quit coffee.", "ts": said}],
            )
            update = next(d for d in body["decisions"] if d["action"] == "update")
            assert (
                update["supersedes"] == ids["Lives in Berlin"] and update["memory_id"] != update["supersedes"]
            )
            # Now: Lisbon only (the coffee fact is closed, the Berlin one superseded).
            facts = (await _ok(call, "memory.list", w, namespace=ns, user_id="u1"))["facts"]
            assert [f["text"] for f in facts] == ["Lives in Lisbon"]
            assert _z(facts[0]["valid_from"]).startswith("2026-05-01T10:00:00")
            assert facts[0]["evidence_ids"] == body["evidence_ids"]
            # Before the message: Berlin and coffee, each closed at the message's time.
            before = await _ok(call, "memory.list", w, namespace=ns, user_id="u1", as_of=MAR)
            got = {f["text"]: f for f in before["facts"]}
            assert set(got) == {"Lives in Berlin", "Drinks coffee every morning"}
            assert all(_z(f["valid_until"]).startswith("2026-05-01T10:00:00") for f in got.values())
            assert got["Lives in Berlin"]["superseded_by"] == update["memory_id"]
            assert got["Drinks coffee every morning"]["superseded_by"] is None
            hits = (
                await _ok(call, "memory.search", w, namespace=ns, user_id="u1", query="Berlin", as_of=MAR)
            )["hits"]
            assert [h["text"] for h in hits] == ["Lives in Berlin"]
            assert (await _ok(call, "memory.search", w, namespace=ns, user_id="u1", query="Berlin"))[
                "hits"
            ] == []
            chain = (
                await _ok(
                    call, "memory.history", w, namespace=ns, user_id="u1", memory_id=update["memory_id"]
                )
            )["chain"]
            assert [(c["text"], c["source"], c["current"]) for c in chain] == [
                ("Lives in Berlin", "set", False),
                ("Lives in Lisbon", "extraction", True),
            ]
            closed = (
                await _ok(
                    call,
                    "memory.history",
                    w,
                    namespace=ns,
                    user_id="u1",
                    memory_id=ids["Drinks coffee every morning"],
                )
            )["chain"]
            assert [(c["text"], c["current"]) for c in closed] == [("Drinks coffee every morning", False)]


async def test_validity_comes_from_the_evidence_time_and_stated_times(make_svc, ns, mint):
    w = mint(ns, "writer")
    with StandInServer() as srv:
        srv.chat_reply = Model(["Plays the cello", "Works at Acme since 2024-01-15"])
        async with api_over(_svc(make_svc, srv)) as call:
            await _ok(
                call,
                "memory.set_from_messages",
                w,
                namespace=ns,
                user_id="u1",
                messages=[
                    {"role": "user", "content": "I play the cello.", "ts": "2025-03-04T08:00:00Z"},
                    {
                        "role": "user",
                        "content": "I have worked at Acme since January.",
                        "ts": "2025-03-05T09:30:00Z",
                    },
                ],
            )
            got = {
                f["text"]: f
                for f in (
                    await _ok(
                        call, "memory.list", w, namespace=ns, user_id="u1", as_of="2025-06-01T00:00:00Z"
                    )
                )["facts"]
            }
    assert _z(got["Plays the cello"]["valid_from"]).startswith("2025-03-05T09:30:00")  # the newest message
    assert _z(got["Works at Acme since 2024-01-15"]["valid_from"]).startswith("2024-01-15T00:00:00")
    # memory.set: a stated end; the default start is when it was set.
    async with api_over(make_svc()) as call:
        r = await _ok(
            call,
            "memory.set",
            w,
            namespace=ns,
            user_id="u2",
            facts=[{"text": "Rents a flat in Porto until 2099-06-30"}, {"text": "Born on 1990-05-04"}],
        )
        facts = {
            f["text"]: f for f in (await _ok(call, "memory.list", w, namespace=ns, user_id="u2"))["facts"]
        }
    assert _z(facts["Rents a flat in Porto until 2099-06-30"]["valid_until"]).startswith("2099-06-30")
    born = facts["Born on 1990-05-04"]
    assert born["valid_until"] is None and born["valid_from"] == born["created_at"]  # a bare date is an event
    assert all(x["stored"] for x in r["results"])


def test_stated_times_need_a_marker_and_an_iso_date() -> None:
    assert stated_times("Lives in Lisbon since 2026-03-01")[0] is not None
    assert stated_times("Moved invoices to the new ledger on 2026-11-30") == (None, None)
    start, end = stated_times("On leave from work since 2026-07-01 until 2026-06-01")
    assert start is not None and end is None  # an end before the start is not taken
    assert stated_times("since 2026-13-45") == (None, None)


async def test_memory_delete_forgets_the_whole_chain(call, ns, mint, services):
    w = mint(ns, "writer")
    ids = []
    for text in ("Lives in Berlin", "Lives in Lisbon", "Lives in Porto"):
        out = await _ok(
            call, "memory.set", w, namespace=ns, user_id="u1", facts=[{"text": text, "key": "home"}]
        )
        ids.append(out["results"][0]["memory_id"])
    chain = (await _ok(call, "memory.history", w, namespace=ns, user_id="u1", memory_id=ids[1]))["chain"]
    assert [c["memory_id"] for c in chain] == ids
    out = await _ok(call, "memory.delete", w, namespace=ns, user_id="u1", memory_ids=[ids[2]])
    assert out["deleted"] == [ids[2]] and sorted(out["forgotten"]) == sorted(ids)
    for mid in ids:
        r = await call("memory.history", w, namespace=ns, user_id="u1", memory_id=mid)
        assert r.status_code == 404 and r.json()["field"] == "memory_id"
    for as_of in (None, "2000-01-01T00:00:00Z"):
        extra = {"as_of": as_of} if as_of else {}
        assert (await _ok(call, "memory.list", w, namespace=ns, user_id="u1", **extra))["facts"] == []
    # No version keeps its text.
    rows = services.ch.query(
        "SELECT text, tombstoned FROM memories FINAL WHERE namespace = {ns:String} AND user_id = 'u1'",
        parameters={"ns": ns},
    ).result_rows
    assert len(rows) == 3 and all(text == "" and gone for text, gone in rows)
    # The key starts a new chain.
    out = await _ok(
        call, "memory.set", w, namespace=ns, user_id="u1", facts=[{"text": "Lives in Faro", "key": "home"}]
    )
    chain = (
        await _ok(
            call, "memory.history", w, namespace=ns, user_id="u1", memory_id=out["results"][0]["memory_id"]
        )
    )["chain"]
    assert [c["text"] for c in chain] == ["Lives in Faro"]


async def test_history_roles_scopes_and_validation(call, ns, mint):
    w = mint(ns, "writer")
    out = await _ok(
        call, "memory.set", w, namespace=ns, user_id="alice", facts=[{"text": "Has a cat", "key": "pet"}]
    )
    mid = out["results"][0]["memory_id"]
    viewer = mint(ns, "viewer")
    alice = mint(ns, "viewer", read_scope="own_user", read_user_id="alice")
    bob = mint(ns, "viewer", read_scope="own_user", read_user_id="bob")
    assert (
        await call("memory.history", viewer, namespace=ns, user_id="alice", memory_id=mid)
    ).status_code == 200
    assert (await call("memory.history", alice, namespace="@me", memory_id=mid)).status_code == 200
    r = await call("memory.history", bob, namespace=ns, user_id="alice", memory_id=mid)
    assert r.status_code == 403 and r.json()["field"] == "user_id"
    r = await call("memory.history", bob, namespace="@me", memory_id=mid)
    assert r.status_code == 404  # bob has no such fact
    r = await call("memory.search", alice, namespace="@me", query="cat", as_of="last tuesday")
    assert r.status_code == 422 and r.json()["field"] == "as_of"
    r = await call("memory.list", w, namespace=ns, user_id="alice", as_of="2026-02-30T00:00:00Z")
    assert r.status_code == 422 and r.json()["field"] == "as_of"
    r = await call(
        "memory.set",
        w,
        namespace=ns,
        user_id="alice",
        facts=[{"text": "Has a dog", "valid_from": JUN, "valid_until": JAN}],
    )
    assert r.status_code == 422 and r.json()["field"] == "facts[0].valid_until"
    assert r.json()["rule"] == "after_valid_from"
