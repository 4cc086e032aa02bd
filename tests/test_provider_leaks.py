"""No text that reads as high reaches a provider, whichever op a client calls and
whichever field it fills.

Every provider is a spy here (the ``leak_spy`` fixture, tests/leaks.py): the test fails
when any of them receives text that reads as high. :data:`DRIVERS` lists the ops that
can reach a provider, each driven with high text in every field a client can fill
(content, reasoning, metadata values, titles, brief sections and events, queries),
through the API. A later op that reaches a provider (the titler, compaction's
summarizer, extraction) adds its driver to the list, and its provider to
tests/leaks.py's PROVIDERS.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from loom.clock import next_version, utcnow
from loom.providers.embedders import FakeEmbedder
from loom.providers.llm import ChatMessage, ScriptedLLM
from loom.sensitivity import reads_as_high
from loom.store import conversations as conv_store
from loom.store import embeddings as emb_store
from loom.store import namespaces, recording_cache, search_marks
from tests.leaks import LeakSpy, LeakSpyEmbedder, LeakSpyLLM

# One text of each shape that reads as high.
HIGH = {
    "api_key": "here is the key: sk-proj-4fQ9xT2mZ8vK1pL7wR3nB6yH0cJ5dG",
    "password": "the prod login is password=Tr0ub4dor&3xq",
    "card": "charge my card 4111 1111 1111 1111 for the renewal",
    "ssn": "my SSN is 123-45-6789",
    "pin": "my PIN is 4821",
}
CLEAN = "the quarterly capacity plan for the storage cluster"
# Clean for longer than anything is embedded or kept (2,048 characters), high after.
LONG_TAIL = (CLEAN + ". ") * 60 + HIGH["password"]


@dataclass
class Ctx:
    call: Callable[..., Awaitable[Any]]
    ns: str
    writer: str
    admin: str
    services: Any
    spy: LeakSpy
    http: Any = None  # the API's own client, for the dashboard's pages
    answers: list[int] = field(default_factory=list)

    async def ok(self, op: str, token: str, **body: Any) -> dict[str, Any]:
        r = await self.call(op, token, **body)
        assert r.status_code == 200, (op, r.status_code)  # never print a body that may hold high text
        return r.json()  # type: ignore[no-any-return]


Driver = Callable[[Ctx], Awaitable[None]]


async def drive_append(ctx: Ctx) -> None:
    turns = []
    for kind, text in HIGH.items():
        for role in ("user", "assistant"):
            turns += [
                {"thread_id": "leak", "role": role, "msg_id": f"{kind}-{role}-content", "content": text},
                {
                    "thread_id": "leak",
                    "role": role,
                    "msg_id": f"{kind}-{role}-reasoning",
                    "content": CLEAN,
                    "reasoning": text,
                },
                {
                    "thread_id": "leak",
                    "role": role,
                    "msg_id": f"{kind}-{role}-metadata",
                    "content": CLEAN + " ",
                    "metadata": {"note": text, "nested": {"deep": [text]}},
                },
            ]
    turns.append({"thread_id": "leak", "role": "user", "msg_id": "tail", "content": LONG_TAIL})
    body = await ctx.ok("conversation.append", ctx.writer, namespace=ctx.ns, turns=turns)
    assert all(r["stored"] for r in body["results"])
    # One at a time as well (the single-turn path).
    await ctx.ok(
        "conversation.append",
        ctx.writer,
        namespace=ctx.ns,
        thread_id="leak",
        role="user",
        content=HIGH["card"],
        msg_id="single",
    )


async def drive_save(ctx: Ctx) -> None:
    for kind, text in HIGH.items():
        body = await ctx.ok(
            "conversation.save_message",
            ctx.writer,
            namespace=ctx.ns,
            user_id="alice",
            conversation_id="saved",
            message_id=f"new-{kind}",
            role="user",
            content=text,
        )
        assert body["reason"] == "high_sensitivity"
        await ctx.ok(
            "conversation.save_message",
            ctx.writer,
            namespace=ctx.ns,
            user_id="alice",
            conversation_id="saved",
            message_id=f"meta-{kind}",
            role="user",
            content=f"{CLEAN} {kind}",
            metadata={"note": text},
        )
        # A high turn the transcript holds (appended above).
        await ctx.ok(
            "conversation.save_message",
            ctx.writer,
            namespace=ctx.ns,
            user_id="alice",
            conversation_id="leak",
            message_id=f"{kind}-user-content",
        )
    await ctx.ok(
        "conversation.save_message",
        ctx.writer,
        namespace=ctx.ns,
        user_id="alice",
        conversation_id="saved",
        message_id="tail",
        role="user",
        content=LONG_TAIL,
    )


async def drive_search(ctx: Ctx) -> None:
    for text in [*HIGH.values(), LONG_TAIL[-200:], CLEAN]:
        for search_mode in ("vector", "hybrid", "lexical"):
            await ctx.ok(
                "conversation.search",
                ctx.writer,
                query=text,
                namespace_scope="one",
                namespace=ctx.ns,
                search_mode=search_mode,
            )
        for mode in ("hybrid", "semantic", "lexical"):
            await ctx.ok(
                "conversation.search_saved_messages",
                ctx.writer,
                namespace=ctx.ns,
                user_id="alice",
                query=text,
                search_mode=mode,
            )


async def drive_search_rerank(ctx: Ctx) -> None:
    """A re-rank sends the query and the hits' excerpts to the LLM: never a high query
    (nor a hit that reads as high), in any mode; a clean query is sent (the spy sees it)."""
    before = ctx.spy.seen.get("llm:api", 0)
    for text in [*HIGH.values(), CLEAN, "storage capacity plan " + HIGH["card"]]:
        for search_mode in ("vector", "hybrid", "lexical"):
            got = await ctx.ok(
                "conversation.search",
                ctx.writer,
                query=text,
                namespace=ctx.ns,
                search_mode=search_mode,
                rerank=True,
                limit=50,
            )
            assert got["rerank"] in ("reranked", "query_high_sensitivity", "nothing_to_rerank"), got["rerank"]
    assert ctx.spy.seen.get("llm:api", 0) > before  # the clean query's hits were re-ranked


async def drive_threads(ctx: Ctx) -> None:
    for kind, text in HIGH.items():
        await ctx.ok(
            "conversation.create",
            ctx.writer,
            namespace=ctx.ns,
            thread_id=f"titled-{kind}",
            title=text,
            metadata={"note": text},
        )
        await ctx.ok(
            "conversation.append",
            ctx.writer,
            namespace=ctx.ns,
            thread_id=f"titled-{kind}",
            role="user",
            content=CLEAN,
        )
        await ctx.ok(
            "conversation.update",
            ctx.writer,
            namespace=ctx.ns,
            thread_id=f"titled-{kind}",
            title=f"{text} (2)",
            metadata={"note": [text]},
        )


def _legacy_rows(ctx: Ctx) -> None:
    """Rows an earlier build wrote: the kept text clean, the transcript high beyond it."""
    now = utcnow()
    content = LONG_TAIL
    conv_store.insert(
        ctx.services.ch,
        [
            conv_store.Turn(
                namespace=ctx.ns,
                agent="default",
                thread_id="old",
                msg_id=m,
                ts=now,
                role="user",
                content=content,
                version=next_version(),
            )
            for m in ("k2048", "k240")
        ],
    )
    fake = FakeEmbedder()
    emb_store.insert(
        ctx.services.ch,
        [
            emb_store.EmbeddingRow(
                ctx.ns,
                "old",
                m,
                "default",
                "user",
                "",
                "",
                now,
                content[:n],
                fake.embed([content[:n]])[0],
                "legacy",
                version=next_version(),
            )
            for m, n in (("k2048", 2048), ("k240", 240))
        ],
    )
    search_marks.record(ctx.services.ch, [(ctx.ns, "")], next_version() + search_marks.CLOCK_MARGIN_NS)


async def drive_reembed(ctx: Ctx) -> None:
    _legacy_rows(ctx)
    report = await ctx.ok("conversation.reembed", ctx.admin, namespace=ctx.ns)
    assert report["skipped_high"] >= 2 and report["reembedded"] > 0


async def drive_briefs(ctx: Ctx) -> None:
    sections = {
        "goal": HIGH["password"],
        "status": HIGH["api_key"],
        "decisions": list(HIGH.values()),
        "dead_ends": [HIGH["card"]],
        "done": [HIGH["ssn"]],
        "open_questions": [HIGH["pin"]],
        "next_steps": [HIGH["password"], CLEAN],
        "key_files": [HIGH["api_key"]],
        "constraints": [HIGH["card"]],
        "pointers": [HIGH["ssn"]],
    }
    await ctx.ok("session.brief_save", ctx.writer, namespace=ctx.ns, brief_key="leaky", sections=sections)
    events = [
        {"kind": kind, "text": text}
        for text in [*HIGH.values(), LONG_TAIL]
        for kind in ("user", "assistant", "command", "error", "note", "tool", "summary")
    ]
    events += [{"kind": "edit", "text": CLEAN, "path": "src/app.py"}, {"kind": "user", "text": CLEAN}]
    body = await ctx.ok(
        "session.brief_save", ctx.writer, namespace=ctx.ns, brief_key="leaky", events=events, event_cursor="1"
    )
    assert body["author"] == "llm" and body["events_withheld"] > 0
    # Events and sections at once, and a brief started from events.
    await ctx.ok(
        "session.brief_save",
        ctx.writer,
        namespace=ctx.ns,
        brief_key="leaky",
        events=events,
        sections={"goal": HIGH["ssn"]},
        event_cursor="2",
    )
    await ctx.ok(
        "session.brief_save", ctx.writer, namespace=ctx.ns, brief_key="fresh", events=events, event_cursor="3"
    )


async def drive_compact(ctx: Ctx) -> None:
    """conversation.compact's summarizer (the worker's LLM): high turns in the window are
    never sent; neither reasoning nor metadata is."""
    turns = []
    for i, text in enumerate(HIGH.values()):
        turns += [
            {"thread_id": "compact", "role": "user", "content": text},
            {
                "thread_id": "compact",
                "role": "assistant",
                "content": f"{CLEAN} {i}",
                "reasoning": text,
                "metadata": {"note": text},
            },
        ]
    turns.append({"thread_id": "compact", "role": "user", "content": LONG_TAIL})
    turns += [{"thread_id": "compact", "role": "user", "content": f"{CLEAN} recent {i}"} for i in range(2)]
    await ctx.ok("conversation.append", ctx.writer, namespace=ctx.ns, turns=turns)
    got = await ctx.ok(
        "conversation.compact",
        ctx.writer,
        namespace=ctx.ns,
        thread_id="compact",
        keep_recent=2,
        min_to_compact=1,
    )
    assert got["messages_summarized"] == len(HIGH)


async def drive_titler(ctx: Ctx) -> None:
    """The conversation_titler's model: the threads above hold high turns, titles and metadata."""
    from loom.ops.conversation.lifecycle.titling import titler_pass

    report = await titler_pass(ctx.services, [ctx.ns])
    assert report.ran and report.titled > 0


