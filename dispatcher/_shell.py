"""The dispatcher's shell: one loop thread that does the I/O around :class:`DispatcherState`.

The loop thread alone touches the core, the tailer and the output writers; the state files are written as below.
Registry lookups and joiner requests run on two small pools of threads, each a blocking call on the thread
that made it (no future, so no gRPC thread to start or wake for its answer); both report back through an
inbox queue, and the loop wakes as soon as an answer arrives (no fixed waits). When nothing happens it
rescans the logs every ``[dispatcher].poll_interval_s``.

Two writes wait for the file system's journal (which the registry's and the joiners' fsyncs keep busy) on
threads of their own, so they never hold the loop that sends the joins:

* ``status.json`` (a view, rewritten every ~100 ms, not durable; a :class:`_HandOff`): the loop hands it
  the statistics it made and goes on. They are made by the loop after the writes they report have landed,
  so the file never shows more than is durable.
* the checkpoint (its snapshot or journal record, fsynced; a :class:`_HandOff` too): one at a
  time, in order, on the checkpoint thread. The unjoinable and quarantine writes stay on the loop and land
  before the loop hands over the checkpoint that passes them; the loop waits for the previous checkpoint
  before it hands over the next, so a failing disk pauses it one checkpoint later, as before it paused at
  the first.

At stop the loop waits for the checkpoint thread, then writes the final checkpoint and status itself.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import queue
import random
import threading
from collections import Counter

from photon import (Clock, PhotonConfig, Quarantine, SystemClock, open_output_sink, output_publisher,
                    recovery_stream, stream_source)

from dispatcher._recovery import StreamAndRecovery
from dispatcher._leader import follow_leaders
from dispatcher._share import RegionShare
from dispatcher._files import CheckpointFiles, ProcessLock, dispatcher_dir, load_checkpoint, write_status
from dispatcher._state import (Checkpoint, DispatcherState, DispatcherStatistics, JoinAnswered, JoinFailed,
                               LinesRead, Lookup, LookupAnswered, LookupFailed, QuarantineRecords, SendBatch,
                               StopRequested, TimePassed, WriteUnjoinable)

log = logging.getLogger("photon.dispatcher")

STATUS_INTERVAL_S = 0.1
MIN_SCAN_BYTES = 16 << 10
MAX_SCAN_BYTES = 8 << 20
JOIN_TIMEOUT_S = 30.0
LOOKUP_TIMEOUT_S = 2.0
QUARANTINE_SYNC_US = 5_000_000  # with the output on S3: upload a grown quarantine at most this often
_DOWN_FOR_US = 500_000  # a joiner whose request failed is avoided this long (unless all are down)

_LOOKUP_OK, _LOOKUP_FAILED, _JOIN_OK, _JOIN_FAILED = range(4)


def _default_joiner_client(address: str):
    from joiner import JoinerClient
    return JoinerClient(address)


def _default_registry_client(endpoints, near_host: str | None = None):
    from idregistry import connect
    return connect(endpoints, near_host=near_host)


class _JoinerPool:
    """Picks the least loaded joiner (fewest requests outstanding), round robin among equals, avoiding
    for a moment a joiner whose last request failed."""

    def __init__(self, addresses: list[str], factory) -> None:
        if not addresses:
            raise ValueError("the dispatcher needs at least one joiner address")
        self.addresses = list(addresses)
        self.clients = [factory(a) for a in self.addresses]
        self.outstanding = [0] * len(self.addresses)
        self.down_until = [0] * len(self.addresses)
        self._next = 0

    def pick(self, now_us: int) -> int:
        n = len(self.addresses)
        best = -1
        for k in range(n):
            i = (self._next + k) % n
            if self.down_until[i] > now_us:
                continue
            if best < 0 or self.outstanding[i] < self.outstanding[best]:
                best = i
        if best < 0:  # all recently failed: try the one that failed longest ago
            best = min(range(n), key=self.down_until.__getitem__)
        self._next = (best + 1) % n
        return best

    def close(self) -> None:
        for c in self.clients:
            try:
                c.close()
            except Exception:  # closing a broken channel must not stop the shutdown
                log.exception("closing joiner client")


class _HandOff:
    """Runs ``write(item)`` on a thread of its own for the items the loop hands it, one at a time, so that the
    loop never waits on the file system for them (see the module docstring).

    :meth:`give` returns at once; an item given while another waits to be taken replaces it (a view, such as
    the status: only the latest is written, never an older one after a newer one). ``give(item, wait=True)``
    first waits until everything given before is written (items land one at a time and in order, and a
    failing disk holds the giver there) and raises :attr:`error`, what ended a write."""

    def __init__(self, name: str, write) -> None:
        self._write = write
        self._cv = threading.Condition()
        self._next = None           # the item to write next (None: nothing new)
        self._busy = False          # an item given and not yet written
        self._closed = False
        self.error: BaseException | None = None
        self.written = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def give(self, item, wait: bool = False) -> None:
        with self._cv:
            if wait:
                while self._busy:
                    self._cv.wait()
                if self.error is not None:
                    raise self.error
            self._next, self._busy = item, True
            self._cv.notify_all()

    def idle(self) -> bool:
        """Nothing given waits to be written, and no write runs."""
        with self._cv:
            return not self._busy

    def close(self, timeout: float | None = None) -> None:
        """Write what was given last, then end the thread (waiting for it at most ``timeout`` seconds)."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout)

    def _run(self) -> None:
        cv = self._cv
        while True:
            with cv:
                while self._next is None and not self._closed:
                    cv.wait()
                item, self._next = self._next, None
                if item is None:
                    return              # closed, nothing left to write
            try:
                self._write(item)
                self.written += 1
            except BaseException as e:  # noqa: BLE001  (the giver re-raises it)
                with cv:
                    self.error = e
            finally:
                with cv:
                    self._busy = self._next is not None
                    cv.notify_all()


