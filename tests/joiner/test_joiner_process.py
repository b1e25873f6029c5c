"""The joiner's process entry: clean stop on SIGTERM, orphaned output published after SIGKILL."""
from __future__ import annotations

import os
import signal
import socket
import subprocess

import pytest

import eventstore
from joiner import JoinerClient, Outcome, read_status
from photon import free_port, wait_until

from joiner_helpers import (click_id, clicks, inprogress_files, joined_lines, make_config, published_files,
                            write_queries)
from service_helpers import read_serving_address, write_photon_toml

J = Outcome.JOINED



@pytest.fixture
def store(tmp_path):
    write_queries(tmp_path, range(20))
    srv = eventstore.serve(make_config(tmp_path), "a")
    try:
        wait_until(lambda: srv.statistics().events_indexed == 20, 10, message="queries indexed")
        yield srv
    finally:
        srv.stop()


def start_joiner(pipes, config, store, port=None, **kw):
    port = port or free_port()
    proc = pipes.python("-m", "joiner.main", "--config", str(config), "--region", "a", "--name", "a-j0",
                        "--port", str(port), "--eventstore", store.address, "--registry", "memory://",
                        stdout=subprocess.PIPE, **kw)
    return proc, read_serving_address(proc, "joiner a-j0")


def test_sigterm_finishes_rolls_and_exits_zero(pipes, tmp_path, store):
    config = write_photon_toml(tmp_path, joiner={"roll_interval_s": 60.0})
    proc, address = start_joiner(pipes, config, store)
    with JoinerClient(address) as client:
        assert client.join(*clicks(range(5))) == [J] * 5
        assert client.status()["lines_written"] == 5
    joined = tmp_path / "out" / "joined"
    assert len(inprogress_files(joined, "a-j0-")) == 1
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    assert not inprogress_files(joined)
    assert sorted(e["click_id"] for e in joined_lines(joined)) == [click_id(n) for n in range(5)]
    status = read_status(tmp_path / "state")["a-j0"]
    assert status["pid"] == proc.pid and status["joined"] == 5 and status["files_rolled"] == 1


def test_orphaned_output_of_a_killed_joiner_is_published_on_restart(pipes, tmp_path, store):
    config = write_photon_toml(tmp_path, joiner={"roll_interval_s": 60.0})
    proc, address = start_joiner(pipes, config, store)
    with JoinerClient(address) as client:
        assert client.join(*clicks(range(6))) == [J] * 6
    joined = tmp_path / "out" / "joined"
    [orphan] = inprogress_files(joined, "a-j0-")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    with open(orphan, "ab") as f:  # what a kill in the middle of a write leaves: a torn last line
        f.write(b'{"click_id":"10.0.0.2:77:17637120010000')
    assert not published_files(joined)
    proc2, address2 = start_joiner(pipes, config, store)
    published = orphan.with_name(orphan.name[1: -len(".inprogress")])
    assert published.exists() and not orphan.exists()
    assert published.read_bytes().endswith(b"}\n")
    assert [e["click_id"] for e in joined_lines(joined)] == [click_id(n) for n in range(6)]
    with JoinerClient(address2) as client:
        assert client.status()["orphans_recovered"] == 1
        # the new process has its own (empty) in-memory registry twin: new ids join and go to a new file
        assert client.join(*clicks(range(6, 9))) == [J] * 3
    proc2.send_signal(signal.SIGTERM)
    assert proc2.wait(timeout=20) == 0
    assert sorted(e["click_id"] for e in joined_lines(joined)) == [click_id(n) for n in range(9)]


def test_bad_adapter_stops_startup_with_a_message_naming_the_key(pipes, tmp_path, store):
    config = write_photon_toml(tmp_path, joiner={"adapter": "nowhere_module:fn"})
    proc = pipes.python("-m", "joiner.main", "--config", str(config), "--region", "a", "--name", "a-j0",
                        "--eventstore", store.address, "--registry", "memory://",
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2 and b"[joiner].adapter = 'nowhere_module:fn'" in err


def test_port_in_use_stops_startup_with_a_message(pipes, tmp_path, store):
    config = write_photon_toml(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = pipes.python("-m", "joiner.main", "--config", str(config), "--region", "a", "--name", "a-j0",
                            "--port", str(port), "--eventstore", store.address, "--registry", "memory://",
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2 and f"cannot bind 127.0.0.1:{port}".encode() in err
