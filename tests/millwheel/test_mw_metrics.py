"""A worker process's Prometheus metrics (``millwheel/_metrics.py``): every number its status gives is a
declared counter or gauge, per computation where it is per computation, and they are served on a free port
when asked for port 0 and read back with prometheus-client's parser. (The served metrics of real worker
processes, against their status: ``test_mw_processes.py``, the status test.)"""
from __future__ import annotations

import pytest

from millwheel import END_OF_TIME
from millwheel._metrics import COMPONENT, METRIC_KINDS, worker_metrics
from photon import scrape, serve_metrics

NOW_US = 4_000_000
STATUS = {
    "worker": "w-1", "pid": 123, "address": "127.0.0.1:5000", "incarnation": 2, "metrics": "127.0.0.1:5001",
    "intervals": [{"computation": "windows", "lo": "0000", "hi": "4000", "sequencer": 7, "records_per_s": 10.5},
                  {"computation": "windows", "lo": "8000", "hi": None, "sequencer": 9, "records_per_s": 2.0},
                  {"computation": "joined", "lo": "0000", "hi": None, "sequencer": 3, "records_per_s": 0.0}],
    "injectors": {"joined": {"caught_up": True, "injected": 40, "held_back_by_acks": 0, "outstanding_limit": None}},
    "computations": {"windows": {"records": 40, "duplicates": 2, "late": 1, "timers": 5, "set_aside": 1}},
    "low_watermarks_us": {"windows": 1_000_000, "joined": END_OF_TIME, "spikes": 0},
    "input_watermarks_us": {"windows": 2_500_000},
    "watermark_authority": {"intervals": 3}, "settled": True, "idle": False, "busy": ["records waiting"],
    "in_flight": 4, "outstanding": 6,
    "counters": {"fenced_commits": 1, "stale_routes": 3, "set_aside": 1},
    "transport": {"calls": 9, "records_sent": 30, "resent_after_delay": 0},
    "acks": {"retry_timeout_ms": 500}, "cache": {"hits": 8, "misses": 2, "hot_keys": 5, "pending_window_keys": 1,
                                                  "evictions": 0, "invalidations": 1},
    "error": None, "dedup_gc": {"rounds": 2, "deleted": 11, "floors": {}}, "collector_threshold": [20000, 10, 10],
    "store": {"commits": 12, "writes": 40, "fenced": 0, "retries": 1, "already_applied": 0, "connections_opened": 2,
              "abandoned": 0, "interrupted": 0},
    "uptime_s": 12.5,
}


def test_every_field_of_a_workers_metrics_is_declared_and_per_computation_where_it_is():
    fields = worker_metrics(STATUS, NOW_US)
    assert METRIC_KINDS.unclassified(fields) == [] and not METRIC_KINDS.counters & METRIC_KINDS.gauges
    assert fields["records"] == {"windows": 40} and fields["set_aside"] == {"windows": 1}
    assert fields["intervals"] == {"windows": 2, "joined": 1}
    assert fields["interval_records_per_s"] == {"windows": 12.5, "joined": 0.0} and fields["records_per_s"] == 12.5
    assert fields["events"] == {"fenced_commits": 1, "stale_routes": 3}     # set aside: per computation above
    assert fields["store"]["commits"] == 12 and fields["cache_hits"] == 8 and fields["dedup_gc_deleted"] == 11
    assert fields["low_watermark_seconds"] == {"windows": 1.0, "joined": float("inf"), "spikes": 0.0}
    assert fields["input_watermark_seconds"] == {"windows": 2.5}
    assert fields["watermark_lag_seconds"] == {"windows": 3.0}       # none for no watermark or the end of time
    assert fields["failed"] is False and worker_metrics({**STATUS, "error": "OSError()"}, NOW_US)["failed"] is True


@pytest.mark.timeout(30)
def test_served_on_a_free_port_and_read_back(monkeypatch):
    for var in ("PHOTON_TLS_CA", "PHOTON_TLS_CERT", "PHOTON_TLS_KEY"):
        monkeypatch.delenv(var, raising=False)
    address = serve_metrics(COMPONENT, lambda: worker_metrics(STATUS, NOW_US), "127.0.0.1:0", kinds=METRIC_KINDS,
                            region="", process="w-1")
    assert address.startswith("127.0.0.1:") and int(address.rsplit(":", 1)[1]) > 0
    m = scrape(address, timeout_s=5.0)
    assert m is not None
    assert m['photon_millwheel_worker_records_total{computation="windows"}'] == 40.0
    assert m['photon_millwheel_worker_low_watermark_seconds{computation="windows"}'] == 1.0
    assert m['photon_millwheel_worker_low_watermark_seconds{computation="joined"}'] == float("inf")
    assert m['photon_millwheel_worker_watermark_lag_seconds{computation="windows"}'] == 3.0
    assert m['photon_millwheel_worker_events_total{event="stale_routes"}'] == 3.0
    assert m['photon_millwheel_worker_store_total{counter="commits"}'] == 12.0
    assert m["photon_millwheel_worker_cache_hits_total"] == 8.0 and m["photon_millwheel_worker_in_flight"] == 4.0
    assert m["photon_millwheel_worker_idle"] == 0.0 and m["photon_millwheel_worker_settled"] == 1.0


def test_every_number_of_a_master_replicas_statistics_is_declared():
    import dataclasses

    from millwheel._master import MasterReplicaStatistics
    from millwheel._metrics import MASTER_METRIC_KINDS
    numeric = [f.name for f in dataclasses.fields(MasterReplicaStatistics) if str(f.type) in ("int", "bool")]
    kinds = MASTER_METRIC_KINDS
    assert sorted(numeric) == sorted(kinds.counters | kinds.gauges | kinds.skip)
    assert not kinds.counters & kinds.gauges
