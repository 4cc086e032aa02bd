"""Request limits that both the API's edge models and the ops enforce, in a module that
imports nothing (the edge models, and the SDK that shares them, stay light to import)."""

MAX_BATCH_TURNS = 500  # turns in one conversation.append batch
MAX_EVENTS = 4_000  # events in one session.brief_save
MAX_EVENT_CHARS = 32_000  # characters of one brief event
MAX_PATH_CHARS = 1_024  # characters of a path a brief event names
MAX_QUERY_CHARS = 4_000  # characters of a conversation.search query
MAX_SEARCH_LIMIT = 100  # hits one conversation.search answers
# lexical_weight in hybrid mode (conversation.search, conversation.search_saved_messages):
# how many votes the lexical leg's rank has against the vector leg's one. Up to 100: at
# 100 the vector leg only breaks the lexical leg's ties (issue 24's LoCoMo figures: the
# weak vector leg at an equal vote drags hybrid under lexical alone).
MIN_LEXICAL_WEIGHT = 0.0
MAX_LEXICAL_WEIGHT = 100.0
DEFAULT_LEXICAL_WEIGHT = 10.0  # conversation.search's (docs/search.md, "The default")
SAVED_LEXICAL_WEIGHT = 1.0  # conversation.search_saved_messages' (not measured anew)
