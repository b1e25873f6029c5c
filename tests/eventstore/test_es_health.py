"""The gRPC health of an event store follows what it can do, read with the standard health client:
NOT_SERVING until its primary reader has caught up with the logs, and from the moment it starts to stop;
a logs store is NOT_SERVING until the reader whose map it follows has caught up. Their metrics declare every
statistic a counter or a gauge."""
from __future__ import annotations

import dataclasses
import json
import threading

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import eventstore
from eventstore._server import CACHE_METRIC_KINDS, LOGS_METRIC_KINDS, store_dir
from eventstore._shell import CacheEventStore
from photon import wait_until

from es_helpers import query_line

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


def _check(stub, service: str = "") -> int:
    return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


@pytest.mark.timeout(60)
def test_event_store_is_not_serving_until_its_reader_has_caught_up(region_config, queries_dir, monkeypatch):
    release = threading.Event()
    real_read_once = CacheEventStore.read_once

    def held_read_once(self):                     # a pause point before the reader's first pass
        release.wait(30)
        return real_read_once(self)

    monkeypatch.setattr(CacheEventStore, "read_once", held_read_once)
    (queries_dir / "q.log").write_bytes(b"".join(query_line(n) + b"\n" for n in range(20)))
    store = eventstore.serve(region_config(), "a")
    channel = grpc.insecure_channel(store.address)
    health = health_pb2_grpc.HealthStub(channel)
    try:
        assert _check(health) == NOT_SERVING and _check(health, "photon.EventStore") == NOT_SERVING
        assert "catching up" in store.store.serving_problem()
        release.set()
        wait_until(lambda: _check(health) == SERVING, 10, message="SERVING once the primary logs are read to their end")
        assert store.statistics().events_indexed == 20
        watch = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=30)
        assert next(watch).status == SERVING
        stopper = threading.Thread(target=store.stop, daemon=True)
        stopper.start()
        assert next(watch).status == NOT_SERVING
        stopper.join(timeout=30)
        watch.cancel()
    finally:
        release.set()
        channel.close()
        store.stop()


@pytest.mark.timeout(60)
def test_logs_store_is_not_serving_until_the_reader_it_follows_has_caught_up(region_config, queries_dir):
    config = region_config()
    checkpoint = store_dir(config, "a") / "cache-0.json"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_text(json.dumps({"offsets": {}, "read_through_us": 0}))
    store = eventstore.serve_logs(config, "a")
    channel = grpc.insecure_channel(store.address)
    health = health_pb2_grpc.HealthStub(channel)
    try:
        assert _check(health) == NOT_SERVING
        checkpoint.write_text(json.dumps({"offsets": {}, "read_through_us": 1_763_712_000_000_000}))
        wait_until(lambda: _check(health, "photon.EventStore") == SERVING, 10,
                   message="SERVING once cache server 0 has read the logs to their end")
    finally:
        channel.close()
        store.stop()


def test_every_numeric_event_store_statistic_is_declared_a_counter_or_a_gauge():
    for cls, kinds in [(eventstore.EventStoreStatistics, CACHE_METRIC_KINDS),
                       (eventstore.LogsStoreStatistics, LOGS_METRIC_KINDS)]:
        numeric = [f.name for f in dataclasses.fields(cls) if str(f.type) in ("int", "float", "bool", "dict")]
        assert sorted(numeric) == sorted(kinds.counters | kinds.gauges), cls.__name__
        assert not kinds.counters & kinds.gauges, cls.__name__
