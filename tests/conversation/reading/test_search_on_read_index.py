"""conversation.search's rules, played again with the read index answering the vector
leg (loom.read_index): every test of test_search.py that writes or reads vectors runs
here with searches going through the index process, so each visibility rule (tombstoned,
re-embedded, failed, high, saved-only, filtered) holds on that path too."""

from __future__ import annotations

import pytest

from tests.conversation.reading import test_search as rules
from tests.conversation.reading import test_search_modes as modes


@pytest.fixture(autouse=True)
def _answered_by_the_index(read_index, request):
    """Each test's vector searches were answered by the index, none left to the engine
    (a lexical search has no vector leg)."""
    stats = read_index.index.stats
    served, missed = stats.served, stats.missed
    yield
    callspec = getattr(request.node, "callspec", None)
    if callspec is None or callspec.params.get("mode") != "lexical":
        assert stats.served > served
    assert stats.missed == missed


test_the_query_finds_its_turn_first = rules.test_the_query_finds_its_turn_first
test_hits_below_the_floor_are_dropped = rules.test_hits_below_the_floor_are_dropped
test_limit = rules.test_limit
test_filters_thread_run_role_and_agent = rules.test_filters_thread_run_role_and_agent
test_fans_out_over_the_tokens_namespaces = rules.test_fans_out_over_the_tokens_namespaces
test_excerpt_is_the_start_of_the_turn_and_follows_the_setting = (
    rules.test_excerpt_is_the_start_of_the_turn_and_follows_the_setting
)
test_a_legacy_240_character_row_shows_the_turn = rules.test_a_legacy_240_character_row_shows_the_turn
test_high_turns_are_never_returned = rules.test_high_turns_are_never_returned
test_tombstoned_turns_and_embeddings_never_appear = rules.test_tombstoned_turns_and_embeddings_never_appear
test_a_re_embedded_row_is_found_by_its_new_vector_only = (
    rules.test_a_re_embedded_row_is_found_by_its_new_vector_only
)
test_failed_embeds_are_found_only_by_substring = rules.test_failed_embeds_are_found_only_by_substring
test_dead_candidates_are_refetched = rules.test_dead_candidates_are_refetched
test_dead_best_candidates_are_replaced_by_the_next_ones_in_order = (
    rules.test_dead_best_candidates_are_replaced_by_the_next_ones_in_order
)
test_a_named_namespace_is_searched_alone_and_none_fans_out = (
    rules.test_a_named_namespace_is_searched_alone_and_none_fans_out
)

# hybrid mode: its vector leg goes through the index too
test_hybrid_fuses_the_legs_and_the_floor_binds_the_vector_leg_only = (
    modes.test_hybrid_fuses_the_legs_and_the_floor_binds_the_vector_leg_only
)
test_lexical_weight_is_the_lexical_legs_share_from_0_to_1 = (
    modes.test_lexical_weight_is_the_lexical_legs_share_from_0_to_1
)
test_a_deleted_thread_is_never_found = modes.test_a_deleted_thread_is_never_found
test_a_redacted_turn_is_found_by_its_new_words_only = (
    modes.test_a_redacted_turn_is_found_by_its_new_words_only
)
test_compacted_turns_are_never_found_and_the_summary_is = (
    modes.test_compacted_turns_are_never_found_and_the_summary_is
)
test_a_saved_only_row_is_never_found_until_it_is_recorded = (
    modes.test_a_saved_only_row_is_never_found_until_it_is_recorded
)
