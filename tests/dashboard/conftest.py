"""The dashboard's tests: a real `loom serve` (the suite's `served` fixture, on its
ClickHouse and Redis) and Debian's Chromium driven by Playwright.

Chromium comes from the system (`apt-get install chromium`; `make test` installs it
when missing), never from Playwright's own download, which this machine's network
does not reach. LOOM_TEST_CHROMIUM names another executable.

Screenshots go to LOOM_TEST_SCREENSHOTS (default: a temporary directory); `make
screenshots` points it at docs/screenshots to refresh the committed ones.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM_FLAGS = [
    "--no-sandbox",  # CI runs as root
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",  # no calls out: the machine's network is closed
    # The network off but for this machine: a page that needs anything from outside
    # (a CDN's script, a web font) fails here as it would for a user without internet.
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1",
    "--disable-component-update",
    "--disable-sync",
]
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}


def chromium_path() -> str:
    found = (
        os.environ.get("LOOM_TEST_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    )
    if not found:
        pytest.fail(
            "no chromium: `apt-get install chromium` (make test does it when it may), or set LOOM_TEST_CHROMIUM"
        )
    return found


@pytest.fixture(scope="session")
async def browser() -> AsyncIterator[Any]:
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        launched = await pw.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
        yield launched
        await launched.close()


@pytest.fixture
async def desktop(browser: Any, served: str) -> AsyncIterator[Any]:
    """A fresh browser session (no cookies) at 1280 px on the served dashboard."""
    context = await browser.new_context(viewport=DESKTOP, base_url=served)
    page = await context.new_page()
    yield page
    await context.close()


@pytest.fixture
async def phone(browser: Any, served: str) -> AsyncIterator[Any]:
    context = await browser.new_context(viewport=PHONE, base_url=served, is_mobile=True, has_touch=True)
    page = await context.new_page()
    yield page
    await context.close()


@pytest.fixture(scope="session")
def shots() -> Path:
    where = Path(os.environ.get("LOOM_TEST_SCREENSHOTS") or tempfile.mkdtemp(prefix="loom-shots-"))
    where.mkdir(parents=True, exist_ok=True)
    return where


def outside_requests(page: Any, base: str) -> list[tuple[str, str]]:
    """Every request the page makes to anywhere but the served Loom, as (resource type,
    url); filled as the page runs."""
    seen: list[tuple[str, str]] = []
    ours = (base, "data:", f"blob:{base}")

    def note(request: Any) -> None:
        if not request.url.startswith(ours):
            seen.append((request.resource_type, request.url))

    page.on("request", note)
    return seen


async def sign_in(page: Any, token: str) -> None:
    await page.goto("/dashboard/signin")
    await page.fill("#token", token)
    await page.click("button[type=submit]")
    await page.wait_for_load_state()
