"""Moving records between senders and consumers, and knowing what is still unfinished.

* :class:`Transport` is the boundary a later multi-process runtime replaces; :class:`LocalTransport`
  hands deliveries to in-process worker inboxes. Senders keep every production until each consumer has
  acked it; over a transport that may lose deliveries they send it again after ``retry_delay_us``
  (doubling), so deliveries may be lost or repeated.
* :class:`Tracker` is the runtime's bookkeeping of unfinished work, for acks and for watermarks, per key
  interval: records received and not yet committed (by consumer interval) and productions not yet acked
  by every consumer (by sender interval; this covers records in transit). (Pending watermark timers are
  the interval cores' own.) New work is always added before the work that caused it is removed, so an
  interval's oldest work never shows a gap.
"""
from __future__ import annotations

import heapq
import threading
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

from millwheel._model import Delivery
from millwheel._store import StoredProduction
from millwheel._watermarks import TimestampBag


class Inbox:
    """A worker's queue: deliveries and control messages, with a condition to wait on."""

    def __init__(self) -> None:
        self._items: deque = deque()
        self.cond = threading.Condition()
        self._woken = False

    def put_many(self, items: Iterable) -> None:
        with self.cond:
            self._items.extend(items)
            self.cond.notify()

    def wake(self) -> None:
        """End the taker's wait now, or its next one if it is not waiting (a wake is never lost: a worker
        idle for long waits only on its inbox, see :meth:`Worker.idle_wait_s`)."""
        with self.cond:
            self._woken = True
            self.cond.notify()

    def take(self, limit: int, timeout_s: float) -> list:
        with self.cond:
            if not self._items and not self._woken:
                self.cond.wait(timeout_s)
            self._woken = False
            n = min(limit, len(self._items))
            return [self._items.popleft() for _ in range(n)]

    def __len__(self) -> int:
        return len(self._items)


class Transport:
    """Carries deliveries to the owner of the consumer's key interval. ``may_lose``: a transport that
    can lose deliveries makes senders retry every unacked one after ``retry_delay_us`` (doubling);
    receivers drop the repeats by id."""
    may_lose = True
    on_sent: Callable[[list[Delivery], bool], None] | None = None
    """Set by the tracker: told after each send which deliveries went into a local inbox (``True``: they
    cannot be lost on the way, so they are not sent again by time) and which did not."""

    def bind(self, route: Callable[[str, int], Inbox]) -> None:
        self._route = route

    def send(self, deliveries: list[Delivery]) -> None:
        raise NotImplementedError

    def park(self, deliveries: list[Delivery]) -> None:
        """Send again once the routes may have changed (by default: now)."""
        self.send(deliveries)


class LocalTransport(Transport):
    """In-process and lossless: delivers straight into the owning worker's inbox, in order."""
    may_lose = False

    def send(self, deliveries: list[Delivery]) -> None:
        by_inbox: dict[int, tuple[Inbox, list]] = {}
        for d in deliveries:
            inbox = self._route(d.consumer, d.interval)
            by_inbox.setdefault(id(inbox), (inbox, []))[1].append(d)
        for inbox, items in by_inbox.values():
            inbox.put_many(items)


class DueQueue:
    """``(time, id)`` entries taken in time order, for the tracker's retries and first sends: entries pushed
    in time order (nearly all: each is "now" plus a delay that rarely shrinks) go to the end of a deque,
    the few others into a heap beside it. Taking the front of a deque costs no comparisons, where a heap of
    every outstanding production cost a dozen tuple comparisons per production (8% of a busy worker). Not
    thread-safe (the tracker's lock guards it)."""

    __slots__ = ("_run", "_heap")

    def __init__(self) -> None:
        self._run: deque = deque()
        self._heap: list = []

    def push(self, at: int, key: str) -> None:
        run = self._run
        if not run or at >= run[-1][0]:
            run.append((at, key))
        else:
            heapq.heappush(self._heap, (at, key))

    def push_many(self, at: int, keys: list[str]) -> None:
        """``push(at, key)`` for each of ``keys``, in that order (one look at the end of the deque for all)."""
        if not keys:
            return
        run = self._run
        if not run or at >= run[-1][0]:
            run.extend([(at, key) for key in keys])
        else:
            for key in keys:
                heapq.heappush(self._heap, (at, key))

    def first(self) -> tuple[int, str] | None:
        run, heap = self._run, self._heap
        if run and (not heap or run[0] <= heap[0]):
            return run[0]
        return heap[0] if heap else None

    def pop(self) -> tuple[int, str]:
        run, heap = self._run, self._heap
        if run and (not heap or run[0] <= heap[0]):
            return run.popleft()
        return heapq.heappop(heap)

    def __len__(self) -> int:
        return len(self._run) + len(self._heap)


