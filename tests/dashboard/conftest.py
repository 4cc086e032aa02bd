"""The dashboard's tests: a real `loom serve` (on the suite's ClickHouse and Redis) and
Debian's Chromium driven by Playwright.

Chromium comes from the system (`apt-get install chromium`; `make test` installs it
when missing), never from Playwright's own download, which this machine's network
does not reach. LOOM_TEST_CHROMIUM names another executable.

Screenshots go to LOOM_TEST_SCREENSHOTS (default: a temporary directory); `make
screenshots` points it at docs/screenshots to refresh the committed ones.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from loom.settings import Settings
from tests.faults.harness import free_port
from tests.platform.served import suite_env

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
def served(schema: Settings) -> Iterator[str]:
    """`loom serve` as a user runs it, on the suite's backends and database (so tests
    can mint tokens and append through the suite's fixtures). With external backends
    it runs no worker: the `arq_worker` fixture's worker serves its jobs."""
    home = Path(tempfile.mkdtemp(prefix="loomd-", dir="/tmp"))
    port = free_port()
    env = suite_env(schema, home, port, LOOM_EMBED_WAIT_SECONDS="5")
    proc = subprocess.Popen(
        [sys.executable, "-m", "loom.cli.main", "serve"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(proc, base)
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(home, ignore_errors=True)


def _wait_healthy(proc: subprocess.Popen[bytes], base: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            pytest.fail(f"loom serve exited {proc.returncode}:\n{out[-3000:]}")
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    pytest.fail("loom serve did not become healthy within 120 s")


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
