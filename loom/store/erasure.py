"""SQL of erasure.request, erasure.status and the removal job.

A user erasure first fixes its keys (:func:`fix_user_keys`, table erasure_keys), then
tombstones what they name so nothing of the user is readable (:func:`tombstone_turns`,
:func:`tombstone_embeddings`, :func:`tombstone_briefs`), and the worker later removes
the rows from disk (:func:`remove_step`). A namespace erasure hides every row of the
namespace with lightweight DELETEs (:func:`hide_namespace`) and the worker then rewrites
the parts without them. Every statement names its rows by a condition that stays true
when it is run again, so a step can be retried after a crash.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from clickhouse_connect.driver.client import Client
from pydantic import BaseModel, ConfigDict, Field

from loom.clock import next_version, utcnow
from loom.store import conversations as conv_store
from loom.store import deletion
from loom.store import embeddings as emb_store
from loom.store.clickhouse import key_sets
from loom.store.rows import VERSION, column, frozen_table_row, named, scalar, table_row
from loom.store.rows import table as declare_table

# Every table that holds rows of a namespace, with the columns that key a row in it
# (what a receipt's digest is computed over). erasure_requests stays: it is the record.
NAMESPACE_TABLES: dict[str, tuple[str, ...]] = {
    "conversations": ("agent", "thread_id", "msg_id", "version"),
    "conversation_embeddings": ("thread_id", "msg_id", "version"),
    "conversation_vectors_384": ("thread_id", "msg_id", "version"),
    "conversation_vectors_1536": ("thread_id", "msg_id", "version"),
    "threads": ("agent", "thread_id", "version"),
    "conversation_terms": ("agent", "thread_id", "msg_id", "term", "doc"),
    "saved_docs": ("user_id", "thread_id", "msg_id", "agent", "version"),
    "saved_terms": ("user_id", "term", "doc"),
    "saved_vectors": ("user_id", "thread_id", "msg_id", "version"),
    "session_briefs": ("brief_key", "version"),
    "session_brief_revisions": ("brief_key", "revision", "version"),
    "memories": ("user_id", "memory_id", "version"),
    "memory_terms": ("user_id", "term", "doc"),
    "memory_evidence": ("user_id", "evidence_id", "version"),
    "evidence_terms": ("user_id", "term", "doc"),
    "memory_decisions": ("user_id", "extraction_id", "seq"),
    "memory_profiles": ("user_id", "version"),
    "search_marks": ("thread_id", "mark"),
    "namespaces": ("version",),
    "erasure_keys": ("erasure_id", "kind", "agent", "thread_id", "msg_id"),
    "message_redactions": ("agent", "thread_id", "msg_id", "redacted_at"),
    "import_jobs": ("job_id", "version"),
    "import_embeddings": ("job_id", "version"),
}
VECTOR_TABLES = ("conversation_vectors_384", "conversation_vectors_1536")
SAVED_TABLES = ("saved_docs", "saved_terms", "saved_vectors")
# The memory plane keys every row by (namespace, user_id): a user's facts, evidence,
# postings, decisions and profile are named by the user alone, with no keys to fix first.
MEMORY_TABLES = (
    "memories",
    "memory_terms",
    "memory_evidence",
    "evidence_terms",
    "memory_decisions",
    "memory_profiles",
)


@dataclass
class TableCount:
    """One table's line of a receipt."""

    tombstoned: int = 0
    removed: int = 0
    digest: str = ""  # hex: sum of sipHash64 over the keys, mod 2^64


# -- the request record ----------------------------------------------------------


class ReceiptLine(BaseModel):
    """One table's line of a receipt: rows tombstoned (or hidden) at the request, rows
    removed from disk by the job, and the digest of the keys per namespace."""

    # A newer build's keys survive this build's rewrite of the receipt (a rolling upgrade).
    model_config = ConfigDict(extra="allow")

    tombstoned: int = 0
    removed: int = 0
    digests: dict[str, str] = Field(default_factory=dict)
    hidden: dict[str, int] | None = None  # per namespace: rows a lightweight DELETE hid at the request


class StepProgress(BaseModel):
    """One removal step of one namespace: the rows it counted before any removal, and
    whether it ran (recorded after it ran, so a killed job resumes where it stopped)."""

    rows: int
    done: bool = False


