"""``python -m joiner.main --config C --region R --name R-j0 --port P --eventstore HOST:PORT
--registry EP[,EP...]``: one joiner process.

Prints ``joiner <name> serving on <host:port>`` once ready. On SIGTERM/SIGINT: stops accepting requests,
finishes those in flight, rolls (publishes) its output file and exits 0.
"""
from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from photon import ConfigError, load_config

from joiner._server import serve


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m joiner.main", description="One Photon joiner process.")
    p.add_argument("--config", required=True, help="photon.toml")
    p.add_argument("--region", required=True, help="the joiner's region")
    p.add_argument("--name", required=True, help="the joiner's name, e.g. <region>-j0 (prefix of its output files)")
    p.add_argument("--port", type=int, default=0, help="port to bind (0: a free port, printed on start)")
    p.add_argument("--host", default=None, help="address to bind (default: [joiner].host)")
    p.add_argument("--eventstore", required=True, help="the region's event store, host:port")
    p.add_argument("--registry", required=True, help="registry endpoints, comma-separated (or memory://)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    stop = threading.Event()  # a SIGTERM during startup stops the process right after it
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        config = load_config(args.config)
        server = serve(config, args.region, args.name, eventstore=args.eventstore, registry=args.registry,
                       port=args.port, host=args.host)
    except (ConfigError, OSError) as e:
        print(f"joiner {args.name}: {e}", file=sys.stderr)
        return 2
    print(f"joiner {args.name} serving on {server.address}", flush=True)
    while not stop.wait(1.0):
        pass
    server.stop()
    logging.getLogger("photon.joiner").info("joiner %s stopped: %s", args.name, server.statistics())
    return 0


if __name__ == "__main__":
    sys.exit(main())
