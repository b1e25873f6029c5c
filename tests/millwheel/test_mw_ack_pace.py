"""An injector over a transport that retries keeps about ``retry_delay_us / ACK_WAIT_SHARE`` of acks
outstanding (:class:`millwheel._injector_shell.AckPace`): the bound follows the rate its productions are
acked at, between ``PACE_FLOOR`` (or one poll's worth) and ``max_in_flight``; no production is dropped or sent unacked for it."""
from __future__ import annotations

import threading

import pytest
from test_mw_runtime import QueueInjector, records

from millwheel import RuntimeConfig
from millwheel._injector_shell import ACK_WAIT_SHARE, PACE_FLOOR, AckPace, InjectorShell
from millwheel._routing import Router
from millwheel._store import SQLiteStore
from millwheel._transport import Inbox, Tracker, Transport
from photon import SystemClock, wait_until


def test_the_pace_is_the_floor_until_a_window_of_acks_is_measured():
    pace = AckPace(target_us=500_000, floor=100, ceiling=10_000, window_us=200_000)
    assert pace.limit() == 100
    pace.acked(0, 0)
    pace.acked(100_000, 5_000)            # half a window: nothing measured yet
    assert pace.rate_per_s is None and pace.limit() == 100


def test_the_pace_is_the_acks_of_target_us_at_the_smoothed_rate_within_floor_and_ceiling():
    pace = AckPace(target_us=500_000, floor=100, ceiling=10_000, window_us=200_000)
    pace.acked(0, 0)
    pace.acked(200_000, 2_000)            # 10,000/s over the window
    assert pace.rate_per_s == pytest.approx(10_000)
    assert pace.limit() == 5_000          # 10,000/s x 0.5 s
    pace.acked(300_000, 600)
    pace.acked(400_000, 600)              # 6,000/s over the next window: each window counts half
    assert pace.rate_per_s == pytest.approx(8_000)
    assert pace.limit() == 4_000
    pace.acked(600_000, 8_000)            # 40,000/s: the mean 24,000/s, 12,000 in 0.5 s: the ceiling
    assert pace.limit() == 10_000
    for t in range(800_000, 3_000_000, 200_000):
        pace.acked(t, 0)                  # no acks for a while: down to the floor, not below
    assert pace.limit() == 100


def test_a_pace_with_impossible_bounds_is_refused():
    with pytest.raises(ValueError):
        AckPace(target_us=0, floor=1, ceiling=1)
    with pytest.raises(ValueError):
        AckPace(target_us=1, floor=10, ceiling=5)


class HeldTransport(Transport):
    """May lose (so senders retry by time) and delivers nothing: the test acks what it chooses."""
    may_lose = True

    def __init__(self) -> None:
        self.sent: list = []
        self.lock = threading.Lock()

    def send(self, deliveries) -> None:
        with self.lock:
            self.sent.extend(deliveries)


@pytest.mark.timeout(60)
def test_an_injector_waits_for_acks_past_its_pace_and_goes_on_as_they_come(tmp_path):
    cfg = RuntimeConfig(threads=1, intervals=4, injector_batch=PACE_FLOOR // 4, max_in_flight=10_000, tick_us=2_000,
                        retry_delay_us=60_000_000)     # no retry by time within the test
    transport = HeldTransport()
    inbox = Inbox()
    tracker = Tracker(transport, lambda sender, interval: inbox)
    inj = QueueInjector()
    total = 4 * PACE_FLOOR
    inj.push(records(total))
    stopping = threading.Event()
    failed: list = []
    shell = InjectorShell("in", inj, "nums", config=cfg, clock=SystemClock(), store=SQLiteStore(str(tmp_path / "s.db")),
                          tracker=tracker, router=Router(lambda stream: [("count", lambda r: r.key)], cfg.intervals),
                          report=Inbox(), stopping=stopping, fail=failed.append)
    shell.inbox = inbox        # the tracker's Done messages for "in" come here
    assert shell.pace is not None and shell.pace.limit() == PACE_FLOOR     # above one poll
    assert cfg.retry_delay_us // ACK_WAIT_SHARE == shell.pace.target_us
    shell.prepare()
    shell.thread.start()
    try:
        # nothing acked: the floor goes out (four polls), then the injector waits
        wait_until(lambda: shell.held_back > 0, 30, message="held back by the pace")
        assert tracker.outstanding_count("in") == PACE_FLOOR
        assert inj.pos == PACE_FLOOR and not failed
        acked = 0
        while acked < total:          # ack everything sent so far, and again, until all are out and acked
            wait_until(lambda n=acked: len(transport.sent) > n, 30, message="the next poll")
            with transport.lock:
                sent = transport.sent[acked:]
            tracker.acked_remotely([(d.consumer, d.record.id) for d in sent])
            acked += len(sent)
        wait_until(lambda: tracker.outstanding_count("in") == 0 and inj.pos == total, 30, message="all acked")
        with transport.lock:
            ids = [d.record.id for d in transport.sent]
        assert len(ids) == len(set(ids)) == total     # each production sent once: none lost, none repeated
        assert not failed
    finally:
        stopping.set()
        inbox.wake()
        shell.thread.join(10)


def test_an_injectors_pace_stays_within_max_in_flight_and_is_off_over_a_lossless_transport(tmp_path):
    def shell(cfg, transport):
        return InjectorShell("in", QueueInjector(), "nums", config=cfg, clock=SystemClock(),
                             store=SQLiteStore(str(tmp_path / "s.db")), tracker=Tracker(transport, lambda s, i: Inbox()),
                             router=Router(lambda stream: [], cfg.intervals), report=Inbox(),
                             stopping=threading.Event(), fail=lambda e: None)
    small = shell(RuntimeConfig(injector_batch=100, max_in_flight=300), HeldTransport())
    assert (small.pace.floor, small.pace.ceiling) == (300, 300)
    big = shell(RuntimeConfig(injector_batch=5_000, max_in_flight=20_000, retry_delay_us=2_000_000), HeldTransport())
    assert (big.pace.floor, big.pace.ceiling, big.pace.target_us) == (5_000, 20_000, 500_000)
    lossless = HeldTransport()
    lossless.may_lose = False
    assert shell(RuntimeConfig(), lossless).pace is None