async def drive_memory(ctx: Ctx) -> None:
    """memory.set (the embedder), memory.search (the query embedding), memory.set_from_messages
    inline and deferred (the extractor, then the decision call over similar facts)."""
    facts = [{"text": t} for t in HIGH.values()] + [{"text": CLEAN}, {"text": LONG_TAIL[:2000]}]
    body = await ctx.ok("memory.set", ctx.writer, namespace=ctx.ns, user_id="u1", facts=facts)
    assert [r["reason"] for r in body["results"]][:5] == ["high_sensitivity"] * 5
    for query in [*HIGH.values(), CLEAN]:
        await ctx.ok("memory.search", ctx.writer, namespace=ctx.ns, user_id="u1", query=query)
        await ctx.ok("memory.recall", ctx.writer, namespace=ctx.ns, user_id="u1", query=query)
    messages = [{"role": "user", "content": t} for t in [*HIGH.values(), LONG_TAIL, CLEAN]]
    for defer in (False, True):
        await ctx.ok(
            "memory.set_from_messages",
            ctx.writer,
            namespace=ctx.ns,
            user_id="u1",
            messages=messages,
            defer=defer,
        )


async def drive_profile(ctx: Ctx) -> None:
    """memory.profile (the model summarises the user's facts; the fact set just before
    makes it stale, so the read rebuilds it) and context.pack's profile section: the
    model's section that reads as high is never answered."""
    facts = [{"text": t, "kind": "note"} for t in HIGH.values()] + [{"text": CLEAN, "kind": "note"}]
    await ctx.ok("memory.set", ctx.writer, namespace=ctx.ns, user_id="u1", facts=facts)
    body = await ctx.ok("memory.profile", ctx.writer, namespace=ctx.ns, user_id="u1")
    assert body["basis"] == "llm" and body["dropped"] == 1, body["basis"]
    pack = await ctx.ok("context.pack", ctx.writer, namespace=ctx.ns, user_id="u1", include_profile=True)
    for answer in (body, pack):
        assert not [kind for kind, text in HIGH.items() if text in json.dumps(answer)]


