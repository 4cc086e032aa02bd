"""The dashboard in a real browser (Debian's Chromium, driven by Playwright) against a
real `loom serve`: each flow a person follows, and a screenshot of each page."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.dashboard.conftest import sign_in

pytestmark = pytest.mark.usefixtures("arq_worker")


async def _append(call: Any, token: str, ns: str, thread: str, content: str, **extra: Any) -> dict[str, Any]:
    r = await call(
        "conversation.append", token, namespace=ns, thread_id=thread, role="user", content=content, **extra
    )
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


async def test_sign_in_and_out(desktop, mint, ns, shots):
    page = desktop
    await page.goto("/dashboard/conversations")
    assert page.url.endswith("/dashboard/signin")  # no token, no page
    await page.screenshot(path=shots / "signin.png")
    await sign_in(page, "loom_not_a_token")
    assert (
        await page.locator(".problem").inner_text()
        == "That token is not valid (unknown, revoked or expired)."
    )
    await sign_in(page, mint(ns, "admin"))
    assert page.url.endswith("/dashboard/conversations")
    cookie = next(c for c in await page.context.cookies() if c["name"] == "loom_dashboard")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["expires"] == -1  # session only
    assert cookie["value"] not in await page.content()  # the token never enters a page
    await page.click("text=Sign out")
    assert page.url.endswith("/dashboard/signin")
    assert not [c for c in await page.context.cookies() if c["name"] == "loom_dashboard"]
    await page.goto("/dashboard/conversations")
    assert page.url.endswith("/dashboard/signin")


async def test_record_switch_changes_what_appends_keep(desktop, mint, ns, call, shots):
    token = mint(ns, "admin")
    before = await _append(call, token, ns, "th-rec", "kept only once recording is on")
    assert before["stored"] is False and before["reason"] == "logging_disabled"
    page = desktop
    await sign_in(page, token)
    assert await page.locator("#record-state").inner_text() == "off — nothing is kept"
    switch = page.locator("#record-switch")
    assert await switch.get_attribute("aria-checked") == "false"
    await page.screenshot(path=shots / "conversations-recording-off.png", full_page=True)
    await switch.click()
    await page.wait_for_load_state()
    assert await page.locator("#record-state").inner_text() == "on — appends are stored"
    assert await page.locator("#record-switch").get_attribute("aria-checked") == "true"
    after = await _append(call, token, ns, "th-rec", "kept now that recording is on")
    assert after["stored"] is True and after["reason"] is None


async def test_keyboard_reaches_the_switch(desktop, mint, ns):
    page = desktop
    await sign_in(page, mint(ns, "admin"))
    for _ in range(40):
        await page.keyboard.press("Tab")
        if await page.evaluate("document.activeElement && document.activeElement.id") == "record-switch":
            break
    else:
        pytest.fail("Tab never reached the Record conversations switch")
    await page.keyboard.press("Enter")
    await page.wait_for_load_state()
    assert await page.locator("#record-state").inner_text() == "on — appends are stored"


async def test_titled_thread_opens_with_its_turns(desktop, mint, ns, call, shots):
    token = mint(ns, "admin")
    assert (await call("conversation.set_logging", token, namespace=ns, enabled=True)).status_code == 200
    r = await call(
        "conversation.create", token, namespace=ns, thread_id="th-title", title="Ledger migration plan"
    )
    assert r.status_code == 200, r.text
    await _append(call, token, ns, "th-title", "We moved invoices to the new ledger.")
    await _append(call, token, ns, "th-plain", "An untitled thread, led by its excerpt.")
    page = desktop
    await sign_in(page, token)
    rows = page.locator("#threads tbody tr")
    assert await rows.count() == 2
    assert "An untitled thread, led by its excerpt." in await rows.nth(0).inner_text()  # newest first
    await page.screenshot(path=shots / "conversations.png", full_page=True)
    await page.click("text=Ledger migration plan")
    await page.wait_for_load_state()
    assert await page.locator("h1").inner_text() == "Ledger migration plan"
    turn = page.locator("#turns li").first
    text = await turn.inner_text()
    assert "We moved invoices to the new ledger." in text
    assert "user" in text and "default" in text and "embedded" in text
    await page.screenshot(path=shots / "thread.png", full_page=True)


async def test_high_turn_stays_masked_until_an_admin_reveals_it(desktop, mint, ns, call, shots):
    admin = mint(ns, "admin")
    await call("conversation.set_logging", admin, namespace=ns, enabled=True)
    secret = "my password=Tr0ub4dor&3horse for the billing box"
    await _append(call, admin, ns, "th-high", secret)
    page = desktop
    await sign_in(page, mint(ns, "viewer"))
    await page.goto(f"/dashboard/thread?ns={ns}&agent=default&thread=th-high")
    assert "Tr0ub4dor" not in await page.content()
    assert await page.locator("text=Reveal").count() == 0  # a viewer cannot reveal
    msg_id = (await page.locator(".msgid").first.inner_text()).strip()
    await page.goto(f"/dashboard/thread?ns={ns}&agent=default&thread=th-high&reveal={msg_id}")
    assert "Tr0ub4dor" not in await page.content()  # nor ask for it by URL
    await sign_in(page, admin)
    await page.goto(f"/dashboard/thread?ns={ns}&agent=default&thread=th-high")
    assert "Tr0ub4dor" not in await page.content()
    await page.click("text=Reveal")
    await page.wait_for_load_state()
    assert secret in await page.locator("#turns").inner_text()
    assert "embedding" in await page.content() and "not_indexed" in await page.content()
    # The owner finds such turns from the Review page, which names them, not their text.
    await page.click("nav[aria-label=Pages] >> text=Review")
    await page.wait_for_load_state()
    listed = await page.locator("#high-turns").inner_text()
    assert "th-high" in listed and "password assignment" in listed and "Tr0ub4dor" not in listed
    await page.screenshot(path=shots / "review.png", full_page=True)


async def test_saved_panel_with_an_end_user_token(desktop, mint, ns, shots):
    page = desktop
    await sign_in(page, mint(ns, "writer", read_scope="own_user", read_user_id="u-ann"))
    assert page.url.endswith("/dashboard/saved")  # an end-user token sees only its own Saved and Memory
    assert await page.locator("nav[aria-label=Pages] a").all_inner_texts() == ["Saved", "Memory"]
    for conv, msg, text in (
        ("c1", "m1", "The invoice export runs nightly at 02:00 from the ledger."),
        ("c1", "m2", "Ticket OPS-4312 tracks the flaky deploy."),
    ):
        await page.fill("#s-conv", conv)
        await page.fill("#s-msg", msg)
        await page.fill("#s-content", text)
        await page.click("#save")
        await page.wait_for_load_state()
    listed = page.locator("#saved-list li")
    assert await listed.count() == 2
    assert "OPS-4312" in await listed.nth(0).inner_text()  # newest saved first
    await page.locator("#saved-q").press_sequentially("OPS-43", delay=30)
    await page.locator("#saved-results[data-query='OPS-43']").wait_for(timeout=10_000)
    hits = page.locator("#saved-hits li")
    assert await hits.count() >= 1
    assert "OPS-4312" in await hits.nth(0).inner_text()
    await page.screenshot(path=shots / "saved.png", full_page=True)
    await page.fill("#saved-q", "")
    await page.locator("#saved-q").press_sequentially("zebra-quasar", delay=10)
    await page.locator("#saved-results[data-query='zebra-quasar']").wait_for(timeout=10_000)
    assert "No saved message matches" in await page.locator("#saved-results").inner_text()
    await page.fill("#saved-q", "")
    await page.goto("/dashboard/saved")
    await page.click("button[aria-label='Unsave message m2']")
    await page.wait_for_load_state()
    assert await page.locator("#saved-list li").count() == 1
    # The end user's pages of others are not there for it.
    await page.goto("/dashboard/conversations")
    assert page.url.endswith("/dashboard/saved")


async def test_load_a_brief(desktop, mint, ns, call, shots):
    token = mint(ns, "writer")
    r = await call(
        "session.brief_save",
        token,
        namespace=ns,
        project="billing",
        branch="ledger-move",
        sections={"goal": "Move invoices to the new ledger", "next_steps": ["Update the export job"]},
    )
    assert r.status_code == 200, r.text
    key = r.json()["brief_key"]
    page = desktop
    await sign_in(page, token)
    listed = await page.locator("#briefs li").filter(has_text=key).inner_text()
    assert (
        listed.count(key) == 1 and "Move invoices to the new ledger" in listed
    )  # the key once, then the goal
    await page.click(f"#briefs >> text={key}")
    await page.wait_for_load_state()
    assert "Move invoices to the new ledger" in await page.locator("dl.sections").inner_text()
    # Sections saved by hand: written by the caller, not by a model on the server.
    assert await page.locator("#brief-author").inner_text() == "written by the calling agent"
    await page.click("#load-full")
    await page.wait_for_load_state()
    loaded = await page.locator("#brief-text").inner_text()
    assert "Move invoices to the new ledger" in loaded and "Update the export job" in loaded
    await page.screenshot(path=shots / "brief.png", full_page=True)


async def test_excerpt_length_changes_search_hits_live(desktop, mint, ns, call, shots):
    token = mint(ns, "admin")
    await call("conversation.set_logging", token, namespace=ns, enabled=True)
    long_turn = "Invoices ledger migration: " + "the invoices ledger migration notes " * 20
    await _append(call, token, ns, "th-long", long_turn)
    page = desktop
    await sign_in(page, token)
    try:
        await page.goto(f"/dashboard/conversations?ns={ns}&q=invoices+ledger+migration")
        first = await page.locator("#search-hits .excerpt").first.inner_text()
        assert len(first) == 240  # the default LOOM_CONVERSATION_SEARCH_EXCERPT_CHARS
        await page.click("nav[aria-label=Pages] >> text=Settings")
        await page.fill("#loom-conversation-search-excerpt-chars", "0")
        await page.click("#save-settings")
        await page.wait_for_load_state()
        error = page.locator("#loom-conversation-search-excerpt-chars-err")
        assert await error.count() == 1  # inline, beside the field
        await page.fill("#loom-conversation-search-excerpt-chars", "60")
        await page.click("#save-settings")
        await page.wait_for_load_state()
        assert await page.locator("#settings-saved").count() == 1
        row = page.locator("tr", has=page.locator("#loom-conversation-search-excerpt-chars"))
        assert "override" in await row.inner_text()
        label = row.locator("th")
        assert (
            await label.locator("label").inner_text()
        ) == "Search: excerpt length"  # a name, the variable beside it
        assert (await label.locator("code").inner_text()) == "LOOM_CONVERSATION_SEARCH_EXCERPT_CHARS"
        await page.screenshot(path=shots / "settings.png", full_page=True)
        await page.goto(f"/dashboard/conversations?ns={ns}&q=invoices+ledger+migration")
        first = await page.locator("#search-hits .excerpt").first.inner_text()
        assert len(first) == 60
    finally:  # the setting is the server's: put it back for the tests after this one
        await call("settings.set", token, values={"LOOM_CONVERSATION_SEARCH_EXCERPT_CHARS": None})


async def test_retention_and_health_pages(desktop, mint, ns, shots):
    page = desktop
    await sign_in(page, mint(ns, "admin"))
    await page.click("nav[aria-label=Pages] >> text=Retention")
    await page.wait_for_load_state()
    assert await page.locator("#retention-days").inner_text() == "keep forever (0)"
    shown = await page.locator("#tables").inner_text()
    assert "Transcript turns" in shown and "Memory facts" in shown and "search_marks" not in shown
    assert "live settings" in await page.locator("main > p.muted").first.inner_text()  # as Settings says
    internal = page.locator("#internal")
    assert not await internal.is_visible()  # the internal tables behind a toggle
    await page.screenshot(path=shots / "retention.png", full_page=True)
    await page.click("#internal-tables summary")
    assert "search_marks" in await internal.inner_text()
    await page.click("nav[aria-label=Pages] >> text=Health")
    await page.wait_for_load_state()
    text = await page.locator("main").inner_text()
    assert re.search(r"clickhouse\s+ok", text, re.I) and re.search(r"redis\s+ok", text, re.I)
    await page.screenshot(path=shots / "health.png", full_page=True)


async def test_phone_width_has_no_sideways_scroll(phone, mint, ns, call, shots):
    token = mint(ns, "admin")
    await call("conversation.set_logging", token, namespace=ns, enabled=True)
    await _append(call, token, ns, "th-phone", "A turn read on a phone.")
    page = phone
    await sign_in(page, token)
    for path in (
        "/dashboard/conversations",
        "/dashboard/thread?agent=default&thread=th-phone",
        "/dashboard/settings",
        "/dashboard/memory?user=u-phone",
    ):
        await page.goto(path)
        wide = await page.evaluate("document.documentElement.scrollWidth")
        assert wide <= 390, f"{path} is {wide} px wide at a 390 px viewport"
    await page.goto("/dashboard/conversations")
    await page.screenshot(path=shots / "conversations-phone.png", full_page=True)


async def test_an_owner_finds_a_pasted_secret_and_redacts_or_deletes_it(desktop, mint, ns, call, shots):
    admin = mint(ns, "admin")
    await call("conversation.set_logging", admin, namespace=ns, enabled=True)
    await _append(
        call, admin, ns, "th-clean", "deploy with the key sk-proj-4fQ9xT2mZ8vK1pL7wR3nB6yH0cJ5dG now"
    )
    await _append(call, admin, ns, "th-clean", "and this turn goes entirely")
    page = desktop
    page.on("dialog", lambda dialog: dialog.accept())  # the confirm step before each removal
    await sign_in(page, admin)
    await page.click("nav[aria-label=Pages] >> text=Review")
    await page.wait_for_load_state()
    assert "api key" in await page.locator("#high-turns").inner_text()
    await page.click("#redact-high-1")
    await page.wait_for_load_state()
    assert "redacted" in await page.locator("#removal").inner_text()
    turns = await page.locator("#turns").inner_text()
    assert "[redacted]" in turns and "sk-proj-4fQ9" not in await page.content()
    await page.screenshot(path=shots / "thread-redacted.png", full_page=True)
    await page.goto("/dashboard/review")
    assert "th-clean" not in await page.locator("main").inner_text()  # nothing left to clean
    await page.goto("/dashboard/thread?agent=default&thread=th-clean")
    await page.locator("#turns li").nth(1).locator("summary").click()
    await page.click("#delete-msg-2")
    await page.wait_for_load_state()
    assert "deleted" in await page.locator("#removal").inner_text()
    assert "goes entirely" not in await page.locator("#turns").inner_text()
    got = await call("conversation.get", admin, namespace=ns, thread_id="th-clean", include_messages=True)
    assert [m["content"] for m in got.json()["messages"]] == ["deploy with the key [redacted] now"]