class Receipt(BaseModel):
    """What an erasure did, never any removed text. A line's `hidden` (none for a table
    only the removal touched) and `progress` (none before the job planned) are left out
    of the stored and answered JSON when there are none."""

    model_config = ConfigDict(extra="allow")  # as ReceiptLine's

    erasure_id: str = ""
    kind: str = ""
    user_id: str = ""
    namespaces: list[str] = Field(default_factory=list)
    purge: bool = False
    asked_at: str | None = None
    unreadable_at: str | None = None
    removed_at: str | None = None
    tables: dict[str, ReceiptLine] = Field(default_factory=dict)
    digest: str = ""
    progress: dict[str, StepProgress] | None = None  # by "<namespace>/<step>"

    def steps(self) -> dict[str, StepProgress]:
        """The removal's progress, begun when the job first plans."""
        if self.progress is None:
            self.progress = {}
        return self.progress

    def as_json(self) -> dict[str, Any]:
        body = self.model_dump(mode="json")
        if self.progress is None:
            del body["progress"]
        for line in body["tables"].values():
            if line["hidden"] is None:
                del line["hidden"]
        return body


def _receipt_json(receipt: Receipt) -> str:
    return json.dumps(receipt.as_json(), separators=(",", ":"), sort_keys=True)


def _receipt(raw: str) -> Receipt:
    return Receipt.model_validate_json(raw or "{}")


@table_row
class Request:
    """A row of loom.erasure_requests (its ``version`` is the writer's)."""

    erasure_id: str = column("String")
    token_id: str = column("String")
    kind: str = column("LowCardinality(String)")  # user | namespaces
    user_id: str = column("String")
    namespaces: list[str] = column("Array(String)")
    purge: bool = column("Bool")
    state: str = column("LowCardinality(String)")  # removing | done | failed
    receipt: Receipt = column("String", default_factory=Receipt, encode=_receipt_json, decode=_receipt)
    steps_total: int = column("UInt32", default=0)
    steps_done: int = column("UInt32", default=0)
    error: str = column("String", default="")
    created_at: datetime | None = column("DateTime64(3, 'UTC')", default=None)
    updated_at: datetime | None = column("DateTime64(3, 'UTC')", default=None)


REQUESTS = declare_table("erasure_requests", Request, extra=[VERSION])


@frozen_table_row
class ErasureKey:
    """A row of loom.erasure_keys: a key a request erases (or, kind handed, leaves)."""

    erasure_id: str = column("String")
    namespace: str = column("String")
    kind: str = column("LowCardinality(String)")
    agent: str = column("String")
    thread_id: str = column("String")
    msg_id: str = column("String")


KEYS = declare_table("erasure_keys", ErasureKey)


def save_request(ch: Client, req: Request) -> None:
    req.updated_at = utcnow()
    REQUESTS.insert(ch, [req], version=next_version())


def get_request(ch: Client, erasure_id: str) -> Request | None:
    return REQUESTS.first(ch, "WHERE erasure_id = {e:String}", {"e": erasure_id})


# -- digests -----------------------------------------------------------------------


def _digest(ch: Client, sql: str, params: dict[str, Any]) -> str:
    """The digest of the keys a SELECT of key columns returns (order-free: a sum of
    their hashes, which an operator can recompute from a backup)."""
    total = scalar(
        ch, f"SELECT toString(sum(h)) FROM (SELECT DISTINCT sipHash64(*) AS h FROM ({sql}))", params
    )
    return format(int(total or 0), "016x")


# -- a user erasure: fix the keys ---------------------------------------------------

_TURN_KEYS = (
    "SELECT agent, thread_id, msg_id FROM erasure_keys WHERE erasure_id = {e:String} "
    "AND namespace = {ns:String} AND kind = 'turn'"
)
_EMB_KEYS = (
    "SELECT thread_id, msg_id FROM erasure_keys WHERE erasure_id = {e:String} "
    "AND namespace = {ns:String} AND kind = 'embedding'"
)
_BRIEF_KEYS = (
    "SELECT msg_id FROM erasure_keys WHERE erasure_id = {e:String} "
    "AND namespace = {ns:String} AND kind = 'brief'"
)
_EXPIRED_KEYS = (
    "SELECT thread_id, msg_id FROM erasure_keys WHERE erasure_id = {e:String} "
    "AND namespace = {ns:String} AND kind = 'expired'"
)
_HANDED_KEYS = (
    "SELECT thread_id, msg_id FROM erasure_keys WHERE erasure_id = {e:String} "
    "AND namespace = {ns:String} AND kind = 'handed'"
)


@dataclass
class KeyDigests:
    turn: str
    embedding: str
    thread: str


