"""``python -m dispatcher.main --config C --region R --joiners HOST:PORT[,...] [--registry EP[,...]]``

Runs one region's dispatcher until SIGTERM or SIGINT, then checkpoints, rolls the unjoinable output and
exits 0 (1 if the dispatcher failed, 2 on a bad command line or configuration).
"""
from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time

from photon import METRICS_AFTER_S, ConfigError, MetricKinds, load_config, serve_metrics_of, settle_gc

from dispatcher._files import DispatcherLocked
from dispatcher._shell import serve
from dispatcher._state import _COUNTERS


METRIC_KINDS = MetricKinds(
    counters=frozenset(_COUNTERS),
    gauges=frozenset({"retry_queue", "queued", "in_flight", "requests_in_flight", "pending_bytes", "caught_up",
                      "scan_at_us", "pid", "oldest_unresolved_us", "held_for_owner", "held_found_present",
                      "held_joined", "held_wasted", "held_again", "held_late", "share_judged_down",
                      "waiting_for_store", "ahead_of_store"}),
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
    settle_gc()               # its unresolved clicks never form cycles: see photon._gc
    metrics_at = time.monotonic() + METRICS_AFTER_S     # see METRICS_AFTER_S: the first second goes to the work
    while not stop.wait(0.2) and dispatcher.running:
        if metrics_at is not None and time.monotonic() >= metrics_at:
            serve_metrics_of(f"dispatcher {args.region}", dispatcher.statistics, kinds=METRIC_KINDS,
                             region=args.region)
            metrics_at = None
    dispatcher.stop()
    return 1 if dispatcher.error is not None else 0


if __name__ == "__main__":
    sys.exit(main())