async def drive_memory_ask(ctx: Ctx) -> None:
    """memory.ask (the answering model, the query embedding): a question that reads as
    high is never sent nor embedded; a clean one over a memory that holds high messages
    (kept as evidence with no text) and refused high facts sends none of them."""
    for question in HIGH.values():
        got = await ctx.ok("memory.ask", ctx.writer, namespace=ctx.ns, user_id="u1", question=question)
        assert got["reason"] == "question_high_sensitivity" and got["answer"] is None
    got = await ctx.ok("memory.ask", ctx.writer, namespace=ctx.ns, user_id="u1", question=CLEAN)
    assert got["reason"] is None and got["answer"]
    assert not [k for k, t in HIGH.items() if t in json.dumps(got)]


async def drive_dashboard(ctx: Ctx) -> None:
    """The dashboard's pages call the ops above: its search boxes and save form reach the
    embedder, and a page must not show a high text (a masked turn, an excerpt)."""
    signed = await ctx.http.post("/dashboard/signin", data={"token": ctx.admin})
    assert signed.status_code == 303
    cookies = {"loom_dashboard": ctx.admin}
    shown = []
    for text in HIGH.values():
        for path, query in (
            ("/dashboard/conversations", {"ns": ctx.ns, "q": text}),
            ("/dashboard/saved", {"ns": ctx.ns, "user": "alice", "q": text}),
            ("/dashboard/saved/results", {"ns": ctx.ns, "user": "alice", "q": text}),
        ):
            r = await ctx.http.get(path, params=query, cookies=cookies)
            assert r.status_code == 200, path
        r = await ctx.http.post(
            "/dashboard/saved/save",
            data={
                "ns": ctx.ns,
                "user": "alice",
                "conversation_id": "dash",
                "message_id": "m",
                "content": text,
            },
            cookies=cookies,
        )
        assert r.status_code == 303
    for path, query in (
        ("/dashboard/conversations", {"ns": ctx.ns}),
        ("/dashboard/thread", {"ns": ctx.ns, "agent": "default", "thread": "leak"}),
        ("/dashboard/saved", {"ns": ctx.ns, "user": "alice"}),
    ):
        shown.append((await ctx.http.get(path, params=query, cookies=cookies)).text)
    for i, page in enumerate(shown):  # no page shows a high text it was not asked to reveal
        assert not [kind for kind, text in HIGH.items() if text in page], i


