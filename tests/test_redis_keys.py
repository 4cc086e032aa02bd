"""Every Redis key's string, pinned: a rolling deploy runs builds of two ages against one
Redis, so a key whose string changed would lose its state (claims, notes, leases, marks)."""

from __future__ import annotations

import hashlib
import pathlib
import re

import pytest

from loom import queue, redis_keys
from loom.leases import thread_lease_key
from loom.ops.briefs.ops import lease_key as brief_lease_key
from loom.ops.conversation.writing import appending
from loom.ops.embedding import recovery
from loom.store import fences, landed, recording_cache, search_marks

PINNED = [
    (queue.QUEUE, "loom:queue"),
    (queue.WAKE_KEY, "loom:queue:wake"),
    (
        appending.claim_key(("ns", "a", "t", "m")),
        "loom:claim:turn:ns:" + hashlib.sha256(b"ns\0a\0t\0m").hexdigest()[:40],
    ),
    (redis_keys.turn_claim("ns", "h" * 40), "loom:claim:turn:ns:" + "h" * 40),
    (redis_keys.turn_claims_of("ns"), "loom:claim:turn:ns:"),
    (redis_keys.append_flush("f"), "loom:flush:append:f"),
    (redis_keys.landed_of("ns"), "loom:landed:ns:"),
    (redis_keys.landed_bucket("ns", 0xA), "loom:landed:ns:00a"),
    (landed.ready_key("ns"), "loom:landed:ns:ready"),
    (redis_keys.landed_rebuilding("ns"), "loom:landed:ns:ready:rebuilding"),
    (fences.key("ns"), "loom:deleted:ns"),
    (recording_cache.key("ns"), "loom:recording:ns"),
    (search_marks.key("ns"), "loom:search:marks:2:ns"),
    (thread_lease_key("ns", "t"), "loom:lease:thread:ns:t"),
    (brief_lease_key("ns", "k"), "loom:lease:brief:ns:k"),
    (recovery.LEASE_KEY, "loom:lease:embed-recovery"),
    (redis_keys.embed_gate("g"), "loom:gate:g"),
    (redis_keys.embed_gate_wake("g"), "loom:gate:g:wake"),
    (redis_keys.reply("p"), "loom:reply:p"),
    (redis_keys.REPLICAS, "loom:replicas"),
    (redis_keys.READ_INDEX_EVENTS, "loom:readindex:events"),
    (redis_keys.compact_done("j"), "loom:compact:done:j"),
    (redis_keys.memory_erasing("ns", "u"), "loom:erasing:memory:ns:u"),
    (redis_keys.memory_job("ns", "j"), "loom:memory:job:ns:j"),
    (redis_keys.memory_jobs_of("ns"), "loom:memory:job:ns:"),
    (redis_keys.webhook_lease("ns"), "loom:lease:webhooks:ns"),
    (redis_keys.memory_version("ns", "u"), "loom:memory:version:ns:u"),
    (redis_keys.memory_version_of("ns"), "loom:memory:nsversion:ns"),
    (redis_keys.SETTINGS_VERSION, "loom:settings:version"),
    (redis_keys.TITLER_LAST_PASS, "loom:titler:last_pass"),
    (redis_keys.settings_applied("api:h:1"), "loom:settings:applied:api:h:1"),
    (redis_keys.IMPORT_WINDOWS, "loom:import:windows"),
    (redis_keys.import_embed_lease("j"), "loom:lease:import-embed:j"),
]


@pytest.mark.parametrize(("built", "expected"), PINNED, ids=[e for _, e in PINNED])
def test_key_strings_are_pinned(built: str, expected: str) -> None:
    assert built == expected


def test_the_landed_note_buckets_use_the_pinned_layout() -> None:
    key, _ = landed._slot("ns", bytes(8))
    assert key == "loom:landed:ns:000"


def test_no_module_spells_a_key_of_its_own() -> None:
    """Only loom/redis_keys.py spells a "loom:" key string in loom/ and workers/."""
    root = pathlib.Path(__file__).resolve().parents[1]
    spelled = re.compile(r"""["']loom:[a-z]""")
    offenders = [
        str(path.relative_to(root))
        for top in ("loom", "workers")
        for path in (root / top).rglob("*.py")
        if path.name != "redis_keys.py" and spelled.search(path.read_text())
    ]
    assert offenders == []
