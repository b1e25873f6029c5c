"""Low-watermark arithmetic (MillWheel paper §4.5). Pure: no threads, clocks or I/O.

Definitions used throughout the runtime:

* The *oldest work* of a computation is the smallest timestamp among its unfinished work: records
  delivered to it and not yet committed, its productions not yet acked by every consumer (stored or
  pending delivery), and its pending watermark timers (a pending timer holds the watermark at its
  timestamp, so what the timer produces at that timestamp is not late downstream).
* The *input low watermark* of computation A is the minimum of the low watermarks of every computation
  and injector producing to a stream A consumes. Watermark timers of A fire, and A's records are
  flagged late, against it.
* The *low watermark* of A = min(oldest work of A, input low watermark of A): the paper's
  "min(oldest work of A, low watermarks of all computations producing to A)".
* An injector's low watermark = min(its own published estimate, its oldest unacked production).
* Every published watermark is monotonic: a late record entering a computation's work cannot move it
  back (the record is flagged late instead).

How they are computed (paper §7.2): the owner of each key interval reports the low watermark of its work
there, :func:`interval_low` = min(the interval's oldest work, the input watermark it used), with its
sequencer. The :class:`WatermarkAuthority` keeps an interval map per computation, ignores stale reports,
and publishes each computation's watermark (the minimum over its intervals, never decreasing); each
consumer takes the minimum over its producers (:func:`input_watermark`). Because a report is bounded by
the input its owner saw, reports taken at different moments by different workers never let a published
watermark pass work that is in flight between them.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Hashable, Iterable, Mapping

NO_WATERMARK = 0
"""The watermark of something that knows nothing yet (no producers, no estimate)."""
END_OF_TIME = (1 << 63) - 1
"""The watermark of input that is complete: every timer can fire."""


class TimestampBag:
    """A multiset of timestamps with a fast minimum (lazy-deleting heap). Not thread-safe."""

    __slots__ = ("_counts", "_heap", "size")

    def __init__(self) -> None:
        self._counts: dict[int, int] = {}
        self._heap: list[int] = []
        self.size = 0

    def add(self, ts: int) -> None:
        c = self._counts.get(ts, 0)
        if c == 0:
            heapq.heappush(self._heap, ts)
        self._counts[ts] = c + 1
        self.size += 1

    def remove(self, ts: int) -> None:
        c = self._counts.get(ts, 0)
        if c <= 0:
            raise KeyError(f"timestamp {ts} is not in the bag")
        if c == 1:
            del self._counts[ts]
        else:
            self._counts[ts] = c - 1
        self.size -= 1

    def min(self) -> int | None:
        heap = self._heap
        while heap and heap[0] not in self._counts:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def __len__(self) -> int:
        return self.size


def input_watermark(producers: Iterable[str], published: Mapping[str, int]) -> int:
    """A consumer's input low watermark: the minimum of its producers' published low watermarks
    (:data:`NO_WATERMARK` when it has none, or one has published nothing yet)."""
    values = [published.get(p, NO_WATERMARK) for p in producers]
    return min(values) if values else NO_WATERMARK


def interval_low(oldest_work_us: int | None, input_watermark_us: int | None) -> int:
    """The low watermark of one interval's work: ``min(oldest work, input watermark)``; an injector has no
    input (``None``) and reports min(its estimate, its oldest unacked production) as ``oldest_work_us``."""
    low = END_OF_TIME if oldest_work_us is None else oldest_work_us
    if input_watermark_us is not None and input_watermark_us < low:
        low = input_watermark_us
    return low


# ---------------------------------------------------------------- the authority (paper §7.2)

@dataclass(frozen=True, slots=True)
class IntervalAssigned:
    """``interval`` of ``name`` now belongs to the holder of ``sequencer`` (a claim, a master's grant).
    Reports with an older sequencer are stale from now on; the interval keeps its last value until its
    new owner reports."""
    name: str
    interval: Hashable
    sequencer: int


@dataclass(frozen=True, slots=True)
class WatermarkReported:
    """The owner of ``interval`` (holding ``sequencer``) found the low watermark of its work there to be
    ``low_us`` (:func:`interval_low`), computed with input watermark ``input_us`` (``None``: an injector,
    which has no input)."""
    name: str
    interval: Hashable
    sequencer: int
    low_us: int
    input_us: int | None = None
    oldest_us: int | None = None
    """The interval's oldest work itself (``None``: none), which tells the authority when the interval
    will have something to do as its input rises (see :attr:`WatermarksPublished.settled`)."""


@dataclass(frozen=True, slots=True)
class WatermarksPublished:
    """What the authority publishes: every computation's and injector's low watermark (``lows``), the
    input watermark each computation's consumers will compute from them (``inputs``), and whether the
    reports are *settled*: every interval has reported, and once the current reports have propagated
    (each consumer reporting again with its new input) no interval's oldest work would fall at or below
    its input unless it already does with the input it used. Then no watermark timer is about to become
    due: a runtime whose records are all acked may call itself idle."""
    lows: Mapping[str, int]
    inputs: Mapping[str, int]
    settled: bool


@dataclass(frozen=True)
class AuthorityStatistics:
    intervals: int
    reports_accepted: int
    reports_stale: int
    unreported: int


class WatermarkAuthority:
    """The low watermark authority (paper §7.2): a pure object, reports in, publications out.

    Per name (computation or injector) it keeps an *interval map*: interval → (sequencer, last value,
    input used, oldest work). Lifecycle: :meth:`restore` the last persisted watermarks (optional, once), then any
    sequence of :meth:`handle` (:class:`IntervalAssigned`, :class:`WatermarkReported`) and
    :meth:`publish`.

    Guarantees: a report whose sequencer is below the interval's known one is ignored (counted as stale);
    an interval assigned and not reported since (never, or moved to an owner that has not reported yet)
    counts at its last value, and one that never reported holds the name at its last published value;
    a published value never decreases. The name's published value is max(last published, min over its
    intervals). Consumers take the minimum over their producers (:func:`input_watermark`); with reports
    bounded by the input their owner used, the authority never leads the workers (a cycle therefore holds
    at the value it started with).
    """

    def __init__(self) -> None:
        self._intervals: dict[str, dict[Hashable, list]] = {}   # name -> interval -> [seq, low, input, oldest]
        self._published: dict[str, int] = {}
        self._accepted = self._stale = 0

    def restore(self, watermarks: Mapping[str, int]) -> None:
        """Start from persisted watermarks: nothing is published below them."""
        for name, wm in watermarks.items():
            self._published[name] = max(int(wm), self._published.get(name, NO_WATERMARK))

    def handle(self, *events: IntervalAssigned | WatermarkReported) -> None:
        for ev in events:
            kind = type(ev)
            if kind is WatermarkReported:
                self._on_report(ev)
            elif kind is IntervalAssigned:
                intervals = self._intervals.setdefault(ev.name, {})
                entry = intervals.setdefault(ev.interval, [ev.sequencer, None, None, None])
                entry[0] = max(entry[0], ev.sequencer)
            else:
                raise TypeError(f"WatermarkAuthority cannot handle {ev!r}")

    def _on_report(self, ev: WatermarkReported) -> None:
        entry = self._intervals.setdefault(ev.name, {}).get(ev.interval)
        if entry is None:
            entry = self._intervals[ev.name][ev.interval] = [ev.sequencer, None, None, None]
        if ev.sequencer < entry[0]:
            self._stale += 1
            return
        entry[0], entry[1], entry[2], entry[3] = ev.sequencer, ev.low_us, ev.input_us, ev.oldest_us
        self._accepted += 1

    def publish(self, producers: Mapping[str, Iterable[str]]) -> WatermarksPublished:
        """Publish every name's low watermark; ``producers`` maps each computation to the names producing
        to what it consumes (the topology), for ``inputs`` and the settled check."""
        pub = self._published
        for name, intervals in self._intervals.items():
            prev = pub.get(name, NO_WATERMARK)
            values = [e[1] for e in intervals.values()]
            if values and None not in values:
                pub[name] = max(prev, min(values))
            else:
                pub[name] = prev
        inputs = {c: input_watermark(ps, pub) for c, ps in producers.items()}
        return WatermarksPublished(dict(pub), inputs, self._settled(producers))

    def _settled(self, producers: Mapping[str, Iterable[str]]) -> bool:
        eventual = self._eventual_inputs(producers)
        for name, intervals in self._intervals.items():
            want = eventual.get(name)
            for _, low, used, oldest in intervals.values():
                if low is None:
                    return False
                if want is not None and used != want and oldest is not None and oldest <= want:
                    return False
        return True

    def _eventual_inputs(self, producers: Mapping[str, Iterable[str]]) -> dict[str, int]:
        """Each computation's input once the current reports have propagated: from the published values,
        raise every computation to min(its oldest reported work, its input) until nothing moves (a
        cycle stays where it is, as it does when published)."""
        low = dict(self._published)
        names = [n for n in producers if n in self._intervals]
        oldest = {}
        for n in names:
            values = [e[3] for e in self._intervals[n].values() if e[3] is not None]
            oldest[n] = min(values) if values else None
        for _ in range(len(names) + 2):
            changed = False
            for n in names:
                value = max(low.get(n, NO_WATERMARK), interval_low(oldest[n], input_watermark(producers[n], low)))
                if value != low.get(n):
                    low[n], changed = value, True
            if not changed:
                break
        return {c: input_watermark(ps, low) for c, ps in producers.items()}

    def sequencer(self, name: str, interval: Hashable) -> int | None:
        entry = self._intervals.get(name, {}).get(interval)
        return None if entry is None else entry[0]

    def statistics(self) -> AuthorityStatistics:
        n = sum(len(m) for m in self._intervals.values())
        unreported = sum(1 for m in self._intervals.values() for e in m.values() if e[1] is None)
        return AuthorityStatistics(n, self._accepted, self._stale, unreported)

def is_late(timestamp_us: int, input_watermark_us: int) -> bool:
    """A record is late when its timestamp is below the consumer's input low watermark: its producers
    had promised nothing older would come."""
    return timestamp_us < input_watermark_us


def advance(previous: int, candidate: int) -> int:
    """The next published value of a monotonic watermark."""
    return candidate if candidate > previous else previous
