"""Server-side batching: RPC handlers enqueue operations; one registry thread drains the queue into one
replicated command and answers every request when Raft has applied it.

Up to ``max_in_flight`` commands are handed to Raft at once (pipelining): while they travel, new requests
pile up in the queue and leave together as the next command. There is no minimum batch size and no
timer: an idle registry submits a lone request at once.
"""
from __future__ import annotations

import queue
import threading
from collections import Counter
from dataclasses import dataclass, field

from idregistry._state import OP_COMMIT, OP_COMMIT_RUNS

SUCCESS = 0
QUEUE_FULL = 1   # pysyncobj's FAIL_REASON.QUEUE_FULL; also used when the batcher's own queue is full


class Rejected(Exception):
    """Raft did not apply the command. ``overloaded`` is true when its queue was full (back off)."""

    def __init__(self, reason: int, overloaded: bool) -> None:
        super().__init__(f"replicated command failed (pysyncobj reason {reason})")
        self.reason = reason
        self.overloaded = overloaded


class _Pending:
    """One request waiting for its result. ``done`` is a bare lock held from the start and released once
    (:meth:`finish`); the waiting handler acquires it. Unlike an ``Event`` (a condition variable, a lock
    per waiter and a Python-level notify), answering is one C call per request."""
    __slots__ = ("op", "size", "done", "result", "error")

    def __init__(self, op, size: int) -> None:
        self.op = op
        self.size = size
        self.done = threading.Lock()
        self.done.acquire()
        self.result = None
        self.error: Exception | None = None

    def finish(self) -> None:
        try:
            self.done.release()
        except RuntimeError:      # already finished (a close racing a late answer): once is enough
            pass


@dataclass
class BatcherStatistics:
    commands: int = 0
    ops: int = 0
    ids: int = 0
    in_flight: int = 0
    refused: int = 0
    batch_ids_histogram: Counter = field(default_factory=Counter)   # power-of-two bucket -> commands


class Batcher:
    """``run(op, size)`` blocks until ``op`` has been applied and returns its result, or raises
    :class:`Rejected` / ``TimeoutError``. ``submit(ops, callback)`` replicates one command (the Raft
    member's method); ``is_overloaded(reason)`` says whether a failure means "queue full";
    ``deliver(answer)`` runs ``answer()`` (which wakes the waiting requests) when the results may be told,
    at once by default."""

    def __init__(self, submit, is_overloaded, max_in_flight: int = 4, max_ids_per_command: int = 20000,
                 max_queued_ids: int = 200000, deliver=None, name: str = "registry-batcher") -> None:
        self._submit = submit
        self._is_overloaded = is_overloaded
        self._queue: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._slots = threading.Semaphore(max_in_flight)
        self._max_in_flight = max_in_flight
        self._max_ids = max_ids_per_command
        self._max_queued = max_queued_ids
        self._deliver = deliver or (lambda answer: answer())
        self._queued_ids = 0
        self._closed = False
        self._lock = threading.Lock()
        self.stats = BatcherStatistics()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def run(self, op, size: int, timeout: float = 10.0):
        if self._closed:
            raise Rejected(-1, overloaded=False)
        with self._lock:
            if self._queued_ids and self._queued_ids + size > self._max_queued:
                self.stats.refused += 1
                raise Rejected(QUEUE_FULL, overloaded=True)
            self._queued_ids += size
        p = _Pending(op, size)
        self._queue.put(p)
        if not p.done.acquire(timeout=timeout):
            raise TimeoutError(f"registry command not applied within {timeout} s")
        if p.error is not None:
            raise p.error
        return p.result

    def queue_depth(self) -> int:
        return self._queue.qsize()

    def queued_ids(self) -> int:
        return self._queued_ids

    def close(self) -> None:
        self._closed = True
        self._queue.put(None)
        for _ in range(self._max_in_flight):   # a loop waiting for a slot (every command in flight) wakes
            self._slots.release()
        self._thread.join(timeout=5)
        while True:   # fail whatever is left so no handler waits for its timeout
            try:
                p = self._queue.get_nowait()
            except queue.Empty:
                break
            if p is not None:
                p.error = Rejected(-1, overloaded=False)
                p.finish()

    def _loop(self) -> None:
        while True:
            self._slots.acquire()
            if self._closed:          # close() fails what is still queued
                return
            first = self._queue.get()
            if first is None:
                return
            batch, ids = [first], first.size
            while ids < self._max_ids:
                try:
                    p = self._queue.get_nowait()
                except queue.Empty:
                    break
                if p is None:
                    self._closed = True
                    break
                batch.append(p)
                ids += p.size
            self._send(batch, ids)
            if self._closed:
                return

    def _send(self, batch: list[_Pending], ids: int) -> None:
        with self._lock:
            self._queued_ids -= ids
            self.stats.commands += 1
            self.stats.ops += len(batch)
            self.stats.ids += ids
            self.stats.in_flight += 1
            self.stats.batch_ids_histogram[1 << max(0, ids - 1).bit_length()] += 1

        def done(results, error) -> None:
            with self._lock:
                self.stats.in_flight -= 1
            self._slots.release()
            if error == SUCCESS:
                def answer() -> None:
                    for p, r in zip(batch, results):
                        p.result = r
                        p.finish()
                self._deliver(answer)      # e.g. once the journal holding the command is on disk
                return
            failure = Rejected(error, overloaded=self._is_overloaded(error))
            for p in batch:
                p.error = failure
                p.finish()

        try:
            self._submit([p.op for p in batch], done)
        except Exception:   # the Raft member is gone (shutting down)
            done(None, -1)


def op_size(op) -> int:
    """How many ids an operation carries (for batch sizing)."""
    if op[0] == OP_COMMIT_RUNS:
        return sum(len(stamps) // 8 for _, stamps in op[2])
    return len(op[2]) if op[0] == OP_COMMIT else 1
