"""The benchmark's deterministic data: chat turns, threads and users, query sets, and vectors.

Everything here is a pure function of a seed. Thread ``k`` of a namespace is generated from
its own ``random.Random(f"{seed}:{namespace}:{k}")``, so a dataset of N turns is the first N
turns of the dataset of any larger N (the 10k set is a prefix of the 100k set), and the
same seed gives byte-identical turns on every machine and Python run.

What a dataset holds (see :func:`build_dataset`):

* ``bench-main``: exactly N turns (the scale). Threads of 2-80 turns (mean ~21) with a
  user/assistant/tool/system mix (~39/47/12/2 %), contents from one-word replies to
  2,000-4,500-character answers, fenced code, pasted logs, JSON tool output and rare
  tokens (ticket ids such as ``INC-48213``, hosts, versions, error codes). Users own 50
  threads each, interleaved in time (thread ``k`` belongs to user ``50*(k//2500) + k%50``),
  so every user has ~1,000 turns at full size whatever the scale.
* ``bench-noise-a`` / ``bench-noise-b``: N/20 turns each, other tenants, so the namespace
  filter of a search is a real filter.
* ``bench-saved``: one heavy user (``saver``) with 10,000 saved messages and three users
  with 2,000 each (user/assistant turns only; the same at every scale).

Vectors (:func:`vectors_for`): user and assistant turns are embedded on their first 2,048
characters, as Loom does. Embedding a million texts with MiniLM on two cores would take
hours (~40 texts/s on this mix), so only a pool of real texts (the first ``n_real``
embeddable turns of ``bench-main``, 20,000 by default and 2,000 in ``--quick``, plus the
saved messages queries are made from) is embedded with the real model, once, and cached
under ``bench/.cache``. Every other turn's vector is *derived* from that pool by
perturbation and re-normalisation (:func:`derive`): by default a random mixture of three
real vectors plus gaussian noise (sigma 0.01 per component); ``--derive noise`` gives the
plain "one real vector + N(0, 0.05^2) noise" variant, which makes tight clusters of
near-ties (see :func:`derive` for the measured effect on HNSW recall). Queries are only made
from real-embedded turns, so a query's text and its neighbours' vectors agree; recall is
measured against exact search over all vectors (real and derived) of the namespace.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

GENERATOR_VERSION = 1
DIM = 384
EMBED_CHARS = 2048  # user and assistant turns are embedded on their first 2,048 characters
MIN_SIMILARITY = 0.30  # conversation.search's cosine floor

MAIN_NS = "bench-main"
NOISE_NS = ("bench-noise-a", "bench-noise-b")
SAVED_NS = "bench-saved"
SAVER = "saver"
SAVED_USERS = ((SAVER, 10_000), ("saved-u1", 2_000), ("saved-u2", 2_000), ("saved-u3", 2_000))

THREADS_PER_USER = 50
USERS_PER_BLOCK = 50
EMBEDDED_ROLES = ("user", "assistant")
CACHE_DIR = Path(__file__).resolve().parent / ".cache"
_EPOCH = datetime(2025, 1, 6, 8, 0, 0, tzinfo=UTC)

Turn = dict[str, Any]

# --------------------------------------------------------------------------------------
# Vocabulary
# --------------------------------------------------------------------------------------

TOPICS: dict[str, dict[str, list[str]]] = {
    "deploy": {
        "nouns": [
            "deployment pipeline",
            "staging cluster",
            "canary release",
            "helm chart",
            "rollback plan",
            "blue-green switch",
            "container image",
            "build cache",
            "release branch",
            "readiness probe",
            "load balancer",
            "autoscaler",
            "ingress controller",
            "artifact registry",
            "feature flag",
        ],
        "verbs": [
            "rebuilt",
            "rolled back",
            "promoted",
            "pinned",
            "redeployed",
            "drained",
            "scaled up",
            "patched",
        ],
        "adj": ["flaky", "stuck", "slow", "half-finished", "misconfigured", "green", "red"],
    },
    "billing": {
        "nouns": [
            "invoice run",
            "billing service",
            "proration logic",
            "tax calculation",
            "refund queue",
            "payment webhook",
            "subscription plan",
            "usage meter",
            "dunning email",
            "credit note",
            "currency conversion",
            "ledger entry",
            "checkout page",
            "trial extension",
            "price table",
        ],
        "verbs": [
            "double-charged",
            "reconciled",
            "voided",
            "recalculated",
            "backfilled",
            "refunded",
            "migrated",
        ],
        "adj": ["overdue", "duplicated", "rounded", "missing", "partial", "annual", "monthly"],
    },
    "data": {
        "nouns": [
            "nightly ETL job",
            "warehouse table",
            "partition key",
            "dbt model",
            "Kafka topic",
            "schema migration",
            "materialized view",
            "parquet export",
            "dedup step",
            "late-arriving events",
            "backfill window",
            "query planner",
            "sort key",
            "retention policy",
            "CDC stream",
        ],
        "verbs": ["reprocessed", "partitioned", "compacted", "vacuumed", "truncated", "replayed", "joined"],
        "adj": ["skewed", "stale", "wide", "sparse", "incremental", "out-of-order", "bloated"],
    },
    "frontend": {
        "nouns": [
            "settings page",
            "date picker",
            "dark mode",
            "bundle size",
            "hydration warning",
            "React component",
            "form validation",
            "infinite scroll",
            "accessibility audit",
            "CSS grid",
            "service worker",
            "image carousel",
            "onboarding flow",
            "error boundary",
            "tooltip",
        ],
        "verbs": ["refactored", "memoized", "lazy-loaded", "restyled", "debounced", "split", "inlined"],
        "adj": ["janky", "responsive", "blank", "misaligned", "cached", "keyboard-only", "mobile"],
    },
    "auth": {
        "nouns": [
            "login flow",
            "session cookie",
            "SSO integration",
            "OAuth callback",
            "refresh token rotation",
            "role mapping",
            "password reset email",
            "MFA prompt",
            "SAML assertion",
            "audit log",
            "permission check",
            "invite link",
            "rate limiter",
            "lockout policy",
            "device trust",
        ],
        "verbs": ["revoked", "rotated", "expired", "federated", "throttled", "re-issued", "scoped"],
        "adj": ["expired", "invalid", "silent", "cross-site", "tenant-wide", "admin-only", "short-lived"],
    },
    "mobile": {
        "nouns": [
            "push notification",
            "offline sync",
            "app store review",
            "crash report",
            "deep link",
            "battery drain",
            "background fetch",
            "in-app purchase",
            "splash screen",
            "TestFlight build",
            "camera permission",
            "widget",
            "biometric unlock",
            "release notes",
            "cold start time",
        ],
        "verbs": ["crashed", "shipped", "rejected", "throttled", "symbolicated", "resubmitted", "profiled"],
        "adj": ["intermittent", "Android-only", "iOS-only", "foreground", "silent", "delayed", "duplicated"],
    },
    "ml": {
        "nouns": [
            "embedding model",
            "training run",
            "eval set",
            "learning rate schedule",
            "feature store",
            "inference latency",
            "GPU quota",
            "tokenizer",
            "checkpoint",
            "fine-tuning job",
            "ranking model",
            "label noise",
            "drift monitor",
            "batch size",
            "recall metric",
        ],
        "verbs": ["retrained", "quantized", "distilled", "evaluated", "overfit", "warmed up", "benchmarked"],
        "adj": ["noisy", "int8", "distilled", "calibrated", "multilingual", "imbalanced", "held-out"],
    },
    "support": {
        "nouns": [
            "customer escalation",
            "SLA breach",
            "support macro",
            "refund request",
            "status page",
            "incident review",
            "on-call rotation",
            "help center article",
            "chat widget",
            "NPS survey",
            "ticket backlog",
            "priority queue",
            "handoff note",
            "churn risk",
            "renewal call",
        ],
        "verbs": ["escalated", "resolved", "reopened", "triaged", "merged", "assigned", "closed"],
        "adj": ["urgent", "enterprise", "repeat", "angry", "low-priority", "pending", "blocked"],
    },
    "travel": {
        "nouns": [
            "flight to Lisbon",
            "hotel booking",
            "train pass",
            "visa appointment",
            "packing list",
            "airport transfer",
            "day trip",
            "travel insurance",
            "layover in Frankfurt",
            "car rental",
            "museum tickets",
            "restaurant reservation",
            "itinerary",
            "baggage allowance",
            "ferry schedule",
        ],
        "verbs": ["booked", "cancelled", "rescheduled", "upgraded", "refunded", "confirmed", "moved"],
        "adj": ["overnight", "non-refundable", "cheap", "scenic", "direct", "delayed", "fully booked"],
    },
    "cooking": {
        "nouns": [
            "sourdough starter",
            "risotto",
            "meal prep",
            "spice rub",
            "pizza dough",
            "slow cooker stew",
            "vegan lasagna",
            "knife skills",
            "pantry list",
            "birthday cake",
            "fermented hot sauce",
            "cast iron pan",
            "grocery budget",
            "lunch boxes",
            "dinner party menu",
        ],
        "verbs": ["proofed", "braised", "substituted", "doubled", "froze", "seasoned", "over-salted"],
        "adj": ["gluten-free", "crispy", "soggy", "spicy", "weeknight", "make-ahead", "dense"],
    },
    "writing": {
        "nouns": [
            "blog post draft",
            "conference talk",
            "grant proposal",
            "cover letter",
            "release announcement",
            "style guide",
            "product spec",
            "design doc",
            "newsletter",
            "chapter outline",
            "executive summary",
            "API reference",
            "case study",
            "press release",
            "onboarding guide",
        ],
        "verbs": ["rewrote", "shortened", "restructured", "proofread", "outlined", "expanded", "translated"],
        "adj": ["wordy", "persuasive", "technical", "informal", "half-done", "overdue", "concise"],
    },
    "finance": {
        "nouns": [
            "quarterly budget",
            "expense report",
            "runway forecast",
            "vendor contract",
            "payroll run",
            "tax filing",
            "cap table",
            "board deck",
            "cash flow model",
            "procurement request",
            "cost centre",
            "headcount plan",
            "audit finding",
            "accrual",
            "revenue recognition",
        ],
        "verbs": ["approved", "reforecast", "trimmed", "deferred", "allocated", "signed", "audited"],
        "adj": ["unbudgeted", "quarterly", "one-off", "recurring", "over-budget", "provisional", "final"],
    },
}
TOPIC_NAMES = list(TOPICS)

PEOPLE = [
    "Ana",
    "Bilal",
    "Chen",
    "Dara",
    "Elif",
    "Farid",
    "Grace",
    "Hugo",
    "Ines",
    "Jonas",
    "Kofi",
    "Lena",
    "Marta",
    "Nikhil",
    "Olga",
    "Pedro",
    "Quinn",
    "Rosa",
    "Sven",
    "Tariq",
    "Uma",
    "Viktor",
    "Wen",
    "Yusuf",
]
SERVICES = [
    "ledger-api",
    "auth-gateway",
    "search-indexer",
    "notif-worker",
    "billing-core",
    "etl-runner",
    "media-proxy",
    "report-builder",
    "sync-daemon",
    "edge-cache",
    "order-service",
    "profile-store",
]
TICKET_PREFIX = ["INC", "OPS", "BILL", "PLAT", "SEC", "DATA", "WEB", "SUP", "MOB", "ML"]
ERRORS = [
    "ERR_CONN_RESET",
    "ETIMEDOUT",
    "E_LOCK_TIMEOUT",
    "OOMKilled",
    "HTTP 502",
    "HTTP 429",
    "deadlock detected",
    "NullPointerException",
    "KeyError: 'tenant_id'",
    "segfault in libssl",
    "certificate has expired",
    "too many open files",
    "disk quota exceeded",
]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "next week", "end of sprint", "tomorrow"]
SHORT_USER = [
    "ok",
    "thanks!",
    "yes please",
    "go ahead",
    "perfect, thank you",
    "that worked",
    "hmm, not quite",
    "can you shorten it?",
    "what about the other one?",
    "makes sense",
    "no, the second option",
    "great",
    "do it",
    "wait, why?",
    "sounds good",
    "still failing",
    "👍",
    "ty",
]
SHORT_ASSISTANT = [
    "Done.",
    "You're welcome!",
    "Glad that worked.",
    "Sure, here it is.",
    "Updated.",
    "Good catch, fixed.",
    "Understood, I'll keep it short.",
    "Yes, that's right.",
]
CONNECTORS = [
    "Also,",
    "Separately,",
    "On top of that,",
    "For context,",
    "To be clear,",
    "In practice,",
    "As a result,",
    "Meanwhile,",
    "Before that,",
    "Importantly,",
]
STOPWORDS = set(
    [
        "a",
        "an",
        "the",
        "and",
        "or",
        "but",
        "if",
        "then",
        "so",
        "to",
        "of",
        "in",
        "on",
        "for",
        "with",
        "at",
        "by",
        "from",
        "up",
        "about",
        "into",
        "over",
        "after",
        "before",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "being",
        "it",
        "its",
        "this",
        "that",
        "these",
        "those",
        "i",
        "you",
        "we",
        "they",
        "he",
        "she",
        "me",
        "my",
        "our",
        "your",
        "their",
        "them",
        "us",
        "do",
        "does",
        "did",
        "done",
        "can",
        "could",
        "should",
        "would",
        "will",
        "just",
        "not",
        "no",
        "yes",
        "also",
        "as",
        "than",
        "too",
        "very",
        "there",
        "here",
        "what",
        "which",
        "who",
        "how",
        "why",
        "when",
        "where",
        "all",
        "any",
        "some",
        "more",
        "most",
        "other",
        "such",
        "only",
        "own",
        "same",
        "few",
        "both",
        "each",
        "again",
        "once",
        "further",
        "while",
        "because",
        "until",
        "out",
        "off",
        "down",
        "under",
        "between",
        "through",
        "during",
        "above",
        "below",
        "let",
        "lets",
        "i'm",
        "it's",
        "we're",
        "don't",
    ]
)
SYNONYMS = {
    "rebuilt": "recreated",
    "rolled": "reverted",
    "failed": "broke",
    "slow": "sluggish",
    "fix": "repair",
    "deployment": "deploy",
    "cluster": "environment",
    "invoice": "bill",
    "refund": "reimbursement",
    "customer": "client",
    "error": "failure",
    "issue": "problem",
    "login": "sign-in",
    "page": "screen",
    "booking": "reservation",
    "draft": "version",
    "budget": "spending plan",
    "model": "network",
    "stuck": "hung",
    "missing": "absent",
    "cancelled": "called off",
    "approved": "signed off",
    "quarterly": "Q3",
    "crashed": "fell over",
    "nightly": "overnight",
    "cheap": "affordable",
}


# --------------------------------------------------------------------------------------
# Text generation
# --------------------------------------------------------------------------------------


@dataclass
class _Ctx:
    rng: random.Random
    topic: str
    tickets: list[str]
    service: str
    host: str
    person: str
    version: str
    vocab: dict[str, list[str]] = field(default_factory=dict)

    def noun(self) -> str:
        return self.rng.choice(self.vocab["nouns"])

    def verb(self) -> str:
        return self.rng.choice(self.vocab["verbs"])

    def adj(self) -> str:
        return self.rng.choice(self.vocab["adj"])


def _ctx(rng: random.Random) -> _Ctx:
    topic = rng.choice(TOPIC_NAMES)
    tickets = [f"{rng.choice(TICKET_PREFIX)}-{rng.randint(100, 99999)}" for _ in range(rng.randint(1, 3))]
    host = f"{rng.choice(['db', 'api', 'worker', 'cache', 'web'])}-{rng.choice(['eu', 'us', 'ap'])}-{rng.randint(1, 9)}"
    version = f"v{rng.randint(1, 4)}.{rng.randint(0, 30)}.{rng.randint(0, 12)}"
    return _Ctx(rng, topic, tickets, rng.choice(SERVICES), host, rng.choice(PEOPLE), version, TOPICS[topic])


def _sentence(c: _Ctx) -> str:
    r = c.rng
    pick = r.randrange(14)
    if pick == 0:
        return f"The {c.noun()} was {c.verb()} on {c.host} after {c.person} noticed it was {c.adj()}."
    if pick == 1:
        return f"{c.tickets[0]} tracks the {c.adj()} {c.noun()}; it is still open and blocks the {c.noun()}."
    if pick == 2:
        return f"We {c.verb()} the {c.noun()} in {c.version}, but the {c.noun()} stayed {c.adj()}."
    if pick == 3:
        return f"{c.service} logs show {r.choice(ERRORS)} roughly every {r.randint(2, 90)} minutes since {r.choice(WEEKDAYS)}."
    if pick == 4:
        return f"{c.person} wants the {c.noun()} {c.verb()} before {r.choice(WEEKDAYS)}, otherwise {r.choice(c.tickets)} slips."
    if pick == 5:
        return f"My guess is that the {c.adj()} {c.noun()} and the {c.noun()} are related."
    if pick == 6:
        return f"It took {r.randint(3, 240)} {r.choice(['seconds', 'minutes', 'hours'])} to get the {c.noun()} back to normal."
    if pick == 7:
        return f"Compare the {c.noun()} with the {c.adj()} one from {r.choice(c.tickets)} before changing anything."
    if pick == 8:
        return f"{r.choice(CONNECTORS)} the {c.noun()} depends on {c.service}, which {c.verb()} last time."
    if pick == 9:
        return f"The numbers: {r.randint(2, 99)}% of requests hit the {c.noun()} and p99 is {r.randint(40, 3000)} ms."
    if pick == 10:
        return f"Should we keep the {c.noun()} {c.adj()} or move it behind a {c.noun()}?"
    if pick == 11:
        return f"{c.person} and {r.choice(PEOPLE)} {c.verb()} the {c.noun()} together, see {r.choice(c.tickets)}."
    if pick == 12:
        return f"Nobody touched the {c.noun()} since {c.version}, so the {c.adj()} state is new."
    return f"The {c.noun()} is {c.adj()} again, and the {c.noun()} looks {c.adj()} too."


def _paragraph(c: _Ctx, n: int) -> str:
    return " ".join(_sentence(c) for _ in range(n))


_CODE = {
    "python": [
        "def {fn}({arg}: dict, retries: int = {n}) -> bool:\n"
        '    """Retry the {noun} until it settles."""\n'
        "    for attempt in range(retries):\n"
        '        if {arg}.get("state") == "ready":\n'
        "            return True\n"
        "        time.sleep(2 ** attempt)\n"
        '    log.warning("{ticket}: gave up after %d attempts", retries)\n'
        "    return False\n",
        "import pandas as pd\n\n"
        'df = pd.read_parquet("{path}")\n'
        'df = df[df["service"] == "{service}"]\n'
        'print(df.groupby("day")["latency_ms"].quantile(0.99).tail({n}))\n',
    ],
    "sql": [
        "SELECT tenant_id, count(*) AS n, max(created_at)\n"
        "FROM {table}\n"
        "WHERE created_at > now() - interval '{n} days'\n"
        "GROUP BY tenant_id\n"
        "ORDER BY n DESC\n"
        "LIMIT 20;\n",
        "UPDATE {table} SET status = 'retry'\nWHERE status = 'failed' AND attempts < {n}; -- {ticket}\n",
    ],
    "bash": [
        "kubectl -n {service} rollout status deploy/{service} --timeout={n}m\n"
        "kubectl -n {service} logs deploy/{service} --since=1h | grep -c '{error}'\n",
        "for h in {host} {host2}; do\n  ssh $h 'df -h /var/lib && uptime'\ndone\n",
    ],
    "typescript": [
        "export function {fn}(items: Item[], limit = {n}): Item[] {{\n"
        "  // {ticket}: keep the newest first\n"
        "  return [...items].sort((a, b) => b.updatedAt - a.updatedAt).slice(0, limit);\n"
        "}}\n",
    ],
}
_FN = ["retry_sync", "drain_queue", "check_health", "reconcile", "pick_latest", "flush_cache", "load_rows"]
_TABLE = ["invoices", "events_raw", "sessions", "orders", "payouts", "audit_log", "jobs"]


def _code(c: _Ctx) -> str:
    r = c.rng
    lang = r.choice(list(_CODE))
    body = r.choice(_CODE[lang]).format(
        fn=r.choice(_FN),
        arg=r.choice(["job", "cfg", "row", "task"]),
        n=r.randint(2, 30),
        noun=c.noun(),
        ticket=r.choice(c.tickets),
        path=f"s3://exports/{c.service}/{r.randint(2023, 2025)}/part-{r.randint(0, 99)}.parquet",
        service=c.service,
        table=r.choice(_TABLE),
        error=r.choice(ERRORS).split(":")[0],
        host=c.host,
        host2=f"{c.host[:-1]}{r.randint(1, 9)}",
    )
    return f"```{lang}\n{body}```"


def _log(c: _Ctx) -> str:
    r = c.rng
    lines = []
    for i in range(r.randint(3, 14)):
        lvl = r.choice(["INFO", "INFO", "WARN", "ERROR"])
        lines.append(
            f"2025-0{r.randint(1, 9)}-{r.randint(10, 28)}T{r.randint(10, 23)}:{r.randint(10, 59)}:{i + 10}Z "
            f"{lvl} {c.service} [{c.host}] {r.choice(ERRORS) if lvl != 'INFO' else 'request ok'} "
            f"latency={r.randint(3, 4000)}ms"
        )
    return "```\n" + "\n".join(lines) + "\n```"


def _user(c: _Ctx) -> str:
    r = c.rng
    x = r.random()
    if x < 0.22:
        return r.choice(SHORT_USER)
    if x < 0.77:
        lead = r.choice(
            [
                "",
                "Quick question: ",
                "Hey, ",
                "Following up on " + r.choice(c.tickets) + ": ",
                "Can you help? ",
            ]
        )
        return lead + _paragraph(c, r.randint(1, 3))
    if x < 0.95:
        paste = _code(c) if r.random() < 0.5 else _log(c)
        return f"{_sentence(c)} Here is what I have:\n\n{paste}\n\n{r.choice(['Why?', 'Any idea?', 'What am I missing?', 'Is this right?'])}"
    return "\n\n".join(_paragraph(c, r.randint(3, 6)) for _ in range(r.randint(3, 6)))


def _assistant(c: _Ctx) -> str:
    r = c.rng
    x = r.random()
    if x < 0.15:
        return r.choice(SHORT_ASSISTANT)
    if x < 0.55:
        return _paragraph(c, r.randint(2, 5))
    if x < 0.85:
        parts = [_paragraph(c, r.randint(2, 4))]
        if r.random() < 0.5:
            parts.append("\n".join(f"- {_sentence(c)}" for _ in range(r.randint(2, 5))))
        if r.random() < 0.5:
            parts.append(_code(c))
        parts.append(_paragraph(c, r.randint(1, 3)))
        return "\n\n".join(parts)
    # A long answer: 2,000-4,500 characters with sections, a list and code.
    target = r.randint(2000, 4500)
    parts = [f"Here is a full write-up for {r.choice(c.tickets)}."]
    while sum(len(p) for p in parts) < target:
        y = r.random()
        if y < 0.55:
            parts.append(_paragraph(c, r.randint(3, 6)))
        elif y < 0.75:
            parts.append(
                f"**{c.noun().capitalize()}**\n"
                + "\n".join(f"{i + 1}. {_sentence(c)}" for i in range(r.randint(3, 6)))
            )
        else:
            parts.append(_code(c))
    return "\n\n".join(parts)


def _tool_call(c: _Ctx) -> tuple[str, str]:
    r = c.rng
    tool = r.choice(
        ["search_tickets", "get_metrics", "run_query", "fetch_logs", "lookup_customer", "calendar"]
    )
    call = f"Let me check that with `{tool}`."
    rows = []
    for _ in range(r.randint(1, 8)):
        rows.append(
            "{"
            + f'"id": "{r.choice(c.tickets) if r.random() < 0.5 else f"{r.choice(TICKET_PREFIX)}-{r.randint(100, 99999)}"}", '
            f'"title": "{c.adj()} {c.noun()}", "status": "{r.choice(["open", "closed", "pending"])}", '
            f'"owner": "{r.choice(PEOPLE)}", "updated": "2025-0{r.randint(1, 9)}-{r.randint(10, 28)}"' + "}"
        )
    out = '{"tool": "' + tool + '", "ok": true, "results": [\n  ' + ",\n  ".join(rows) + "\n]}"
    return call, out


def _system(c: _Ctx) -> str:
    return (
        f"You are a helpful assistant for the {c.topic} team. Be concise, cite ticket ids, "
        f"and prefer concrete next steps. Today the on-call is {c.person}."
    )


def user_of_thread(k: int) -> str:
    """The owner of main-namespace thread ``k``: users own 50 threads each, interleaved in blocks."""
    block, pos = divmod(k, USERS_PER_BLOCK * THREADS_PER_USER)
    return f"u{block * USERS_PER_BLOCK + pos % USERS_PER_BLOCK:05d}"


def thread(seed: int, namespace: str, k: int, *, user_id: str | None = None) -> list[Turn]:
    """Thread ``k`` of ``namespace``: its turns in order (a pure function of the arguments)."""
    r = random.Random(f"{seed}:{namespace}:{k}:v{GENERATOR_VERSION}")
    c = _ctx(r)
    x = r.random()
    length = r.randint(2, 6) if x < 0.30 else r.randint(8, 24) if x < 0.75 else r.randint(25, 80)
    uid = user_id or user_of_thread(k)
    tid = f"t{k:07d}"
    start = _EPOCH + timedelta(seconds=k * 37 + r.randint(0, 30))
    out: list[tuple[str, str]] = []
    if r.random() < 0.3:
        out.append(("system", _system(c)))
    while len(out) < length:
        out.append(("user", _user(c)))
        if r.random() < 0.25:
            call, result = _tool_call(c)
            out.append(("assistant", call))
            out.append(("tool", result))
        out.append(("assistant", _assistant(c)))
    turns = []
    t = start
    for j, (role, content) in enumerate(out[:length]):
        t += timedelta(seconds=r.randint(2, 300), milliseconds=r.randint(0, 999))
        turns.append(
            {
                "namespace": namespace,
                "thread_id": tid,
                "msg_id": f"{tid}-m{j:03d}",
                "role": role,
                "content": content,
                "user_id": uid,
                "ts": t.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            }
        )
    return turns


def iter_turns(seed: int, namespace: str, first_thread: int = 0) -> Iterator[Turn]:
    k = first_thread
    while True:
        yield from thread(seed, namespace, k)
        k += 1


def turns(n: int, seed: int = 42, namespace: str = MAIN_NS) -> list[Turn]:
    """The first ``n`` turns of ``namespace`` (prefix-stable: ``turns(a)`` is ``turns(b)[:a]`` for a < b)."""
    out: list[Turn] = []
    for t in iter_turns(seed, namespace):
        if len(out) >= n:
            break
        out.append(t)
    return out


def fresh_turns(n: int, seed: int, tag: str, *, roles: Sequence[str] | None = None) -> list[Turn]:
    """``n`` turns for append benchmarks, in threads of their own (``tag`` keeps them apart from
    the loaded data and from other runs): thread ids ``a<tag>-<k>``, user ``app-<tag>``."""
    out: list[Turn] = []
    k = 0
    while len(out) < n:
        for t in thread(seed, f"append:{tag}", k, user_id=f"app-{tag}"):
            if roles is not None and t["role"] not in roles:
                continue
            t = dict(
                t, namespace=MAIN_NS, thread_id=f"a{tag}-{k:06d}", msg_id=f"a{tag}-{k:06d}-{t['msg_id'][-4:]}"
            )
            out.append(t)
            if len(out) >= n:
                break
        k += 1
    return out


def saved_turns(seed: int = 42, share: float = 1.0) -> list[Turn]:
    """The saved-message set: 10,000 saved messages of ``saver`` and 2,000 each of three others
    (times ``share``: the harness's smoke mode loads 5% of it)."""
    out: list[Turn] = []
    for u, (user, full) in enumerate(SAVED_USERS):
        count = max(1, round(full * share))
        got = 0
        k = 0
        while got < count:
            for t in thread(seed, f"{SAVED_NS}:{user}", k, user_id=user):
                if t["role"] not in EMBEDDED_ROLES:
                    continue
                tid = f"s{u}-{k:06d}"
                out.append(
                    dict(
                        t,
                        namespace=SAVED_NS,
                        thread_id=tid,
                        msg_id=f"{tid}-{t['msg_id'][-4:]}",
                        saved_at=t["ts"],
                    )
                )
                got += 1
                if got >= count:
                    break
            k += 1
    return out


def embeddable(t: Turn) -> bool:
    return t["role"] in EMBEDDED_ROLES


def embed_text(t: Turn) -> str:
    return str(t["content"])[:EMBED_CHARS]


# --------------------------------------------------------------------------------------
# Queries
# --------------------------------------------------------------------------------------

_WORD = re.compile(r"[A-Za-z][A-Za-z0-9'_-]*")
_TICKET = re.compile(r"\b(?:" + "|".join(TICKET_PREFIX) + r")-\d{3,5}\b")
_QUERY_FRAMES = [
    "{}",
    "{}?",
    "what did we decide about {}",
    "remind me about {}",
    "notes on {}",
    "the thread where {}",
    "{} again",
    "how did we handle {}",
    "find {}",
]


def paraphrase(text: str, rng: random.Random) -> str | None:
    """A paraphrase-ish query made from ``text``: a few content words of one sentence, some
    swapped for synonyms, in a question frame. None when the text has too few words."""
    body = re.sub(r"```.*?```", " ", text, flags=re.S)
    sentences = [s for s in re.split(r"(?<=[.?!])\s+|\n+", body) if len(_WORD.findall(s)) >= 5]
    if not sentences:
        return None
    s = rng.choice(sentences[:8])
    words = [w for w in _WORD.findall(s) if w.lower() not in STOPWORDS]
    if len(words) < 3:
        return None
    n = min(len(words), rng.randint(3, 7))
    start = rng.randrange(0, len(words) - n + 1)
    chosen = [
        SYNONYMS.get(w.lower(), w.lower()) if rng.random() < 0.5 else w.lower()
        for w in words[start : start + n]
    ]
    if len(chosen) > 3 and rng.random() < 0.4:
        i = rng.randrange(len(chosen) - 1)
        chosen[i], chosen[i + 1] = chosen[i + 1], chosen[i]
    return rng.choice(_QUERY_FRAMES).format(" ".join(chosen))


def search_queries(source: Sequence[Turn], n: int, seed: int, salt: str = "search") -> list[dict[str, Any]]:
    """``n`` paraphrase queries, each from a different turn of ``source`` (turns with real vectors)."""
    rng = random.Random(f"{seed}:{salt}:queries")
    idx = list(range(len(source)))
    rng.shuffle(idx)
    out: list[dict[str, Any]] = []
    for i in idx:
        if len(out) >= n:
            break
        t = source[i]
        if len(t["content"]) < 40:
            continue
        q = paraphrase(t["content"], rng)
        if q:
            out.append({"text": q, "source": t["msg_id"], "kind": "paraphrase"})
    return out


def saved_queries(source: Sequence[Turn], n: int, seed: int) -> list[dict[str, Any]]:
    """Saved-search queries from ``source`` (one user's saved messages): ~50% paraphrases, ~30% a
    rare token of the message (a ticket id, sometimes with a word), ~20% a 4-word phrase from deep
    in a long message. Each carries its source ``msg_id`` (for hit@10)."""
    rng = random.Random(f"{seed}:saved:queries")
    idx = list(range(len(source)))
    rng.shuffle(idx)
    out: list[dict[str, Any]] = []
    for i in idx:
        if len(out) >= n:
            break
        t = source[i]
        text = t["content"]
        x = rng.random()
        q: str | None = None
        kind = "paraphrase"
        if x < 0.3:
            tickets = _TICKET.findall(text)
            if tickets:
                q, kind = rng.choice(tickets), "rare_token"
                if rng.random() < 0.5:
                    words = [w for w in _WORD.findall(text) if w.lower() not in STOPWORDS and len(w) > 4]
                    if words:
                        q = f"{q} {rng.choice(words).lower()}"
        elif x < 0.5 and len(text) > 1800:
            words = _WORD.findall(text[1200:])
            if len(words) >= 8:
                j = rng.randrange(0, len(words) - 4)
                q, kind = " ".join(words[j : j + 4]), "deep_phrase"
        if q is None and len(text) >= 40:
            q, kind = paraphrase(text, rng), "paraphrase"
        if q:
            out.append({"text": q, "source": t["msg_id"], "kind": kind})
    return out


# --------------------------------------------------------------------------------------
# Datasets
# --------------------------------------------------------------------------------------


@dataclass
class Dataset:
    """One scale's data. ``turns`` holds every row to load (main, noise, saved); ``vectors[i]``
    is the vector of ``turns[i]`` when ``has_vec[i]`` (user/assistant turns), else zeros."""

    scale: int
    seed: int
    turns: list[Turn]
    vectors: np.ndarray
    has_vec: np.ndarray
    real: np.ndarray  # True where the vector came from the model (not derived)
    search: list[dict[str, Any]]  # measured search queries
    calibration: list[dict[str, Any]]  # held-out queries for tuning
    saved: list[dict[str, Any]]  # saved-search queries (user SAVER)
    erase_users: list[str]
    main_count: int

    def rows_of(self, namespace: str) -> np.ndarray:
        return np.array([t["namespace"] == namespace for t in self.turns], dtype=bool)


def build_dataset(
    scale: int,
    *,
    seed: int = 42,
    n_real: int = 20_000,
    n_search: int = 1000,
    n_calibration: int = 200,
    n_saved: int = 500,
    n_erase: int = 3,
    derive_mode: str = "mix",
    saved_share: float = 1.0,
    embedder: Any = None,
    log: Callable[[str], None] = print,
) -> Dataset:
    t0 = time.perf_counter()
    main = turns(scale, seed, MAIN_NS)
    noise = [t for ns in NOISE_NS for t in turns(max(1, scale // 20), seed, ns)]
    saved = saved_turns(seed, saved_share)
    rows = main + saved + noise
    has_vec = np.array([embeddable(t) for t in rows], dtype=bool)
    emb_idx = np.flatnonzero(has_vec)
    log(
        f"  generated {len(main):,} main + {len(saved):,} saved + {len(noise):,} noise turns "
        f"({len(emb_idx):,} embeddable) in {time.perf_counter() - t0:.1f}s"
    )

    # Real pool: the first n_real embeddable main turns, plus the saved messages queries are made from.
    main_emb = [i for i in emb_idx if i < len(main)]
    pool = main_emb[:n_real]
    saver_rows = [i for i in emb_idx if rows[i]["namespace"] == SAVED_NS and rows[i]["user_id"] == SAVER]
    saved_q = saved_queries([rows[i] for i in saver_rows], n_saved, seed)
    by_msg = {rows[i]["msg_id"]: i for i in saver_rows}
    pool_saved = sorted({by_msg[q["source"]] for q in saved_q})
    texts = [embed_text(rows[i]) for i in emb_idx]
    pos = {int(i): p for p, i in enumerate(emb_idx)}
    real_positions = [pos[int(i)] for i in pool] + [pos[int(i)] for i in pool_saved]
    vecs, real_mask = vectors_for(
        texts, real=real_positions, seed=seed, mode=derive_mode, embedder=embedder, log=log
    )
    vectors = np.zeros((len(rows), DIM), dtype=np.float32)
    vectors[emb_idx] = vecs
    real = np.zeros(len(rows), dtype=bool)
    real[emb_idx] = real_mask

    src = [rows[i] for i in pool]
    qs = search_queries(src, n_search + n_calibration, seed)
    users = sorted({t["user_id"] for t in main})
    counts = {u: 0 for u in users}
    for t in main:
        counts[t["user_id"]] += 1
    # Users to erase: those nearest the median row count (deterministic), skipping the largest ones.
    med = float(np.median(list(counts.values())))
    erase = sorted(users, key=lambda u: (abs(counts[u] - med), u))[:n_erase]
    log(
        f"  dataset ready in {time.perf_counter() - t0:.1f}s "
        f"({int(real.sum()):,} real vectors, {int(has_vec.sum() - real.sum()):,} derived)"
    )
    return Dataset(
        scale,
        seed,
        rows,
        vectors,
        has_vec,
        real,
        qs[n_calibration:],
        qs[:n_calibration],
        saved_q,
        erase,
        len(main),
    )


# --------------------------------------------------------------------------------------
# Vectors: the real pool (cached) and the derived rest
# --------------------------------------------------------------------------------------

_embedder_singleton: Any = None


def default_embedder() -> Any:
    """Loom's MiniLM embedder (loom.providers); built once per process."""
    global _embedder_singleton
    if _embedder_singleton is None:
        from loom.providers.embedders import build_embedder

        _embedder_singleton = build_embedder("minilm")
    return _embedder_singleton


def _key(text: str) -> bytes:
    return hashlib.sha1(text.encode("utf-8")).digest()


class VectorCache:
    """Real embeddings keyed by sha1 of the text, in one npz per model under ``bench/.cache``."""

    def __init__(self, model_id: str, cache_dir: Path = CACHE_DIR) -> None:
        safe = re.sub(r"[^A-Za-z0-9._-]+", "_", model_id)
        self.path = cache_dir / f"vectors-{safe}.npz"
        self._map: dict[bytes, np.ndarray] = {}
        self._dirty = False
        if self.path.exists():
            with np.load(self.path) as z:
                keys, vecs = z["keys"], z["vecs"]
            if keys.dtype == np.uint8 and keys.ndim == 2:  # (n, 20) sha1 digests
                self._map = {k.tobytes(): vecs[i] for i, k in enumerate(keys)}
            elif keys.dtype.kind == "S":  # an older cache: "S20" keys lost their trailing NULs
                self._map = {bytes(k).ljust(20, b"\0"): vecs[i] for i, k in enumerate(keys)}

    def __len__(self) -> int:
        return len(self._map)

    def get(self, text: str) -> np.ndarray | None:
        return self._map.get(_key(text))

    def put(self, texts: Sequence[str], vecs: np.ndarray) -> None:
        for t, v in zip(texts, vecs, strict=True):
            self._map[_key(t)] = np.asarray(v, dtype=np.float32)
        self._dirty = True

    def save(self) -> None:
        if not self._dirty:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Raw digests as uint8 rows (a numpy "S20" array would drop trailing NUL bytes).
        keys = np.frombuffer(b"".join(self._map), dtype=np.uint8).reshape(-1, 20)
        vecs = (
            np.stack(list(self._map.values())).astype(np.float32)
            if self._map
            else np.zeros((0, DIM), np.float32)
        )
        tmp = self.path.with_suffix(".tmp.npz")
        np.savez(tmp, keys=keys, vecs=vecs)
        os.replace(tmp, self.path)
        self._dirty = False


def embed_real(
    texts: Sequence[str],
    *,
    embedder: Any = None,
    cache_dir: Path = CACHE_DIR,
    log: Callable[[str], None] = print,
) -> np.ndarray:
    """Real MiniLM vectors for ``texts``, from the cache where present; new ones are embedded and cached."""
    emb = embedder or default_embedder()
    cache = VectorCache(getattr(emb, "model_id", "embedder"), cache_dir)
    out = np.zeros((len(texts), DIM), dtype=np.float32)
    missing: list[int] = []
    for i, t in enumerate(texts):
        v = cache.get(t)
        if v is None:
            missing.append(i)
        else:
            out[i] = v
    if missing:
        log(
            f"  embedding {len(missing):,} texts with the real model (cached afterwards in {cache.path.name}; "
            f"{len(texts) - len(missing):,} cached)"
        )
        t0 = time.perf_counter()
        step = 256
        try:
            for s in range(0, len(missing), step):
                chunk = missing[s : s + step]
                vecs = emb.embed([texts[i] for i in chunk])
                out[chunk] = vecs
                cache.put([texts[i] for i in chunk], vecs)
                done = s + len(chunk)
                if done % 2048 < step or done == len(missing):
                    rate = done / (time.perf_counter() - t0)
                    log(f"    {done:,}/{len(missing):,} ({rate:.0f} texts/s)")
        finally:
            cache.save()
    return out


DERIVE_MODES = ("mix", "noise")
DEFAULT_SIGMA = {"mix": 0.01, "noise": 0.05}


def derive(
    sources: np.ndarray,
    n: int,
    *,
    seed: int,
    mode: str = "mix",
    sigma: float | None = None,
    start: int = 0,
    chunk: int = 4096,
) -> np.ndarray:
    """``n`` derived unit vectors from the real ``sources``.

    * ``mix`` (default): a random convex mixture of three real vectors (Dirichlet(1, 1, 1)
      weights) plus ``sigma * N(0, I)`` (sigma 0.01 per component), re-normalised.
    * ``noise``: one real vector plus ``sigma * N(0, I)`` (sigma 0.05 per component: the noise
      has norm ~0.98, the result keeps a cosine of ~0.71 to its source), re-normalised.

    Why ``mix``: with ``noise``, each real vector grows a tight cluster of ~40 near-copies at
    1M turns, so a query's top 10 is a pick among near-ties. Measured at 100k turns (2,300 real
    vectors, pgvector HNSW m=16): recall@10 at ef_search=40 is 0.53 with ``noise`` and 0.82 with
    ``mix``; the first is an adversarial case for any ANN index, not a realistic one.
    Row ``start + i`` depends only on (seed, its index, the sources): generated in fixed chunks.
    """
    if mode not in DERIVE_MODES:
        raise ValueError(f"derive mode must be one of {DERIVE_MODES}")
    sig = DEFAULT_SIGMA[mode] if sigma is None else sigma
    dim = sources.shape[1]
    out = np.empty((n, dim), dtype=np.float32)
    i = 0
    while i < n:
        g = (start + i) // chunk
        rng = np.random.default_rng([seed, 7919, g])
        lo = (start + i) - g * chunk
        rows = min(chunk - lo, n - i)
        if mode == "mix":
            idx = rng.integers(0, len(sources), size=(chunk, 3))[lo : lo + rows]
            w = rng.dirichlet([1.0, 1.0, 1.0], size=chunk).astype(np.float32)[lo : lo + rows]
            v = np.einsum("nk,nkd->nd", w, sources[idx])
        else:
            v = sources[rng.integers(0, len(sources), size=chunk)[lo : lo + rows]].copy()
        v += sig * rng.standard_normal((chunk, dim), dtype=np.float32)[lo : lo + rows]
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        out[i : i + rows] = v
        i += rows
    return out


def vectors_for(
    texts: Sequence[str],
    n_real: int = 20_000,
    *,
    real: Sequence[int] | None = None,
    seed: int = 42,
    mode: str = "mix",
    sigma: float | None = None,
    embedder: Any = None,
    cache_dir: Path = CACHE_DIR,
    log: Callable[[str], None] = print,
) -> tuple[np.ndarray, np.ndarray]:
    """Unit vectors for ``texts`` (shape ``(len(texts), 384)``) via the bulk path.

    The texts at positions ``real`` (default: the first ``n_real``) are embedded with the real
    model (cached in ``bench/.cache``); every other one gets a vector derived from real ones by
    :func:`derive`. Returns (vectors, mask of the real ones)."""
    positions = sorted(set(real)) if real is not None else list(range(min(n_real, len(texts))))
    mask = np.zeros(len(texts), dtype=bool)
    mask[positions] = True
    out = np.empty((len(texts), DIM), dtype=np.float32)
    if positions:
        out[positions] = embed_real(
            [texts[i] for i in positions], embedder=embedder, cache_dir=cache_dir, log=log
        )
    rest = np.flatnonzero(~mask)
    if len(rest):
        if not positions:
            raise ValueError("vectors_for needs at least one real text to derive from")
        out[rest] = derive(out[positions], len(rest), seed=seed, mode=mode, sigma=sigma)
    return out, mask


# --------------------------------------------------------------------------------------
# Exact search (ground truth)
# --------------------------------------------------------------------------------------


def exact_topk(
    matrix: np.ndarray,
    ids: Sequence[str],
    queries: np.ndarray,
    k: int = 10,
    floor: float = MIN_SIMILARITY,
    block: int = 128,
) -> list[list[str]]:
    """Exact cosine top-``k`` ids per query among ``matrix`` rows (unit vectors), floored."""
    out: list[list[str]] = []
    for s in range(0, len(queries), block):
        sims = queries[s : s + block] @ matrix.T
        kk = min(k, sims.shape[1])
        top = np.argpartition(-sims, kk - 1, axis=1)[:, :kk]
        for r in range(sims.shape[0]):
            cand = top[r][np.argsort(-sims[r, top[r]])]
            out.append([ids[j] for j in cand if sims[r, j] >= floor])
    return out


if __name__ == "__main__":  # a peek: python -m bench.datagen [N]
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    for t in turns(n):
        print(f"[{t['thread_id']} {t['role']:9} {t['user_id']}] {t['content'][:160]!r}")
