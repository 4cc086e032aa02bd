"""`loom ingest-transcript`, run as a user runs it (the `loom` command in a subprocess,
LOOM_URL and LOOM_TOKEN in its environment) against the API on a real HTTP port, with
the suite's worker embedding what it appends."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from loom.sdk.transcripts import TranscriptError, parse
from tests.conftest import bearer

LOOM = [sys.executable, "-m", "loom.cli.main", "ingest-transcript"]
HIGH = "the prod login is password=Tr0ub4dor&3xq"

MARKDOWN = """# user
We moved invoices to the new ledger.

# assistant
Noted. The export job needs the new ledger's id:

```
# user
this heading is quoted inside a code block
```

# User
Which ledger holds the refunds?

# assistant
Refunds stay on the old ledger until March.
"""


@dataclass
class Ran:
    code: int
    out: str
    err: str

    def json(self) -> dict[str, Any]:
        return json.loads(self.out)  # type: ignore[no-any-return]


@pytest.fixture
async def ingest(api_url: str, arq_worker: Any, ns: str, mint: Any) -> Any:
    """ingest(*args, token=...) -> Ran: the command, awaited without blocking the loop
    (the suite's worker runs on it)."""
    admin = mint(ns, "admin")

    async def run(*args: str, token: str | None = admin, stdin: bytes | None = None) -> Ran:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOOM_")}
        env["LOOM_URL"] = api_url
        if token is not None:
            env["LOOM_TOKEN"] = token
        proc = await asyncio.create_subprocess_exec(
            *LOOM,
            *args,
            env=env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(stdin), 120)
        return Ran(proc.returncode or 0, out.decode(), err.decode())

    return run


async def _record(call: Any, ns: str, token: str, on: bool = True) -> None:
    r = await call("conversation.set_logging", token, namespace=ns, enabled=on)
    assert r.status_code == 200, r.text


async def _listed(api: Any, ns: str, token: str, thread_id: str) -> list[dict[str, Any]]:
    r = await api.post(
        "/v1/conversation.list",
        json={"namespace": ns, "thread_id": thread_id, "limit": 500},
        headers=bearer(token),
    )
    assert r.status_code == 200, r.text
    return r.json()["messages"]  # type: ignore[no-any-return]


# -- parsing ---------------------------------------------------------------------------


def test_markdown_sections_split_on_role_headings_only_outside_code_blocks() -> None:
    turns = parse(MARKDOWN, "markdown")
    assert [t.role for t in turns] == ["user", "assistant", "user", "assistant"]
    assert "# user\nthis heading is quoted" in turns[1].content
    assert turns[2].content == "Which ledger holds the refunds?" and turns[2].line == 12
    # Stable ids: the same file, or the same transcript grown longer, gives the same ids.
    longer = parse(MARKDOWN + "\n# user\nAnd the credit notes?\n", "markdown")
    assert [t.msg_id for t in longer[:4]] == [t.msg_id for t in turns]


def test_a_codex_session_file_is_read_by_its_first_line() -> None:
    from pathlib import Path as P

    from loom.sdk.transcripts import detect_format

    lines = [
        {"type": "session_meta", "payload": {"id": "s"}},
        {
            "type": "response_item",
            "payload": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "<environment_context>cwd</environment_context>"}],
            },
        },
        {
            "type": "response_item",
            "payload": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "fix the exporter"}],
            },
        },
        {"type": "response_item", "payload": {"type": "function_call", "name": "shell"}},
        {
            "type": "response_item",
            "payload": {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "done"}],
            },
        },
    ]
    text = "\n".join(json.dumps(x) for x in lines)
    assert detect_format(P("rollout.jsonl"), text) == "codex"
    assert [(t.role, t.content, t.line) for t in parse(text, "codex")] == [
        ("user", "fix the exporter", 3),
        ("assistant", "done", 5),
    ]


@pytest.mark.parametrize(
    ("text", "fmt", "line", "words"),
    [
        ("notes first\n# user\nhi\n", "markdown", 1, "before the first"),
        ("# user\nhi\n# assistant\n\n  \n# user\nok\n", "markdown", 3, "empty"),
        ('[\n {"role": "user", "content": "hi"},\n {"role": "robot", "content": "x"}\n]', "json", 3, "role"),
        (
            '[\n {"role": "user", "content": "hi"},\n {"role": "user" "content": "x"}\n]',
            "json",
            3,
            "not JSON",
        ),
        (
            '{"role": "user", "content": "hi"}\n\n{"role": "assistant", "content": ""}\n',
            "jsonl",
            3,
            "content",
        ),
        ('{"role": "user", "content": "hi"}\n{"role": "user", "content": "hi"', "jsonl", 2, "not JSON"),
        (
            '[{"role": "user", "content": "a", "msg_id": "m"}, {"role": "user", "content": "b", "msg_id": "m"}]',
            "json",
            1,
            "repeats",
        ),
        ("{}", "json", 1, "array"),
        ("   \n", "markdown", None, "no turns"),
    ],
)
def test_a_bad_file_names_its_line(text: str, fmt: Any, line: int | None, words: str) -> None:
    with pytest.raises(TranscriptError) as err:
        parse(text, fmt)
    assert err.value.line == line and words in str(err.value)


