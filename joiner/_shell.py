"""The joiner shell: carries out one :class:`~joiner._state.JoinBatch` per request against the event store,
the registry and the output writer, and counts what happened.

Order per request (the paper's): event store lookup -> adapter -> registry commit with this attempt's
token -> write the OK lines (flushed) -> answer. A crash between commit and write loses those events from
the output (they are registered but not written); the verification job finds them and the recovery job
re-joins them. Writing before committing could duplicate a click, so it is never done.

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

from photon import Clock, RollingWriter

from joiner._state import JoinBatch, Outcome, throttled

log = logging.getLogger("photon.joiner")

# Tests only: with PHOTON_TEST_KILL_AFTER_COMMIT=<file>, the first joiner of the run to commit a batch writes
# the batch's ids into <file> (created exclusively, so only once per file) and SIGKILLs itself before
# writing them: the loss window between commit and write, on demand.
KILL_AFTER_COMMIT_ENV = "PHOTON_TEST_KILL_AFTER_COMMIT"


def _kill_after_commit(ids: list[str]) -> None:
    marker = os.environ.get(KILL_AFTER_COMMIT_ENV)
    if not marker:
        return
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
    already_joined: int
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
                 commit_patience_s: float = 300.0, store_behind_s: float = 5.0) -> None:
        self.name = name
        self.address = address
        self.token_prefix = make_token_prefix(address, pid if pid is not None else os.getpid(), clock.now_us())
        self._store, self._registry, self._adapter = store, registry, adapter
        self._writer = writer
        self._clock = clock
        self._max_in_flight = max_in_flight
        self._commit_patience_s = commit_patience_s
        self._store_behind_us = int(store_behind_s * 1_000_000)
        self.stopping = threading.Event()
        self._seq = itertools.count(1)
        self._lock = threading.Lock()
        self._in_flight = 0
        self._counts = [0] * len(Outcome)
        self._c = dict(requests=0, requests_throttled=0, events=0, duplicates_in_request=0,
                       adapter_errors=0, bad_ids=0, eventstore_errors=0, registry_errors=0, commit_retries=0,
                       orphans_recovered=0, not_found_store_behind=0)

    def recover_orphans(self) -> int:
        """Publish the in-progress output files a killed predecessor with this name left (torn last line
        cut). Call once, before serving."""
        published = self._writer.recover_orphans()
        for p in published:
            log.info("joiner %s: published orphaned output %s", self.name, p)
        self._c["orphans_recovered"] += len(published)
        return len(published)

    def join(self, ids: list[str], ref_ids: list[str], raws: list[bytes]) -> bytearray:
        """One outcome number per event (see :class:`Outcome`); raises ValueError for ragged columns."""
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
        try:
            batch = JoinBatch(ids, ref_ids, raws)
            out = self._join(batch, next(self._seq))
        finally:
            with self._lock:
                self._in_flight -= 1
        with self._lock:
            self._count(out)
            self._c["duplicates_in_request"] += batch.duplicates
            self._c["adapter_errors"] += batch.adapter_errors
            self._c["bad_ids"] += batch.bad_ids
        return out

    def _join(self, batch: JoinBatch, seq: int) -> bytearray:
        refs = batch.ref_ids_to_look_up()
        try:
            primaries = self._store.lookup(refs) if refs else []
            if len(primaries) != len(refs):
                raise ValueError(f"event store answered {len(primaries)} results for {len(refs)} ids")
        except Exception as e:
            self._failed("eventstore_errors", "event store lookup", e)
            batch.gave_up()
            return batch.outcomes()
        now = self._clock.now_us()
        batch.primaries_found(primaries, self._adapter.bind(now))
        read_through = getattr(self._store, "read_through_us", None)
        if read_through is not None and now - read_through > self._store_behind_us:
            deferred = batch.defer_not_found()
            with self._lock:
                self._c["not_found_store_behind"] += deferred
        if batch.first_error is not None:
            log.warning("joiner %s: request %d: %d malformed id(s), %d adapter failure(s), answered UNJOINABLE; "
                        "first: %s", self.name, seq, batch.bad_ids, batch.adapter_errors, batch.first_error)
        ids = batch.ids_to_commit()
        if ids:
            token = f"{self.token_prefix}{seq}"
            try:
                results = self._commit_patiently(ids, token, seq)
                lines = batch.commit_resolved(results)
            except Exception as e:
                self._failed("registry_errors", "registry commit", e)
                batch.gave_up()
                return batch.outcomes()
            # Committed: write before answering JOINED. A crash from here until the flush loses these
            # events from the output only (registered, not written): the verification job's case.
            if lines:
                _kill_after_commit([i for i, r in zip(ids, results) if int(r) == 0])   # 0: OK
            try:
                self._writer.write_lines(lines)
            except Exception:
                log.critical("joiner %s: request %d: %d committed event(s) could not be written (token %s); "
                             "the verification job will find them", self.name, seq, len(lines), token)
                raise
        return batch.outcomes()

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
        return JoinerStatistics(
            name=self.name, address=self.address, in_flight=in_flight, max_in_flight=self._max_in_flight,
            joined=counts[Outcome.JOINED], already_joined=counts[Outcome.ALREADY_JOINED],
            not_found=counts[Outcome.NOT_FOUND], throttled=counts[Outcome.THROTTLED],
            unjoinable=counts[Outcome.UNJOINABLE], lines_written=w.lines_written, bytes_written=w.bytes_written,
            files_rolled=w.files_rolled, **c)
