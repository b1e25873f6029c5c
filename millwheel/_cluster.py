"""Running MillWheel as processes on one machine: the master's three replicas and N worker processes
(``millwheel run --workers N``), one more worker from anywhere (``millwheel worker``), and what
``millwheel status`` shows.

The cluster's description lives in ``<out>/.millwheel/cluster.json``: the module, input, output, store
URL, runtime options and the master replicas' specs. A later ``millwheel run`` on the same ``--out``
reuses the same master (same data, same ports), so its sequencers keep growing above those the store
holds. Each worker process announces itself in ``<out>/.millwheel/workers/<name>.json`` (pid, address)
and removes the file when it stops.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from photon.rpc import open_channel

from millwheel import worker_pb2 as wpb
from millwheel import worker_pb2_grpc as wpb_grpc
from millwheel._master import MasterSpec, master_specs
from millwheel._master_client import MasterClient
from millwheel._master_state import PlacementPolicy
from millwheel._routing import split_keys

INITIAL_PIECES = 4
"""Master intervals per computation at declaration (each covers whole slots)."""


@dataclass
class ClusterFile:
    module: str
    input: str
    out: str
    store: str
    options: dict = field(default_factory=dict)
    specs: list = field(default_factory=list)
    workers: int = 0
    """How many workers ``millwheel run`` started: injectors wait for that many to hold intervals."""

    @property
    def masters(self) -> list[str]:
        return [MasterSpec.from_json(s).grpc_address for s in self.specs]

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.__dict__, indent=1))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> "ClusterFile":
        return cls(**json.loads(Path(path).read_text()))


def cluster_path(out) -> Path:
    return Path(out).resolve() / ".millwheel" / "cluster.json"


def declared(topology, slots: int) -> dict[str, list[str]]:
    """The master's computations: every computation cut into ``INITIAL_PIECES`` ranges of slots, every
    injector one interval."""
    out = {name: split_keys(slots, INITIAL_PIECES) for name in topology.computations}
    out.update({name: [] for name in topology.injectors})
    return out


def new_specs(out, topology, slots: int, policy: PlacementPolicy) -> list[str]:
    root = Path(out).resolve() / ".millwheel" / "master"
    return [s.to_json() for s in master_specs(root, declared(topology, slots), policy=policy, tick_ms=100)]


class ChildDidNotStart(RuntimeError):
    """A child process exited (or closed its output) before it said it serves."""


RESTART_FIRST_S = 1.0
"""The wait before a failed worker process is started again the first time; each further failed start in a row
doubles it, up to :data:`RESTART_CAP_S`."""
RESTART_CAP_S = 30.0
FAILED_STARTS = 5
"""A worker process failing this many times in a row for the same reason (its exit status and its last line on
stderr) is not started again: the run stops, naming it and the cause (a lasting one: an output that cannot be
written, a full disk), instead of starting it again for ever."""
START_TIMEOUT_S = 60.0
"""How long a started process has to say it serves (its ready line) before it is killed as not started."""
HEALTHY_S = 60.0
"""A process that ran this long before it failed starts a new count of failures in a row."""


class KeepsFailing(RuntimeError):
    """A worker process failed :data:`FAILED_STARTS` times in a row for the same reason."""


class _Relay:
    """Copies what a child process writes after its ``ready`` line to this process's stdout, and its stderr to
    this process's stderr (when not sent elsewhere), line by line, remembering its last line on stderr: the
    pipes are read to their end, so a child writing much (``FileSink(echo=True)`` in a worker) never blocks
    on a full pipe, and the cause of a failure is at hand."""

    def __init__(self, p: subprocess.Popen) -> None:
        self.last = ""
        self._threads = []
        if p.stderr is not None:
            self._start(p.stderr, sys.stderr, keep=True)
        self._stdout = p.stdout

    def start_stdout(self) -> None:
        """After the ready line was read from the child's stdout."""
        if self._stdout is not None:
            self._start(self._stdout, sys.stdout, keep=False)

    def _start(self, pipe, to, keep: bool) -> None:
        t = threading.Thread(target=self._copy, args=(pipe, to, keep), name="millwheel-child-output", daemon=True)
        self._threads.append(t)
        t.start()

    def _copy(self, pipe, to, keep: bool) -> None:
        try:
            for line in iter(pipe.readline, b""):
                if keep and line.strip():
                    self.last = line.decode(errors="replace").strip()
                try:
                    to.buffer.write(line)
                    to.flush()
                except (OSError, ValueError, AttributeError):
                    pass            # our own output closed: the child's is still read to its end
        except (OSError, ValueError):
            pass
        finally:
            pipe.close()

    def join(self, timeout_s: float) -> None:
        """Wait for the pipes' ends (the child exited) for up to ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))


class Processes:
    """Child processes started by this one, stopped (TERM, then KILL) a group at a time, the last started
    group first: processes started one after the other with the same ``ready`` line (the workers, the
    master's replicas) are one group, signalled together and waited for together. What a child writes
    after its ready line is copied to this process's output (:class:`_Relay`)."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []
        self._kinds: list[str] = []
        self._launches: list[tuple[list[str], dict]] = []     # per process: its argv and Popen's keywords
        self._relays: dict[int, _Relay] = {}                   # pid -> its output's relay
        self._started_at: dict[int, float] = {}               # index -> when its process was started
        self._due: dict[int, float] = {}                      # index -> when to start its failed process again
        self._streak: dict[int, tuple[tuple[str, str], int]] = {}   # index -> (exit reason, failures in a row)

    def _spawn(self, argv: list[str], kw: dict, timeout_s: float) -> tuple[subprocess.Popen, str | None]:
        """The process started, and the first line it printed (its ``ready`` line when it serves; None: killed
        for saying nothing in time, see :meth:`_first_line`)."""
        p = self._popen(argv, kw)
        return p, self._first_line(p, time.monotonic() + timeout_s)

    def _popen(self, argv: list[str], kw: dict) -> subprocess.Popen:
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, **({"stderr": subprocess.PIPE} | kw))
        self._relays[p.pid] = _Relay(p)
        return p

    def _first_line(self, p: subprocess.Popen, deadline: float) -> str | None:
        """The first line ``p`` printed (``""``: it closed its output). A process that has printed no line by
        ``deadline`` is killed and None returned: a start that hangs (a master that never answers its registration, a store that never
        answers) must not hang the run that waits for it."""
        first: list[bytes] = []
        reader = threading.Thread(target=lambda: first.append(p.stdout.readline()), name="millwheel-child-ready",
                                  daemon=True)
        reader.start()
        reader.join(max(0.0, deadline - time.monotonic()))
        if not first:
            p.kill()
            p.wait()
            self._relays[p.pid].join(2.0)
            reader.join(2.0)          # (it reads the end of the output now)
            p.stdout.close()
            return None
        self._relays[p.pid].start_stdout()
        return first[0].decode(errors="replace")

    def last_line(self, p: subprocess.Popen) -> str:
        """The last line ``p`` wrote on stderr (once it exited: all of it read), or ``""``."""
        relay = self._relays.get(p.pid)
        if relay is None:
            return ""
        relay.join(2.0)
        return relay.last

    def start(self, argv: list[str], ready: str, timeout_s: float = START_TIMEOUT_S,
              **kw) -> tuple[subprocess.Popen, str]:
        return self.start_all([argv], ready, timeout_s, **kw)[0]

    def start_all(self, argvs: list[list[str]], ready: str, timeout_s: float = START_TIMEOUT_S,
                  **kw) -> list[tuple[subprocess.Popen, str]]:
        """Start one process per argv at once (one group: they start side by side instead of each waiting for
        the one before to serve), then wait for each one's ``ready`` line in turn, all within ``timeout_s`` of
        their start; returns each process and the rest of its ready line. Raises :class:`ChildDidNotStart` for
        the first that did not start (killed if it runs on; the others are in :attr:`procs`, stopped by
        :meth:`stop`)."""
        started = []
        for argv in argvs:
            started.append((len(self.procs), p := self._popen(argv, kw)))
            self.procs.append(p)
            self._kinds.append(ready)
            self._launches.append((argv, kw))
        deadline = time.monotonic() + timeout_s
        out = []
        for i, p in started:
            line = self._first_line(p, deadline)
            self._started_at[i] = time.monotonic()
            if line is None or not line.startswith(ready):
                what = ready.split(" serving on")[0]
                if line is None:
                    raise ChildDidNotStart(f"a {what} process (pid {p.pid}) had not said it serves {timeout_s:.0f} "
                                           "s after its start and was killed; its own messages are above")
                try:
                    p.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
                self.last_line(p)        # its own message, copied before ours
                raise ChildDidNotStart(f"a {what} process (pid {p.pid}) did not start (exit {p.returncode}"
                                       + (f", it said {line.strip()!r}" if line.strip() else "")
                                       + "); its own message is above")
            out.append((p, line[len(ready):].strip()))
        return out

    def restart_exited(self, ready: str) -> list[str]:
        """Start each process of kind ``ready`` that has failed (exited with a status other than 0, or killed)
        again, in its place; one that exited 0 was asked to stop (SIGTERM, or a Ctrl-C reaching the whole
        process group) and is left. The first start again waits :data:`RESTART_FIRST_S`, each further
        failure in a row twice as long (at most :data:`RESTART_CAP_S`); the :data:`FAILED_STARTS`-th failure
        in a row for the same reason raises :class:`KeepsFailing` (a process that ran :data:`HEALTHY_S`
        before it failed starts a new count). Returns one line per process, saying what happened."""
        said = []
        now = time.monotonic()
        for i, (p, kind) in enumerate(zip(self.procs, self._kinds)):
            if kind != ready or p.poll() is None or p.returncode == 0:
                continue
            due = self._due.get(i)
            if due is None:                 # a failure seen for the first time
                reason = (exit_text(p.returncode), self.last_line(p))
                was, n = self._streak.get(i, (None, 0))
                n = n + 1 if was == reason and now - self._started_at.get(i, 0.0) < HEALTHY_S else 1
                self._streak[i] = (reason, n)
                if n >= FAILED_STARTS:
                    raise KeepsFailing(f"worker pid {p.pid} failed {n} times in a row, each time with {reason[0]}"
                                       + (f", saying: {reason[1]}" if reason[1] else "")
                                       + "; not started again (what was committed stays: once the cause is "
                                       "fixed, running the same command again goes on from there)")
                due = self._due[i] = now + min(RESTART_CAP_S, RESTART_FIRST_S * 2 ** (n - 1))
            if now < due:
                continue
            del self._due[i]
            self._relays.pop(p.pid, None)
            new, line = self._spawn(*self._launches[i], START_TIMEOUT_S)
            self._started_at[i] = time.monotonic()
            self.procs[i] = new
            if line is not None and line.startswith(ready):
                said.append(f"pid {p.pid} exited with {exit_text(p.returncode)}; started pid {new.pid} in its "
                            f"place, serving on {line[len(ready):].strip()}")
            else:
                said.append(f"pid {p.pid} exited with {exit_text(p.returncode)}; pid {new.pid} started in its "
                            f"place did not start (exit {new.poll()}); trying again")
        return said

    def groups(self) -> list[list[subprocess.Popen]]:
        """The processes in stopping order: groups of the same kind, the last started first."""
        out: list[list[subprocess.Popen]] = []
        last = None
        for p, kind in zip(self.procs, self._kinds):
            if kind != last:
                out.append([])
                last = kind
            out[-1].append(p)
        return out[::-1]

    def stop(self, timeout_s: float = 20.0) -> list[int]:
        """Each group in turn (workers leave while the master still answers): SIGTERM to all of it, then
        wait up to ``timeout_s`` for all of it; returns the pids that did not end in time and were killed
        (no exit handler ran)."""
        killed = []
        for group in self.groups():
            for p in group:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            for p in group:
                try:
                    p.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=10)
                    killed.append(p.pid)
                relay = self._relays.pop(p.pid, None)
                if relay is not None:
                    relay.join(2.0)       # (the pipes close at their end)
        return killed


