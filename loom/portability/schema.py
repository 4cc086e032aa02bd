"""docs/export-format.schema.json: the JSON Schema of one line of Loom's export format,
rendered from the lines' models (loom.models.portability). A test keeps the file
equal to this output: `python -m loom.portability.schema > docs/export-format.schema.json`."""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import Field, TypeAdapter

from loom.models import portability as m

Line = Annotated[
    m.HeaderLine
    | m.NamespaceLine
    | m.ThreadLine
    | m.TurnLine
    | m.RedactionLine
    | m.BriefLine
    | m.BriefRevisionLine
    | m.MemoryLine
    | m.EvidenceLine
    | m.DecisionLine
    | m.EndLine,
    Field(discriminator="kind"),
]
LINE = TypeAdapter(Line)


def schema() -> dict[str, Any]:
    body = LINE.json_schema()
    # `pos` is an import record's note of where it is in its source: never in an export.
    for definition in body.get("$defs", {}).values():
        definition.get("properties", {}).pop("pos", None)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"One line of a Loom export ({m.FORMAT_NAME}, format version {m.FORMAT_VERSION})",
        "description": "A Loom export is NDJSON: a header line, body lines (one row each), an end line. "
        "See docs/export-format.md.",
        **body,
    }


def render() -> str:
    return json.dumps(schema(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    print(render(), end="")
