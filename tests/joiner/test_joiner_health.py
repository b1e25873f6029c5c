"""The gRPC health of a joiner follows what it can do, read with the standard health client: NOT_SERVING
while its output writes fail (a real full tmpfs) or it is throttled (every request slot busy), and from
the moment it starts to stop. Its metrics declare every statistic a counter or a gauge."""
from __future__ import annotations

import dataclasses
import threading

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import joiner
from joiner._server import METRIC_KINDS
from photon import wait_until

from fake_registry import FakeRegistry
from joiner_helpers import clicks, join_held_in_commit, write_queries

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


class HealthClient:
    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.stub = health_pb2_grpc.HealthStub(self.channel)

    def status(self, service: str = "") -> int:
        return self.stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status

    def wait(self, status: int, timeout: float = 10.0, service: str = "", message: str = "") -> None:
        wait_until(lambda: self.status(service) == status, timeout,
                   message=message or f"health {health_pb2.HealthCheckResponse.ServingStatus.Name(status)}")

    def close(self) -> None:
        self.channel.close()


@pytest.mark.timeout(60)
def test_joiner_is_not_serving_while_its_output_disk_is_full(small_disk, stack, tmp_path):
    disk = small_disk(tmp_path / "out", "300k")
    s = stack(FakeRegistry(), writer_probe_s=0.05)
    health = HealthClient(s.server.address)
    try:
        write_queries(s.root, range(40))
        s.wait_queries(40)
        health.wait(SERVING)
        assert health.status("photon.Joiner") == SERVING
        disk.fill()
        s.client.join(*clicks(range(10)))          # the write fails: the writer is failing from now on
        health.wait(NOT_SERVING, message="NOT_SERVING while the output writes fail")
        assert health.status("photon.Joiner") == NOT_SERVING
        assert "No space left on device" in s.server.serving_problem()
        disk.resize("4m")
        health.wait(SERVING, message="SERVING again once the output folder takes writes")
    finally:
        health.close()


@pytest.mark.timeout(60)
def test_joiner_is_not_serving_while_throttled_and_from_the_start_of_its_stop(stack):
    reg, s, pending = join_held_in_commit(stack, 5, max_in_flight=1)
    health = HealthClient(s.server.address)
    try:
        health.wait(NOT_SERVING, message="NOT_SERVING with its only request slot busy")
        assert s.server.serving_problem().startswith("throttled")
        reg.gate.set()
        pending.result(timeout=10)
        health.wait(SERVING, message="SERVING once the slot is free again")

        watch = health.stub.Watch(health_pb2.HealthCheckRequest(service="photon.Joiner"), timeout=30)
        assert next(watch).status == SERVING
        write_queries(s.root, range(5, 6))
        s.wait_queries(6)
        reg.gate = threading.Event()              # a request in flight keeps the stop waiting for it
        held = s.client.join_future(*clicks(range(5, 6)))
        wait_until(lambda: reg.waiting == 1, 10, message="a request inside the registry commit")
        stopper = threading.Thread(target=s.server.stop, daemon=True)
        stopper.start()
        assert next(watch).status == NOT_SERVING   # told at once, while the request in flight finishes
        assert stopper.is_alive()
        reg.gate.set()
        held.result(timeout=10)
        stopper.join(timeout=30)
        watch.cancel()
    finally:
        health.close()


def test_every_numeric_joiner_statistic_is_declared_a_counter_or_a_gauge():
    numeric = [f.name for f in dataclasses.fields(joiner.JoinerStatistics) if str(f.type) in ("int", "float", "bool")]
    assert sorted(numeric) == sorted(METRIC_KINDS.counters | METRIC_KINDS.gauges)
    assert not METRIC_KINDS.counters & METRIC_KINDS.gauges