def exit_text(code: int | None) -> str:
    """A child's ``returncode`` as words: ``signal SIGKILL`` or ``status 1``."""
    return f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"status {code}"


def start_masters(procs: Processes, specs: list[str]) -> list[str]:
    """The master's replicas, started side by side (each waits for the others' Raft addresses anyway)."""
    parsed = [MasterSpec.from_json(text) for text in specs]
    procs.start_all([spec.argv() for spec in parsed], "millwheel master serving on ")
    return [spec.grpc_address for spec in parsed]


def worker_argv(cluster: Path, threads: int | None = None) -> list[str]:
    argv = [sys.executable, "-m", "millwheel.cli", "worker", "--cluster", str(cluster)]
    if threads:
        argv += ["--threads", str(threads)]
    return argv


def worker_status(address: str, timeout_s: float = 2.0, thread_cpu: bool = False) -> dict:
    """A worker's status (``WorkerHost.status``); ``thread_cpu``: with its CPU by thread kind."""
    channel = open_channel(address, [])
    try:
        reply = wpb_grpc.WorkerStub(channel).Status(wpb.WorkerStatusRequest(thread_cpu=thread_cpu),
                                                     timeout=timeout_s)
        return json.loads(reply.status_json)
    except grpc.RpcError as e:
        return {"address": address, "unreachable": e.code().name}
    finally:
        channel.close()


