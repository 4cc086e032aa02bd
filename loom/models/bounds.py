"""The one rule that bounds what a request may carry beyond its declared fields.

A free JSON value (a turn's or a thread's ``metadata``) nests at most
:data:`MAX_JSON_DEPTH` levels, holds at most :data:`MAX_JSON_ITEMS` keys and items in
all, and serialises to at most :data:`MAX_JSON_BYTES` bytes. Every string of a request
(values and keys, at any depth) is valid Unicode: a lone surrogate such as
``"\\ud800"`` (legal in JSON's ``\\u`` escapes, not encodable as UTF-8) is refused, since
nothing downstream could store it.

Both checks walk iteratively (no recursion, whatever the depth) and name the field
and the rule in the 422.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

from pydantic import AfterValidator

MAX_JSON_DEPTH = 16
MAX_JSON_ITEMS = 1_000
MAX_JSON_BYTES = 65_536

DEPTH_RULE = f"JSON values nest at most {MAX_JSON_DEPTH} levels"
ITEMS_RULE = f"a JSON value holds at most {MAX_JSON_ITEMS:,} keys and items"
BYTES_RULE = f"a JSON value is at most {MAX_JSON_BYTES:,} bytes as JSON"
SURROGATE_RULE = "strings must be valid Unicode (no lone surrogate such as \\ud800)"

_SURROGATE = re.compile("[\ud800-\udfff]")


def bounded_json(value: dict[str, Any]) -> dict[str, Any]:
    """Depth, item count and size of a free JSON value; raises ValueError naming the rule."""
    if not value:
        return value
    items = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth > MAX_JSON_DEPTH:
                raise ValueError(DEPTH_RULE)
            items += len(node)
            if items > MAX_JSON_ITEMS:
                raise ValueError(ITEMS_RULE)
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    if len(json.dumps(value, separators=(",", ":"))) > MAX_JSON_BYTES:  # ASCII: characters are bytes
        raise ValueError(BYTES_RULE)
    return value


JsonObject = Annotated[dict[str, Any], AfterValidator(bounded_json)]


def _has_lone_surrogate(data: Any) -> bool:
    # The fast pass every request body takes (no paths built); isascii() is O(1) in
    # CPython, so most strings skip the scan.
    stack = [data]
    while stack:
        node = stack.pop()
        kind = type(node)
        if kind is str:
            if not node.isascii() and _SURROGATE.search(node):
                return True
        elif kind is dict:
            for key in node:
                if isinstance(key, str) and not key.isascii() and _SURROGATE.search(key):
                    return True
            stack.extend(node.values())
        elif kind is list:
            stack.extend(node)
    return False


def lone_surrogate_at(data: Any) -> str | None:
    """The dotted path of the first string (value or key) holding a lone surrogate, or None."""
    if not _has_lone_surrogate(data):
        return None
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, str):
            # isascii() is O(1) in CPython: most strings skip the scan.
            if not node.isascii() and _SURROGATE.search(node):
                return _printable(path) or "body"
        elif isinstance(node, dict):
            for key, child in node.items():
                where = f"{path}.{key}" if path else str(key)
                if isinstance(key, str) and not key.isascii() and _SURROGATE.search(key):
                    return _printable(where)
                stack.append((child, where))
        elif isinstance(node, list):
            stack.extend((child, f"{path}.{i}" if path else str(i)) for i, child in enumerate(node))
    return None


def _printable(path: str) -> str:
    # A key on the path may hold the surrogate itself: shown escaped (\\ud800), so
    # the error can be sent as UTF-8.
    return path.encode("utf-8", "backslashreplace").decode("utf-8")
