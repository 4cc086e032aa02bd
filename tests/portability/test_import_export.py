"""`loom import` and `loom export` end to end, on the real engines: each shipped sample
through the CLI, idempotence, resuming, the recording switch and the sensitivity rules,
bad input with its position, and the round trip (export, import into an empty
namespace, export again: equal but for the header's time and namespace)."""

from __future__ import annotations

import asyncio
import gzip
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import zstandard

from loom.clock import next_version
from loom.ops.portability.importing import job_id_of
from loom.portability import files, readers
from loom.portability.schema import LINE, render
from loom.store import conversations as conv_store
from loom.store import memories as memory_store
from loom.store.rows import scalar
from tests.conftest import bearer
from tests.portability.conftest import DATA

HIGH = "the prod login is password=Tr0ub4dor&3xq"


async def _record(call: Any, ns: str, token: str) -> None:
    r = await call("conversation.set_logging", token, namespace=ns, enabled=True)
    assert r.status_code == 200, r.text


async def _job(call: Any, ns: str, token: str) -> dict[str, Any]:
    r = await call("import.status", token, namespace=ns)
    assert r.status_code == 200, r.text
    return r.json()["jobs"][0]  # type: ignore[no-any-return]


async def _embedded(call: Any, ns: str, token: str) -> dict[str, Any]:
    """The namespace's latest import once its background embedding is done."""
    for _ in range(300):
        job = await _job(call, ns, token)
        if job["embedding"]["state"] in ("done", "none"):
            return job
        await asyncio.sleep(0.05)
    raise AssertionError(f"the import's embedding did not finish: {job['embedding']}")


def _rows(services: Any, ns: str, table: str) -> int:
    """Every row version the namespace holds in `table` (what an import adds to)."""
    return int(
        scalar(services.ch, f"SELECT count() FROM {table} WHERE namespace = {{ns:String}}", {"ns": ns})
    )


async def _listed(api: Any, ns: str, token: str, thread_id: str) -> list[dict[str, Any]]:
    r = await api.post(
        "/v1/conversation.list",
        json={"namespace": ns, "thread_id": thread_id, "limit": 100},
        headers=bearer(token),
    )
    assert r.status_code == 200, r.text
    return r.json()["messages"]  # type: ignore[no-any-return]


# -- the samples, through the CLI -----------------------------------------------------------


async def test_chatgpt_export_imports_its_chosen_branch_once_and_embeds_it(
    loom_cli: Any, call: Any, api: Any, services: Any, ns: str, mint: Any
) -> None:
    admin = mint(ns, "admin")
    await _record(call, ns, admin)
    sample = str(DATA / "chatgpt_conversations.json")
    first = await loom_cli("import", sample, "--namespace", ns, "--user-id", "u-7", "--json", token=admin)
    assert first.code == 0, first.err
    got = first.json()
    assert got["format"] == "chatgpt" and got["state"] == "done" and got["units"] == 2
    assert got["counts"]["stored"] == 7 and got["counts"]["thread"] == 2

    ledger = await _listed(api, ns, admin, "chatgpt-conv-ledger-0001")
    # The branch the user last saw (current_node back to the root): the regenerated
    # answer and the hidden system message are not in it; the image part is dropped.
    assert [(m["msg_id"], m["role"]) for m in ledger] == [
        ("u-1", "user"),
        ("a-1", "assistant"),
        ("u-2", "user"),
        ("t-1", "tool"),
        ("a-2", "assistant"),
    ]
    assert ledger[1]["metadata"]["model"] == "gpt-4o" and ledger[4]["metadata"]["model"] == "gpt-4o-mini"
    assert ledger[0]["ts"].startswith("2024-12-04T08:13:21.5") and ledger[0]["user_id"] == "u-7"
    assert ledger[2]["content"] == "Here is the old ledger's export screen. Where do refunds go?"
    thread = await call("conversation.get", admin, namespace=ns, thread_id="chatgpt-conv-ledger-0001")
    assert thread.json()["thread"]["title"] == "Ledger migration"
    assert thread.json()["thread"]["created_at"].startswith("2024-12-04T08:13:20.123456")

    job = await _embedded(call, ns, admin)
    # The tool turn is not embedded; the dashboard's Imports page shows the same.
    assert job["embedding"]["to_embed"] == 6 and job["embedding"]["embedded"] == 6
    page = await api.get(f"/dashboard/imports?ns={ns}", cookies={"loom_dashboard": admin})
    assert "chatgpt_conversations.json" in page.text and "6 of 6 embedded" in page.text
    hits = await call(
        "conversation.search", admin, namespace=ns, query="When does the first ferry leave on Sundays?"
    )
    assert hits.json()["hits"][0]["msg_id"] == "q-1"

    # A second import of the same file adds nothing: not a row, not a version.
    before = {t: _rows(services, ns, t) for t in ("conversations", "threads", "conversation_embeddings")}
    again = await loom_cli("import", sample, "--namespace", ns, "--user-id", "u-7", "--json", token=admin)
    assert again.code == 0, again.err
    assert again.json()["counts"]["duplicate"] == 7 and "stored" not in again.json()["counts"]
    await _embedded(call, ns, admin)
    assert {t: _rows(services, ns, t) for t in before} == before


