"""The master replica's Raft member: a pysyncobj group whose one replicated method applies a batch of
placement facts to the :class:`~millwheel._master_state.MasterState`.

What the IdRegistry learned about pysyncobj (docs/registry.md), kept here because MillWheel stands on the
base only and may not use the registry's private modules:

* **Durable term and vote.** pysyncobj writes its term/vote record without fsync; here it is written to a
  temporary file, fsynced, renamed and its folder fsynced before the vote or message that depends on it
  is sent (:class:`_DurableMetaStorer`), and an unreadable record raises instead of reading as empty (a
  replica that forgot its vote could vote twice in one term).
* **Nothing acknowledged that is not on disk.** pysyncobj's journal is memory-mapped and never flushed.
  The master's traffic is a few batched commands per second (heartbeats, time), so the journal is
  simply synced (``msync``) after every entry is written, in the Raft thread, before the member counts
  the entry towards a majority (leader) or acknowledges it (follower) (:class:`_SyncedJournal`). The
  registry, with thousands of commands per second, groups these fsyncs off the Raft thread instead.
* **A full disk is an error up front, not a SIGBUS.** The journal's blocks are reserved with
  ``posix_fallocate`` before pysyncobj writes into its map (:class:`_ReservedFile`).
* **Fsync failure is fail-stop.** A failed write, fsync, reservation or snapshot logs why and exits with
  :data:`EXIT_STORAGE_FAILED` at once (a later fsync that succeeds proves nothing after one that failed);
  the supervisor restarts the replica, which reads its journal back.
* **Compaction without tearing.** After pysyncobj renames a new snapshot into place, the journal's
  remaining entries are written to a new file, fsynced and renamed over the old one (folder fsynced),
  never rewritten in place; a crash leaves either journal whole (:meth:`_SyncedJournal.deleteEntriesTo`).
* **Snapshots by the master's own serializer** (``serializer``/``deserializer``), fsynced before
  pysyncobj renames them; never a fork (a child forked from a process running gRPC's threads crashes).
* ``appendEntriesUseBatch=False`` (a command costs a round trip, not a tick) and a bounded command queue.

This module overrides private internals of pysyncobj :data:`PYSYNCOBJ_VERSION` (pinned in
``pyproject.toml``); it refuses to load on another version.
"""
from __future__ import annotations

import logging
import os
import pickle
import threading
from dataclasses import dataclass
from pathlib import Path

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, SyncObjConsumer, replicated
from pysyncobj.version import VERSION as _INSTALLED_PYSYNCOBJ

from photon.raft import RaftMember as _SyncObjMember
from photon.raft import CompactingJournal, JOURNAL_FILE, PipelinedTransport  # noqa: F401 (JOURNAL_FILE re-exported)
from photon.raft import (EXIT_STORAGE_FAILED,  # noqa: F401 (re-exported: tests and callers use them here)
                         PYSYNCOBJ_VERSION, PysyncobjMismatch, storage_failed,
                         DurableMetaStorer as _DurableMetaStorer, ReservedFile as _ReservedFile)  # noqa: F401

from millwheel._master_state import MasterState

log = logging.getLogger("millwheel.master.raft")

SNAPSHOT_FILE = "raft.snapshot"
SNAPSHOT_FORMAT = 1
QUEUE_FULL = FAIL_REASON.QUEUE_FULL


class _SyncedJournal(CompactingJournal):
    """pysyncobj's file journal, on disk after every change before pysyncobj goes on (see the module
    docstring), compacted by writing a new file instead of rewriting the live one."""

    def __init__(self, journal, data_dir: Path, on_failure=None, open_journal=None) -> None:
        super().__init__(journal, data_dir, on_failure, open_journal)
        self.syncs = 0

    def _sync(self, what: str) -> None:
        try:
            self._journal.flush()
        except OSError as e:
            self._on_failure(f"syncing the Raft journal after {what}", e)
            raise
        self.syncs += 1

    def add(self, *entry) -> None:
        self._journal.add(*entry)
        self._sync("appending an entry")

    def deleteEntriesFrom(self, entry_from) -> None:  # noqa: N802 (pysyncobj's name)
        self._journal.deleteEntriesFrom(entry_from)
        self._sync("cutting conflicting entries")

    def clear(self) -> None:
        self._journal.clear()
        self._sync("clearing it")


