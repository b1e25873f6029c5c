"""Regions on separate network namespaces, each with its own address (as on separate machines): two
regions both up, every joinable click exactly once in the union; and the same at 50 ms round trip
between regions: every packet between two regions' namespaces (TCP handshakes, gRPC to a joiner or a
registry leader in another region, Raft between replicas) pays it, by ``tc netem`` where the kernel has
it, else by the TUN relay of :mod:`bench.netns`."""
from __future__ import annotations

import pytest

from bench.netns import RegionNetwork, delay_refused, namespaces_refused
from photon import load_config, wait_until
from regions_helpers import joinable, regions_workload, union_joined, wait_all_joined

_refused = namespaces_refused()
pytestmark = pytest.mark.skipif(_refused is not None, reason=f"network namespaces refused: {_refused}")


def _run_in_namespaces(tmp_path, region_run, rtt_ms: float, queries: int, timeout_s: float) -> dict:
    names = ["a", "b", "c"]
    with RegionNetwork(names, rtt_ms=rtt_ms) as net:
        print(f"regions {rtt_ms:g} ms apart, delay by {net.delay}")
        config_path = regions_workload(tmp_path, regions=("a", "b"), registry_only=("c",), queries=queries,
                                       hosts={n: net.host(n) for n in names})
        config = load_config(config_path)
        assert config.registry.simulated_rtt_ms == 0
        assert {r.host for r in config.regions} == {net.host(n) for n in names}
        runs = {n: region_run(config_path, n, prefix=net.prefix(n)).start() for n in names}
        for n, run in runs.items():
            wait_until(lambda: len(run.processes()) > 0, 60, message=f"region {n} started")
        expected = joinable(tmp_path)
        try:
            wait_all_joined(config, expected, timeout_s, runs=runs.values())
            wait_until(lambda: all(runs[n].dispatcher_status().get("caught_up") for n in ("a", "b")), 120,
                       message="both dispatchers caught up")
        finally:
            for n in ("a", "b", "c"):
                runs[n].stop()
        ids = union_joined(config)
        assert set(ids) == expected
        assert [k for k, v in ids.items() if v > 1] == []
        # the registry replicas really listen on their namespaces' addresses
        assert all(p["region"] == "c" for n, p in runs["c"].processes().items())
        statuses = {n: runs[n].dispatcher_status() for n in ("a", "b")}
    if net.delay == "relay":         # the regions' traffic with each other really went over the wire
        assert net.wire_statistics["packets_relayed"] > 100, net.wire_statistics
    return statuses


@pytest.mark.timeout(300)
def test_two_regions_in_their_own_namespaces_join_each_click_once(tmp_path, region_run):
    statuses = _run_in_namespaces(tmp_path, region_run, rtt_ms=0, queries=3000, timeout_s=150)
    assert all(s["events_read"] > 0 for s in statuses.values())


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.skipif(delay_refused() is not None, reason=f"no delay between namespaces here: {delay_refused()}")
def test_fifty_ms_round_trip_between_regions_keeps_the_invariants(tmp_path, region_run):
    statuses = _run_in_namespaces(tmp_path, region_run, rtt_ms=50, queries=3000, timeout_s=300)
    assert all(s["events_read"] > 0 for s in statuses.values())
    # every join commits through a registry majority (3 of 5, placed 2/2/1): at least one replica in
    # another region must answer, so no join can be faster than one round trip
    p50s = [s["join_latency_ms"]["p50"] for s in statuses.values() if s.get("join_latency_ms")]
    assert p50s and min(p50s) >= 50, statuses