async def test_claude_openai_and_transcript_samples_import(
    loom_cli: Any, call: Any, api: Any, ns: str, mint: Any
) -> None:
    admin = mint(ns, "admin")
    await _record(call, ns, admin)
    expected = {
        "claude_conversations.json": ("claude", 4),
        "openai_messages.jsonl": ("openai", 6),
        "transcript.md": ("markdown", 2),
    }
    for name, (fmt, stored) in expected.items():
        ran = await loom_cli(
            "import", str(DATA / name), "--namespace", ns, "--agent", "importer", "--json", token=admin
        )
        assert ran.code == 0, ran.err
        assert (ran.json()["format"], ran.json()["counts"]["stored"]) == (fmt, stored)
    claude = await api.post(
        "/v1/conversation.list",
        json={
            "namespace": ns,
            "agent": "importer",
            "thread_id": "claude-c1a0c1a0-0000-4000-8000-000000000001",
        },
        headers=bearer(admin),
    )
    turns = claude.json()["messages"]
    assert [(m["role"], m["msg_id"]) for m in turns] == [("user", "m-0001"), ("assistant", "m-0002")]
    assert turns[1]["content"].startswith("Move it to Postgres 16")  # from its text blocks
    assert turns[1]["ts"].startswith("2024-11-02T09:15:20.5")
    openai = await api.post(
        "/v1/conversation.list",
        json={"namespace": ns, "agent": "importer", "thread_id": "openai-req-42"},
        headers=bearer(admin),
    )
    assert [(m["role"], m["content"]) for m in openai.json()["messages"]] == [
        ("system", "Answer in one line."),
        ("user", "What is the capital of Slovenia?"),
        ("assistant", "Ljubljana."),
    ]


# -- the rules appends follow ------------------------------------------------------------


async def test_recording_off_stores_nothing_and_high_turns_are_stored_never_embedded(
    loom_cli: Any, call: Any, api: Any, services: Any, ns: str, mint: Any, tmp_path: Path, leak_spy: Any
) -> None:
    admin = mint(ns, "admin")
    path = tmp_path / "session.jsonl"
    path.write_text(
        json.dumps({"role": "user", "content": HIGH})
        + "\n"
        + json.dumps({"role": "assistant", "content": "Stored."})
        + "\n"
    )
    off = await loom_cli(
        "import", str(path), "--namespace", ns, "--thread-id", "t-high", "--json", token=admin
    )
    assert off.code == 0, off.err
    assert off.json()["counts"]["logging_disabled"] == 2 and _rows(services, ns, "conversations") == 0

    await _record(call, ns, admin)
    with_renamed = tmp_path / "session-2.jsonl"  # another file: another job
    with_renamed.write_text(path.read_text() + json.dumps({"role": "user", "content": "more"}) + "\n")
    on = await loom_cli(
        "import", str(with_renamed), "--namespace", ns, "--thread-id", "t-high", "--json", token=admin
    )
    assert on.code == 0, on.err
    assert on.json()["counts"]["stored"] == 3 and on.json()["counts"]["high"] == 1
    job = await _embedded(call, ns, admin)
    assert job["embedding"]["embedded"] == 2
    listed = await _listed(api, ns, admin, "t-high")
    assert listed[0]["content"] == HIGH  # stored verbatim ...
    embedded = scalar(
        services.ch,
        "SELECT count() FROM conversation_embeddings WHERE namespace = {ns:String} AND msg_id = {m:String}",
        {"ns": ns, "m": listed[0]["msg_id"]},
    )
    assert embedded == 0  # ... never embedded (and the leak spy saw no provider get it)


