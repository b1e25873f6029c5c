"""Pure parts behind rebalancing and retries across processes: where a worker proposes to split an
interval, the sender's retries taken from a heap by due time, their timeout learnt from ack delays, and
when a sender holds back new input."""
from __future__ import annotations

import pytest

from millwheel._master_facts import Interval
from millwheel._model import Delivery, Record
from millwheel._routing import IntervalMap, middle_slot_key, slot_key
from millwheel._transport import Inbox, LocalTransport, Tracker, Transport
from mw_helpers import SentTransport, production

pytestmark = pytest.mark.timeout(30)


def test_the_split_key_divides_the_traffic_most_evenly():
    # [0000, 0004): a quarter, a quarter, a half, nothing: the even cut is before slot 2
    assert middle_slot_key("", "0004", {0: 25, 1: 25, 2: 50}, 16) == slot_key(2)
    # a little noise either way keeps the cut there (the first boundary past half would jump to 0003)
    assert middle_slot_key("", "0004", {0: 24, 1: 25, 2: 52}, 16) == slot_key(2)
    assert middle_slot_key("", "0004", {0: 26, 1: 25, 2: 49}, 16) == slot_key(2)
    # all traffic in one slot (one hot key), or none at all, or one slot: no split can help
    assert middle_slot_key("0004", "0008", {6: 10.0}, 16) == ""
    assert middle_slot_key("0004", "0008", {}, 16) == ""
    assert middle_slot_key("0004", "0005", {4: 100}, 16) == ""


def test_retries_come_from_a_heap_by_due_time_with_backoff_and_skip_what_was_acked():
    t = SentTransport()
    tracker = Tracker(t, lambda sender, interval: Inbox())
    tracker.register("src", [production(1)], now_us=0, retry_delay_us=100)
    tracker.register("src", [production(2)], now_us=50, retry_delay_us=100)
    assert tracker.due_retries(99) == 0 and t.sent == []
    assert tracker.due_retries(100) == 1 and [d.record.id for d in t.sent] == ["p1"]
    tracker.acked_remotely([("c", "p2")])            # acked before it was due: never sent again
    assert tracker.due_retries(10_000, max_backoff_us=150) == 1 and [d.record.id for d in t.sent] == ["p1", "p1"]
    # backoff doubled to 200, capped at 150: due again at 10,150, not before
    assert tracker.due_retries(10_149) == 0
    assert tracker.due_retries(10_150) == 1
    tracker.acked_remotely([("c", "p1")])
    assert tracker.due_retries(1 << 40) == 0 and tracker.outstanding_count() == 0


def test_a_production_forgotten_by_its_sender_is_not_retried():
    t = SentTransport()
    tracker = Tracker(t, lambda sender, interval: Inbox())
    tracker.register("src", [production(1, ("c", "d"))], now_us=0, retry_delay_us=10)
    tracker.acked_remotely([("c", "p1")])
    assert tracker.due_retries(10) == 1 and [d.consumer for d in t.sent] == ["d"]   # only what is unacked
    assert tracker.forget("src", 0) == 1
    assert tracker.due_retries(1 << 40) == 0


class _Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def test_the_retry_timeout_follows_the_ack_delays_so_queued_records_are_not_sent_twice():
    t, clock = SentTransport(), _Clock()
    tracker = Tracker(t, lambda sender, interval: Inbox(), clock)
    assert tracker.retry_timeout_us == 0
    # acks take 3 s (a consumer's queue), longer than the 1 s retry delay: each such production is sent
    # again once, and its delay from the first send is still a sample, so the timeout grows past the delay
    for n in range(8):
        tracker.register("src", [production(n)], now_us=clock.now, retry_delay_us=1_000_000)
        clock.now += 1_000_000
        tracker.due_retries(clock.now, max_backoff_us=8_000_000)
        clock.now += 2_000_000
        tracker.acked_remotely([("c", f"p{n}")])
    assert tracker.retry_timeout_us > 3_000_000
    sent_before = len(t.sent)
    # now a production acked after 3 s is not sent again meanwhile (its retry is put off, not dropped)
    tracker.register("src", [production(100)], now_us=clock.now, retry_delay_us=1_000_000)
    start = clock.now
    for step in range(1, 31):
        clock.now = start + step * 100_000
        tracker.due_retries(clock.now, max_backoff_us=8_000_000)
    assert len(t.sent) == sent_before
    tracker.acked_remotely([("c", "p100")])
    assert tracker.outstanding_count() == 0
    # a production that is really lost is still sent again, once the learnt timeout has passed (capped)
    tracker.register("src", [production(101)], now_us=clock.now, retry_delay_us=1_000_000)
    lost_at = clock.now
    while len(t.sent) == sent_before:
        clock.now += 100_000
        tracker.due_retries(clock.now, max_backoff_us=8_000_000)
    assert [d.record.id for d in t.sent[sent_before:]] == ["p101"]
    assert tracker.retry_timeout_us <= clock.now - lost_at <= 8_000_000 + 100_000


