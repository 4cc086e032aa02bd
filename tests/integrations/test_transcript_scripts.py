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
CODEX = REPO / "integrations" / "codex" / "loom-codex-notify.sh"
CODEX_SESSION = "0199a0c2-4b8e-7d21-9f3a-6c5e1b2d3f40"


def codex_rollout(home: Path, turns: list[tuple[str, str]]) -> Path:
    """A Codex CLI session file: its meta line, the context Codex injects, the turns, and
    items that are not turns (a tool call, reasoning)."""
    folder = home / "sessions" / "2026" / "12" / "01"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"rollout-2026-12-01T10-00-00-{CODEX_SESSION}.jsonl"

    def message(role: str, text: str) -> dict[str, Any]:
        kind = "input_text" if role == "user" else "output_text"
        return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}

    items: list[dict[str, Any]] = [
        {"type": "session_meta", "payload": {"id": CODEX_SESSION, "cwd": "/work/billing"}},
        {
            "type": "response_item",
            "payload": message("user", "<environment_context>cwd: /work</environment_context>"),
        },
    ]
    for role, text in turns:
        items.append({"type": "response_item", "payload": message(role, text)})
        items.append(
            {
                "type": "response_item",
                "payload": {"type": "function_call", "name": "shell", "arguments": "{}"},
            }
        )
        items.append({"type": "response_item", "payload": {"type": "reasoning", "summary": []}})
    path.write_text("".join(json.dumps({"timestamp": "2026-12-01T10:00:00Z", **i}) + "\n" for i in items))
    return path


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


async def test_the_codex_notify_program_ingests_the_session_file(recording, api, tmp_path: Path) -> None:
    home = tmp_path / "codex"
    turns = [("user", "Where do invoices go now?"), ("assistant", "To the new ledger.")]
    codex_rollout(home, turns)
    notice = json.dumps({"type": "agent-turn-complete", "thread-id": CODEX_SESSION, "turn-id": "1"})
    env = recording | {"CODEX_HOME": str(home)}
    code, _, err, _ = await _bash(CODEX, notice, env=env)
    assert code == 0 and "stored 2" in err, err
    codex_rollout(home, [*turns, ("user", "And the refunds?")])  # the session grew
    code, _, err, _ = await _bash(CODEX, notice, env=env)
    assert code == 0 and "duplicate 2" in err and "stored 1" in err, err
    listed = await _listed(api, recording, "codex", f"codex/{CODEX_SESSION}")
    assert listed == ["Where do invoices go now?", "To the new ledger.", "And the refunds?"]
    # An older Codex names no session: its newest session file is taken.
    code, _, err, _ = await _bash(CODEX, json.dumps({"type": "agent-turn-complete"}), env=env)
    assert code == 0 and "duplicate 3" in err, err