@dataclass
class UserKeys:
    """What the request reads back of the keys it fixed: the threads they lie in, the
    (agent, thread) pairs of the user's turns, and the digests of the keys."""

    threads: list[str]
    pairs: list[tuple[str, str]]
    digests: KeyDigests


def _hex(total: Any) -> str:
    return format(int(total or 0), "016x")


def fix_user_keys(
    ch: Client, erasure_id: str, namespace: str, user_id: str, *, purge: bool = False
) -> UserKeys:
    """Record the keys of every transcript and embedding row any version of which the
    user owns (a save may have claimed a row no user owned before), then read back, in
    one statement, what the rest of the request needs (:class:`UserKeys`, the receipt's
    key digests included). It runs beside the tombstones, which name the user's rows by
    their threads (:func:`user_threads`), not by these keys. Recording the
    same keys twice changes nothing (the reads de-duplicate). With `purge`, also the
    user's embedding rows whose message no agent's transcript row holds any more (the
    retention TTL expired it, kind expired): a user erasure tombstones those but leaves
    them on disk; only a namespace erasure removes them."""
    params = {"e": erasure_id, "ns": namespace, "u": user_id}
    if purge:
        ch.command(
            "INSERT INTO erasure_keys (erasure_id, namespace, kind, agent, thread_id, msg_id) "
            "SELECT {e:String}, {ns:String}, 'expired', '', thread_id, msg_id FROM conversation_embeddings "
            "WHERE namespace = {ns:String} AND user_id = {u:String} AND (thread_id, msg_id) NOT IN ("
            "  SELECT thread_id, msg_id FROM conversations WHERE namespace = {ns:String} AND thread_id IN ("
            "    SELECT thread_id FROM conversation_embeddings WHERE namespace = {ns:String} AND user_id = {u:String}))"
            " GROUP BY thread_id, msg_id",
            parameters=params,
        )
    ch.command(
        "INSERT INTO erasure_keys (erasure_id, namespace, kind, agent, thread_id, msg_id) "
        "SELECT {e:String}, {ns:String}, 'turn', toString(agent), thread_id, msg_id FROM conversations "
        "WHERE namespace = {ns:String} AND user_id = {u:String} GROUP BY agent, thread_id, msg_id "
        "UNION ALL "
        "SELECT {e:String}, {ns:String}, 'embedding', '', thread_id, msg_id FROM conversation_embeddings "
        "WHERE namespace = {ns:String} AND user_id = {u:String} GROUP BY thread_id, msg_id",
        parameters=params,
    )
    mine = "erasure_id = {e:String} AND namespace = {ns:String}"
    got = next(
        named(
            ch.query(
                f"SELECT groupUniqArray(thread_id) AS threads, "
                f"groupUniqArrayIf((agent, thread_id), kind = 'turn') AS pairs, {_key_digest_columns()} "
                f"FROM erasure_keys WHERE {mine}",
                parameters=params,
            )
        )
    )
    return UserKeys(
        threads=sorted(got["threads"]),
        pairs=sorted((str(a), str(t)) for a, t in got["pairs"]),
        digests=KeyDigests(
            turn=_hex(got["turn_digest"]),
            embedding=_hex(got["embedding_digest"]),
            thread=_hex(got["thread_digest"]),
        ),
    )


def _key_digest_columns() -> str:
    """The digests of the turn, embedding and thread keys fixed, as aggregates of a read
    of the erasure's keys (one pass; the same sum as :func:`_digest`)."""

    def summed(cols: str, kind: str) -> str:
        return f"toString(arraySum(groupUniqArrayIf(sipHash64({cols}), kind = '{kind}')))"

    return (
        f"{summed('agent, thread_id, msg_id', 'turn')} AS turn_digest, "
        f"{summed('thread_id, msg_id', 'embedding')} AS embedding_digest, "
        f"{summed('agent, thread_id', 'turn')} AS thread_digest"
    )


@dataclass
class UserThreads:
    """The threads any version of a transcript or embedding row of the user lies in, and
    those of them that hold a row of another user (any version): only those can keep a
    live turn, or hold an heir of an embedding row, once the user's rows are tombstoned."""

    threads: list[str]
    mixed: set[str]


