"""`loom import` and `loom export` run as a user runs them: the `loom` command in a
subprocess with LOOM_URL and LOOM_TOKEN, against the API on a real port, with the
suite's worker doing the imports' background embedding."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

LOOM = [sys.executable, "-m", "loom.cli.main"]
DATA = Path(__file__).resolve().parents[1] / "data" / "imports"


@dataclass
class Ran:
    code: int
    out: str
    err: str

    def json(self) -> dict[str, Any]:
        return json.loads(self.out.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.fixture
async def loom_cli(api_url: str, arq_worker: Any) -> Any:
    """loom_cli(*args, token=...) -> Ran: the command, awaited without blocking the loop
    (the suite's worker runs on it)."""

    async def run(*args: str, token: str) -> Ran:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOOM_")}
        env["LOOM_URL"], env["LOOM_TOKEN"] = api_url, token
        proc = await asyncio.create_subprocess_exec(
            *LOOM, *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await asyncio.wait_for(proc.communicate(), 120)
        return Ran(proc.returncode or 0, out.decode(), err.decode())

    return run
