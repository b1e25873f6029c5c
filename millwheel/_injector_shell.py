"""The thread running one injector: poll, commit position + records as strong productions, send, report.

It talks to the rest of the runtime through its inbox (:class:`Done` acks of its productions), the
coordinator's inbox (its low watermark, :class:`WatermarksReported`), the store and the tracker. An
injector has one interval (0) and one sequencer; its low watermark is min(its own estimate, its oldest
unacked production), which seeds the watermarks of everything downstream (paper §5.2).
"""
from __future__ import annotations

import threading
from typing import Callable

import orjson
from photon import Clock

from millwheel._config import RuntimeConfig
from millwheel._injectors import Injector
from millwheel._messages import WatermarksReported
from millwheel._routing import Router
from millwheel._store import SetAsideRecord, Store, StoredProduction, Write
from millwheel._transport import Done, Inbox, Tracker
from millwheel._watermarks import WatermarkReported, interval_low

IDLE_POLL_US = 20_000
"""The wait between polls of an injector whose last two polls gave nothing (see :meth:`InjectorShell.idle_wait_s`)."""
ACK_WAIT_SHARE = 4
"""Over a transport that retries, an injector keeps about ``retry_delay_us / ACK_WAIT_SHARE`` of acks
outstanding (:class:`AckPace`): a production then waits about that long for its ack, well inside the retry
delay, instead of queueing at its consumers long enough to be sent again."""
PACE_FLOOR = 1_000
"""The pace never bounds an injector below this many unacked productions (nor below one poll,
``injector_batch``): a pipeline whose acks take longer than the pace's target even with nothing queued (a
slow store, a loaded host) would otherwise be held to a few records per round trip."""
PACE_WINDOW_US = 200_000
"""The ack rate is measured over windows at least this long (shorter ones would see single commits)."""


class AckPace:
    """How many productions an injector may keep unacknowledged: as many as its consumers acked in
    ``target_us`` at the rate they have been acking (Little's law: a production then waits about
    ``target_us`` for its ack), at least ``floor`` (a pipeline slower than that is not held back further:
    at a low rate this is every production) and at most ``ceiling`` (``max_in_flight``).

    Pure: :meth:`acked` is told how many productions were acked and when (integer microseconds, never
    going back); :meth:`limit` is the bound now. The rate is measured over windows of at least
    ``window_us`` and smoothed (each window counts half: a rate that changes is followed within a few
    windows). A window in which fewer acks came than the bound allowed (the injector was not held back)
    still counts: what is acked is what the consumers were given, and the bound grows again as acks come
    faster. Holding back never drops or delays a record's guarantees: the injector only polls less."""

    __slots__ = ("_count", "_start_us", "ceiling", "floor", "rate_per_s", "target_us", "window_us")

    def __init__(self, target_us: int, floor: int, ceiling: int, window_us: int = PACE_WINDOW_US) -> None:
        if target_us <= 0 or floor <= 0 or ceiling < floor or window_us <= 0:
            raise ValueError("AckPace needs target_us, floor and window_us > 0 and ceiling >= floor")
        self.target_us, self.floor, self.ceiling, self.window_us = target_us, floor, ceiling, window_us
        self.rate_per_s: float | None = None
        self._start_us: int | None = None
        self._count = 0

    def acked(self, now_us: int, n: int) -> None:
        """``n`` productions (0 or more) were acked by ``now_us``."""
        if self._start_us is None:
            self._start_us = now_us
        self._count += n
        span = now_us - self._start_us
        if span >= self.window_us:
            rate = self._count * 1e6 / span
            self.rate_per_s = rate if self.rate_per_s is None else (self.rate_per_s + rate) / 2
            self._start_us, self._count = now_us, 0

    def limit(self) -> int:
        """The most productions to keep unacknowledged now."""
        if self.rate_per_s is None:
            return self.floor
        return max(self.floor, min(self.ceiling, int(self.rate_per_s * self.target_us / 1e6)))