def user_threads(ch: Client, namespace: str, user_id: str) -> UserThreads:
    """One read, needing no key fixed first (see :class:`UserThreads`)."""
    mine = "namespace = {ns:String} AND user_id = {u:String}"
    rows = ch.query(
        # every thread of the user's embedding rows shows, its transcript rows expired or not
        "SELECT thread_id, max(user_id != {u:String}) AS mixed FROM ("
        "  SELECT thread_id, user_id FROM conversations WHERE namespace = {ns:String} AND thread_id IN ("
        f"    SELECT thread_id FROM conversations WHERE {mine} "
        f"    UNION DISTINCT SELECT thread_id FROM conversation_embeddings WHERE {mine}) "
        f"  UNION ALL SELECT thread_id, user_id FROM conversation_embeddings WHERE {mine}"
        ") GROUP BY thread_id",
        parameters={"ns": namespace, "u": user_id},
    )
    found = list(named(rows))
    return UserThreads(
        threads=sorted({r["thread_id"] for r in found}), mixed={r["thread_id"] for r in found if r["mixed"]}
    )


def drop_keys(ch: Client, erasure_id: str) -> None:
    ch.command(
        "ALTER TABLE erasure_keys DELETE WHERE erasure_id = {e:String}",
        parameters={"e": erasure_id},
        settings={"mutations_sync": 2},
    )


# -- a user erasure: tombstones (nothing readable) -----------------------------------


# The user's live rows, named by their threads (the primary key narrows the read to
# them) and their newest version's owner: what the fixed keys name, less what was
# already tombstoned, so the tombstones need not wait for the keys.
_USER_LIVE = (
    "namespace = {ns:String} AND thread_id IN {th:Array(String)} AND user_id = {u:String} AND NOT tombstoned"
)


def tombstone_turns(ch: Client, namespace: str, user_id: str, threads: Sequence[str]) -> int:
    """Tombstone (reason "erased") every live transcript row the user owns in `threads`
    (:func:`user_threads`), in one statement. Returns the version the tombstones carry
    (count them with :func:`written`: a count first would be one more statement on the
    way to the answer)."""
    version = next_version()
    params = {"ns": namespace, "u": user_id, "v": version, "th": list(threads)}
    where = _USER_LIVE
    replaced = {"tombstoned": "true", "tombstoned_at": "now64(3)", "tombstone_reason": "'erased'"}
    conv_store.TABLE.revise(ch, replaced, where, params)
    return version


WRITTEN_TABLES = ("conversations", "conversation_embeddings", "threads")


def written(
    ch: Client, namespace: str, threads: Sequence[str], stamped: Mapping[str, Sequence[int]]
) -> dict[str, int]:
    """How many rows of the namespace's `threads` the erasure's statements stamped with
    the versions of `stamped` (per table), in one read (its parts run side by side)."""
    asked = {t: list(v) for t, v in stamped.items() if v}
    counts = {table: 0 for table in stamped}
    if not asked:
        return counts
    parts: list[str] = []
    params: dict[str, Any] = {"ns": namespace, "th": list(threads)}
    for i, (table, versions) in enumerate(asked.items()):
        if table not in WRITTEN_TABLES:
            raise ValueError(f"not a table an erasure tombstones: {table}")
        parts.append(
            f"SELECT {i} AS i, count() AS n FROM {table} WHERE namespace = {{ns:String}} "
            f"AND thread_id IN {{th:Array(String)}} AND version IN {{v{i}:Array(UInt64)}}"
        )
        params[f"v{i}"] = versions
    tables = list(asked)
    for row in named(ch.query(" UNION ALL ".join(parts), parameters=params)):
        counts[tables[int(row["i"])]] = int(row["n"])
    return counts


def key_stamped(
    ch: Client, erasure_id: str, namespace: str, threads: Sequence[str], stamped: Mapping[str, Sequence[int]]
) -> None:
    """Record the keys of the rows the tombstones stamped, in one statement: the keys were
    fixed beside the tombstones, so a row of the user that landed between the two reads
    is tombstoned but was not keyed; this keys it, so the removal takes it too. A key
    recorded twice changes nothing."""
    params: dict[str, Any] = {"e": erasure_id, "ns": namespace, "th": list(threads)}
    parts = []
    for table, kind, agent in (
        ("conversations", "turn", "toString(agent)"),
        ("conversation_embeddings", "embedding", "''"),
    ):
        if stamped.get(table):
            params[kind] = list(stamped[table])
            parts.append(
                f"SELECT {{e:String}}, {{ns:String}}, '{kind}', {agent}, thread_id, msg_id FROM {table} "
                f"WHERE namespace = {{ns:String}} AND thread_id IN {{th:Array(String)}} "
                f"AND version IN {{{kind}:Array(UInt64)}}"
            )
    if parts:
        ch.command(
            "INSERT INTO erasure_keys (erasure_id, namespace, kind, agent, thread_id, msg_id) "
            + " UNION ALL ".join(parts),
            parameters=params,
        )


