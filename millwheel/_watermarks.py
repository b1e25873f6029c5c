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
watermark pass work that is in flight between them. A computation on a cycle would wait for itself under
that rule; each cyclic component of the topology (:func:`cyclic_components`) is published as one unit from
a consistent cut taken in epochs instead (see :class:`WatermarkAuthority`).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Hashable, Iterable, Mapping

NO_WATERMARK = 0
"""The watermark of something that knows nothing yet (no producers, no estimate)."""
END_OF_TIME = (1 << 63) - 1
"""The watermark of input that is complete: every timer can fire."""


class TimestampBag:
    """A multiset of timestamps with a fast minimum (lazy-deleting heap). Not thread-safe.

    It can also keep a *window low*: :meth:`mark` starts a window, and :meth:`window_low` is the smallest
    timestamp the bag held at any moment since (what was in it at the mark and everything added after;
    removals do not raise it). The cut of a cycle's watermark is made of these (see
    :class:`WatermarkAuthority`)."""

    __slots__ = ("_counts", "_heap", "_marked", "_window", "size")

    def __init__(self) -> None:
        self._counts: dict[int, int] = {}
        self._heap: list[int] = []
        self.size = 0
        self._window: int | None = None
        self._marked = False

    def add(self, ts: int) -> None:
        c = self._counts.get(ts, 0)
        if c == 0:
            heapq.heappush(self._heap, ts)
        self._counts[ts] = c + 1
        self.size += 1
        if self._marked and (self._window is None or ts < self._window):
            self._window = ts

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

    def window_low(self) -> int | None:
        """The smallest timestamp held since the last :meth:`mark` (before any mark: the current minimum)."""
        return self._window if self._marked else self.min()

    def mark(self) -> int | None:
        """End the current window and start a new one now; returns the ended window's low."""
        ended = self.window_low()
        self._window, self._marked = self.min(), True
        return ended

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
    epoch: int = 0
    """For a computation on a cycle: the newest cut epoch its owner has seen (0: none yet)."""
    cut_us: int | None = None
    """With ``epoch``: the smallest timestamp of any work the interval held at any moment since its owner
    first saw epoch ``epoch - 1`` (``None``: none), see :class:`WatermarkAuthority`."""


@dataclass(frozen=True, slots=True)
class EpochDecided:
    """Cut epoch ``epoch`` of the cyclic component ``component`` (its members' names, sorted, joined by
    ``/``) is announced, decided when the component's external input watermark was ``external_us`` and
    ``cohort`` (``(name, interval, sequencer)`` each) had reported under ``epoch - 1``. An authority that
    does not decide epochs itself (several processes' authorities sharing one store) proposes them in
    :attr:`WatermarksPublished.proposals` and learns the one decision of each step by this event."""
    component: str
    epoch: int
    external_us: int
    cohort: tuple


@dataclass(frozen=True, slots=True)
class WatermarksPublished:
    """What the authority publishes: every computation's and injector's low watermark (``lows``), the
    input watermark each computation's consumers will compute from them (``inputs``), and whether the
    reports are *settled*: every interval has reported, and once the current reports have propagated
    (each consumer reporting again with its new input) no interval's oldest work would fall at or below
    its input unless it already does with the input it used. Then no watermark timer is about to become
    due: a runtime whose records are all acked may call itself idle. ``epochs``: the cut epoch announced
    to every computation on a cycle (the workers report under it)."""
    lows: Mapping[str, int]
    inputs: Mapping[str, int]
    settled: bool
    epochs: Mapping[str, int] = field(default_factory=dict)
    proposals: tuple[EpochDecided, ...] = ()


@dataclass(frozen=True)
class AuthorityStatistics:
    intervals: int
    reports_accepted: int
    reports_stale: int
    unreported: int
    cycles: int = 0
    """Strongly connected components of the topology with a cycle, each published as one unit."""
    cuts_published: int = 0
    """Epochs whose cut was complete and consistent (so a cycle's watermark was computed from it)."""
    cuts_refused: int = 0
    """Epochs every interval reported under but whose cut was not usable (an interval moved meanwhile)."""


@dataclass
class _Cut:
    """The epoch protocol of one cyclic component (see :class:`WatermarkAuthority`)."""
    epoch: int = 1
    cohort: dict | None = None       # (name, interval) -> sequencer that reported epoch - 1 before the announcement
    external_us: int = NO_WATERMARK  # the component's external input watermark when this epoch was announced
    closed: bool = False             # this epoch's reports are used (published, or refused)


