"""Metrics as Prometheus means them: counters are counters (``_total``), latencies are histograms fed from
the mergeable :class:`LatencyHistogram`, region/component/process are labels; read back with
prometheus-client's own parser, and ``photon status`` reads the new names."""
from __future__ import annotations

import dataclasses
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from photon import LatencyHistogram, MetricKinds, free_port, histogram_quantile, scrape, serve_metrics


@pytest.fixture
def no_tls(monkeypatch):
    for var in ("PHOTON_TLS_CA", "PHOTON_TLS_CERT", "PHOTON_TLS_KEY", "PHOTON_RAFT_SECRET_FILE"):
        monkeypatch.delenv(var, raising=False)


def test_every_numeric_dispatcher_statistic_is_declared_a_counter_a_gauge_or_a_histogram():
    import dispatcher
    import dispatcher.main
    kinds = dispatcher.main.METRIC_KINDS
    numeric = [f.name for f in dataclasses.fields(dispatcher.DispatcherStatistics)
               if str(f.type) in ("int", "float", "bool", "dict")]
    assert sorted(numeric) == sorted(kinds.counters | kinds.gauges | set(kinds.latency_histograms) | kinds.skip)
    assert not kinds.counters & kinds.gauges


@pytest.mark.timeout(30)
def test_counters_histograms_and_labels_read_back_with_the_client_librarys_parser(no_tls):
    hist = LatencyHistogram()
    for us in [300] * 10 + [3_000] * 70 + [40_000] * 15 + [4_000_000] * 5:
        hist.add(us)
    stats = {"events_read": 1234, "retry_queue": 7, "caught_up": True, "why": "text is not a metric",
             "join_latency_hist": hist.to_json(), "reasons": {"gone": 2, "bad": 1}}
    kinds = MetricKinds(counters=frozenset({"events_read", "reasons"}), gauges=frozenset({"retry_queue", "caught_up"}),
                        latency_histograms={"join_latency_hist": "join_latency_seconds"}, labels={"reasons": "reason"})
    address = f"127.0.0.1:{free_port()}"
    serve_metrics("dispatcher", lambda: stats, address, kinds=kinds, region="a", process="dispatcher-a",
                  serving=lambda: False)
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as r:
        families = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
    labels = {"region": "a", "component": "dispatcher", "process": "dispatcher-a"}

    events = families["photon_dispatcher_events_read"]
    assert events.type == "counter"
    assert [(s.name, s.labels, s.value) for s in events.samples] == [("photon_dispatcher_events_read_total", labels, 1234)]
    assert families["photon_dispatcher_retry_queue"].type == "gauge"
    assert families["photon_dispatcher_caught_up"].samples[0].value == 1.0
    assert families["photon_serving"].samples[0].value == 0.0 and families["photon_up"].samples[0].labels == labels
    assert "photon_dispatcher_why" not in families
    reasons = families["photon_dispatcher_reasons"]
    assert reasons.type == "counter" and {s.labels["reason"]: s.value for s in reasons.samples} == {"gone": 2, "bad": 1}

    latency = families["photon_dispatcher_join_latency_seconds"]
    assert latency.type == "histogram"
    buckets = {s.labels["le"]: s.value for s in latency.samples if s.name.endswith("_bucket")}
    assert buckets["0.0005"] == 10 and buckets["0.005"] == 80 and buckets["0.05"] == 95 and buckets["5.0"] == 100
    assert buckets["+Inf"] == 100 and list(buckets.values()) == sorted(buckets.values())
    assert all(s.labels["region"] == "a" for s in latency.samples)
    total = sum(s.value for s in latency.samples if s.name.endswith("_sum"))
    exact = (10 * 300 + 70 * 3_000 + 15 * 40_000 + 5 * 4_000_000) / 1e6
    assert abs(total - exact) / exact < 0.03

    m = scrape(address)
    assert m["photon_dispatcher_events_read_total"] == 1234 and m['photon_dispatcher_reasons_total{reason="gone"}'] == 2
    p50 = histogram_quantile(m, "photon_dispatcher_join_latency_seconds", 0.5)
    assert 0.002 <= p50 <= 0.005              # the true median is 3 ms: within its bucket
    assert histogram_quantile(m, "photon_dispatcher_join_latency_seconds", 0.5, before=m) is None   # none since


def test_status_reads_counters_gauges_and_the_latency_histogram():
    from photon.app._status import _fig
    before = {"photon_dispatcher_events_read_total": 1000.0, 'photon_dispatcher_join_latency_seconds_bucket{le="0.01"}': 0.0,
              'photon_dispatcher_join_latency_seconds_bucket{le="0.02"}': 0.0,
              'photon_dispatcher_join_latency_seconds_bucket{le="+Inf"}': 0.0}
    now = {"photon_up": 1.0, "photon_dispatcher_events_read_total": 3000.0, "photon_dispatcher_pending_bytes": 2 ** 21,
           "photon_dispatcher_retry_queue": 4.0, "photon_dispatcher_wasted_joins_total": 9.0,
           'photon_dispatcher_join_latency_seconds_bucket{le="0.01"}': 50.0,
           'photon_dispatcher_join_latency_seconds_bucket{le="0.02"}': 100.0,
           'photon_dispatcher_join_latency_seconds_bucket{le="+Inf"}': 100.0}
    line = _fig({"up": True, "role": "dispatcher", "metrics": now}, {"up": True, "metrics": before}, 2.0)
    assert "lag 2.0 MB" in line and "events/s 1000" in line and "retry queue 4" in line
    assert "join p50/p90 10/18 ms" in line and "wasted joins 9" in line
    reg = {"photon_up": 1.0, "photon_serving": 0.0, "photon_registry_is_leader": 1.0, "photon_registry_term": 3.0,
           "photon_registry_commands_total": 10.0, "photon_registry_ids_committed_total": 250.0}
    line = _fig({"up": True, "role": "registry", "metrics": reg}, None, 0.0)
    assert line.startswith("NOT SERVING  LEADER") and "term 3" in line and "ids/command 25.0" in line


_SERVICE = """
import sys
from photon import run_service

class Server:
    address = "nowhere:0"
    def statistics(self):
        return {"served": 7}
    def stop(self):
        pass

sys.exit(run_service("probe a", Server, region="a"))
"""


@pytest.mark.timeout(60)
def test_a_service_serves_its_metrics_after_its_first_second_and_stops_cleanly(no_tls, procs):
    """``run_service`` prints ``serving on`` first and serves metrics ``METRICS_AFTER_S`` later (a cold
    start's first second goes to answering); they come, labelled as before, and SIGTERM still stops it."""
    import os
    import signal
    import subprocess
    import time

    from photon import METRICS_AFTER_S, wait_until
    address = f"127.0.0.1:{free_port()}"
    p = procs.python("-c", _SERVICE, stdout=subprocess.PIPE, text=True,
                     env={**os.environ, "PHOTON_METRICS_ADDR": address, "PHOTON_PROCESS": "probe-0"})
    assert p.stdout.readline().strip() == "probe a serving on nowhere:0"
    printed = time.monotonic()
    wait_until(lambda: scrape(address) is not None, 30, message="the service's metrics")
    assert time.monotonic() - printed >= METRICS_AFTER_S * 0.5     # never right after serving
    m = scrape(address)
    assert m["photon_probe_served"] == 7.0 and m["photon_up"] == 1.0
    os.killpg(p.pid, signal.SIGTERM)
    assert p.wait(timeout=30) == 0
