"""A real CacheEventStore gRPC server: in-process via serve(), and as its process entry point."""
from __future__ import annotations

import signal
import subprocess

import pytest

from eventstore import EventStoreClient, EventStoreUnavailable, serve
from photon import free_port, wait_until

from es_helpers import query_id, query_line
from service_helpers import read_serving_address, write_photon_toml


@pytest.fixture
def server(region_config, queries_dir):
    srv = serve(region_config(eventstore={"cache_mb": 2.0}), "a", port=0)
    try:
        yield srv
    finally:
        srv.stop()


def test_lookup_over_grpc_while_the_logs_grow(server, queries_dir):
    client = EventStoreClient(server.address)
    try:
        f = queries_dir / "h1" / "q.log"
        f.parent.mkdir()
        f.write_bytes(query_line(1) + b"\n" + query_line(2)[:5])
        wait_until(lambda: client.lookup([query_id(1)]) == [query_line(1)], 10, message="query 1 served")
        assert client.lookup([query_id(2)]) == [None]
        with open(f, "ab") as out:
            out.write(query_line(2)[5:] + b"\n")
        (queries_dir / "q-new.log").write_bytes(query_line(3) + b"\n")
        wait_until(lambda: None not in client.lookup([query_id(2), query_id(3)]), 10, message="queries 2, 3 served")
        ids = [query_id(3), query_id(404), query_id(1), query_id(3)]
        assert client.lookup(ids) == [query_line(3), None, query_line(1), query_line(3)]
        assert client.lookup([]) == []
        status = client.status()
        assert status["region"] == "a" and status["entries"] == 3 and status["files"] == 2
        assert status["reader_alive"] is True and status["max_bytes"] == 2 << 20
    finally:
        client.close()


def test_lookups_say_up_to_when_the_store_has_read_its_logs(server, queries_dir):
    import time
    client = EventStoreClient(server.address)
    try:
        assert client.read_through_us is None                  # nothing asked yet
        before_us = time.time_ns() // 1000
        (queries_dir / "q.log").write_bytes(query_line(1) + b"\n")
        wait_until(lambda: client.lookup([query_id(1)]) == [query_line(1)] and client.read_through_us >= before_us,
                   10, message="query 1 served by a store that has read past it")
        assert client.read_through_us <= time.time_ns() // 1000
        assert client.status()["read_through_us"] >= client.read_through_us
    finally:
        client.close()


def test_large_batch_lookup(server, queries_dir):
    (queries_dir / "q.log").write_bytes(b"".join(query_line(n) + b"\n" for n in range(3000)))
    with EventStoreClient(server.address) as client:
        wait_until(lambda: server.statistics().events_indexed == 3000, 10, message="3000 queries indexed")
        got = client.lookup([query_id(n) for n in range(3000)] + [query_id(5000)])
        assert got[:3000] == [query_line(n) for n in range(3000)] and got[3000] is None


def test_unreachable_store_raises_unavailable():
    client = EventStoreClient(f"127.0.0.1:{free_port()}", timeout=2.0)
    with pytest.raises(EventStoreUnavailable, match="127.0.0.1"):
        client.lookup([query_id(1)])
    with pytest.raises(EventStoreUnavailable):
        client.status()
    client.close()


def test_process_serves_and_stops_cleanly_on_sigterm(pipes, tmp_path, queries_dir):
    (queries_dir / "q.log").write_bytes(query_line(1) + b"\n" + b"oops\n")
    config = write_photon_toml(tmp_path, eventstore={"cache_mb": 2})
    port = free_port()
    proc = pipes.python("-m", "eventstore.main", "--config", str(config), "--region", "a", "--port", str(port),
                        stdout=subprocess.PIPE)
    assert read_serving_address(proc, "eventstore a") == f"127.0.0.1:{port}"
    with EventStoreClient(f"127.0.0.1:{port}") as client:
        wait_until(lambda: client.lookup([query_id(1)]) == [query_line(1)], 10, message="query served")
        assert client.status()["bad_records"] == 1
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 0
    assert (tmp_path / "out" / "quarantine" / "eventstore-a.jsonl").read_bytes().count(b"\n") == 1


def test_process_rejects_unknown_region(pipes, tmp_path):
    config = write_photon_toml(tmp_path)
    proc = pipes.python("-m", "eventstore.main", "--config", str(config), "--region", "zz",
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2 and b"no region named 'zz'" in err
