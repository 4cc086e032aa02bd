"""The Claude Code capture hook (integrations/claude-code/hooks/loom-conversation.mjs)
run by Node as Claude Code runs it (the hook's JSON on stdin), on transcripts written
here in Claude Code's JSONL shape, against the API on a real HTTP port with the suite's
worker. Node.js is required: `make test` installs it, and without it these tests fail."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import bearer
from tests.platform.served import serve
from tests.providers.standin import StandInServer

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "integrations" / "claude-code"
HOOK = PLUGIN / "hooks" / "loom-conversation.mjs"
NODE = shutil.which("node") or shutil.which("nodejs")
SECRET = "my prod login is password=Tr0ub4dor&3xq"
LESSON = "The export tests fail after the exporter edit"


class Transcript:
    """A session transcript in Claude Code's JSONL shape."""

    def __init__(self, path: Path, session_id: str) -> None:
        self.path, self.session_id = path, session_id
        self.uuids: list[str] = []

    def add(self, kind: str, content: Any, **extra: Any) -> str:
        entry_id = str(uuid.uuid4())
        role = "assistant" if kind == "assistant" else "user"
        entry = {
            "type": kind,
            "uuid": entry_id,
            "sessionId": self.session_id,
            "timestamp": "2026-12-01T10:00:00.000Z",
            "message": {"role": role, "content": content},
            **extra,
        }
        with self.path.open("a") as f:
            f.write(json.dumps(entry) + "\n")
        self.uuids.append(entry_id)
        return entry_id

    def user(self, text: str) -> str:
        return self.add("user", text)

    def assistant(self, text: str, *tools: dict[str, Any]) -> str:
        return self.add("assistant", [{"type": "text", "text": text}, *tools])

    def tool_result(self, text: str, error: bool = False, tool_use_id: str = "x") -> str:
        result = {"type": "tool_result", "tool_use_id": tool_use_id, "content": text, "is_error": error}
        return self.add("user", [result])


@dataclass
class Hook:
    api_url: str
    token: str
    namespace: str
    state_dir: Path
    cwd: Path

    async def run(self, event: str, transcript: Transcript | None, **env: str) -> tuple[int, str, str, float]:
        payload: dict[str, Any] = {"hook_event_name": event, "cwd": str(self.cwd)}
        if transcript is not None:
            payload |= {"session_id": transcript.session_id, "transcript_path": str(transcript.path)}
        environ = {k: v for k, v in os.environ.items() if not k.startswith("LOOM_")}
        environ |= {
            "LOOM_URL": self.api_url,
            "LOOM_TOKEN": self.token,
            "LOOM_NAMESPACE": self.namespace,
            "LOOM_USER_ID": "u-7",
            "LOOM_HOOK_STATE_DIR": str(self.state_dir),
            **env,
        }
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            str(NODE),
            str(HOOK),
            env=environ,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(json.dumps(payload).encode()), 60)
        return proc.returncode or 0, out.decode(), err.decode(), time.monotonic() - started


@pytest.fixture
def hook(api_url: str, arq_worker: Any, ns: str, mint: Any, tmp_path: Path) -> Hook:
    if NODE is None:
        pytest.fail("Node.js is not installed: `apt-get install nodejs` (make test installs it)")
    cwd = tmp_path / "billing-service"
    (cwd / ".git").mkdir(parents=True)
    (cwd / ".git" / "HEAD").write_text("ref: refs/heads/ledger-move\n")
    return Hook(api_url, mint(ns, "writer"), ns, tmp_path / "state", cwd)


async def _op(api: Any, token: str, op: str, **body: Any) -> dict[str, Any]:
    r = await api.post(f"/v1/{op}", json=body, headers=bearer(token))
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


async def _listed(api: Any, hook: Hook, session_id: str) -> list[dict[str, Any]]:
    body = {"namespace": hook.namespace, "agent": "claude-code", "thread_id": f"claude-code/{session_id}"}
    return (await _op(api, hook.token, "conversation.list", **body, limit=500))["messages"]  # type: ignore[no-any-return]


async def _record(call: Any, hook: Hook, mint: Any) -> None:
    r = await call(
        "conversation.set_logging", mint(hook.namespace, "admin"), namespace=hook.namespace, enabled=True
    )
    assert r.status_code == 200, r.text


