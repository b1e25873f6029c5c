"""The front door: the in-process twin and the real client pass the same conformance checks; the launcher's
view (registry_processes / registry_endpoints) is stable; a replica stops cleanly on SIGTERM."""
from __future__ import annotations

import signal

import pytest

from photon import IdGenerator, wait_until
import idregistry
from idregistry import CommitResult, InMemoryRegistry, RegistryClient

from registry_helpers import make_config

OK, EXISTS = CommitResult.OK, CommitResult.ALREADY_EXISTS


def check_conformance(registry, gen: IdGenerator) -> None:
    a, b, c = gen.next_id(), gen.next_id(), gen.next_id()
    assert registry.lookup([a, b]) == [False, False]
    assert registry.commit([a, b], "t1") == [OK, OK]
    assert registry.commit([b, c], "t2") == [EXISTS, OK]
    assert registry.commit([a], "t1") == [OK]
    assert all(isinstance(r, CommitResult) for r in registry.commit([c], "t1"))
    wait_until(lambda: registry.lookup([a, b, c]) == [True, True, True], 10, message="ids visible")
    rows = registry.status()
    assert rows and {"shard", "replica", "address", "pid", "is_leader", "term", "commit_index",
                     "ids_held"} <= set(rows[0])
    with pytest.raises(ValueError):
        registry.commit(["bad"], "t1")
    assert registry.delete(a, "t2") is False
    assert registry.clear_tokens([b]) == 1
    assert registry.delete(b, "t1") is False
    assert registry.delete(a, "t1") is True
    wait_until(lambda: registry.lookup([a, b]) == [False, True], 10, message="the delete visible")
    exported = {event_id: token for event_id, token, _ in registry.export(0)}
    assert exported[b] == "" and exported[c] == "t2" and a not in exported
    stats = registry.statistics()
    assert stats.shards[0].ids_held >= 2


@pytest.mark.parametrize("kind", ["memory", "grpc"])
def test_every_registry_implementation_conforms(kind, request):
    if kind == "memory":
        registry = InMemoryRegistry()
    else:
        registry = RegistryClient(request.getfixturevalue("cluster").endpoints())
    try:
        check_conformance(registry, IdGenerator("10.7.7.7", {"memory": 1, "grpc": 2}[kind]))
    finally:
        registry.close()


def test_connect_chooses_by_url(cluster):
    assert idregistry.connect("memory://") is idregistry.connect("memory://")
    client = idregistry.connect(",".join(cluster.endpoints()))
    try:
        assert isinstance(client, RegistryClient)
    finally:
        client.close()


def test_registry_processes_are_stable_and_remember_free_ports(tmp_path):
    config = make_config(tmp_path, replicas=3, shards=2)
    first = idregistry.registry_processes(config)
    again = idregistry.registry_processes(make_config(tmp_path, replicas=3, shards=2))
    assert [p.argv for p in first] == [p.argv for p in again]
    assert [p.name for p in first] == [f"registry-s{s}-r{r}" for s in range(2) for r in range(3)]
    assert {p.role for p in first} == {"registry"} and {p.region for p in first} == {"local"}
    assert (config.registry_data_dir / "layout.json").exists()
    endpoints = idregistry.registry_endpoints(config)
    assert len(endpoints) == 3 and all(e.startswith("127.0.0.1:") for e in endpoints)


def test_fixed_port_base_gives_fixed_ports(tmp_path):
    config = make_config(tmp_path, replicas=3, port_base=31000)
    assert idregistry.registry_endpoints(config) == ["127.0.0.1:31001", "127.0.0.1:31003", "127.0.0.1:31005"]


@pytest.mark.timeout(60)
def test_replica_stops_cleanly_on_sigterm(tmp_path, procs):
    config = make_config(tmp_path, replicas=1)
    (spec,) = idregistry.registry_processes(config)
    p = procs.start(spec.argv)
    with RegistryClient(idregistry.registry_endpoints(config)) as client:
        wait_until(lambda: client.status()[0].get("is_leader"), 20, message="the lone replica to lead")
        assert client.commit([IdGenerator("10.1.1.1", 1).next_id()], "t") == [OK]
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=15) == 0


@pytest.mark.timeout(90)
def test_simulated_round_trip_delays_every_commit_by_one_round_trip(tmp_path, procs):
    import time

    from registry_helpers import Cluster
    cluster = Cluster(make_config(tmp_path, simulated_rtt_ms=60.0), procs)
    cluster.start_missing()
    with RegistryClient(cluster.endpoints()) as client:
        cluster.client = client
        cluster.wait_leader()
        gen = IdGenerator("10.5.5.5", 55)
        latencies = []
        for _ in range(5):
            t = time.perf_counter()
            assert client.commit([gen.next_id()], "t") == [OK]
            latencies.append(time.perf_counter() - t)
    assert 0.06 <= sorted(latencies)[2] < 0.25     # one replica round trip (60 ms) plus processing