class Dispatcher:
    """A running dispatcher for one region; made by :func:`serve`.

    Lifecycle: construct (takes the state-folder lock, loads the checkpoint), :meth:`start`, then
    :meth:`stop` (final checkpoint, unjoinable output rolled, status written). :meth:`statistics` may be
    called from any thread at any time.
    """

    def __init__(self, config: PhotonConfig, region: str, joiners: list[str], registry=None, *,
                 clock: Clock | None = None, joiner_client=None, registry_client=None,
                 join_timeout_s: float = JOIN_TIMEOUT_S, lookup_timeout_s: float = LOOKUP_TIMEOUT_S,
                 status_interval_s: float = STATUS_INTERVAL_S,
                 jitter=None) -> None:
        self.region = config.region(region)
        self.config = config
        self.clock = clock or SystemClock()
        self._wall0 = self.clock.now_us()
        self._mono0 = self.clock.monotonic_us()
        self.dir = dispatcher_dir(self.region.state_dir)
        self._lock = ProcessLock(self.dir)
        self._join_timeout_s = join_timeout_s
        self._status_every_us = int(status_interval_s * 1_000_000)
        self._poll_us = int(config.dispatcher.poll_interval_s * 1_000_000)
        try:
            snapshot = load_checkpoint(self.dir)
            self._checkpoints = CheckpointFiles(self.dir, int(snapshot.get("journal", 0)) if snapshot else 0)
            if registry_client is None and registry:
                # lookups read the registry replicas of this region first: no wide-area round trip
                registry_client = _default_registry_client(registry, self.region.bind_host(config.registry.host))
            self._registry = registry_client
            self.core = DispatcherState(config.join, config.dispatcher, lookups=registry_client is not None,
                                        jitter=jitter if jitter is not None else random.Random(),
                                        restore=snapshot, share=region_share(config, self.region.name))
            self.quarantine = Quarantine(self.region.quarantine_dir, f"dispatcher-{self.region.name}",
                                         publisher=output_publisher(config, self.region, "quarantine"))
            self.quarantine.skip_known(self.core.offsets)   # lines past the checkpoint are read again
            # the foreign stream and its recovery stream (photon recover re-injects lost clicks there)
            self.tailer = StreamAndRecovery(
                stream_source(config, self.region, config.join.foreign_stream),
                stream_source(config, self.region, recovery_stream(config.join.foreign_stream)),
                config.join.foreign_stream, offsets=self.core.offsets, quarantine=self.quarantine,
                max_line_bytes=config.input.max_line_bytes)
            self.unjoinable = open_output_sink(self.region.output_url("unjoinable"), f"dispatcher-{self.region.name}",
                                               staging=self.region.unjoinable_dir, s3=config.s3)
            self._joiners = _JoinerPool(joiners, joiner_client or _default_joiner_client)
        except BaseException:
            self._lock.release()
            raise
        name = f"dispatcher-{self.region.name}"
        self.unjoinable.recover_orphans()
        # lines after the checkpoint are read again, and their clicks may be given up again: unjoinable
        # lines an earlier run wrote since then are not written twice (from a second before the
        # checkpoint: file times are coarse)
        since_us = int(snapshot.get("written_at_us", 0)) - 1_000_000 if snapshot else 0
        self._unjoinable_written = Counter(self.unjoinable.lines_written_since(since_us))
        self.unjoinable_repeats_skipped = 0
        self._lookup_tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._lookup_workers = [threading.Thread(target=self._lookup_worker, name=f"{name}-lookup-{k}",
                                                 daemon=True)
                                for k in range(config.dispatcher.max_in_flight)]
        # joiner requests, one blocking call each (at most max_in_flight are out: a thread for each); apart
        # from the lookups' threads, so a hung registry call never delays a join
        self._join_tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._join_workers = [threading.Thread(target=self._worker, args=(self._join_tasks,),
                                               name=f"{name}-join-{k}", daemon=True)
                              for k in range(config.dispatcher.max_in_flight)]
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._batch_joiner: dict[int, int] = {}
        self._lookups_started: dict[int, int] = {}  # batch in a registry lookup -> when it was asked
        self._lookup_deadline_us = int(lookup_timeout_s * 1_000_000)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._stats = self.core.statistics(pid=os.getpid())
        self._pending_bytes = 0
        self._scan_wall_us = 0
        self._line_bytes = 256.0  # running estimate of a line's size, for read-ahead budgets
        self._scanned = False     # a first scan has been made (it reads about one request: _scan_budget)
        self.error: BaseException | None = None
        self._waiting_for_disk = ""      # why the dispatcher is paused on a failing write ("" when not)
        self._abandoned = False          # stopped with a write not done: no final checkpoint
        self._next_quarantine_sync = 0
        self._leaders = None                  # the registry-leader follower, from start() on
        # the status and checkpoint threads (see the module docstring), from start() until the loop stops;
        # without them the loop writes both itself
        self._status_writer: _HandOff | None = None
        self._checkpointer: _HandOff | None = None

    # ------------------------------------------------------------ lifecycle

    def start(self) -> "Dispatcher":
        for w in self._lookup_workers + self._join_workers:
            w.start()
        self._leaders = follow_leaders(self.config, self.core.share, self._registry, self.region.name)
        self._status_writer = _HandOff(f"{self._thread.name}-status", self._write_status)
        self._checkpointer = _HandOff(f"{self._thread.name}-checkpoint",
                                      lambda cmd: self._write_checkpoint(cmd, on_loop=False))
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 30.0) -> None:
        self._stopping.set()
        self._inbox.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout)
        elif self._thread.ident is None:  # never started: still leave a final checkpoint behind
            self._finish()

    def statistics(self) -> DispatcherStatistics:
        return self._stats

    # ------------------------------------------------------------ the loop

    def _run(self) -> None:
        try:
            self._loop()
        except _WriteAbandoned as e:
            log.error("dispatcher %s: %s; no final checkpoint (a restart reads on from the last one)",
                      self.region.name, e)
        except BaseException as e:  # noqa: BLE001  (reported in status and to the process)
            self.error = e
            log.exception("dispatcher loop failed")
        finally:
            self._finish()

    def _loop(self) -> None:
        core, now_us, inbox = self.core, self._now_us, self._inbox
        self._execute(core.handle(TimePassed(now_us())))  # re-send what the checkpoint held
        next_scan = next_status = 0
        found = False  # the latest scan found lines: scan again at once
        while not self._stopping.is_set():
            if self._checkpointer is not None and self._checkpointer.error is not None:
                raise self._checkpointer.error
            answers = []
            try:
                while True:
                    answers.append(inbox.get_nowait())
            except queue.Empty:
                pass
            now = now_us()
            events = [ev for a in answers if a is not None and (ev := self._answer_event(a, now)) is not None]
            if self._lookups_started:
                self._expire_lookups(now, events)
            scanned_lines = False
            wanted = core.lines_wanted()
            if wanted and (found or now >= next_scan):
                chunks = self.tailer.poll(self._scan_budget(wanted if self._scanned
                                                            else min(wanted, self.config.dispatcher.batch_size)))
                self._scanned = True
                self._scan_wall_us = self.clock.now_us()
                found = scanned_lines = bool(chunks)
                if found:
                    self._learn_line_size(chunks)
                now = now_us()
                events.append(LinesRead(chunks, now))
                next_scan = now + self._poll_us
            events.append(TimePassed(now))
            self._execute(core.handle(*events))
            if now >= next_status:
                self._publish_status()
                self.unjoinable.maybe_roll()
                if now >= self._next_quarantine_sync:
                    self.quarantine.sync()      # uploads it when the output is on S3
                    self._next_quarantine_sync = now + QUARANTINE_SYNC_US
                next_status = now + self._status_every_us
            if not answers and not scanned_lines:
                wake = min(next_scan, next_status) if core.wants_lines() else next_status
                due = core.next_due_us()
                if due is not None:
                    wake = min(wake, due)
                if self._lookups_started:
                    wake = min(wake, min(self._lookups_started.values()) + self._lookup_deadline_us)
                timeout = max(0, wake - now_us()) / 1e6
                try:
                    inbox.put(inbox.get(timeout=timeout))  # wait for an answer, then handle it above
                except queue.Empty:
                    pass

    def _now_us(self) -> int:
        """Wall time that never goes backwards: the wall clock at start plus monotonic time since, so a
        stepped system clock cannot stall retries or make times run backwards."""
        return self._wall0 + self.clock.monotonic_us() - self._mono0

    def _scan_budget(self, lines_wanted: int) -> int:
        """Bytes to read for about ``lines_wanted`` lines (read ahead is bounded, so a large backlog
        stays in the files and not in memory or in every checkpoint). The process's first scan asks for
        about one request's lines (``batch_size``), not the read-ahead's: at a cold start the first lookup
        and the first join request then wait for a few hundred lines' work, not for a backlog's worth
        (about 16,000 lines and 0.05 CPU-s on the 1M workload); the next scan follows at once."""
        return min(MAX_SCAN_BYTES, max(MIN_SCAN_BYTES, int(lines_wanted * self._line_bytes)))

    def _learn_line_size(self, chunks) -> None:
        n = sum(len(c.lines) for c in chunks)
        size = sum(c.end - c.offsets[0] for c in chunks)
        self._line_bytes = 0.8 * self._line_bytes + 0.2 * (size / n)

    def _answer_event(self, answer: tuple, now: int):
        kind, batch_id, payload = answer
        if kind == _LOOKUP_OK or kind == _LOOKUP_FAILED:
            if self._lookups_started.pop(batch_id, None) is None:
                return None  # answered after its deadline: the batch was already sent without it
            if kind == _LOOKUP_OK:
                return LookupAnswered(batch_id, payload, now)
            return LookupFailed(batch_id, payload, now)
        j = self._batch_joiner.pop(batch_id)
        self._joiners.outstanding[j] -= 1
        if kind == _JOIN_OK:
            return JoinAnswered(batch_id, payload, now, getattr(payload, "store_behind", False),
                                getattr(payload, "store_read_to_us", None), getattr(payload, "store_read_through_us", 0))
        self._joiners.down_until[j] = now + _DOWN_FOR_US
        log.warning("joiner %s failed a request: %s", self._joiners.addresses[j], payload)
        return JoinFailed(batch_id, payload, now)

    def _execute(self, commands: list) -> None:
        for cmd in commands:
            kind = type(cmd)
            if kind is SendBatch:
                self._send(cmd)
            elif kind is Lookup:
                self._lookup(cmd)
            elif kind is WriteUnjoinable:
                lines = self._not_written_before(cmd.raws)
                # committed before the next command: no checkpoint passes lines a crash could still cut
                self._until_written("writing unjoinable output",
                                    lambda: self.unjoinable.sync(self.unjoinable.write_lines(lines)))
            elif kind is QuarantineRecords:
                for file, offset, reason, raw in cmd.records:
                    self._until_written("writing the quarantine",
                                        lambda: self.quarantine.add(file, offset, reason, raw))
            elif kind is Checkpoint:
                if self._checkpointer is not None:
                    self._checkpointer.give(cmd, wait=True)    # after the one before it; raises its error
                else:
                    self._write_checkpoint(cmd)
            else:
                raise TypeError(f"unknown dispatcher command {cmd!r}")

    def _write_checkpoint(self, cmd: Checkpoint, on_loop: bool = True) -> None:
        if cmd.snapshot is not None:
            self._until_written("writing the checkpoint", lambda: self._checkpoints.save_snapshot(cmd.snapshot),
                                on_loop)
        else:
            self._until_written("writing the checkpoint journal", lambda: self._checkpoints.append_delta(cmd.delta),
                                on_loop)

    def _drain_checkpoints(self) -> None:
        """At stop (on the loop thread): the checkpoint being written lands (or is abandoned), the thread
        ends, and later checkpoints are written on the loop."""
        if self._checkpointer is not None:
            self._checkpointer.close()
            self._checkpointer = None

    def _until_written(self, what: str, write, on_loop: bool = True) -> None:
        """Run ``write`` until it succeeds. A full or failing disk pauses the dispatcher here (commands run
        in order, so no checkpoint moves past events whose unjoinable or quarantine write has not landed);
        the status says so (``waiting_for_disk``) and the dispatcher goes on by itself once the write
        succeeds. Stopping while paused raises :class:`_WriteAbandoned`: no final checkpoint is written, so
        a restart reads those events again from the previous checkpoint."""
        delay = 0.05
        while True:
            try:
                write()
            except OSError as e:
                if not self._waiting_for_disk:
                    log.error("dispatcher %s: %s failed (%s); pausing until it succeeds", self.region.name, what, e)
                self._waiting_for_disk = f"{what}: {e}"
                if on_loop:
                    self._publish_status()
                else:                     # the checkpoint thread: the core is the loop's, so the last statistics
                    self._stats = dataclasses.replace(self._stats, waiting_for_disk=self._waiting_for_disk)
                    if self._status_writer is not None:
                        self._status_writer.give(self._stats)
                if self._stopping.wait(delay):
                    self._abandoned = True
                    raise _WriteAbandoned(f"stopped while {what} kept failing: {e}") from e
                delay = min(1.0, delay * 2)
                continue
            if self._waiting_for_disk:
                log.warning("dispatcher %s: %s works again; resuming", self.region.name, what)
                self._waiting_for_disk = ""
            return

    def _not_written_before(self, raws: list[bytes]) -> list[bytes]:
        written = self._unjoinable_written
        if not written:
            return raws
        out = []
        for raw in raws:
            if written[raw] > 0:
                written[raw] -= 1
                self.unjoinable_repeats_skipped += 1
            else:
                out.append(raw)
        written += Counter()   # drops the used-up lines, so the check above ends once all are met
        return out

    def _lookup_worker(self) -> None:
        """Runs registry lookups (daemon threads: a hung registry call never delays the process's exit)."""
        self._worker(self._lookup_tasks)

    @staticmethod
    def _worker(tasks: queue.SimpleQueue) -> None:
        """Runs the tasks put on ``tasks`` until a None (daemon threads: a hung call never delays the
        process's exit)."""
        while (task := tasks.get()) is not None:
            task()

    def _expire_lookups(self, now: int, events: list) -> None:
        """A lookup slower than its deadline counts as failed: the batch goes to the joiners without it
        (their registry commit decides), so a hung registry cannot hold every batch slot."""
        for batch_id, started in list(self._lookups_started.items()):
            if now - started >= self._lookup_deadline_us:
                del self._lookups_started[batch_id]
                events.append(LookupFailed(batch_id, "lookup timed out", now))

    def _lookup(self, cmd: Lookup) -> None:
        inbox, registry, batch_id, started = self._inbox, self._registry, cmd.batch_id, self._lookups_started
        started[batch_id] = self._now_us()

        def run():
            if batch_id not in started:
                return  # expired while queued behind slower lookups
            try:
                inbox.put((_LOOKUP_OK, batch_id, registry.lookup(cmd.ids)))
            except Exception as e:  # a lookup failure is transient: the batch is sent anyway
                inbox.put((_LOOKUP_FAILED, batch_id, f"{type(e).__name__}: {e}"))

        self._lookup_tasks.put(run)

    def _send(self, cmd: SendBatch) -> None:
        pool, inbox, batch_id = self._joiners, self._inbox, cmd.batch_id
        j = pool.pick(self._now_us())
        pool.outstanding[j] += 1
        self._batch_joiner[batch_id] = j

        client, timeout, ids, ref_ids, raws = pool.clients[j], self._join_timeout_s, cmd.ids, cmd.ref_ids, cmd.raws

        def run():
            try:
                inbox.put((_JOIN_OK, batch_id, client.join(ids, ref_ids, raws, timeout=timeout)))
            except Exception as e:  # unavailable, timed out, cancelled: the whole request is retried
                inbox.put((_JOIN_FAILED, batch_id, f"{type(e).__name__}: {e}"))

        self._join_tasks.put(run)

    def _publish_status(self, final: bool = False) -> None:
        """Make the statistics (on the loop thread, after the writes they report) and have them written:
        by the status thread while running, by the caller when ``final`` or before :meth:`start`."""
        try:
            self._pending_bytes = self.tailer.pending_bytes()
        except OSError:
            log.exception("measuring pending bytes")
        # scan_at_us is compared with other processes' wall clocks: report the system's, not the core's
        self._stats = dataclasses.replace(
            self.core.statistics(pending_bytes=self._pending_bytes, pid=os.getpid()),
            scan_at_us=self._scan_wall_us, waiting_for_disk=self._waiting_for_disk)
        if not final and self._status_writer is not None:
            self._status_writer.give(self._stats)
            return
        self._write_status(self._stats)

    def _write_status(self, stats) -> None:
        try:
            write_status(self.dir, stats)
        except OSError as e:      # a view only: a full disk must not end the dispatcher
            log.debug("writing the dispatcher status failed: %s", e)

    def _finish(self) -> None:
        try:
            self._drain_checkpoints()      # a write stopped while the disk kept failing sets _abandoned
            if not self._abandoned:
                try:
                    self._execute(self.core.handle(StopRequested(self._now_us())))
                except _WriteAbandoned as e:
                    log.error("dispatcher %s: %s; no final checkpoint (a restart reads on from the last one)",
                              self.region.name, e)
            for close in (self.unjoinable.roll, self.quarantine.close):
                try:
                    close()
                except OSError as e:
                    log.error("dispatcher %s: closing output at stop failed: %s", self.region.name, e)
            if self._status_writer is not None:
                self._status_writer.close(timeout=5.0)   # bounded: the final status below replaces a late one
            self._publish_status(final=True)
        finally:
            if self._leaders is not None:
                self._leaders.stop()
            for _ in self._lookup_workers:
                self._lookup_tasks.put(None)
            for _ in self._join_workers:
                self._join_tasks.put(None)
            self._joiners.close()
            if self._registry is not None:
                try:
                    self._registry.close()
                except Exception:
                    log.exception("closing registry client")
            self._checkpoints.close()
            self._lock.release()


