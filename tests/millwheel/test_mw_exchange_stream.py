"""Records and acks between worker processes on one ``ExchangeStream`` call per peer: what a receiver
takes and answers is what the unary ``Exchange`` call of the same request gives, request by request; a
reply that does not come back in time fails its request and the next request opens a new stream; closing
a peer whose call hangs returns at once. Real gRPC servers on free ports."""
from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import orjson
import pytest

from photon import wait_until
from photon.rpc import open_channel

from millwheel import _peer
from millwheel import worker_pb2 as pb
from millwheel import worker_pb2_grpc as pb_grpc
from millwheel._model import Delivery, Record
from millwheel._peer import WorkerServicer, _Peer, pack_records

pytestmark = pytest.mark.timeout(60)


class _Tracker:
    """What a receiver's tracker is told by ``Exchange``: acks and resend requests, in order."""

    def __init__(self, log: list) -> None:
        self.log = log

    def acked_remotely(self, pairs) -> None:
        self.log.append(("acked", [tuple(p) for p in pairs]))

    def resend_requested(self, pairs) -> int:
        self.log.append(("resend", [tuple(p) for p in pairs]))
        return 0


class _Receiver:
    """A ``WorkerServicer`` on a free port whose ``accept`` logs what it takes and answers the slots in
    ``away`` as moved (to ``elsewhere:1``); ``hold`` (set) makes ``accept`` wait until it is cleared.
    Counts the calls of each kind."""

    def __init__(self, away: set) -> None:
        self.log: list = []
        self.away = away
        self.hold = threading.Event()
        self.release = threading.Event()
        self.calls = {"Exchange": 0, "ExchangeStream": 0}
        receiver = self

        class Servicer(WorkerServicer):
            def Exchange(self, request, context):
                receiver.calls["Exchange"] += 1
                return super().Exchange(request, context)

            def ExchangeStream(self, requests, context):
                receiver.calls["ExchangeStream"] += 1
                return super().ExchangeStream(requests, context)

        self.server = grpc.server(ThreadPoolExecutor(8))
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        pb_grpc.add_WorkerServicer_to_server(Servicer(_Tracker(self.log), self._accept, lambda thread_cpu=False: {}),
                                             self.server)
        self.server.start()

    def _accept(self, reply_to: str, deliveries: list[Delivery]) -> list:
        if self.hold.is_set():
            self.release.wait(30)
        self.log.append(("records", reply_to, [(d.consumer, d.interval, d.record) for d in deliveries]))
        return sorted({(d.consumer, d.interval, "elsewhere:1") for d in deliveries
                       if (d.consumer, d.interval) in self.away})

    def close(self) -> None:
        self.release.set()
        self.server.stop(0).wait(5)


@pytest.fixture
def receivers():
    made: list[_Receiver] = []

    def make(away: set = frozenset()) -> _Receiver:
        made.append(_Receiver(set(away)))
        return made[-1]
    try:
        yield make
    finally:
        for r in made:
            r.close()


def _batches(rng: random.Random, n: int) -> list[tuple[list[Delivery], list, list]]:
    """``n`` random (records, acks, resends) requests, some parts empty."""
    out = []
    for b in range(n):
        records = [Delivery(rng.choice("abc"), rng.randrange(4),
                            Record(f"k{rng.randrange(50)}", {"v": rng.randrange(1000), "s": "x" * rng.randrange(5)},
                                   rng.randrange(10**15), f"src:{b}:{i}", "s", "src", rng.randrange(10**15)))
                   for i in range(rng.choice([0, 1, 3, 40]))]
        acks = [(rng.choice("abc"), f"p{b}:{i}") for i in range(rng.choice([0, 0, 2, 9]))]
        resends = [(rng.choice("abc"), f"r{b}:{i}") for i in range(rng.choice([0, 0, 1]))]
        if records or acks or resends:
            out.append((records, acks, resends))
    return out