async def test_stop_appends_each_new_turn_once(hook: Hook, call, api, mint, tmp_path: Path) -> None:
    await _record(call, hook, mint)
    t = Transcript(tmp_path / "s1.jsonl", "s1")
    u1 = t.user("Move the invoices to the new ledger.")
    a1 = t.assistant(
        "I'll edit the exporter.",
        {"type": "tool_use", "name": "Edit", "input": {"file_path": "src/export.py"}},
    )
    t.tool_result("ok")  # a tool result is not a turn
    assert (await hook.run("Stop", t))[0] == 0
    assert [(m["msg_id"], m["role"]) for m in await _listed(api, hook, "s1")] == [
        (u1, "user"),
        (a1, "assistant"),
    ]

    u2 = t.user("And the refunds?")
    a2 = t.assistant("Refunds stay on the old ledger.")
    code, _, err, _ = await hook.run("Stop", t)
    assert code == 0, err
    listed = await _listed(api, hook, "s1")
    assert [m["msg_id"] for m in listed] == [u1, a1, u2, a2]
    assert {m["user_id"] for m in listed} == {"u-7"}
    assert json.loads((hook.state_dir / "s1.json").read_text())["sent"] == 5


async def test_a_resumed_session_continues_its_thread_without_doubles(
    hook: Hook, call, api, mint, tmp_path: Path
) -> None:
    await _record(call, hook, mint)
    first = Transcript(tmp_path / "s2.jsonl", "s2")
    first.user("Where do invoices go?")
    first.assistant("To the new ledger.")
    await hook.run("Stop", first)
    resumed = Transcript(tmp_path / "s3.jsonl", "s3")  # Claude Code copies the resumed turns
    resumed.path.write_text(first.path.read_text())
    resumed.uuids = list(first.uuids)
    resumed.user("Continue with the credit notes.")
    await hook.run("Stop", resumed)
    assert [m["msg_id"] for m in await _listed(api, hook, "s2")] == resumed.uuids
    assert await _listed(api, hook, "s3") == []


async def test_recording_off_or_capture_off_appends_nothing(hook: Hook, api, tmp_path: Path) -> None:
    t = Transcript(tmp_path / "s4.jsonl", "s4")
    t.user("hello")
    assert (await hook.run("Stop", t))[0] == 0  # the namespace does not record
    state = json.loads((hook.state_dir / "s4.json").read_text())
    assert state["verdict"] is False and state["sent"] == 1
    t2 = Transcript(tmp_path / "s5.jsonl", "s5")
    t2.user("hello again")
    await hook.run("Stop", t2, LOOM_CAPTURE_CONVERSATIONS="false")
    assert await _listed(api, hook, "s5") == []
    assert json.loads((hook.state_dir / "s5.json").read_text())["sent"] == 0


async def test_a_down_loom_costs_a_short_timeout_and_nothing_is_lost(
    hook: Hook, call, api, mint, tmp_path: Path
) -> None:
    await _record(call, hook, mint)
    t = Transcript(tmp_path / "s6.jsonl", "s6")
    t.user("We moved invoices.")
    t.assistant("Noted.")
    code, _, err, took = await hook.run("Stop", t, LOOM_URL="http://127.0.0.1:9", LOOM_HOOK_TIMEOUT_MS="1000")
    assert code == 0 and "will retry" in err and took < 10
    assert json.loads((hook.state_dir / "s6.json").read_text())["sent"] == 0
    await hook.run("Stop", t)
    assert [m["msg_id"] for m in await _listed(api, hook, "s6")] == t.uuids


@pytest.fixture
def with_a_model(schema: Any) -> Iterator[tuple[str, StandInServer]]:
    """(url, stand-in): an API on a real port whose chat model is the stand-in (the
    briefs keep the deterministic builder), for what only runs with a model: the session
    end's crystallize. The stand-in draws one fact from the run's observations."""

    def reply(req: Any) -> Any:
        said = req.json["messages"][-1]["content"]
        return srv.chat_ok(json.dumps({"facts": [LESSON] if "test_export" in said else []}))

    with StandInServer() as srv:
        srv.set_handler(srv.CHAT, reply)
        cfg = {"llm": "openai", "llm_url": srv.url, "llm_model": "stand-in", "session_brief_llm": False}
        with serve(schema.model_copy(update=cfg)) as url:
            yield url, srv


