"""loom.supervisor's rules with stand-in children (small Python processes): restarts
with a doubling delay, giving up after too many failures, the order of a stop; and
loom.embedded.lifeline's parent-death signal. The real `loom serve` under faults is
tests/faults."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from loom import start_gate
from loom.settings import Settings
from loom.supervisor import Child, RestartPolicy, Supervisor


def _python(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code])


def test_a_failing_child_is_restarted_with_doubling_delays_then_given_up_on(tmp_path: Path) -> None:
    policy = RestartPolicy(
        first_delay_s=0.1, max_delay_s=0.4, stable_after_s=30.0, max_failures=5, window_s=60.0
    )
    sup = Supervisor(Settings(home=tmp_path), policy)
    spawned: list[float] = []

    def spawn() -> subprocess.Popen[bytes]:
        spawned.append(time.monotonic())
        return _python("raise SystemExit(3)")

    child = Child("flaky", spawn, 5.0)
    child.start()
    sup.workers.append(child)
    sup.supervise()

    assert sup.gave_up is child
    assert len(spawned) == 5  # the first start and four restarts; the fifth failure gives up
    gaps = [b - a for a, b in zip(spawned, spawned[1:], strict=False)]
    for gap, delay in zip(gaps, [0.1, 0.2, 0.4, 0.4], strict=True):  # doubling, capped
        assert gap >= delay
    assert "the flaky failed 5 times within 60s (last: exited with exit code 3)" in sup.give_up_message()


def test_a_child_that_stayed_up_restarts_quickly_again(tmp_path: Path) -> None:
    delays: list[float] = []

    class Recording(Supervisor):
        def _failed(self, child: Child, now: float, why: str) -> None:
            super()._failed(child, now, why)
            if child.restart_at is not None:
                delays.append(child.delay_s)

    policy = RestartPolicy(
        first_delay_s=0.1, max_delay_s=5.0, stable_after_s=0.3, max_failures=3, window_s=60.0
    )
    sup = Recording(Settings(home=tmp_path), policy)
    child = Child("steady", lambda: _python("import time; time.sleep(0.6)"), 5.0)
    child.start()
    sup.workers.append(child)
    sup.supervise()
    # Each run outlived stable_after_s, so the delay never doubled.
    assert sup.gave_up is child and delays == [0.1, 0.1]


def test_stop_takes_the_api_then_the_workers_then_the_backends(tmp_path: Path) -> None:
    order = tmp_path / "order"
    sup = Supervisor(Settings(home=tmp_path))

    def stand_in(name: str) -> Child:
        # Each notes when it was told to stop, after a while (a drain), then exits.
        code = (
            f"import signal, sys, time\n"
            f"def bye(*_):\n    time.sleep(0.2)\n"
            f"    open({str(order)!r}, 'a').write({name!r} + '\\n')\n    sys.exit(0)\n"
            f"signal.signal(signal.SIGTERM, bye)\nopen({str(order)!r} + '.{name}', 'w').close()\n"
            f"time.sleep(60)\n"
        )
        child = Child(name, lambda: _python(code), 5.0)
        child.start()
        return child

    sup.backends = [stand_in("clickhouse"), stand_in("redis")]
    sup.workers = [stand_in("worker")]
    sup.api = [stand_in("api")]
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("order.*"))) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)  # every stand-in has its handler in place
    sup.stop()
    lines = order.read_text().split()
    assert lines[:2] == ["api", "worker"] and sorted(lines[2:]) == ["clickhouse", "redis"]
    assert all(c.proc is not None and c.proc.returncode == 0 for c in sup.children)


def _gated(seen: Path) -> Child:
    """A stand-in for the API or a worker: waits at its start gate, then notes the URL
    it was given."""
    code = (
        "import os\nfrom loom import start_gate\nstart_gate.await_start()\n"
        f"open({str(seen)!r}, 'a').write(os.environ['LOOM_REDIS_URL'] + '\\n')\n"
    )
    return Child("api", lambda: subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE), 5.0)


def test_a_gated_child_waits_for_its_release_and_a_restart_goes_at_once(tmp_path: Path) -> None:
    seen = tmp_path / "seen"
    child = _gated(seen)
    child.start()
    assert child.proc is not None
    with pytest.raises(subprocess.TimeoutExpired):
        child.proc.wait(1.5)  # imported, and waiting: nothing is known yet
    assert not seen.exists()

    child.release(start_gate.release_line({"LOOM_REDIS_URL": "unix:///home/redis.sock"}))
    assert child.proc.wait(30) == 0
    assert seen.read_text() == "unix:///home/redis.sock\n"

    child.start()  # a restart: the line is known, the child goes on by itself
    assert child.proc.wait(30) == 0
    assert seen.read_text() == "unix:///home/redis.sock\n" * 2


def test_a_gated_child_ends_quietly_when_the_supervisor_stops_before_releasing_it(tmp_path: Path) -> None:
    child = _gated(tmp_path / "seen")
    child.start()
    assert child.proc is not None and child.proc.stdin is not None
    child.proc.stdin.close()  # the supervisor's end of the pipe is gone, no line sent
    assert child.proc.wait(30) == 0
    assert not (tmp_path / "seen").exists()


def test_a_child_with_a_lifeline_dies_with_its_parent() -> None:
    # A parent that starts a long sleeper with the lifeline, says its pid, and waits.
    parent_code = (
        "import subprocess, sys, time\n"
        "from loom.embedded.lifeline import die_with_parent\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
        "preexec_fn=die_with_parent())\n"
        "print(p.pid, flush=True)\ntime.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        sleeper = psutil.Process(int(parent.stdout.readline()))
        assert sleeper.is_running()
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        sleeper.wait(10)  # raises psutil.TimeoutExpired if it outlived its parent
    finally:
        if parent.poll() is None:
            parent.kill()
