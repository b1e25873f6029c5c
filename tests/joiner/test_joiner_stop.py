"""Clean shutdown has no loss window: a stopping joiner finishes the commits and writes it has started, and
what it cannot finish in ``[joiner].stop_patience_s`` goes into the lost-ids ledger, never nowhere."""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import orjson
import pytest

import eventstore
import idregistry
from joiner import JoinerClient, JoinerUnavailable, Outcome, read_lost, read_status
from photon import free_port, load_config, read_output_lines, wait_until

from fake_registry import FakeRegistry, FakeRegistryDown
from joiner_helpers import click_id, clicks, join_held_in_commit, joined_lines, make_config, write_queries
from service_helpers import read_serving_address, write_photon_toml

J, T = Outcome.JOINED, Outcome.THROTTLED


class DownRegistry(FakeRegistry):
    """Fails every commit while ``down`` is set; with ``registers`` the ids are registered first (the reply is
    lost, as when a leader dies after replicating)."""

    def __init__(self, registers: bool) -> None:
        super().__init__()
        self.down = threading.Event()
        self.down.set()
        self.registers = registers
        self.attempts = 0

    def commit(self, ids, token):
        self.attempts += 1
        if self.down.is_set():
            if self.registers:
                super().commit(ids, token)
            raise FakeRegistryDown("no leader")
        return super().commit(ids, token)


def _refusing(client) -> bool:
    try:
        client.status()
    except JoinerUnavailable:
        return True
    return False


def test_stop_finishes_a_commit_that_is_being_retried(stack):
    reg = DownRegistry(registers=False)
    s = stack(reg, roll_interval_s=60.0, stop_patience_s=30.0)
    write_queries(s.root, range(3))
    s.wait_queries(3)
    pending = s.client.join_future(*clicks(range(3)), timeout=60)
    wait_until(lambda: reg.attempts >= 2, 10, message="the commit being retried")
    stopping = threading.Thread(target=s.server.stop)
    stopping.start()
    with JoinerClient(s.server.address) as probe:
        wait_until(lambda: _refusing(probe), 10, message="the stopping joiner refusing new requests")
    attempts = reg.attempts
    wait_until(lambda: reg.attempts > attempts + 1, 10, message="the commit still retried while stopping")
    reg.down.clear()                     # the registry answers again
    assert pending.result(timeout=30) == [J, J, J]
    stopping.join(timeout=30)
    assert not stopping.is_alive()
    assert sorted(e["click_id"] for e in joined_lines(s.joined_dir)) == [click_id(n) for n in range(3)]
    assert read_lost(s.root / "state") == []


def test_stop_records_a_commit_whose_outcome_stays_unknown(stack):
    reg = DownRegistry(registers=True)   # every attempt registers, no reply arrives
    s = stack(reg, roll_interval_s=60.0, stop_patience_s=0.5)
    write_queries(s.root, range(4))
    s.wait_queries(4)
    ids = clicks(range(4))[0]
    pending = s.client.join_future(*clicks(range(4)), timeout=60)
    wait_until(lambda: reg.attempts >= 1, 10, message="the commit attempted")
    s.server.stop()
    assert pending.result(timeout=10) == [T] * 4        # claims nothing: the dispatcher resends
    assert set(reg.tokens) == set(ids)                    # registered ...
    assert joined_lines(s.joined_dir) == []               # ... not written ...
    lost = read_lost(s.root / "state")                    # ... and in the ledger for verification
    assert sorted(e["id"] for e in lost) == sorted(ids)
    assert {e["token"] for e in lost} == {reg.tokens[ids[0]]}
    assert all(e["reason"].startswith("commit outcome unknown") and e["joiner"] == "a-j0" for e in lost)
    assert s.server.statistics().commit_unknown_ids == 4


def test_commit_given_up_after_patience_is_recorded(stack):
    reg = DownRegistry(registers=True)
    s = stack(reg, commit_patience_s=0)
    write_queries(s.root, range(2))
    s.wait_queries(2)
    ids = clicks(range(2))[0]
    assert s.client.join(*clicks(range(2))) == [T, T]
    assert sorted(e["id"] for e in read_lost(s.root / "state")) == sorted(ids)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sigterm_during_a_registry_outage_finishes_the_commit_real_processes(pipes, tmp_path):
    """Real registry replicas (SIGSTOPped: no answers), a real joiner process: SIGTERM while its commit
    waits; the registry comes back 12 s later (longer than any fixed stop grace); the click is joined,
    answered JOINED, published, and the joiner exits 0 with nothing in the ledger."""
    config_path = write_photon_toml(tmp_path, joiner={"roll_interval_s": 60.0, "stop_patience_s": 60.0})
    config = load_config(config_path)
    replicas = [pipes.start(spec.argv) for spec in idregistry.registry_processes(config)]
    endpoints = idregistry.registry_endpoints(config)
    registry = idregistry.connect(endpoints)
    now_us = time.time_ns() // 1000
    write_queries(tmp_path, range(10))
    store = eventstore.serve(make_config(tmp_path), "a")
    stopped = []
    try:
        wait_until(lambda: any(s.get("is_leader") for s in registry.status()), 60, message="a registry leader")
        wait_until(lambda: store.statistics().events_indexed == 10, 10, message="queries indexed")
        proc = pipes.python("-m", "joiner.main", "--config", str(config_path), "--region", "a", "--name", "a-j0",
                            "--port", str(free_port()), "--eventstore", store.address,
                            "--registry", ",".join(endpoints), stdout=subprocess.PIPE)
        address = read_serving_address(proc, "joiner a-j0")
        with JoinerClient(address) as client:
            assert client.join(*clicks(range(5), base_us=now_us)) == [J] * 5
            for r in replicas:
                os.kill(r.pid, signal.SIGSTOP)
                stopped.append(r)
            pending = client.join_future(*clicks(range(5, 10), base_us=now_us), timeout=120)
            wait_until(lambda: client.status()["in_flight"] == 1, 10, message="the request inside its commit")
            proc.send_signal(signal.SIGTERM)
            wait_until(lambda: _refusing(client), 10, message="the joiner stopping")
            time.sleep(12)               # the outage's length (a fault's shape, not a wait for a condition)
            for r in stopped:
                os.kill(r.pid, signal.SIGCONT)
            stopped.clear()
            assert pending.result(timeout=90) == [J] * 5
        assert proc.wait(timeout=60) == 0
        out = tmp_path / "out" / "joined"
        got = sorted(orjson.loads(x)["click_id"] for x in read_output_lines(out))
        assert got == sorted(click_id(n, base_us=now_us) for n in range(10))
        assert read_status(tmp_path / "state")["a-j0"]["joined"] == 10
        assert read_lost(tmp_path / "state") == []
    finally:
        for r in stopped:
            os.kill(r.pid, signal.SIGCONT)
        registry.close()
        store.stop()


def test_joined_at_us_is_stamped_after_the_registry_commit(stack):
    reg, s, pending = join_held_in_commit(stack, 2, roll_interval_s=0.2)
    released_us = time.time_ns() // 1000
    reg.gate.set()
    assert pending.result(timeout=10) == [J, J]
    wait_until(lambda: len(joined_lines(s.joined_dir)) == 2, 10, message="joined lines published")
    assert all(e["_photon"]["joined_at_us"] >= released_us for e in joined_lines(s.joined_dir))
