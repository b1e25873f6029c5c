"""The joiner shell: carries out one :class:`~joiner._state.JoinBatch` per request against the event store,
the registry and the output writer, and counts what happened.

Order per request (the paper's): event store lookup -> adapter -> registry commit with this attempt's
token -> write the OK lines (flushed) -> answer. A crash between commit and write loses those events from
the output (they are registered but not written); the verification job finds them and the recovery job
re-joins them. Writing before committing could duplicate a click, so it is never done.

A failed output write (``ENOSPC``, ``EIO``) after an OK commit is never a silent loss: the ids go into the
lost-ids ledger (``joiner._lost``, fsynced) before the answer, those events answer LOST (the registry
holds them; the recovery job writes them), and from then on the joiner answers every request
THROTTLED before touching the event store or the registry until a probe write to its output folder
succeeds again (tried at most once per ``writer_probe_s``).

A commit whose outcome stays unknown (the registry failed to answer for ``commit_patience_s``, or the joiner
was told to stop and ``stop_patience_s`` ran out while the commit was still being retried) may have
registered its ids. Those ids go into the same ledger with a reason starting ``commit outcome unknown``
before the request is answered THROTTLED, so nothing registered is ever left out of both the output and the
ledger; the verification job confirms such candidates against the registry export and the output.

Clean shutdown (:meth:`Joiner.drain`): new requests are refused by the server; the requests in flight keep
retrying their commits and writes until they finish or ``stop_patience_s`` runs out; then the retry loops
give up and every commit still started and unfinished is recorded in the ledger as above.

Tokens: ``<host:port>/<pid>/<start_us>/<seq>``, unique per join attempt (``seq`` numbers this process's
requests). The registry treats a commit by the same token as idempotent, so the registry client may retry
a commit with it; a new request for the same id carries a new token and gets ALREADY_EXISTS.
"""
from __future__ import annotations

import itertools
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass

import orjson

from photon import Clock, EventIds, Outcome, RollingWriter, is_event_id

from joiner._lost import LostLedger
from joiner._state import JoinBatch, throttled

log = logging.getLogger("photon.joiner")

# Tests only: with PHOTON_TEST_KILL_AFTER_COMMIT=<file>, the first joiner of the run to commit a batch writes
# the batch's ids into <file> (created exclusively, so only once per file) and SIGKILLs itself before
# writing them: the loss window between commit and write, on demand.
KILL_AFTER_COMMIT_ENV = "PHOTON_TEST_KILL_AFTER_COMMIT"
_KILL_MARKER = os.environ.get(KILL_AFTER_COMMIT_ENV, "")
"""Read once at start: the join path pays nothing for the hook when it is off."""


def _kill_after_commit(marker: str, ids: list[str]) -> None:
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return
    os.write(fd, "\n".join(ids).encode() + b"\n")
    os.fsync(fd)
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True, slots=True)
class JoinerStatistics:
    name: str
    address: str
    requests: int
    requests_throttled: int
    in_flight: int
    max_in_flight: int
    events: int
    joined: int
    already_registered: int
    not_found: int
    throttled: int
    unjoinable: int
    duplicates_in_request: int
    adapter_errors: int
    bad_ids: int
    eventstore_errors: int
    registry_errors: int
    commit_retries: int
    lines_written: int
    bytes_written: int
    files_rolled: int
    orphans_recovered: int
    not_found_store_behind: int   # answered THROTTLED, not NOT_FOUND: the event store was catching up
    served_by_cache: int          # primaries found in the cache servers
    served_by_logs: int           # primaries found by the logs store (the cache had missed them)
    write_failures: int = 0        # output writes that failed after an OK commit
    lost_ids: int = 0              # ids put into the lost-ids ledger (registered, not written)
    requests_throttled_writer: int = 0   # requests refused at the door while the output writer failed
    writer_error: str = ""         # why the output writer is failing now ("" when it works)
    refused_ids: int = 0           # ids the registry refused alone (e.g. timestamped far in the future)
    commit_unknown_ids: int = 0    # ids put into the ledger because their commit's outcome stayed unknown
    unrecorded_ids: int = 0        # registered ids neither written nor in the ledger (stopping with both failing)
    output_commits: int = 0        # group commits of the output (one may cover several requests' lines)
    store_wait_us: int = 0         # time requests spent in event store lookups (summed over requests at once)
    commit_wait_us: int = 0        # ... in registry commits
    write_wait_us: int = 0         # ... writing their lines until committed output


