"""Every Redis key Loom writes: its string, type, lifetime and writer, in one place.

A key's string is part of the contract between processes of different builds: during a
rolling deploy an older API and a newer worker share one Redis, so a key renamed here
would lose its state (claims, notes, leases, marks) and let two processes disagree.
tests/test_redis_keys.py pins every string; change one only with a plan for the
processes still reading the old one.

Every key a namespace owns starts with a prefix that ends in the namespace and a
colon (or is exactly the prefix plus the namespace), so an erasure can find them
(loom.ops.erasure.requesting.purge_redis). arq's own keys (``arq:job:…``,
``arq:result:…``) are arq's: not listed here.

| family              | type   | TTL                         | written by                                   |
|---------------------|--------|-----------------------------|----------------------------------------------|
| QUEUE               | zset   | none (arq's)                | the API enqueues, arq's worker pops          |
| QUEUE_WAKE          | list   | QUEUE_WAKE_TTL_S            | the enqueuer; an idle worker pops            |
| turn_claim          | string | claims' TTL (append, save)  | append flush (Lua), conversation.save        |
| append_flush        | string | a flush's live TTL (renewed)| append flush (Lua; renewed while it runs)    |
| landed_bucket       | hash   | none                        | append flush (Lua), the notes' rebuild       |
| landed_ready        | string | none                        | the notes' rebuild (Redis run_id)            |
| landed_rebuilding   | string | the rebuild lease's TTL     | the notes' rebuild (a lease)                 |
| fences              | hash   | fences' TTL (an hour)       | conversation.delete                          |
| recording           | string | recording cache's TTL       | append flush, namespace switches             |
| search_marks        | hash   | none                        | writers that change live vectors, search     |
| thread_lease        | string | the lease's TTL (renewed)   | every writer of a thread's rows              |
| brief_lease         | string | the lease's TTL (renewed)   | session.brief_save / brief_delete            |
| EMBED_RECOVERY_LEASE| string | the lease's TTL (renewed)   | the embedding recovery pass (worker cron)    |
| TITLER_LEASE        | string | the lease's TTL (renewed)   | the conversation_titler pass (worker cron)   |
| TITLER_LAST_PASS    | string | none                        | the titler's tick (worker cron; Lua)         |
| SETTINGS_VERSION    | string | none                        | settings.set (INCR); every process reads it  |
| settings_applied    | string | APPLIED_TTL_S (live_settings)| each process's settings follower            |
| memory_lease        | string | the lease's TTL (renewed)   | memory.set_from_messages' decisions (per user) |
| memory_erasing      | string | a day (an hour while pending)| a user erasure's memory step (per user)      |
| webhook_lease       | string | the lease's TTL (renewed)   | webhook.register / rotate_secret (per namespace) |
| memory_job          | string | a day (memory.job_status)   | memory.set_from_messages with defer (API), the memory_extract job (worker) |
| memory_version      | string | a day                       | every write of a user's facts, and the first search to find none (per user) |
| memory_version_of   | string | a day                       | the first search to find none (per namespace); a namespace erasure deletes it |
| compact_job         | string | an hour                     | conversation.compact (API), read by compact_status |
| compact_done        | list   | a minute                    | the compaction job (worker), popped by the waiting API |
| embed_gate          | string | the gate's TTL              | append flush (API), read by the worker       |
| embed_gate_wake     | list   | the gate's TTL              | append flush (API), popped by the worker     |
| reply               | list   | the reply TTL               | the worker pushes, one API process pops      |
| REPLICAS            | hash   | none (entries expire by their heartbeat) | every API and worker process (loom.replicas) |
| READ_INDEX_EVENTS   | stream | none (trimmed to its newest STREAM_MAXLEN entries) | every embedding-row insert and search-mark raise (loom.read_index.feed) |
| IMPORT_WINDOWS      | hash   | none (a field per import, removed once its turns are embedded) | import.write (API), the import's embedding (worker) |
| import_embed_lease  | string | the lease's TTL (renewed)   | an import's background embedding (worker)    |

The TTLs themselves stay beside the code that sets them (named in the table), since
each is a rule of that code, not of the key.
"""

from __future__ import annotations