# an interval's entry: [sequencer, low, input used, oldest work, sequencer of the report, epoch, cut]
_SEQ, _LOW, _USED, _OLDEST, _REP_SEQ, _EPOCH, _CUT = range(7)


class WatermarkAuthority:
    """The low watermark authority (paper §7.2): a pure object, reports in, publications out.

    Per name (computation or injector) it keeps an *interval map*: interval → (sequencer, last value,
    input used, oldest work, and for a cycle the last epoch and cut). Lifecycle: :meth:`restore` the last
    persisted watermarks (optional, once), then any sequence of :meth:`handle` (:class:`IntervalAssigned`,
    :class:`WatermarkReported`) and :meth:`publish`.

    Guarantees: a report whose sequencer is below the interval's known one is ignored (counted as stale);
    an interval assigned and not reported since (never, or moved to an owner that has not reported yet)
    counts at its last value, and one that never reported holds the name at its last published value;
    a published value never decreases. The name's published value is max(last published, min over its
    intervals). Consumers take the minimum over their producers (:func:`input_watermark`); with reports
    bounded by the input their owner used, the authority never leads the workers.

    **Cycles.** On a cycle that rule would hold every member at its first value (each waits for the
    other), so each strongly connected component of the topology with a cycle (:func:`cyclic_components`)
    is published as one unit by a consistent cut in epochs. The authority announces epoch E (in
    :attr:`WatermarksPublished.epochs`); the owner of every interval of the component reports under E the
    smallest timestamp of all the work it held (received records, its productions not acked by every
    consumer, pending watermark timers) at any moment since it first saw E − 1. Once every interval has
    reported under E with its current sequencer, and each of those sequencers had reported under E − 1
    before E was announced (the *cohort*; a moved interval breaks it), every member's window contains the
    moment E was announced, and any work in the component then or later descends from work some member
    held in its window or from input that came in later, bounded by the external inputs' watermarks at
    the announcement. So the component publishes max(last published, min(external inputs' watermark when
    E was announced, the reports' cuts)) for every member, and the authority announces E + 1 when that
    could move something (or when the cut was refused). Reports without an epoch never complete a cut:
    the component then holds at its last value, as a moved or silent interval does.
    """

    def __init__(self, decide_epochs: bool = True) -> None:
        self._intervals: dict[str, dict[Hashable, list]] = {}   # name -> interval -> entry (see _SEQ ...)
        self._published: dict[str, int] = {}
        self._accepted = self._stale = 0
        self._decide = decide_epochs
        self._cuts: dict[str, _Cut] = {}        # component key -> its protocol
        self._proposals: list[EpochDecided] = []
        self._topology: tuple | None = None   # (producers as compared, components)
        self._cuts_published = self._cuts_refused = 0

    def restore(self, watermarks: Mapping[str, int]) -> None:
        """Start from persisted watermarks: nothing is published below them."""
        for name, wm in watermarks.items():
            self._published[name] = max(int(wm), self._published.get(name, NO_WATERMARK))

    def handle(self, *events: IntervalAssigned | WatermarkReported | EpochDecided) -> None:
        for ev in events:
            kind = type(ev)
            if kind is WatermarkReported:
                self._on_report(ev)
            elif kind is EpochDecided:
                cut = self._cuts.setdefault(ev.component, _Cut())
                if ev.epoch > cut.epoch:
                    self._adopt(cut, ev)
            elif kind is IntervalAssigned:
                intervals = self._intervals.setdefault(ev.name, {})
                entry = intervals.setdefault(ev.interval, [ev.sequencer, None, None, None, None, 0, None])
                entry[_SEQ] = max(entry[_SEQ], ev.sequencer)
            else:
                raise TypeError(f"WatermarkAuthority cannot handle {ev!r}")

    def _on_report(self, ev: WatermarkReported) -> None:
        entry = self._intervals.setdefault(ev.name, {}).get(ev.interval)
        if entry is None:
            entry = self._intervals[ev.name][ev.interval] = [ev.sequencer, None, None, None, None, 0, None]
        if ev.sequencer < entry[_SEQ]:
            self._stale += 1
            return
        entry[:] = [ev.sequencer, ev.low_us, ev.input_us, ev.oldest_us, ev.sequencer, ev.epoch, ev.cut_us]
        self._accepted += 1

    def components(self, producers: Mapping[str, Iterable[str]]) -> list[frozenset[str]]:
        """The cyclic components of the topology ``producers`` describes (computed again when it changes)."""
        key = {c: tuple(ps) for c, ps in producers.items()}
        if self._topology is None or self._topology[0] != key:
            self._topology = (key, cyclic_components(key))
        return self._topology[1]

    def publish(self, producers: Mapping[str, Iterable[str]]) -> WatermarksPublished:
        """Publish every name's low watermark; ``producers`` maps each computation to the names producing
        to what it consumes (the topology), for ``inputs``, the settled check and the cycles."""
        pub = self._published
        comps = self.components(producers)
        on_cycle = {n for comp in comps for n in comp}
        for name, intervals in self._intervals.items():
            if name in on_cycle:
                continue
            prev = pub.get(name, NO_WATERMARK)
            values = [e[_LOW] for e in intervals.values()]
            if values and None not in values:
                pub[name] = max(prev, min(values))
            else:
                pub[name] = prev
        epochs: dict[str, int] = {}
        self._proposals = []
        for comp in comps:
            key = component_key(comp)
            cut = self._cuts.get(key)
            if cut is None:
                cut = self._cuts[key] = _Cut(external_us=self._external(comp, producers))
            self._advance(comp, key, cut, producers)
            epochs.update(dict.fromkeys(comp, cut.epoch))
        inputs = {c: input_watermark(ps, pub) for c, ps in producers.items()}
        return WatermarksPublished(dict(pub), inputs, self._settled(producers), epochs, tuple(self._proposals))

    def _external(self, comp: frozenset, producers: Mapping[str, Iterable[str]]) -> int:
        """The watermark of what comes into ``comp`` from outside it (:data:`NO_WATERMARK` if nothing does,
        as for a computation with no producers)."""
        outside = sorted({p for m in comp for p in producers.get(m, ())} - comp)
        return input_watermark(outside, self._published)

    def _advance(self, comp: frozenset, key: str, cut: _Cut, producers: Mapping[str, Iterable[str]]) -> None:
        """One step of the component's epoch protocol (see the class docstring)."""
        pub = self._published
        for name in comp:
            pub.setdefault(name, NO_WATERMARK)
        if any(name not in self._intervals for name in comp):
            return                                     # a member has no interval yet: nothing to cut
        entries = {(name, i): e for name in comp for i, e in self._intervals[name].items()}
        if not all(e[_REP_SEQ] == e[_SEQ] and e[_EPOCH] == cut.epoch for e in entries.values()):
            return                                     # reports under this epoch still missing
        usable = cut.cohort is not None and len(cut.cohort) == len(entries) and \
            all(cut.cohort.get(k) == e[_REP_SEQ] for k, e in entries.items())
        if not cut.closed:
            cut.closed = True
            if usable:
                self._cuts_published += 1
                value = min([cut.external_us] + [END_OF_TIME if e[_CUT] is None else e[_CUT]
                                                  for e in entries.values()])
                for name in comp:
                    pub[name] = max(pub[name], value)
            else:
                self._cuts_refused += 1 if cut.cohort is not None else 0
        external = self._external(comp, producers)
        oldest = min([END_OF_TIME] + [e[_OLDEST] for e in entries.values() if e[_OLDEST] is not None])
        if not usable or min(external, oldest) > min(pub[name] for name in comp):
            decision = EpochDecided(key, cut.epoch + 1, external,
                                    tuple(sorted((n, i, e[_REP_SEQ]) for (n, i), e in entries.items())))
            if self._decide:
                self._adopt(cut, decision)
            else:
                self._proposals.append(decision)

    @staticmethod
    def _adopt(cut: _Cut, decision: EpochDecided) -> None:
        cut.epoch = decision.epoch
        cut.cohort = {(n, i): seq for n, i, seq in decision.cohort}
        cut.external_us = decision.external_us
        cut.closed = False

    def _settled(self, producers: Mapping[str, Iterable[str]]) -> bool:
        eventual = self._eventual_inputs(producers)
        for name, intervals in self._intervals.items():
            want = eventual.get(name)
            for e in intervals.values():
                low, used, oldest = e[_LOW], e[_USED], e[_OLDEST]
                if low is None:
                    return False
                if want is not None and used != want and oldest is not None and oldest <= want:
                    return False
        return True

    def _eventual_inputs(self, producers: Mapping[str, Iterable[str]]) -> dict[str, int]:
        """Each computation's input once the current reports have propagated: from the published values,
        raise every computation to min(its oldest reported work, its input) until nothing moves; a cyclic
        component rises as one, to min(the oldest work of all its members, its external input)."""
        low = dict(self._published)
        names = [n for n in producers if n in self._intervals]
        oldest: dict[str, int | None] = {}
        for n in names:
            values = [e[_OLDEST] for e in self._intervals[n].values() if e[_OLDEST] is not None]
            oldest[n] = min(values) if values else None
        unit: dict[str, tuple] = {}
        for comp in self.components(producers):
            outside = sorted({p for m in comp for p in producers.get(m, ())} - comp)
            own = [oldest[m] for m in comp if oldest.get(m) is not None]
            for m in comp:
                unit[m] = (outside, min(own) if own else None)
        for _ in range(len(names) + 2):
            changed = False
            for n in names:
                ins, own = unit.get(n, (producers[n], oldest[n]))
                value = max(low.get(n, NO_WATERMARK), interval_low(own, input_watermark(ins, low)))
                if value != low.get(n):
                    low[n], changed = value, True
            if not changed:
                break
        return {c: input_watermark(ps, low) for c, ps in producers.items()}

    def sequencer(self, name: str, interval: Hashable) -> int | None:
        entry = self._intervals.get(name, {}).get(interval)
        return None if entry is None else entry[_SEQ]

    def statistics(self) -> AuthorityStatistics:
        n = sum(len(m) for m in self._intervals.values())
        unreported = sum(1 for m in self._intervals.values() for e in m.values() if e[_LOW] is None)
        cycles = len(self._topology[1]) if self._topology else 0
        return AuthorityStatistics(n, self._accepted, self._stale, unreported, cycles, self._cuts_published,
                                   self._cuts_refused)


