"""The dispatcher's deciding core: a pure object, facts in, instructions out.

:class:`DispatcherState` owns everything the dispatcher decides: which lines are bad records, which ids are
unresolved, what goes into the next registry lookup and joiner request, when an event is retried and when
it is given up as unjoinable, and what a checkpoint holds. It has no sockets, threads or clock reads; the
shell (``_shell.py``) feeds it events (past-tense facts) through :meth:`DispatcherState.handle` and carries
out the commands it returns, **in order**.

Lifecycle of one foreign event::

    LinesRead ──► queued ──► Lookup ──► LookupAnswered ──► SendBatch ──► JoinAnswered ─┬─► resolved
                    ▲          (present: already registered, resolved)                  │
                    ├──────────── retry heap (backoff) ◄── NOT_FOUND / THROTTLED / JoinFailed
                    └── held for the event store (its query not read yet, see _not_ahead) ◄── queued

*Unresolved* events (queued, in a lookup or joiner request, waiting in the retry heap or for the event store)
are unique by id: a second copy of an unresolved id is parked beside the first and resolved the same way.

Offset rule: :attr:`DispatcherState.offsets` holds, per file, the offset just past the last line fed in.
Every line before it is resolved, quarantined, or unresolved and therefore inside the next checkpoint, so
resuming at a checkpoint's offsets with its events re-queued loses nothing. The shell executes commands in
order, so quarantine and unjoinable writes land before the checkpoint that moves offsets past them.
"""
from __future__ import annotations

import heapq
import itertools
from bisect import bisect_right
from collections import Counter, deque
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import eq, gt, is_not, itemgetter, not_

import orjson
import msgspec.json  # noqa: F401  (photon.StringFields imports it on first use; here the fork server has it
                    # loaded, with this room, before it forks the service)
from tenacity import RetryCallState, wait_exponential

from dispatcher._messages import ChunkRead  # noqa: F401  (re-exported with the core's other messages)
from dispatcher._messages import (Checkpoint, Command, Event, JoinAnswered, JoinFailed, LinesRead,
                                  Lookup, LookupAnswered, LookupFailed, QuarantineRecords, SendBatch, StopRequested,
                                  TimePassed, WriteUnjoinable)
from dispatcher._share import RegionShare
from photon import (ID_KEY, ID_TIME_DIGITS, TIMESTAMP_DIGITS, BadEventId, Outcome, DispatcherConfig, JoinConfig,
                    LatencyHistogram, bad_id_positions, drop_at, is_event_id, parse_event_id, string_fields)

CHECKPOINT_FORMAT = 2
"""The full snapshot (see :meth:`DispatcherState.snapshot`): 2 holds the unresolved events as columns, like a
delta's events read since; 1 as rows (``[id, ref, raw, first_seen_us, attempts, [copy, ...]]``). Restoring and
:func:`apply_delta` read both (see :func:`snapshot_events`) and refuse any other."""
DELTA_FORMAT = 3
"""The journal's deltas (see :meth:`DispatcherState.delta`): 3 holds the events read since as columns with their
raw lines as bytes (joined by newlines, each line's length beside them, written to the journal after the delta's
JSON line as they are: see ``_files.encode_delta``), 2 as the same columns with the lines as text inside the
JSON, 1 (no ``"format"`` key) as rows like the snapshot's; :func:`apply_delta` reads all three and refuses any
other."""
JOURNAL_COMPACT_MIN_ENTRIES = 100_000
"""A full checkpoint replaces the journal once the journal holds more entries than this and more than
twice the unresolved events (so rewriting the unresolved events costs O(1) per journal entry)."""
STORE_PROBE_EVERY_US = 200_000
"""While clicks wait for the event store to catch up and no request is out whose answer would say whether it
has, one batch of them (the longest waiting) is sent this often as a probe."""
STORE_POSITION_PROBE_US = 50_000
"""While clicks are held back because the event store has not read their queries yet and no request is out
(whose answer would say how far the store has read), an empty request asks a joiner this often."""
RETRY_GATHER_SHARE = 0.25
"""When a retry falls due, the retries due within this share of the first retry delay (``retry_initial_s``)
after it go with it, in the same requests, a little early. Retry delays are jittered per click, so a tail of
clicks that fell due together (e.g. unjoinable clicks all let go when the event store catches up) would
otherwise come due one by one and go as one request per click, each a registry lookup, a joiner request and
event store lookups, competing with live clicks for the request slots and the CPU; gathered, they go in a few
requests. Nothing goes before the first of them is due."""
LATENCY_SAMPLES = 4096
OLDEST_HEAP_SLACK = 1024
"""The heap behind :meth:`DispatcherState.oldest_unresolved_us` is rebuilt from the unresolved ids once it holds
more than twice as many entries plus this many (resolved ids leave it lazily)."""
_MAX_ATTEMPT_TABLE = 64


# ---------------------------------------------------------------- statistics


@dataclass(frozen=True)
class DispatcherStatistics:
    """What a dispatcher has done so far (counters are cumulative across restarts, as checkpointed).

    ``already_registered`` counts events resolved because the registry already held their id: dropped by
    the registry lookup, answered ALREADY_REGISTERED, and later lines of an id that was still unresolved
    (resolved with it). It is what the dispatcher can know, not a count of prevented duplicates: the id
    being registered does not say that the click is in some output (its joiner may have died between
    commit and write, or a commit whose outcome stayed unknown may have taken it); only reconciling the
    registry with the output tells (the run summary, the verification job). ``wasted_joins`` counts the
    ALREADY_REGISTERED answers alone: joins done only to find the id registered. ``lost`` counts events
    answered LOST: registered, their output write failed, recorded in the joiner's lost-ids ledger for the
    recovery job. ``caught_up`` is true iff the latest scan found no new complete line, nothing is in
    flight, nothing is queued or waiting for a retry or for the event store, and every line given up is
    written to the unjoinable output.
    """
    events_read: int = 0
    joined: int = 0
    wasted_joins: int = 0
    already_registered: int = 0
    unjoinable: int = 0
    lost: int = 0
    bad_records: int = 0
    retry_queue: int = 0
    waiting_for_store: int = 0     # THROTTLED while the event store was catching up, or held back before
    #                                sending because the store has not read their queries yet (see ahead_of_store)
    ahead_of_store: int = 0        # of those, held back: their query's time is past what the store has read
    held_for_store: int = 0        # clicks held back so far (a click may be held more than once)
    store_probes: int = 0          # empty requests sent to learn how far the store has read
    queued: int = 0
    in_flight: int = 0
    requests_in_flight: int = 0
    attempts: int = 0
    lookup_failures: int = 0
    join_failures: int = 0
    pending_bytes: int = 0
    caught_up: bool = False
    scan_at_us: int = 0
    join_latency_ms: dict = field(default_factory=dict)   # percentiles of the last LATENCY_SAMPLES joins
    join_latency_hist: dict = field(default_factory=dict)  # every join of the run: LatencyHistogram.to_json()
    pid: int = 0
    waiting_for_disk: str = ""   # set by the shell: the write it is paused on (disk full), "" when none
    oldest_unresolved_us: int = 0  # event time of the oldest click still unresolved (0: none); see photon._horizon
    held_for_owner: int = 0        # clicks held back for their owner region (this process; see _share.py)
    held_found_present: int = 0    # of those, found joined by their owner after the grace: no join here
    held_joined: int = 0           # of those, joined here (the owner had not)
    held_wasted: int = 0           # of those, joined here too late: wasted after all
    held_again: int = 0            # lookups of held clicks that found them unjoined, held again (owner progressing)
    share_judged_down: int = 0     # times an owner region was judged down (silent for its patience)
    held_late: int = 0             # held clicks joined here while their owner progressed (waited > its lag + patience)
    share_grace_ms: dict = field(default_factory=dict)   # owner region -> its grace now
    share_down: list = field(default_factory=list)       # owner regions judged down (their clicks taken at once)
    share_leader_region: str = ""  # the registry leader's region, owning share_leader_fraction of the clicks ("": none)