# -- through the API ----------------------------------------------------------------------


async def test_markdown_ingest_appends_each_turn_once(ingest, call, api, ns, mint, tmp_path: Path) -> None:
    admin = mint(ns, "admin")
    await _record(call, ns, admin)
    path = tmp_path / "session.md"
    path.write_text(MARKDOWN)

    dry = await ingest("--namespace", ns, "--file", str(path), "--dry-run", "--json", token=None)
    assert dry.code == 0, dry.err
    assert dry.json()["turns"] == 4 and dry.json()["by_role"] == {"user": 2, "assistant": 2}
    thread_id = dry.json()["thread_id"]
    assert await _listed(api, ns, admin, thread_id) == []  # a dry run sends nothing

    first = await ingest("--namespace", ns, "--file", str(path), "--json")
    assert first.code == 0, first.err
    assert first.json()["thread_id"] == thread_id and first.json()["stored"] == 4
    listed = await _listed(api, ns, admin, thread_id)
    assert [(m["role"], m["content"]) for m in listed] == [
        (t.role, t.content) for t in parse(MARKDOWN, "markdown")
    ]

    again = await ingest("--namespace", ns, "--file", str(path), "--json")
    assert again.json()["duplicate"] == 4 and "stored" not in again.json()
    assert len(await _listed(api, ns, admin, thread_id)) == 4


async def test_json_and_jsonl_with_their_own_ids_a_high_turn_and_a_user(
    ingest, call, api, ns, mint, tmp_path: Path
) -> None:
    admin = mint(ns, "admin")
    await _record(call, ns, admin)
    items = [
        {"role": "user", "content": "Where do the invoices go?", "msg_id": "u1"},
        {"role": "assistant", "content": "To the new ledger.", "msg_id": "a1"},
        {"role": "user", "content": HIGH, "msg_id": "u2"},
    ]
    as_json = tmp_path / "export.json"
    as_json.write_text(json.dumps(items, indent=2))
    ran = await ingest(
        "--namespace", ns, "--file", str(as_json), "--thread-id", "t-json", "--user-id", "u-7", "--json"
    )
    assert ran.code == 0, ran.err
    assert ran.json()["stored"] == 2 and ran.json()["skipped_high"] == 1
    listed = await _listed(api, ns, admin, "t-json")
    assert [m["msg_id"] for m in listed] == ["u1", "a1", "u2"]
    assert {m["user_id"] for m in listed} == {"u-7"}

    as_jsonl = tmp_path / "export.log"  # no telling suffix: JSONL by its first character
    as_jsonl.write_text("\n".join(json.dumps(i) for i in items[:2]) + "\n")
    ran = await ingest("--namespace", ns, "--file", str(as_jsonl), "--thread-id", "t-json", "--json")
    assert ran.json()["duplicate"] == 2


async def test_a_namespace_that_does_not_record_keeps_nothing(ingest, api, ns, mint, tmp_path: Path) -> None:
    path = tmp_path / "s.md"
    path.write_text(MARKDOWN)
    ran = await ingest("--namespace", ns, "--file", str(path), "--thread-id", "t", "--json")
    assert ran.code == 0, ran.err
    assert ran.json()["logging_disabled"] == 4
    assert await _listed(api, ns, mint(ns, "admin"), "t") == []


async def test_a_long_transcript_goes_in_several_batches(ingest, call, api, ns, mint, tmp_path: Path) -> None:
    admin = mint(ns, "admin")
    await _record(call, ns, admin)
    path = tmp_path / "long.jsonl"
    roles = ("user", "assistant")
    path.write_text(
        "".join(json.dumps({"role": roles[i % 2], "content": f"turn {i}"}) + "\n" for i in range(450))
    )
    ran = await ingest("--namespace", ns, "--file", str(path), "--thread-id", "long", "--json")
    assert ran.code == 0, ran.err
    assert ran.json()["stored"] == 450
    assert len(await _listed(api, ns, admin, "long")) == 450


async def test_errors_are_clear_and_exit_non_zero(ingest, ns, mint, tmp_path: Path) -> None:
    bad = tmp_path / "bad.md"
    bad.write_text("# user\nhi\n# assistant\n")
    ran = await ingest("--namespace", ns, "--file", str(bad))
    assert ran.code == 2 and "line 3" in ran.err and "empty" in ran.err

    good = tmp_path / "good.md"
    good.write_text(MARKDOWN)
    ran = await ingest("--namespace", ns, "--file", str(good), token="loom_not_a_token")
    assert ran.code == 1 and "401 unauthorized" in ran.err

    viewer = mint(ns, "viewer")
    ran = await ingest("--namespace", ns, "--file", str(good), token=viewer)
    assert ran.code == 1 and "403 forbidden" in ran.err

    ran = await ingest("--namespace", ns, "--file", str(good), token=None)
    assert ran.code == 1 and "LOOM_TOKEN" in ran.err

    ran = await ingest("--namespace", ns, "--file", str(tmp_path / "missing.md"))
    assert ran.code == 2 and "cannot read" in ran.err
