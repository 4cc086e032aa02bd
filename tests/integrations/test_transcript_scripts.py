"""The Cursor hook and the generic ingest script, run by bash as their users run them,
against the API on a real HTTP port (they hand the transcript to `loom ingest-transcript`)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import bearer

REPO = Path(__file__).resolve().parents[2]
CURSOR = REPO / "integrations" / "cursor" / "cursor-session-hook.sh"
GENERIC = REPO / "integrations" / "generic" / "ingest.sh"
TRANSCRIPT = "# user\nWhere do invoices go now?\n\n# assistant\nTo the new ledger.\n"


@pytest.fixture
async def recording(api_url: str, arq_worker: Any, call: Any, ns: str, mint: Any) -> dict[str, str]:
    r = await call("conversation.set_logging", mint(ns, "admin"), namespace=ns, enabled=True)
    assert r.status_code == 200, r.text
    bin_dir = Path(sys.executable).parent  # the suite's venv holds the `loom` command
    return {
        "LOOM_URL": api_url,
        "LOOM_TOKEN": mint(ns, "writer"),
        "LOOM_NAMESPACE": ns,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
    }


async def _bash(
    script: Path, *args: str, env: dict[str, str], stdin: str = ""
) -> tuple[int, str, str, float]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("LOOM_")} | env
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        "bash",
        str(script),
        *args,
        env=environ,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin.encode()), 120)
    return proc.returncode or 0, out.decode(), err.decode(), time.monotonic() - started


async def _listed(api: Any, env: dict[str, str], agent: str, thread_id: str) -> list[str]:
    body = {"namespace": env["LOOM_NAMESPACE"], "agent": agent, "thread_id": thread_id}
    r = await api.post("/v1/conversation.list", json=body, headers=bearer(env["LOOM_TOKEN"]))
    assert r.status_code == 200, r.text
    return [m["content"] for m in r.json()["messages"]]


async def test_the_cursor_hook_hands_the_transcript_over_once(recording, api, tmp_path: Path) -> None:
    path = tmp_path / "chat.md"
    path.write_text(TRANSCRIPT)
    hook_input = json.dumps(
        {"hook_event_name": "stop", "conversation_id": "c-9", "transcript_path": str(path)}
    )
    for _ in range(2):  # after every reply: the second run adds nothing
        code, out, err, _ = await _bash(CURSOR, env=recording, stdin=hook_input)
        assert code == 0 and out.strip() == "{}", err
    assert await _listed(api, recording, "cursor", "cursor/c-9") == [
        "Where do invoices go now?",
        "To the new ledger.",
    ]
    assert "duplicate 2" in err


async def test_the_cursor_hook_never_blocks(recording, tmp_path: Path) -> None:
    path = tmp_path / "chat.md"
    path.write_text(TRANSCRIPT)
    hook_input = json.dumps({"conversation_id": "c-10", "transcript_path": str(path)})
    down = recording | {"LOOM_URL": "http://127.0.0.1:9", "LOOM_HOOK_TIMEOUT_S": "20"}
    code, out, err, took = await _bash(CURSOR, env=down, stdin=hook_input)
    assert code == 0 and out.strip() == "{}" and "will retry" in err and took < 30
    code, out, err, _ = await _bash(CURSOR, env=recording | {"LOOM_TOKEN": ""}, stdin=hook_input)
    assert code == 0 and "LOOM_TOKEN is not set" in err
    code, out, err, _ = await _bash(CURSOR, env=recording, stdin="{}")
    assert code == 0 and "no transcript_path" in err


async def test_the_generic_script_ingests_an_exported_transcript(recording, api, tmp_path: Path) -> None:
    path = tmp_path / "export.json"
    path.write_text(
        json.dumps([{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}])
    )
    code, out, err, _ = await _bash(GENERIC, str(path), "t-generic", env=recording | {"LOOM_AGENT": "my-bot"})
    assert code == 0, err
    assert "stored 2" in out
    assert await _listed(api, recording, "my-bot", "t-generic") == ["hello", "hi"]
    code, _, err, _ = await _bash(GENERIC, env=recording)
    assert code == 2 and "usage" in err