def known_workers(out, client: MasterClient | None) -> list[str]:
    """Addresses of the workers: those announced under ``<out>`` and every owner in the master's map."""
    addresses = set()
    folder = Path(out).resolve() / ".millwheel" / "workers"
    for f in folder.glob("*.json") if folder.exists() else ():
        try:
            addresses.add(json.loads(f.read_text())["address"])
        except (OSError, ValueError, KeyError):
            continue
    if client is not None:
        addresses.update(iv.address for iv in client.interval_map() if iv.address)
    return sorted(addresses)


def cluster_status(cf: ClusterFile, client: MasterClient) -> dict:
    """Everything ``millwheel status`` shows, as one dict."""
    replicas = client.status()
    leader = next((r.get("address") for r in replicas if r.get("is_leader")), None)
    intervals = client.interval_map()
    workers = [worker_status(a) for a in known_workers(cf.out, client)]
    live = [w for w in workers if "unreachable" not in w]
    lows: dict[str, int] = {}
    for w in live:
        for n, v in w.get("low_watermarks_us", {}).items():
            lows[n] = max(v, lows.get(n, 0))
    now_us = time.time_ns() // 1000
    rate = sum(iv["records_per_s"] for w in live for iv in w["intervals"])
    return {
        "leader": leader, "masters": replicas,
        "workers": live, "unreachable": [w for w in workers if "unreachable" in w],
        "intervals": [{"computation": iv.computation, "lo": iv.lo, "hi": iv.hi, "worker": iv.worker,
                       "address": iv.address, "sequencer": iv.sequencer} for iv in intervals],
        "watermarks": {n: {"low_watermark_us": v, "lag_s": round((now_us - v) / 1e6, 3) if v > 0 else None}
                       for n, v in sorted(lows.items())},
        "records_per_s": round(rate, 1),
        "set_aside": sum(w.get("counters", {}).get("set_aside", 0) for w in live),
    }