THREAD_GONE, THREAD_KEPT = "thread", "thread_kept"
Pair = tuple[str, str]  # (agent, thread_id)


def thread_fates(
    ch: Client, namespace: str, user_id: str, keys: UserKeys, mixed_threads: set[str]
) -> tuple[list[Pair], list[Pair]]:
    """The user's thread rows' fate, (gone, kept): every (agent, thread) the user has a
    turn in. One left with no live turn once the user's turns are tombstoned is gone;
    one where other users' turns live on is kept. Only a thread that holds a row of
    another user can be kept, so only those are read (FINAL: the live versions), and not
    at all when there are none; the read does not wait for the tombstones (a turn of
    the user counts as gone)."""
    live: set[Pair] = set()
    mixed = sorted({t for _, t in keys.pairs} & mixed_threads)
    if mixed:
        rows = ch.query(
            "SELECT DISTINCT toString(agent) AS agent, thread_id FROM conversations FINAL "
            "WHERE namespace = {ns:String} AND thread_id IN {th:Array(String)} "
            "AND NOT tombstoned AND user_id != {u:String}",
            parameters={"ns": namespace, "th": mixed, "u": user_id},
        )
        live = {(r["agent"], r["thread_id"]) for r in named(rows)}
    kept = [p for p in keys.pairs if p in live]
    return [p for p in keys.pairs if p not in live], kept


def record_thread_keys(
    ch: Client, erasure_id: str, namespace: str, gone: Sequence[Pair], kept: Sequence[Pair], version: int
) -> None:
    """Note the thread keys for the removal: kind "thread" (every version goes) and
    "thread_kept", whose key notes the version its title was emptied at (the removal
    takes the versions below it)."""
    KEYS.insert(
        ch,
        [
            ErasureKey(
                erasure_id=erasure_id,
                namespace=namespace,
                kind=kind,
                agent=agent,
                thread_id=thread_id,
                msg_id=str(version) if kind == THREAD_KEPT else "",
            )
            for kind, pairs in ((THREAD_GONE, gone), (THREAD_KEPT, kept))
            for agent, thread_id in pairs
        ],
    )


def settle_threads(
    ch: Client, namespace: str, gone: Sequence[Pair], kept: Sequence[Pair], version: int
) -> None:
    """Write the user's thread rows (see :func:`thread_fates`): a gone thread is
    tombstoned, title and metadata emptied; a kept one keeps its row with the title
    emptied, since a title is written from the thread's text. Rows already so are not
    rewritten, so running it again writes none."""
    if not (gone or kept):
        return
    params = {
        "ns": namespace,
        "v": version,
        "th": sorted({t for _, t in [*gone, *kept]}),
        "g": [tuple(p) for p in gone],
        "k": [tuple(p) for p in kept],
    }
    is_gone = "has({g:Array(Tuple(String, String))}, (toString(agent), thread_id))"
    ch.command(
        "INSERT INTO threads (namespace, agent, thread_id, title, metadata, run_id, created_at, updated_at, "
        f"tombstoned, version) SELECT namespace, agent, thread_id, '', if({is_gone}, '{{}}', metadata), run_id, "
        f"created_at, now64(3), {is_gone} OR tombstoned, {{v:UInt64}} FROM threads FINAL "
        "WHERE namespace = {ns:String} AND thread_id IN {th:Array(String)} "
        f"AND ({is_gone} AND (NOT tombstoned OR title != '' OR metadata != '{{}}') "
        "OR has({k:Array(Tuple(String, String))}, (toString(agent), thread_id)) AND title != '')",
        parameters=params,
    )


def other_copies(
    ch: Client, erasure_id: str, namespace: str, user_id: str, chars: int, mixed: Sequence[str]
) -> list[tuple[str, deletion.Copy]]:
    """Every agent's row (any owner, tombstoned or not) of the turns whose embedding
    rows the user owns, as (thread_id, copy): the heirs and the user's own copies. Only
    the `mixed` threads (those holding a row of another user) can hold an heir: none,
    no read."""
    if not mixed:
        return []
    rows = ch.query(
        f"SELECT thread_id, {deletion.COPY_COLUMNS} FROM conversations FINAL "
        "WHERE namespace = {ns:String} AND thread_id IN {th:Array(String)} "
        f"AND (thread_id, msg_id) IN ({_EMB_KEYS}) AND (thread_id, msg_id) IN ("
        "  SELECT thread_id, msg_id FROM conversations FINAL WHERE namespace = {ns:String} "
        "  AND thread_id IN {th:Array(String)} "
        f"  AND (thread_id, msg_id) IN ({_EMB_KEYS}) AND user_id != {{u:String}} AND NOT tombstoned)",
        parameters={"e": erasure_id, "ns": namespace, "u": user_id, "n": chars, "th": sorted(mixed)},
    ).named_results()
    return [(r["thread_id"], deletion.copy_of(r)) for r in rows]