@pytest.mark.parametrize("seed", range(3))
def test_requests_on_the_stream_are_taken_and_answered_as_unary_exchange_calls_of_them_are(receivers, seed):
    rng = random.Random(seed)
    batches = _batches(rng, 30)
    away = {(c, s) for c in "abc" for s in range(4) if rng.random() < 0.3}

    # the per-call form: one unary Exchange per request, the moved deliveries read off each reply
    unary = receivers(away)
    stub = pb_grpc.WorkerStub(open_channel(unary.address, _peer.CHANNEL_OPTIONS))
    moved_unary: list[Delivery] = []
    moved_slots = 0
    for records, acks, resends in batches:
        reply = stub.Exchange(pb.ExchangeRequest(
            reply_to="me:1", packed_records=pack_records(records) if records else b"",
            packed_acks=orjson.dumps(acks) if acks else b"",
            resend=[pb.WireAck(consumer=c, id=i) for c, i in resends]), timeout=10)
        gone = {(m.consumer, m.interval) for m in reply.moved}
        moved_slots += len(reply.moved)
        assert all(m.owner == "elsewhere:1" for m in reply.moved)
        moved_unary.extend(d for d in records if (d.consumer, d.interval) in gone)

    # the stream: a peer sending the same requests one at a time (each waited for, so none coalesce)
    streamed = receivers(away)
    moved_stream: list[Delivery] = []
    counters = {"calls": 0, "calls_without_records": 0, "failed_calls": 0, "records_sent": 0, "moved": 0}
    peer = _Peer(streamed.address, "me:1", moved_stream.extend, counters)
    try:
        for n, (records, acks, resends) in enumerate(batches, 1):
            peer.put(records=records, acks=acks, resends=resends)
            wait_until(lambda: counters["calls"] == n, 10, message=f"request {n} answered")
    finally:
        peer.close()
    assert streamed.log == unary.log and len(unary.log) >= len(batches)
    assert moved_stream == moved_unary
    assert counters["failed_calls"] == 0
    assert counters["records_sent"] == sum(len(r) for r, _, _ in batches)
    assert counters.get("calls_without_records", 0) == sum(1 for r, _, _ in batches if not r)
    assert counters["moved"] == moved_slots      # slots answered moved
    assert streamed.calls == {"Exchange": 0, "ExchangeStream": 1}       # every request on one stream


def test_a_reply_not_back_in_time_fails_its_request_and_the_next_request_opens_a_new_stream(receivers, monkeypatch):
    monkeypatch.setattr(_peer, "CALL_TIMEOUT_S", 0.5)
    monkeypatch.setattr(_peer, "WATCH_S", 0.05)
    r = receivers()
    counters = {"calls": 0, "calls_without_records": 0, "failed_calls": 0, "records_sent": 0, "moved": 0}
    peer = _Peer(r.address, "me:1", lambda ds: None, counters)
    one = Delivery("a", 0, Record("k", 1, 5, "src:1", "s", "src", 5))
    two = Delivery("a", 0, Record("k", 2, 6, "src:2", "s", "src", 6))
    try:
        r.hold.set()                           # the receiver hangs on the first request
        started = time.monotonic()
        peer.put(records=[one])
        wait_until(lambda: counters["failed_calls"] == 1, 10, message="the hung request failed")
        assert 0.5 <= time.monotonic() - started < 5
        assert counters["calls"] == 0 and counters["records_sent"] == 0
        r.hold.clear()
        r.release.set()
        peer.put(records=[two])
        wait_until(lambda: counters["calls"] == 1, 10, message="the next request answered")
        assert counters["failed_calls"] == 1 and counters["records_sent"] == 1
        assert r.calls == {"Exchange": 0, "ExchangeStream": 2}
        assert ("records", "me:1", [("a", 0, two.record)]) in r.log
    finally:
        peer.close()


def test_closing_a_peer_whose_request_hangs_ends_its_threads_at_once(receivers):
    r = receivers()
    r.hold.set()
    counters = {"calls": 0, "calls_without_records": 0, "failed_calls": 0, "records_sent": 0, "moved": 0}
    peer = _Peer(r.address, "me:1", lambda ds: None, counters)
    peer.put(records=[Delivery("a", 0, Record("k", 1, 5, "src:1", "s", "src", 5))])
    wait_until(lambda: peer._in_flight is not None, 10, message="the request in flight")
    started = time.monotonic()
    peer.close()
    assert time.monotonic() - started < _peer.CLOSE_WAIT_S + 0.5
    assert not peer.thread.is_alive() and not peer._watch.is_alive()
    assert counters["calls"] == 0
