"""``python -m eventstore.main --config C --region R --port P [--shard N | --logs]``: one event store process.

A cache server (shard N of ``[eventstore].cache_servers``, default 0) or, with ``--logs``, a LogsEventStore.

Prints ``eventstore <region> serving on <host:port>`` once ready; stops cleanly (exit 0) on SIGTERM/SIGINT.
"""
from __future__ import annotations

import argparse
import sys

from photon import load_config, run_service, settle_gc

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

    def start():
        config = load_config(args.config)
        if args.logs:
            server = serve_logs(config, args.region, port=args.port, host=args.host)
        else:
            server = serve(config, args.region, port=args.port, host=args.host, shard=args.shard)
        settle_gc()           # see photon._gc
        return server

    return run_service(f"{'logstore' if args.logs else 'eventstore'} {args.region}", start, region=args.region)


if __name__ == "__main__":
    sys.exit(main())
