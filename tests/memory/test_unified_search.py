"""search: one query answered in `memory` and `conversation` sections."""

from __future__ import annotations

from loom.store import namespaces, recording_cache


async def test_sections_for_a_namespace_token_and_an_own_user_token(call, ns, mint, services, arq_worker):
    w = mint(ns, "writer")
    namespaces.update(services.ch, ns, conversation_logging_enabled=True)
    await services.redis.delete(recording_cache.key(ns))
    await call(
        "memory.set", w, namespace=ns, user_id="u1", facts=[{"text": "Plans a trip to Kyoto in April"}]
    )
    r = await call(
        "conversation.append",
        w,
        namespace=ns,
        thread_id="t1",
        role="user",
        user_id="u1",
        content="Plans a trip to Kyoto in April",
    )
    assert r.status_code == 200, r.text
    r = await call(
        "session.brief_save", w, namespace=ns, brief_key="kyoto", sections={"goal": "Kyoto trip in April"}
    )
    assert r.status_code == 200, r.text

    body = (await call("search", w, namespace=ns, query="Kyoto trip April", user_id="u1")).json()
    assert [h["text"] for h in body["memory"]["hits"]] == ["Plans a trip to Kyoto in April"]
    assert [h["thread_id"] for h in body["conversation"]["hits"]] == ["t1"]
    # Without a user, memory (per user) is not searched.
    body = (await call("search", w, namespace=ns, query="Kyoto trip April")).json()
    assert body["memory"] == {"hits": [], "note": "no_user"}
    # A token pinned to the user: its memory, never threads.
    me = mint(ns, "viewer", read_scope="own_user", read_user_id="u1")
    body = (await call("search", me, namespace="@me", query="Kyoto trip April")).json()
    assert [h["text"] for h in body["memory"]["hits"]] == ["Plans a trip to Kyoto in April"]
    assert body["conversation"] == {"hits": [], "note": "not_permitted"}