def test_a_sender_is_backlogged_once_its_oldest_unacked_production_waited_half_the_retry_delay():
    t = SentTransport()
    tracker = Tracker(t, lambda sender, interval: Inbox())
    assert not tracker.backlogged("src", 0, 1000)
    tracker.register("src", [production(1)], now_us=0, retry_delay_us=1000)
    tracker.register("src", [production(2)], now_us=400, retry_delay_us=1000)
    tracker.register("other", [production(3)], now_us=0, retry_delay_us=1000)
    assert not tracker.backlogged("src", 500, 1000)
    assert tracker.backlogged("src", 501, 1000)
    tracker.acked_remotely([("c", "p1")])            # the oldest is now the one sent at 400
    assert not tracker.backlogged("src", 900, 1000) and tracker.backlogged("src", 901, 1000)
    tracker.acked_remotely([("c", "p2")])
    assert not tracker.backlogged("src", 1 << 40, 1000)
    # in one process (a lossless transport, no retries) nothing queues twice: never backlogged
    local = Tracker(LocalTransport(), lambda sender, interval: Inbox())
    local.register("src", [production(4)], now_us=0, retry_delay_us=1000)
    assert not local.backlogged("src", 1 << 40, 1000)


class _Routed(Transport):
    """Sends to a local inbox the consumers named ``local``, and reports it as a worker process's does."""
    may_lose = True

    def __init__(self, local: set[str]) -> None:
        self.local, self.sent, self.parked = local, [], []

    def send(self, deliveries):
        self.sent.extend(deliveries)
        if self.on_sent is not None:
            self.on_sent([d for d in deliveries if d.consumer in self.local], True)
            self.on_sent([d for d in deliveries if d.consumer not in self.local], False)

    def park(self, deliveries):
        self.parked.extend(deliveries)


def test_copies_in_a_local_inbox_are_not_sent_again_by_time_and_come_back_if_their_interval_is_given_up():
    t = _Routed({"c"})
    tracker = Tracker(t, lambda sender, interval: Inbox())
    tracker.send(tracker.register("src", [production(1, ("c", "d"))], now_us=0, retry_delay_us=10))
    assert [d.consumer for d in t.sent] == ["c", "d"]
    # only the remote copy is sent again by time: the local one waits in an inbox that cannot lose it
    assert tracker.due_retries(10) == 1 and [d.consumer for d in t.sent[2:]] == ["d"]
    assert tracker.due_retries(1 << 20) == 1 and [d.consumer for d in t.sent[3:]] == ["d"]
    # its consumer gave the interval up before running it: handed back, it goes out by the next map
    local_copy = t.sent[0]
    tracker.received([local_copy])
    tracker.returned([local_copy])
    assert t.parked == [local_copy] and tracker.in_flight == 0
    # sent again to a remote owner now: from then on it is retried by time like any remote copy
    t.local.clear()
    tracker.send(t.parked)
    n = len(t.sent)
    assert tracker.due_retries(1 << 30) == 2 and {d.consumer for d in t.sent[n:]} == {"c", "d"}
    # a copy of another process's production handed back is not sent from here (its sender retries it)
    other = Delivery("c", 0, Record("k", {}, 5, "elsewhere/1", "s", "other", 5))
    tracker.received([other])
    tracker.returned([other])
    assert t.parked == [local_copy]


def test_copies_bound_for_a_slot_whose_owner_changed_go_again_at_once_and_only_those():
    t = SentTransport()
    tracker = Tracker(t, lambda sender, interval: Inbox())
    tracker.send(tracker.register("src", [production(1, ("c", "d"))], now_us=0, retry_delay_us=1_000_000))
    assert [d.consumer for d in t.sent] == ["c", "d"]
    assert tracker.resend_to({("d", 0)}) == 1 and [d.consumer for d in t.sent[2:]] == ["d"]
    assert tracker.resend_to({("e", 0), ("d", 1)}) == 0 and tracker.resend_to(set()) == 0
    tracker.acked_remotely([("d", "p1")])
    assert tracker.resend_to({("d", 0)}) == 0


def test_the_map_names_the_slots_whose_owner_moved_or_went():
    def iv(lo, hi, worker, address):
        return Interval("c", lo, hi, worker, 1, 0, address)
    old = IntervalMap([iv("", "0002", "w1", "a1"), iv("0002", None, "w2", "a2")], 4)
    new = IntervalMap([iv("", "0001", "w1", "a1"), iv("0001", "0003", "w3", "a3"), iv("0003", None, "", "")], 4)
    assert new.moved_since(old) == {("c", 1), ("c", 2), ("c", 3)}
    assert old.moved_since(IntervalMap([], 4)) == set()     # no owner before: parked, not in flight