class _WriteAbandoned(Exception):
    """The dispatcher stopped while a write it must not skip kept failing."""


def serve(config: PhotonConfig, region: str, joiners: list[str], registry=None, **options) -> Dispatcher:
    """Start the dispatcher of ``region`` feeding ``joiners`` (``host:port`` addresses), looking ids up in
    the registry at ``registry`` (endpoints for ``idregistry.connect``; None: no lookups). Returns the
    running :class:`Dispatcher`; call ``stop()`` to end it. Options: ``clock``, ``joiner_client``
    (``address -> client``), ``registry_client`` (a connected client), ``join_timeout_s``,
    ``lookup_timeout_s`` (a slower lookup counts as failed: the batch is sent without it),
    ``status_interval_s``, ``jitter`` (an object with ``random()`` scaling each retry delay by
    ``1 - 0.2 * jitter.random()``; default a fresh ``random.Random``)."""
    return Dispatcher(config, region, joiners, registry, **options).start()


def region_share(config: PhotonConfig, region: str) -> RegionShare | None:
    """Each click's first region among the config's pipeline regions (``[dispatcher].share_by_region``), or
    None with a single pipeline region or the option off."""
    names = [r.name for r in config.pipeline_regions]
    d = config.dispatcher
    if not d.share_by_region or len(names) < 2 or region not in names:
        return None
    return RegionShare(names, region, int(d.share_grace_initial_ms * 1000), int(d.share_grace_min_ms * 1000),
                       int(d.share_grace_max_ms * 1000), int(d.share_down_after_ms * 1000),
                       d.share_leader_fraction)