def hand_over(ch: Client, erasure_id: str, namespace: str, rows: Sequence[emb_store.EmbeddingRow]) -> None:
    """Write the embedding rows passed to another user's copy, and note their keys so the
    removal leaves them."""
    if not rows:
        return
    emb_store.insert(ch, list(rows))
    KEYS.insert(
        ch,
        [
            ErasureKey(
                erasure_id=erasure_id,
                namespace=namespace,
                kind="handed",
                agent="",
                thread_id=r.thread_id,
                msg_id=r.msg_id,
            )
            for r in rows
        ],
    )


def tombstone_embeddings(ch: Client, namespace: str, user_id: str, threads: Sequence[str]) -> int:
    """Tombstone every live embedding row the user owns in `threads` (text and vector
    emptied; saved_at stays so the per-user vector index takes it), in one statement;
    rows passed to another user's copy first are that user's. Returns the version the
    tombstones carry (:func:`written` counts them)."""
    version = next_version()
    params = {"ns": namespace, "u": user_id, "v": version, "th": list(threads)}
    where = _USER_LIVE
    replaced = {
        "text": "''",
        "embedding": "CAST([] AS Array(Float32))",
        "model": "''",
        "error": "''",
        "is_saved": "false",
        "tombstoned": "true",
    }
    emb_store.TABLE.revise(ch, replaced, where, params)
    return version


def live_embedding_rows(
    ch: Client, erasure_id: str, namespace: str, user_id: str, pairs: Sequence[tuple[str, str]]
) -> list[emb_store.EmbeddingRow]:
    """The user's live embedding rows among `pairs` (thread_id, msg_id), with vectors."""
    if not pairs:
        return []
    found = ch.query(
        emb_store._FULL + "WHERE namespace = {ns:String} AND thread_id IN {th:Array(String)} "
        "AND msg_id IN {ids:Array(String)} AND user_id = {u:String} AND NOT tombstoned",
        parameters={
            "ns": namespace,
            "u": user_id,
            **key_sets(pairs, th=0, ids=1),
        },
    )
    wanted = set(pairs)
    return [r for r in emb_store.TABLE.rows(found) if (r.thread_id, r.msg_id) in wanted]


_BRIEF_OWNER = "(user_id = {u:String} OR startsWith(brief_key, {p:String}))"


def _brief_params(namespace: str, user_id: str) -> dict[str, Any]:
    # A token bounded to a user keeps that user's briefs under a ~user~ prefix.
    return {"ns": namespace, "u": user_id, "p": f"~{user_id}~"}


def tombstone_briefs(ch: Client, erasure_id: str, namespace: str, user_id: str) -> tuple[int, int, str]:
    """The user's briefs: their keys fixed (kind brief), a deleted version of each
    (sections emptied), and every revision of them or by the user removed (a lightweight
    DELETE: unreadable at once). Returns (briefs tombstoned, revisions removed, digest
    of the brief keys). The digest and both counts come from one read."""
    params = {**_brief_params(namespace, user_id), "v": next_version(), "e": erasure_id}
    mine = f"namespace = {{ns:String}} AND {_BRIEF_OWNER}"
    revisions = (
        f"namespace = {{ns:String}} AND ({_BRIEF_OWNER} OR brief_key IN (SELECT brief_key FROM "
        f"session_briefs WHERE {mine}))"
    )
    keys = (
        f"SELECT brief_key FROM session_briefs WHERE {mine} UNION DISTINCT "
        f"SELECT brief_key FROM session_brief_revisions WHERE {mine}"
    )
    # One read, a branch per figure (the engine runs them side by side).
    rows = ch.query(
        f"SELECT 'total' AS k, toString(sum(DISTINCT sipHash64(brief_key))) AS n FROM ({keys}) "
        f"UNION ALL SELECT 'versions', toString(count()) FROM session_briefs WHERE {mine} "
        f"UNION ALL SELECT 'live', toString(count()) FROM session_briefs FINAL WHERE {mine} AND NOT deleted "
        f"UNION ALL SELECT 'revisions', toString(count()) FROM session_brief_revisions WHERE {revisions}",
        parameters=params,
    )
    found = {r["k"]: r["n"] for r in named(rows)}
    count, removed = int(found["live"]), int(found["revisions"])
    if int(found["versions"]):  # every version goes, a brief deleted before included
        ch.command(
            "INSERT INTO erasure_keys (erasure_id, namespace, kind, agent, thread_id, msg_id) "
            "SELECT {e:String}, {ns:String}, 'brief', '', '', brief_key FROM session_briefs "
            f"WHERE {mine} GROUP BY brief_key",
            parameters=params,
        )
    if count:
        ch.command(
            "INSERT INTO session_briefs (namespace, brief_key, project, branch, session_id, user_id, agent, revision, "
            "sections, author, last_session_id, last_event_cursor, last_summary, created_at, updated_at, deleted, "
            "version) SELECT namespace, brief_key, project, branch, '', user_id, agent, revision, '{}', author, '', "
            f"'', '', created_at, now64(3), true, {{v:UInt64}} FROM session_briefs FINAL WHERE {mine} AND NOT deleted",
            parameters=params,
        )
    if removed:
        ch.command(f"DELETE FROM session_brief_revisions WHERE {revisions}", parameters=params)
    return count, removed, _hex(found["total"])


