"""First run, as a new user meets Loom: a fresh copy of the project, no LOOM_* variable.

The project's files (what git tracks, plus new files not ignored, i.e. what a clone of
the next commit holds) are copied to a new directory; the suite's installed venv is
linked in as its `.venv` (what `make run` would have installed there). From that
directory, with every LOOM_* variable removed from the environment, the venv's `loom
serve` (the process `make run` starts) is started on a free port (`--port`, since 7777
may be taken by another suite on this machine) and used exactly as the README says:
`loom token mint` from the same directory, then the README's "Calling Loom" blocks, run
by bash as written (only the port in `API=` differs). Ctrl-C (SIGINT to serve's process
group, as a terminal sends it) must leave no process behind.

The module shares one server between its tests (module fixture, stopped by the last
test, which checks the stop).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent  # the suite's venv (make test: .venv/bin)
LOOM_EXE = VENV_BIN / "loom"
HEALTHY_WITHIN_S = 10.0  # a clone answers /healthz this soon after `make run` starts serve (idle machine)
STARTUP_LIMIT_S = 120.0  # give up waiting (the 10 s assertion is separate, for a clear message)

pytestmark = pytest.mark.timeout(600)


# -- the fresh copy ---------------------------------------------------------------


def _project_files() -> list[Path]:
    """Tracked files plus new ones git does not ignore (relative paths), as in the
    working tree; without git, every file but the venv, the data home and caches."""
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
        names = [n for n in out.decode().split("\0") if n]
        return [Path(n) for n in names if (REPO / n).is_file()]
    except (OSError, subprocess.SubprocessError):
        skip = {".venv", ".loom", ".git", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
        return [
            p.relative_to(REPO)
            for p in REPO.rglob("*")
            if p.is_file() and not skip.intersection(p.relative_to(REPO).parts)
        ]


def _fresh_copy() -> Path:
    # Short path: the embedded Redis's unix socket lives under ./.loom (under ~100 chars).
    root = Path(tempfile.mkdtemp(prefix="loomfirst-", dir="/tmp")) / "loom"
    for rel in _project_files():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, root / rel)
    assert not (root / ".venv").exists() and not (root / ".loom").exists()
    (root / ".venv").symlink_to(VENV_BIN.parent, target_is_directory=True)
    return root


def _user_env() -> dict[str, str]:
    """The caller's environment without any LOOM_* variable (a new user sets none)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("LOOM_")}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- processes ----------------------------------------------------------------------


def _proc_stat(pid: int) -> tuple[int, str, str] | None:
    """(parent pid, state, start time) of a live process, None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = raw[raw.rindex(")") + 2 :].split()
    return int(rest[1]), rest[0], rest[19]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _all_pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def _descendants(root: int) -> dict[int, str]:
    """pid -> start time of every live descendant of `root`."""
    parents: dict[int, list[int]] = {}
    starts: dict[int, str] = {}
    for pid in _all_pids():
        stat = _proc_stat(pid)
        if stat is not None:
            parents.setdefault(stat[0], []).append(pid)
            starts[pid] = stat[2]
    found: dict[int, str] = {}
    todo = list(parents.get(root, []))
    while todo:
        pid = todo.pop()
        found[pid] = starts[pid]
        todo.extend(parents.get(pid, []))
    return found


def _running(pid: int, start: str) -> bool:
    """Still running (a zombie has exited; another process may reuse the pid)."""
    stat = _proc_stat(pid)
    return stat is not None and stat[1] != "Z" and stat[2] == start


def _processes_in(directory: Path) -> list[str]:
    """Live processes whose command line names `directory` or which work in it."""
    found = []
    for pid in _all_pids():
        stat = _proc_stat(pid)
        if stat is None or stat[1] == "Z" or pid == os.getpid():
            continue
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            cwd = ""
        cmd = _cmdline(pid)
        if str(directory) in cmd or cwd == str(directory) or cwd.startswith(f"{directory}/"):
            found.append(f"{pid}: {cmd[:200]} (cwd {cwd})")
    return found


@dataclass
class Served:
    """A `loom serve` started from a fresh copy, as a user starts it."""

    root: Path
    port: int
    process: subprocess.Popen[bytes]
    started: float
    lines: list[str] = field(default_factory=list)
    healthy_after: float | None = None
    busy: float = 1.0  # runnable processes per core while serve started (1 = the machine was free)
    children: dict[int, str] = field(default_factory=dict)  # pid -> start time, seen while up
    stopped_output: str | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return "".join(self.lines)

    def run(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """A command from the copy's directory with the user's environment."""
        return subprocess.run(
            list(args), cwd=self.root, env=_user_env(), capture_output=True, text=True, timeout=timeout
        )

    def interrupt(self, timeout: float = 90.0) -> str:
        """Ctrl-C: SIGINT to serve's process group; its output once it exited."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGINT)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill_all()
            pytest.fail(f"loom serve did not stop within {timeout}s of Ctrl-C:\n{self.output()[-3000:]}")
        time.sleep(0.2)  # the reader thread drains the pipe
        return self.output()

    def kill_all(self) -> None:
        """Last resort (a failed test): nothing started here outlives the module."""
        for pid, start in {**self.children, **_descendants(self.process.pid)}.items():
            if _running(pid, start):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()


