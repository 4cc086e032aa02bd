"""Request limits that both the API's edge models and the ops enforce, in a module that
imports nothing (the edge models, and the SDK that shares them, stay light to import)."""

MAX_BATCH_TURNS = 500  # turns in one conversation.append batch
MAX_EVENTS = 4_000  # events in one session.brief_save
MAX_EVENT_CHARS = 32_000  # characters of one brief event
MAX_PATH_CHARS = 1_024  # characters of a path a brief event names
MAX_QUERY_CHARS = 4_000  # characters of a conversation.search query
MAX_SEARCH_LIMIT = 100  # hits one conversation.search answers
# lexical_weight in hybrid mode (conversation.search, conversation.search_saved_messages),
# one scale for both: 0 to 1, the lexical (BM25) leg's share of the reciprocal-rank
# fusion, the vector leg taking the rest (0: the vector leg alone, 1: the lexical leg
# alone, 0.5: an equal vote).
MIN_LEXICAL_WEIGHT = 0.0
MAX_LEXICAL_WEIGHT = 1.0
# conversation.search's: the lexical leg's rank gets nine votes to the vector leg's one
# (on LoCoMo the weak vector leg at an equal vote drags hybrid under lexical alone;
# docs/search.md, "The default").
DEFAULT_LEXICAL_WEIGHT = 0.9
SAVED_LEXICAL_WEIGHT = 0.5  # conversation.search_saved_messages': an equal vote
