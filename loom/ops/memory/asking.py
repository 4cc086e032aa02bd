"""memory.ask (viewer; a token pinned to one user asks about that user): a plain-language
question about a user, answered by the LLM from the scope's memory, with citations and
the time the answer rests on.

The context, ranked as the other reads rank it (no model call to gather it):
- facts: memory.search's hybrid ranking for the question (current facts; with `as_of`,
  those valid then);
- evidence: memory.recall's BM25 for the question (with `as_of`, said by then);
- the user's profile sections (memory.profile's, never rebuilt by a model here).

The model (prompts/ask.txt) sees them under short ids (F1, E1, never Loom's) and answers
`{"answer", "citations"}`; citations are mapped back to fact and evidence ids, and an id
the model made up is dropped. The time basis is the newest time among the cited items
(a fact's update, the evidence's time), or among the context when nothing is cited,
with the `as_of` asked about.

No answer (`answer: null`), the ranked context still returned, and `reason` says why:
- `llm_not_configured`: the stock fake LLM;
- `question_high_sensitivity`: the question reads as high, so it is never sent to a
  model (nor embedded: the fact ranking is BM25 alone); the context found by BM25 is
  returned as memory.search would return it;
- `model_calls_disabled`: the namespace's owner switched model calls off;
- `no_context`: the memory holds nothing for the question (no call is made);
- `llm_failed`: the model failed or answered no JSON;
- `answer_high_sensitivity`: the model's answer reads as high (withheld).
Items that read as high never reach the model or the answer: facts that do are never
stored, evidence that does keeps no text, and both are screened again here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from loom import failures
from loom import logging as loom_logging
from loom.auth.principal import Principal, Role
from loom.errors import InvalidRequest
from loom.models.memory_answers import MemoryAskRequest
from loom.ops.memory import facts as fact_ops
from loom.ops.memory import profile as profile_ops
from loom.ops.memory.common import scope_of, search_evidence
from loom.ops.memory.facts import FactHit
from loom.ops.memory.recall import RecallHit
from loom.providers.llm import ChatMessage, LLMError, json_object
from loom.sensitivity import reads_as_high
from loom.services import Services
from loom.store import evidence as ev_store
from loom.store import namespaces as ns_store
from loom.store.memories import Scope

log = loom_logging.get("loom.memory.ask")
_PROMPT = Path(__file__).parent / "prompts" / "ask.txt"
MAX_PROMPT_CHARS = 16_000
EVIDENCE_CHARS = 1_000  # of one evidence message in the prompt
PROFILE_CHARS = 2_000  # of the profile in the prompt


@dataclass
class Citation:
    kind: str  # fact | evidence
    id: str
    time: datetime


@dataclass
class Answer:
    answer: str | None
    reason: str | None
    facts: list[FactHit] = field(default_factory=list)
    evidence: list[RecallHit] = field(default_factory=list)
    profile: list[tuple[str, str]] = field(default_factory=list)
    citations: list[Citation] = field(default_factory=list)
    newest: datetime | None = None  # the time basis
    as_of: datetime | None = None
    fallback_reason: str | None = None  # why the facts' vector leg did not run


def _utc(t: datetime) -> datetime:
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


async def ask(svc: Services, who: Principal, req: MemoryAskRequest) -> Answer:
    who.require_role(Role.viewer)
    scope = scope_of(who, req)
    question, limit = req.question, req.limit
    if not question.strip():
        raise InvalidRequest("question must not be blank", field="question", rule="not_blank")
    as_of = _utc(req.as_of) if req.as_of is not None else None
    out = Answer(None, None, as_of=as_of)
    found = await _facts(svc, scope, question, limit, as_of)
    out.fallback_reason = found.fallback_reason
    out.facts = [h for h in found.hits if not reads_as_high(h.fact.text)]
    hits = await search_evidence(svc, scope, question, limit=limit, window=ev_store.Window(until=as_of))
    out.evidence = [
        RecallHit(e, round(s, 6), list(m))
        for e, s, m in hits
        if e.content and not e.high_sensitivity and not reads_as_high(e.content)
    ]
    out.profile = [
        (n, t) for n, t in await _profile(svc, scope) if not reads_as_high(n) and not reads_as_high(t)
    ]
    out.newest = _newest([h.fact.updated_at for h in out.facts] + [e.evidence.ts for e in out.evidence])
    out.reason = await _why_not(svc, scope, question, out)
    if out.reason is None:
        await _answer(svc, question, out)
    return out


async def _facts(
    svc: Services, scope: Scope, question: str, limit: int, as_of: datetime | None
) -> fact_ops.FactSearch:
    """The facts for the question: the current ones, or those valid at `as_of`."""
    return await fact_ops.hybrid(svc, scope, question, limit=limit, as_of=as_of)


async def _profile(svc: Services, scope: Scope) -> list[tuple[str, str]]:
    """The user's profile sections (name, text), with no model call (the stored profile
    when fresh, else one built from the current facts)."""
    got = await profile_ops.current(svc, Scope(scope.namespace, scope.user_id))
    return [(str(n), str(t)) for n, t in got.sections]


def _newest(times: list[datetime]) -> datetime | None:
    return max((_utc(t) for t in times), default=None)


async def _why_not(svc: Services, scope: Scope, question: str, out: Answer) -> str | None:
    """Why no model is asked, or None when one is."""
    if reads_as_high(question):
        return "question_high_sensitivity"
    if not svc.llm.configured:
        return "llm_not_configured"
    if not out.facts and not out.evidence and not out.profile:
        return "no_context"
    config = await svc.run(ns_store.get, svc.ch, scope.namespace)
    if not config.model_calls_enabled:
        return "model_calls_disabled"
    return None


def _prompt_items(question: str, out: Answer) -> tuple[str, dict[str, Citation]]:
    """The model's input (JSON) within MAX_PROMPT_CHARS, and its short ids' citations."""
    ids: dict[str, Citation] = {}
    facts, evidence = [], []
    size = len(question)
    for i, h in enumerate(out.facts, 1):
        item = {"id": f"F{i}", "text": h.fact.text, "time": _utc(h.fact.updated_at).isoformat()}
        size += len(h.fact.text) + 60
        if size > MAX_PROMPT_CHARS:
            break
        facts.append(item)
        ids[f"F{i}"] = Citation("fact", h.fact.memory_id, _utc(h.fact.updated_at))
    for i, e in enumerate(out.evidence, 1):
        text = e.evidence.content[:EVIDENCE_CHARS]
        size += len(text) + 80
        if size > MAX_PROMPT_CHARS:
            break
        ev = e.evidence
        evidence.append({"id": f"E{i}", "role": ev.role, "text": text, "time": _utc(ev.ts).isoformat()})
        ids[f"E{i}"] = Citation("evidence", ev.evidence_id, _utc(ev.ts))
    profile, left = [], PROFILE_CHARS
    for name, text in out.profile:
        if left <= 0:
            break
        profile.append({"section": name, "text": text[:left]})
        left -= len(text)
    payload = {
        "question": question,
        "as_of": out.as_of.isoformat() if out.as_of else None,
        "profile": profile,
        "facts": facts,
        "evidence": evidence,
    }
    return json.dumps(payload, ensure_ascii=False), ids


def _parse(reply: str) -> tuple[str, list[str]]:
    data = json_object(reply)
    answer = data.get("answer")
    if not isinstance(answer, str) or not answer.strip():
        raise ValueError("the model's reply holds no answer")
    cited = data.get("citations", [])
    return answer.strip(), [str(c) for c in cited] if isinstance(cited, list) else []


async def _answer(svc: Services, question: str, out: Answer) -> None:
    text, ids = _prompt_items(question, out)
    try:
        reply = await svc.llm.complete(
            [ChatMessage("system", _PROMPT.read_text()), ChatMessage("user", text)], temperature=0.0
        )
        answer, cited = _parse(reply)
    except (LLMError, ValueError) as exc:
        log.warning("memory.ask model call failed", error=failures.detail(exc))
        out.reason = "llm_failed"
        return
    if reads_as_high(answer):
        out.reason = "answer_high_sensitivity"
        return
    out.answer = answer
    out.citations = [ids[c] for c in dict.fromkeys(cited) if c in ids]
    if out.citations:
        out.newest = _newest([c.time for c in out.citations])
