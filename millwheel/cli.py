"""``millwheel`` command line.

    millwheel run MODULE --input DIR --out DIR [--until-idle] [--store URL] [--threads N]
                  [--option NAME=VALUE ...]

``MODULE`` is an importable module (``examples.ad_windows`` is looked up as
``millwheel.examples.ad_windows`` too) defining ``build(input, out) -> Topology``. The state store
defaults to ``sqlite:///<out>/.millwheel/state.db``, so running the same command again resumes where
the last run stopped (or was killed). With ``--until-idle`` the command returns once the input is
consumed and every timer due by the final watermark has fired.
"""
from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading
from pathlib import Path

from millwheel._config import MillWheelConfigError, RuntimeConfig
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
    options.setdefault("store", args.store or f"sqlite:///{Path(args.out).resolve() / '.millwheel' / 'state.db'}")
    if args.threads:
        options["threads"] = args.threads
    rt = Runtime(topology, RuntimeConfig.from_mapping(options))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    rt.start()
    try:
        if args.until_idle:
            rt.run_until_idle()
        else:
            while not stop.wait(0.2) and rt.error is None:
                pass
            if rt.error is not None:
                raise rt.error
    finally:
        rt.stop()
    s = rt.statistics()
    print(f"millwheel: injected {s.injected} records; "
          + "; ".join(f"{n}: {c.records_processed} processed, {c.duplicates_dropped} duplicates, "
                      f"{c.late_records} late, {c.timers_fired} timers" for n, c in s.computations.items()),
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
    p.add_argument("--store", help="state store URL (default sqlite:///<out>/.millwheel/state.db)")
    p.add_argument("--threads", type=int, help="worker threads")
    p.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                   help="any runtime option (see docs/millwheel.md)")
    args = parser.parse_args(argv)
    try:
        return run(args)
    except MillWheelConfigError as e:
        print(f"millwheel: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
