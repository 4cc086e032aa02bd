"""The Memory page in a real browser against a real `loom serve`: a user's facts with
their validity, source and evidence, one fact's history, the profile, the facts as of
an earlier time, forgetting a fact after a confirmation; and a dashboard path with no
page answers the dashboard's own 404."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from loom.providers.llm import ChatMessage, ScriptedLLM
from tests.dashboard.conftest import sign_in
from tests.memory.conftest import api_over

pytestmark = pytest.mark.usefixtures("arq_worker")

CHAT = [
    {"role": "user", "content": "I moved from Berlin to Lisbon last month."},
    {"role": "assistant", "content": "Nice! How is Lisbon treating you?"},
]


def _model(messages: list[ChatMessage]) -> str:
    """Extraction finds one fact; the profile is written from the facts it is given."""
    system = messages[0].content
    if "extract durable facts" in system:
        return json.dumps({"facts": ["Lives in Lisbon"]})
    if "living profile" in system:
        return json.dumps({"sections": {"identity": "Lives in Lisbon"}})
    return json.dumps({"decisions": []})


async def _facts(services: Any, token: str, ns: str) -> None:
    """One fact drawn from messages (with evidence) and a keyed fact revised once."""
    async with api_over(dataclasses.replace(services, llm=ScriptedLLM(_model))) as call:
        r = await call("memory.set_from_messages", token, namespace=ns, user_id="u-mem", messages=CHAT)
        assert r.status_code == 200 and r.json()["extracted"] == 1, r.text
        for text, since in (("Wants invoices in EUR", "2025-01-01"), ("Wants invoices in USD", "2025-06-01")):
            fact = {"text": text, "key": "invoice-currency", "valid_from": f"{since}T00:00:00Z"}
            r = await call("memory.set", token, namespace=ns, user_id="u-mem", facts=[fact])
            assert r.status_code == 200 and r.json()["results"][0]["stored"], r.text


async def test_memory_page(desktop, mint, ns, services, shots):
    token = mint(ns, "writer")
    await _facts(services, token, ns)
    page = desktop
    await sign_in(page, token)
    await page.click("nav[aria-label=Pages] >> text=Memory")
    await page.fill("#m-user", "u-mem")
    await page.click("#m-show")
    await page.wait_for_load_state()
    facts = await page.locator("#facts").inner_text()
    assert "Wants invoices in USD" in facts and "Lives in Lisbon" in facts
    assert "Wants invoices in EUR" not in facts  # superseded: in its history, not current
    assert "2025-06-01 00:00:00 UTC → holds" in facts and "extraction" in facts and "set" in facts
    assert await page.locator("#profile").inner_text() != ""
    await page.screenshot(path=shots / "memory.png", full_page=True)

    # Evidence: the messages the extracted fact came from.
    lisbon = page.locator("#facts tr", has_text="Lives in Lisbon")
    await lisbon.get_by_role("link", name="2 evidence").click()
    await page.wait_for_load_state()
    assert "I moved from Berlin to Lisbon last month." in await page.locator("#evidence").inner_text()
    await page.screenshot(path=shots / "memory-history.png", full_page=True)

    # History: both versions of the keyed fact, oldest first, the old one closed.
    usd = page.locator("#facts tr", has_text="Wants invoices in USD")
    await usd.get_by_role("link", name="History").click()
    await page.wait_for_load_state()
    versions = await page.locator("#versions li").all_inner_texts()
    assert ["EUR" in versions[0], "USD" in versions[1]] == [True, True] and len(versions) == 2
    assert "→ 2025-06-01 00:00:00 UTC" in versions[0] and "current" in versions[1]

    # As of an earlier time: the fact as it stood then.
    await page.fill("#m-as-of", "2025-03-01T00:00:00")
    await page.click("#m-show")
    await page.wait_for_load_state()
    then = await page.locator("#facts").inner_text()
    assert "Wants invoices in EUR" in then and "Wants invoices in USD" not in then
    assert "Facts valid at 2025-03-01 00:00:00 UTC" in await page.locator("#facts-h").inner_text()

    # Forget, confirmed: a dismissed confirmation forgets nothing.
    await page.goto(f"/dashboard/memory?ns={ns}&user=u-mem")
    answers = iter([False, True])
    page.on("dialog", lambda dialog: dialog.accept() if next(answers) else dialog.dismiss())
    forget = page.locator("#facts tr", has_text="Wants invoices in USD").get_by_role("button", name="Forget")
    await forget.click()
    assert "Wants invoices in USD" in await page.locator("#facts").inner_text()
    await forget.click()
    await page.wait_for_load_state()
    assert "forgotten" in await page.locator("#forgotten").inner_text()
    assert "Wants invoices in USD" not in await page.locator("#facts").inner_text()

    # A dashboard path with no page: the dashboard's own 404, with its menu.
    answer = await page.goto("/dashboard/no-such-page")
    assert answer is not None and answer.status == 404
    assert await page.locator("h1").inner_text() == "No such page"
    assert await page.locator("nav[aria-label=Pages] >> text=Memory").count() == 1
