"""Live settings across processes: a real `loom serve` (its own API process and worker
process) on the suite's ClickHouse and Redis, and the suite's in-process API.

A change stored through the in-process API is in force in the other API process's
conversation.search within seconds, without a restart, and in its worker process: the
titler, switched off by that process's environment, is on there once an override says
so. The worker's observable is its follower's report (settings.get's `processes`: the
version and overrides each process applied), since the suite's own in-process worker
shares the queue and may take the other worker's titler ticks; the tick's reading of the
live switch and interval is tested in tests/conversation/test_live_settings.py."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from loom.auth.principal import Principal, Role
from loom.ops.platform import live_settings
from loom.ops.platform import settings as ops
from tests.conversation.conftest import wait_for
from tests.faults.harness import free_port, short_home
from tests.platform.served import suite_env

EXCERPT = "LOOM_CONVERSATION_SEARCH_EXCERPT_CHARS"
ENABLED = "LOOM_CONVERSATION_TITLER_ENABLED"
INTERVAL = "LOOM_CONVERSATION_TITLER_INTERVAL_SECONDS"
ALL = [live_settings.env_name(f) for f in live_settings.LIVE_SETTINGS]
SERVE_OUT: list[Path] = []
OUT: list[Path] = []
ADMIN = Principal("settings-test", ("x",), Role.admin)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@contextlib.contextmanager
def _loom_serve(settings: Any, home: Path) -> Iterator[str]:
    """`loom serve` (an API process; with backends given, it starts no worker) and a
    `loom worker` process, on the suite's backends and database; the titler switched
    off by their environment, the recovery pass kept away from the suite's rows."""
    port = free_port()
    env = suite_env(
        settings,
        home,
        port,
        LOOM_CONVERSATION_TITLER_ENABLED="false",
        LOOM_EMBED_RECOVERY_GRACE_SECONDS="86400",
        LOOM_EMBED_RECOVERY_INTERVAL_SECONDS="3600",
        PYTHONUNBUFFERED="1",
    )
    out_path = home / "serve.out"
    OUT[:] = [out_path]
    procs: list[subprocess.Popen[bytes]] = []
    with open(out_path, "wb") as out:
        for command in (["serve"], ["worker"]):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "loom.cli.main", *command],
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 150
        while True:
            assert all(p.poll() is None for p in procs), out_path.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, out_path.read_text(errors="replace")[-3000:]
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        yield base
    finally:
        for proc in procs:
            _stop(proc)


async def _is_not_none(value: Any) -> bool:
    return (await value) is not None


@pytest.fixture
async def served(services: Any) -> AsyncIterator[str]:
    await ops.update(services, ADMIN, dict.fromkeys(ALL))
    home = short_home()
    try:
        with _loom_serve(services.settings, home) as base:
            yield base
    finally:
        await ops.update(services, ADMIN, dict.fromkeys(ALL))
        shutil.rmtree(home, ignore_errors=True)


async def test_a_change_reaches_another_api_process_and_a_worker_process(
    served, call, ns, writer, mint, services
):
    long = "staging deploy " + "x" * 600
    r = await call(
        "conversation.append",
        writer,
        namespace=ns,
        turns=[{"thread_id": "t", "msg_id": "long", "role": "user", "content": long}],
    )
    assert r.status_code == 200 and r.json()["results"][0]["stored"], r.text
    viewer, admin = mint(ns, "viewer"), mint(ns, "admin")
    async with httpx.AsyncClient(base_url=served, timeout=30) as other:

        async def excerpts() -> list[str]:
            r = await other.post(
                "/v1/conversation.search",
                json={"namespace": ns, "query": "staging deploy"},
                headers={"Authorization": f"Bearer {viewer}"},
            )
            assert r.status_code == 200, r.text
            return [h["excerpt"] for h in r.json()["hits"]]

        assert await excerpts() == [long[:240]]
        r = await other.post("/v1/settings.get", json={}, headers={"Authorization": f"Bearer {admin}"})
        shown = {s["name"]: s for s in r.json()["settings"]}
        assert (shown[ENABLED]["value"], shown[ENABLED]["source"]) == (False, "environment")

        async def other_worker() -> dict[str, Any] | None:
            """The `loom worker` process's report (the suite's own worker runs in this process)."""
            r = await call("settings.get", admin)
            mine = f":{os.getpid()}"
            found = [
                p
                for p in r.json()["processes"]
                if p["process"].startswith("worker:") and not p["process"].endswith(mine)
            ]
            return found[0] if found else None

        # The worker process is up and follows (nothing overridden yet) before the change.
        assert await wait_for(lambda: _is_not_none(other_worker()), timeout=60, step=0.2), OUT[0].read_text()
        before = await other_worker()
        assert before is not None and before["overrides"] == {}

        # Changed through this (the suite's) API process...
        r = await call("settings.set", admin, values={EXCERPT: 37, ENABLED: True, INTERVAL: 10})
        assert r.status_code == 200, r.text
        version = r.json()["version"]
        changed = time.monotonic()

        async def followed() -> bool:
            return await excerpts() == [long[:37]]

        # ... in force in the other API process within seconds, no restart.
        assert await wait_for(followed, timeout=10, step=0.1)
        took = time.monotonic() - changed

        # ... and in the same worker process (no restart): the titler on (its
        # environment says off) at the new interval.
        async def worker_followed() -> bool:
            now = await other_worker()
            return (
                now is not None
                and now["process"] == before["process"]
                and now["version"] >= version
                and now["overrides"].get(ENABLED) is True
                and now["overrides"].get(INTERVAL) == 10
            )

        assert await wait_for(worker_followed, timeout=10, step=0.1), await other_worker()
        took_worker = time.monotonic() - changed
        print(f"followed by the other API process in {took:.2f} s, the worker process in {took_worker:.2f} s")
        assert took < 10

        # Cleared: the environment's value is back there too.
        await call("settings.set", admin, values={EXCERPT: None})

        async def back() -> bool:
            return await excerpts() == [long[:240]]

        assert await wait_for(back, timeout=10, step=0.1)
