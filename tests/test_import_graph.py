"""No import cycle among Loom's modules: every import counts, also one inside a function
or under TYPE_CHECKING, so that no cycle hides behind a late import. A module that needs
what another needs of it takes a Protocol, or the shared piece moves to a third module."""

from __future__ import annotations

import graphlib

import grimp


def _cycle(*packages: str) -> list[str]:
    """One import cycle among the packages' modules ([] when there is none)."""
    graph = grimp.build_graph(*packages, cache_dir=None)
    modules = graph.modules
    imports = {m: [i for i in graph.find_modules_directly_imported_by(m) if i in modules] for m in modules}
    try:
        graphlib.TopologicalSorter(imports).prepare()
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return []


def test_no_module_imports_itself_through_others() -> None:
    assert _cycle("loom", "workers", "clickhouse_schema") == []


def test_the_edge_models_import_nothing_of_the_server() -> None:
    """loom.models is what the API, the MCP tools and the SDK share: a client installs it
    without the server, so it reaches for no op, store or service (not even late)."""
    graph = grimp.build_graph("loom", cache_dir=None)
    reached = {
        imported
        for module in graph.find_descendants("loom.models")
        for imported in graph.find_modules_directly_imported_by(module)
        if imported.startswith("loom.") and not imported.startswith("loom.models")
    }
    assert reached <= {"loom.errors", "loom.limits"}, reached


def test_a_cycle_cut_by_a_late_import_is_still_a_cycle(tmp_path, monkeypatch) -> None:
    pkg = tmp_path / "cyclic"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from cyclic import b\n")
    (pkg / "b.py").write_text("def late():\n    from cyclic import a\n    return a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert set(_cycle("cyclic")) == {"cyclic.a", "cyclic.b"}
