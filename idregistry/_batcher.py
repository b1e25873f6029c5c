"""Server-side batching: RPC handlers enqueue operations; whatever is queued leaves as one replicated
command, and every request is answered when Raft has applied it.

Up to ``max_in_flight`` commands are handed to Raft at once (pipelining): while they travel, new requests
pile up in the queue and leave together as the next command. There is no minimum batch size and no
timer: an idle registry submits a lone request at once.

No thread of its own: a request that finds a free slot submits the queue itself (in its handler's
thread), and a command's completion (in Raft's thread) submits what queued behind it before it answers
its own requests, so the next command is in Raft's queue within the same tick, without waking another
thread to send it (see docs/registry.md, "Server-side batching"; measured in docs/history/registry.md,
"Fewer hand-offs on the leader").
"""
from __future__ import annotations

import threading
from collections import Counter, deque
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
    member's method; it may call ``callback`` before returning, e.g. a full queue); ``is_overloaded(reason)``
    says whether a failure means "queue full"; ``deliver(answer)`` runs ``answer()`` (which wakes the
    waiting requests) when the results may be told, at once by default."""

    def __init__(self, submit, is_overloaded, max_in_flight: int = 4, max_ids_per_command: int = 20000,
                 max_queued_ids: int = 200000, deliver=None, name: str = "registry-batcher") -> None:
        self._submit = submit
        self._is_overloaded = is_overloaded
        self._queue: deque[_Pending] = deque()      # guarded by _lock
        self._max_in_flight = max_in_flight
        self._max_ids = max_ids_per_command
        self._max_queued = max_queued_ids
        self._deliver = deliver or (lambda answer: answer())
        self._queued_ids = 0
        self._closed = False
        self._lock = threading.Lock()
        self.name = name
        self.stats = BatcherStatistics()

    def run(self, op, size: int, timeout: float = 10.0):
        p = _Pending(op, size)
        with self._lock:
            if self._closed:
                raise Rejected(-1, overloaded=False)
            if self._queued_ids and self._queued_ids + size > self._max_queued:
                self.stats.refused += 1
                raise Rejected(QUEUE_FULL, overloaded=True)
            self._queued_ids += size
            self._queue.append(p)
        self._pump()
        if not p.done.acquire(timeout=timeout):
            raise TimeoutError(f"registry command not applied within {timeout} s")
        if p.error is not None:
            raise p.error
        return p.result

    def queue_depth(self) -> int:
        return len(self._queue)

    def queued_ids(self) -> int:
        return self._queued_ids

    def close(self) -> None:
        """Submit nothing more and fail whatever is still queued (commands in flight still answer)."""
        with self._lock:
            self._closed = True
            left = list(self._queue)
            self._queue.clear()
            self._queued_ids = 0
        for p in left:
            p.error = Rejected(-1, overloaded=False)
            p.finish()

    def _take(self) -> tuple[list[_Pending], int] | None:
        """Under ``_lock``: the next command's requests (a slot taken for it), or None."""
        queue_ = self._queue
        if self._closed or not queue_ or self.stats.in_flight >= self._max_in_flight:
            return None
        first = queue_.popleft()
        batch, ids = [first], first.size
        while queue_ and ids < self._max_ids:
            p = queue_.popleft()
            batch.append(p)
            ids += p.size
        self._queued_ids -= ids
        stats = self.stats
        stats.commands += 1
        stats.ops += len(batch)
        stats.ids += ids
        stats.in_flight += 1
        stats.batch_ids_histogram[1 << max(0, ids - 1).bit_length()] += 1
        return batch, ids

    def _pump(self) -> None:
        """Submit queued requests while a slot is free (outside the lock: ``submit`` may call back)."""
        while True:
            with self._lock:
                taken = self._take()
            if taken is None:
                return
            self._send(taken[0])

    def _send(self, batch: list[_Pending]) -> None:
        def done(results, error) -> None:
            with self._lock:
                self.stats.in_flight -= 1
            try:
                self._pump()          # what queued behind this command leaves now, from this thread
            finally:
                if error == SUCCESS:
                    def answer() -> None:
                        for p, r in zip(batch, results):
                            p.result = r
                            p.finish()
                    self._deliver(answer)      # e.g. once the journal holding the command is on disk
                else:
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