async def drive_import(ctx: Ctx) -> None:
    """import.write (facts embedded in the API process) and the import's background
    embedding (the worker's model): high text in turns, reasoning, metadata, a thread's
    title, facts and evidence; the clean turns are embedded, the high ones never sent."""
    job = await ctx.ok(
        "import.start",
        ctx.admin,
        namespace=ctx.ns,
        source="leak.jsonl",
        fingerprint="leak-fingerprint",
        format="loom",
    )
    turns = [{"kind": "turn", "thread_id": "imported", "msg_id": "clean", "role": "user", "content": CLEAN}]
    turns.append(
        {"kind": "turn", "thread_id": "imported", "msg_id": "tail", "role": "user", "content": LONG_TAIL}
    )
    for kind, text in HIGH.items():
        turns += [
            {
                "kind": "turn",
                "thread_id": "imported",
                "msg_id": f"{kind}-c",
                "role": "assistant",
                "content": text,
            },
            {
                "kind": "turn",
                "thread_id": "imported",
                "msg_id": f"{kind}-r",
                "role": "user",
                "content": CLEAN + " r",
                "reasoning": text,
            },
            {
                "kind": "turn",
                "thread_id": "imported",
                "msg_id": f"{kind}-m",
                "role": "user",
                "content": CLEAN + " m",
                "metadata": {"n": text},
            },
        ]
    at = "2026-01-01T00:00:00Z"
    others = [
        {"kind": "thread", "thread_id": "imported", "title": HIGH["password"]},
        *(
            {
                "kind": "memory",
                "user_id": "u1",
                "memory_id": f"imp-{k}",
                "text": t,
                "created_at": at,
                "updated_at": at,
            }
            for k, t in HIGH.items()
        ),
        {
            "kind": "memory",
            "user_id": "u1",
            "memory_id": "imp-clean",
            "text": CLEAN,
            "created_at": at,
            "updated_at": at,
        },
        {
            "kind": "memory",
            "user_id": "u1",
            "memory_id": "imp-tail",
            "text": LONG_TAIL,
            "created_at": at,
            "updated_at": at,
        },
        {
            "kind": "memory_evidence",
            "user_id": "u1",
            "evidence_id": "imp-e",
            "content": HIGH["ssn"],
            "ts": at,
            "created_at": at,
        },
    ]
    body = await ctx.ok(
        "import.write",
        ctx.admin,
        job_id=job["job_id"],
        seq=0,
        position="end",
        records=others + turns,
        final="done",
    )
    assert body["batch"]["stored"] == len(turns) and body["batch"]["high"] == len(HIGH) + 1
    for _ in range(200):  # the worker embeds the clean ones
        status = await ctx.ok("import.status", ctx.admin, job_id=job["job_id"])
        if status["jobs"][0]["embedding"]["state"] == "done":
            break
        await asyncio.sleep(0.05)
    assert status["jobs"][0]["embedding"]["embedded"] == 1 + 2 * len(HIGH), status["jobs"][0]["embedding"]