# -- bad input -----------------------------------------------------------------------------


def _claude_with(tmp_path: Path, sender: str) -> Path:
    convs = json.loads((DATA / "claude_conversations.json").read_text())
    convs[1]["chat_messages"][0]["sender"] = sender
    path = tmp_path / f"claude-{sender}.json"
    path.write_text(json.dumps(convs))
    return path


async def test_a_bad_record_stops_its_batch_or_is_skipped_as_asked(
    loom_cli: Any, call: Any, services: Any, ns: str, mint: Any, tmp_path: Path
) -> None:
    admin = mint(ns, "admin")
    await _record(call, ns, admin)
    bad = _claude_with(tmp_path, "robot")

    stopped = await loom_cli("import", str(bad), "--namespace", ns, "--json", token=admin)
    assert stopped.code == 3, stopped.err
    where = "conversation 1 (c1a0c1a0-0000-4000-8000-000000000002) message 0 (m-0003)"
    assert f"{where}: unknown role 'robot'" in stopped.err
    summary = stopped.json()
    assert summary["state"] == "stopped" and summary["errors"][0]["pos"] == where
    assert _rows(services, ns, "conversations") == 0  # nothing of that batch was written

    skipped = await loom_cli(
        "import", str(bad), "--namespace", ns, "--on-error", "skip", "--json", token=admin
    )
    assert skipped.code == 0, skipped.err
    assert skipped.json()["counts"]["stored"] == 3 and skipped.json()["counts"]["skipped"] == 1
    job = await _job(call, ns, admin)
    assert job["errors"][0]["pos"] == where and "unknown role" in job["errors"][0]["message"]


async def test_a_malformed_file_and_an_oversized_record_name_their_position(
    loom_cli: Any, call: Any, services: Any, ns: str, mint: Any, tmp_path: Path
) -> None:
    admin = mint(ns, "admin")
    await _record(call, ns, admin)
    text = (DATA / "chatgpt_conversations.json").read_text()
    cut = tmp_path / "cut.json"
    cut.write_text(text[: text.index('"title": "Ferry timetable"') + 40])  # the second conversation cut short
    broken = await loom_cli(
        "import", str(cut), "--namespace", ns, "--format", "chatgpt", "--batch", "2", token=admin
    )
    assert broken.code == 3
    assert "after conversation 0: malformed JSON" in broken.err
    # Batches before the break were committed (two records a batch): a resume starts there.
    job = await _job(call, ns, admin)
    assert job["state"] == "stopped" and job["next_seq"] >= 3

    big = tmp_path / "big.jsonl"
    lines = [
        {
            "messages": [
                {"role": "user", "content": "short question"},
                {"role": "assistant", "content": "short answer"},
            ]
        },
        {"messages": [{"role": "user", "content": "x" * 1_000_001}]},
    ]
    big.write_text("\n".join(json.dumps(x) for x in lines) + "\nnot json\n")
    ran = await loom_cli("import", str(big), "--namespace", ns, "--on-error", "skip", "--json", token=admin)
    assert ran.code == 0, ran.err
    errors = {e["pos"]: e["message"] for e in ran.json()["errors"]}
    assert "1,000,001 characters, over the limit of 1,000,000" in errors["line 2 message 0"]
    assert errors["line 3"].startswith("not JSON")
    assert ran.json()["counts"]["stored"] == 2 and ran.json()["counts"]["skipped"] == 2