_MISSING = object()
_HELD_TIME = itemgetter(0)
_HELD_ID = itemgetter(1)
_HELD_KEY = itemgetter(2)
_PAST_ANY_TIME = ":"      # sorts after every timestamp's digits (":" follows "9")
_TIME_TEXT = f"{{:0{TIMESTAMP_DIGITS}d}}"


def time_text(limit_us: int) -> str:
    """A time as an id's fixed-width timestamp digits, for comparing with ``ID_TIME_DIGITS`` of ids as text
    (text order is time order): a time before every id's sorts first, one past every id's last."""
    if limit_us < 0:
        return ""
    if limit_us >= 10**TIMESTAMP_DIGITS:
        return _PAST_ANY_TIME
    return _TIME_TEXT.format(int(limit_us))


class AheadOfStore:
    """Clicks held back because the event store has not read their queries yet (see
    :meth:`DispatcherState._not_ahead`): ``since`` maps each held click to when it was held (in that order,
    for the time limit); per query key, sorted runs of ``(time digits, click id, key)``: clicks held at once
    are one run per key (sorted by time first, a pass over clicks that come nearly in time order, then dealt
    to their keys in that order: no comparison of keys, which cost most of the sort), appended
    to the key's last run when they come after it, and released by cutting a run at the store's position
    (``bisect``), not one heap step per click. Clicks
    that leave ``since`` otherwise (the time limit, resolved) leave the runs lazily; the runs are rebuilt
    from ``since`` before they hold more than twice as many entries plus :data:`OLDEST_HEAP_SLACK`."""

    def __init__(self) -> None:
        self.since: dict[str, int] = {}
        self._runs: dict[str, list[list]] = {}    # query key -> [[entries sorted, first not released], ...]
        self._entries = 0                          # entries not cut from the runs (some of released clicks)

    def __len__(self) -> int:
        return len(self.since)

    def entries(self) -> int:
        return self._entries

    def hold(self, keys: list[str], times: list[str], cids: list[str], now: int) -> None:
        """Hold ``cids`` (their queries' keys and time digits alongside) since ``now``."""
        self.since.update(dict.fromkeys(cids, now))
        self._add(sorted(zip(times, cids, keys)), keys)
        self._entries += len(cids)

    def _add(self, entries: list, keys) -> None:
        """Add ``entries`` (sorted) to their keys' runs; ``keys``: their keys, in any order."""
        distinct = set(keys)
        if len(distinct) == 1:                    # one key
            self._add_run(entries[0][2], entries)
            return
        runs = {key: [] for key in sorted(distinct)}   # (keys in order: released key by key in it)
        deque(map(list.append, map(runs.__getitem__, map(_HELD_KEY, entries)), entries), 0)
        for key, run in runs.items():
            self._add_run(key, run)

    def _add_run(self, key: str, entries: list) -> None:
        runs = self._runs.get(key)
        if runs is None:
            self._runs[key] = [[entries, 0]]
        elif runs[-1][0][-1] <= entries[0]:        # after the key's last run (reading in time order): one run
            runs[-1][0].extend(entries)
        else:
            runs.append([entries, 0])

    def rebuild_if_outgrown(self, ref_of) -> None:
        """Rebuild the runs from ``since`` (``ref_of(cid)``: its query's id) once released entries abound."""
        if self._entries <= 2 * len(self.since) + OLDEST_HEAP_SLACK:
            return
        self._runs = {}
        refs = list(map(ref_of, self.since))
        if refs:
            keys = list(map(ID_KEY, refs))
            self._add(sorted(zip(map(ID_TIME_DIGITS, refs), self.since, keys)), keys)
        self._entries = len(refs)

    def release(self, read_to: dict[str, int] | None, through_us: int) -> list[str]:
        """The held clicks whose query's time is at most the store's position (``read_to`` per key, else
        ``through_us``; all of them when ``read_to`` is None), key by key, each key's in (time, id) order."""
        since = self.since
        if not since:
            self._runs.clear()
            self._entries = 0
            return []
        runs_of = self._runs
        out: list = []
        for key in list(runs_of):
            runs = runs_of[key]
            if read_to is None:
                cut = [entries[start:] if start else entries for entries, start in runs]
                del runs_of[key]
            else:
                limit = time_text(read_to.get(key, through_us))
                cut, keep = [], []
                for run in runs:
                    entries, start = run
                    end = bisect_right(entries, limit, start, key=_HELD_TIME)
                    if end > start:
                        cut.append(entries[start:end] if start or end < len(entries) else entries)
                        run[1] = end
                    if end < len(entries):
                        keep.append(run)
                if len(keep) < len(runs):
                    if keep:
                        runs_of[key] = keep
                    else:
                        del runs_of[key]
            if cut:
                self._entries -= sum(map(len, cut))
                out.extend(map(_HELD_ID, cut[0] if len(cut) == 1 else sorted(itertools.chain.from_iterable(cut))))
        if read_to is None:
            self._entries = 0
        # a click held again after the time limit let it go may be in two runs: each released once (its
        # first entry pops it from since, a second one finds it gone), and only those still held
        released = list(compress(out, map(is_not, map(since.pop, out, repeat(_MISSING)), repeat(_MISSING))))
        if not since:
            self._runs.clear()
            self._entries = 0
        return released

    def expired(self, oldest: int) -> list[str]:
        """Take out the clicks held since ``oldest`` or before (in the order they were held)."""
        since = self.since
        expired = list(itertools.takewhile(lambda cid: since[cid] <= oldest, since))
        deque(map(since.__delitem__, expired), 0)
        return expired

    def forget(self, ids) -> None:
        """Drop ``ids`` (resolved; usually none of them held): a step per held one only."""
        since = self.since
        deque(map(since.__delitem__, since.keys() & ids), 0)


class _PositionDigits(dict):
    """The event store's position per query key as an id's time digits (:func:`time_text`): ``read_to``'s time
    for the key, else ``through_us``; each key's made the first time it is asked (``__getitem__`` in C finds
    the others), so a check of many clicks slices no key set beforehand."""

    __slots__ = ("_read_to", "_through_us")

    def __init__(self, read_to: dict[str, int], through_us: int) -> None:
        super().__init__()
        self._read_to, self._through_us = read_to, through_us

    def __missing__(self, key: str) -> str:
        digits = self[key] = time_text(self._read_to.get(key, self._through_us))
        return digits


_COUNTERS = ("events_read", "joined", "wasted_joins", "already_registered", "unjoinable", "lost",
             "bad_records", "attempts", "lookup_failures", "join_failures", "held_for_store", "store_probes")
_RENAMED_COUNTERS = {"already_joined": "wasted_joins", "duplicates_prevented": "already_registered"}
"""Counters of checkpoints written before their renaming, under their new names."""


def later_position(read_to: dict[str, int], through_us: int, new_read_to: dict[str, int],
                   new_through_us: int) -> tuple[dict[str, int], int]:
    """The later of two positions of the event store (per query key, the time up to which it has read that
    key; ``through_us`` for a key not named): key by key the greater. Answers to requests sent at once come
    back in any order, each with the position its lookup saw, so the latest answer may carry an older
    position; taken as it came, a click released by one answer was held again by the next."""
    keys = read_to.keys() | new_read_to.keys()
    return ({k: max(read_to.get(k, through_us), new_read_to.get(k, new_through_us)) for k in keys},
            max(through_us, new_through_us))


def backoff_table_us(initial_s: float, max_s: float) -> list[int]:
    """Retry delay after the n-th attempt (index n-1), from tenacity's exponential wait: doubling from
    ``initial_s``, capped at ``max_s``."""
    wait = wait_exponential(multiplier=initial_s, max=max_s, exp_base=2)
    state = RetryCallState(None, None, (), {})
    table = []
    for n in range(1, _MAX_ATTEMPT_TABLE + 1):
        state.attempt_number = n
        table.append(int(wait(state) * 1_000_000))
    return table


