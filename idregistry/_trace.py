"""Timing records of the commit path, for finding what a slow commit waited for
(docs/history/registry.md, "Fourteenth pass: what a slow commit at 150K ids/s waits for").

Off unless the environment names a folder in :data:`ENV`: then every replica process (and the bench's load
generators) records, on the host's monotonic clock (the same in every process), what its threads did:

* ``tick``: a Raft-thread tick whose time outside the poller's wait was at least :data:`TICK_MS` (its wall,
  the thread's CPU and its wait for a core, from ``/proc/thread-self/schedstat``);
* ``fsync``: every journal fsync (the fsync thread);
* ``apply``: a replicated command applied to the state in at least :data:`APPLY_MS`;
* ``freeze``, ``snapshot``, ``compact``, ``meta``, ``fsync_path``: a snapshot's freeze (Raft thread), its
  writing (writer thread), the journal's compaction (Raft thread), the once-a-second commit-index record, and
  each fsync of a file or folder by path in the Raft member's storage (compaction's, the term/vote record's);
* ``gc``: every collection of the cyclic collector (``gc.callbacks``), with its generation;
* ``request`` (leader): a commit request's handler, from the packed runs to the answer, named by its first id;
* ``command`` (leader): a replicated command, submitted, applied (a majority has it on disk) and answered
  (the leader's own fsync covers it), with the first id of each of its requests;
* ``ack`` (followers): an acknowledgement of appended entries, from the moment it waited for the fsync to
  its send;
* ``commit`` (load generators): a client's commit, named by its first id, with the calling thread's CPU and
  run-queue wait and the host's CPU pressure (``/proc/pressure/cpu``: time some task waited for a core)
  during it.

Nothing changes what a replica does or when it answers; the hooks wrap methods of the running objects only
when tracing. Each process appends its records to ``<folder>/<role>-<pid>.jsonl`` every half second and at
exit. ``bench/registry_tail.py`` reads them back.
"""
from __future__ import annotations

import atexit
import gc
import json
import os
import threading
import time
from pathlib import Path

ENV = "PHOTON_REGISTRY_TRACE"
TICK_MS = 2.0
APPLY_MS = 1.0

_now = time.monotonic


def folder() -> str | None:
    return os.environ.get(ENV) or None


class Recorder:
    """Records of one process, flushed to ``<folder>/<role>-<pid>.jsonl`` by a daemon thread."""

    def __init__(self, where: str, role: str) -> None:
        self.path = Path(where) / f"{role}-{os.getpid()}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.role = role
        self._rows: list = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._gc_started = 0.0
        gc.callbacks.append(self._on_gc)
        self._thread = threading.Thread(target=self._flusher, name="registry-trace", daemon=True)
        self._thread.start()
        atexit.register(self.flush)

    def add(self, kind: str, t0: float, t1: float, **extra) -> None:
        self._rows.append((kind, t0, t1, extra))      # list.append is atomic under the GIL

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_started = _now()
        else:
            self.add("gc", self._gc_started, _now(), gen=info.get("generation"),
                     collected=info.get("collected"), thread=threading.current_thread().name)

    def _flusher(self) -> None:
        while not self._stop.wait(0.5):
            self.flush()

    def close(self) -> None:
        """Stop recording (the collector's callback, the flushing thread) and write what is left."""
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        self._stop.set()
        self._thread.join(timeout=2)
        self.flush()

    def flush(self) -> None:
        with self._lock:
            rows, self._rows = self._rows, []
            if not rows:
                return
            with open(self.path, "a") as f:
                for kind, t0, t1, extra in rows:
                    f.write(json.dumps({"kind": kind, "t0": t0, "t1": t1, "role": self.role, **extra}) + "\n")


def cpu_pressure_us() -> int:
    """Microseconds so far in which some runnable task of this host waited for a CPU (``/proc/pressure/cpu``);
    0 where the kernel does not say."""
    try:
        with open("/proc/pressure/cpu", "rb") as f:
            return int(f.readline().rsplit(b"=", 1)[1])
    except (OSError, ValueError, IndexError):
        return 0