async def test_an_import_cut_short_resumes_from_its_last_committed_batch(
    loom_cli: Any, call: Any, services: Any, ns: str, mint: Any
) -> None:
    admin = mint(ns, "admin")
    await _record(call, ns, admin)
    path = DATA / "claude_conversations.json"
    options = {"on_error": "stop"}
    # What a run that died after its first batch left: the job, one batch committed.
    start = await call(
        "import.start",
        admin,
        namespace=ns,
        source=path.name,
        fingerprint=files.fingerprint(path),
        format="claude",
        options=options,
    )
    assert start.status_code == 200, start.text
    assert start.json()["job_id"] == job_id_of(ns, files.fingerprint(path), "claude", options)
    with files.open_source(path) as opened:
        first = next(readers.read("claude", files.buffered(opened.stream), readers.Mapping(), path))
    wrote = await call(
        "import.write",
        admin,
        job_id=start.json()["job_id"],
        seq=0,
        position=json.dumps({"unit": 1, "sub": 0}),
        records=first.records,
        units=1,
    )
    assert wrote.status_code == 200, wrote.text
    again = await call("import.write", admin, job_id=start.json()["job_id"], seq=0, position="x", records=[])
    assert again.json()["committed"] is False  # a retried batch writes nothing
    late = await call("import.write", admin, job_id=start.json()["job_id"], seq=5, position="x", records=[])
    assert late.status_code == 409 and late.json()["field"] == "seq"

    resumed = await loom_cli("import", str(path), "--namespace", ns, "--json", token=admin)
    assert resumed.code == 0, resumed.err
    assert "resuming import" in resumed.err
    counts = resumed.json()["counts"]
    assert counts["stored"] == 4 and "duplicate" not in counts  # the second conversation only was sent again
    assert resumed.json()["units"] == 2


# -- the round trip ------------------------------------------------------------------------


async def _rich_namespace(call: Any, services: Any, ns: str, admin: str) -> None:
    """Saved, redacted, deleted, compacted and superseded items, briefs with revisions,
    evidence and decisions."""
    await _record(call, ns, admin)
    turns = [
        {"msg_id": f"m{i}", "role": "user" if i % 2 == 0 else "assistant", "content": text, "user_id": "u-1"}
        for i, text in enumerate(
            [
                "We moved invoices to the new ledger.",
                "Noted: invoices now go to the new ledger.",
                "My card is 4111 1111 1111 1111 for the refund.",
                "Refunds stay on the old ledger until March.",
                "Please forget what I said about the vendor.",
                "Forgotten.",
                "Which region hosts the ledger?",
                "Frankfurt, eu-central-1.",
            ]
        )
    ]
    r = await call(
        "conversation.append", admin, namespace=ns, agent="a", turns=[{"thread_id": "t1", **t} for t in turns]
    )
    assert r.status_code == 200, r.text
    await call(
        "conversation.append",
        admin,
        namespace=ns,
        agent="a",
        thread_id="t2",
        role="user",
        content="hi",
        user_id="u-2",
    )
    assert (
        await call("conversation.update", admin, namespace=ns, agent="a", thread_id="t1", title="Ledger")
    ).status_code == 200
    saved = await call(
        "conversation.save_message",
        admin,
        namespace=ns,
        agent="a",
        user_id="u-1",
        conversation_id="t1",
        message_id="m1",
    )
    assert saved.status_code == 200, saved.text
    red = await call(
        "conversation.redact", admin, namespace=ns, agent="a", thread_id="t1", msg_id="m2", high=True
    )
    assert red.status_code == 200, red.text
    gone = await call(
        "conversation.delete_message", admin, namespace=ns, agent="a", thread_id="t1", msg_id="m4"
    )
    assert gone.status_code == 200, gone.text
    # A compaction's writes (the summarizer needs a model): the summary, the turns it replaced tombstoned.
    now = datetime.now(UTC)
    summary = conv_store.Turn(
        namespace=ns,
        agent="a",
        thread_id="t1",
        msg_id="summary-1",
        ts=now - timedelta(days=1),
        role="system",
        content="The user moved invoices to the new ledger.",
        metadata={"compacted_from": ["m0", "m1"]},
        is_summary=True,
        version=next_version(),
    )
    originals = await services.run(conv_store.states, services.ch, [(ns, "a", "t1", "m0")])
    assert originals
    replaced = conv_store.Turn(
        namespace=ns,
        agent="a",
        thread_id="t1",
        msg_id="m0",
        ts=now - timedelta(days=2),
        role="user",
        content="We moved invoices to the new ledger.",
        user_id="u-1",
        tombstoned=True,
        tombstoned_at=now,
        tombstone_reason="compacted",
        version=next_version(),
    )
    await services.run(conv_store.insert, services.ch, [summary, replaced])
    for sections in ({"goal": "Move the ledger"}, {"goal": "Move the ledger", "status": "invoices moved"}):
        b = await call("session.brief_save", admin, namespace=ns, brief_key="ledger", sections=sections)
        assert b.status_code == 200, b.text
    for text in ("Wants invoices in EUR", "Wants invoices in USD"):  # the second supersedes the first
        f = await call(
            "memory.set", admin, namespace=ns, user_id="u-1", facts=[{"text": text, "key": "currency"}]
        )
        assert f.status_code == 200, f.text
    forget = await call("memory.set", admin, namespace=ns, user_id="u-1", facts=[{"text": "Likes ferries"}])
    await call(
        "memory.delete",
        admin,
        namespace=ns,
        user_id="u-1",
        memory_ids=[forget.json()["results"][0]["memory_id"]],
    )
    ev = await call(
        "memory.set_from_messages",
        admin,
        namespace=ns,
        user_id="u-1",
        messages=[{"role": "user", "content": "I live in Lyon."}],
    )
    assert ev.status_code == 200, ev.text
    await services.run(
        memory_store.record_decisions,
        services.ch,
        [
            {
                "namespace": ns,
                "user_id": "u-1",
                "extraction_id": "x-1",
                "seq": 0,
                "action": "add",
                "memory_id": "",
                "text": "Lives in Lyon",
                "evidence_ids": ["e-1"],
                "created_at": now,
            }
        ],
    )