def component_key(component: Iterable[str]) -> str:
    """The name of a cyclic component: its members sorted, joined by ``/`` (no name contains one)."""
    return "/".join(sorted(component))


def cyclic_components(producers: Mapping[str, Iterable[str]]) -> list[frozenset[str]]:
    """The strongly connected components of a topology that hold a cycle: two or more names, or one that
    consumes what it produces. ``producers`` maps each computation to the names producing to what it
    consumes. Tarjan's algorithm, iterative (no recursion limit), over the edges consumer → producer
    (the components are the same either way); deterministic for a given mapping."""
    succ = {n: tuple(ps) for n, ps in producers.items()}
    index: dict[str, int] = {}
    lowlink: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[frozenset[str]] = []
    for root in succ:
        if root in index:
            continue
        index[root] = lowlink[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(succ.get(root, ())))]
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = lowlink[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(succ.get(w, ()))))
                    break
                if w in on_stack:
                    lowlink[v] = min(lowlink[v], index[w])
            else:
                work.pop()
                if work:
                    u = work[-1][0]
                    lowlink[u] = min(lowlink[u], lowlink[v])
                if lowlink[v] == index[v]:
                    comp = set()
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.add(w)
                        if w == v:
                            break
                    if len(comp) > 1 or v in succ.get(v, ()):
                        out.append(frozenset(comp))
    return out


