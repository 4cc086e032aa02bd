"""The API's docs in a real browser with the network off (but for this machine): Swagger
UI at /docs and ReDoc at /redoc load every script and style from Loom itself and list
the ops. (ReDoc's sidebar credit is an image on its maker's CDN, which it does not need.)"""

from __future__ import annotations

from tests.dashboard.conftest import outside_requests


async def test_docs_list_the_ops_without_internet(desktop, served):
    page = desktop
    outside = outside_requests(page, served)
    await page.goto("/docs")
    append = page.locator(".opblock-summary-path", has_text="/v1/conversation.append")
    await append.first.wait_for(timeout=20_000)
    paths = await page.locator(".opblock-summary-path").all_inner_texts()
    assert len(paths) > 40 and "/v1/memory.history" in [p.strip() for p in paths]
    assert outside == [], outside
    await page.goto("/redoc")
    await page.get_by_text("conversation.append", exact=False).first.wait_for(timeout=20_000)
    assert [kind for kind, _ in outside] in ([], ["image"]), outside