def _lines(path: Path) -> list[bytes]:
    raw = path.read_bytes()
    if raw.startswith(files.GZIP_MAGIC):
        raw = gzip.decompress(raw)
    elif raw.startswith(files.ZSTD_MAGIC):
        raw = zstandard.ZstdDecompressor().stream_reader(raw).read()
    return raw.splitlines()


async def test_export_import_export_round_trips(
    loom_cli: Any, call: Any, api: Any, services: Any, ns: str, mint: Any, tmp_path: Path
) -> None:
    other = f"{ns}b"
    admin = mint([ns, other], "admin")
    await _rich_namespace(call, services, ns, admin)
    first, second = tmp_path / "a.ndjson.gz", tmp_path / "b.ndjson.zst"
    out = await loom_cli("export", "--namespace", ns, "--output", str(first), token=admin)
    assert out.code == 0, out.err
    imported = await loom_cli("import", str(first), "--namespace", other, "--json", token=admin)
    assert imported.code == 0, imported.err
    assert imported.json()["format"] == "loom" and imported.json()["counts"]["namespace"] == 1
    await _embedded(call, other, admin)
    again = await loom_cli(
        "export", "--namespace", other, "--output", str(second), "--compression", "zstd", token=admin
    )
    assert again.code == 0, again.err

    a, b = _lines(first), _lines(second)
    header_a, header_b = json.loads(a[0]), json.loads(b[0])
    for h in (header_a, header_b):
        h.pop("exported_at"), h.pop("namespace")
    assert header_a == header_b
    assert a[1:] == b[1:]  # every row and the end line's checksum: equal
    kinds = [json.loads(x)["kind"] for x in a]
    for kind in (
        "namespace",
        "thread",
        "turn",
        "redaction",
        "brief",
        "brief_revision",
        "memory",
        "memory_evidence",
        "memory_decision",
    ):
        assert kind in kinds, kind
    for raw in a:
        LINE.validate_json(raw)  # every line is one the documented schema describes
    rows = [json.loads(x) for x in a[1:-1]]
    turns = {r["msg_id"]: r for r in rows if r["kind"] == "turn" and r["thread_id"] == "t1"}
    assert turns["m1"]["is_saved"] and turns["m1"]["saved_at"]
    assert "[redacted]" in turns["m2"]["content"] and "4111" not in turns["m2"]["content"]
    assert (
        turns["m4"]["tombstoned"]
        and turns["m4"]["tombstone_reason"] == "deleted"
        and turns["m4"]["content"] == ""
    )
    assert turns["m0"]["tombstone_reason"] == "compacted" and turns["summary-1"]["is_summary"]
    facts = [r for r in rows if r["kind"] == "memory"]
    assert any(f["superseded_by"] for f in facts) and any(f["tombstoned"] for f in facts)
    assert {r["action"] for r in rows if r["kind"] == "redaction"} == {"redacted", "deleted"}
    # The imported namespace works: its facts were embedded and are found as the source's are.
    texts = []
    for where in (ns, other):
        found = await call(
            "memory.search", admin, namespace=where, user_id="u-1", query="Wants invoices in USD"
        )
        texts.append([(h["text"], h["legs"]) for h in found.json()["hits"]])
    assert texts[0] == texts[1] and texts[1][0][0] == "Wants invoices in USD" and "vector" in texts[1][0][1]