_MEMORY_WHERE = "namespace = {ns:String} AND user_id = {u:String}"


def count_user_memory(ch: Client, namespace: str, user_id: str) -> dict[str, TableCount]:
    """The user's rows in every memory table (every version) and the digest of their
    keys, in one read: a branch per table, which the engine runs side by side (scalar
    subqueries would run one after another)."""
    parts = [
        f"SELECT {i} AS i, count() AS n, toString(sum(DISTINCT sipHash64({', '.join(NAMESPACE_TABLES[table])}))) "
        f"AS total FROM {table} WHERE {_MEMORY_WHERE}"
        for i, table in enumerate(MEMORY_TABLES)
    ]
    rows = named(ch.query(" UNION ALL ".join(parts), parameters={"ns": namespace, "u": user_id}))
    found = {int(r["i"]): r for r in rows}
    return {
        table: TableCount(tombstoned=int(found[i]["n"]), digest=_hex(found[i]["total"]))
        for i, table in enumerate(MEMORY_TABLES)
    }


def hide_user_memory(ch: Client, namespace: str, user_id: str, table: str) -> None:
    """The user's facts, evidence, postings or extraction decisions (one memory table),
    every version, hidden at once by a lightweight DELETE (the removal job then rewrites
    the parts without them)."""
    ch.command(f"DELETE FROM {table} WHERE {_MEMORY_WHERE}", parameters={"ns": namespace, "u": user_id})


# -- a user erasure: removal from disk ------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One idempotent removal: rows of `table` matching `where` (params: e, ns, u, p)."""

    name: str
    table: str
    where: str
    apply_mask: bool = False  # rows already hidden by a lightweight DELETE: rewrite the parts without them
    # Removed first, in a mutation of its own: the rows of `where` that are not the
    # erasure's tombstones. A mutation rewrites one part after another, so removing a
    # tombstone while an older live version still sits in a part not yet rewritten would
    # make that version readable again for a moment; the tombstones go last.
    first: str = ""


_GONE_THREADS = (
    "SELECT agent, thread_id FROM erasure_keys WHERE erasure_id = {e:String} "
    f"AND namespace = {{ns:String}} AND kind = '{THREAD_GONE}'"
)
_KEPT_THREADS = (
    "SELECT agent, thread_id FROM erasure_keys WHERE erasure_id = {e:String} "
    f"AND namespace = {{ns:String}} AND kind = '{THREAD_KEPT}'"
)
_KEPT_AT = (
    "SELECT max(toUInt64OrZero(msg_id)) FROM erasure_keys WHERE erasure_id = {e:String} "
    f"AND namespace = {{ns:String}} AND kind = '{THREAD_KEPT}'"
)