def percentiles_ms(samples_us, points=(50, 90, 99)) -> dict:
    """``{"p50": ms, ...}`` of the samples (nearest rank), or ``{}`` when there are none."""
    if not samples_us:
        return {}
    s = sorted(samples_us)
    n = len(s)
    return {f"p{p}": round(s[min(n - 1, max(0, -(-p * n // 100) - 1))] / 1000.0, 3) for p in points}


# ---------------------------------------------------------------- the core

_REF, _RAW, _FIRST_SEEN, _ATTEMPTS = range(4)  # fields of an unresolved event's record (a list)
_GET_REF, _GET_RAW, _GET_FIRST_SEEN, _GET_ATTEMPTS = (itemgetter(_REF), itemgetter(_RAW), itemgetter(_FIRST_SEEN),
                                                      itemgetter(_ATTEMPTS))

RECOVERY_FILE_PREFIX = "../"
"""Files of the recovery stream are named ``../<stream>-recovery/<file>`` (see ``_recovery.py``). Their clicks
are never dropped on a registry lookup's "present": ``photon recover`` deleted them from the registry just
before, and a replica that has not seen the delete yet (cut off from its leader) may still say present; the
joiner's commit decides instead (ALREADY_EXISTS if another joiner did join them since)."""


class DispatcherState:
    """The dispatcher's decisions. Only :meth:`handle` changes state; see the module doc for the lifecycle.

    ``lookups``: when false (no registry configured) batches go straight to the joiners.
    ``jitter``: a ``random.Random``-like object; each retry delay is scaled by ``1 - 0.2 * jitter.random()``
    (``None``: no jitter, fully deterministic).
    ``restore``: a snapshot from a previous run (see :meth:`snapshot`): its offsets are resumed and its
    unresolved events are queued to be sent again at the first :meth:`handle` call.
    """

    def __init__(self, join: JoinConfig, dispatcher: DispatcherConfig, *, lookups: bool = True,
                 jitter=None, restore: dict | None = None, share: RegionShare | None = None) -> None:
        self.join = join
        self.config = dispatcher
        self.lookups = lookups
        self._jitter = jitter
        self._delays_us = backoff_table_us(dispatcher.retry_initial_s, dispatcher.retry_max_s)
        self._give_up_after_us = int(join.unjoinable_after_s * 1_000_000)
        self._gather_us = int(self._delays_us[0] * RETRY_GATHER_SHARE)
        self._checkpoint_every_us = int(dispatcher.checkpoint_interval_s * 1_000_000)
        self._backlog_batch = max(dispatcher.batch_size, dispatcher.backlog_batch_size)
        self.offsets: dict[str, int] = {}
        self._events: dict[str, list] = {}        # unresolved id -> [ref, raw, first_seen_us, attempts]
        self._dups: dict[str, list[bytes]] = {}    # unresolved id -> raw lines of its later copies
        self._recovered: set[str] = set()          # unresolved ids read from the recovery stream: no lookup
        self._share = share if lookups else None   # each click's first region (see _share.py)
        self._held: dict[str, int] = {}            # unresolved id held back for its owner -> owner index
        self._held_again: set[str] = set()         # of those, found unjoined at a lookup already
        self._oldest = _OldestIds()                # unresolved ids by time (resolved ones leave it lazily)
        self._queued: deque[str] = deque()         # ids to send as soon as a request slot is free
        self._released_front = 0                   # the first ids of _queued: released by the store's progress
        self._retry: list[tuple[int, str]] = []    # heap of (due_us, id)
        self._store_wait: dict[str, int] = {}      # THROTTLED while the event store caught up -> since when
        self._probe_due_us = 0                     # when a batch of _store_wait may go out as a probe
        # holding back clicks whose query the event store has not read yet (see _not_ahead)
        self._by_position = not join.primary_ids.custom   # refs are Photon ids: key + time
        self._store_read_to: dict | None = None    # the store's position as answers gave it, while it is behind
        self._store_through_us = 0
        self._ahead = AheadOfStore()
        self._ahead_since = self._ahead.since      # click id held back -> since when (in that order)
        self._unhold: set[str] = set()             # held past the longest retry delay: sent without the check
        self._position_probe_due_us = 0
        self._batches: dict[int, list[str]] = {}   # request in lookup, looked up or at a joiner -> its ids
        self._looking: set[int] = set()            # requests whose registry lookup is out
        self._in_flight = 0
        self._next_batch = 1
        self._latencies: deque[int] = deque(maxlen=LATENCY_SAMPLES)
        self._latency_hist = LatencyHistogram()     # every join since the first run (kept in checkpoints)
        self._last_scan_empty = False
        self._scan_at_us = 0
        self._dirty = False
        self._last_checkpoint_us = 0
        # what changed since the last checkpoint (see delta()); the first checkpoint is a full one
        self._added: dict[str, None] = {}          # ids first read since the last checkpoint
        self._dup_added: list[tuple[str, bytes]] = []  # later copies of ids checkpointed before
        self._sent: list[str] = []                 # ids sent (one more attempt), checkpointed before
        self._gone: list[str] = []                 # ids resolved, checkpointed before
        self._journal_entries = 0
        self._full_due = True
        self._unjoinable: list[bytes] = []        # raws given up, written before the next checkpoint
        self.counters = dict.fromkeys(_COUNTERS, 0)
        if restore is not None:
            self._restore(restore)

    # ------------------------------------------------------------ the one way in

    def handle(self, *events: Event) -> list[Command]:
        out: list[Command] = []
        now = 0
        for ev in events:
            now = ev.now_us
            kind = type(ev)
            if kind is LinesRead:
                self._on_lines(ev, out)
            elif kind is LookupAnswered:
                self._on_lookup(ev.batch_id, ev.present, out, now)
            elif kind is LookupFailed:
                self.counters["lookup_failures"] += 1
                self._on_lookup(ev.batch_id, None, out, now)
            elif kind is JoinAnswered:
                self._on_answer(ev.batch_id, ev.outcomes, now, out, ev.store_behind, ev.store_read_to,
                                ev.store_read_through_us)
            elif kind is JoinFailed:
                self.counters["join_failures"] += 1
                self._on_answer(ev.batch_id, None, now, out)
            elif kind is not TimePassed and kind is not StopRequested:
                raise TypeError(f"DispatcherState cannot handle {ev!r}")
        if events:
            self._release_due(now)
            self._pump(out, now)
            final = type(events[-1]) is StopRequested
            if final or (self._dirty and now - self._last_checkpoint_us >= self._checkpoint_every_us):
                if self._unjoinable:
                    out.append(WriteUnjoinable(self._unjoinable))
                    self._unjoinable = []
                out.append(self._checkpoint(now, final))
                self._dirty = False
                self._last_checkpoint_us = now
        return out

    def _checkpoint(self, now: int, final: bool) -> Checkpoint:
        """A delta while the journal is short; a full snapshot first, at a stop, and when the journal has
        grown past :data:`JOURNAL_COMPACT_MIN_ENTRIES` and twice the unresolved events."""
        if not (self._full_due or final):
            delta = self.delta(now)
            self._journal_entries += (len(delta["added"]["ids"]) + len(delta["dup"]) + len(delta["sent"])
                                      + len(delta["gone"]))
            if self._journal_entries <= max(JOURNAL_COMPACT_MIN_ENTRIES, 2 * len(self._events)):
                return Checkpoint(delta=delta)
        self._added.clear()
        self._dup_added.clear()
        self._sent.clear()
        self._gone.clear()
        self._journal_entries = 0
        self._full_due = False
        return Checkpoint(snapshot=self.snapshot(now))

    # ------------------------------------------------------------ queries

    @property
    def share(self) -> RegionShare | None:
        """Each click's first region (None: every click is looked up and joined at once)."""
        return self._share

    @property
    def caught_up(self) -> bool:
        return (self._last_scan_empty and not self._batches and not self._queued and not self._retry
                and not self._store_wait and not self._ahead_since and not self._unjoinable)

    def lines_wanted(self) -> int:
        """Backpressure: how many more events the core wants read, so that about ``max_in_flight`` full
        backlog batches (``backlog_batch_size``) wait queued behind the requests in flight, and never more than ``max_unresolved`` events
        are unresolved (queued, in flight or waiting for a retry; 0: read nothing now). So at most
        ``max_unresolved`` + one scan's lines (plus their later copies) are held in memory and in each
        checkpoint, however long the joiners, event store or registry stay down. Clicks held back for the
        event store (their query not read yet) count as queued: the dispatcher reads no further ahead of the
        store than that, so a cold start leaves the rest in the logs (not in memory, nor in checkpoints) until
        the store has read their queries."""
        cfg = self.config
        return max(0, min(self._backlog_batch * cfg.max_in_flight - len(self._queued) - len(self._ahead_since),
                          cfg.max_unresolved - len(self._events)))

    def wants_lines(self) -> bool:
        return self.lines_wanted() > 0

    def next_due_us(self) -> int | None:
        """When the earliest retry (or the next probe of the event store) falls due (the shell's wake-up
        hint), or None."""
        due = self._retry[0][0] if self._retry else None
        if self._store_wait:
            probe = (self._probe_due_us if not self._batches
                     else next(iter(self._store_wait.values())) + self._delays_us[-1])
            due = probe if due is None else min(due, probe)
        if self._ahead_since:
            cap = next(iter(self._ahead_since.values())) + self._delays_us[-1]
            if not self._batches:
                cap = min(cap, self._position_probe_due_us)
            due = cap if due is None else min(due, cap)
        return due

    def unresolved_ids(self) -> set[str]:
        return set(self._events)

    def statistics(self, pending_bytes: int = 0, pid: int = 0) -> DispatcherStatistics:
        return DispatcherStatistics(
            **self.counters, retry_queue=len(self._retry),
            waiting_for_store=len(self._store_wait) + len(self._ahead_since), ahead_of_store=len(self._ahead_since),
            queued=len(self._queued),
            in_flight=self._in_flight, requests_in_flight=len(self._batches), pending_bytes=pending_bytes,
            caught_up=self.caught_up, scan_at_us=self._scan_at_us,
            join_latency_ms=percentiles_ms(self._latencies), join_latency_hist=self._latency_hist.to_json(),
            pid=pid, oldest_unresolved_us=self.oldest_unresolved_us(), **self._share_statistics())

    def _share_statistics(self) -> dict:
        if self._share is None:
            return {}
        s = self._share.statistics()
        return dict(held_for_owner=s.deferred, held_found_present=s.found_present, held_joined=s.deferred_joined,
                    held_wasted=s.deferred_wasted, held_again=s.held_again, share_judged_down=s.judged_down,
                    held_late=s.late,
                    share_grace_ms={r: g for k, (r, g) in enumerate(zip(s.owners, s.grace_ms)) if k != self._share.me},
                    share_down=[r for r, d in zip(s.owners, s.down) if d], share_leader_region=s.leader_region)

    def oldest_unresolved_us(self) -> int:
        """The event time (from its key, photon.EventIds) of the oldest click queued, in flight or waiting for
        a retry; 0 when there is none. Every click whose joined line may still appear is unresolved here or
        not read yet."""
        return self._oldest.oldest_us(self._events)

    def snapshot(self, now_us: int) -> dict:
        """The checkpoint: offsets plus every unresolved event (queued, in flight or waiting), the events as
        columns in the order they were first read (like a delta's ``"added"``, see :meth:`delta`)::

            {"format": 2, "written_at_us": int, "offsets": {file: offset},
             "events": {"ids": [id, ...], "refs": [ref_id, ...], "first_seen": [us, ...], "attempts": [int, ...],
                        "raws": "line\\nline...",   # their raw lines joined by newlines (a list of lines if
                                                    # one holds a newline)
                        "dups": {id: [raw_of_later_copy, ...]}},   # those with later copies
             "recovered": [id, ...],     # unresolved ids read from the recovery stream (never dropped on a lookup)
             "counters": {name: int}, "join_latency_hist": {bucket: count}}

        Format 1 (read by :func:`snapshot_events`) held a row per event instead; the columns are taken by
        ``map`` in C and the lines decoded and written as one string.
        """
        events = self._events
        return {"format": CHECKPOINT_FORMAT, "written_at_us": now_us, "offsets": dict(self.offsets),
                "events": _event_columns(list(events), list(events.values()), self._dups, events),
                "recovered": sorted(self._recovered), "counters": dict(self.counters),
                "join_latency_hist": self._latency_hist.to_json()}

    def delta(self, now_us: int) -> dict:
        """What changed since the previous checkpoint (and clears that record); applied to the previous
        checkpoint by :func:`apply_delta` it gives :meth:`snapshot`. An event read and resolved between two
        checkpoints is in neither::

            {"format": 3, "written_at_us": int, "offsets": {file: offset},
             "added": {                               # events read since, still unresolved, as columns:
                 "ids": [id, ...], "refs": [ref_id, ...], "first_seen": [us, ...], "attempts": [int, ...],
                 "raws": b"line\\nline...",           # their raw lines joined by newlines, as bytes,
                 "lens": [int, ...],                  # and each line's length in bytes
                 "dups": {id: [raw_of_later_copy, ...]}},   # those of them with later copies
             "recovered": [id, ...],                  # of those, read from the recovery stream
             "dup": [[id, raw_line], ...],            # later copies of events checkpointed before
             "sent": [id, ...],                       # one more attempt each (events checkpointed before)
             "gone": [id, ...],                       # resolved (events checkpointed before), copies too
             "counters": {name: int}, "join_latency_hist": {bucket: count}}

        The events read since are the bulk of a delta: as columns they are taken by ``map`` in C, and their
        lines joined as bytes, which the journal holds as they are after the delta's JSON line (neither decoded
        nor escaped as a JSON string: that was most of a delta's cost, format 2), instead of a list built and a
        line decoded per event (format 1). :func:`apply_delta` still reads both older formats: see
        :func:`delta_events`.
        """
        events = self._events
        ids = list(self._added)
        recovered = self._recovered
        delta = {"format": DELTA_FORMAT, "written_at_us": now_us, "offsets": dict(self.offsets),
                 "added": _event_columns(ids, list(map(events.__getitem__, ids)), self._dups, self._added,
                                         as_text=False),
                 "recovered": list(filter(recovered.__contains__, ids)) if recovered else [],
                 "dup": [[i, d.decode()] for i, d in self._dup_added],
                 "sent": list(filter(events.__contains__, self._sent)), "gone": self._gone,
                 "counters": dict(self.counters), "join_latency_hist": self._latency_hist.to_json()}
        self._added = {}
        self._dup_added = []
        self._sent = []
        self._gone = []
        return delta

    # ------------------------------------------------------------ transitions

    def _on_lines(self, ev: LinesRead, out: list) -> None:
        """Each chunk in bulk (see :func:`_chunk_fields`): its lines parsed, their two ids taken and checked
        with one regular-expression pass each, and its new events added together. Only its bad lines
        (:meth:`_add_line` names their problem) and copies of unresolved ids (:meth:`_add_event`) are taken
        one by one; a chunk of custom ids (an event-time field) goes line by line. The outcome of every line
        is the one it had line by line: nothing is resolved while lines are read."""
        self._scan_at_us = ev.now_us
        self._last_scan_empty = not ev.chunks
        if not ev.chunks:
            return
        self._dirty = True
        now = ev.now_us
        idf, reff = self.join.foreign_id_field, self.join.foreign_ref_field
        foreign_ids, primary_ids = self.join.foreign_ids, self.join.primary_ids
        custom = foreign_ids if foreign_ids.custom or primary_ids.custom else None
        events, added, queued = self._events, self._added, self._queued
        bad: list = []
        read = 0
        for chunk in ev.chunks:
            file, lines = chunk.file, chunk.lines
            recovered = file.startswith(RECOVERY_FILE_PREFIX)
            read += len(lines)
            if custom is not None:              # a time field per event: line by line
                for off, line in zip(chunk.offsets, lines):
                    self._add_line(file, off, line, now, recovered, custom, bad)
                self.offsets[file] = chunk.end
                continue
            cids, refs, wrong = _chunk_fields(lines, idf, reff)
            if wrong:                           # their problems named one by one (in order: only they are bad)
                offsets = chunk.offsets
                for k in wrong:
                    self._add_line(file, offsets[k], lines[k], now, recovered, None, bad)
                lines = drop_at(lines, wrong)
            again = _repeats(cids, events)
            if again:                           # copies of unresolved ids: after the others, in order
                copies = [(cids[k], refs[k], lines[k]) for k in again]
                cids, refs, lines = drop_at(cids, again), drop_at(refs, again), drop_at(lines, again)
            new = dict(zip(cids, [[ref, line, now, 0] for ref, line in zip(refs, lines)]))
            events.update(new)
            added.update(dict.fromkeys(cids))
            self._oldest.add(cids)
            if recovered:
                self._recovered.update(cids)
                queued.extend(cids)
            elif self._share is None:
                queued.extend(cids)
            else:
                for cid in cids:
                    self._place(cid, now)
            if again:
                for cid, ref, line in copies:
                    self._add_event(cid, ref, line, now, recovered)
            self.offsets[file] = chunk.end
        self.counters["events_read"] += read
        if bad:
            self.counters["bad_records"] += len(bad)
            out.append(QuarantineRecords(bad))

    def _add_line(self, file: str, off: int, line: bytes, now: int, recovered: bool, custom, bad: list) -> None:
        """One line parsed and checked on its own: added, or its problem appended to ``bad``."""
        idf, reff = self.join.foreign_id_field, self.join.foreign_ref_field
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            bad.append((file, off, f"not valid JSON: {e}", line))
            return
        if type(rec) is not dict:
            bad.append((file, off, f"not a JSON object but {type(rec).__name__}", line))
            return
        cid = rec.get(idf)
        ref = rec.get(reff)
        if type(cid) is not str or type(ref) is not str:
            bad.append((file, off, _field_problem(rec, idf, reff), line))
            return
        if custom is not None:          # a time field: the event's Photon key (photon.EventIds)
            try:
                cid = custom.key(rec)
                problem = self.join.primary_ids.ref_problem(ref)
                if problem:
                    raise BadEventId(f"{reff!r} {problem}")
            except BadEventId as e:
                bad.append((file, off, str(e), line))
                return
        elif not (is_event_id(cid) and is_event_id(ref)):
            try:
                parse_event_id(cid)
                parse_event_id(ref)
            except BadEventId as e:
                bad.append((file, off, str(e), line))
                return
        self._add_event(cid, ref, line, now, recovered)

    def _add_event(self, cid: str, ref: str, line: bytes, now: int, recovered: bool) -> None:
        """A checked line: a later copy of an unresolved id, or a new unresolved event."""
        events = self._events
        if cid in events:
            self._dups.setdefault(cid, []).append(line)
            if cid not in self._added:
                self._dup_added.append((cid, line))
            return
        events[cid] = [ref, line, now, 0]
        self._oldest.add((cid,))
        self._added[cid] = None
        if recovered:
            self._recovered.add(cid)
            self._queued.append(cid)
        elif self._share is None:
            self._queued.append(cid)
        else:
            self._place(cid, now)

    def _place(self, cid: str, now: int) -> None:
        """A new click with region sharing: queued, or held back for its owner region."""
        share = self._share
        owner = share.owner(cid)
        hold = share.hold_us(owner)
        if hold:
            self._held[cid] = owner
            heapq.heappush(self._retry, (now + hold, cid))
        else:
            self._queued.append(cid)

    def _on_lookup(self, batch_id: int, present: list | None, out: list, now: int = 0) -> None:
        ids = self._batches.get(batch_id)
        if ids is None:
            raise KeyError(f"lookup answer for unknown batch {batch_id}")
        self._looking.discard(batch_id)
        self._dirty = True
        if present is not None and len(present) != len(ids):
            present = None  # a malformed answer is no answer: send them all
        held = self._held
        if present is not None and (held or any(present)):
            keep = []
            recovered = self._recovered
            again = self._held_again
            for cid, known in zip(ids, present):
                owner = held.get(cid)
                if known and cid not in recovered:
                    if owner is not None:
                        waited = now - self._events[cid][_FIRST_SEEN]
                        self._share.found_present(owner, now, cid not in again, waited)
                    self._resolve_duplicate(cid)
                elif owner is not None and self._hold_again(cid, owner, now):
                    pass
                else:
                    keep.append(cid)
            self._in_flight -= len(ids) - len(keep)
            ids = keep
            if not ids:
                del self._batches[batch_id]
                return
            self._batches[batch_id] = ids
        self._send(batch_id, ids, out)

    def _send(self, batch_id: int, ids: list[str], out: list) -> None:
        recs = list(map(self._events.__getitem__, ids))
        for r in recs:
            r[_ATTEMPTS] += 1
        added = self._added
        if added:                              # one more attempt, for the journal (of ids checkpointed before)
            self._sent.extend(itertools.filterfalse(added.__contains__, ids))
        else:
            self._sent.extend(ids)
        self.counters["attempts"] += len(ids)
        out.append(SendBatch(batch_id, ids, list(map(_GET_REF, recs)), list(map(_GET_RAW, recs))))

    def _on_answer(self, batch_id: int, outcomes: list | None, now: int, out: list,
                   store_behind: bool = False, read_to: dict | None = None, read_through_us: int = 0) -> None:
        """Store behind: THROTTLED events wait in ``_store_wait`` (not in the retry heap) until an answer
        comes from a joiner whose store is no longer behind; while no request is out, one batch of them
        goes out every :data:`STORE_PROBE_EVERY_US` as a probe, and none waits longer than the longest
        retry delay (``retry_max_s``), so answers that keep saying "behind" cannot hold one back for good. A cold start thus sends a click whose
        primary was not read yet about twice, not once per backoff step while the store reads its backlog.

        With the store's position (``read_to``), a click whose query it has not read yet is not even sent: it
        is held back (see :meth:`_not_ahead`) and goes once the store has read past its query's time."""
        ids = self._batches.pop(batch_id, None)
        if ids is None:
            raise KeyError(f"joiner answer for unknown batch {batch_id}")
        self._dirty = True
        self._in_flight -= len(ids)
        if outcomes is not None and len(outcomes) != len(ids):
            self.counters["join_failures"] += 1
            outcomes = None  # a malformed answer: retry the whole batch
        if outcomes is None:
            for cid in ids:
                self._schedule_retry(cid, now)
            return
        wait = self._store_wait
        if store_behind:
            if not wait:
                self._probe_due_us = now + STORE_PROBE_EVERY_US
            if read_to is not None and self._by_position:
                if self._store_read_to is not None:  # answers overtake each other: a store never reads back
                    read_to, read_through_us = later_position(self._store_read_to, self._store_through_us,
                                                              read_to, read_through_us)
                self._store_read_to, self._store_through_us = read_to, read_through_us
                self._release_ahead()
        else:
            if wait:                             # the store has caught up: everything waiting goes now
                self._queued.extend(wait)
                wait.clear()
            if self._store_read_to is not None:
                self._store_read_to = None
                self._release_ahead()
        events, c, lat = self._events, self.counters, self._latencies
        held = self._held
        if not held:                            # the JOINED ones in bulk, the others (usually none) one by one
            joined = outcomes.count(Outcome.JOINED)
            if joined == len(ids):
                self._all_joined(ids, now)
                return
            if joined:
                mask = list(map(eq, outcomes, repeat(Outcome.JOINED)))
                self._all_joined(list(compress(ids, mask)), now)
                keep = list(map(not_, mask))
                ids, outcomes = list(compress(ids, keep)), list(compress(outcomes, keep))
        give_up: list[str] = []
        throttled: list[str] = []
        for cid, outcome in zip(ids, outcomes):
            if cid in held:
                self._held_answered(held[cid], outcome, now)
            if outcome == Outcome.JOINED:
                waited = now - events[cid][_FIRST_SEEN]
                lat.append(waited)
                self._latency_hist.add(waited)
                c["joined"] += 1
                self._resolved(cid)
            elif outcome == Outcome.ALREADY_REGISTERED:
                c["wasted_joins"] += 1
                self._resolve_duplicate(cid)
            elif outcome == Outcome.UNJOINABLE:
                give_up.append(cid)
            elif outcome == Outcome.LOST:       # in the joiner's lost-ids ledger: the recovery job's now
                c["lost"] += 1
                self._resolved(cid)
            elif outcome == Outcome.NOT_FOUND and self._may_give_up(events[cid], now):
                give_up.append(cid)
            elif store_behind and outcome == Outcome.THROTTLED:
                throttled.append(cid)
            else:  # NOT_FOUND too early, THROTTLED, or an outcome this dispatcher does not know
                self._schedule_retry(cid, now)
        if throttled:                           # held back (see _not_ahead) in one pass, or waiting
            if self._store_read_to is not None:
                throttled = self._not_ahead(throttled, now)
            wait.update(dict.fromkeys(throttled, now))
        if give_up:
            self._give_up(give_up)

    def _all_joined(self, ids: list[str], now: int) -> None:
        """Clicks answered JOINED (none held for its owner): their latencies counted per distinct wait (a
        batch's clicks were mostly read together) and their records dropped in bulk."""
        recs = list(map(self._events.pop, ids))
        waits = [now - f for f in map(_GET_FIRST_SEEN, recs)]
        self._latencies.extend(waits)
        hist = self._latency_hist
        for waited, n in Counter(waits).items():
            hist.add(waited, n)
        self.counters["joined"] += len(ids)
        self._forget(ids)

    def _not_ahead(self, cids: list[str], now: int) -> list[str]:
        """Hold back those of ``cids`` (taken from the queue, or answered THROTTLED, the store's position known)
        whose query's time is past what the event store has read of the query's key: the store has certainly
        not read that query yet, so sending the click now would only come back THROTTLED. A held click goes (to
        the front of the queue, not checked again there) as soon as an answer says the store has read past that
        time, or has caught up, and after the longest retry delay (``retry_max_s``) in any case, then once
        without this check. While clicks are held and no request is out, an empty request every
        :data:`STORE_POSITION_PROBE_US` asks how far the store has read. A click whose query is truly missing is
        therefore held only while the store has not read up to its time, and then tried and retried as usual (it
        stays unresolved meanwhile: the checkpoint and the oldest unresolved time count it).

        In bulk: the query keys and times sliced and compared by ``map`` in C. Returns the others, in order."""
        refs = list(map(_GET_REF, map(self._events.__getitem__, cids)))
        limits = _PositionDigits(self._store_read_to, self._store_through_us)   # as digits: no int() per click
        times, keys = list(map(ID_TIME_DIGITS, refs)), list(map(ID_KEY, refs))  # (kept for those held)
        ahead = list(map(gt, times, map(limits.__getitem__, keys)))
        unhold = self._unhold
        if unhold:                              # once without the check: those go whatever their time
            free = list(map(unhold.__contains__, cids))
            unhold.difference_update(cids)
            ahead = list(map(gt, ahead, free))  # (ahead and not free)
        held = ahead.count(True)
        if not held:
            return cids
        self._ahead.hold(list(compress(keys, ahead)), list(compress(times, ahead)), list(compress(cids, ahead)), now)
        self.counters["held_for_store"] += held
        self._ahead.rebuild_if_outgrown(self._ref_of)
        return list(compress(cids, map(not_, ahead)))   # (usually most are held: no step per held click)

    def _ref_of(self, cid: str) -> str:
        return self._events[cid][_REF]

    def _release_ahead(self) -> None:
        """Queue (in front) every held click whose query the store has now read past (all of them once the
        store is no longer behind)."""
        released = self._ahead.release(self._store_read_to, self._store_through_us)
        if released:
            self._queued.extendleft(reversed(released))
            self._released_front += len(released)

    def _may_give_up(self, rec: list, now: int) -> bool:
        return (rec[_ATTEMPTS] >= self.config.min_attempts
                and now - rec[_FIRST_SEEN] >= self._give_up_after_us)

    def _schedule_retry(self, cid: str, now: int) -> None:
        attempts = self._events[cid][_ATTEMPTS]
        delay = self._delays_us[min(max(attempts, 1), _MAX_ATTEMPT_TABLE) - 1]
        if self._jitter is not None:
            delay = int(delay * (1.0 - 0.2 * self._jitter.random()))
        heapq.heappush(self._retry, (now + delay, cid))

    def _give_up(self, ids: list[str]) -> None:
        raws = self._unjoinable
        before = len(raws)
        for cid in ids:
            raws.append(self._events[cid][_RAW])
            raws.extend(self._dups.get(cid, ()))
            self._resolved(cid, dups_counter=None)
        self.counters["unjoinable"] += len(raws) - before

    def _resolve_duplicate(self, cid: str) -> None:
        self.counters["already_registered"] += 1
        self._resolved(cid)

    def _held_answered(self, owner: int, outcome: int, now: int) -> None:
        if outcome == Outcome.JOINED:
            self._share.joined(owner, now)
        elif outcome == Outcome.ALREADY_REGISTERED:
            self._share.wasted(owner, now)

    def _hold_again(self, cid: str, owner: int, now: int) -> bool:
        """A held click found unjoined: hold it again while its owner shows progress (true), else it is
        joined here; an owner judged down by this lookup has every click of it still held released now."""
        share = self._share
        hold, judged_down = share.still_unjoined(owner, now, cid not in self._held_again,
                                                 now - self._events[cid][_FIRST_SEEN])
        self._held_again.add(cid)
        if judged_down:
            held = self._held
            self._retry = [(now if held.get(i) == owner else due, i) for due, i in self._retry]
            heapq.heapify(self._retry)
        if not hold:
            return False
        heapq.heappush(self._retry, (now + hold, cid))
        return True

    def _resolved(self, cid: str, dups_counter: str | None = "already_registered") -> None:
        del self._events[cid]
        self._forget((cid,), dups_counter)

    def _forget(self, ids, dups_counter: str | None = "already_registered") -> None:
        """The rest of resolving ``ids`` (no longer in ``_events``): the journal told of those checkpointed
        before, and each dropped from the sets it may be in (only the sets in use are asked)."""
        added = self._added
        if added:
            pop = added.pop
            gone = self._gone
            for cid in ids:
                if pop(cid, _MISSING) is _MISSING:
                    gone.append(cid)          # checkpointed before: the journal must say it is gone
        else:
            self._gone.extend(ids)            # (nothing added since the last checkpoint: all were in it)
        # the rest are usually empty, and hold few of ids: a step per id found there, not per id
        if self._store_wait:
            wait = self._store_wait
            deque(map(wait.__delitem__, wait.keys() & ids), 0)
        if self._ahead_since:
            self._ahead.forget(ids)
        if self._unhold:
            self._unhold.difference_update(ids)
        if self._recovered:
            self._recovered.difference_update(ids)
        if self._held:
            for cid in ids:
                if self._held.pop(cid, None) is not None:
                    self._held_again.discard(cid)
        if self._dups:
            dups = self._dups
            copies = list(map(dups.pop, dups.keys() & ids))
            if copies and dups_counter:
                self.counters[dups_counter] += sum(map(len, copies))

    def _release_due(self, now: int) -> None:
        heap = self._retry
        if heap and heap[0][0] <= now:         # with it, those due soon after (see RETRY_GATHER_SHARE)
            soon = now + self._gather_us
            while heap and heap[0][0] <= soon:
                self._queued.append(heapq.heappop(heap)[1])
        if self._ahead_since:
            self._release_held_too_long(now)
        wait = self._store_wait
        if not wait:
            return
        if not self._batches and not self._queued and now >= self._probe_due_us:
            probe = list(itertools.islice(wait, self.config.batch_size))   # the longest waiting
        else:                                   # answers keep coming: only those waiting too long go
            oldest = now - self._delays_us[-1]
            probe = list(itertools.takewhile(lambda cid: wait[cid] <= oldest, wait))
        if probe:
            for cid in probe:
                del wait[cid]
            self._queued.extend(probe)
            self._probe_due_us = now + STORE_PROBE_EVERY_US

    def _release_held_too_long(self, now: int) -> None:
        expired = self._ahead.expired(now - self._delays_us[-1])
        self._unhold.update(expired)
        self._queued.extend(expired)

    def _pump(self, out: list, now: int = 0) -> None:
        size, limit, queued = self.config.batch_size, self.config.max_in_flight, self._queued
        hold = self._store_read_to is not None
        looking = self._looking
        while queued and len(self._batches) < limit:
            # a backlog is spread over the free slots in bigger requests (per-request costs paid less
            # often); with little queued, requests of batch_size go at once (no waiting to fill a batch)
            free = limit - len(self._batches)
            n = min(len(queued), max(size, min(self._backlog_batch, -(-len(queued) // free))))
            front = self._released_front
            if not hold:
                ids = _take(queued, n)
                self._released_front = max(0, front - n)
            else:                               # clicks whose query the store has not read yet stay behind
                # (those released by its progress, at the front, not checked again: the store's position
                # never goes back, see later_position, so they would pass)
                k = min(front, n)
                ids = _take(queued, k)
                self._released_front = front - k
                while queued and len(ids) < n:
                    ids += self._not_ahead(_take(queued, min(n - len(ids), len(queued))), now)
                if not ids:
                    break
                n = len(ids)
            # one writer's ids together and in time order: the registry takes such a run as one packed
            # (prefix, timestamps) item, a mix of writers id by id (clicks released by the store's progress
            # come in their queries' order, the writers interleaved)
            ids.sort()
            batch_id = self._next_batch
            self._next_batch += 1
            self._batches[batch_id] = ids
            self._in_flight += n
            self._dirty = True
            if self.lookups:
                looking.add(batch_id)
                out.append(Lookup(batch_id, ids))
            else:
                self._send(batch_id, ids, out)
        if self._ahead_since and not self._batches and now >= self._position_probe_due_us:
            batch_id = self._next_batch                 # an empty request: how far has the store read?
            self._next_batch += 1
            self._batches[batch_id] = []
            self.counters["store_probes"] += 1
            self._position_probe_due_us = now + STORE_POSITION_PROBE_US
            out.append(SendBatch(batch_id, [], [], []))

    def _restore(self, snap: dict) -> None:
        rows = snapshot_events(snap)              # (either format; any other refused here)
        self.offsets = {str(k): int(v) for k, v in snap["offsets"].items()}
        for cid, ref, raw, first_seen, attempts, dups in rows:
            if cid in self._events:
                continue
            self._events[cid] = [ref, raw.encode(), int(first_seen), int(attempts)]
            if dups:
                self._dups[cid] = [d.encode() for d in dups]
            self._queued.append(cid)
        self._oldest.add(self._events)
        self._recovered = {cid for cid in snap.get("recovered", ()) if cid in self._events}
        for name, value in snap.get("counters", {}).items():
            name = _RENAMED_COUNTERS.get(name, name)
            if name in self.counters:
                self.counters[name] = int(value)
        self._latency_hist = LatencyHistogram.from_json(snap.get("join_latency_hist"))
        self._last_checkpoint_us = int(snap.get("written_at_us", 0))


def apply_delta(snapshot: dict, delta: dict) -> dict:
    """The checkpoint ``snapshot`` with ``delta`` (see :meth:`DispatcherState.delta`) applied, in place, its
    events kept in the snapshot's own format (rows for format 1, columns for 2); returns it. An id may be both
    "gone" (its earlier line, checkpointed before, was resolved) and added (a later line of it read since): the
    added event is the one that stays. A delta or snapshot of an unknown format is refused before anything is
    applied. Applying many deltas, convert a snapshot to rows once first (:func:`snapshot_as_rows`)."""
    added = delta_events(delta)
    rows = snapshot_events(snapshot)
    events = {e[0]: e for e in rows}
    # "dup", "sent" and "gone" are about events checkpointed before; the added ones about events read since,
    # which may carry the id of one that was resolved meanwhile: so the old ones first, then the new ones
    for cid, raw in delta["dup"]:
        if cid in events:
            events[cid][5].append(raw)
    for cid in delta["sent"]:
        if cid in events:
            events[cid][4] += 1
    for cid in delta["gone"]:
        events.pop(cid, None)
    for e in added:
        events[e[0]] = e
    recovered = {i for i in snapshot.get("recovered", ()) if i in events}
    recovered.update(i for i in delta["recovered"] if i in events)
    rows = list(events.values())
    snapshot.update(events=rows if snapshot.get("format") == 1 else _row_columns(rows), recovered=sorted(recovered),
                    offsets=delta["offsets"], written_at_us=delta["written_at_us"], counters=delta["counters"],
                    join_latency_hist=delta["join_latency_hist"])
    return snapshot


def _event_columns(ids: list[str], recs: list[list], dups: dict, among, as_text: bool = True) -> dict:
    """Events as a checkpoint's columns (a snapshot's ``"events"``, a delta's ``"added"``): ``recs`` the
    records of ``ids``, ``dups`` the later copies of unresolved ids (those of ``among`` taken). The raw lines
    joined by newlines: as text (``as_text``; a list of them if one holds a newline), or as bytes with each
    line's length beside them (``"lens"``: a line holding a newline needs no other form, and no pass looks for
    one; counting the newlines of the joined lines cost as much as ``orjson`` escaping them)."""
    lines = list(map(_GET_RAW, recs))
    raws = b"\n".join(lines)
    if not as_text:
        cols = _columns(ids, recs, raws, dups, among)
        cols["lens"] = list(map(len, lines))
        return cols
    if ids and raws.count(b"\n") != len(ids) - 1:    # a line holding a newline: the lines one by one
        return _columns(ids, recs, [r.decode() for r in lines], dups, among)
    return _columns(ids, recs, raws.decode(), dups, among)


def _columns(ids: list[str], recs: list[list], raws, dups: dict, among) -> dict:
    copies = {i: [d.decode() for d in c] for i, c in dups.items() if i in among} if dups else {}
    return {"ids": ids, "refs": list(map(_GET_REF, recs)), "raws": raws,
            "first_seen": list(map(_GET_FIRST_SEEN, recs)), "attempts": list(map(_GET_ATTEMPTS, recs)),
            "dups": copies}


def _row_columns(rows: list[list]) -> dict:
    """Rows (``[id, ref, raw, first_seen_us, attempts, [copy, ...]]``, lines as text) as columns, exactly as
    :func:`_event_columns` makes them from the same events."""
    ids = list(map(itemgetter(0), rows))
    raws = "\n".join(map(itemgetter(2), rows))
    if ids and raws.count("\n") != len(ids) - 1:
        raws = list(map(itemgetter(2), rows))
    return {"ids": ids, "refs": list(map(itemgetter(1), rows)), "raws": raws,
            "first_seen": list(map(itemgetter(3), rows)), "attempts": list(map(itemgetter(4), rows)),
            "dups": {e[0]: e[5] for e in rows if e[5]}}


def _column_rows(cols: dict) -> list[list]:
    """Columns (a snapshot's ``"events"`` of format 2, a delta's ``"added"``) as rows (lines as text)."""
    ids, raws, dups = cols["ids"], cols["raws"], cols["dups"]
    if type(raws) is bytes:                       # (a delta of format 3: each line's length beside them)
        raws = _split_lines(raws, cols["lens"])
    elif type(raws) is str:
        raws = raws.split("\n") if ids else []
    return [[i, ref, raw, seen, attempts, list(dups.get(i, ()))]
            for i, ref, raw, seen, attempts in zip(ids, cols["refs"], raws, cols["first_seen"], cols["attempts"])]


def _split_lines(raws: bytes, lens: list[int]) -> list[str]:
    """The lines of ``raws`` (joined by newlines) by their lengths, as text; refused unless they fill it."""
    out, at = [], 0
    for n in lens:
        out.append(raws[at:at + n].decode())
        at += n + 1
    if (at - 1 if lens else 0) != len(raws):
        raise ValueError(f"dispatcher checkpoint lines of {at - 1} bytes in {len(raws)}")
    return out


def snapshot_events(snapshot: dict) -> list[list]:
    """A snapshot's unresolved events as rows (``[id, ref, raw, first_seen_us, attempts, [copy, ...]]``), from
    either format (a new list for format 2, the snapshot's own for 1); a snapshot of another format is
    refused."""
    fmt = snapshot.get("format")
    if fmt == 1:
        return snapshot["events"]
    if fmt != CHECKPOINT_FORMAT:
        raise ValueError(f"dispatcher checkpoint format {fmt!r} is not 1 or {CHECKPOINT_FORMAT}")
    return _column_rows(snapshot["events"])


def snapshot_as_rows(snapshot: dict) -> dict:
    """The snapshot with its events as rows (format 1: what :func:`apply_delta` applies deltas to fastest and
    what restoring reads); the snapshot itself when it is in format 1 already."""
    if snapshot.get("format") == 1:
        return snapshot
    return {**snapshot, "format": 1, "events": snapshot_events(snapshot)}


def delta_events(delta: dict) -> list[list]:
    """The events a delta added, as rows like the snapshot's (``[id, ref, raw, first_seen_us, attempts,
    [copy, ...]]``), from any of its three formats; a delta of another format is refused."""
    fmt = delta.get("format", 1)
    if fmt == 1:
        return delta["add"]
    if fmt != 2 and fmt != DELTA_FORMAT:
        raise ValueError(f"dispatcher checkpoint delta format {fmt!r} is not 1, 2 or {DELTA_FORMAT}")
    return _column_rows(delta["added"])


def _chunk_fields(lines: list[bytes], idf: str, reff: str) -> tuple[list[str], list[str], list[int]]:
    """The ids (``idf``) and refs (``reff``) of the lines that are JSON objects whose two fields are
    well-formed Photon ids, in order, and the (increasing) indices of the other lines, which the caller
    takes one by one to name their problem. In bulk: the two fields read by :class:`photon.StringFields`
    (msgspec over the chunk, with ``orjson.loads``' outcome per line), and each list of ids checked by one
    regular-expression pass over them joined by newlines; a step per bad line, not per line."""
    pairs, bad = string_fields(idf, reff).read(lines)
    if bad:
        pairs = drop_at(pairs, bad)
    if not pairs:
        return [], [], bad
    cids, refs = map(list, zip(*pairs))
    n = len(cids) - 1
    joined_ids, joined_refs = "\n".join(cids), "\n".join(refs)
    if joined_ids.count("\n") == n and joined_refs.count("\n") == n:
        wrong = bad_id_positions(joined_ids)       # one pass over each, stopping only at bad ids
        wrong_refs = bad_id_positions(joined_refs)
        if wrong_refs:
            wrong = sorted(set(wrong).union(wrong_refs))
        if not wrong:
            return cids, refs, bad
    else:                                     # (an id holding a newline)
        wrong = [k for k, (cid, ref) in enumerate(pairs) if not (is_event_id(cid) and is_event_id(ref))]
    kept = drop_at(range(len(lines)), bad) if bad else range(len(lines))
    return drop_at(cids, wrong), drop_at(refs, wrong), sorted(bad + [kept[p] for p in wrong])


def _repeats(cids: list[str], events: dict) -> list[int]:
    """The positions in ``cids`` of ids unresolved already (in ``events``) or repeated from earlier in
    ``cids``, increasing: found by set operations in C over the chunk's ids (one dict built and one
    intersection with the unresolved ids, the later copies as the positions no id starts at), with a step
    only per repeat found, not one per id: a chunk holding one copy of an unresolved click is common."""
    n = len(cids)
    first = dict(zip(reversed(cids), range(n - 1, -1, -1)))   # id -> its first position
    unresolved = first.keys() & events.keys()                  # (iterates the smaller: the chunk's ids)
    if len(first) == n:                                        # no id twice in the chunk
        return sorted(map(first.__getitem__, unresolved)) if unresolved else []
    later = set(range(n)).difference(first.values())           # the later copies within the chunk
    later.update(map(first.__getitem__, unresolved))           # and the first line of each unresolved id
    return sorted(later)


class _OldestIds:
    """The unresolved ids by event time, for :meth:`DispatcherState.oldest_unresolved_us`: a heap of *runs*
    (the ids added together, e.g. one chunk's, sorted by their time digits), each keyed by the time of its
    first id not resolved yet. Resolved ids leave a run lazily, as its front is looked at; a run whose ids
    are all resolved leaves the heap. Adding a chunk costs one (usually linear: one writer's ids come in
    time order) sort and one heap push, not one push per id. Every id here passed ``is_event_id``: its last
    :data:`TIMESTAMP_DIGITS` characters are zero-padded digits, so the smallest string is the smallest time."""

    __slots__ = ("_heap", "_held", "_seq")

    def __init__(self) -> None:
        self._heap: list[list] = []     # [time digits of the run's front, seq, run, index of its front]
        self._held = 0                  # ids in the runs of the heap (resolved ones too)
        self._seq = 0

    def add(self, ids) -> None:
        run = sorted(ids, key=ID_TIME_DIGITS)
        if run:
            self._seq += 1
            heapq.heappush(self._heap, [run[0][-TIMESTAMP_DIGITS:], self._seq, run, 0])
            self._held += len(run)

    def clear(self) -> None:
        self._heap.clear()
        self._held = 0

    def _compact(self, events: dict) -> None:
        """Keep only the unresolved ids (``events``): each run filtered by ``filter`` in C, its order kept, so
        nothing is sorted again. An id in two runs (resolved, then read again while its first run still held
        it) would stay twice: then all are sorted once as one run, as they were before runs were filtered."""
        runs = [kept for _, _, run, i in self._heap
                if (kept := list(filter(events.__contains__, itertools.islice(run, i, None))))]
        held = sum(map(len, runs))
        if held != len(events):                 # (more: an id twice; every unresolved id was added)
            self.clear()
            self.add(events)
            return
        self._heap = [[run[0][-TIMESTAMP_DIGITS:], seq, run, 0] for seq, run in enumerate(runs, self._seq + 1)]
        heapq.heapify(self._heap)
        self._seq += len(runs)
        self._held = held

    def oldest_us(self, events: dict) -> int:
        """The time of the oldest id in ``events`` (the unresolved ones; every one of them was added); 0
        when there is none."""
        if not events:
            self.clear()
            return 0
        if self._held > 2 * len(events) + OLDEST_HEAP_SLACK:   # mostly resolved ids: rebuild (amortized O(1))
            self._compact(events)
        heap = self._heap
        while True:
            top = heap[0]
            run, i = top[2], top[3]
            while i < len(run) and run[i] not in events:
                i += 1
            if i == len(run):
                heapq.heappop(heap)
                self._held -= len(run)
                continue
            digits = run[i][-TIMESTAMP_DIGITS:]
            if digits == top[0]:
                top[3] = i
                return int(digits)
            top[0], top[3] = digits, i
            heapq.heapreplace(heap, top)      # its front moved later: back into place


def _take(queue: deque, n: int) -> list:
    """The first ``n`` of ``queue``, taken out: ``popleft`` called by ``map`` in C, not a Python step per id."""
    return list(map(deque.popleft, repeat(queue, n)))


def _field_problem(rec: dict, idf: str, reff: str) -> str:
    for name in (idf, reff):
        value = rec.get(name)
        if value is None:
            return f"missing field {name!r}"
        if type(value) is not str:
            return f"field {name!r} is {type(value).__name__}, not a string"
    return "bad id fields"
