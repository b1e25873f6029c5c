"""Records between worker processes over gRPC (``worker.proto``): the transport, the tracker's remote
acks, and the servicer.

* :class:`GrpcTransport` routes each delivery by the master's interval map: to a local worker's inbox
  when this process owns the consumer's slot, else into the batch of the owner's process, which one
  thread per peer sends (up to ``PEER_BATCH`` records, packed as one JSON array, and every pending ack,
  packed the same way, per request). The requests go on one ``ExchangeStream`` call per peer, kept open,
  with one request in flight: a reply not back within ``CALL_TIMEOUT_S`` cancels the stream (a watchdog
  thread per peer), a failed stream fails its request in flight (as a failed unary call did) and the next
  request opens a new one. A delivery whose owner is unknown, or that the receiver answers ``moved``, is
  parked until the map is read again and then sent at once; one whose call fails is not sent now. Besides, the sender's tracker
  retries every unacked delivery (``may_lose``), so records are retried until acknowledged.
* :class:`RemoteTracker` remembers where each received record came from and, once the consumer commits
  it, acks it to that process (batched with its records); acks that come in are the sender's half of
  :meth:`Tracker.acked`. A consumer that drops records uncommitted (it gave their slot up or was fenced)
  asks the process they came from to send them again at once (``resend``, batched the same way), and
  does not send them on itself: their sender resends them by its map and their acks go back to it.
* :class:`WorkerServicer` takes records for slots this process holds and answers the others with the
  owner it knows (a stale route); the sender then reads the map again.
"""
from __future__ import annotations

import json
import queue
import threading
import time
from collections import deque
from typing import Callable

import grpc
import orjson

from photon.rpc import open_channel

from millwheel import worker_pb2 as pb
from millwheel import worker_pb2_grpc as pb_grpc
from millwheel._model import Delivery, Record, new_record
from millwheel._transport import Tracker, Transport

PEER_BATCH = 5000
CALL_TIMEOUT_S = 5.0
CLOSE_WAIT_S = 1.0
"""How long closing a peer waits for its thread (its call in progress is cut off first)."""
WATCH_S = 0.5
"""How often a peer's watchdog looks at the request in flight (its reply is awaited up to ``CALL_TIMEOUT_S``
plus this)."""
_END = object()    # ends a stream's request iterator
CHANNEL_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 50), ("grpc.max_reconnect_backoff_ms", 500),
                   ("grpc.min_reconnect_backoff_ms", 50), ("grpc.max_receive_message_length", 64 * 2**20),
                   ("grpc.max_send_message_length", 64 * 2**20)]


def to_wire(d: Delivery) -> pb.WireRecord:
    r = d.record
    return pb.WireRecord(consumer=d.consumer, interval=d.interval, key=r.key, value=orjson.dumps(r.value),
                         timestamp_us=r.timestamp_us, id=r.id, stream=r.stream, sender=r.sender,
                         produced_at_us=r.produced_at_us)


def from_wire(w: pb.WireRecord) -> Delivery:
    return Delivery(w.consumer, w.interval, Record(w.key, orjson.loads(w.value), w.timestamp_us, w.id, w.stream,
                                                   w.sender, w.produced_at_us))


def pack_records(deliveries: list[Delivery]) -> bytes:
    """Deliveries as ``ExchangeRequest.packed_records``: one JSON array, encoded in one call."""
    return orjson.dumps([(d.consumer, d.interval, r.key, r.value, r.timestamp_us, r.id, r.stream, r.sender,
                          r.produced_at_us) for d in deliveries for r in (d.record,)])


def unpack_records(packed: bytes) -> list[Delivery]:
    make = new_record
    return [Delivery(c, i, make(k, v, ts, rid, stream, sender, at))
            for c, i, k, v, ts, rid, stream, sender, at in orjson.loads(packed)]


def request_acks(request: pb.ExchangeRequest) -> list[tuple[str, str]]:
    """The ``(consumer, production id)`` acks of an ``Exchange`` call, packed or one message each."""
    out = [(c, i) for c, i in orjson.loads(request.packed_acks)] if request.packed_acks else []
    if request.acks:
        out.extend((a.consumer, a.id) for a in request.acks)
    return out


def _ack_pairs(request: pb.ExchangeRequest) -> list:
    """:func:`request_acks` as the tracker takes them: the packed ones as decoded (two-element lists, not
    made into tuples one by one)."""
    out = orjson.loads(request.packed_acks) if request.packed_acks else []
    if request.acks:
        out.extend((a.consumer, a.id) for a in request.acks)
    return out


