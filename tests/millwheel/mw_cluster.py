"""``millwheel run MODULE --workers N`` as a child process for tests: three master replicas and N worker
processes on a PostgreSQL store, with the run's cluster file, a master client and the checks every
process test makes (the windows equal the batch answer, each window once)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path

from millwheel import MasterClient
from millwheel._cluster import ClusterFile, cluster_path, known_workers, wait_cluster_idle, worker_status
from photon import wait_until

from mw_helpers import batch_windows, read_windows, write_joined

HERE = Path(__file__).resolve().parent

# Deadlines for conditions that only take long on a loaded machine: starting three master replicas and two
# worker processes (one after the other, each importing grpc, psycopg and the rest) took 24 s at a load
# average of 25 on the 2-core development machine, and did not finish within 90 s at a load of 30-44.
START_S = 240

LEASE = "lease_us=2000000"


def window_key(w: dict) -> tuple:
    return (w["advertiser_id"], w["window_start_us"])


def check_windows(got: list[dict], expected_events: list[dict]) -> None:
    """The windows written equal the batch answer over ``expected_events``, each window once. A failure
    says which windows differ (see :func:`windows_difference`)."""
    keys = [window_key(w) for w in got]
    expected = batch_windows(expected_events)
    assert len(keys) == len(set(keys)), f"a window written twice: {windows_difference(got, expected)}"
    assert {window_key(w): w["clicks"] for w in got} == expected, \
        f"the windows differ from the batch: {windows_difference(got, expected)}"


def windows_difference(got: list[dict], expected: dict[tuple[str, int], int], limit: int = 20) -> str:
    """The windows ``got`` (in the order written) that differ from ``expected`` (clicks per (advertiser,
    window start)): missing, extra, written more than once (each line number), and with wrong counts, each
    as advertiser, window start (µs and UTC minute) and clicks; at most ``limit`` of each kind."""
    lines: dict[tuple, list[int]] = {}
    clicks: dict[tuple, list[int]] = {}
    for n, w in enumerate(got, 1):
        lines.setdefault(window_key(w), []).append(n)
        clicks.setdefault(window_key(w), []).append(w["clicks"])

    def name(key: tuple) -> str:
        minute = datetime.fromtimestamp(key[1] / 1e6, timezone.utc).strftime("%Y-%m-%d %H:%M")
        return f"({key[0]}, {key[1]} = {minute})"

    def some(items: list) -> str:
        return "; ".join(items[:limit]) + (f"; and {len(items) - limit} more" if len(items) > limit else "")

    missing = sorted(k for k in expected if k not in lines)
    extra = sorted(k for k in lines if k not in expected)
    doubled = sorted(k for k, at in lines.items() if len(at) > 1)
    wrong = sorted(k for k in lines if k in expected and any(c != expected[k] for c in clicks[k]))
    return (f"{len(got)} window lines, {len(expected)} expected; "
            f"missing {len(missing)}: [{some([f'{name(k)} {expected[k]} clicks' for k in missing])}]; "
            f"extra {len(extra)}: [{some([f'{name(k)} {clicks[k]} clicks, lines {lines[k]}' for k in extra])}]; "
            f"doubled {len(doubled)}: [{some([f'{name(k)} clicks {clicks[k]}, lines {lines[k]}' for k in doubled])}]; "
            f"wrong counts {len(wrong)}: [{some([f'{name(k)} {clicks[k]} clicks, {expected[k]} expected, lines {lines[k]}' for k in wrong])}]")


def stop_run(proc: subprocess.Popen) -> None:
    """A ``millwheel run`` child stopped as a user would (Ctrl-C), killed if it does not stop within a minute."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