def thread_sched() -> tuple[int, int]:
    """(CPU ns, ns waited on a run queue) of the calling thread so far."""
    return _schedstat()


def _schedstat() -> tuple[int, int]:
    """(CPU ns, ns waited on a run queue) of the calling thread so far."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            cpu, wait, _ = f.read().split()
        return int(cpu), int(wait)
    except (OSError, ValueError):
        return 0, 0


class _TimedPoll:
    """Stands in for a ``select.poll`` object: its ``poll`` adds the time spent inside to ``waited``."""

    def __init__(self, inner) -> None:
        self._inner = inner
        self.waited = 0.0

    def poll(self, timeout_ms):
        t = _now()
        try:
            return self._inner.poll(timeout_ms)
        finally:
            self.waited += _now() - t

    def register(self, *a):
        return self._inner.register(*a)

    def unregister(self, *a):
        return self._inner.unregister(*a)

    def modify(self, *a):
        return self._inner.modify(*a)


def _timed(add, kind: str, fn, fields=None):
    """``fn`` wrapped to record each call as ``kind`` from its start to its end (``fields(*args)``: more of
    the record), also when it raises."""
    def timed(*args):
        t0 = _now()
        try:
            return fn(*args)
        finally:
            add(kind, t0, _now(), **(fields(*args) if fields else {}))
    return timed


def install_replica(server) -> Recorder | None:
    """Wrap the running replica's Raft member, fsync thread, batcher and state (``server``: a
    :class:`~idregistry._shell.ReplicaServer`) to record what they do. None when tracing is off."""
    where = folder()
    if where is None:
        return None
    spec = server.spec
    rec = Recorder(where, f"replica{spec.replica}")
    sync = server.raft._sync
    add = rec.add

    # the Raft thread's ticks: time outside the poller's wait
    poller = sync._poller
    timed = None
    if hasattr(poller, "_PollPoller__poll"):
        timed = _TimedPoll(poller._PollPoller__poll)
        poller._PollPoller__poll = timed
    tick = sync._onTick

    def on_tick(time_to_wait=0.0):
        waited0 = timed.waited if timed else 0.0
        c0, q0 = _schedstat()
        t0 = _now()
        try:
            return tick(time_to_wait)
        finally:
            t1 = _now()
            busy = (t1 - t0) - ((timed.waited - waited0) if timed else 0.0)
            if busy * 1000 >= TICK_MS:
                c1, q1 = _schedstat()
                add("tick", t0, t1, busy_ms=round(busy * 1000, 3), cpu_ms=round((c1 - c0) / 1e6, 3),
                    runq_ms=round((q1 - q0) / 1e6, 3), leader=sync._isLeader())
    sync._onTick = on_tick

    # the journal's fsyncs
    syncer = server._syncer
    if syncer is not None:
        syncer._flush = _timed(add, "fsync", syncer._flush)

    # applying, snapshots, compaction, the commit-index record
    consumer = server.raft._consumer
    apply_ops = consumer.state.__class__.apply

    def timed_apply(state, ops):
        t0 = _now()
        try:
            return apply_ops(state, ops)
        finally:
            t1 = _now()
            if (t1 - t0) * 1000 >= APPLY_MS:
                add("apply", t0, t1, ops=len(ops))
    consumer.state.__class__.apply = timed_apply

    write_snapshot = consumer.write_snapshot

    def timed_write(path, raft_data):
        t0 = _now()
        try:
            return write_snapshot(path, raft_data)
        finally:
            add("freeze", t0, _now())
            writer = consumer._writer
            if writer is not None:
                threading.Thread(target=_after_writer, args=(writer, add), daemon=True).start()
    consumer.write_snapshot = timed_write
    serializer = sync._SyncObj__serializer
    if getattr(serializer, "_Serializer__serializer", None) is not None:
        serializer._Serializer__serializer = timed_write

    import photon.raft as raft_module
    raft_module.fsync_path = _timed(add, "fsync_path", raft_module.fsync_path,
                                    lambda path: {"name": os.path.basename(str(path)),
                                                  "thread": threading.current_thread().name})

    journal = sync._SyncObj__raftLog
    delete_to = journal.deleteEntriesTo

    def timed_delete(entry_to):
        waiting = sync.commits_waiting() if hasattr(sync, "commits_waiting") else None
        t0 = _now()
        try:
            return delete_to(entry_to)
        finally:
            add("compact", t0, _now(), commits_waiting=waiting,
                deferred=getattr(consumer, "compactions_deferred", None))
    journal.deleteEntriesTo = timed_delete
    one_second = getattr(journal, "onOneSecondTimer", None)
    if one_second is not None:
        def timed_one_second():
            t0 = _now()
            try:
                return one_second()
            finally:
                add("meta", t0, _now())
        journal.onOneSecondTimer = timed_one_second

    # followers: each acknowledgement from its wait for the fsync to its send
    acks = sync._acks
    queued_at: dict[int, float] = {}
    send_next = sync._SyncObj__sendNextNodeIdx

    def traced_send_next(node, reset=False, nextNodeIdx=None, success=False):  # noqa: N803 (pysyncobj's name)
        before = sync._ack_seq
        t = _now()
        result = send_next(node, reset, nextNodeIdx, success)
        if sync._ack_seq != before:
            queued_at[sync._ack_seq] = t
        return result
    sync._SyncObj__sendNextNodeIdx = traced_send_next
    send_synced = sync._send_synced_acks

    def traced_send_synced():
        waiting = [a[0] for a in acks]
        send_synced()
        sent = len(waiting) - len(acks)
        if sent:
            t = _now()
            for seq in waiting[:sent]:
                t0 = queued_at.pop(seq, None)
                if t0 is not None:
                    add("ack", t0, t)
    callbacks = sync._SyncObj__onTickCallbacks
    for k, cb in enumerate(callbacks):
        if getattr(cb, "__func__", None) is type(sync)._send_synced_acks:
            callbacks[k] = traced_send_synced

    # the leader: requests and commands
    batcher = server.batcher
    submit = batcher._submit
    applying: list = [None]        # the command whose completion runs now (Raft's thread)

    def traced_submit(ops, callback):
        row = {"t_sub": _now(), "firsts": [_first_id(op) for op in ops], "ids": sum(_op_ids(op) for op in ops)}

        def done(results, error):
            row["applied"] = _now()
            applying[0] = row
            try:
                return callback(results, error)
            finally:
                applying[0] = None
        return submit(ops, done)
    batcher._submit = traced_submit
    deliver = batcher._deliver

    def traced_deliver(answer):
        row = applying[0]
        if row is None:
            return deliver(answer)

        def answered():
            answer()
            add("command", row["t_sub"], _now(), applied=row["applied"], firsts=row["firsts"], ids=row["ids"])
        return deliver(answered)
    batcher._deliver = traced_deliver

    commit_runs = server.commit_runs

    def traced_commit_runs(token, runs):
        c0, q0 = _schedstat()
        t0 = _now()
        try:
            return commit_runs(token, runs)
        finally:
            t1 = _now()
            c1, q1 = _schedstat()
            add("request", t0, t1, first=_first_of_runs(runs), cpu_ms=round((c1 - c0) / 1e6, 3),
                runq_ms=round((q1 - q0) / 1e6, 3))
    server.commit_runs = traced_commit_runs
    return rec


def _after_writer(writer, add) -> None:
    writer.done.wait()
    add("snapshot", writer.started, _now())


def _first_of_runs(runs) -> str | None:
    try:
        prefix, stamps = runs[0]
        return f"{prefix}:{int.from_bytes(bytes(stamps[:8]), 'little'):016d}"
    except Exception:       # noqa: BLE001 (a shape the trace does not name: recorded without a name)
        return None


def _first_id(op) -> str | None:
    from idregistry._state import OP_COMMIT_RUNS
    return _first_of_runs(op[2]) if op and op[0] == OP_COMMIT_RUNS else None


def _op_ids(op) -> int:
    from idregistry._batcher import op_size
    return op_size(op)


def client_recorder() -> Recorder | None:
    """A load generator's recorder (None when tracing is off)."""
    where = folder()
    return Recorder(where, "client") if where else None