def request_records(request: pb.ExchangeRequest) -> list[Delivery]:
    """The records of an ``Exchange`` call, packed or one message each."""
    out = unpack_records(request.packed_records) if request.packed_records else []
    if request.records:
        out.extend(from_wire(w) for w in request.records)
    return out


class _Peer:
    """One other worker process: a queue of records and acks and the thread that sends them in batches."""

    def __init__(self, address: str, reply_to: str, on_moved: Callable[[list[Delivery]], None],
                 counters: dict) -> None:
        self.address, self._reply_to, self._on_moved, self._counters = address, reply_to, on_moved, counters
        self._records: deque = deque()
        self._acks: deque = deque()
        self._resends: deque = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._channel = open_channel(address, CHANNEL_OPTIONS)
        self._stub = pb_grpc.WorkerStub(self._channel)
        self._call = None           # the open ExchangeStream call, and the queue its requests are taken from
        self._requests: queue.SimpleQueue | None = None
        self._in_flight: tuple | None = None    # (call, monotonic time written) of the request awaiting its reply
        self.thread = threading.Thread(target=self._main, name=f"millwheel-peer-{address}", daemon=True)
        self.thread.start()
        self._watch_stop = threading.Event()
        self._watch = threading.Thread(target=self._watchdog, name=f"millwheel-peer-watch-{address}", daemon=True)
        self._watch.start()

    def put(self, records=(), acks=(), resends=()) -> None:
        with self._cond:
            self._records.extend(records)
            self._acks.extend(acks)
            self._resends.extend(resends)
            self._cond.notify()

    def close(self, timeout_s: float = CLOSE_WAIT_S) -> None:
        """Stop sending: what is queued is dropped (its senders retry it, as after a failed call) and a call
        in progress is cut off (closing the channel ends it at once, also to a peer that hangs)."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._watch_stop.set()
        self._channel.close()       # cancels the stream's call
        requests = self._requests
        if requests is not None:
            requests.put(_END)      # ends its request iterator (gRPC's thread waiting on it)
        self.thread.join(timeout=timeout_s)
        self._watch.join(timeout=timeout_s)

    def _exchange(self, req: pb.ExchangeRequest) -> pb.ExchangeReply:
        """One request on the open stream (opened first if there is none) and its reply. Raises
        ``grpc.RpcError`` when the stream fails or is cancelled (then it is dropped: the next request opens
        a new one), ``ValueError`` when the channel was closed."""
        call, requests = self._call, self._requests
        if call is None:
            requests = queue.SimpleQueue()
            call = self._stub.ExchangeStream(_taken(requests))
            self._call, self._requests = call, requests
        self._in_flight = (call, time.monotonic())
        requests.put(req)
        try:
            return next(call)
        except StopIteration:      # the receiver ended the stream: as a failed call
            self._end_stream()
            raise _StreamEnded() from None
        except grpc.RpcError:
            self._end_stream()
            raise
        finally:
            self._in_flight = None

    def _end_stream(self) -> None:
        call, requests, self._call, self._requests = self._call, self._requests, None, None
        if requests is not None:
            requests.put(_END)
        if call is not None:
            call.cancel()

    def _watchdog(self) -> None:
        """Cancels the stream whose request in flight has waited longer than ``CALL_TIMEOUT_S`` for its reply
        (a peer that hangs): the request fails as a unary call past its deadline did."""
        while not self._watch_stop.wait(WATCH_S):
            flight = self._in_flight
            if flight is not None and time.monotonic() - flight[1] > CALL_TIMEOUT_S:
                flight[0].cancel()

    def _main(self) -> None:
        while True:
            with self._cond:
                while not (self._records or self._acks or self._resends or self._closed):
                    self._cond.wait()
                if self._closed:
                    return
                n = min(PEER_BATCH, len(self._records))
                records = [self._records.popleft() for _ in range(n)]
                acks, self._acks = list(self._acks), deque()
                resends, self._resends = list(self._resends), deque()
            req = pb.ExchangeRequest(reply_to=self._reply_to, packed_records=pack_records(records) if records else b"",
                                     packed_acks=orjson.dumps(acks) if acks else b"",
                                     resend=[pb.WireAck(consumer=c, id=i) for c, i in resends])
            try:
                reply = self._exchange(req)
            except ValueError:       # the channel was closed under the call: closing
                return
            except grpc.RpcError:
                if self._closed:
                    return
                # the senders retry the records, acks come again, and records asked for again and not
                # sent come by their sender's retry timeout (a resend request only hastens them)
                self._counters["failed_calls"] += 1
                continue
            self._counters["calls"] += 1
            self._counters["records_sent"] += len(records)
            if not records:
                self._counters["calls_without_records"] += 1
            if reply.moved:
                self._counters["moved"] += len(reply.moved)
                gone = {(m.consumer, m.interval) for m in reply.moved}
                self._on_moved([d for d in records if (d.consumer, d.interval) in gone])


class _StreamEnded(grpc.RpcError):
    """The receiver ended an ``ExchangeStream`` call before replying to the request in flight."""


def _taken(requests: queue.SimpleQueue):
    """A stream's requests: what is put on ``requests``, until ``_END``."""
    while True:
        req = requests.get()
        if req is _END:
            return
        yield req


