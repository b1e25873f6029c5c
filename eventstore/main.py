"""``python -m eventstore.main --config C --region R --port P``: one region's CacheEventStore process.

Prints ``eventstore <region> serving on <host:port>`` once ready; stops cleanly (exit 0) on SIGTERM/SIGINT.
"""
from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from photon import ConfigError, load_config

from eventstore._server import serve


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eventstore.main", description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="photon.toml")
    p.add_argument("--region", required=True, help="region whose primary logs to serve")
    p.add_argument("--port", type=int, default=0, help="port to bind (0: a free port, printed on start)")
    p.add_argument("--host", default=None, help="address to bind (default: [eventstore].host)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    stop = threading.Event()  # a SIGTERM during startup stops the process right after it
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        config = load_config(args.config)
        server = serve(config, args.region, port=args.port, host=args.host)
    except (ConfigError, OSError) as e:
        print(f"eventstore: {e}", file=sys.stderr)
        return 2
    print(f"eventstore {args.region} serving on {server.address}", flush=True)
    while not stop.wait(1.0):
        pass
    server.stop()
    logging.getLogger("photon.eventstore").info("eventstore %s stopped: %s", args.region, server.statistics())
    return 0


if __name__ == "__main__":
    sys.exit(main())