def new_grants(granted: dict, assigned) -> list[tuple[str, int, int]]:
    """The grants among ``assigned`` (:class:`IntervalAssigned`, from the master's maps) newer than those in
    ``granted`` (``(name, interval)`` -> the sequencer last recorded), as ``(name, interval, sequencer)``
    rows to record in the store; ``granted`` is updated to them."""
    out = []
    for a in assigned:
        key = (a.name, a.interval)
        if a.sequencer > granted.get(key, 0):
            granted[key] = a.sequencer
            out.append((a.name, a.interval, a.sequencer))
    return out


def reports_to_write(rows, held: dict, granted: dict) -> list[tuple]:
    """The report rows ``(name, interval, sequencer, ...)`` a process may write: of an interval it holds
    under that sequencer (``held``) and that no newer grant has reached it for (``granted``: the newest
    sequencers of the master's maps it has read, which it may read before it gives the interval up)."""
    return [r for r in rows if held.get((r[0], r[1])) == r[2] and granted.get((r[0], r[1]), 0) <= r[2]]


def is_late(timestamp_us: int, input_watermark_us: int) -> bool:
    """A record is late when its timestamp is below the consumer's input low watermark: its producers
    had promised nothing older would come."""
    return timestamp_us < input_watermark_us


def advance(previous: int, candidate: int) -> int:
    """The next published value of a monotonic watermark."""
    return candidate if candidate > previous else previous
