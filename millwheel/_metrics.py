"""A worker process's Prometheus metrics, read from its status (``WorkerHost.status``) at every scrape.

``millwheel worker`` serves them at ``--metrics-port`` on its ``--host`` (a free port by default; the address
is in the worker's announcement and in ``millwheel status``), through :func:`photon.serve_metrics`, so they
read like every Photon process's: counters ``photon_millwheel_worker_<field>_total``, gauges
``photon_millwheel_worker_<field>``, labels ``region`` (empty), ``component`` and ``process`` (the worker's
name). :func:`worker_metrics` turns a status into flat fields; :data:`METRIC_KINDS` says which are counters.
"""
from __future__ import annotations

from typing import Any

from millwheel._watermarks import END_OF_TIME, NO_WATERMARK
from photon import MetricKinds

COMPONENT = "millwheel_worker"

PER_COMPUTATION = ("records", "duplicates", "late", "timers", "set_aside")
"""Counters of a worker's computations, each one family with a ``computation`` label."""

METRIC_KINDS = MetricKinds(
    counters=frozenset({*PER_COMPUTATION, "events", "transport", "store", "cache_hits", "cache_misses",
                        "cache_evictions", "cache_invalidations", "dedup_gc_rounds", "dedup_gc_deleted"}),
    gauges=frozenset({"low_watermark_seconds", "input_watermark_seconds", "watermark_lag_seconds", "intervals",
                      "interval_records_per_s",
                      "records_per_s", "in_flight", "outstanding", "idle", "settled", "cache_hot_keys",
                      "cache_pending_window_keys", "uptime_s", "failed"}),
    labels={**dict.fromkeys(PER_COMPUTATION, "computation"), "low_watermark_seconds": "computation",
            "input_watermark_seconds": "computation", "watermark_lag_seconds": "computation", "intervals": "computation",
            "interval_records_per_s": "computation", "events": "event", "transport": "counter",
            "store": "counter"},
)


def worker_metrics(status: dict[str, Any], now_us: int) -> dict[str, Any]:
    """The fields of a worker's metrics, from its ``status()`` read at ``now_us`` (wall clock): per
    computation (records, duplicates, late records, timers fired, records set aside; its low and input
    watermarks in seconds since the epoch and the low watermark's lag behind ``now_us`` (none for a
    computation whose watermark is 0 or the end of time); intervals held and their records/s), the
    process's events (``counters``: fenced commits, stale routes, lost incarnations, ...), the transport's
    and the store's counters, the cache's, what is in flight and unacked, idle and settled."""
    comps = status.get("computations", {})
    out: dict[str, Any] = {name: {c: int(v.get(name, 0)) for c, v in comps.items()} for name in PER_COMPUTATION}
    lows = status.get("low_watermarks_us", {})
    out["low_watermark_seconds"] = {c: _seconds(v) for c, v in lows.items()}
    out["input_watermark_seconds"] = {c: _seconds(v) for c, v in status.get("input_watermarks_us", {}).items()}
    out["watermark_lag_seconds"] = {c: max(0, now_us - v) / 1e6 for c, v in lows.items()
                                    if NO_WATERMARK < v < END_OF_TIME}
    held: dict[str, int] = {}
    rates: dict[str, float] = {}
    for iv in status.get("intervals", ()):
        held[iv["computation"]] = held.get(iv["computation"], 0) + 1
        rates[iv["computation"]] = rates.get(iv["computation"], 0.0) + iv.get("records_per_s", 0.0)
    out["intervals"], out["interval_records_per_s"] = held, rates
    out["records_per_s"] = sum(rates.values())
    out["events"] = {k: v for k, v in status.get("counters", {}).items() if k != "set_aside"}
    out["transport"] = dict(status.get("transport", {}))
    out["store"] = {k: v for k, v in status.get("store", {}).items() if isinstance(v, (int, float))}
    cache = status.get("cache", {})
    for k in ("hits", "misses", "evictions", "invalidations", "hot_keys", "pending_window_keys"):
        out[f"cache_{k}"] = cache.get(k, 0)
    gc = status.get("dedup_gc", {})
    out["dedup_gc_rounds"], out["dedup_gc_deleted"] = gc.get("rounds", 0), gc.get("deleted", 0)
    for k in ("in_flight", "outstanding", "idle", "settled", "uptime_s"):
        out[k] = status.get(k, 0)
    out["failed"] = status.get("error") is not None
    return out


def _seconds(us: int) -> float:
    """A watermark in seconds since the epoch; the end of time as +Inf."""
    return float("inf") if us >= END_OF_TIME else us / 1e6