class ClusterRun:
    """One ``millwheel run`` of ``module`` (``examples.ad_windows`` or a module beside the tests) over
    ``n_clicks`` joined clicks in ``files`` files. ``poison``: the index of the click that
    ``mw_poison_windows`` raises on (left out of the expected answer). ``until_idle``: the run returns once
    idle; ``new_session``: the run leads a process group of its own (for a Ctrl-C to the whole group)."""

    def __init__(self, tmp: Path, store: str, *, workers: int = 2, n_clicks: int = 4000, files: int = 8,
                 module: str = "examples.ad_windows", names: list[str] | None = None,
                 master_options: tuple[str, ...] = (), options: tuple[str, ...] = ("injector_batch=200",),
                 poison: int | None = None, until_idle: bool = False, new_session: bool = False) -> None:
        self.input, self.out = tmp / "in", tmp / "out"
        self.events = write_joined(self.input, n_clicks, files, names=names)
        self.poison = None if poison is None else self.events[poison]
        self.expected = [e for e in self.events if e is not self.poison]
        self.module = module
        argv = [sys.executable, "-m", "millwheel.cli", "run", module, "--input", str(self.input), "--out",
                str(self.out), "--workers", str(workers), "--store", store, "--master-option", LEASE,
                "--option", "retry_delay_us=500000"]
        for o in master_options:
            argv += ["--master-option", o]
        for o in options:
            argv += ["--option", o]
        if until_idle:
            argv.append("--until-idle")
        env = dict(os.environ)
        if self.poison is not None:
            env["MW_POISON_CLICK"] = self.poison["click_id"]
        env["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(HERE)) if p)
        self.log = open(tmp / "run.log", "wb")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=new_session)
        self.client = None
        try:
            wait_until(lambda: cluster_path(self.out).exists() or self.proc.poll() is not None, START_S,
                       message="the cluster file")
            self.cluster = ClusterFile.load(cluster_path(self.out))
            self.client = MasterClient(self.cluster.masters, retry_timeout_s=30.0)
            wait_until(lambda: len(self.workers()) == workers, START_S, message=f"{workers} workers answering")
        except BaseException as e:
            self.close()      # the run and everything it started stop, also when it did not start
            if isinstance(e, TimeoutError):
                tail = (tmp / "run.log").read_bytes()[-4000:].decode(errors="replace")
                raise TimeoutError(f"{e}; the run's log ends:\n{tail}") from e
            raise

    def workers(self) -> list[dict]:
        return [s for s in (worker_status(a) for a in known_workers(self.out, None)) if "unreachable" not in s]

    def processed(self, computation: str = "windows") -> int:
        return sum(w["computations"].get(computation, {}).get("records", 0) for w in self.workers())

    def windows(self) -> list[dict]:
        return read_windows(self.out / "windows.jsonl")

    def topology(self):
        sys.path.insert(0, str(HERE))
        try:
            module = __import__(f"millwheel.{self.module}", fromlist=["build"]) if "." in self.module \
                else __import__(self.module)
        finally:
            sys.path.remove(str(HERE))
        return module.build(str(self.input), str(self.out))

    def wait_idle(self, timeout: float = 300) -> None:
        try:
            wait_cluster_idle(self.topology(), self.out, self.client, threading.Event(), timeout)
        except TimeoutError:
            raise TimeoutError(f"not idle after {timeout} s: {self.why_busy()}") from None

    def why_busy(self) -> str:
        """What the workers and the master say, for a run that does not get idle."""
        workers = [{k: w.get(k) for k in ("worker", "busy", "injectors", "counters", "error", "in_flight",
                                          "outstanding", "low_watermarks_us", "computations")}
                   | {"intervals": [(iv["computation"], iv["lo"], iv["sequencer"]) for iv in w["intervals"]]}
                   for w in self.workers()]
        owners = [(iv.computation, iv.lo, iv.worker, iv.sequencer) for iv in self.client.interval_map()]
        return json.dumps({"workers": workers, "map": owners})

    def check(self) -> None:
        check_windows(self.windows(), self.expected)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        stop_run(self.proc)
        self.log.close()