class GrpcTransport(Transport):
    """See the module docstring. ``owner(consumer, slot)`` gives the owner's address (None: unknown);
    ``bind``'s route gives the local inbox for slots owned here."""
    may_lose = True

    def __init__(self, address: str, owner: Callable[[str, int], str | None], on_moved: Callable[[], None]) -> None:
        self.address = address
        self._owner, self._on_moved = owner, on_moved
        self._peers: dict[str, _Peer] = {}
        self._lock = threading.Lock()
        self._parked: list[Delivery] = []
        self.counters: dict[str, int] = {"calls": 0, "calls_without_records": 0, "failed_calls": 0,
                                         "records_sent": 0, "moved": 0, "unrouted": 0, "local": 0,
                                         "resent_after_map": 0, "resend_requests": 0}

    def _peer(self, address: str) -> _Peer:
        with self._lock:
            peer = self._peers.get(address)
            if peer is None:
                peer = self._peers[address] = _Peer(address, self.address, self._park, self.counters)
            return peer

    def _park(self, deliveries: list[Delivery]) -> None:
        """Deliveries answered ``moved`` (or with no owner known): kept until the map is read again, then
        sent at once (:meth:`resend_parked`) rather than after the sender's retry delay."""
        with self._lock:
            self._parked.extend(deliveries)
        self._on_moved()

    def resend_parked(self) -> int:
        """Send what was parked again, by the map as it is now (call after reading the map)."""
        with self._lock:
            parked, self._parked = self._parked, []
        if parked:
            self.counters["resent_after_map"] += len(parked)
            self.send(parked, park=False)
        return len(parked)

    def send(self, deliveries: list[Delivery], park: bool = True) -> None:
        local: dict[int, tuple] = {}
        remote: dict[str, list] = {}
        unrouted: list[Delivery] = []
        owner, where_to = self._owner, {}   # each (consumer, slot)'s list to join, found once per call
        for d in deliveries:
            slot = (d.consumer, d.interval)
            where = where_to.get(slot)
            if where is None:
                address = owner(d.consumer, d.interval)
                if address is None:
                    where = unrouted     # no owner known now: sent when the map is read again (and retried)
                elif address == self.address:
                    inbox = self._route(d.consumer, d.interval)
                    where = local.setdefault(id(inbox), (inbox, []))[1]
                else:
                    where = remote.setdefault(address, [])
                where_to[slot] = where
            where.append(d)
        note = self.on_sent
        for inbox, items in local.values():
            self.counters["local"] += len(items)
            if note is not None:
                note(items, True)       # before they can be taken and acked
            inbox.put_many(items)
        for address, items in remote.items():
            if note is not None:
                note(items, False)
            self._peer(address).put(records=items)
        if unrouted:
            self.counters["unrouted"] += len(unrouted)
            if note is not None:
                note(unrouted, False)
            if park:
                self._park(unrouted)

    def park(self, deliveries: list[Delivery]) -> None:
        """Handed back by a consumer here (it does not hold their slot, or not yet): sent again after the
        next heartbeat's map read. Unlike a ``moved`` answer this asks for no heartbeat at once: when the
        map gives the slot here, the claim comes at the next heartbeat as always (not sooner, beside its
        old owner), and a slot given away was learnt from a map just read."""
        with self._lock:
            self._parked.extend(deliveries)

    def send_acks(self, address: str, pairs: list[tuple[str, str]]) -> None:
        self._peer(address).put(acks=pairs)

    def request_resend(self, address: str, pairs: list[tuple[str, str]]) -> None:
        """Ask the process at ``address`` to send these ``(consumer, production id)`` again now: they came
        from it and were dropped here uncommitted."""
        self.counters["resend_requests"] += len(pairs)
        self._peer(address).put(resends=pairs)

    def close(self) -> None:
        with self._lock:
            peers, self._peers = list(self._peers.values()), {}
        for p in peers:
            p.close()


