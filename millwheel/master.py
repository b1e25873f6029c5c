"""Entry point of one MillWheel master replica: ``python -m millwheel.master --spec '<json>'``.

The spec comes from :func:`millwheel.master_specs` (``MasterSpec.argv()`` builds the whole command line).
The process prints ``millwheel master serving on <address>`` once it serves and stops cleanly on SIGTERM;
a journal, vote record or snapshot that cannot be made durable stops it with exit status 75.
"""
from __future__ import annotations

import argparse
import faulthandler
import logging
import sys

from millwheel._config import MillWheelConfigError
from millwheel._exit import exit_bounded
from millwheel._master import MasterSpec, serve_master


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="millwheel.master", description="run one MillWheel master replica")
    parser.add_argument("--spec", required=True, help="the replica's spec as JSON (MasterSpec.to_json())")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    faulthandler.enable()
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        spec = MasterSpec.from_json(args.spec)
        serve_master(spec)
    except (OSError, MillWheelConfigError, ValueError, TypeError) as e:
        print(f"millwheel master: refusing to start: {e}", file=sys.stderr, flush=True)
        return 2
    return exit_bounded(0, "millwheel master")


if __name__ == "__main__":
    sys.exit(main())