@dataclass(frozen=True)
class RaftSettings:
    """The pysyncobj knobs the master sets; defaults suit replicas on one LAN or one host."""
    commands_queue: int = 256
    append_entries_period_s: float = 0.1
    raft_min_timeout_s: float = 1.0
    raft_max_timeout_s: float = 2.0
    connection_retry_s: float = 0.5
    leader_fallback_s: float = 3.0
    log_compaction_min_entries: int = 1000
    log_compaction_min_time_s: float = 60.0
    raft_password: str | None = None

    def conf(self, data_dir: Path, serializer, deserializer) -> SyncObjConf:
        return SyncObjConf(
            serializer=serializer, deserializer=deserializer,
            autoTickPeriod=0.05, appendEntriesUseBatch=False, appendEntriesBatchSizeBytes=2 ** 22,
            commandsQueueSize=self.commands_queue, appendEntriesPeriod=self.append_entries_period_s,
            raftMinTimeout=self.raft_min_timeout_s, raftMaxTimeout=self.raft_max_timeout_s,
            connectionTimeout=max(3.5, self.raft_max_timeout_s * 1.5),
            connectionRetryTime=self.connection_retry_s, leaderFallbackTimeout=self.leader_fallback_s,
            logCompactionMinEntries=self.log_compaction_min_entries,
            logCompactionMinTime=self.log_compaction_min_time_s,
            journalFile=str(data_dir / JOURNAL_FILE), fullDumpFile=str(data_dir / SNAPSHOT_FILE),
            useFork=False, dynamicMembershipChange=False, commandsWaitLeader=False,
            password=self.raft_password)


class _PlacementConsumer(SyncObjConsumer):
    """Holds the replicated :class:`MasterState`. ``lock`` is held while a batch applies (and while a
    snapshot is written), so readers in other threads copy whole states only. ``apply`` returns, per
    fact, ``(commands, view)`` where ``view`` is what the fact's sender is told (see :func:`reply_for`)."""

    def __init__(self, state: MasterState) -> None:
        super().__init__()
        self.state = state
        self.lock = threading.Lock()

    def write_snapshot(self, path: str, raft_data) -> None:
        try:
            with self.lock, open(path, "wb") as f:
                pickle.dump((SNAPSHOT_FORMAT, self.state, raft_data), f, protocol=pickle.HIGHEST_PROTOCOL)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            storage_failed(f"writing the snapshot {path}", e)
            raise

    def read_snapshot(self, path: str):
        with open(path, "rb") as f:
            fmt, state, raft_data = pickle.load(f)
        if fmt != SNAPSHOT_FORMAT:
            raise ValueError(f"{path}: master snapshot format {fmt}, expected {SNAPSHOT_FORMAT}")
        with self.lock:
            self.state = state
        return raft_data

    @replicated
    def apply(self, facts):
        out = []
        with self.lock:
            for fact in facts:
                commands = self.state.handle(fact)
                out.append((commands, reply_for(self.state, fact)))
        return out


def reply_for(state: MasterState, fact):
    """What the sender of ``fact`` is told once it applied: a worker's own view for worker facts."""
    worker = getattr(fact, "worker", None)
    if worker is None:
        return None
    incarnation = getattr(fact, "incarnation", None)
    return state.view_of(worker, incarnation)


class RaftMember(_SyncObjMember):
    """A running Raft member. ``submit(facts, callback)`` replicates one command (a batch of facts); the
    callback runs in pysyncobj's thread as ``callback(results, error)`` with ``error`` 0 on success."""

    def __init__(self, self_addr: str, peers: list[str], data_dir: Path, state: MasterState,
                 settings: RaftSettings) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir = data_dir
        self._consumer = _PlacementConsumer(state)
        others = [p for p in peers if p != self_addr]
        conf = settings.conf(data_dir, self._consumer.write_snapshot, self._consumer.read_snapshot)
        # the pipelined transport: pysyncobj's own resends entries already on the wire, which followers
        # truncate and append again, logging each time at CRITICAL that their state may have diverged
        self._sync = SyncObj(self_addr, others, conf=conf, consumers=[self._consumer],
                             transportClass=PipelinedTransport)
        if not hasattr(self._sync, "_SyncObj__raftLog"):
            self._sync.destroy()
            raise PysyncobjMismatch(f"pysyncobj {_INSTALLED_PYSYNCOBJ}: SyncObj lacks its journal")
        self.journal = _SyncedJournal(self._sync._SyncObj__raftLog, data_dir)
        self._sync._SyncObj__raftLog = self.journal
        self._destroyed = threading.Event()

    @property
    def state(self) -> MasterState:
        return self._consumer.state

    @property
    def state_lock(self) -> threading.Lock:
        return self._consumer.lock

    def submit(self, facts: list, callback) -> None:
        self._consumer.apply(facts, callback=callback)

    def destroy(self) -> None:
        if not self._destroyed.is_set():
            self._destroyed.set()
            self._sync.destroy()