async def test_a_user_or_thread_export_holds_only_its_rows(
    call: Any, api: Any, services: Any, ns: str, mint: Any
) -> None:
    admin = mint(ns, "admin")
    await _rich_namespace(call, services, ns, admin)
    r = await api.post(
        "/v1/export.start",
        json={"namespace": ns, "user_id": "u-2", "compression": "none"},
        headers=bearer(admin),
    )
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
    rows = [json.loads(x) for x in r.content.splitlines()]
    assert rows[0]["scope"] == {"user_id": "u-2"} and rows[-1]["rows"] == len(rows) - 2
    assert [(x["kind"], x.get("thread_id")) for x in rows[1:-1]] == [("thread", "t2"), ("turn", "t2")]
    # A thread's export, gzip-encoded (the client decodes it as it reads).
    t = await api.post("/v1/export.start", json={"namespace": ns, "thread_id": "t2"}, headers=bearer(admin))
    assert t.headers["content-encoding"] == "gzip"
    assert {json.loads(x)["kind"] for x in t.content.splitlines()} == {
        "header",
        "thread",
        "turn",
        "end",
    }
    bounded = mint(ns, "writer", read_scope="own_user", read_user_id="u-2")
    refused = await api.post("/v1/export.start", json={"namespace": ns}, headers=bearer(bounded))
    assert refused.status_code == 403


def test_the_documented_schema_is_current() -> None:
    path = Path(__file__).resolve().parents[2] / "docs" / "export-format.schema.json"
    assert path.read_text() == render(), (
        "run: python -m loom.portability.schema > docs/export-format.schema.json"
    )


async def test_the_recovery_pass_leaves_an_imports_turns_to_its_own_pass(services: Any, ns: str) -> None:
    """A turn an import stored is its own background pass's to embed: the recovery pass
    skips the turns inside a registered window (and only those)."""
    from loom.ops.portability import windows
    from loom.providers.embedders import FakeEmbedder, SpyEmbedder
    from tests.embedding.test_recovery import orphan, rewind, run_pass

    ch = services.ch
    rewind(ch)
    imported = [
        conv_store.Turn(
            namespace=ns,
            agent="default",
            thread_id="t",
            msg_id=f"imp-{i}",
            ts=datetime.now(UTC),
            role="user",
            content=f"an imported turn {i}",
            appended_by="tok-import",
            version=next_version(),
        )
        for i in range(2)
    ]
    await services.run(conv_store.insert, ch, imported)
    orphan(ch, ns, "crash", "a turn a crash left unembedded")
    now = datetime.now(UTC)
    await windows.put(
        services.redis, f"imp-{ns}", ns, "tok-import", now - timedelta(minutes=1), now + timedelta(minutes=1)
    )
    try:
        spy = SpyEmbedder(FakeEmbedder())
        report = await run_pass(services, spy)
    finally:
        await windows.remove(services.redis, f"imp-{ns}")
    assert report.skipped_import == 2
    assert "a turn a crash left unembedded" in spy.texts and not [
        t for t in spy.texts if "imported turn" in t
    ]
