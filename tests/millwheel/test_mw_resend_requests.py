"""Consumer-driven resends: a consumer that drops records uncommitted (fenced, an interval given up, or
records kept for a slot whose claim was refused) asks their sender to send them again at once, instead of
leaving them to the sender's retry timeout (up to 4 x ``retry_delay_us``). The pure part on a tracker; the
round trip over real gRPC servers on free ports, with a retry delay far beyond the tests' deadlines, so
only the request can have sent them again."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from photon import wait_until

from millwheel import worker_pb2_grpc as pb_grpc
from millwheel._model import Delivery
from millwheel._peer import GrpcTransport, RemoteTracker, WorkerServicer
from millwheel._transport import Inbox, Tracker
from mw_helpers import SentTransport, production

pytestmark = pytest.mark.timeout(60)

NEVER_US = 3_600_000_000
"""A retry delay no test waits for: a copy sent twice was sent again on request."""


def test_a_resend_request_sends_the_unacked_copies_named_at_once_and_nothing_else():
    t = SentTransport()
    tracker = Tracker(t, lambda sender, interval: Inbox())
    tracker.send(tracker.register("src", [production(1, ("c", "d")), production(2)], now_us=0,
                                  retry_delay_us=NEVER_US))
    assert len(t.sent) == 3
    # only the copy asked for, of the consumer that asked; unknown ids and other consumers are ignored
    assert tracker.resend_requested([("d", "p1"), ("c", "p9"), ("e", "p2")]) == 1
    assert [(d.consumer, d.record.id) for d in t.sent[3:]] == [("d", "p1")]
    tracker.acked_remotely([("d", "p1")])
    assert tracker.resend_requested([("d", "p1")]) == 0          # acked since: nothing to send
    assert tracker.resend_requested([("c", "p1"), ("c", "p2")]) == 2
    assert tracker.resent_on_request == 3 and tracker.resent == 0
    # the timed retries are unchanged by a request: still due only after the retry delay
    assert tracker.due_retries(NEVER_US - 1) == 0 and tracker.due_retries(NEVER_US) == 2


class _Process:
    """One worker process's record exchange: a transport, its tracker and the servicer, on a free port.
    ``owners`` maps ``(consumer, slot)`` to an address (the test changes it without telling anyone, as an
    owner change that no map read announces). What the servicer takes is received at once (``taken``),
    or, with ``keep_early``, only kept with its sender's address (``early``), as records for a slot given
    here but not yet claimed are."""

    def __init__(self, owners: dict, keep_early: bool = False) -> None:
        self.owners, self.keep_early = owners, keep_early
        self.taken: list[Delivery] = []
        self.early: list[tuple[str, Delivery]] = []
        self.server = grpc.server(ThreadPoolExecutor(4))
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.transport = GrpcTransport(self.address, lambda c, s: self.owners.get((c, s)), lambda: None)
        self.transport.bind(lambda c, s: Inbox())
        self.tracker = RemoteTracker(self.transport, lambda sender, interval: Inbox(), lambda: 0)
        pb_grpc.add_WorkerServicer_to_server(WorkerServicer(self.tracker, self._accept, lambda thread_cpu=False: {}), self.server)
        self.server.start()

    def _accept(self, reply_to: str, deliveries: list[Delivery]) -> list:
        if self.keep_early:
            self.early.extend((reply_to, d) for d in deliveries)
        else:
            self.tracker.note_origin(deliveries, reply_to)
            self.tracker.received(deliveries)
            self.taken.extend(deliveries)
        return []

    def close(self) -> None:
        self.transport.close()
        self.server.stop(0).wait(5)


@pytest.fixture
def processes():
    made: list[_Process] = []

    def make(owners: dict, keep_early: bool = False) -> _Process:
        made.append(_Process(owners, keep_early))
        return made[-1]
    try:
        yield make
    finally:
        for p in made:
            p.close()


def _send_one(sender: _Process) -> Delivery:
    out = sender.tracker.register("src", [production(1)], now_us=0, retry_delay_us=NEVER_US)
    sender.tracker.send(out)
    return out[0]


@pytest.mark.parametrize("how", ["handed_back", "returned"])
def test_a_consumer_that_drops_received_records_gets_them_sent_again_at_once_by_their_sender(processes, how):
    """``handed_back``: a fenced core's records (``ReturnDeliveries``); ``returned``: records that reached
    a worker after its interval was given up. Either way the consumer sends nothing on itself: its
    sender sends again by its own map, and the new consumer's ack reaches the sender."""
    owners: dict = {}
    sender, old, new = processes(owners), processes(owners), processes(owners)
    owners[("c", 0)] = old.address
    _send_one(sender)
    wait_until(lambda: len(old.taken) == 1, 10, message="the old owner received the record")
    owners[("c", 0)] = new.address                 # moved, and the sender was not told
    if how == "handed_back":
        old.tracker.hand_back(list(old.taken))
    else:
        old.tracker.returned(list(old.taken))
    wait_until(lambda: len(new.taken) == 1, 10, message="the sender sent the record again to the new owner")
    assert old.tracker.in_flight == 0 and old.transport.counters["resend_requests"] == 1
    assert old.transport.counters["records_sent"] == 0     # not sent on by the consumer that dropped it
    assert sender.tracker.resent_on_request == 1 and sender.tracker.resent == 0
    new.tracker.acked(list(new.taken))
    wait_until(lambda: sender.tracker.outstanding_count() == 0, 10, message="the new owner's ack at the sender")


def test_records_kept_for_a_claim_that_was_refused_are_sent_again_at_once_by_their_sender(processes):
    owners: dict = {}
    sender, new = processes(owners), processes(owners)
    claiming = processes(owners, keep_early=True)
    owners[("c", 0)] = claiming.address
    _send_one(sender)
    wait_until(lambda: len(claiming.early) == 1, 10, message="the record kept before the claim")
    owners[("c", 0)] = new.address                 # a newer owner claimed it first
    claiming.tracker.resend_dropped(list(claiming.early))
    wait_until(lambda: len(new.taken) == 1, 10, message="the sender sent the record again to the new owner")
    assert claiming.tracker.in_flight == 0 and claiming.transport.counters["resend_requests"] == 1
    assert sender.tracker.resent_on_request == 1 and sender.tracker.resent == 0
    new.tracker.acked(list(new.taken))
    wait_until(lambda: sender.tracker.outstanding_count() == 0, 10, message="the new owner's ack at the sender")


def test_in_one_process_a_handed_back_record_goes_to_its_owner_again():
    t = SentTransport()
    tracker = Tracker(t, lambda sender, interval: Inbox())
    out = tracker.register("src", [production(1)], now_us=0, retry_delay_us=NEVER_US)
    tracker.received(out)
    tracker.hand_back(out)
    assert t.sent == out and tracker.in_flight == 0
