"""observe.record and observe.crystallize (writers): episodic observations of an
agent's tool actions, and facts drawn from a run's observations.

An observation is evidence (loom.memory_evidence, `source: "observation"`, role
`tool`) of one user's run: "<tool>: <input summary> -> <outcome>". Like a message it
keeps no text when it reads as high, and memory.recall reads it. Recording one never
creates a fact; `observe.crystallize` runs the extraction (the same prompts and
add / update / delete / leave decisions as memory.set_from_messages) over the run's
observations, and the facts it adds or updates carry `source: "crystallize"`.
"""

from __future__ import annotations

from loom.auth.principal import Principal, Role
from loom.errors import InvalidRequest
from loom.models.memory import ObserveCrystallizeRequest, ObserveRecordRequest
from loom.ops.memory import erasing, extraction
from loom.ops.memory import facts as fact_ops
from loom.ops.memory.common import scope_for, scope_of
from loom.services import Services
from loom.store import evidence as ev_store

OBSERVATION = "observation"
MAX_CRYSTALLIZE = 500


def observation_text(tool: str, input_summary: str, outcome: str) -> str:
    return f"{tool}: {input_summary} -> {outcome}"


async def record(svc: Services, who: Principal, req: ObserveRecordRequest) -> str:
    """observe.record: store one observation; answers its evidence id."""
    who.require_role(Role.writer)
    if not req.run_id:
        raise InvalidRequest(
            "run_id is required (the run the action belongs to)", field="run_id", rule="required"
        )
    scope = scope_of(who, req)
    writes = erasing.Writes(scope.namespace, scope.user_id)
    text = observation_text(req.tool, req.input_summary, req.outcome)
    msg = extraction.Message("tool", text, req.obs_id, req.ts)
    rows = extraction.build_evidence(scope, [msg], OBSERVATION)
    await svc.run(ev_store.insert, svc.ch, rows)
    writes.add_evidence(rows)
    await erasing.settle(svc, writes)  # an erasure outlived it: nothing of it is kept
    return rows[0].evidence_id


async def crystallize(svc: Services, who: Principal, req: ObserveCrystallizeRequest) -> extraction.Extraction:
    """observe.crystallize: extraction over the run's observations (oldest first)."""
    who.require_role(Role.writer)
    if not req.run_id:
        raise InvalidRequest("run_id is required (the run to crystallize)", field="run_id", rule="required")
    scope = scope_for(who, req.namespace, req.user_id, run_id=req.run_id)
    rows = await svc.run(ev_store.recent, svc.ch, scope, limit=MAX_CRYSTALLIZE, source=OBSERVATION)
    ids = [e.evidence_id for e in reversed(rows)]
    if not ids:
        return extraction.Extraction([], reason="nothing_readable")
    out = await extraction.extract(svc, scope, ids, fact_source=fact_ops.CRYSTALLIZE)
    await extraction.announce(svc, scope, out, None)
    return out