from collections.abc import Callable

# -- the job queue (loom.queue) -------------------------------------------------------

QUEUE = "loom:queue"
"""arq's queue (a sorted set of job ids, arq's own layout). No TTL."""
QUEUE_WAKE = f"{QUEUE}:wake"
"""List: one token per enqueued job; an idle worker blocks on it (loom.queue.wake_workers)."""

# -- the append path (loom.ops.conversation.writing.appending, loom.store.landed) -------------

TURN_CLAIM = "loom:claim:turn:"
"""Prefix. String per turn: the flush id (or ``save:…``) of the one writer that claims it."""
APPEND_FLUSH = "loom:flush:append:"
"""Prefix. String per append flush id while the flush runs (its live mark): a claim
whose flush has no live mark was left by a flush that died, and may be taken over."""
LANDED = "loom:landed:"
"""Prefix of a namespace's landed-turn notes: hash buckets, its ready mark, its rebuild lease."""
FENCES = "loom:deleted:"
"""Prefix. Hash per namespace: (agent, thread) -> the version a conversation.delete began at."""
RECORDING = "loom:recording:"
"""Prefix. String per namespace: "1" or "0", its recording switch (a short cache)."""
NAMESPACE_CONFIG = "loom:nsconfig:"
"""Prefix. String per namespace: its loom.namespaces row as JSON (a short cache)."""
SEARCH_MARKS = "loom:search:marks:2:"
"""Prefix. Hash per namespace of the verification marks; "2" is the cache's generation."""

# -- leases (loom.leases) ----------------------------------------------------------------

THREAD_LEASE = "loom:lease:thread:"
BRIEF_LEASE = "loom:lease:brief:"
EMBED_RECOVERY_LEASE = "loom:lease:embed-recovery"
"""String: the token of the one worker running the embedding recovery pass."""
TITLER_LEASE = "loom:lease:conversation_titler"
"""String: the token of the one worker running a conversation_titler pass."""
TITLER_LAST_PASS = "loom:titler:last_pass"
"""String: the Unix time (seconds) the last conversation_titler pass started; the tick
sets it and starts a pass only once the live interval has passed (loom.ops.conversation.lifecycle.titler_tick)."""
MEMORY_LEASE = "loom:lease:memory:"
"""Prefix. String per (namespace, user): the extraction deciding over that user's facts."""
MEMORY_ERASING = "loom:erasing:memory:"
"""Prefix. String per (namespace, user): "pending" while an erasure hides the user's
memory, then the version stamped when it had (loom.ops.memory.erasing)."""
WEBHOOK_LEASE = "loom:lease:webhooks:"
"""Prefix. String per namespace: the registration or rotation writing its webhook secret."""
MEMORY_JOB = "loom:memory:job:"
"""Prefix. String (JSON) per (namespace, deferred extraction job id): the job's state and,
once done, its counts (loom.ops.memory.job_status). Job ids hold no ':'."""
MEMORY_VERSION = "loom:memory:version:"
"""Prefix. String per (namespace, user): a random token every write of the user's facts
replaces once its rows are durable; a search's cached read of the user's facts is
current only while the token it was read under still stands (loom.ops.memory.scan_cache)."""
MEMORY_NS_VERSION = "loom:memory:nsversion:"
"""Prefix. String per namespace: the same, for the whole namespace (an erasure of the
namespace deletes it, which retires every cached read of its users)."""

# -- live settings (loom.ops.platform.settings) ------------------------------------------------

SETTINGS_VERSION = "loom:settings:version"
"""String (an integer): bumped by every settings.set; each process re-reads the stored
overrides when it changes."""
SETTINGS_APPLIED = "loom:settings:applied:"
"""Prefix. String (JSON) per process ("api:host:pid"): the version and the overrides its
follower applied last (settings.get lists them)."""

# -- compaction (loom.ops.conversation.lifecycle.compacting) ------------------------------------

COMPACT_JOB = "loom:compact:job:"
"""Prefix. String per compaction job id: the namespace that queued it (only it may poll)."""
COMPACT_DONE = "loom:compact:done:"
"""Prefix. List per compaction job id: its answer (JSON), pushed by the worker for the
API that awaits it (a blocking pop instead of polling arq's result)."""

