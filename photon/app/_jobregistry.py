"""The IdRegistry for a batch job (``photon verify``, ``photon recover``, ``photon registry export``), whether
or not a pipeline runs.

These jobs talk to the registry's replicas. :func:`registry_for_job` first asks every replica of the config
for its status (a short probe, all at once):

* **one answers**: a pipeline (or a registry started some other way) runs it; the job uses it as it is.
* **none answers**: the job brings the registry up from its own data, for its own duration only:

  1. It takes the launcher lock (``<state_dir>/launcher.lock``) of every region whose state dir is on this
     machine, as ``photon run`` does. Held by a ``photon run``: the pipeline runs here and its launcher
     restarts its replicas, so the job starts nothing and waits for them as before. Held by another job:
     it fails, naming it. Held by the job, a ``photon run`` started meanwhile exits 4 naming the job.
  2. Every replica of every shard must have its data dir (from the config) on this machine; otherwise it
     fails naming each shard and replica that could not be reached or started, and where its data should be;
     when none has, it says that nothing was ever registered here, naming the state dir (a config whose
     pipeline never ran).
  3. It starts every replica on its configured address with the job's name in its spec: such a replica
     refuses commits, token clearing and reshards (UNAVAILABLE, naming the job), so a pipeline elsewhere
     that reaches those addresses registers nothing; lookups, deletes and exports (what the jobs need) are
     served. Each replica holds its data dir's own lock (``replica.lock``) for its life, so it never runs
     beside a live replica on the same data: a second one exits, naming the dir and the holder's pid.
  4. It waits for a leader in every shard, runs the job, and stops the replicas (SIGTERM, in order) at the
     end, also when the job fails or is interrupted (Ctrl-C, SIGTERM).

Progress goes to ``echo``: ``registry not running: starting its 5 replicas from ... for this job``,
``leader elected ...``, ``registry stopped ...``. The replicas' output goes to
``[verify].out_dir/job-registry/logs/``; their pids to ``job-registry/processes.json`` beside it.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import idregistry
from photon import PhotonConfig, wait_until
from photon.app._launcher import AlreadyRunning, child_env, lock_state_dirs
from photon.app._regions import held_by_launcher
from photon.app._supervisor import Supervisor

RUNNING, STARTED, WAITING = "running", "started", "waiting"
"""What :func:`registry_for_job` yields: a registry that answered, one it started, or none answering while
a ``photon run`` on this machine (whose launcher restarts its replicas) holds a region."""
PROBE_TIMEOUT_S = 1.5
LEADER_TIMEOUT_S = 60.0
STOP_GRACE_S = 10.0


class JobRegistryError(idregistry.RegistryUnavailable):
    """No replica answers and the registry cannot be brought up here; the message says which replicas and
    why."""


def answering(places) -> list[str]:
    """The gRPC addresses of the replicas that answer a status request within :data:`PROBE_TIMEOUT_S`."""
    if not places:
        return []
    client = idregistry.RegistryClient([p.grpc_address for p in places])
    try:
        with ThreadPoolExecutor(min(16, len(places))) as pool:
            rows = list(pool.map(lambda p: client.replica_status(p.grpc_address, timeout=PROBE_TIMEOUT_S), places))
    finally:
        client.close()
    return [p.grpc_address for p, row in zip(places, rows) if "error" not in row]


def replicas_answering(config: PhotonConfig) -> list[str]:
    """The gRPC addresses of the config's registry replicas that answer now (see :func:`answering`)."""
    return answering(idregistry.replica_places(config))


def _not_here(places) -> list[str]:
    return [f"shard {p.shard} replica {p.replica} (region {p.region}, {p.grpc_address}): no data dir {p.data_dir} "
            f"on this machine" for p in places if not p.data_dir.is_dir()]


def _never_ran(config: PhotonConfig, places) -> str:
    """No replica answers and none has a data dir here: on this machine nothing was ever registered."""
    states = sorted({config.region(p.region).state_dir for p in places})
    roots = sorted({str(p.data_dir.parent.parent) for p in places})
    dirs = f"state dir{'s' if len(states) > 1 else ''} {', '.join(states)}"
    return (f"nothing was ever registered here: no registry replica answers, and none of its {len(places)} "
            f"replicas has data on this machine (no shard-*/replica-* folder under {', '.join(roots)}), so the "
            f"pipeline of this config has never run with {dirs} here. Run `photon run --config {config.path}` "
            f"first, or, if the registry runs on other machines, run the job there or while it runs")


def _roots(places) -> str:
    """``/x/state/a/registry (shard-0/replica-0..4)``: where the replicas' data is, briefly."""
    by_root: dict[Path, list[str]] = {}
    for p in places:
        by_root.setdefault(p.data_dir.parent.parent, []).append(f"{p.data_dir.parent.name}/{p.data_dir.name}")
    return "; ".join(f"{root} ({', '.join(names)})" for root, names in by_root.items())


