"""What the embedded engine's endpoint does for the engine between requests: drop the
vector-index cache once it holds mostly indexes of parts merges removed, and hand the
allocator's free pages back to the system.

Each step takes `query`, which runs one statement and answers its text (the endpoint
passes a pooled engine handle; tests pass a client).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

Query = Callable[[str], str]

# The engine keeps a part's HNSW index cached after a merge removed the part, until the
# cache is full; and it weighs every cached index at 16 MiB at least, whatever its size
# (measured: indexes of 10, 100, 1,000 and 5,000 vectors, 9 kB to 4.6 MB on disk, each
# added 16.78-16.82 MB to VectorSimilarityIndexCacheBytes and 0.5-6 MB to the RSS). So
# the cache's bytes say how many indexes it holds, not how much memory they take, and
# its limit (1.5 GiB by default) is about 96 indexes of any size. Under steady appends a
# merged part appears every second or so and each is cached at its first search: the
# indexes of removed parts pile up toward that limit.
#
# The check follows the indexed parts instead: every VECTOR_CACHE_CHECK_S it reads them
# (name, index size, live or removed: a removed part stays listed until the engine's
# cleanup, 30 s or more, so one that lived a second is seen too), adds the index size of
# each removed part not counted before to `removed`, and drops the cache when `removed`
# passes the live indexes' size (and VECTOR_CACHE_SLACK_BYTES): the reload that follows a
# drop (each live part's index at its next search) then costs at most once what the
# removed indexes held. A removed part that was never searched counts too, so the bound
# is on the safe side.
VECTOR_CACHE_CHECK_S = 5.0
VECTOR_CACHE_SLACK_BYTES = 64 << 20
_INDEXED_PARTS = (
    "SELECT concat(database, '.', table, '/', name), secondary_indices_uncompressed_bytes, active "
    "FROM system.parts WHERE secondary_indices_uncompressed_bytes > 0 "
    "AND (database, table) IN "
    "(SELECT database, table FROM system.data_skipping_indices WHERE type = 'vector_similarity') "
    "FORMAT TSV"
)
_DROP_VECTOR_CACHE = "SYSTEM DROP VECTOR SIMILARITY INDEX CACHE"


@dataclass
class VectorCacheTrim:
    """The removed parts already counted, and the index bytes of parts removed since the
    cache was last dropped."""

    counted: set[str] = field(default_factory=set)
    removed: int = 0

    def check(self, query: Query) -> bool:
        """Look at the parts; drop the cache if the removed indexes call for it. True when dropped."""
        live, gone = 0, set()
        for line in query(_INDEXED_PARTS).splitlines():
            name, size, active = line.split("\t")
            if active == "1":
                live += int(size)
                continue
            gone.add(name)
            if name not in self.counted:
                self.removed += int(size)
        self.counted = gone
        if self.removed <= max(live, VECTOR_CACHE_SLACK_BYTES):
            return False
        query(_DROP_VECTOR_CACHE)
        self.removed = 0
        return True


# The engine's allocator (jemalloc, built without background threads) returns freed pages
# to the system only when later allocations in the same arena pass its decay time, so
# pages a burst freed stay resident while the engine idles between requests (a 30-minute
# soak: allocated bytes flat, -1.4 MB per 10 minutes, resident +7.6). Once a minute the
# endpoint hands them back; a page used again faults in.
MEMORY_RELEASE_S = 60.0
_PURGE_FREE_PAGES = "SYSTEM JEMALLOC PURGE"


def release_free_memory(query: Query) -> None:
    """Return the allocator's free pages to the system."""
    query(_PURGE_FREE_PAGES)