# -- the embedding job's channels (loom.ops.embedding.client, loom.replies)

EMBED_GATE = "loom:gate:"
"""Prefix. String per gated job ("ok" or "fail"), plus a wake-up list beside it."""
REPLY = "loom:reply:"
"""Prefix. List per API process: the workers' JSON replies to its jobs."""

# -- the live replicas of a deploy (loom.replicas) -------------------------------------

IMPORT_WINDOWS = "loom:import:windows"
"""Hash: import job id -> JSON of its namespace, token and window of insert times. The
turns an import stored without an embedding (its token's, in that window) are its own
background embedding's to embed: the recovery pass leaves them alone
(loom.ops.portability.windows)."""
IMPORT_EMBED_LEASE = "loom:lease:import-embed:"
"""Prefix. String per import job id: the one worker embedding that import's turns."""
REPLICAS = "loom:replicas"
"""Hash: replica id -> JSON of its build, schema, capabilities and last heartbeat. An
entry whose heartbeat is older than the liveness window is a replica that is gone."""

# -- the read index (loom.read_index) -------------------------------------------------

READ_INDEX_EVENTS = "loom:readindex:events"
"""Stream: the write events the read index applies (embedding rows written, search marks
raised), in order; its entry ids are the positions the index records as applied."""


# -- the keys' builders ------------------------------------------------------------------
# Most families join their prefix and parts in one of three ways: those are declared
# below by their prefix alone, so no family can join its parts in a way of its own. The
# few whose layouts differ are spelled out after them.


def _of(prefix: str) -> Callable[[str], str]:
    """A family with a key per one part (a namespace, or a job, gate or process id)."""

    def key(part: str) -> str:
        return prefix + part

    return key


def _under(prefix: str) -> Callable[[str], str]:
    """The prefix every key of a namespace in the family starts with (an erasure scans it)."""

    def key(namespace: str) -> str:
        return f"{prefix}{namespace}:"

    return key


def _of_namespace(prefix: str) -> Callable[[str, str], str]:
    """A family with a key per namespace and one more part (a user, thread, turn or job)."""

    namespaced = _under(prefix)

    def key(namespace: str, part: str) -> str:
        return namespaced(namespace) + part

    return key


# (namespace, user_id)
memory_lease = _of_namespace(MEMORY_LEASE)
memory_erasing = _of_namespace(MEMORY_ERASING)
memory_version = _of_namespace(MEMORY_VERSION)
# (namespace, turn_hash), (namespace, thread_id), (namespace, stored_key), (namespace, job_id)
turn_claim = _of_namespace(TURN_CLAIM)
thread_lease = _of_namespace(THREAD_LEASE)
brief_lease = _of_namespace(BRIEF_LEASE)
memory_job = _of_namespace(MEMORY_JOB)

# (namespace)
turn_claims_of = _under(TURN_CLAIM)
memory_jobs_of = _under(MEMORY_JOB)
landed_of = _under(LANDED)
webhook_lease = _of(WEBHOOK_LEASE)
memory_version_of = _of(MEMORY_NS_VERSION)
fences = _of(FENCES)
recording = _of(RECORDING)
namespace_config = _of(NAMESPACE_CONFIG)
search_marks = _of(SEARCH_MARKS)
# (job_id), (flush_id), (gate), (process)
compact_job = _of(COMPACT_JOB)
compact_done = _of(COMPACT_DONE)
import_embed_lease = _of(IMPORT_EMBED_LEASE)
append_flush = _of(APPEND_FLUSH)
embed_gate = _of(EMBED_GATE)
reply = _of(REPLY)
settings_applied = _of(SETTINGS_APPLIED)


def landed_bucket(namespace: str, bucket: int) -> str:
    return f"{landed_of(namespace)}{bucket:03x}"


def landed_ready(namespace: str) -> str:
    return f"{landed_of(namespace)}ready"


def landed_rebuilding(namespace: str) -> str:
    return f"{landed_ready(namespace)}:rebuilding"


def embed_gate_wake(gate: str) -> str:
    return f"{embed_gate(gate)}:wake"
