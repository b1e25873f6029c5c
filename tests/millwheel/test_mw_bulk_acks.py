"""The tracker's acks in bulk: :meth:`Tracker.acked_remotely` and :meth:`Tracker.acked` finish productions
through one pass over a batch of acks (``_senders_acked``); on any mix of productions (several senders,
intervals and consumers, stored or not) and acks (repeated, unknown, interleaved across batches) they leave
the tracker exactly as one ``_sender_acked`` per ack does."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mw_helpers import SentTransport

from millwheel._model import Delivery, Record
from millwheel._store import StoredProduction
from millwheel._transport import Inbox, Tracker

pytestmark = pytest.mark.timeout(120)

CONSUMERS = ("c", "d", "e")


class _Clock:
    def __init__(self) -> None:
        self.t = 0

    def __call__(self) -> int:
        self.t += 37
        return self.t


def _tracker():
    inboxes: dict = {}
    tracker = Tracker(SentTransport(), lambda s, i: inboxes.setdefault((s, i), Inbox()), _Clock())
    return tracker, inboxes


def _register(tracker: Tracker, prods) -> None:
    for n, (sender, interval, ts, consumers, stored) in enumerate(prods):
        p = StoredProduction(f"p{n}", "s", f"k{n}", b"{}", ts, 1000 + n)
        deliveries = [Delivery(c, n % 3, Record(p.key, {}, ts, p.id, "s", sender, 1000 + n)) for c in consumers]
        tracker.register(sender, [(p, interval, stored, deliveries)], now_us=n * 10, retry_delay_us=100)


def _one_by_one(tracker: Tracker, pairs) -> None:
    """The reference: one ``_sender_acked`` per ack."""
    done: dict = {}
    now = tracker._now_us()
    with tracker._lock:
        for consumer, pid in pairs:
            tracker._sender_acked(consumer, pid, done, now)
    tracker._after(done)


def _picture(tracker: Tracker, inboxes: dict) -> dict:
    return {"outstanding": {pid: (o.sender, o.interval, sorted(o.left)) for pid, o in tracker.outstanding.items()},
            "per_sender": dict(tracker.per_sender),
            "work": {k: (b.min(), len(b)) for k, b in tracker.work.items()},
            "done": {k: [(m.sender, m.interval, m.ids) for m in ib._items] for k, ib in inboxes.items()},
            "ack_delays": list(tracker.ack_delays), "rto": tracker.retry_timeout_us,
            "in_flight": tracker.in_flight, "acked_total": tracker.acked_total}


_PRODS = st.lists(st.tuples(st.sampled_from(["src", "mid"]), st.integers(0, 2), st.integers(0, 50),
                            st.lists(st.sampled_from(CONSUMERS), min_size=1, max_size=3, unique=True),
                            st.booleans()), max_size=25)
_ACKS = st.lists(st.lists(st.tuples(st.sampled_from(CONSUMERS), st.integers(0, 30)), max_size=20), max_size=6)


@settings(max_examples=200, deadline=None)
@given(_PRODS, _ACKS)
def test_remote_acks_in_bulk_leave_the_tracker_as_one_ack_at_a_time(prods, batches):
    bulk, bulk_inboxes = _tracker()
    ref, ref_inboxes = _tracker()
    _register(bulk, prods)
    _register(ref, prods)
    for batch in batches:
        pairs = [(c, f"p{n}") for c, n in batch]
        bulk.acked_remotely(pairs)
        _one_by_one(ref, pairs)
        assert _picture(bulk, bulk_inboxes) == _picture(ref, ref_inboxes)


@settings(max_examples=100, deadline=None)
@given(_PRODS, st.data())
def test_local_acks_in_bulk_leave_the_tracker_as_one_ack_at_a_time(prods, data):
    """:meth:`Tracker.acked` of received deliveries: the consumer's half per delivery, then the senders'
    half in bulk, against the same per delivery with ``_sender_acked``."""
    bulk, bulk_inboxes = _tracker()
    ref, ref_inboxes = _tracker()
    _register(bulk, prods)
    _register(ref, prods)
    every = [d for o in list(bulk.outstanding.values()) for d in o.left.values()]
    chosen = data.draw(st.lists(st.sampled_from(every), unique_by=lambda d: (d.consumer, d.record.id))
                       if every else st.just([]))
    bulk.received(chosen)
    ref.received(chosen)
    bulk.acked(chosen)
    with ref._lock:       # the reference: the consumer's half, then one sender's half per delivery
        for d in chosen:
            ref._bag(d.consumer, d.interval).remove(d.record.timestamp_us)
            ref.in_flight -= 1
        ref.acked_total += len(chosen)
    _one_by_one(ref, [(d.consumer, d.record.id) for d in chosen])
    assert _picture(bulk, bulk_inboxes) == _picture(ref, ref_inboxes)