def user_steps(purge: bool) -> list[Step]:
    """What the worker removes for a user erasure, per namespace, in order."""
    steps = [
        Step(
            "conversations",
            "conversations",
            f"namespace = {{ns:String}} AND (agent, thread_id, msg_id) IN ({_TURN_KEYS})",
            first="NOT tombstoned",
        ),
        *(
            Step(
                t,
                t,
                f"namespace = {{ns:String}} AND ((thread_id, msg_id) IN ({_EMB_KEYS}) "
                f"AND (thread_id, msg_id) NOT IN ({_HANDED_KEYS}) "
                f"OR (thread_id, msg_id) IN ({_HANDED_KEYS}) AND user_id = {{u:String}})",
            )
            for t in VECTOR_TABLES
        ),
        # The transcript's postings of the user's turns (every version: the turns are gone).
        Step(
            "conversation_terms",
            "conversation_terms",
            f"namespace = {{ns:String}} AND (agent, thread_id, msg_id) IN ({_TURN_KEYS})",
        ),
        *(Step(t, t, "namespace = {ns:String} AND user_id = {u:String}") for t in SAVED_TABLES),
        # The records of the user's turns redacted or removed one by one (keys, no text).
        Step("message_redactions", "message_redactions", "namespace = {ns:String} AND user_id = {u:String}"),
        Step(
            "threads",
            "threads",
            # every version of a thread left with no live turn; the versions of a kept
            # thread from before its title was emptied
            f"namespace = {{ns:String}} AND ((agent, thread_id) IN ({_GONE_THREADS}) "
            f"OR (agent, thread_id) IN ({_KEPT_THREADS}) AND version < ({_KEPT_AT}))",
            first="NOT tombstoned",
        ),
        Step(
            "session_briefs",
            "session_briefs",
            f"namespace = {{ns:String}} AND brief_key IN ({_BRIEF_KEYS})",
            first="NOT deleted",
        ),
        # Hidden at once by a lightweight DELETE (counted then): the parts are rewritten without them.
        Step("session_brief_revisions", "session_brief_revisions", "", apply_mask=True),
        *(Step(t, t, "", apply_mask=True) for t in MEMORY_TABLES),
    ]
    if purge:
        steps.insert(
            1,
            Step(
                "conversation_embeddings",
                "conversation_embeddings",
                # A row passed to another user's copy keeps its newest version; its older
                # versions, which name the user, go.
                f"namespace = {{ns:String}} AND ((thread_id, msg_id) IN ({_EMB_KEYS}) "
                f"AND (thread_id, msg_id) NOT IN ({_HANDED_KEYS}) AND (thread_id, msg_id) NOT IN ({_EXPIRED_KEYS}) "
                f"OR (thread_id, msg_id) IN ({_HANDED_KEYS}) AND user_id = {{u:String}})",
                first="NOT tombstoned",
            ),
        )
    return steps


def namespace_steps() -> list[Step]:
    return [Step(t, t, "namespace = {ns:String}", apply_mask=t != "erasure_keys") for t in NAMESPACE_TABLES]


def step_params(erasure_id: str, namespace: str, user_id: str) -> dict[str, Any]:
    return {"e": erasure_id, **_brief_params(namespace, user_id)}


def count_rows(ch: Client, step: Step, params: dict[str, Any]) -> int:
    return int(scalar(ch, f"SELECT count() FROM {step.table} WHERE {step.where}", params))


def remove(ch: Client, step: Step, params: dict[str, Any]) -> None:
    """Remove the rows from disk: a mutation that rewrites the parts holding them, waited
    for (its condition names the same rows when it is run again)."""
    if step.apply_mask:
        ch.command(f"ALTER TABLE {step.table} APPLY DELETED MASK", settings={"mutations_sync": 2})
        return
    for where in ([f"({step.where}) AND ({step.first})"] if step.first else []) + [step.where]:
        ch.command(
            f"ALTER TABLE {step.table} DELETE WHERE {where}",
            parameters=params,
            settings={"mutations_sync": 2},
        )


# -- a namespace erasure ---------------------------------------------------------------


def namespace_counts(ch: Client, namespace: str) -> dict[str, TableCount]:
    """Per table: the namespace's rows (every version) and the digest of their keys."""
    out: dict[str, TableCount] = {}
    for table, cols in NAMESPACE_TABLES.items():
        params = {"ns": namespace}
        rows = int(scalar(ch, f"SELECT count() FROM {table} WHERE namespace = {{ns:String}}", params))
        digest = (
            _digest(ch, f"SELECT {', '.join(cols)} FROM {table} WHERE namespace = {{ns:String}}", params)
            if rows
            else format(0, "016x")
        )
        out[table] = TableCount(tombstoned=rows, digest=digest)
    return out


def hide_namespace(ch: Client, namespace: str) -> None:
    """Every row of the namespace, in every table, unreadable at once (lightweight
    DELETE); the worker then rewrites the parts without them."""
    for table in NAMESPACE_TABLES:
        if table == "erasure_keys":
            continue
        ch.command(f"DELETE FROM {table} WHERE namespace = {{ns:String}}", parameters={"ns": namespace})
