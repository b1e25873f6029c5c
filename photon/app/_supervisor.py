"""Starting and supervising Photon's processes: restart what dies, stop everything in order.

The supervisor is the only part of ``photon run`` that touches processes. Children run in their own
session (so a Ctrl-C reaches the launcher alone, which then stops them in order) and get SIGTERM if the
launcher itself dies. Given a fork server (:mod:`photon.app._forkserver`), every ``python -m`` child it can
fork is forked from it (through the fork server, which dies with the launcher, they die with the launcher
too), and anything else is started here; the two are supervised alike. Each child's output goes to ``<log_dir>/<name>.log``, rotated by size: at
``LOG_MAX_BYTES`` the file becomes ``<name>.log.1`` (older ones shift up to ``.LOG_BACKUPS``, the oldest is
dropped). The output is read through a pipe by a thread per child, so a full disk drops log lines and
never blocks a child.
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from photon import write_atomic

STOP_ORDER = ("dispatcher", "joiner", "eventstore", "registry")
LOG_MAX_BYTES = 16 << 20
LOG_BACKUPS = 3
_PR_SET_PDEATHSIG = 1


@dataclass
class _Child:
    spec: object
    proc: subprocess.Popen | None = None     # or a ForkedProcess (photon.app._forkserver), alike to the supervisor
    restarts: int = 0
    next_start: float = 0.0
    backoff_s: float = 0.5
    started_at: float = 0.0
    events: list = field(default_factory=list)


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


class RotatingLog:
    """Appends a child's output to ``path``, rotating at ``max_bytes`` (``path.1`` .. ``path.<backups>``).
    Write failures (disk full) drop the data and are counted; they never raise."""

    def __init__(self, path: Path, max_bytes: int = LOG_MAX_BYTES, backups: int = LOG_BACKUPS) -> None:
        self.path, self.max_bytes, self.backups = Path(path), max_bytes, backups
        self.dropped_bytes = 0

    def write(self, data: bytes) -> None:
        try:
            size = self.path.stat().st_size if self.path.exists() else 0
            if size and size + len(data) > self.max_bytes:
                for k in range(self.backups - 1, 0, -1):
                    older = self.path.with_name(f"{self.path.name}.{k}")
                    if older.exists():
                        os.replace(older, self.path.with_name(f"{self.path.name}.{k + 1}"))
                os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
            with open(self.path, "ab") as f:
                f.write(data)
        except OSError:
            self.dropped_bytes += len(data)

    def pump(self, stream) -> None:
        """Copy ``stream`` (a child's stdout) into the log until it ends."""
        with stream:
            for line in iter(stream.readline, b""):
                self.write(line)


def _describe_exit(code: int) -> str:
    from photon.app._forkserver import STATUS_LOST
    if code == STATUS_LOST:
        return "ended with its fork server (exit status unknown)"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


class Supervisor:
    """Keeps every spec's process running. ``ensure(specs)`` adds specs not seen before; ``poll()``
    restarts dead children with a growing delay (0.5 s doubling to 10 s); ``stop()`` stops by role in
    :data:`STOP_ORDER`, SIGTERM first and SIGKILL after ``grace_s``."""

    def __init__(self, log_dir: Path, state_file: Path, env: dict | None = None, echo=None,
                 forkserver=None) -> None:
        self.log_dir = Path(log_dir)
        self.forkserver = forkserver     # a photon.app._forkserver.ForkServer: services start forked from it
        self.state_file = Path(state_file)
        self.env = env
        self.children: dict[str, _Child] = {}
        self.stopping = False
        self.state_error = ""            # why launcher.json could not be written ("" when it was)
        self._state_dirty = False
        self.held_regions: set[str] = set()     # regions taken down on purpose: not started, not restarted
        self._echo = echo or (lambda msg: print(f"photon: {msg}", file=sys.stderr, flush=True))

    def ensure(self, specs) -> None:
        """Start every spec not seen before, in the order given and all at once (see :meth:`_start_all`)."""
        changed = False
        new = []
        for spec in specs:
            if spec.name not in self.children:
                self.children[spec.name] = _Child(spec)
                if spec.region not in self.held_regions:
                    new.append(self.children[spec.name])
                changed = True
        if new:
            self._start_all(new)
        if changed:
            self._write_state()

    def poll(self) -> None:
        if self.stopping:
            return
        now = time.monotonic()
        changed = False
        for child in self.children.values():
            if child.proc is not None and child.proc.poll() is not None:
                code = child.proc.returncode
                self._echo(f"{child.spec.name} (pid {child.proc.pid}) {_describe_exit(code)}; "
                           f"restarting in {child.backoff_s:.1f} s (see {self.log_dir / child.spec.name}.log)")
                if now - child.started_at > 30:
                    child.backoff_s = 0.5
                child.next_start = now + child.backoff_s
                child.backoff_s = min(10.0, child.backoff_s * 2)
                child.proc = None
                child.restarts += 1
                changed = True
            if child.proc is None and now >= child.next_start and child.spec.region not in self.held_regions:
                self._start(child)
                changed = True
        if changed or self._state_dirty:
            self._write_state()

    def pid(self, name: str) -> int | None:
        child = self.children.get(name)
        return child.proc.pid if child and child.proc and child.proc.poll() is None else None

    def names(self, role: str) -> list[str]:
        return [n for n, c in self.children.items() if c.spec.role == role]

    def hold_region(self, region: str, hard: bool = False, grace_s: float = 20.0) -> list[str]:
        """Take every process of ``region`` down and keep it down until :meth:`release_region`: with
        ``hard`` all of them get SIGKILL at once (a region lost whole), else they stop in order as in
        :meth:`stop`. Returns the names of the processes taken down."""
        self.held_regions.add(region)
        members = [c for c in self.children.values() if c.spec.region == region and c.proc is not None]
        if hard:
            for c in members:
                if c.proc.poll() is None:
                    c.proc.kill()
            for c in members:
                c.proc.wait(timeout=10)
        else:
            self._stop_group(members, grace_s)
        for c in members:
            c.proc = None
        self._write_state()
        return [c.spec.name for c in members]

    def release_region(self, region: str) -> list[str]:
        """Start every process of a held ``region`` again (at once, no restart delay)."""
        self.held_regions.discard(region)
        starting = [c for c in self.children.values() if c.spec.region == region and c.proc is None]
        for c in starting:
            c.next_start, c.backoff_s = 0.0, 0.5
        if starting:
            self._start_all(starting)
        self._write_state()
        return [c.spec.name for c in starting]

    def stop(self, grace_s: float = 20.0) -> None:
        self.stopping = True
        self._stop_group([c for c in self.children.values() if c.proc is not None], grace_s)
        if self.forkserver is not None:        # last: its children die with it
            self.forkserver.close()
        self._write_state()

    def _stop_group(self, children: list, grace_s: float) -> None:
        roles = list(STOP_ORDER) + sorted({c.spec.role for c in children} - set(STOP_ORDER))
        for role in roles:
            group = [c for c in children if c.spec.role == role and c.proc is not None]
            for c in group:
                if c.proc.poll() is None:
                    c.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            for c in group:
                try:
                    c.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    self._echo(f"{c.spec.name} (pid {c.proc.pid}) did not stop in {grace_s:.0f} s; killing it")
                    c.proc.kill()
                    c.proc.wait(timeout=10)

    def _start(self, child: _Child) -> None:
        self._start_all([child])

    def _start_all(self, children: list) -> None:
        """Start ``children``, in order. Those the fork server can fork are asked of it all at once
        (:meth:`~photon.app._forkserver.ForkServer.spawn_many`: it forks them back to back, where asked one
        by one it would import a later room's modules between two of them); the others, and any it could
        not fork, are started directly afterwards (so a direct start that raises leaves no forked child
        untracked)."""
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        except OSError:
            pass                      # the pump drops what it cannot write
        envs = [self._env(child.spec) for child in children]
        forked = self._fork_all([child.spec for child in children], envs)
        for child, proc in zip(children, forked):      # every forked one tracked before any direct start
            if proc is not None:
                self._track(child, proc)
        for child, env, proc in zip(children, envs, forked):
            if proc is None:
                self._track(child, subprocess.Popen(list(child.spec.argv), stdout=subprocess.PIPE,
                                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                    start_new_session=True, preexec_fn=_die_with_parent, env=env))

    def _track(self, child: _Child, proc) -> None:
        """``proc`` runs ``child`` from now on; its output is pumped into the child's log."""
        child.proc = proc
        log = RotatingLog(self.log_dir / f"{child.spec.name}.log")
        threading.Thread(target=log.pump, args=(proc.stdout,), name=f"log-{child.spec.name}",
                         daemon=True).start()
        child.started_at = time.monotonic()

    def _fork_all(self, specs: list, envs: list) -> list:
        """Per spec, the child forked by the fork server (its output on a pipe read here, as a started
        child's), or None when there is no fork server or it cannot start this one (the caller starts it
        directly)."""
        from photon.app._forkserver import ForkServerUnavailable
        server = self.forkserver
        out: list = [None] * len(specs)
        if server is None:
            return out
        asks, pipes = [], []
        for k, (spec, env) in enumerate(zip(specs, envs)):
            if server.can_fork(spec.argv, env):
                read_end, write_end = os.pipe()
                asks.append(k)
                pipes.append((read_end, write_end))
        if not asks:
            return out
        try:
            results = server.spawn_many([(specs[k].argv, envs[k], write_end, None)
                                         for k, (_, write_end) in zip(asks, pipes)])
        except BaseException:
            for read_end, _ in pipes:
                os.close(read_end)
            raise
        finally:
            for _, write_end in pipes:
                os.close(write_end)
        for k, (read_end, _), proc in zip(asks, pipes, results):
            if isinstance(proc, ForkServerUnavailable):
                os.close(read_end)
                if not server.broken:           # (a fork server that broke has said so itself)
                    self._echo(f"{specs[k].name}: {proc}; starting it directly")
                continue
            proc.stdout = open(read_end, "rb")  # noqa: SIM115  (the log pump closes it at the end of the output)
            out[k] = proc
        return out

    def _env(self, spec) -> dict:
        """The child's environment: the launcher's, plus where it serves metrics and the labels they carry."""
        env = {**(self.env if self.env is not None else os.environ), "PHOTON_REGION": spec.region,
               "PHOTON_PROCESS": spec.name}
        if spec.metrics_address:
            env["PHOTON_METRICS_ADDR"] = spec.metrics_address
        return env

    def _write_state(self) -> None:
        server = self.forkserver
        state = {"launcher_pid": os.getpid(), "down_regions": sorted(self.held_regions),
                 "forkserver_pid": server.pid if server is not None and not server.broken else None, "processes": {
            name: {"pid": c.proc.pid if c.proc else None, "role": c.spec.role, "region": c.spec.region,
                   "restarts": c.restarts, "argv": list(c.spec.argv),
                   "forked": bool(getattr(c.proc, "forked", False)),
                   "address": c.spec.address, "metrics": c.spec.metrics_address}
            for name, c in self.children.items()}}
        try:
            self.state_file.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.state_file, json.dumps(state, indent=1).encode())
        except OSError as e:     # a full state disk pauses the listing, never the run: tried again each poll
            if not self.state_error:
                self._echo(f"cannot write {self.state_file} ({e}); waiting for the disk, retrying")
            self.state_error = str(e)
            self._state_dirty = True
            return
        if self.state_error:
            self._echo(f"{self.state_file} written again")
        self.state_error = ""
        self._state_dirty = False
