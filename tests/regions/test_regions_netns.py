"""Regions on separate network namespaces, each with its own address (as on separate machines): two
regions both up, every joinable click exactly once in the union; and the same at 50 ms round trip
between regions (tc netem on each namespace's link; where the kernel has no netem, the registry's
simulated round trip between replicas stands in, and the test says so)."""
from __future__ import annotations

import pytest

from bench.netns import RegionNetwork, namespaces_refused, netem_refused
from photon import load_config, wait_until
from regions_helpers import joinable, regions_workload, union_joined, wait_all_joined

_refused = namespaces_refused()
pytestmark = pytest.mark.skipif(_refused is not None, reason=f"network namespaces refused: {_refused}")


def _run_in_namespaces(tmp_path, region_run, rtt_ms: float, queries: int, timeout_s: float) -> dict:
    names = ["a", "b", "c"]
    use_netem = rtt_ms > 0 and netem_refused() is None
    with RegionNetwork(names, rtt_ms=rtt_ms if use_netem else 0) as net:
        sections = {}
        if rtt_ms > 0 and not use_netem:
            print(f"tc netem refused ({netem_refused()}): registry replicas simulate {rtt_ms} ms instead")
            sections["registry"] = {"simulated_rtt_ms": rtt_ms}
        config_path = regions_workload(tmp_path, regions=("a", "b"), registry_only=("c",), queries=queries,
                                       hosts={n: net.host(n) for n in names}, **sections)
        config = load_config(config_path)
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
        return {n: runs[n].dispatcher_status() for n in ("a", "b")}


@pytest.mark.timeout(300)
def test_two_regions_in_their_own_namespaces_join_each_click_once(tmp_path, region_run):
    statuses = _run_in_namespaces(tmp_path, region_run, rtt_ms=0, queries=3000, timeout_s=150)
    assert all(s["events_read"] > 0 for s in statuses.values())


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_fifty_ms_round_trip_between_regions_keeps_the_invariants(tmp_path, region_run):
    statuses = _run_in_namespaces(tmp_path, region_run, rtt_ms=50, queries=3000, timeout_s=300)
    assert all(s["events_read"] > 0 for s in statuses.values())
