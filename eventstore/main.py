"""``python -m eventstore.main --config C --region R --port P``: one region's CacheEventStore process.

Prints ``eventstore <region> serving on <host:port>`` once ready; stops cleanly (exit 0) on SIGTERM/SIGINT.
"""
from __future__ import annotations

import argparse
import sys

from photon import load_config, run_service

from eventstore._server import serve


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eventstore.main", description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="photon.toml")
    p.add_argument("--region", required=True, help="region whose primary logs to serve")
    p.add_argument("--port", type=int, default=0, help="port to bind (0: a free port, printed on start)")
    p.add_argument("--host", default=None, help="address to bind (default: [eventstore].host)")
    args = p.parse_args(argv)
    return run_service(f"eventstore {args.region}", lambda: serve(load_config(args.config), args.region, port=args.port, host=args.host))


if __name__ == "__main__":
    sys.exit(main())
