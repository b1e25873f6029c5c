"""A registry replica's gRPC health follows its Raft group (NOT_SERVING with no leader it is connected to,
and from the moment it starts to stop), read with the standard health client; its metrics, scraped
over HTTP and read with prometheus-client's own parser, are counters, gauges and histograms labelled
with region, component and process."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
import warnings

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

import idregistry
from photon import histogram_quantile, scrape, wait_until

from registry_helpers import make_config

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


def _start(procs, spec, **env):
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PHOTON_TLS", "PHOTON_RAFT"))}
    return procs.start(list(spec.argv), env={**clean, "PHOTON_METRICS_ADDR": spec.metrics_address,
                                             "PHOTON_REGION": spec.region, "PHOTON_PROCESS": spec.name, **env})


def _check(stub, service: str = "") -> int:
    return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


@pytest.mark.timeout(120)
def test_replica_health_follows_its_group_and_metrics_parse_as_prometheus_types(tmp_path, procs):
    config = make_config(tmp_path)
    specs = idregistry.registry_processes(config)
    running = {s.name: _start(procs, s) for s in specs}
    channels = {s.name: grpc.insecure_channel(s.address) for s in specs}
    health = {n: health_pb2_grpc.HealthStub(c) for n, c in channels.items()}
    client = idregistry.RegistryClient([s.address for s in specs], retry_timeout_s=30)
    try:
        wait_until(lambda: all(_ok(lambda h=h: _check(h)) == SERVING for h in health.values()), 30,
                   message="every replica SERVING")
        assert all(_check(h, "photon.Registry") == SERVING for h in health.values())
        now_us = time.time_ns() // 1000
        ids = [f"10.0.0.1:1:{now_us + n:016d}" for n in range(300)]
        for n in range(0, 300, 100):
            assert set(client.commit(ids[n:n + 100], "tok")) == {idregistry.CommitResult.OK}

        # metrics: the client library's own parser reads types, names and labels (served a moment after
        # gRPC: photon.METRICS_AFTER_S)
        wait_until(lambda: all(_metrics_answer(s.metrics_address) for s in specs), 30,
                   message="every replica's metrics answering")
        spec = specs[0]
        with urllib.request.urlopen(f"http://{spec.metrics_address}/metrics", timeout=5) as r:
            families = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
        commands = families["photon_registry_commands"]
        assert commands.type == "counter" and commands.samples[0].name == "photon_registry_commands_total"
        assert commands.samples[0].labels == {"region": "local", "component": "registry",
                                              "process": "registry-s0-r0"}
        assert families["photon_registry_ids_held"].type == "gauge"
        assert families["photon_up"].samples[0].value == 1.0 and families["photon_serving"].samples[0].value == 1.0
        fsync = families["photon_registry_fsync_latency_seconds"]
        assert fsync.type == "histogram"
        count = [s.value for s in fsync.samples if s.name.endswith("_count")][0]
        buckets = [s.value for s in fsync.samples if s.name.endswith("_bucket")]
        assert count > 0 and buckets == sorted(buckets) and buckets[-1] == count      # cumulative, +Inf last
        assert families["photon_registry_command_ids"].type == "histogram"
        leader = next(s for s in specs if scrape(s.metrics_address).get("photon_registry_is_leader"))
        m = scrape(leader.metrics_address)
        assert m["photon_registry_ids_held"] == 300 and m["photon_registry_commands_total"] >= 3
        assert m["photon_registry_ids_committed_total"] >= 300     # (housekeeping commands count one each)
        assert m['photon_registry_command_ids_bucket{le="128.0"}'] >= 3   # 100 ids per command
        assert histogram_quantile(m, "photon_registry_fsync_latency_seconds", 0.5) > 0

        # a replica left alone knows no leader it can reach: NOT_SERVING
        survivor = specs[2].name
        for s in specs[:2]:
            running[s.name].send_signal(signal.SIGKILL)
            running[s.name].wait(timeout=10)
        wait_until(lambda: _check(health[survivor]) == NOT_SERVING, 20, message="the lone replica NOT_SERVING")
        assert scrape(specs[2].metrics_address)["photon_serving"] == 0.0
        for s in specs[:2]:
            running[s.name] = _start(procs, s)
        wait_until(lambda: _ok(lambda: _check(health[survivor])) == SERVING, 30,
                   message="SERVING again with a leader back")

        # stopping: a watcher is told NOT_SERVING before the server goes away
        watch = health[survivor].Watch(health_pb2.HealthCheckRequest(service="photon.Registry"), timeout=30)
        assert next(watch).status == SERVING
        running[survivor].send_signal(signal.SIGTERM)
        assert next(watch).status == NOT_SERVING
        assert running[survivor].wait(timeout=20) == 0
    finally:
        client.close()
        for c in channels.values():
            c.close()


def _metrics_answer(address: str) -> bool:
    return scrape(address) is not None


def _ok(fn):
    try:
        return fn()
    except grpc.RpcError:
        return None


@pytest.mark.timeout(180)
def test_a_full_journal_disk_stops_that_replica_cleanly_and_the_others_keep_committing(tmp_path, procs,
                                                                                        small_disk):
    disk = small_disk(tmp_path / "small", "1m")
    config = make_config(tmp_path, max_ids_per_command=100000)
    specs = idregistry.registry_processes(config)
    full = specs[2]
    spec = json.loads(full.argv[full.argv.index("--spec") + 1])
    spec["data_dir"] = str(disk.path)
    spec["election_timeout_scale"] = 3.0                     # the full one rarely leads (it may still)
    full_argv = [*full.argv[:full.argv.index("--spec") + 1], json.dumps(spec)]
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PHOTON_TLS", "PHOTON_RAFT"))}
    for s in specs[:2]:
        procs.start(list(s.argv), env=clean)
    err_path = tmp_path / "full-replica.err"
    with open(err_path, "wb") as err:
        victim = procs.start(full_argv, env=clean, stderr=err, stdout=subprocess.DEVNULL)
    client = idregistry.RegistryClient([s.address for s in specs], retry_timeout_s=30)
    try:
        sent, now_us = 0, time.time_ns() // 1000

        def commit_batch() -> None:
            nonlocal sent
            ids = [f"10.0.0.1:1:{now_us + sent + n:016d}" for n in range(2000)]
            assert set(client.commit(ids, "tok")) == {idregistry.CommitResult.OK}
            sent += len(ids)

        def victim_gone() -> bool:
            commit_batch()
            return victim.poll() is not None

        wait_until(victim_gone, 120, interval=0.0, message="the replica on the full disk to stop")
        assert victim.returncode == 75, f"exit status {victim.returncode} (a SIGBUS death would be -7)"
        text = err_path.read_text()
        assert "THE DISK IS FULL" in text and "No space left on device" in text and "Raft journal" in text
        assert "Fatal Python error" not in text
        before = sent
        for _ in range(20):                                     # the other two keep the majority
            commit_batch()
        rows: list[dict] = []

        def both_answer() -> bool:                              # (a status call has a 2 s deadline: a busy
            rows[:] = [r for r in client.status() if "error" not in r]   # machine can miss one)
            return {r["replica"] for r in rows} == {0, 1}

        wait_until(both_answer, 30, interval=0.2, message="replicas 0 and 1 to answer a status call")
        assert any(r.get("is_leader") for r in rows)
        assert all(r["ids_held"] == sent for r in rows) and sent == before + 40000

        # the journal left on the full disk is whole: its entries read back in order, none torn
        from pysyncobj.journal import FileJournal
        with warnings.catch_warnings():                 # pysyncobj reads the vote record (raft.journal.meta,
            warnings.simplefilter("ignore", ResourceWarning)   # there once the replica voted) without closing it
            journal = FileJournal(str(disk.path / "raft.journal"))
        try:
            indexes = [journal[i][1] for i in range(len(journal))]
        finally:
            journal._destroy()
        assert len(indexes) > 1 and indexes == list(range(indexes[0], indexes[0] + len(indexes)))
    finally:
        client.close()


@pytest.mark.timeout(60)
def test_a_replica_serves_grpc_before_it_starts_its_metrics(tmp_path, monkeypatch):
    """A replica's metrics start :data:`photon.METRICS_AFTER_S` after its gRPC server, never before it: the
    first second of a group goes to its first election and its first requests."""
    import socket
    import threading

    from idregistry import _server
    from idregistry._spec import spec_from_json
    from photon import METRICS_AFTER_S
    config = make_config(tmp_path)
    planned = idregistry.registry_processes(config)[0]
    spec = spec_from_json(planned.argv[planned.argv.index("--spec") + 1])
    host, port = spec.grpc_address.rsplit(":", 1)
    started: list = []

    def metrics(*_args, **_kwargs) -> None:
        with socket.socket() as s:
            started.append((time.monotonic(), s.connect_ex((host, int(port))) == 0))

    monkeypatch.setattr(_server, "serve_metrics", metrics)
    stop = threading.Event()
    t0 = time.monotonic()
    replica = threading.Thread(target=_server.serve, args=(spec, stop), daemon=True)
    replica.start()
    try:
        wait_until(lambda: started, 30, message="the replica's metrics started")
    finally:
        stop.set()
        replica.join(30)
    at, grpc_answered = started[0]
    assert grpc_answered, "metrics were started before the replica's gRPC server took connections"
    assert at - t0 >= METRICS_AFTER_S
