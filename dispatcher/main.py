"""``python -m dispatcher.main --config C --region R --joiners HOST:PORT[,...] [--registry EP[,...]]``

Runs one region's dispatcher until SIGTERM or SIGINT, then checkpoints, rolls the unjoinable output and
exits 0 (1 if the dispatcher failed, 2 on a bad command line or configuration).
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from photon import ConfigError, MetricKinds, load_config, serve_metrics

from dispatcher._files import DispatcherLocked
from dispatcher._shell import serve
from dispatcher._state import _COUNTERS


METRIC_KINDS = MetricKinds(
    counters=frozenset(_COUNTERS),
    gauges=frozenset({"retry_queue", "queued", "in_flight", "requests_in_flight", "pending_bytes", "caught_up",
                      "scan_at_us", "pid", "oldest_unresolved_us", "held_for_owner", "held_found_present",
                      "held_joined", "held_wasted", "held_again", "held_late", "share_judged_down",
                      "waiting_for_store"}),
    latency_histograms={"join_latency_hist": "join_latency_seconds"},
    skip=frozenset({"join_latency_ms", "share_grace_ms"}))
"""How :class:`DispatcherStatistics` is exposed: its counters (cumulative across restarts, as
checkpointed), its gauges, and every join's latency as a histogram in seconds (``join_latency_ms``, the
percentiles of the last joins, is left to the status file: Prometheus derives them from the histogram)."""


def _list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dispatcher.main", description=__doc__.split("\n")[2])
    parser.add_argument("--config", required=True, help="photon.toml")
    parser.add_argument("--region", required=True, help="the region whose foreign logs to dispatch")
    parser.add_argument("--joiners", required=True, type=_list, help="HOST:PORT[,HOST:PORT...] of the joiners")
    parser.add_argument("--registry", type=_list, default=[],
                        help="IdRegistry endpoints EP[,EP...] (omitted: no lookups, the joiners' commits decide)")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not args.joiners:
        parser.error("--joiners needs at least one HOST:PORT")
    try:
        config = load_config(args.config)
        config.region(args.region)
    except ConfigError as e:
        print(f"dispatcher: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        dispatcher = serve(config, args.region, args.joiners, args.registry or None)
    except DispatcherLocked as e:
        print(f"dispatcher: {e}", file=sys.stderr)
        return 1
    except ConfigError as e:      # e.g. the log or output location on S3 cannot be used
        print(f"dispatcher: {e}", file=sys.stderr)
        return 2
    try:
        serve_metrics("dispatcher", dispatcher.statistics, kinds=METRIC_KINDS, region=args.region,
                      process=os.environ.get("PHOTON_PROCESS") or f"dispatcher {args.region}")
    except OSError as e:
        logging.getLogger("dispatcher").warning("metrics not served: %s", e)
    while not stop.wait(0.2) and dispatcher.running:
        pass
    dispatcher.stop()
    return 1 if dispatcher.error is not None else 0


if __name__ == "__main__":
    sys.exit(main())
