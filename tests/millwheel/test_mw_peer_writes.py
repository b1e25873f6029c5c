"""Records for a peer with no request in flight are written by the thread that puts them (the peer's thread
then reads the reply): held to the form in which the peer's thread writes every request, with several
threads putting records, acks and resend requests at random moments. Real gRPC servers on free ports."""
from __future__ import annotations

import random
import threading
import time
from collections import Counter

import pytest

from photon import wait_until

from millwheel._model import Delivery, Record
from millwheel._peer import _Peer

from tests.millwheel.test_mw_exchange_stream import receivers  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(120)


class _PeerThreadWritesAll(_Peer):
    """The form before: ``put`` only queues, the peer's thread writes every request."""

    def put(self, records=(), acks=(), resends=()) -> None:
        with self._cond:
            self._records.extend(records)
            self._acks.extend(acks)
            self._resends.extend(resends)
            self._cond.notify()


def _plans(rng: random.Random, putters: int, puts: int) -> list[list[tuple]]:
    """Per putting thread, ``puts`` random (pause s, records, acks, resends), ids unique to the thread."""
    plans = []
    for t in range(putters):
        plan = []
        for n in range(puts):
            records = [Delivery(rng.choice("abc"), rng.randrange(4),
                                Record(f"k{rng.randrange(50)}", {"v": rng.randrange(1000)}, rng.randrange(10**15),
                                       f"t{t}:{n}:{i}", "s", "src", rng.randrange(10**15)))
                       for i in range(rng.choice([0, 1, 1, 2, 7]))]
            acks = [(rng.choice("abc"), f"a{t}:{n}:{i}") for i in range(rng.choice([0, 0, 1, 3]))]
            resends = [(rng.choice("abc"), f"r{t}:{n}:{i}") for i in range(rng.choice([0, 0, 0, 1]))]
            plan.append((rng.choice([0, 0, 0.0005, 0.002, 0.005]), records, acks, resends))
        plans.append(plan)
    return plans


def _run(peer_class, address: str, plans: list[list[tuple]]) -> tuple[dict, list[Delivery]]:
    counters = {"calls": 0, "calls_without_records": 0, "failed_calls": 0, "records_sent": 0, "moved": 0,
                "written_at_once": 0}
    moved: list[Delivery] = []
    moved_lock = threading.Lock()

    def on_moved(ds):
        with moved_lock:
            moved.extend(ds)
    peer = peer_class(address, "me:1", on_moved, counters)

    def put_all(plan):
        for pause, records, acks, resends in plan:
            if pause:
                time.sleep(pause)   # the pauses make the puts meet the peer idle and busy in turn
            peer.put(records=records, acks=acks, resends=resends)
    total = sum(len(r) for plan in plans for _, r, _, _ in plan)
    try:
        threads = [threading.Thread(target=put_all, args=(plan,)) for plan in plans]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        wait_until(lambda: counters["records_sent"] == total and not peer._records and not peer._acks
                   and not peer._resends and peer._sent is None, 20, message="everything answered")
    finally:
        peer.close()
    return counters, moved


@pytest.mark.parametrize("seed", range(3))
def test_records_written_by_their_putters_arrive_as_when_the_peer_thread_writes_every_request(receivers, seed):  # noqa: F811
    rng = random.Random(seed)
    plans = _plans(rng, 3, 60)
    away = {(c, s) for c in "abc" for s in range(4) if rng.random() < 0.3}
    got = {}
    for form in (_PeerThreadWritesAll, _Peer):
        r = receivers(away)
        counters, moved = _run(form, r.address, plans)
        records = [rec for kind, *rest in r.log if kind == "records" for (_, _, rec) in rest[1]]
        got[form] = dict(
            # each putter's records, in the order it put them
            records={t: [rec.id for rec in records if rec.id.startswith(f"t{t}:")] for t in range(len(plans))},
            all_records=Counter((rec.id, rec.key, repr(rec.value), rec.timestamp_us, rec.produced_at_us)
                                for rec in records),
            acks=Counter(p for kind, *rest in r.log if kind == "acked" for p in rest[0]),
            resends=Counter(p for kind, *rest in r.log if kind == "resend" for p in rest[0]),
            moved=Counter(d.record.id for d in moved),
            counters=counters, streams=r.calls["ExchangeStream"])
    old, new = got[_PeerThreadWritesAll], got[_Peer]
    want = {t: [rec.record.id for _, rs, _, _ in plan for rec in rs] for t, plan in enumerate(plans)}
    assert old["records"] == want
    assert new["records"] == want
    assert new["all_records"] == old["all_records"] and max(new["all_records"].values()) == 1
    assert new["acks"] == old["acks"] == Counter(a for plan in plans for _, _, acks, _ in plan for a in acks)
    assert new["resends"] == old["resends"] == Counter(x for plan in plans for _, _, _, rs in plan for x in rs)
    assert new["moved"] == old["moved"] and sum(new["moved"].values()) > 0
    assert new["counters"]["failed_calls"] == old["counters"]["failed_calls"] == 0
    assert new["counters"]["records_sent"] == old["counters"]["records_sent"]
    assert new["streams"] == old["streams"] == 1
    assert old["counters"]["written_at_once"] == 0
    # both ways of writing happened: at once by a putter, and by the peer's thread after a reply
    assert 0 < new["counters"]["written_at_once"] < new["counters"]["calls"]
