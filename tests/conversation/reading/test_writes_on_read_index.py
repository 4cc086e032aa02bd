"""The writers that remove or rewrite turns, played again with conversation.search going
through the read index (loom.read_index): deletion (a thread, one turn), redaction,
compaction, a user erasure, saves and unsaves of saved-only rows, re-embeds, and the
search marks' own rules. Each test searches after its write and asserts what must and
must not be found: here those searches are answered by the index. One of them races a
deletion with the search itself: the turn is tombstoned after the index ranked it and
before the marks are read, the window where the engine holds the write and the index
has not heard of it yet."""

from __future__ import annotations

import pytest

from tests.conversation.lifecycle import test_compact, test_delete, test_redact
from tests.conversation.reading import test_search_marks
from tests.conversation.reading.test_search_marks import verifications  # noqa: F401 - the marks tests' spy
from tests.conversation.saved import test_saved_only
from tests.erasure import test_erasure


@pytest.fixture(autouse=True)
def _answered_by_the_index(read_index):
    stats = read_index.index.stats
    served = stats.served
    yield
    assert stats.served > served


test_delete_tombstones_turns_thread_and_embeddings_and_every_read_drops_them = (
    test_delete.test_delete_tombstones_turns_thread_and_embeddings_and_every_read_drops_them
)
test_a_shared_embedding_row_passes_to_the_other_agents_live_copy = (
    test_delete.test_a_shared_embedding_row_passes_to_the_other_agents_live_copy
)
test_delete_message_passes_a_shared_row_to_the_other_agents_copy = (
    test_redact.test_delete_message_passes_a_shared_row_to_the_other_agents_copy
)
test_redact_high_replaces_the_secret_reembeds_and_export_shows_the_redaction = (
    test_redact.test_redact_high_replaces_the_secret_reembeds_and_export_shows_the_redaction
)
test_a_user_erasure_is_unreadable_at_once_then_removed_with_a_receipt = (
    test_erasure.test_a_user_erasure_is_unreadable_at_once_then_removed_with_a_receipt
)
test_the_window_before_keep_recent_becomes_one_embedded_summary = (
    test_compact.test_the_window_before_keep_recent_becomes_one_embedded_summary
)
test_a_saved_only_row_is_never_searched_listed_or_read = (
    test_saved_only.test_a_saved_only_row_is_never_searched_listed_or_read
)
test_a_saved_only_copy_leaves_another_agents_recorded_copy_searchable = (
    test_saved_only.test_a_saved_only_copy_leaves_another_agents_recorded_copy_searchable
)
test_a_removed_unsaved_turn_is_never_found = test_search_marks.test_a_removed_unsaved_turn_is_never_found
test_a_save_raises_the_mark_so_search_shows_the_new_owner = (
    test_search_marks.test_a_save_raises_the_mark_so_search_shows_the_new_owner
)
test_a_change_that_ends_before_the_marks_are_read_is_seen = (
    test_search_marks.test_a_change_that_ends_before_the_marks_are_read_is_seen
)