def cluster_idle(topology, out, client: MasterClient) -> bool:
    """Every interval has a live owner, every worker answers and is idle, and every injector is held by
    one and caught up."""
    intervals = client.interval_map()
    if not intervals or any(not iv.worker for iv in intervals):
        return False
    owners = {iv.address for iv in intervals}
    statuses = [worker_status(a) for a in known_workers(out, client)]
    # a worker that does not answer and owns nothing is gone (killed: its announcement stays behind)
    statuses = [s for s in statuses if "unreachable" not in s or s["address"] in owners]
    if not statuses or any("unreachable" in s or not s["idle"] for s in statuses):
        return False
    # every interval is held by its owner under the map's sequencer (an owner learns at its next heartbeat)
    holding = {(iv["computation"], iv["lo"], iv["sequencer"]) for s in statuses for iv in s["intervals"]}
    if any((iv.computation, iv.lo, iv.sequencer) not in holding for iv in intervals):
        return False
    held = {n for s in statuses for n, i in s["injectors"].items() if i["caught_up"]}
    return held >= set(topology.injectors)


def wait_cluster_idle(topology, out, client: MasterClient, stop, timeout_s: float | None = None,
                      tick=None) -> None:
    """Returns once :func:`cluster_idle` holds at two looks apart; ``tick`` (if given) is called at every
    look (``millwheel run`` starts exited workers again there)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not stop.is_set():
        if tick is not None:
            tick()
        if cluster_idle(topology, out, client):
            stop.wait(0.3)   # settle: idle at two looks apart
            if cluster_idle(topology, out, client):
                return
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError("millwheel cluster not idle")
        stop.wait(0.2)
    raise KeyboardInterrupt