def _read_into(stream: Any, lines: list[str]) -> None:
    for raw in iter(stream.readline, b""):
        lines.append(raw.decode(errors="replace"))


def _runnable_per_core() -> float:
    return os.getloadavg()[0] / (os.cpu_count() or 1)


def _start(root: Path) -> Served:
    port = _free_port()
    load_before = _runnable_per_core()
    assert LOOM_EXE.exists(), f"no loom executable in the suite's venv ({LOOM_EXE})"
    process = subprocess.Popen(
        [str(LOOM_EXE), "serve", "--port", str(port)],
        cwd=root,
        env=_user_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    served = Served(root, port, process, time.monotonic())
    # Serve's children share the pipe; reading it on a thread keeps their logs from blocking them.
    threading.Thread(target=_read_into, args=(process.stdout, served.lines), daemon=True).start()
    deadline = served.started + STARTUP_LIMIT_S
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(f"{served.base}/healthz", timeout=1.0).status_code == 200:
                served.healthy_after = time.monotonic() - served.started
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    # Serve prints its URLs right after its own health check passes.
    while time.monotonic() < deadline and process.poll() is None and "Press Ctrl-C" not in served.output():
        time.sleep(0.05)
    served.children = _descendants(process.pid)
    served.busy = max(1.0, load_before, _runnable_per_core())
    return served


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    root = _fresh_copy()
    server = _start(root)
    try:
        yield server
    finally:
        if server.process.poll() is None:
            server.interrupt()
        leftovers = _processes_in(root)
        if leftovers:
            server.kill_all()
        shutil.rmtree(root.parent, ignore_errors=True)


def _need_up(served: Served) -> None:
    if served.healthy_after is None:
        pytest.fail(f"loom serve did not answer /healthz from a fresh copy:\n{served.output()[-4000:]}")


def _post(served: Served, op: str, token: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(
        f"{served.base}/v1/{op}", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=60
    )
    assert r.status_code == 200, (op, r.status_code, r.text)
    return r.json()  # type: ignore[no-any-return]


# -- the tests ----------------------------------------------------------------------


def test_serve_from_a_fresh_copy_with_no_environment(served: Served) -> None:
    """Health within 10 s, a token from `loom token mint` in the same directory, then
    recording on, a user turn appended and found by conversation.search."""
    _need_up(served)
    # 10 s on a free machine; on a shared one (several suites at once) start-up waits for
    # the CPU like everything else, so the limit stretches by the run queue per core.
    limit = HEALTHY_WITHIN_S * served.busy
    print(f"/healthz after {served.healthy_after:.1f}s with {served.busy:.1f} runnable per core")
    assert served.healthy_after is not None and served.healthy_after <= limit, (
        f"/healthz answered after {served.healthy_after:.1f}s (limit {limit:.1f}s: {HEALTHY_WITHIN_S}s x "
        f"{served.busy:.1f} runnable per core)"
    )
    # LOOM_HOME defaulted to ./.loom of the working directory, resolved there.
    assert (served.root / ".loom" / "redis" / "redis.sock").exists()
    assert (served.root / ".loom" / "clickhouse" / "endpoint.port").exists()
    assert f"Home       {served.root / '.loom'}" in served.output()

    minted = served.run("./.venv/bin/loom", "token", "mint", "--namespace", "first-run", "--role", "admin")
    assert minted.returncode == 0, minted.stderr
    token = minted.stdout.strip()
    assert token.startswith("loom_") and "\n" not in token

    config = _post(served, "conversation.set_logging", token, {"namespace": "first-run", "enabled": True})
    assert config["conversation_logging_enabled"] is True
    turn = _post(
        served,
        "conversation.append",
        token,
        {
            "namespace": "first-run",
            "thread_id": "t-1",
            "msg_id": "m-1",
            "role": "user",
            "content": "The quarterly report moved to the finance wiki.",
        },
    )
    assert turn["stored"] is True and turn["embedding"] == "embedded", turn
    found = _post(
        served,
        "conversation.search",
        token,
        {"namespace": "first-run", "query": "where is the quarterly report now?"},
    )
    assert found["namespaces"] == ["first-run"]
    assert [(h["thread_id"], h["msg_id"]) for h in found["hits"]] == [("t-1", "m-1")], found
    fanned = _post(served, "conversation.search", token, {"query": "quarterly report finance wiki"})
    assert fanned["namespaces"] == ["first-run"] and fanned["hits"][0]["msg_id"] == "m-1"


def test_every_url_serve_prints_answers(served: Served) -> None:
    _need_up(served)
    urls = re.findall(r"http://\S+", served.output())
    assert urls, served.output()
    token = served.run(
        "./.venv/bin/loom", "token", "mint", "--namespace", "urls", "--role", "viewer"
    ).stdout.strip()
    for url in urls:
        if "<op>" in url:  # the API: POST /v1/<op> (one op stands for all)
            r = httpx.post(
                url.replace("<op>", "namespace.get_config"),
                json={"namespace": "urls"},
                headers={"Authorization": f"Bearer {token}"},
                timeout=30,
            )
        else:  # the dashboard sends a visitor without a session to its sign-in page
            r = httpx.get(url, timeout=30, follow_redirects=True)
        assert r.status_code == 200, (url, r.status_code, r.text[:300])
    printed = {u.removeprefix(served.base) for u in urls}
    assert printed == {"/v1/<op>", "/docs", "/dashboard", "/healthz"}, printed


# -- the README's first session ---------------------------------------------------------


def readme_blocks() -> list[str]:
    """The fenced bash blocks of the README's "Calling Loom" section, in order."""
    text = (REPO / "README.md").read_text()
    section = text.split("\n## Calling Loom\n", 1)[1].split("\n## ", 1)[0]
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", section, flags=re.S)]


def _json(out: str) -> dict[str, Any]:
    return json.loads(out)  # type: ignore[no-any-return]


def _set_logging(out: str) -> None:
    assert _json(out)["conversation_logging_enabled"] is True


def _appended(msg_id: str) -> Callable[[str], None]:
    def check(out: str) -> None:
        body = _json(out)
        assert body["msg_id"] == msg_id and body["stored"] is True and body["embedding"] == "embedded", body

    return check


def _searched(out: str) -> None:
    body = _json(out)
    assert body["namespaces"] == ["acme"] and body["mode"] == "vector"
    assert body["hits"] and body["hits"][0]["msg_id"] in ("m-1", "m-2"), body
    assert "m-1" in [h["msg_id"] for h in body["hits"]], body


def _saved(out: str) -> None:
    body = _json(out)
    assert body["saved"] is True and body["message_id"] == "m-1" and body["reason"] is None, body


def _found_saved(out: str) -> None:
    body = _json(out)
    assert [h["message_id"] for h in body["hits"]] == ["m-1"], body


def _brief_saved(out: str) -> None:
    body = _json(out)
    assert body["brief_key"] == "ledger-migration" and body["revision"] == 1 and body["changed"] is True, body


def _brief_read(out: str) -> None:
    body = _json(out)
    assert body["revision"] == 1 and body["sections"]["goal"] == "Move invoicing to the new ledger", body
    assert body["sections"]["next_steps"] == ["Retire the old ledger"]


def _fact_set(out: str) -> None:
    body = _json(out)
    assert [(r["stored"], r["indexed"]) for r in body["results"]] == [(True, True)], body


def _fact_found(out: str) -> None:
    body = _json(out)
    assert body["hits"] and body["hits"][0]["text"] == "Wants invoices issued in EUR", body


def _silent(out: str) -> None:
    assert out == "", out


# Each block (in README order): a phrase that identifies it, and the check of what it prints.
README_STEPS: list[tuple[str, Callable[[str], None]]] = [
    ("API=http://127.0.0.1:7777", _silent),
    ("TOKEN=$(.venv/bin/loom token mint --namespace acme --role admin)", _silent),
    ("/v1/conversation.set_logging", _set_logging),
    ('"msg_id": "m-1", "role": "user"', _appended("m-1")),
    ('"msg_id": "m-2", "role": "assistant"', _appended("m-2")),
    ("/v1/conversation.search ", _searched),
    ("USER_TOKEN=$(.venv/bin/loom token mint --namespace acme --role writer --read-scope own_user", _silent),
    ("/v1/conversation.save_message", _saved),
    ("/v1/conversation.search_saved_messages", _found_saved),
    ("/v1/session.brief_save", _brief_saved),
    ("/v1/session.brief_get", _brief_read),
    ("/v1/memory.set", _fact_set),
    ("/v1/memory.search", _fact_found),
]

MARK = "@@loom-readme-block@@"


def test_readme_first_session_runs_as_written(served: Served) -> None:
    _need_up(served)
    blocks = readme_blocks()
    assert [phrase for phrase, _ in README_STEPS if not any(phrase in b for b in blocks)] == []
    assert len(blocks) == len(README_STEPS), blocks
    assert shutil.which("curl"), "the README's commands need curl"
    script = ""
    for block, (phrase, _) in zip(blocks, README_STEPS, strict=True):
        assert phrase in block, (phrase, block)
        # The only change: the port this suite's server listens on.
        script += f"printf '%s\\n' '{MARK}'\n{block.replace('127.0.0.1:7777', f'127.0.0.1:{served.port}')}\n"
    script += f"printf '%s\\n' '{MARK}'\nprintf '%s\\n%s\\n' \"$TOKEN\" \"$USER_TOKEN\"\n"
    ran = served.run("bash", "-c", script, timeout=300)
    assert ran.returncode == 0, (ran.stdout, ran.stderr)
    parts = [p.strip() for p in ran.stdout.split(MARK + "\n")[1:]]
    assert len(parts) == len(README_STEPS) + 1, ran.stdout
    for out, (phrase, check) in zip(parts, README_STEPS, strict=False):
        try:
            check(out)
        except (AssertionError, ValueError, KeyError) as exc:
            raise AssertionError(f"README block {phrase!r} printed {out!r}") from exc
    admin, end_user = parts[-1].split("\n")
    assert admin.startswith("loom_") and end_user.startswith("loom_") and admin != end_user


def readme_sdk_example() -> str:
    """The Python block of the README's SDK section (the design's own example)."""
    text = (REPO / "README.md").read_text()
    section = text.split("\n## The Python SDK\n", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    return str(block)


# Runs a script with top-level await as written (as `python -m asyncio` would).
TOP_LEVEL_AWAIT = (
    "import ast, asyncio, sys\n"
    "code = compile(sys.stdin.read(), 'README', 'exec', flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)\n"
    "ran = eval(code, {'__name__': '__main__'})\n"
    "if ran is not None:\n"
    "    asyncio.run(ran)\n"
)


def test_readme_sdk_example_runs_as_written(served: Served) -> None:
    """The SDK example (Agent, session, resume, append, close, briefs.save) against this
    `loom serve`: only the port differs; the token comes from LOOM_TOKEN."""
    _need_up(served)
    minted = served.run("./.venv/bin/loom", "token", "mint", "--namespace", "dev", "--role", "writer")
    assert minted.returncode == 0, minted.stderr
    token = minted.stdout.strip()
    script = served.root / "readme_sdk_example.py"
    script.write_text(readme_sdk_example().replace("localhost:7777", f"127.0.0.1:{served.port}"))
    ran = served.run(
        "bash",
        "-c",
        f"LOOM_TOKEN={token} ./.venv/bin/python -c {shlex.quote(TOP_LEVEL_AWAIT)} < {script.name}",
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "False"  # namespace dev does not record: nothing kept, no error
    brief = _post(served, "session.brief_get", token, {"namespace": "dev", "project": "billing"})
    assert brief["brief_key"] == "auto/billing/ledger-move" and brief["author"] == "model"
    assert brief["sections"]["next_steps"] == ["Update the export job"]
    recalled = _post(
        served, "memory.recall", token, {"namespace": "dev", "user_id": "u1", "query": "invoices ledger"}
    )
    # close() handed the turns to extraction: kept as evidence although the transcript was not.
    assert "We moved invoices to the new ledger." in [h["content"] for h in recalled["hits"]], recalled


# -- what the README documents exists ------------------------------------------------------


def _read_outside_settings(name: str) -> bool:
    pattern = re.compile(rf"\.{name}\b|[\"']{name}[\"']")
    for path in [*REPO.glob("loom/**/*.py"), *REPO.glob("workers/**/*.py")]:
        if path == REPO / "loom" / "settings.py":
            continue
        if pattern.search(path.read_text()):
            return True
    return False


def _derived_in_settings(name: str) -> list[str]:
    """The Settings properties that read the setting (a derived value the code uses)."""
    import ast

    tree = ast.parse((REPO / "loom" / "settings.py").read_text())
    found = []
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and any(
            isinstance(d, ast.Name) and d.id == "property" for d in fn.decorator_list
        ):
            reads = {n.attr for n in ast.walk(fn) if isinstance(n, ast.Attribute)}
            if name in reads:
                found.append(fn.name)
    return found


def _setting_is_used(name: str) -> bool:
    """Read somewhere in loom/ or workers/ other than its declaration, directly or
    through a Settings property that is."""
    return _read_outside_settings(name) or any(_read_outside_settings(p) for p in _derived_in_settings(name))


def _path_without_loom() -> str:
    """PATH as a user's who never put `loom` on it: the hooks must find the clone's own."""
    dirs = os.environ.get("PATH", "").split(os.pathsep)
    return os.pathsep.join(d for d in dirs if d and not (Path(d) / "loom").is_file())


def _threads_listed(out: str) -> None:
    threads = {t["thread_id"]: t for t in _json(out)["threads"]}
    hooks = {
        "try-generic",
        "cursor/try-cursor",
        "codex/0199a0c2-4b8e-7d21-9f3a-6c5e1b2d3f40",
        "claude-code/try-claude",
    }
    assert hooks <= set(threads), threads
    assert all(threads[t]["excerpt"] == "To the new ledger." for t in hooks), threads


# integrations/README.md's "Trying each hook by hand", in order: a phrase of each block
# and the check of what it prints (the scripts' own reports go to standard error).
HOOK_STEPS: list[tuple[str, Callable[[str], None]]] = [
    ("export LOOM_URL=http://127.0.0.1:7777", _silent),
    ("integrations/generic/ingest.sh /tmp/loom-try.md try-generic", lambda out: _expect(out, "stored 2")),
    ("integrations/cursor/cursor-session-hook.sh", lambda out: _expect(out, "{}")),
    ("integrations/codex/loom-codex-notify.sh", _silent),
    ("integrations/claude-code/hooks/loom-conversation.mjs", _silent),
    ("/v1/conversation.threads", _threads_listed),
]


def _expect(out: str, last_line: str) -> None:
    assert out.splitlines()[-1] == last_line, out


def test_each_hook_runs_by_hand_as_written(served: Served, tmp_path: Path) -> None:
    """After the README's first session (namespace acme records), from the clone, with
    no `loom` on PATH: the hooks find the clone's .venv/bin/loom."""
    _need_up(served)
    text = (REPO / "integrations" / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    assert len(blocks) == len(HOOK_STEPS), blocks
    script = f"export PATH={shlex.quote(_path_without_loom())}\n"
    for block, (phrase, _) in zip(blocks, HOOK_STEPS, strict=True):
        assert phrase in block, (phrase, block)
        # The changes: this suite's port, and files in this test's own directory.
        block = block.replace("127.0.0.1:7777", f"127.0.0.1:{served.port}").replace("/tmp/", f"{tmp_path}/")
        script += f"printf '%s\\n' '{MARK}'\n{block}\n"
    ran = served.run("bash", "-c", script, timeout=300)
    assert ran.returncode == 0 and "no loom command" not in ran.stderr, (ran.stdout, ran.stderr)
    parts = [p.strip() for p in ran.stdout.split(MARK + "\n")[1:]]
    for out, (phrase, check) in zip(parts, HOOK_STEPS, strict=True):
        try:
            check(out)
        except (AssertionError, ValueError, KeyError, IndexError) as exc:
            raise AssertionError(
                f"hook block {phrase!r} printed {out!r}; stderr {ran.stderr[-2000:]!r}"
            ) from exc


def test_every_setting_the_readme_names_is_read_and_used() -> None:
    from loom.settings import Settings

    text = (REPO / "README.md").read_text()
    # Every name written out: no `_SUFFIX` shorthand a reader (or this test) must expand.
    assert re.findall(r"`_[A-Z][A-Z0-9_]*`", text) == []
    names = set(re.findall(r"\bLOOM_[A-Z0-9_]+", text))
    test_only = {n for n in names if n.startswith("LOOM_TEST_")}
    # The clients' variables (the SDK, `loom ingest-transcript`): read there, not by the server.
    from loom.sdk.transport import CLIENT_ENV

    names -= set(CLIENT_ENV)
    conftest = (REPO / "tests" / "conftest.py").read_text()
    assert all(n in conftest for n in test_only), test_only  # the suite's own switches
    settings = {n.removeprefix("LOOM_").lower() for n in names - test_only}
    assert settings, "the README names no setting"
    assert sorted(s for s in settings if s not in Settings.model_fields) == []
    assert sorted(s for s in settings if not _setting_is_used(s)) == []


def test_settings_home_is_absolute_from_the_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from loom.settings import load_settings

    for key in [k for k in os.environ if k.startswith("LOOM_")]:
        monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    assert load_settings().home == tmp_path.resolve() / ".loom"
    monkeypatch.setenv("LOOM_HOME", "data/../state")
    assert load_settings().home == tmp_path.resolve() / "state"
    monkeypatch.setenv("LOOM_HOME", "~/loom-home")
    assert load_settings().home == Path.home().resolve() / "loom-home"


def test_embedded_redis_starts_on_a_relative_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    """redis-server changes into its --dir before opening its --logfile: a relative dir
    broke it (`make run` with the default ./.loom)."""
    from loom.embedded.redis_server import ping, start_redis

    root = Path(tempfile.mkdtemp(prefix="loomrel-", dir="/tmp"))
    monkeypatch.chdir(root)
    server = start_redis(Path(".loom/redis"))
    try:
        assert ping(server.url) and server.directory == root.resolve() / ".loom" / "redis"
        assert (root / ".loom" / "redis" / "redis.log").exists()
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


# -- Ctrl-C (last: it stops the module's server) -------------------------------------------


_STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ ")
# The lines under "Loom is up": where each URL is, and how to stop.
_UP_BLOCK = re.compile(r"^(  [A-Za-z]+ +\S|Press Ctrl-C to stop\.$)")


def _untimed_or_routine(output: str) -> list[str]:
    """The console's lines that carry no time, or that only --verbose should show (a
    request, a job's start or end, an MCP session's routine, a traceback)."""
    bad = []
    for line in output.splitlines():
        timed = bool(_STAMP.match(line)) or (line.startswith("{") and '"timestamp": "' in line)
        routine = any(w in line for w in ("HTTP Request:", " → ", " ← ", "Traceback", "uvicorn.access"))
        if routine or not (timed or _UP_BLOCK.match(line)):
            bad.append(line)
    return bad


def test_ctrl_c_leaves_no_process_behind(served: Served) -> None:
    _need_up(served)
    seen = {_cmdline(pid) for pid in served.children}
    kinds = {
        "redis-server": "redis-server",
        "endpoint": "loom.embedded.clickhouse_endpoint",
        "api": "loom.api.process",
        "worker": "workers.process",
    }
    missing = [k for k, needle in kinds.items() if not any(needle in c for c in seen)]
    assert missing == [], (missing, seen)
    output = served.interrupt()
    assert served.process.returncode == 0, output[-3000:]
    assert "Loom stopped." in output
    assert _untimed_or_routine(output) == [], output[-3000:]
    left = {pid: _cmdline(pid) for pid, start in served.children.items() if _running(pid, start)}
    assert left == {}, left
    assert _processes_in(served.root) == []
    assert not (served.root / ".loom" / "clickhouse" / "endpoint.port").exists()
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{served.base}/healthz", timeout=1)
