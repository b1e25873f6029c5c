"""Pure parts behind rebalancing and retries across processes: where a worker proposes to split an
interval, and the sender's retries taken from a heap by due time."""
from __future__ import annotations

import pytest

from millwheel._model import Delivery, Record
from millwheel._routing import middle_slot_key, slot_key
from millwheel._store import StoredProduction
from millwheel._transport import Inbox, Tracker, Transport

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


class _Sent(Transport):
    may_lose = True

    def __init__(self) -> None:
        self.sent: list[Delivery] = []

    def send(self, deliveries):
        self.sent.extend(deliveries)


def _production(n: int, consumers=("c",)):
    p = StoredProduction(f"p{n}", "s", f"k{n}", b"{}", 1000 + n, 1000 + n)
    return (p, 0, True, [Delivery(c, 0, Record(p.key, {}, p.timestamp_us, p.id, "s", "src", 1000 + n))
                         for c in consumers])


def test_retries_come_from_a_heap_by_due_time_with_backoff_and_skip_what_was_acked():
    t = _Sent()
    tracker = Tracker(t, lambda sender, interval: Inbox())
    tracker.register("src", [_production(1)], now_us=0, retry_delay_us=100)
    tracker.register("src", [_production(2)], now_us=50, retry_delay_us=100)
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
    t = _Sent()
    tracker = Tracker(t, lambda sender, interval: Inbox())
    tracker.register("src", [_production(1, ("c", "d"))], now_us=0, retry_delay_us=10)
    tracker.acked_remotely([("c", "p1")])
    assert tracker.due_retries(10) == 1 and [d.consumer for d in t.sent] == ["d"]   # only what is unacked
    assert tracker.forget("src", 0) == 1
    assert tracker.due_retries(1 << 40) == 0