@contextmanager
def _interrupted_by_sigterm():
    """SIGTERM raises KeyboardInterrupt in the main thread while inside, so the replicas are stopped."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    before = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _exit_reason(supervisor: Supervisor, name: str) -> str:
    """The last line a replica that exited wrote (its pump may still be copying it: wait a moment)."""
    log = supervisor.log_dir / f"{name}.log"

    def last_line() -> str:
        try:
            lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
        except OSError:
            return ""
        return lines[-1].strip() if lines else ""
    try:
        wait_until(lambda: bool(last_line()), 2.0, interval=0.05)
    except TimeoutError:
        pass
    return last_line() or f"no output (see {log})"


def _wait_for_leaders(supervisor: Supervisor, places, timeout_s: float) -> dict[int, str]:
    """``{shard: leader address}`` once every shard has a leader; raises :class:`JobRegistryError` when a
    replica exits first (naming why) or no leader comes within ``timeout_s``."""
    shards = sorted({p.shard for p in places})
    client = idregistry.RegistryClient([p.grpc_address for p in places if p.shard == 0], retry_timeout_s=2.0)
    leaders: dict[int, str] = {}

    def up() -> bool:
        for name, child in supervisor.children.items():
            if child.proc is not None and child.proc.poll() is not None:
                raise JobRegistryError(f"registry replica {name} exited (status {child.proc.returncode}) while "
                                       f"starting for this job: {_exit_reason(supervisor, name)}")
        try:
            rows = client.status()
        except idregistry.RegistryUnavailable:
            return False
        leaders.clear()
        leaders.update({r["shard"]: r["address"] for r in rows if r.get("is_leader")})
        return all(s in leaders for s in shards)
    try:
        wait_until(up, timeout_s, interval=0.2, message="a leader in every registry shard")
    except TimeoutError:
        missing = [s for s in shards if s not in leaders]
        raise JobRegistryError(f"registry started for this job, but shard(s) {missing} elected no leader within "
                               f"{timeout_s:g} s (replica logs: {supervisor.log_dir})") from None
    finally:
        client.close()
    return dict(leaders)


@contextmanager
def registry_for_job(config: PhotonConfig, job: str, echo=None, leader_timeout_s: float = LEADER_TIMEOUT_S):
    """Run the body with a registry answering (see the module docstring); yields :data:`RUNNING`,
    :data:`STARTED` or :data:`WAITING`. ``job`` names the command (``"photon verify"``); ``echo(message)``
    prints progress (default: ``<job>: message`` on stderr). Raises :class:`JobRegistryError` (a
    :class:`idregistry.RegistryUnavailable`) when no replica answers and the registry cannot be started here."""
    echo = echo or (lambda message: print(f"{job}: {message}", file=sys.stderr, flush=True))
    places = idregistry.replica_places(config)
    if answering(places):
        yield RUNNING
        return
    try:
        locks = lock_state_dirs(config, what=job, only_existing=True)
    except AlreadyRunning as e:
        if e.held is not None and held_by_launcher(e.held):
            echo(f"no registry replica answers; photon run (pid {e.held.pid}) runs here and restarts them: "
                 f"waiting for them")
            yield WAITING
            return
        raise JobRegistryError(f"no registry replica answers, and {e.held.describe() if e.held else 'another job'} "
                               f"holds this machine's regions (it may be bringing the registry up for itself): "
                               f"run this job again when it ends") from None
    try:
        missing = _not_here(places)
        if places and len(missing) == len(places):
            raise JobRegistryError(_never_ran(config, places))
        if missing:
            raise JobRegistryError("no registry replica answers, and the registry cannot be started here for this "
                                   "job: " + "; ".join(missing) + ". Start the registry where its data is "
                                   "(photon run there) and run the job again")
        yield from _serve_for_job(config, job, places, echo, leader_timeout_s)
    finally:
        for f in locks:
            f.close()


def _serve_for_job(config: PhotonConfig, job: str, places, echo, leader_timeout_s: float):
    home = config.verify_dir / "job-registry"
    supervisor = Supervisor(home / "logs", home / "processes.json", env=child_env(config), echo=echo)
    specs = idregistry.registry_processes(config, job=f"{job} (pid {os.getpid()})")
    echo(f"registry not running: starting its {len(specs)} replicas from {_roots(places)} for this job "
         f"(they refuse pipeline commits; logs: {supervisor.log_dir})")
    started = time.monotonic()
    try:
        with _interrupted_by_sigterm():
            supervisor.ensure(specs)
            leaders = _wait_for_leaders(supervisor, places, leader_timeout_s)
            echo(f"leader elected after {time.monotonic() - started:.1f} s: "
                 + ", ".join(f"shard {s} at {a}" for s, a in sorted(leaders.items())))
            yield STARTED
    finally:
        supervisor.stop(grace_s=STOP_GRACE_S)
        echo(f"registry stopped ({len(specs)} replicas, up {time.monotonic() - started:.1f} s for this job)")

