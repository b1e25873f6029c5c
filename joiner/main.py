"""``python -m joiner.main --config C --region R --name R-j0 --port P --eventstore HOST:PORT[,...]
[--logstore HOST:PORT[,...]] --registry EP[,EP...]``: one joiner process.

Prints ``joiner <name> serving on <host:port>`` once ready. On SIGTERM/SIGINT: stops accepting requests,
finishes those in flight, rolls (publishes) its output file and exits 0.
"""
from __future__ import annotations

import argparse
import sys

from photon import load_config, run_service, settle_gc

from joiner._server import serve


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m joiner.main", description="One Photon joiner process.")
    p.add_argument("--config", required=True, help="photon.toml")
    p.add_argument("--region", required=True, help="the joiner's region")
    p.add_argument("--name", required=True, help="the joiner's name, e.g. <region>-j0 (prefix of its output files)")
    p.add_argument("--port", type=int, default=0, help="port to bind (0: a free port, printed on start)")
    p.add_argument("--host", default=None, help="address to bind (default: [joiner].host)")
    p.add_argument("--eventstore", required=True, help="the region's event store, host:port")
    p.add_argument("--logstore", default="", help="the region's logs stores, host:port, comma-separated")
    p.add_argument("--registry", required=True, help="registry endpoints, comma-separated (or memory://)")
    args = p.parse_args(argv)
    def start():
        server = serve(load_config(args.config), args.region, args.name, eventstore=args.eventstore,
                       registry=args.registry, port=args.port, host=args.host, logstore=args.logstore)
        settle_gc()           # see photon._gc
        return server

    return run_service(f"joiner {args.name}", start, region=args.region)


if __name__ == "__main__":
    sys.exit(main())
