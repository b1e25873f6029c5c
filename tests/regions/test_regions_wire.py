"""The wire between region namespaces: the relay's deciding core (where a packet goes, when, in what
order) and the real thing, two namespaces a configured round trip apart (every TCP exchange between them
pays it; the root namespace reaches both without it), cleaned up after, and stale leftovers of a dead
owner deleted."""
from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import time

import pytest

from bench._wire import WireQueue
from bench.netns import RegionNetwork, delete_stale, namespaces_refused, relay_refused


def _packet(dst: str, payload: bytes = b"", version: int = 4) -> bytes:
    header = bytes([version << 4 | 5]) + bytes(11) + socket.inet_aton("10.0.0.1") + socket.inet_aton(dst)
    return header + payload


def test_wire_queue_holds_each_packet_for_the_delay_in_arrival_order_and_drops_what_it_cannot_route():
    wire = WireQueue({socket.inet_aton("10.0.0.2"): "b", socket.inet_aton("10.0.0.3"): "c"}, delay_s=0.05)
    wire.accept(_packet("10.0.0.2", b"1"), now=10.0)
    wire.accept(_packet("10.0.0.3", b"2"), now=10.01)
    wire.accept(_packet("10.0.0.2", b"3"), now=10.02)
    wire.accept(_packet("10.0.0.9", b"nowhere"), now=10.02)
    wire.accept(_packet("10.0.0.2", b"v6", version=6), now=10.02)
    wire.accept(b"\x45short", now=10.02)
    assert list(wire.due(10.049)) == []
    assert [(d, p[-1:]) for d, p in wire.due(10.06)] == [("b", b"1"), ("c", b"2")]
    assert wire.next_due() == pytest.approx(10.07)
    assert [(d, p[-1:]) for d, p in wire.due(11.0)] == [("b", b"3")]
    stats = wire.statistics()
    assert (stats.packets_relayed, stats.packets_dropped, stats.packets_queued) == (3, 3, 0)


def test_a_packet_not_taken_stays_first():
    wire = WireQueue({socket.inet_aton("10.0.0.2"): "b"}, delay_s=0.0)
    wire.accept(_packet("10.0.0.2", b"1"), now=1.0)
    wire.accept(_packet("10.0.0.2", b"2"), now=1.0)
    for _ in wire.due(1.0):
        break                          # the writer could not write it (EAGAIN): retried next turn
    assert [p[-1:] for _, p in wire.due(1.0)] == [b"1", b"2"]


_refused = relay_refused()
netns = pytest.mark.skipif(_refused is not None, reason=f"the TUN relay cannot run here: {_refused}")

_SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[1], 7000)); s.listen()
print("listening", flush=True)
while True:
    c, _ = s.accept(); c.sendall(c.recv(64)); c.close()
"""
_CLIENT = """
import socket, sys, time
for _ in range(3):
    t0 = time.monotonic(); s = socket.create_connection((sys.argv[1], 7000), timeout=10); t1 = time.monotonic()
    s.sendall(b"ping"); assert s.recv(64) == b"ping"; t2 = time.monotonic(); s.close()
    print((t1 - t0) * 1000, (t2 - t1) * 1000)
"""


def _exchanges(net: RegionNetwork, procs) -> tuple[list[float], list[float], list[float]]:
    """Three TCP connects and request/responses from region a to region b (ms), and three from the root
    namespace to region b."""
    server = procs.start([*net.prefix("b"), sys.executable, "-c", _SERVER, net.host("b")], stdout=subprocess.PIPE)
    assert server.stdout.readline().strip() == b"listening"
    out = subprocess.run([*net.prefix("a"), sys.executable, "-c", _CLIENT, net.host("b")], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rows = [[float(x) for x in line.split()] for line in out.stdout.split("\n") if line.strip()]
    root = []
    for _ in range(3):
        t0 = time.monotonic()
        with socket.create_connection((net.host("b"), 7000), timeout=10) as s:
            s.sendall(b"ping")
            assert s.recv(64) == b"ping"
        root.append((time.monotonic() - t0) * 1000)
    server.kill()
    server.wait()
    return [r[0] for r in rows], [r[1] for r in rows], root


@netns
@pytest.mark.timeout(120)
def test_two_namespaces_a_hundred_ms_apart_pay_it_on_every_round_trip(procs):
    with RegionNetwork(["a", "b"], rtt_ms=100, delay="relay") as net:
        relay = net.relay
        connects, requests, root = _exchanges(net, procs)
        names = [net.namespace(r) for r in ("a", "b")]
    # a TCP connect is one round trip (SYN out, SYN-ACK back), a request and its answer another
    assert min(connects) >= 100 and min(requests) >= 100, (connects, requests)
    assert max(connects) < 1000 and max(requests) < 1000, (connects, requests)
    # the root namespace reaches the regions over the bridge, without the wire's delay
    assert statistics.median(root) < 100, root
    assert relay.poll() is not None
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(n in listed for n in names)


@netns
@pytest.mark.timeout(120)
def test_at_zero_round_trip_the_relay_adds_no_delay(procs):
    with RegionNetwork(["a", "b"], rtt_ms=0, delay="relay") as net:
        connects, requests, _ = _exchanges(net, procs)
    assert statistics.median(connects) < 50 and statistics.median(requests) < 50, (connects, requests)


@pytest.mark.skipif(namespaces_refused() is not None, reason=f"network namespaces refused: {namespaces_refused()}")
def test_leftovers_of_an_owner_that_died_are_deleted():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    ns, link = f"photon-p{dead.pid}r7-x", f"bp{dead.pid}r7"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    subprocess.run(["ip", "link", "add", link, "type", "bridge"], check=True)
    try:
        gone = delete_stale()
        assert ns in gone and link in gone
        assert ns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert subprocess.run(["ip", "link", "show", link], capture_output=True).returncode != 0
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", link], capture_output=True)
