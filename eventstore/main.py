"""``python -m eventstore.main --config C --region R --port P [--shard N | --logs]``: one event store process.

A cache server (shard N of ``[eventstore].cache_servers``, default 0) or, with ``--logs``, a LogsEventStore.

Prints ``eventstore <region> serving on <host:port>`` once ready; stops cleanly (exit 0) on SIGTERM/SIGINT.
"""
from __future__ import annotations

import argparse
import sys

from photon import load_config, run_service

from eventstore._server import serve, serve_logs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eventstore.main", description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="photon.toml")
    p.add_argument("--region", required=True, help="region whose primary logs to serve")
    p.add_argument("--port", type=int, default=0, help="port to bind (0: a free port, printed on start)")
    p.add_argument("--host", default=None, help="address to bind (default: [eventstore].host)")
    p.add_argument("--shard", type=int, default=0, help="which cache server of the region (0-based)")
    p.add_argument("--logs", action="store_true", help="run the region's LogsEventStore instead of a cache server")
    args = p.parse_args(argv)
    if args.logs:
        return run_service(f"logstore {args.region}", lambda: serve_logs(load_config(args.config), args.region,
                                                                         port=args.port, host=args.host),
                           region=args.region)
    return run_service(f"eventstore {args.region}", lambda: serve(load_config(args.config), args.region,
                                                                  port=args.port, host=args.host, shard=args.shard),
                       region=args.region)


if __name__ == "__main__":
    sys.exit(main())
