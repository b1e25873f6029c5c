"""Entry point of one registry replica process: ``python -m idregistry.main --spec '<json>'``.

The launcher builds the argv with :func:`idregistry.registry_processes`; the process stops cleanly on SIGTERM.
"""
from __future__ import annotations

import argparse
import logging
import sys

from idregistry._server import serve
from idregistry._shell import spec_from_json


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="idregistry.main", description="run one IdRegistry replica")
    parser.add_argument("--spec", required=True, help="the replica's spec as JSON (from registry_processes)")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    serve(spec_from_json(args.spec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