# The ops that can reach a provider. A later feature adds its own.
DRIVERS: list[tuple[str, Driver]] = [
    ("conversation.append", drive_append),
    ("conversation.save_message", drive_save),
    ("conversation.search + search_saved_messages", drive_search),
    ("conversation.search's LLM re-rank", drive_search_rerank),
    ("conversation.create + update", drive_threads),
    ("conversation.reembed", drive_reembed),
    ("session.brief_save", drive_briefs),
    ("conversation.compact", drive_compact),
    ("conversation_titler", drive_titler),
    ("memory.set + search + set_from_messages", drive_memory),
    ("memory.profile + context.pack's profile", drive_profile),
    ("memory.ask", drive_memory_ask),
    ("the dashboard's pages", drive_dashboard),
    ("import.write + the import's embedding", drive_import),
]


def _brief_model(messages: list[ChatMessage]) -> str:
    if "extract durable facts" in messages[0].content:  # the memory extractor (it proposes a high fact too)
        return json.dumps({"facts": [CLEAN + " again", HIGH["ssn"]]})
    if "long-term memory consistent" in messages[0].content:
        return json.dumps({"decisions": [{"event": "ADD", "text": CLEAN + " again"}]})
    if "living profile" in messages[0].content:  # the profile (it writes a high section too)
        return json.dumps({"sections": {"work": CLEAN, "other": HIGH["card"]}})

    if "You rank the turns" in messages[0].content:  # conversation.search's re-rank
        turns = json.loads(messages[-1].content)["turns"]
        return json.dumps({"ranking": [t["id"] for t in reversed(turns)]})
    if "answer a question about one user" in messages[0].content:  # memory.ask
        return json.dumps({"answer": "They plan storage capacity quarterly.", "citations": ["F1", "E1"]})
    return json.dumps({"status": "revised", "new_done": ["a step"]})


def test_every_high_text_reads_as_high() -> None:
    """The test's premise: each text it sends reads as high, and the clean one does not."""
    assert all(reads_as_high(t) for t in HIGH.values())
    assert reads_as_high(LONG_TAIL) and not reads_as_high(LONG_TAIL[:2048]) and not reads_as_high(CLEAN)


def test_the_spy_fails_on_a_high_text() -> None:
    """The fixture can fail: a high text sent to a spied provider is a leak."""
    spy = LeakSpy()
    LeakSpyEmbedder(FakeEmbedder(), spy, "embedder").embed([CLEAN, HIGH["ssn"]])
    assert [leak.provider for leak in spy.leaks] == ["embedder"]
    with pytest.raises(AssertionError):
        spy.assert_clean()


async def test_the_llm_spy_fails_on_a_high_text() -> None:
    spy = LeakSpy()
    llm = LeakSpyLLM(ScriptedLLM(["ok"]), spy, "llm")
    await llm.complete([ChatMessage("user", HIGH["pin"])])
    assert len(spy.leaks) == 1


async def test_no_op_sends_a_provider_text_that_reads_as_high(call, api, ns, mint, services, leak_spy):
    namespaces.update(services.ch, ns, conversation_logging_enabled=True)
    await services.redis.delete(recording_cache.key(ns))
    assert leak_spy.llm is not None
    leak_spy.llm.inner = ScriptedLLM(_brief_model)  # a configured model for the briefs
    ctx = Ctx(call, ns, mint(ns, "writer"), mint(ns, "admin"), services, leak_spy, http=api)
    for name, drive in DRIVERS:
        await drive(ctx)
        assert not leak_spy.leaks, f"{name}: {leak_spy.leaks}"
    # The providers were called (with the clean texts): the spies were in place.
    assert leak_spy.seen.get("embedder:worker", 0) > 0, leak_spy.seen
    assert leak_spy.seen.get("embedder:api", 0) > 0, leak_spy.seen
    assert leak_spy.seen.get("llm:api", 0) > 0, leak_spy.seen
    assert leak_spy.seen.get("llm:worker", 0) > 0, leak_spy.seen
