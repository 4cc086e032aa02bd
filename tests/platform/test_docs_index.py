"""docs/ holds together: every page is listed in docs/index.md, the glossary defines
the words the other pages lean on, and no page points at the tracker's issue numbers
(a reader of the repository has only the repository)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.glob("*.md") if p.name != "index.md")


def _glossary_terms() -> set[str]:
    text = (DOCS / "glossary.md").read_text()
    return {m.group(1).lower() for m in re.finditer(r"^\| \*\*([^*]+)\*\*", text, re.M)}


def test_every_docs_page_is_on_the_index() -> None:
    index = (DOCS / "index.md").read_text()
    linked = set(re.findall(r"\]\(([^)#]+\.md)\)", index))
    assert linked == {p.name for p in PAGES}, "docs/index.md lists exactly the pages of docs/"


def test_the_glossary_defines_the_words_the_docs_lean_on() -> None:
    terms = _glossary_terms()
    for term in ("plane", "bounded token", "flush", "replica", "heir", "turn", "lease", "mark", "read index"):
        assert term in terms, f"docs/glossary.md does not define {term!r}"


def test_no_doc_points_at_an_issue_number() -> None:
    issue = re.compile(r"\bissues? ?#?\d+|#\d{2,}\b", re.I)
    for path in [*DOCS.glob("*.md"), ROOT / "README.md"]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            assert not issue.search(line), f"{path.name}:{n} names an issue: {line.strip()}"