class InjectorShell:
    """Lifecycle: :meth:`prepare` (claim, restore the position, replay stored productions), then
    ``thread.start()``; the thread stops when ``stopping`` is set."""

    def __init__(self, name: str, injector: Injector, stream: str, *, config: RuntimeConfig, clock: Clock,
                 store: Store, tracker: Tracker, router: Router, report: Inbox, stopping: threading.Event,
                 fail: Callable[[BaseException], None]) -> None:
        self.name, self.injector, self.stream = name, injector, stream
        self.config, self.clock, self.store, self.tracker, self.router = config, clock, store, tracker, router
        self._report, self._stopping, self._fail = report, stopping, fail
        self.inbox = Inbox()
        self.estimate = 0
        self.caught_up = False
        self.busy = False
        self.injected = 0
        self.set_aside: dict[str, int] = {}
        """Per consumer, records set aside because its key extractor raised on them (in this process's run)."""
        self.seq = 0
        self._n = 0
        self._reported: int | None = None
        self._produced_last = False      # the last poll gave records
        # over a transport that retries, the productions kept unacked follow the acks' pace (AckPace)
        ceiling = max(1, config.max_in_flight)
        self.pace = AckPace(max(1, config.retry_delay_us // ACK_WAIT_SHARE),
                            min(ceiling, max(config.injector_batch, PACE_FLOOR)), ceiling) if tracker.may_lose else None
        self.held_back = 0                # steps held back by the pace (not by max_in_flight or a backlog)
        self.thread = threading.Thread(target=self._main, name=f"millwheel-injector-{name}", daemon=True)

    def prepare(self, sequencer: int | None = None) -> int:
        """Claim interval 0 (under a master's ``sequencer`` when given), restore the position, replay stored
        productions; returns the sequencer."""
        self.seq = self.store.claim(self.name, 0, sequencer)
        raw = self.store.read_states(self.name, [""]).get("")
        saved = orjson.loads(raw) if raw is not None else {}
        self.injector.restore(saved.get("position"))
        self.estimate = int(saved.get("estimate", 0))
        prods = self.store.pending_productions(self.name, 0)
        # a consumer whose key extractor raises on one of them had it set aside with it (see _inject)
        out = self.tracker.register(self.name, self.router.outgoing(self.name, 0, prods, True, []),
                                    self.clock.now_us(), self.config.retry_delay_us)
        self.tracker.send(out)
        return self.seq

    def _main(self) -> None:
        try:
            while not self._stopping.is_set():
                self._step()
        except BaseException as e:  # noqa: BLE001 - any failure stops the runtime loudly
            self._fail(e)
        finally:
            self.injector.close()

    def _step(self) -> None:
        cfg = self.config
        items = self.inbox.take(1 << 30, 0)
        done = [pid for item in items if isinstance(item, Done) for pid in item.ids]
        outstanding = self.tracker.outstanding_count(self.name)
        room = cfg.max_in_flight - outstanding
        if self.pace is not None:
            self.pace.acked(self.clock.now_us(), len(done))
            paced = self.pace.limit() - outstanding
            if paced < room:
                room = paced
                if room < min(cfg.injector_batch, self.pace.limit()) // 4:   # not a poll for a few records
                    self.held_back += 1
                    room = 0
        if room <= 0 or self.tracker.backlogged(self.name, self.clock.now_us(), cfg.retry_delay_us):
            if done:
                self.store.commit([Write(self.name, 0, self.seq, productions_done=done)])
            self._report_watermark()
            self.inbox.take(0, cfg.tick_us / 1e6)
            return
        self.busy = True
        try:
            with self.tracker.producing(self.clock.now_us) as now:
                prods = self._inject(now, done, min(room, cfg.injector_batch))
            self._report_watermark()
        finally:
            self.busy = False
        if not prods:
            self.inbox.take(0, self.idle_wait_s())
        self._produced_last = bool(prods)

    def idle_wait_s(self) -> float:
        """How long to wait after a poll that gave nothing: ``tick_us`` if the poll before it gave records
        (a source producing steadily has its next records due within a tick; waiting longer held each one
        up to 20 ms before it was even read), else ``IDLE_POLL_US`` (an idle source is not polled busily)."""
        return (self.config.tick_us if self._produced_last else max(self.config.tick_us, IDLE_POLL_US)) / 1e6

    def _inject(self, now: int, done: list[str], most: int) -> list[StoredProduction]:
        cfg = self.config
        poll = self.injector.poll(most, now)
        prods = []
        for key, value, ts in poll.records:
            self._n += 1
            prods.append(StoredProduction(f"{self.name}/{self.seq}/{self._n}", self.stream, str(key),
                                          orjson.dumps(value), int(ts), now))
        writes = [Write(self.name, 0, self.seq, productions_done=done)] if done else []
        # routed before the commit: a record a consumer's key extractor raises on (a field missing from an
        # input line) is set aside for that consumer in the same write as the position past it, instead of
        # stopping the runtime at every start on the same stored record
        failed: list = []
        rows = self.router.outgoing(self.name, 0, prods, True, failed)
        if prods:
            state = orjson.dumps({"position": poll.position, "estimate": max(self.estimate, poll.watermark_us)})
            aside = [SetAsideRecord(consumer, p.id, p.key, f"the key extractor of {consumer} for stream {p.stream} "
                                    f"raised: {error}", 1, p.value, p.timestamp_us, self.name, p.produced_at_us)
                     for consumer, p, error in failed]
            writes.append(Write(self.name, 0, self.seq, key="", state=state, productions=prods, set_aside=aside))
        self.store.commit(writes)
        for consumer, _, _ in failed:
            self.set_aside[consumer] = self.set_aside.get(consumer, 0) + 1
        out = self.tracker.register(self.name, rows, now, cfg.retry_delay_us)
        self.tracker.send(out)
        self.injected += len(prods)
        self.estimate = max(self.estimate, poll.watermark_us)
        self.caught_up = poll.caught_up and not prods
        return prods

    def _report_watermark(self) -> None:
        """min(estimate, oldest unacked production), read in that order: productions are registered
        before the estimate rises, so the pair never shows a gap."""
        estimate = self.estimate
        (oldest,) = self.tracker.oldest([(self.name, 0)])
        low = interval_low(oldest, estimate)
        if low != self._reported:
            self._reported = low
            self._report.put_many([WatermarksReported((WatermarkReported(self.name, 0, self.seq, low),))])
