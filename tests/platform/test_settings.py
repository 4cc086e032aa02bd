from __future__ import annotations

import pytest

from loom.settings import Settings, SettingsError, load_settings


def test_defaults_follow_the_seed(monkeypatch):
    for key in list(__import__("os").environ):
        if key.startswith("LOOM_"):
            monkeypatch.delenv(key)
    s = load_settings()
    assert s.conversation_search_min_similarity == 0.30
    assert s.conversation_search_excerpt_chars == 240
    assert s.conversation_titler_enabled is True
    assert s.conversation_titler_window_hours == 168
    assert s.conversation_titler_min_turns == 4
    assert s.conversation_titler_max_threads_per_pass == 10
    assert s.retention_conversations_days == 0
    assert s.session_brief_llm is True
    assert s.clickhouse_embedded and s.redis_embedded
    assert s.port == 7777


@pytest.mark.parametrize(
    "var,value",
    [
        ("LOOM_CONVERSATION_SEARCH_MIN_SIMILARITY", "high"),
        ("LOOM_CONVERSATION_SEARCH_EXCERPT_CHARS", "-3"),
        ("LOOM_RETENTION_CONVERSATIONS_DAYS", "-1"),
        ("LOOM_CONVERSATION_TITLER_ENABLED", "perhaps"),
        ("LOOM_PORT", "99999"),
    ],
)
def test_bad_value_names_the_variable(monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert var in str(err.value)


def test_env_overrides(monkeypatch):
    monkeypatch.setenv("LOOM_CONVERSATION_SEARCH_EXCERPT_CHARS", "100")
    monkeypatch.setenv("LOOM_RETENTION_CONVERSATIONS_DAYS", "30")
    s = Settings()
    assert s.conversation_search_excerpt_chars == 100 and s.retention_conversations_days == 30