ACK_DELAY_BOUNDS_US = (100_000, 250_000, 500_000, 1_000_000, 2_000_000, 4_000_000, 8_000_000, 1 << 62)


@dataclass(slots=True)
class Outstanding:
    """A production some consumer has not acked yet."""
    sender: str
    interval: int
    prod: StoredProduction
    left: dict[str, Delivery]
    stored: bool
    first_sent_us: int
    retry_after_us: int
    backoff_us: int
    sent_us: int = 0          # the last time it was sent
    local: set | None = None  # consumers whose copy went into a local inbox when last sent (not retried)


@dataclass(frozen=True, slots=True)
class Done:
    """Control message to a sender's owner: these stored productions are acked by every consumer."""
    sender: str
    interval: int
    ids: tuple[str, ...]


class Tracker:
    """Thread-safe bookkeeping of unfinished work; see the module docstring."""

    def __init__(self, transport: Transport, owner_inbox: Callable[[str, int], Inbox],
                 now_us: Callable[[], int] | None = None) -> None:
        self._lock = threading.Lock()
        self._now_us = now_us
        self.ack_delays = [0] * len(ACK_DELAY_BOUNDS_US)   # productions acked, by first send -> last ack
        self._srtt_us: float | None = None         # smoothed ack delay and its mean deviation (Jacobson)
        self._rttvar_us = 0.0
        self._rto_us = 0                           # srtt + 4 rttvar: no retry before (0: no sample yet)
        self.retries_deferred = 0                  # retries put off because acks come slower than the delay
        self._transport = transport
        self._owner = owner_inbox
        self.work: dict[tuple[str, int], TimestampBag] = {}
        self.outstanding: dict[str, Outstanding] = {}
        self.per_sender: dict[str, int] = {}
        self.in_flight = 0
        self.acked_total = 0
        self.resent = 0                            # deliveries sent again after their retry delay
        self.resent_after_move = 0                 # deliveries sent again because their consumer's owner changed
        self.resent_on_request = 0                 # deliveries sent again because their consumer dropped them
        self._retries = DueQueue()                 # (retry_after_us, production id); stale rows skipped
        self._first_sent: dict[str, DueQueue] = {}  # per sender: (first send, id), stale rows dropped lazily
        if transport.may_lose:
            transport.on_sent = self._sent
        self._producing = TimestampBag()   # production times of steps still making their productions

    @property
    def may_lose(self) -> bool:
        """Deliveries may be lost on the way, so unacked ones are sent again by time (see :class:`Transport`)."""
        return self._transport.may_lose

    def _bag(self, name: str, interval: int) -> TimestampBag:
        bag = self.work.get((name, interval))
        if bag is None:
            bag = self.work[(name, interval)] = TimestampBag()
        return bag

    def oldest(self, pairs: Iterable[tuple[str, int]]) -> list[int | None]:
        """The oldest unfinished timestamp of each ``(name, interval)`` (``None``: no work), read at once."""
        with self._lock:
            work = self.work
            return [work[p].min() if p in work else None for p in pairs]

    def window_lows(self, pairs: Iterable[tuple[str, int]]) -> list[int | None]:
        """Per ``(name, interval)``: the oldest timestamp of its work at any moment since its last
        :meth:`restart_windows` (``None``: none), read at once."""
        with self._lock:
            return [self._bag(*p).window_low() for p in pairs]

    def restart_windows(self, pairs: Iterable[tuple[str, int]]) -> list[int | None]:
        """End each pair's tracking window now and start a new one (a computation on a cycle saw a new cut
        epoch); returns each ended window's low. Everything added later lowers the new window."""
        with self._lock:
            return [self._bag(*p).mark() for p in pairs]

    def unreceive(self, deliveries: list[Delivery]) -> None:
        """Received deliveries handed back uncommitted (their interval moved): no longer this consumer's
        work; the sender's outstanding production holds them again until someone acks them."""
        with self._lock:
            for d in deliveries:
                self._bag(d.consumer, d.interval).remove(d.record.timestamp_us)
            self.in_flight -= len(deliveries)

    def hand_back(self, deliveries: list[Delivery]) -> None:
        """Received deliveries a consumer gives back uncommitted (it gave their interval up, or was fenced):
        no longer its work, and they go to the interval's owner again now."""
        self.unreceive(deliveries)
        self.send(deliveries)

    def outstanding_count(self, sender: str | None = None) -> int:
        if sender is None:
            return len(self.outstanding)
        return self.per_sender.get(sender, 0)

    @contextmanager
    def producing(self, now_us: Callable[[], int]) -> Iterator[int]:
        """Read the production time for one step of a sender (``now_us()``, inside the lock) and hold it
        until the step's productions are registered: a production computed and being stored is not yet
        outstanding, and dedup GC must not pass it meanwhile (see :meth:`oldest_produced_at`)."""
        now = self.hold_production_time(now_us)
        try:
            yield now
        finally:
            self.release_production_time(now)

    def hold_production_time(self, now_us: Callable[[], int]) -> int:
        """:meth:`producing` in two calls, for a step whose productions are registered later (once its
        commit, running beside the next step, has landed): read ``now_us()`` and hold it until
        :meth:`release_production_time` is called with the returned value."""
        with self._lock:
            now = now_us()
            self._producing.add(now)
        return now

    def release_production_time(self, now: int) -> None:
        with self._lock:
            self._producing.remove(now)

    def oldest_produced_at(self) -> tuple[dict[str, int], int | None]:
        """The production time of each sender's oldest outstanding production, and the oldest production
        time of any step still producing (which may become any sender's)."""
        with self._lock:
            out: dict[str, int] = {}
            for o in self.outstanding.values():
                if o.prod.produced_at_us < out.get(o.sender, 1 << 63):
                    out[o.sender] = o.prod.produced_at_us
            return out, self._producing.min()

    def register(self, sender: str, productions: list[tuple[StoredProduction, int, bool, list[Delivery]]],
                 now_us: int, retry_delay_us: int) -> list[Delivery]:
        """Register productions ``(production, sender interval, stored?, deliveries)`` of one sender as
        outstanding and return the deliveries to send. A production with no consumer is done at once;
        one already outstanding (replayed) is not registered twice."""
        out: list[Delivery] = []
        done: dict[tuple[str, int], list[str]] = {}
        with self._lock:
            outstanding, retries = self.outstanding, self._retries
            first = self._first_sent.get(sender)
            if first is None:
                first = self._first_sent[sender] = DueQueue()
            due = now_us + max(retry_delay_us, self._rto_us)       # the same for the whole call
            bag, bag_interval = None, None
            added: list[str] = []
            for prod, interval, stored, deliveries in productions:
                pid = prod.id
                if pid in outstanding:
                    continue
                if not deliveries:
                    if stored:
                        done.setdefault((sender, interval), []).append(pid)
                    continue
                if len(deliveries) == 1:
                    left = {deliveries[0].consumer: deliveries[0]}
                else:
                    left = {d.consumer: d for d in deliveries}
                outstanding[pid] = Outstanding(sender, interval, prod, left, stored, now_us, due, retry_delay_us,
                                               now_us)
                added.append(pid)
                if bag is None or interval != bag_interval:
                    bag, bag_interval = self._bag(sender, interval), interval
                bag.add(prod.timestamp_us)
                out.extend(deliveries)
            if added:      # one retry time and one first-send time for the whole call: pushed together
                retries.push_many(due, added)
                first.push_many(now_us, added)
                self.per_sender[sender] = self.per_sender.get(sender, 0) + len(added)
        self._after(done)
        return out

    def send(self, deliveries: list[Delivery]) -> None:
        self._transport.send(deliveries)

    def _sent(self, deliveries: list[Delivery], local: bool) -> None:
        """The transport's account of a send (see :attr:`Transport.on_sent`). A copy in a local inbox is
        lost only if its consumer gives its interval up first, and then the consumer hands it back
        (:meth:`returned`): sending it again by time would only queue a copy behind it."""
        if not deliveries:
            return
        with self._lock:
            for d in deliveries:
                o = self.outstanding.get(d.record.id)
                if o is None or d.consumer not in o.left:
                    continue
                if local:
                    if o.local is None:
                        o.local = {d.consumer}
                    else:
                        o.local.add(d.consumer)
                elif o.local:
                    o.local.discard(d.consumer)

    def returned(self, deliveries: list[Delivery]) -> None:
        """Received deliveries of intervals their consumer does not hold (any more): no longer its work.
        Those produced here go out again once the routes may have changed; the others' senders, in other
        processes, send them again."""
        self.unreceive(deliveries)
        with self._lock:
            mine = [d for d in deliveries if d.record.id in self.outstanding]
        if mine:
            self._transport.park(mine)

    def received(self, deliveries: list[Delivery]) -> None:
        """Deliveries reached their consumer: they are its work until it acks them. (In transit, the
        sender's outstanding production holds the watermark instead.)"""
        with self._lock:
            bag, pair = None, None
            for d in deliveries:
                if bag is None or pair != (d.consumer, d.interval):
                    pair = (d.consumer, d.interval)
                    bag = self._bag(*pair)
                bag.add(d.record.timestamp_us)
            self.in_flight += len(deliveries)

    def acked(self, deliveries: list[Delivery]) -> None:
        """The consumers committed (or dropped as duplicates) these deliveries."""
        done: dict[tuple[str, int], list[str]] = {}
        now = self._now_us() if self._now_us is not None else None
        with self._lock:
            bag, pair = None, None
            for d in deliveries:
                if bag is None or pair != (d.consumer, d.interval):
                    pair = (d.consumer, d.interval)
                    bag = self._bag(*pair)
                bag.remove(d.record.timestamp_us)
            self.in_flight -= len(deliveries)
            self._senders_acked([(d.consumer, d.record.id) for d in deliveries], done, now)
            self.acked_total += len(deliveries)
        self._after(done)

    def acked_remotely(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Consumers in other processes acked ``(consumer, production id)``: the sender's half of
        :meth:`acked` (the consumer's half happened there). Acks of unknown productions are ignored."""
        done: dict[tuple[str, int], list[str]] = {}
        now = self._now_us() if self._now_us is not None else None
        with self._lock:
            self._senders_acked(pairs, done, now)
        self._after(done)

    def _senders_acked(self, pairs: Iterable[tuple[str, str]], done: dict, now: int | None) -> None:
        """The senders' half of acks ``(consumer, production id)``, in bulk (under the lock): each ack takes
        its consumer off its production; the productions left with none are finished (ack delay sampled,
        sender's count and work bag lowered, stored ones reported in ``done``), in the order of their last
        ack. The same as one :meth:`_sender_acked` per pair, with fewer lookups per ack."""
        outstanding = self.outstanding
        finished = []
        for consumer, pid in pairs:
            o = outstanding.get(pid)
            if o is None:
                continue
            left = o.left
            if consumer not in left:
                continue
            del left[consumer]
            if not left:
                del outstanding[pid]
                finished.append(o)
        if not finished:
            return
        sample = self._sample if now is not None else None
        per_sender, work = self.per_sender, self.work
        bag, slot = None, None
        for o in finished:
            if sample is not None:
                sample(now - o.first_sent_us)
            sender, interval = o.sender, o.interval
            per_sender[sender] -= 1
            if bag is None or slot != (sender, interval):
                slot = (sender, interval)
                bag = work.get(slot) or self._bag(sender, interval)
            bag.remove(o.prod.timestamp_us)
            if o.stored:
                ids = done.get(slot)
                if ids is None:
                    done[slot] = [o.prod.id]
                else:
                    ids.append(o.prod.id)

    def _sender_acked(self, consumer: str, pid: str, done: dict, now: int | None) -> None:
        """One ack, the reference for :meth:`_senders_acked` (which the tracker uses)."""
        o = self.outstanding.get(pid)
        if o is None or consumer not in o.left:
            return
        del o.left[consumer]
        if not o.left and now is not None:
            self._sample(now - o.first_sent_us)
        if not o.left:
            del self.outstanding[pid]
            self.per_sender[o.sender] -= 1
            self._bag(o.sender, o.interval).remove(o.prod.timestamp_us)
            if o.stored:
                done.setdefault((o.sender, o.interval), []).append(pid)

    def _sample(self, delay_us: int) -> None:
        """One production's ack delay (first send to last ack): the retry timeout follows the delays acks
        actually take (Jacobson/Karels: srtt + 4 x mean deviation), so that records queued at a busy
        consumer are not sent again while its acks still flow. Productions sent again are sampled too, from
        their first send (Karn's rule would drop them, but then every delay longer than the retry delay
        goes unseen, as those are exactly the ones sent again, and the timeout could never grow past it).
        Under the lock."""
        for i, bound in enumerate(ACK_DELAY_BOUNDS_US):
            if delay_us < bound:
                self.ack_delays[i] += 1
                break
        if self._srtt_us is None:
            self._srtt_us, self._rttvar_us = float(delay_us), delay_us / 2
        else:
            self._rttvar_us += (abs(delay_us - self._srtt_us) - self._rttvar_us) / 4
            self._srtt_us += (delay_us - self._srtt_us) / 8
        self._rto_us = int(self._srtt_us + 4 * self._rttvar_us)

    @property
    def retry_timeout_us(self) -> int:
        """The retry timeout learnt from ack delays (0 until the first sample); a delivery is sent again
        no sooner than max(its backoff, this) after its last send."""
        return self._rto_us

    def forget(self, sender: str, interval: int) -> int:
        """The sender's interval moved away: stop retrying its productions here (its new owner replays the
        stored ones). Returns how many were dropped."""
        with self._lock:
            gone = [pid for pid, o in self.outstanding.items() if o.sender == sender and o.interval == interval]
            for pid in gone:
                o = self.outstanding.pop(pid)
                self.per_sender[sender] -= 1
                self._bag(sender, interval).remove(o.prod.timestamp_us)
            return len(gone)

    def resend_to(self, slots: set[tuple[str, int]]) -> int:
        """The owners of these ``(consumer, interval)`` pairs changed: send every unacked copy bound for
        them again now, by the new routes, rather than when its retry comes due (an old owner that gives
        a slot up drops what it held unacked, and the retry timeout may have grown to seconds)."""
        if not slots:
            return 0
        out: list[Delivery] = []
        with self._lock:
            for o in self.outstanding.values():
                for c, d in o.left.items():
                    if (c, d.interval) in slots:
                        out.append(d)
            self.resent_after_move += len(out)
        if out:
            self._transport.send(out)
        return len(out)

    def resend_requested(self, pairs: Iterable[tuple[str, str]]) -> int:
        """Consumers dropped these ``(consumer, production id)`` copies uncommitted (they gave the slot
        up, were fenced, or their claim of it was refused) and asked for them again: send each one still
        unacked again now, by the routes as they are now, rather than when its retry comes due (no map
        change the sender sees announces such a loss, and the retry timeout may have grown to seconds).
        Their timed retries stay as they were (a production's other consumers may have lost theirs too).
        Returns how many were sent."""
        out: list[Delivery] = []
        with self._lock:
            for consumer, pid in pairs:
                o = self.outstanding.get(pid)
                d = o.left.get(consumer) if o is not None else None
                if d is None:
                    continue            # acked since (or never ours): nothing to send
                out.append(d)
            self.resent_on_request += len(out)
        if out:
            self._transport.send(out)
        return len(out)

    def oldest_sent_us(self, sender: str) -> int | None:
        """When the sender's oldest outstanding production was first sent (``None``: none outstanding)."""
        with self._lock:
            queue = self._first_sent.get(sender)
            while queue:
                at, pid = queue.first()
                o = self.outstanding.get(pid)
                if o is not None and o.first_sent_us == at:
                    return at
                queue.pop()                       # acked or forgotten since
            return None

    def backlogged(self, sender: str, now_us: int, retry_delay_us: int) -> bool:
        """The sender should hold back new input: over a transport that retries, its oldest unacked
        production has waited half the retry delay, so what it sends now would queue at its consumers long
        enough to be sent twice (and the copies queue too: a backlog past the retry delay feeds itself)."""
        if not self._transport.may_lose:
            return False
        oldest = self.oldest_sent_us(sender)
        return oldest is not None and now_us - oldest > retry_delay_us // 2

    def oldest_unacked_us(self) -> int | None:
        """The first send time of the oldest outstanding production (for delay statistics)."""
        with self._lock:
            return min((o.first_sent_us for o in self.outstanding.values()), default=None)

    def _after(self, done: dict) -> None:
        for (sender, interval), ids in done.items():
            self._owner(sender, interval).put_many([Done(sender, interval, tuple(ids))])

    def unacked(self, pids: Iterable[str]) -> frozenset[str]:
        """The ids among ``pids`` some consumer has not acked yet."""
        with self._lock:
            return frozenset(p for p in pids if p in self.outstanding)

    def mark_stored(self, sender: str, interval: int, pids: Iterable[str]) -> None:
        """These weak productions were checkpointed; one acked while its checkpoint was being written
        is deleted again by its owner."""
        done: dict[tuple[str, int], list[str]] = {}
        with self._lock:
            for pid in pids:
                o = self.outstanding.get(pid)
                if o is None:
                    done.setdefault((sender, interval), []).append(pid)
                else:
                    o.stored = True
        self._after(done)

    def _wait_us(self, backoff_us: int, max_backoff_us: int | None) -> int:
        wait = max(backoff_us, self._rto_us)
        return wait if max_backoff_us is None else min(wait, max(backoff_us, max_backoff_us))

    def due_retries(self, now_us: int, max_backoff_us: int | None = None) -> int:
        """Send again every delivery not acked within its retry delay: the larger of its backoff (the
        delay doubles per attempt, up to ``max_backoff_us`` when given) and the retry timeout learnt from
        ack delays (:attr:`retry_timeout_us`, also capped by ``max_backoff_us``), counted from its last
        send."""
        out: list[Delivery] = []
        later: list[tuple[int, str]] = []
        with self._lock:
            queue = self._retries
            while queue and queue.first()[0] <= now_us:   # only what is due: no scan of everything outstanding
                due_us, pid = queue.pop()
                o = self.outstanding.get(pid)
                if o is None or o.retry_after_us != due_us:
                    continue                        # acked, forgotten, or already rescheduled
                wait = self._wait_us(o.backoff_us, max_backoff_us)
                if o.sent_us + wait > now_us:       # acks got slower since it was sent: not lost yet
                    self.retries_deferred += 1
                    o.retry_after_us = o.sent_us + wait
                    later.append((o.retry_after_us, pid))
                    continue
                if o.local:
                    out.extend(d for c, d in o.left.items() if c not in o.local)
                else:
                    out.extend(o.left.values())
                o.sent_us = now_us
                o.backoff_us *= 2
                if max_backoff_us is not None and o.backoff_us > max_backoff_us:
                    o.backoff_us = max_backoff_us
                o.retry_after_us = now_us + self._wait_us(o.backoff_us, max_backoff_us)
                later.append((o.retry_after_us, pid))
            for row in later:
                queue.push(*row)
            self.resent += len(out)
        if out:
            self._transport.send(out)
        return len(out)