_STORE_CAUGHT_UP = (False, None, 0)
"""(behind, read_to_us, read_through_us) of a store that is not behind."""

ORPHAN_TOKEN = ""
"""The ledger token of ids set aside at a restart: the dead process's token is not in its output lines;
the verification job finds the registry's token in its export (and judges that process stopped)."""
ORPHAN_REASON = "beyond the commit record of a killed joiner: never output, set aside at restart"

REFUSED = 2
"""The commit result given to an id the registry refused on its own: answered like TOO_OLD (UNJOINABLE)."""

PROBE_MIN_BYTES = 64 << 10
"""The smallest probe write that tells a failed output folder works again (a full tmpfs may still take a
few bytes into a partly used page)."""


def make_token_prefix(address: str, pid: int, start_us: int) -> str:
    """The part of every token that names this joiner process; the request number follows."""
    return f"{address}/{pid}/{start_us}/"


class Joiner:
    """Joins batches of foreign events; thread-safe, one call to :meth:`join` per request.

    ``store.lookup(ids) -> [raw | None]`` and ``registry.commit(ids, token) -> [CommitResult]`` may raise
    anything on failure: the request's undecided events are then answered THROTTLED with nothing written.
    A store with a ``read_through_us`` attribute (the time up to which it has read its logs; None: not
    known) that is more than ``store_behind_s`` behind the clock has its "not held" answers taken as
    "not yet": those events are answered THROTTLED, not NOT_FOUND.
    At most ``max_in_flight`` requests are worked on at once; one more is answered all THROTTLED at once.
    """

    def __init__(self, *, name: str, address: str, store, registry, adapter, writer: RollingWriter,
                 max_in_flight: int, clock: Clock, pid: int | None = None,
                 commit_patience_s: float = 300.0, store_behind_s: float = 5.0,
                 ledger: LostLedger | None = None, writer_probe_s: float = 1.0, ref_ok=is_event_id) -> None:
        self.name = name
        self._ref_ok = ref_ok            # which ref ids can name a primary event (see JoinBatch)
        self.address = address
        self.token_prefix = make_token_prefix(address, pid if pid is not None else os.getpid(), clock.now_us())
        self._store, self._registry, self._adapter = store, registry, adapter
        self._writer = writer
        self._clock = clock
        self._max_in_flight = max_in_flight
        self._commit_patience_s = commit_patience_s
        self._store_behind_us = int(store_behind_s * 1_000_000)
        self._ledger = ledger
        self._writer_probe_s = writer_probe_s
        self._writer_error = ""          # set while the output writer fails; see _writer_usable
        self._probe_bytes = PROBE_MIN_BYTES
        self._next_probe = 0.0
        self.stopping = threading.Event()
        self._last = threading.local()   # the store's state as the calling thread's latest join found it
        self._store_seen = _STORE_CAUGHT_UP  # the store's state as the latest lookup of any thread found it
        self._seq = itertools.count(1)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)   # notified whenever a request finishes
        self._in_flight = 0
        self._started: dict[int, tuple[list[str], str]] = {}  # seq -> (ids, token): commits begun, unfinished
        self._counts = [0] * len(Outcome)
        self._c = dict(requests=0, requests_throttled=0, events=0, duplicates_in_request=0,
                       adapter_errors=0, bad_ids=0, eventstore_errors=0, registry_errors=0, commit_retries=0,
                       orphans_recovered=0, not_found_store_behind=0, served_by_cache=0, served_by_logs=0,
                       write_failures=0, lost_ids=0, requests_throttled_writer=0, refused_ids=0,
                       commit_unknown_ids=0, unrecorded_ids=0, store_wait_us=0, commit_wait_us=0, write_wait_us=0)

    @property
    def store_behind(self) -> bool:
        """Whether the calling thread's latest :meth:`join` found the event store catching up (a request
        refused before any lookup reports what the latest lookup of any request found)."""
        return getattr(self._last, "store", _STORE_CAUGHT_UP)[0]

    @property
    def store_position(self) -> tuple[dict[str, int], int] | None:
        """With :attr:`store_behind`: ``(read_to_us, read_through_us)``, how far the event store had read (see
        ``eventstore.EventStoreChain.read_to_us``), for the dispatcher to hold back clicks whose query cannot
        have been read yet; None when not behind or not reported by the store."""
        behind, read_to, through = getattr(self._last, "store", _STORE_CAUGHT_UP)
        return (read_to, through) if behind and read_to is not None else None

    def recover_orphans(self, id_field: "str | EventIds") -> int:
        """Put in order the output files a killed predecessor with this name left: each in-progress file is
        published up to what its commit record vouched for (what every reader counted while it was down);
        the whole lines beyond were joined and registered but never output, so their ids (field
        ``id_field``, or their Photon keys given a photon.EventIds) go into the lost-ids ledger first, and
        then they are cut (see
        :meth:`photon.RollingWriter.recover_orphans`). Call once, before serving; raises OSError when the
        ledger or the output folder cannot be put in order (the joiner must not start then)."""
        orphans = self._writer.recover_orphans(lambda lines: self._set_aside(lines, id_field))
        for p in orphans.published:
            log.info("joiner %s: published orphaned output %s", self.name, p)
        self._c["orphans_recovered"] += len(orphans.published)
        return len(orphans.published)

    def _set_aside(self, lines: list[bytes], id_field: "str | EventIds") -> None:
        ids = []
        key = id_field.key if isinstance(id_field, EventIds) else (lambda event: str(event[id_field]))
        for line in lines:
            try:
                ids.append(key(orjson.loads(line)))
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                log.critical("joiner %s: an uncommitted output line has no readable %r (%s): %r",
                             self.name, id_field, e, line[:200])
        if self._ledger is None:
            raise OSError(f"joiner {self.name}: {len(ids)} uncommitted output line(s) to set aside and no ledger")
        self._ledger.append(ids, ORPHAN_TOKEN, self._clock.now_us(), ORPHAN_REASON)
        with self._lock:
            self._c["lost_ids"] += len(ids)
        log.error("joiner %s: %d id(s) a killed predecessor registered and wrote but never committed to the "
                  "output; recorded in the lost-ids ledger for recovery", self.name, len(ids))

    def join(self, ids: list[str], ref_ids: list[str], raws: list[bytes]) -> bytearray:
        """One outcome number per event (see :class:`Outcome`); raises ValueError for ragged columns.
        Afterwards, on the calling thread, :attr:`store_behind` says whether the event store was catching up
        (its NOT_FOUND answers were turned into THROTTLED)."""
        self._last.store = self._store_seen
        n = len(ids)
        if len(ref_ids) != n or len(raws) != n:
            raise ValueError(f"a join request needs one ref_id and one raw line per id: got {n} ids, "
                             f"{len(ref_ids)} ref_ids, {len(raws)} raws")
        with self._lock:
            self._c["requests"] += 1
            if self._in_flight >= self._max_in_flight:  # refused before any per-event work
                self._c["requests_throttled"] += 1
                out = throttled(n)
                self._count(out)
                return out
            self._in_flight += 1
        if not self._writer_usable():      # nothing committed while nothing can be written
            with self._lock:
                self._in_flight -= 1
                self._idle.notify_all()
                self._c["requests_throttled_writer"] += 1
                out = throttled(n)
                self._count(out)
            return out
        try:
            batch = JoinBatch(ids, ref_ids, raws, self._ref_ok)
            out = self._join(batch, next(self._seq))
        finally:
            with self._lock:
                self._in_flight -= 1
                self._idle.notify_all()
        with self._lock:
            self._count(out)
            self._c["duplicates_in_request"] += batch.duplicates
            self._c["adapter_errors"] += batch.adapter_errors
            self._c["bad_ids"] += batch.bad_ids
        return out

    def _join(self, batch: JoinBatch, seq: int) -> bytearray:
        refs = batch.ref_ids_to_look_up()
        try:
            # a request with no events is a probe of how far the store has read (answered with that alone)
            began = time.monotonic_ns()
            primaries = self._store.lookup(refs) if refs or not batch.n else []
            self._waited("store_wait_us", began)
            if len(primaries) != len(refs):
                raise ValueError(f"event store answered {len(primaries)} results for {len(refs)} ids")
        except Exception as e:
            self._failed("eventstore_errors", "event store lookup", e)
            batch.gave_up()
            return batch.outcomes()
        now = self._clock.now_us()
        served = getattr(self._store, "served_by", None)     # a lookup chain says who served each primary
        if served is not None and len(served) == len(refs):
            batch.primaries_found(primaries, {s: self._adapter.bind(now, s) for s in set(served)}, served)
            with self._lock:
                self._c["served_by_cache"] += served.count("cache")
                self._c["served_by_logs"] += served.count("logs")
        else:
            batch.primaries_found(primaries, self._adapter.bind(now))
        read_through = getattr(self._store, "read_through_us", None)
        if read_through is not None and now - read_through > self._store_behind_us:
            self._last.store = self._store_seen = (True, getattr(self._store, "read_to_us", None), read_through)
            deferred = batch.defer_not_found()
            with self._lock:
                self._c["not_found_store_behind"] += deferred
        elif refs or not batch.n:
            self._last.store = self._store_seen = _STORE_CAUGHT_UP
        if batch.first_error is not None:
            log.warning("joiner %s: request %d: %d malformed id(s), %d adapter failure(s), answered UNJOINABLE; "
                        "first: %s", self.name, seq, batch.bad_ids, batch.adapter_errors, batch.first_error)
        ids = batch.ids_to_commit()
        if ids:
            token = f"{self.token_prefix}{seq}"
            with self._lock:
                self._started[seq] = (ids, token)
            try:
                try:
                    began = time.monotonic_ns()
                    results = self._commit_isolating(ids, token, seq)
                    self._waited("commit_wait_us", began)
                    lines = batch.commit_resolved(results)
                except Exception as e:
                    self._failed("registry_errors", "registry commit", e)
                    self._record_unknown(seq, f"commit outcome unknown: {type(e).__name__}: {e}")
                    batch.gave_up()
                    return batch.outcomes()
                # Committed: write before answering JOINED. A crash from here until the flush loses these
                # events from the output only (registered, not written): the verification job's case.
                if lines:
                    if _KILL_MARKER:        # tests only; 0: OK
                        _kill_after_commit(_KILL_MARKER, [i for i, r in zip(ids, results) if int(r) == 0])
                    began = time.monotonic_ns()
                    self._write_or_record(batch, lines, now, token, seq)
                    self._waited("write_wait_us", began)
            finally:
                with self._lock:
                    self._started.pop(seq, None)
        return batch.outcomes()

    def _waited(self, counter: str, began_ns: int) -> None:
        """Add the time since ``began_ns`` (``time.monotonic_ns``) to one of the wait counters: where a request's
        wall time goes (statistics only; nothing decides on them)."""
        waited = (time.monotonic_ns() - began_ns) // 1000
        with self._lock:
            self._c[counter] += waited

    def _record_unknown(self, seq: int, reason: str) -> None:
        """Put the ids of started commit ``seq`` into the lost-ids ledger as candidates (they may be
        registered and are not written), unless that commit has finished or is already recorded."""
        with self._lock:
            started = self._started.pop(seq, None)
        if started is None:
            return
        ids, token = started
        try:
            if self._ledger is None:
                raise OSError("this joiner has no lost-ids ledger")
            self._ledger.append(ids, token, self._clock.now_us(), reason)
        except OSError as e:
            log.critical("joiner %s: request %d: %d id(s) whose commit outcome is unknown (token %s) could not be "
                         "put into the lost-ids ledger (%s): %s", self.name, seq, len(ids), token, e, " ".join(ids))
            return
        with self._lock:
            self._c["commit_unknown_ids"] += len(ids)
        log.error("joiner %s: request %d: %d id(s) may be registered under token %s but are not written (%s); "
                  "recorded in the lost-ids ledger for verification", self.name, seq, len(ids), token, reason)

    def drain(self, patience_s: float, after_s: float = 1.0) -> int:
        """Finish the requests in flight (the clean shutdown; the server refuses new ones first).

        Waits up to ``patience_s`` for every request in flight to answer (their commits keep being retried
        with their tokens, their writes keep being tried). Then sets :attr:`stopping` (retry loops give up),
        waits up to ``after_s`` more, and records every commit that is still started and unfinished (e.g.
        stuck inside a registry call) in the lost-ids ledger as ``commit outcome unknown``. Returns how
        many commits were recorded that way (0: everything finished)."""
        deadline = time.monotonic() + patience_s
        with self._idle:
            while self._in_flight and (left := deadline - time.monotonic()) > 0:
                self._idle.wait(left)
        self.stopping.set()
        deadline = time.monotonic() + after_s
        with self._idle:
            while self._in_flight and (left := deadline - time.monotonic()) > 0:
                self._idle.wait(left)
            unfinished = sorted(self._started)
        for seq in unfinished:
            self._record_unknown(seq, "commit outcome unknown: the joiner stopped before the commit answered")
        return len(unfinished)

    def _write(self, batch: JoinBatch, lines: list[bytes], built_us: int) -> None:
        """Write the committed lines and return once they are durable and committed under the output contract
        (a reader counts them); each line stamped with the time the writer took it (in its file's hour)."""
        self._writer.sync(self._writer.write_lines(lines, lambda now_us, ls: batch.render(ls, built_us, now_us)))

    def _write_or_record(self, batch: JoinBatch, lines: list[bytes], built_us: int, token: str, seq: int) -> None:
        """Write the committed lines until they are committed output; if any step fails (write, fsync, roll,
        commit record: the lines are then cut, never output later), put their ids durably into the lost-ids
        ledger before answering (retrying the output and the ledger in turn while neither works)."""
        try:
            self._write(batch, lines, built_us)
            return
        except OSError as e:
            reason = f"output write failed: {e}"
        self._writer_failed(reason, sum(len(line) + 1 for line in lines))
        delay = 0.05
        while True:
            lost = batch.write_failed_ids()
            try:
                if self._ledger is None:
                    raise OSError("this joiner has no lost-ids ledger")
                self._ledger.append(lost, token, self._clock.now_us(), reason)
            except OSError as e:
                log.error("joiner %s: request %d: the lost-ids ledger failed too (%s); retrying", self.name, seq, e)
            else:
                batch.write_failed()
                with self._lock:
                    self._c["lost_ids"] += len(lost)
                log.error("joiner %s: request %d: %d registered id(s) could not be written (%s); recorded in the "
                          "lost-ids ledger under token %s for recovery", self.name, seq, len(lost), reason, token)
                return
            if self.stopping.is_set():
                log.critical("joiner %s: request %d: stopping with %d registered id(s) neither written nor in the "
                             "ledger (token %s): %s", self.name, seq, len(lost), token, " ".join(lost))
                batch.write_unrecorded()
                with self._lock:
                    self._c["unrecorded_ids"] += len(lost)
                return
            self.stopping.wait(delay)
            delay = min(1.0, delay * 2)
            try:
                self._write(batch, lines, built_us)     # the output may have room again
            except OSError:
                continue
            return

    def _writer_failed(self, reason: str, nbytes: int) -> None:
        with self._lock:
            self._c["write_failures"] += 1
            if not self._writer_error:
                log.error("joiner %s: %s; answering THROTTLED until the output folder takes writes again",
                          self.name, reason)
            self._writer_error = reason
            self._probe_bytes = max(PROBE_MIN_BYTES, nbytes)
            self._next_probe = time.monotonic() + self._writer_probe_s

    def _writer_usable(self) -> bool:
        """True unless the output writer failed (in a request, or in the roller thread: the writer's
        ``error``) and a probe (a write of about the failed size into a hidden file of the output folder,
        fsynced, at most once per ``writer_probe_s``) still fails."""
        with self._lock:
            if not self._writer_error:
                failed = self._writer.error       # a failure the roller thread met (roll, rename, commit)
                if not failed:
                    return True
                self._writer_error = failed
                self._next_probe = 0.0
                log.error("joiner %s: %s; answering THROTTLED until the output folder takes writes again",
                          self.name, failed)
            now = time.monotonic()
            if now < self._next_probe:
                return False
            self._next_probe = now + self._writer_probe_s
            size = self._probe_bytes
        probe = self._writer.dir / f".{self.name}.probe"
        try:
            self._writer.dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                view, done = memoryview(bytes(size)), 0
                while done < size:
                    done += os.write(fd, view[done:])
                os.fdatasync(fd)                  # as a commit does: the data must reach the disk
            finally:
                os.close(fd)
                probe.unlink(missing_ok=True)
        except OSError as e:
            log.debug("joiner %s: output probe failed: %s", self.name, e)
            return False
        self._writer.clear_error()
        with self._lock:
            log.warning("joiner %s: the output folder takes writes again (was: %s); joining resumes",
                        self.name, self._writer_error)
            self._writer_error = ""
        return True

    def _commit_isolating(self, ids: list[str], token: str, seq: int) -> list[int]:
        """Commit ``ids``; when the registry refuses the call as a whole (ValueError: an id timestamped
        beyond the clock-skew bound, or one it cannot parse), split it in halves until the refused ids are
        alone. Each of those answers UNJOINABLE (so the dispatcher writes it to the unjoinable output, and
        this joiner's log names the reason); every other id is decided as usual. The halves use the same
        token, so a part that did commit before the refusal (another shard) is answered OK again."""
        try:
            return list(self._commit_patiently(ids, token, seq))
        except ValueError as e:
            if len(ids) == 1:
                with self._lock:
                    self._c["refused_ids"] += 1
                log.warning("joiner %s: request %d: the registry refuses %s (%s); answered UNJOINABLE",
                            self.name, seq, ids[0], e)
                return [REFUSED]
        mid = len(ids) // 2
        return self._commit_isolating(ids[:mid], token, seq) + self._commit_isolating(ids[mid:], token, seq)

    def _commit_patiently(self, ids: list[str], token: str, seq: int):
        """Commit ``ids`` under ``token`` until the registry answers.

        A failed commit may still have gone through (the reply was lost, or the leader died after
        replicating it). Answering THROTTLED then would leave those ids registered under this token and
        never written, so the same token (idempotent) is retried for up to ``commit_patience_s``. The
        dispatcher may meanwhile resend the events to another joiner: that attempt's new token gets
        ALREADY_EXISTS if this commit went through, so either this joiner writes them or the other does,
        never both. Malformed ids (ValueError) are not retried; nor is anything once the joiner stops.
        """
        deadline = time.monotonic() + self._commit_patience_s
        attempt = 0
        while True:
            try:
                return self._registry.commit(ids, token)
            except ValueError:
                raise
            except Exception as e:
                attempt += 1
                if time.monotonic() >= deadline or self.stopping.is_set():
                    if attempt > 1 or self._commit_patience_s > 0:
                        log.critical("joiner %s: request %d: gave up committing %d id(s) under token %s after %d "
                                     "attempts; any that did commit are for the verification job",
                                     self.name, seq, len(ids), token, attempt)
                    raise
                with self._lock:
                    self._c["commit_retries"] += 1
                log.warning("joiner %s: request %d: commit failed (%s: %s); retrying with the same token",
                            self.name, seq, type(e).__name__, e)
                self.stopping.wait(min(1.0, 0.05 * 2 ** min(attempt, 5)))

    def _failed(self, counter: str, what: str, e: Exception) -> None:
        with self._lock:
            self._c[counter] += 1
        log.warning("joiner %s: %s failed, answering THROTTLED: %s: %s", self.name, what, type(e).__name__, e)

    def _count(self, out: bytearray) -> None:
        counts = self._counts
        for o in range(len(counts)):
            counts[o] += out.count(o)
        self._c["events"] += len(out)

    def statistics(self) -> JoinerStatistics:
        w = self._writer.stats
        with self._lock:
            c, counts = dict(self._c), list(self._counts)
            in_flight = self._in_flight
            writer_error = self._writer_error or self._writer.error
        return JoinerStatistics(writer_error=writer_error,
            name=self.name, address=self.address, in_flight=in_flight, max_in_flight=self._max_in_flight,
            joined=counts[Outcome.JOINED], already_registered=counts[Outcome.ALREADY_REGISTERED],
            not_found=counts[Outcome.NOT_FOUND], throttled=counts[Outcome.THROTTLED],
            unjoinable=counts[Outcome.UNJOINABLE], lines_written=w.lines_written, bytes_written=w.bytes_written,
            files_rolled=w.files_rolled, output_commits=w.commits, **c)
