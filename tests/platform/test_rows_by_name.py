"""Rows by name, never by position: a static check of the code.

- In loom/store (loom/store/rows.py aside, which decodes by the declared names): no
  read of a query result's positional forms (``.result_rows``, ``.first_row``, ...) and
  no integer subscript of a row-like name (``r[0]``, ``row[3]``, ``rows[0][0]``): reads
  go through ``Table``/``Reader`` decoders, :func:`loom.store.rows.named` with ``AS``
  aliases, or :func:`loom.store.rows.scalar`.
- In loom/, workers/ and bench/: every construction of a declared row dataclass (the
  rows of loom.store.rows.TABLES) passes its fields by keyword.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import loom.store
from loom.store.rows import TABLES

ROOT = Path(__file__).resolve().parents[2]
STORE = ROOT / "loom" / "store"
# Query-result attributes that hand out rows as tuples.
POSITIONAL_RESULTS = {"result_rows", "result_set", "result_columns", "first_row", "row_tuples"}
# Names a row of a query result goes by in the store modules.
ROW_NAMES = {"r", "row", "rows", "found", "result", "results", "values", "record", "got"}


def _int_index(node: ast.Subscript) -> bool:
    idx = node.slice
    if isinstance(idx, ast.UnaryOp) and isinstance(idx.op, ast.USub):
        idx = idx.operand
    return isinstance(idx, ast.Constant) and isinstance(idx.value, int) and not isinstance(idx.value, bool)


def _base_name(node: ast.expr) -> str | None:
    while isinstance(node, ast.Subscript):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def positional_reads(source: str, filename: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Attribute) and node.attr in POSITIONAL_RESULTS:
            found.append(f"{filename}:{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Subscript) and _int_index(node) and _base_name(node.value) in ROW_NAMES:
            found.append(f"{filename}:{node.lineno}: {ast.unparse(node)}")
    return found


def _row_classes() -> set[str]:
    for mod in pkgutil.iter_modules(loom.store.__path__):
        importlib.import_module(f"loom.store.{mod.name}")
    return {spec.row.__name__ for spec in TABLES.values()}


def positional_constructions(source: str, filename: str, classes: set[str]) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        name = (
            func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
        )
        if name in classes and not all(isinstance(a, ast.Starred) for a in node.args):
            found.append(f"{filename}:{node.lineno}: {name}(<{len(node.args)} positional>)")
    return found


def test_store_reads_rows_by_name():
    problems = []
    for path in sorted(STORE.glob("*.py")):
        if path.name == "rows.py":
            continue
        problems += positional_reads(path.read_text(), str(path.relative_to(ROOT)))
    assert problems == []


def test_row_dataclasses_are_built_by_keyword():
    classes = _row_classes()
    assert {"Turn", "EmbeddingRow", "ThreadRow"} <= classes
    problems = []
    for top in ("loom", "workers", "bench"):
        for path in sorted((ROOT / top).rglob("*.py")):
            problems += positional_constructions(path.read_text(), str(path.relative_to(ROOT)), classes)
    assert problems == []


def test_the_checks_catch_positional_code():
    bad = (
        "def f(ch):\n"
        "    rows = ch.query('SELECT 1').result_rows\n"
        "    n = rows[0][0]\n"
        "    return [Turn(r[0], r[1]) for r in rows], emb_store.EmbeddingRow('ns', 't', msg_id='m')\n"
    )
    assert sorted(positional_reads(bad, "bad.py")) == [
        "bad.py:2: .result_rows",
        "bad.py:3: rows[0]",
        "bad.py:3: rows[0][0]",
        "bad.py:4: r[0]",
        "bad.py:4: r[1]",
    ]
    assert sorted(positional_constructions(bad, "bad.py", {"Turn", "EmbeddingRow"})) == [
        "bad.py:4: EmbeddingRow(<2 positional>)",
        "bad.py:4: Turn(<2 positional>)",
    ]
    good = (
        "def f(ch, key):\n"
        "    got = named(ch.query('SELECT 1 AS one'))\n"
        "    return key[0], [Turn(namespace=r['one']) for r in got], TokenRow(**{'a': 1})\n"
    )
    assert positional_reads(good, "good.py") == []
    assert positional_constructions(good, "good.py", {"Turn", "TokenRow"}) == []
