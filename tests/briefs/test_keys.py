"""Key validation, the automatic key, and each token kind's view of keys (pure logic)."""

from __future__ import annotations

import pytest

from loom.auth.principal import Principal, Role
from loom.errors import Forbidden, InvalidRequest
from loom.ops.briefs.keys import KeyScope, check_key, derive_key


def p(scope: str = "all", user: str = "", session: str = "") -> Principal:
    return Principal("t", ("ns",), Role.writer, scope, user, session)


def test_derived_keys() -> None:
    assert derive_key("", "loom", "feat/briefs", "s1") == "auto/loom/feat/briefs"
    assert derive_key("", "my project", "", "") == "auto/my-project/-"
    assert derive_key("", "", "", "sess-1") == "session/sess-1"
    assert derive_key("given", "p", "b", "s") == "given"
    with pytest.raises(InvalidRequest) as exc:
        derive_key("", "", "", "")
    assert exc.value.field == "brief_key"
    assert len(derive_key("", "p" * 300, "b", "")) == 160


@pytest.mark.parametrize("key", ["", "-lead", "a b", "a~b", "x" * 161, "é"])
def test_bad_keys_are_400(key: str) -> None:
    with pytest.raises(InvalidRequest) as exc:
        check_key(key)
    assert exc.value.field == "brief_key" and exc.value.status == 422


def test_namespace_wide_scope() -> None:
    s = KeyScope.of(p())
    assert s.for_write("auto/x/y") == "auto/x/y"
    assert s.for_read("~u1~notes") == "~u1~notes"
    assert s.for_read("~u1~s1~notes") == "~u1~s1~notes"
    assert s.show("~u1~notes") == "~u1~notes" and s.visible("~u1~s1~notes")
    with pytest.raises(InvalidRequest):
        s.for_write("~u1~notes")  # a namespace-wide token gets/deletes by prefix, never saves one
    with pytest.raises(InvalidRequest):
        s.for_read("~u1~bad key")


def test_user_scope() -> None:
    s = KeyScope.of(p("own_user", "u1"))
    assert s.for_write("notes") == "~u1~notes" and s.for_read("notes") == "~u1~notes"
    assert s.show("~u1~notes") == "notes"
    assert s.visible("~u1~notes") and not s.visible("~u1~s1~notes") and not s.visible("notes")
    assert not s.visible("~u2~notes")
    with pytest.raises(Forbidden) as exc:
        s.for_read("~u1~notes")
    assert exc.value.status == 403 and exc.value.field == "brief_key"
    with pytest.raises(Forbidden):
        s.for_write("~u2~notes")


def test_session_scope() -> None:
    s = KeyScope.of(p("own_session", "u1", "s1"))
    assert s.for_write("notes") == "~u1~s1~notes"
    assert s.show("~u1~s1~notes") == "notes"
    assert s.visible("~u1~s1~notes") and not s.visible("~u1~notes") and not s.visible("~u1~s2~notes")
    with pytest.raises(Forbidden):
        s.for_write("~x")
