"""Remembered ports (``ports.json``): chosen once, reused by a restarted launcher, and written once per
state dir when a whole plan is made inside :func:`photon.ports_written_once`."""
import json

import pytest

from photon import ports_written_once, remembered_ports


@pytest.mark.timeout(30)
def test_ports_are_remembered_and_reused(tmp_path):
    first = remembered_ports(tmp_path, "joiners", "127.0.0.1", 2)
    assert json.loads((tmp_path / "ports.json").read_text()) == {"joiners": first}
    assert remembered_ports(tmp_path, "joiners", "127.0.0.1", 2) == first


@pytest.mark.timeout(30)
def test_a_plan_inside_the_block_writes_each_file_once_at_its_end(tmp_path, monkeypatch):
    import photon._process as process
    writes = []
    real = process.write_atomic
    monkeypatch.setattr(process, "write_atomic", lambda path, data, **kw: (writes.append(path), real(path, data, **kw)))
    a, b = tmp_path / "a", tmp_path / "b"
    with ports_written_once():
        joiners = remembered_ports(a, "joiners", "127.0.0.1", 2)
        store = remembered_ports(a, "eventstore", "127.0.0.1", 1)
        with ports_written_once():                     # nested: the outer block writes
            other = remembered_ports(b, "metrics-s0-r0", "127.0.0.1", 1)
        assert remembered_ports(a, "joiners", "127.0.0.1", 2) == joiners     # seen inside the block already
        assert writes == [] and not (a / "ports.json").exists()
    assert sorted(writes) == [a / "ports.json", b / "ports.json"]
    assert json.loads((a / "ports.json").read_text()) == {"joiners": joiners, "eventstore": store}
    assert json.loads((b / "ports.json").read_text()) == {"metrics-s0-r0": other}
    writes.clear()
    with ports_written_once():                          # nothing changed: nothing written
        assert remembered_ports(a, "eventstore", "127.0.0.1", 1) == store
    assert writes == []
    assert remembered_ports(a, "joiners", "127.0.0.1", 2) == joiners         # outside: as before


@pytest.mark.timeout(30)
def test_a_block_that_fails_writes_nothing(tmp_path):
    with pytest.raises(RuntimeError), ports_written_once():
        remembered_ports(tmp_path, "joiners", "127.0.0.1", 1)
        raise RuntimeError("planning failed")
    assert not (tmp_path / "ports.json").exists()
    remembered_ports(tmp_path, "joiners", "127.0.0.1", 1)     # the batch is over: written at once again
    assert (tmp_path / "ports.json").exists()


@pytest.mark.timeout(30)
def test_free_ports_lie_below_the_ephemeral_range_bind_and_are_not_handed_out_twice():
    """A port the OS hands out for port 0 comes from the ephemeral range, where any outgoing connection can
    take it before the server binds it; ``free_port`` picks below that range, checks it binds, and does
    not give a process the same port twice (a port held by a socket is skipped)."""
    import socket

    from photon import free_port
    from photon._service import FREE_PORTS, _ephemeral_low
    if _ephemeral_low() <= FREE_PORTS[-1]:
        pytest.skip(f"this machine's ephemeral ports start at {_ephemeral_low()}, inside {FREE_PORTS}")
    held = []
    try:
        for _ in range(50):
            s = socket.socket()
            s.bind(("127.0.0.1", free_port()))
            held.append(s)
        ports = [s.getsockname()[1] for s in held]
        assert len(set(ports)) == len(ports)
        assert all(p in FREE_PORTS for p in ports)
        more = [free_port() for _ in range(200)]          # none of them is one bound above, none repeats
        assert not set(more) & set(ports) and len(set(more)) == len(more)
    finally:
        for s in held:
            s.close()
