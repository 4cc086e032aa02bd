"""`loom serve` and the admin commands, as a user runs them (real processes)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

LOOM = [sys.executable, "-m", "loom.cli.main"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOM_")}
    env.update(LOOM_HOME=str(home), LOOM_EMBEDDER="fake", **extra)
    return env


def _short_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import tempfile

    return Path(tempfile.mkdtemp(prefix="loomc-", dir="/tmp"))


def test_token_mint_without_serve(tmp_path_factory):
    home = _short_home(tmp_path_factory)
    out = subprocess.run(
        [*LOOM, "token", "mint", "--namespace", "acme", "--role", "writer", "--json"],
        env=_env(home),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    minted = json.loads(out.stdout)
    assert minted["token"].startswith("loom_") and minted["role"] == "writer"
    listed = subprocess.run(
        [*LOOM, "token", "list"], env=_env(home), capture_output=True, text=True, timeout=120
    )
    assert listed.returncode == 0 and minted["token_id"] in listed.stdout
    assert minted["token"] not in listed.stdout  # secrets are never listed
    bad = subprocess.run(
        [*LOOM, "token", "mint", "--namespace", "acme", "--role", "root"],
        env=_env(home),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "role" in bad.stderr


def test_bad_setting_fails_startup_naming_the_variable(tmp_path_factory):
    home = _short_home(tmp_path_factory)
    out = subprocess.run(
        [*LOOM, "migrate"],
        env=_env(home, LOOM_CONVERSATION_SEARCH_MIN_SIMILARITY="lots"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "LOOM_CONVERSATION_SEARCH_MIN_SIMILARITY" in out.stderr


def test_serve_end_to_end(tmp_path_factory):
    home = _short_home(tmp_path_factory)
    port = _free_port()
    env = _env(home, LOOM_PORT=str(port))
    serve = subprocess.Popen(
        [*LOOM, "serve"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        else:
            pytest.fail("loom serve did not become healthy")
        # An admin command while serve runs uses serve's embedded endpoint (no lock clash).
        out = subprocess.run(
            [*LOOM, "token", "mint", "--namespace", "acme", "--role", "admin"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        token = out.stdout.strip()
        headers = {"Authorization": f"Bearer {token}"}
        r = httpx.post(
            f"{base}/v1/conversation.set_logging",
            json={"namespace": "acme", "enabled": True},
            headers=headers,
            timeout=10,
        )
        assert r.status_code == 200 and r.json()["conversation_logging_enabled"] is True
        assert (
            httpx.post(
                f"{base}/v1/conversation.set_logging", json={"namespace": "acme", "enabled": True}, timeout=10
            ).status_code
            == 401
        )
        assert httpx.get(f"{base}/openapi.json", timeout=10).status_code == 200
    finally:
        os.killpg(serve.pid, signal.SIGINT) if serve.poll() is None else None
        try:
            output = serve.communicate(timeout=60)[0].decode(errors="replace")
        except subprocess.TimeoutExpired:
            os.killpg(serve.pid, signal.SIGKILL)
            output = serve.communicate()[0].decode(errors="replace")
            pytest.fail("loom serve did not stop on Ctrl-C:\n" + output[-3000:])
    assert serve.returncode == 0, output[-3000:]
    assert f"{base}/docs" in output
    assert not (home / "clickhouse" / "endpoint.port").exists()
    # Every child is gone: nothing listens any more.
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{base}/healthz", timeout=1)
