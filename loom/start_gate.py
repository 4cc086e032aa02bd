"""How `loom serve`'s API and workers import their modules while the backends start.

A child's imports take seconds (the API's FastAPI routes and pydantic models about 3 s,
a worker's about 1 s; more on a fresh clone, which compiles every module first), as long
as starting the embedded backends and migrating a new home. Done one after the other,
a first run answered /healthz after 8-10 s. So the supervisor starts its API and workers
first, with FLAG: each imports what it runs, then waits for one line on its standard
input, the variables the backends' start decided (their URLs) as a JSON object, which
the supervisor writes once the schema is migrated. A child restarted later gets its
line at once, so it starts as it did before.

Nothing reads settings before the line: the API reads them in its lifespan, a worker
when it builds itself.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping

FLAG = "--await-start"


def release_line(variables: Mapping[str, str]) -> bytes:
    """What the supervisor writes to a waiting child."""
    return (json.dumps(dict(variables)) + "\n").encode()


def await_start() -> None:
    """Wait for the supervisor's line and put its variables in this process's
    environment. A closed pipe with no line means the supervisor stopped while
    starting: end quietly (it stops this process anyway)."""
    raw = sys.stdin.buffer.readline()
    if not raw:
        sys.stdout.flush()
        os._exit(0)
    variables = json.loads(raw)
    os.environ.update({str(k): str(v) for k, v in variables.items()})
