"""Acks between worker processes riding on the replies: acks a process owes another wait up to
``ACK_LINGER_S`` for a request from it, whose reply takes them back, or for records to go with; else they go
alone. Every ack put arrives exactly once, as when each went in a call of its own. Two real ends (a gRPC
server with the servicer and a transport each) on free ports."""
from __future__ import annotations

import random
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from photon import wait_until

from millwheel import _peer
from millwheel import worker_pb2_grpc as pb_grpc
from millwheel._model import Delivery, Record
from millwheel._peer import GrpcTransport, WorkerServicer

pytestmark = pytest.mark.timeout(120)


class _End:
    """One process's side: a servicer on a free port (records taken, acks and resend requests logged) and a
    transport sending to the other end, whose acks that come back on replies are logged too. With
    ``on_replies`` False the servicer gives no acks back (each ack goes in a request: the per-call form)."""

    def __init__(self, on_replies: bool) -> None:
        self.lock = threading.Lock()
        self.acked: Counter = Counter()      # acks that arrived here, by either way
        self.records: list = []
        self.server = grpc.server(ThreadPoolExecutor(8))
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.peer_address: str | None = None
        self.transport = GrpcTransport(self.address, lambda c, s: self.peer_address, lambda: None)
        self.transport.on_acks = self._arrived
        end = self

        class Tracker:
            def acked_remotely(self, pairs) -> None:
                end._arrived(pairs)

            def resend_requested(self, pairs) -> int:
                return 0

        take = self.transport.take_acks if on_replies else None
        pb_grpc.add_WorkerServicer_to_server(WorkerServicer(Tracker(), self._accept, lambda thread_cpu=False: {},
                                                            take), self.server)
        self.server.start()

    def _arrived(self, pairs) -> None:
        with self.lock:
            self.acked.update(tuple(p) for p in pairs)

    def _accept(self, reply_to: str, deliveries: list[Delivery]) -> list:
        with self.lock:
            self.records.extend(d.record.id for d in deliveries)
        return []

    def close(self) -> None:
        self.transport.close()
        self.server.stop(0).wait(5)


def _pair(on_replies: bool) -> tuple[_End, _End]:
    a, b = _End(on_replies), _End(on_replies)
    a.peer_address, b.peer_address = b.address, a.address
    return a, b


def _record(n: int) -> Delivery:
    return Delivery("c", 0, Record(f"k{n}", {"n": n}, n, f"src:{n}", "s", "src", n))


def _play(ops: list, on_replies: bool) -> tuple[Counter, Counter, list, list, dict, dict]:
    """Carries out ``ops`` (``("acks", end, pairs)`` or ``("records", end, n)``, with a pause after some)
    and waits until every ack and record has arrived."""
    a, b = _pair(on_replies)
    ends = {"a": a, "b": b}
    try:
        want = {"a": Counter(), "b": Counter()}     # acks each end should receive
        sent = {"a": [], "b": []}
        for kind, who, what, pause in ops:
            me, other = ends[who], ends["b" if who == "a" else "a"]
            if kind == "acks":
                me.transport.send_acks(other.address, what)
                want["b" if who == "a" else "a"].update(what)
            else:
                me.transport.send([_record(n) for n in what])
                sent["b" if who == "a" else "a"].extend(f"src:{n}" for n in what)
            if pause:
                time.sleep(pause)     # (spacing the operations; the outcome is waited for below)

        def arrived() -> bool:
            with a.lock, b.lock:
                return (a.acked == want["a"] and b.acked == want["b"]
                        and sorted(a.records) == sorted(sent["a"]) and sorted(b.records) == sorted(sent["b"]))
        wait_until(arrived, 30, message="every ack and record arrived")
        time.sleep(3 * _peer.ACK_LINGER_S)     # nothing more arrives (no ack twice)
        assert a.acked == want["a"] and b.acked == want["b"]
        return (a.acked, b.acked, sorted(a.records), sorted(b.records), dict(a.transport.counters),
                dict(b.transport.counters))
    finally:
        a.close()
        b.close()


def _ops(rng: random.Random, n: int) -> list:
    ops, next_id = [], 0
    for i in range(n):
        who = rng.choice("ab")
        if rng.random() < 0.6:
            ops.append(("acks", who, [(rng.choice("xyz"), f"{who}p{i}:{j}") for j in range(rng.choice([1, 2, 7]))],
                        rng.choice([0, 0, 0.002, 0.01])))
        else:
            k = rng.choice([1, 3, 20])
            ops.append(("records", who, list(range(next_id, next_id + k)), rng.choice([0, 0, 0.002, 0.01])))
            next_id += k
    return ops


@pytest.mark.parametrize("seed", range(3))
def test_acks_riding_on_replies_arrive_exactly_as_acks_each_in_a_call_of_their_own(seed):
    ops = _ops(random.Random(seed), 60)
    *per_call, counters_a0, counters_b0 = _play(ops, on_replies=False)
    *riding, counters_a, counters_b = _play(ops, on_replies=True)
    assert riding == per_call
    assert counters_a0["acks_on_replies"] == counters_b0["acks_on_replies"] == 0
    assert counters_a["failed_calls"] == counters_b["failed_calls"] == 0


def test_acks_queued_for_a_peer_go_back_on_the_reply_to_its_request(monkeypatch):
    monkeypatch.setattr(_peer, "ACK_LINGER_S", 2.0)
    a, b = _pair(on_replies=True)
    try:
        acks = [("x", f"p{i}") for i in range(5)]
        b.transport.send_acks(a.address, acks)        # b owes a these acks; they linger
        time.sleep(0.1)
        assert not a.acked
        started = time.monotonic()
        a.transport.send([_record(1)])                  # a's request to b takes them back on its reply
        wait_until(lambda: a.acked == Counter(acks), 5, message="the acks on the reply")
        assert time.monotonic() - started < 1.0
        assert a.transport.counters["acks_on_replies"] == 5
        assert b.transport.counters["calls"] == 0       # b made no call of its own for them
        assert b.records == ["src:1"]
    finally:
        a.close()
        b.close()


def test_acks_alone_go_in_a_call_of_their_own_after_the_linger(monkeypatch):
    monkeypatch.setattr(_peer, "ACK_LINGER_S", 0.3)
    a, b = _pair(on_replies=True)
    try:
        acks = [("x", "p1"), ("y", "p2")]
        started = time.monotonic()
        b.transport.send_acks(a.address, acks[:1])
        b.transport.send_acks(a.address, acks[1:])       # joins the first one's linger
        wait_until(lambda: a.acked == Counter(acks), 5, message="the acks alone")
        assert time.monotonic() - started >= 0.3
        assert b.transport.counters["calls"] == 1 and b.transport.counters["calls_without_records"] == 1
        assert a.transport.counters["acks_on_replies"] == 0
    finally:
        a.close()
        b.close()


def test_records_queued_take_the_lingering_acks_along_at_once(monkeypatch):
    monkeypatch.setattr(_peer, "ACK_LINGER_S", 2.0)
    a, b = _pair(on_replies=True)
    try:
        b.transport.send_acks(a.address, [("x", "p1")])
        time.sleep(0.05)
        started = time.monotonic()
        b.transport.send([_record(7)])
        wait_until(lambda: a.acked == Counter({("x", "p1"): 1}) and a.records == ["src:7"], 5,
                   message="the acks with the records")
        assert time.monotonic() - started < 1.0
        assert b.transport.counters["calls"] == 1 and b.transport.counters["calls_without_records"] == 0
    finally:
        a.close()
        b.close()
