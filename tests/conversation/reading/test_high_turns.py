"""conversation.high_turns (admin): the turns that read as high, found without their text."""

from __future__ import annotations

SECRET = "the prod login is password=Tr0ub4dor&3xq"


async def test_lists_high_turns_newest_first_without_their_text(call, mint, ns):
    admin = mint(ns, "admin")
    await call("conversation.set_logging", admin, namespace=ns, enabled=True)
    for thread, content in (("a", SECRET), ("a", "nothing to hide"), ("b", "my SSN is 123-45-6789")):
        r = await call(
            "conversation.append", admin, namespace=ns, thread_id=thread, role="user", content=content
        )
        assert r.json()["stored"] is True
    r = await call("conversation.high_turns", admin, namespace=ns)
    assert r.status_code == 200
    body = r.json()
    assert [(t["thread_id"], t["kinds"][:1], t["saved_only"]) for t in body["turns"]] == [
        ("b", ["ssn"], False),
        ("a", ["password_assignment"], False),
    ]
    assert "Tr0ub4dor" not in r.text and "123-45-6789" not in r.text and body["has_more"] is False
    page = await call("conversation.high_turns", admin, namespace=ns, limit=1, offset=0)
    assert len(page.json()["turns"]) == 1 and page.json()["has_more"] is True


async def test_only_an_admin_may_list_them(call, mint, ns):
    for role in ("viewer", "writer"):
        r = await call("conversation.high_turns", mint(ns, role), namespace=ns)
        assert r.status_code == 403 and r.json()["rule"] == "role"
    bounded = mint(ns, "admin", read_scope="own_user", read_user_id="u1")
    assert (await call("conversation.high_turns", bounded, namespace=ns)).status_code == 403
    bad = await call("conversation.high_turns", mint(ns, "admin"), namespace=ns, limit=0)
    assert bad.status_code == 422 and bad.json()["field"] == "limit"
