"""Entry point of one registry replica process: ``python -m idregistry.main --spec '<json>'``.

The launcher builds the argv with :func:`idregistry.registry_processes`; the process stops cleanly on SIGTERM.
It exits with :data:`~idregistry._replica.EXIT_DATA_DIR_IN_USE` (73), saying which process holds it, when
another live replica holds its data dir.
"""
from __future__ import annotations

import argparse
import faulthandler
import logging
import sys

from idregistry._replica import EXIT_DATA_DIR_IN_USE, DataDirInUse
from idregistry._server import serve
from idregistry._spec import spec_from_json


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="idregistry.main", description="run one IdRegistry replica")
    parser.add_argument("--spec", required=True, help="the replica's spec as JSON (from registry_processes)")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    faulthandler.enable()    # a fatal signal (SIGBUS, SIGSEGV) still says where, in this replica's log
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    spec = spec_from_json(args.spec)
    try:
        serve(spec)
    except DataDirInUse as e:
        print(f"registry shard {spec.shard} replica {spec.replica} not started: {e}", file=sys.stderr, flush=True)
        return EXIT_DATA_DIR_IN_USE
    except OSError as e:        # a port taken, a Raft secret that cannot be had under [tls], a disk refused
        print(f"registry shard {spec.shard} replica {spec.replica}: refusing to start: {e}", file=sys.stderr,
              flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
