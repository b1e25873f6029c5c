"""MillWheel's Prometheus metrics: a worker process's, read from its status (``WorkerHost.status``) at every
scrape, and a master replica's, from its :class:`MasterReplicaStatistics`.

``millwheel worker`` serves them at ``--metrics-port`` on its ``--host``, a master replica at its spec's
``metrics_port`` on its gRPC host (a free port by default; the addresses are in ``millwheel status``), both
through :func:`serve` and so :func:`photon.serve_metrics`: they read like every Photon process's, counters
``photon_<component>_<field>_total``, gauges ``photon_<component>_<field>``, labels ``region`` (empty),
``component`` and ``process``. :func:`worker_metrics` turns a worker's status into flat fields;
:data:`METRIC_KINDS` and :data:`MASTER_METRIC_KINDS` say which fields are counters.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from millwheel._watermarks import END_OF_TIME, NO_WATERMARK
from photon import MetricKinds, serve_metrics

COMPONENT = "millwheel_worker"

PER_COMPUTATION = ("records", "duplicates", "late", "timers", "set_aside")
"""Counters of a worker's computations, each one family with a ``computation`` label."""

METRIC_KINDS = MetricKinds(
    counters=frozenset({*PER_COMPUTATION, "events", "transport", "store", "cache_hits", "cache_misses",
                        "cache_evictions", "cache_invalidations", "dedup_gc_rounds", "dedup_gc_deleted"}),
    gauges=frozenset({"low_watermark_seconds", "input_watermark_seconds", "watermark_lag_seconds", "intervals",
                      "interval_records_per_s", "records_per_s", "in_flight", "outstanding", "idle", "settled", "cache_hot_keys",
                      "cache_pending_window_keys", "uptime_s", "failed"}),
    labels={**dict.fromkeys(PER_COMPUTATION, "computation"), "low_watermark_seconds": "computation",
            "input_watermark_seconds": "computation", "watermark_lag_seconds": "computation",
            "intervals": "computation", "interval_records_per_s": "computation", "events": "event", "transport": "counter",
            "store": "counter"},
)


MASTER_COMPONENT = "millwheel_master"

MASTER_METRIC_KINDS = MetricKinds(
    counters=frozenset({"journal_syncs", "batches", "facts_proposed", "placement_facts", "placement_commands",
                        "assigns", "revokes", "splits", "merges", "moves", "expired_workers"}),
    gauges=frozenset({"is_leader", "term", "commit_index", "last_applied", "log_len", "largest_batch",
                      "queue_depth", "workers", "intervals", "master_now_us"}),
    skip=frozenset({"replica"}))
"""How a replica's :class:`MasterReplicaStatistics` become metrics (``photon_millwheel_master_*``)."""


def serve(component: str, statistics: Callable[[], object], host: str, port: int, kinds: MetricKinds,
          process: str, say: Callable[[str], None]) -> str | None:
    """Serve ``statistics()`` as ``component``'s metrics at ``host:port`` (0: a free port); the address served,
    or None when the port cannot be had, said through ``say``: the process runs on without metrics."""
    try:
        return serve_metrics(component, statistics, f"{host}:{port}", kinds=kinds, region="", process=process)
    except OSError as e:
        say(f"metrics not served at {host}:{port}: {e}")
        return None


def worker_metrics(status: dict[str, Any], now_us: int) -> dict[str, Any]:
    """The fields of a worker's metrics, from its ``status()`` read at ``now_us`` (wall clock): per
    computation (records, duplicates, late records, timers fired, records set aside; its low and input
    watermarks in seconds since the epoch and the low watermark's lag behind ``now_us`` (none for a
    computation whose watermark is 0 or the end of time); intervals held and their records/s), the
    process's events (``counters``: fenced commits, stale routes, lost incarnations, ...), the transport's
    and the store's counters, the cache's, what is in flight and unacked, idle and settled."""
    comps = status["computations"]
    out: dict[str, Any] = {name: {c: int(v.get(name, 0)) for c, v in comps.items()} for name in PER_COMPUTATION}
    lows = status["low_watermarks_us"]
    out["low_watermark_seconds"] = {c: _seconds(v) for c, v in lows.items()}
    out["input_watermark_seconds"] = {c: _seconds(v) for c, v in status["input_watermarks_us"].items()}
    out["watermark_lag_seconds"] = {c: max(0, now_us - v) / 1e6 for c, v in lows.items()
                                    if NO_WATERMARK < v < END_OF_TIME}
    held: dict[str, int] = {}
    rates: dict[str, float] = {}
    for iv in status["intervals"]:
        held[iv["computation"]] = held.get(iv["computation"], 0) + 1
        rates[iv["computation"]] = rates.get(iv["computation"], 0.0) + iv["records_per_s"]
    out["intervals"], out["interval_records_per_s"] = held, rates
    out["records_per_s"] = sum(rates.values())
    out["events"] = {k: v for k, v in status["counters"].items() if k != "set_aside"}   # (per computation above)
    out["transport"] = dict(status["transport"])
    out["store"] = {k: v for k, v in status["store"].items() if isinstance(v, (int, float))}
    for k in ("hits", "misses", "evictions", "invalidations", "hot_keys", "pending_window_keys"):
        out[f"cache_{k}"] = status["cache"][k]
    out["dedup_gc_rounds"], out["dedup_gc_deleted"] = status["dedup_gc"]["rounds"], status["dedup_gc"]["deleted"]
    for k in ("in_flight", "outstanding", "idle", "settled", "uptime_s"):
        out[k] = status[k]
    out["failed"] = status["error"] is not None
    return out

def _seconds(us: int) -> float:
    """A watermark in seconds since the epoch; the end of time as +Inf."""
    return float("inf") if us >= END_OF_TIME else us / 1e6