async def test_compaction_and_session_end_save_the_brief_and_hand_turns_to_memory(
    hook: Hook, with_a_model, call, api, mint, tmp_path: Path
) -> None:
    url, model = with_a_model
    hook = dataclasses.replace(hook, api_url=url)
    await _record(call, hook, mint)
    t = Transcript(tmp_path / "s7.jsonl", "s7")
    t.user("Move invoices to the new ledger.")
    edit = {"type": "tool_use", "id": "toolu_1", "name": "Edit", "input": {"file_path": "src/export.py"}}
    bash = {"type": "tool_use", "id": "toolu_2", "name": "Bash", "input": {"command": "pytest -q"}}
    t.assistant("Editing the exporter.", edit)
    t.assistant("Running the tests.", bash)
    t.tool_result("1 failed: test_export", error=True, tool_use_id="toolu_2")
    t.user(SECRET)
    code, _, err, _ = await hook.run("PreCompact", t)
    assert code == 0, err
    brief = await _op(
        api, hook.token, "session.brief_get", namespace=hook.namespace, project="billing-service"
    )
    assert brief["brief_key"] == "auto/billing-service/ledger-move" and brief["revision"] == 1
    assert "src/export.py" in json.dumps(brief["sections"])
    assert "Tr0ub4dor" not in json.dumps(brief)
    # The tool actions are observations of the session's run (the failed test run's outcome with it).
    assert json.loads((hook.state_dir / "s7.json").read_text())["observed"] == 2
    seen = await _op(
        api, hook.token, "memory.recall", namespace=hook.namespace, user_id="u-7", query="pytest"
    )
    assert any("test_export" in h["content"] for h in seen["hits"]), seen
    assert not model.requests_to(model.CHAT)  # compaction crystallizes nothing

    t.assistant("The exporter now writes to the new ledger.")
    code, _, err, _ = await hook.run("SessionEnd", t)
    assert code == 0, err
    recalled = await _op(
        api, hook.token, "memory.recall", namespace=hook.namespace, user_id="u-7", query="exporter ledger"
    )
    assert "The exporter now writes to the new ledger." in [h["content"] for h in recalled["hits"]]
    assert "Tr0ub4dor" not in json.dumps(recalled)
    # The session's end revises the brief with what came after the compaction.
    again = await _op(
        api, hook.token, "session.brief_get", namespace=hook.namespace, project="billing-service"
    )
    assert again["revision"] == brief["revision"] + 1, again
    assert "The exporter now writes to the new ledger." in again["sections"]["status"], again
    assert "src/export.py" in again["sections"]["key_files"]
    # ... and crystallizes the run's observations into the user's facts.
    facts = await _op(api, hook.token, "memory.list", namespace=hook.namespace, user_id="u-7")
    assert [(f["text"], f["source"]) for f in facts["facts"]] == [(LESSON, "crystallize")], facts
    assert all("Tr0ub4dor" not in r.body.decode() for r in model.requests_to(model.CHAT))


async def test_session_start_names_the_briefs_only(hook: Hook, api) -> None:
    await _op(
        api,
        hook.token,
        "session.brief_save",
        namespace=hook.namespace,
        brief_key="ledger-migration",
        sections={"goal": "Move invoicing to the new ledger"},
    )
    code, out, err, _ = await hook.run("SessionStart", None)
    assert code == 0, err
    assert "ledger-migration" in out and "Move invoicing" not in out


def test_the_plugin_is_wired_as_claude_code_expects() -> None:
    manifest = json.loads((PLUGIN / ".claude-plugin" / "plugin.json").read_text())
    assert manifest["name"] == "loom"
    hooks = json.loads((PLUGIN / "hooks" / "hooks.json").read_text())["hooks"]
    assert set(hooks) == {"Stop", "PreCompact", "SessionEnd", "SessionStart"}
    for groups in hooks.values():
        (command,) = [h["command"] for g in groups for h in g["hooks"]]
        assert command == 'node "${CLAUDE_PLUGIN_ROOT}/hooks/loom-conversation.mjs"'
    skill = (PLUGIN / "skills" / "loom-session" / "SKILL.md").read_text()
    assert skill.startswith("---\nname: loom-session\n")