class RemoteTracker(Tracker):
    """A :class:`Tracker` whose consumers ack records received from other processes back to them."""

    def __init__(self, transport: GrpcTransport, owner_inbox, now_us=None) -> None:
        super().__init__(transport, owner_inbox, now_us)
        self._origin: dict[tuple[str, str], str] = {}
        self._origin_lock = threading.Lock()

    def note_origin(self, deliveries: list[Delivery], address: str) -> None:
        with self._origin_lock:
            for d in deliveries:
                self._origin[(d.consumer, d.record.id)] = address

    def _take_origins(self, deliveries: list[Delivery]) -> dict[str, list[tuple[str, str]]]:
        out: dict[str, list] = {}
        with self._origin_lock:
            for d in deliveries:
                address = self._origin.pop((d.consumer, d.record.id), None)
                if address is not None:
                    out.setdefault(address, []).append((d.consumer, d.record.id))
        return out

    def acked(self, deliveries: list[Delivery]) -> None:
        super().acked(deliveries)
        for address, pairs in self._take_origins(deliveries).items():
            self._transport.send_acks(address, pairs)

    def unreceive(self, deliveries: list[Delivery]) -> None:
        """Also asks the senders in other processes to send them again now (see the module docstring)."""
        super().unreceive(deliveries)
        self._ask_again(self._take_origins(deliveries))

    def hand_back(self, deliveries: list[Delivery]) -> None:
        """Those received from other processes go back to their senders (asked to send them again, by
        :meth:`unreceive`); only those that came from this process are sent on from here."""
        with self._origin_lock:
            own = [d for d in deliveries if (d.consumer, d.record.id) not in self._origin]
        self.unreceive(deliveries)
        if own:
            self.send(own)

    def _ask_again(self, origins: dict[str, list[tuple[str, str]]]) -> None:
        for address, pairs in origins.items():
            self._transport.request_resend(address, pairs)

    def resend_dropped(self, dropped: list[tuple[str, Delivery]]) -> None:
        """Records ``(reply_to, delivery)`` taken for a slot before its claim and dropped (the claim was
        refused, or the slot was given elsewhere meanwhile): never received, their senders are asked to
        send them again now."""
        per: dict[str, list[tuple[str, str]]] = {}
        for address, d in dropped:
            per.setdefault(address, []).append((d.consumer, d.record.id))
        self._ask_again(per)


class WorkerServicer(pb_grpc.WorkerServicer):
    """``accept(reply_to, deliveries) -> [(consumer, slot, owner)]`` takes what this process holds and
    names the rest; ``status(thread_cpu)`` is this process's statistics as a dict (with its CPU by thread kind
    when ``thread_cpu``). Acks and resend requests that
    come in go to the tracker first (a request sends the named copies again at once)."""

    def __init__(self, tracker: RemoteTracker, accept, status) -> None:
        self._tracker, self._accept, self._status = tracker, accept, status

    def Exchange(self, request, context):
        return self._exchange(request)

    def ExchangeStream(self, requests, context):
        """What :meth:`Exchange` does, for each request of the stream in order, one reply each."""
        for request in requests:
            yield self._exchange(request)

    def _exchange(self, request: pb.ExchangeRequest) -> pb.ExchangeReply:
        if request.acks or request.packed_acks:
            self._tracker.acked_remotely(_ack_pairs(request))
        if request.resend:
            self._tracker.resend_requested([(a.consumer, a.id) for a in request.resend])
        records = request_records(request)
        moved = self._accept(request.reply_to, records) if records else []
        return pb.ExchangeReply(accepted=len(records) - len(moved),
                                moved=[pb.Moved(consumer=c, interval=s, owner=o) for c, s, o in moved])

    def Status(self, request, context):
        return pb.WorkerStatusReply(status_json=json.dumps(self._status(request.thread_cpu)))
