"""One shard replica's Raft member: a pysyncobj group whose only replicated method applies a batch of
registry operations to the :class:`~idregistry._state.ShardState`.

pysyncobj settings (see docs/registry.md, "pysyncobj settings (and why)"; the measurements behind them in
docs/history/registry.md):

* ``appendEntriesUseBatch=False``: the leader sends a new entry at once (a pipe wakes its poller) instead
  of waiting for the next append-entries tick, so a commit costs one round trip, not a tick.
* ``appendEntriesBatchSizeBytes`` large: one message carries every pending entry (pipelining), and
  pysyncobj never splits an entry into chunks.
* Journal (``journalFile``) and snapshots (``fullDumpFile``) in the replica's data dir. Snapshots use the
  registry's own serializer (``serializer``/``deserializer``/``serializeChecker``): the state is a few typed
  arrays, frozen between two commands in the Raft thread and written as raw bytes by a writer thread
  (:class:`_StateConsumer`), so the Raft thread does not stop for the tens of milliseconds per million ids
  that takes. pysyncobj's default forks a child to pickle the
  whole object, but a child forked from a process running gRPC's threads crashes (SIGSEGV) before it
  finishes, so compaction would never complete.
* ``commandsQueueSize`` bounded: a full queue fails the command with QUEUE_FULL, which clients see as
  RESOURCE_EXHAUSTED and back off from.
* Messages go out as stored (uncompressed) zlib frames of a protocol-4 pickle (:class:`_StoredTcpConnection`)
  instead of pysyncobj's level-3 compression of a protocol-2 pickle, and commands are pickled with
  protocol 4 (:meth:`RaftReplica.submit`); pysyncobj decodes both, so members of either kind form one group.
* The first election: a member that has heard no leader asks its peers (a pre-vote, the registry's own
  message) and stands at once when every peer it reaches grants (:mod:`idregistry._first_election`,
  :class:`_PrevoteSyncObj`), instead of waiting out the steady 1-2 s timeout; later elections are
  pysyncobj's own.

Durability beyond pysyncobj's own: the term/vote record (``raft.journal.meta``) is written to a temporary
file, fsynced, renamed and its folder fsynced before pysyncobj sends the vote or message that depends on it
(:class:`_DurableMetaStorer`, installed into ``pysyncobj.journal`` when this module is imported); a
snapshot file is fsynced before pysyncobj renames it, and compacting the journal writes a new file and
renames it into place (file and folder fsynced) instead of rewriting the live journal in place; the
journal's disk space is reserved (``posix_fallocate``) before pysyncobj writes into its memory map, so a
full disk is an ENOSPC up front, not a SIGBUS mid-entry (:class:`_ReservedFile`). Any failure there is fail-stop: the
replica logs why and exits with :data:`EXIT_STORAGE_FAILED` (the supervisor restarts it), so nothing that
is not on disk is ever acknowledged.

One replica per data dir: a replica holds an exclusive lock on ``<data_dir>/replica.lock`` (which names its
pid and what started it) for its whole life, taken before pysyncobj opens the journal, so a second replica
on the same data (a launcher's and a verify job's, or two launchers) refuses to start with
:class:`DataDirInUse` instead of two Raft members writing one journal.

This module overrides private internals of pysyncobj :data:`PYSYNCOBJ_VERSION` (pinned in
``pyproject.toml``); :func:`check_pysyncobj` refuses to start on any other version or when one of those
names is missing, instead of silently skipping the acknowledgement rule.
"""
from __future__ import annotations

import logging
import os
import pickle
import queue
import struct
import threading
import zlib
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import pysyncobj.journal
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, SyncObjConsumer, replicated
from pysyncobj.config import SERIALIZER_STATE
from pysyncobj.tcp_connection import TcpConnection
from pysyncobj.monotonic import monotonic as _monotonic
from pysyncobj.syncobj import _COMMAND_TYPE, _bchr
from pysyncobj.transport import TCPTransport
from pysyncobj.version import VERSION as _INSTALLED_PYSYNCOBJ

from photon import LockHeld, hold_lock
from photon.raft import (EXIT_STORAGE_FAILED,  # noqa: F401 (re-exported: tests and callers use them here)
                         JOURNAL_FILE, PYSYNCOBJ_VERSION, CompactingJournal, PipelinedTransport, PysyncobjMismatch,
                         RaftMember,
                         storage_failed,
                         DurableMetaStorer as _DurableMetaStorer, ReservedFile as _ReservedFile)  # noqa: F401

from idregistry._first_election import (PREVOTE, PREVOTE_REPLY, Ask, FirstElection, FirstElectionStatistics,
                                        Stand, grants_prevote)
from idregistry._state import ShardState

log = logging.getLogger("idregistry.replica")

DATA_LOCK_FILE = "replica.lock"
SNAPSHOT_FILE = "raft.snapshot"
EXIT_DATA_DIR_IN_USE = 73
"""Exit status of a replica process that found its data dir held by another live replica."""

_PRIVATE_CLASS_NAMES = {SyncObj: ("_SyncObj__sendNextNodeIdx", "_SyncObj__getCurrentLogIndex",
                                  "_SyncObj__getCurrentLogTerm", "_applyCommand", "_getFuncName",
                                  "_SyncObj__callErrCallback", "_checkCommandsToApply"),
                        TCPTransport: ("_onMessageReceived", "_onTick", "_onNewIncomingConnection", "addNode"),
                        TcpConnection: ("send", "_TcpConnection__trySendBuffer"),
                        pysyncobj.journal.MetaStorer: ("storeMeta", "getMeta", "getPath")}
_PRIVATE_INSTANCE_NAMES = ("_methodToID", "_SyncObj__raftLog", "_SyncObj__pipeNotifier", "_SyncObj__raftNextIndex",
                           "_SyncObj__raftElectionDeadline", "_SyncObj__votedForNodeId", "_SyncObj__transport",
                           "_SyncObj__raftCommitIndex", "_SyncObj__commandsQueue", "_SyncObj__applyLogEntries",
                           "_SyncObj__getCurrentLogIndex", "_SyncObj__thread")


class DataDirInUse(RuntimeError):
    """Another live process holds this replica's data dir; the message names the dir and the holder's pid."""

    def __init__(self, data_dir: Path, held: LockHeld) -> None:
        self.data_dir = Path(data_dir)
        self.pid = held.pid
        who = f"pid {held.pid}" if held.pid else "another process"
        what = held.holder.split(" ", 1)[1] if held.pid and " " in held.holder else ""
        super().__init__(f"registry data dir {data_dir} is in use by {who}" + (f" ({what})" if what else "")
                         + ": a second replica on the same data would write the same Raft journal; stop that "
                           "one first")


def lock_data_dir(data_dir: Path, what: str = "registry replica"):
    """Hold ``<data_dir>/replica.lock`` for this process (the returned file; close it to release);
    raises :class:`DataDirInUse` when another live process holds it."""
    try:
        return hold_lock(Path(data_dir) / DATA_LOCK_FILE, what)
    except LockHeld as e:
        raise DataDirInUse(data_dir, e) from None


def check_pysyncobj(version: str = _INSTALLED_PYSYNCOBJ) -> None:
    """Raise :class:`PysyncobjMismatch` unless pysyncobj is :data:`PYSYNCOBJ_VERSION` and has every private
    name the registry overrides."""
    if version != PYSYNCOBJ_VERSION:
        raise PysyncobjMismatch(f"the IdRegistry needs pysyncobj=={PYSYNCOBJ_VERSION} (it overrides its private "
                                f"internals), found {version}: install the pinned version")
    for cls, names in _PRIVATE_CLASS_NAMES.items():
        missing = [n for n in names if not hasattr(cls, n)]
        if missing:
            raise PysyncobjMismatch(f"pysyncobj {version}: {cls.__name__} lacks {missing}; the registry's "
                                    f"acknowledgement and durability rules cannot be installed")


check_pysyncobj()

# pysyncobj's failure reasons, grouped by what the caller should do about them.
QUEUE_FULL_REASONS = frozenset({FAIL_REASON.QUEUE_FULL})


@dataclass(frozen=True)
class RaftSettings:
    """The pysyncobj knobs the registry sets; defaults suit replicas on one LAN or one host."""
    commands_queue: int = 256
    append_entries_period_s: float = 0.1
    raft_min_timeout_s: float = 1.0
    raft_max_timeout_s: float = 2.0
    connection_retry_s: float = 0.1
    leader_fallback_s: float = 3.0
    log_compaction_min_entries: int = 2000
    log_compaction_min_time_s: float = 300.0
    simulated_rtt_ms: float = 0.0
    raft_password: str | None = None     # authenticates and encrypts Raft traffic (pysyncobj password)
    first_election_rank: int = 0         # order of the members' first pre-votes (idregistry._first_election)
    compress_messages: bool = False      # pysyncobj's zlib (level 3) on every Raft message; off: stored frames

    def conf(self, data_dir: Path, serializer=None, deserializer=None, serialize_checker=None) -> SyncObjConf:
        return SyncObjConf(
            serializer=serializer,
            deserializer=deserializer,
            serializeChecker=serialize_checker,
            # with a simulated round trip, delayed messages are delivered from the tick: tick often
            autoTickPeriod=0.002 if self.simulated_rtt_ms else 0.05,
            appendEntriesUseBatch=False,
            appendEntriesBatchSizeBytes=2 ** 26,
            sendBufferSize=2 ** 22,
            recvBufferSize=2 ** 22,
            commandsQueueSize=self.commands_queue,
            appendEntriesPeriod=self.append_entries_period_s,
            raftMinTimeout=self.raft_min_timeout_s,
            raftMaxTimeout=self.raft_max_timeout_s,
            connectionTimeout=max(3.5, self.raft_max_timeout_s * 1.5),
            connectionRetryTime=self.connection_retry_s,
            leaderFallbackTimeout=self.leader_fallback_s,
            logCompactionMinEntries=self.log_compaction_min_entries,
            logCompactionMinTime=self.log_compaction_min_time_s,
            journalFile=str(data_dir / JOURNAL_FILE),
            fullDumpFile=str(data_dir / SNAPSHOT_FILE),
            useFork=False,
            dynamicMembershipChange=False,
            commandsWaitLeader=False,
            password=self.raft_password,
        )


WIRE_PICKLE_PROTOCOL = 4
"""Pickle protocol of the Raft messages this replica sends (pysyncobj's own is 2, which writes every bytes
object, a command included, as a latin-1 string and a call to rebuild it; any pysyncobj reads either)."""

COMMAND_PICKLE_PROTOCOL = 4
"""Pickle protocol of the registry's replicated commands (see :meth:`RaftReplica.submit`)."""

_ZLIB_STORED_HEADER = b"\x78\x01"      # deflate, 32 KiB window, no dictionary; (0x78 * 256 + 0x01) % 31 == 0
_STORED_BLOCK_MAX = 0xFFFF
_stored_block_header = struct.Struct("<BHH").pack
_adler32_trailer = struct.Struct(">I").pack
_length_prefix = struct.Struct("i").pack     # pysyncobj's frame: native int length, then the payload


def zlib_stored(data: bytes) -> bytes:
    """``data`` as a zlib stream of stored (uncompressed) deflate blocks: exactly what ``zlib.decompress``
    reads back, so any pysyncobj member decodes it, made without deflate's per-call set-up (a fresh
    compressor allocates and clears its window and hash tables: ~45 us per call even at level 0)."""
    view = memoryview(data)
    n = len(view)
    parts = [_ZLIB_STORED_HEADER]
    pos = 0
    while True:
        size = min(_STORED_BLOCK_MAX, n - pos)
        last = pos + size >= n
        parts.append(_stored_block_header(1 if last else 0, size, size ^ 0xFFFF))
        parts.append(view[pos:pos + size])
        pos += size
        if last:
            break
    parts.append(_adler32_trailer(zlib.adler32(view)))
    return b"".join(parts)


class _StoredTcpConnection(TcpConnection):
    """pysyncobj's connection, sending each message as a stored zlib stream of a protocol-4 pickle
    (:func:`zlib_stored`) instead of compressing it at level 3. Receiving is pysyncobj's own
    (``zlib.decompress`` of either), so members of either kind talk to each other.

    The registry's commands are packed binary (int64 timestamps), which deflate shrinks by about 2.8x at
    ~235 us per message of a 700-id command, paid by the leader once per follower; stored, a message costs
    ~3 us to encode and ~4 us to decode. Over loopback or a LAN the bytes saved are worth less than that
    CPU; ``RaftSettings.compress_messages`` brings pysyncobj's compression back (a slow WAN link).
    Encryption (``password``) still applies to the frame as before."""

    def send(self, message) -> None:
        if self.sendRandKey:
            message = (self.sendRandKey, message)
        data = zlib_stored(pickle.dumps(message, WIRE_PICKLE_PROTOCOL))
        if self.encryptor:
            data = self.encryptor.encrypt_at_time(data, int(_monotonic()))
        self._TcpConnection__writeBuffer += _length_prefix(len(data)) + data
        self._TcpConnection__trySendBuffer()


class _PipelinedTransport(PipelinedTransport):
    """pysyncobj's TCP transport with the leader's pipeline kept intact (:class:`photon.raft.PipelinedTransport`),
    the registry's pre-vote messages (which pysyncobj never sees) and a follower's note that it heard the leader.

    Unless ``compress_messages``, every connection (outgoing ones made in :meth:`addNode`, incoming ones
    handed to :meth:`_onNewIncomingConnection` before anything is sent on them) sends stored, not
    compressed, messages (:class:`_StoredTcpConnection`)."""

    compress_messages = False

    def _stored(self, conn) -> None:
        if (not self.compress_messages and type(conn) is TcpConnection
                and hasattr(conn, "_TcpConnection__writeBuffer")):
            conn.__class__ = _StoredTcpConnection

    def addNode(self, node) -> None:
        super().addNode(node)
        conn = self._connections.get(node)
        if conn is not None:
            self._stored(conn)

    def _onNewIncomingConnection(self, conn) -> None:
        self._stored(conn)
        super()._onNewIncomingConnection(conn)

    def _onMessageReceived(self, node, message) -> None:
        kind = message.get("type")
        if kind == PREVOTE or kind == PREVOTE_REPLY:     # the registry's own; pysyncobj never sees them
            self._syncObj._on_prevote_message(node, message)
            return
        if kind == "append_entries":
            self._syncObj._heard_leader()
        super()._onMessageReceived(node, message)


class _DelayedTransport(_PipelinedTransport):
    """pysyncobj's TCP transport, delivering every message from another replica half a simulated round
    trip late (benchmarks of replicas spread over distant regions, on one host). Delivery happens in the
    Raft thread's tick, so nothing else about pysyncobj's threading changes."""

    one_way_s = 0.0

    def __init__(self, *args, **kwargs) -> None:
        self._delayed: deque = deque()
        super().__init__(*args, **kwargs)

    def _onMessageReceived(self, node, message) -> None:
        self._delayed.append((time.monotonic() + self.one_way_s, node, message))

    def _onTick(self) -> None:
        super()._onTick()
        now = time.monotonic()
        delayed = self._delayed
        while delayed and delayed[0][0] <= now:
            _, node, message = delayed.popleft()
            super()._onMessageReceived(node, message)


def _transport_class(rtt_ms: float, compress_messages: bool = False):
    if not rtt_ms:
        if not compress_messages:
            return _PipelinedTransport
        return type("CompressingTransport", (_PipelinedTransport,), {"compress_messages": True})
    return type("DelayedTransport", (_DelayedTransport,), {"one_way_s": rtt_ms / 2000.0,
                                                           "compress_messages": compress_messages})


SNAPSHOT_FORMAT = 1


WRITING_SUFFIX = ".writing"      # a snapshot being written (renamed to SNAPSHOT_FILE once on disk)

COMPACTION_DEFER_S = 1.0
"""How long a written snapshot may wait to be renamed into place (and the journal compacted after it) for a
moment when no commit waits on this member (:meth:`_StateConsumer.check_snapshot`)."""


SNAPSHOT_SYNC_BYTES = 2 << 20
"""A snapshot being written is synced to disk every this many bytes (:class:`_SyncedFile`), not only at its end."""


class _SyncedFile:
    """A file being written whose data is synced every :data:`SNAPSHOT_SYNC_BYTES` (``fdatasync``), a large
    write cut at those bounds: a snapshot synced only at its end left its whole state (tens of megabytes)
    dirty, and the file system flushed it within the journal's next ``fsync``, which then took 30-45 ms
    instead of 1-3 (a traced quiet run at 150K ids/s: every commit slower than 40 ms waited for a
    follower's fsync during its snapshot). Synced as it goes, a journal ``fsync`` waits at most for one
    piece. Only ``write`` is offered (all ``pickle.dump`` needs)."""

    def __init__(self, f, sync_bytes: int = SNAPSHOT_SYNC_BYTES) -> None:
        self._f = f
        self._fd = f.fileno()
        self._sync_bytes = sync_bytes
        self._unsynced = 0
        self.syncs = 0

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            piece = view[done:done + self._sync_bytes - self._unsynced]
            self._f.write(piece)
            done += len(piece)
            self._unsynced += len(piece)
            if self._unsynced >= self._sync_bytes:
                self._f.flush()
                os.fdatasync(self._fd)
                self.syncs += 1
                self._unsynced = 0
        return done


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


class _SnapshotWriter:
    """Writes one frozen state (:meth:`ShardState.freeze`) to ``<snapshot>.writing`` and fsyncs it, in its own
    thread; :meth:`_StateConsumer.check_snapshot` renames it into place from the Raft thread."""

    def __init__(self, view, raft_data, final: Path) -> None:
        self.view = view
        self.raft_data = raft_data
        self.final = final
        self.path = final.with_name(final.name + WRITING_SUFFIX)
        self.inode = _inode(final)          # a snapshot installed from the leader meanwhile changes it
        self.error: BaseException | None = None
        self.started = time.monotonic()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="registry-snapshot", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            with open(self.path, "wb") as f:
                pickle.dump((SNAPSHOT_FORMAT, self.view, self.raft_data), _SyncedFile(f),
                            protocol=pickle.HIGHEST_PROTOCOL)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            # a disk that fails here fails the journal next: stop now, say why
            storage_failed(f"writing the snapshot {self.path}", e)
            self.error = e
        except BaseException as e:     # noqa: BLE001 (reported as a failed snapshot; pysyncobj retries later)
            self.error = e
        finally:
            self.done.set()


class _StateConsumer(SyncObjConsumer):
    """Holds the replicated state; snapshots go through :meth:`write_snapshot` / :meth:`check_snapshot` /
    :meth:`read_snapshot`.

    A snapshot is written without stopping the Raft thread: pysyncobj calls :meth:`write_snapshot` between
    two commands, which freezes the state (time proportional to the runs, not the ids: later commands copy a
    run only before changing an id it already held) and hands it to a writer thread. pysyncobj asks
    :meth:`check_snapshot` (its ``serializeChecker``) every tick; once the file is written and fsynced, that
    renames it into place, in the Raft thread, and reports success, after which pysyncobj compacts the journal
    (:class:`photon.raft.CompactingJournal` fsyncs the folder first, making the rename durable). Writing the
    whole state in the Raft thread stalled every commit for tens of milliseconds per 2 million ids held.
    The compaction itself (three fsyncs, the entries since the snapshot written again) still runs in the Raft
    thread, so a written snapshot is renamed, and the journal compacted, at a tick when ``busy()`` says no
    commit waits on this member (the Raft member's :meth:`_AckAfterSyncObj.commits_waiting`), or once it has
    waited :data:`COMPACTION_DEFER_S`: the stall then falls on the requests that arrive during it, not also on
    every command in flight."""

    def __init__(self, state: ShardState, snapshot_path: Path | None = None) -> None:
        super().__init__()
        self.state = state
        self.snapshot_path = Path(snapshot_path) if snapshot_path is not None else None
        self._writer: _SnapshotWriter | None = None
        self.on_loaded = None        # on_loaded(raft_data), when a snapshot was read (see RaftReplica)
        self.busy = None             # busy() -> True while commits wait on this member (see check_snapshot)
        self.compactions_deferred = 0
        self._written_at: float | None = None
        self.snapshots = 0
        self.snapshot_ms_last = 0.0
        if self.snapshot_path is not None:     # a writer's leftover from an earlier life: never renamed, never read
            self.snapshot_path.with_name(self.snapshot_path.name + WRITING_SUFFIX).unlink(missing_ok=True)

    def write_snapshot(self, path: str, raft_data) -> None:
        """pysyncobj's serializer hook: called in the Raft thread (so the state is between commands) with a
        temporary path it renames into place as soon as this returns. Without a ``snapshot_path`` the
        snapshot is written there, now; with one, a writer thread writes it (:meth:`check_snapshot`), and
        ``path`` is left absent, so pysyncobj's rename finds nothing (it ignores that; its serializeChecker,
        :meth:`check_snapshot`, reports the outcome)."""
        if self.snapshot_path is None:
            self._write_now(path, raft_data)
            return
        Path(path).unlink(missing_ok=True)
        if self._writer is None:
            self._writer = _SnapshotWriter(self.state.freeze(), raft_data, self.snapshot_path)

    def _write_now(self, path: str, raft_data) -> None:
        try:
            with open(path, "wb") as f:
                pickle.dump((SNAPSHOT_FORMAT, self.state, raft_data), f, protocol=pickle.HIGHEST_PROTOCOL)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            storage_failed(f"writing the snapshot {path}", e)
            raise

    def check_snapshot(self) -> int:
        """pysyncobj's serializeChecker, in the Raft thread: how the snapshot being written is doing."""
        writer = self._writer
        if writer is None:
            return SERIALIZER_STATE.NOT_SERIALIZING
        if not writer.done.is_set():
            return SERIALIZER_STATE.SERIALIZING
        if writer.error is None and self.busy is not None:
            # success makes pysyncobj compact the journal in this tick (its fsyncs, 5-45 ms in the Raft
            # thread on this host), stalling every commit waiting on this member: wait for a moment when
            # none is, for at most COMPACTION_DEFER_S
            now = time.monotonic()
            if self._written_at is None:
                self._written_at = now
            if now - self._written_at < COMPACTION_DEFER_S and self.busy():
                self.compactions_deferred += 1
                return SERIALIZER_STATE.SERIALIZING
        self._written_at = None
        self._writer = None
        writer.view.release()
        if writer.error is not None:
            log.warning("registry snapshot not written (%s: %s); pysyncobj tries again later",
                        type(writer.error).__name__, writer.error)
            writer.path.unlink(missing_ok=True)
            return SERIALIZER_STATE.FAILED
        if _inode(writer.final) != writer.inode:
            # the leader installed a newer snapshot meanwhile: this one must not replace it
            writer.path.unlink(missing_ok=True)
            return SERIALIZER_STATE.FAILED
        try:
            os.replace(writer.path, writer.final)
        except OSError as e:
            storage_failed(f"renaming the snapshot {writer.path} into place", e)
            raise
        self.snapshots += 1
        self.snapshot_ms_last = round(1000 * (time.monotonic() - writer.started), 1)
        return SERIALIZER_STATE.SUCCESS

    def wait_snapshot(self, timeout: float) -> None:
        """Wait for a snapshot being written (before the data dir is let go)."""
        writer = self._writer
        if writer is not None:
            writer.thread.join(timeout)

    def read_snapshot(self, path: str):
        """pysyncobj's deserializer hook: restores the state, returns pysyncobj's own data."""
        with open(path, "rb") as f:
            fmt, state, raft_data = pickle.load(f)
        if fmt != SNAPSHOT_FORMAT:
            raise ValueError(f"{path}: registry snapshot format {fmt}, expected {SNAPSHOT_FORMAT}")
        self.state = state
        if self.on_loaded is not None:
            self.on_loaded(raft_data)
        return raft_data

    @replicated
    def apply(self, ops):
        return self.state.apply(ops)


class _NotifyingJournal(CompactingJournal):
    """pysyncobj's journal, telling ``on_append`` after every entry written to it (so the fsync thread
    starts flushing as soon as an entry is in, while it is still being replicated), and compacted without
    rewriting the live file (:class:`photon.raft.CompactingJournal`)."""

    def __init__(self, journal, on_append, data_dir: Path, on_failure=None, open_journal=None,
                 on_replace=None) -> None:
        super().__init__(journal, data_dir, on_failure, open_journal)
        self._on_append = on_append
        self._on_replace = on_replace

    def deleteEntriesTo(self, entry_to) -> None:  # noqa: N802 (pysyncobj's name)
        """Compaction renames a new file over the journal: ``on_replace`` is told before the next entry is
        written (into the new file), so the fsync thread opens the path again."""
        super().deleteEntriesTo(entry_to)
        if self._on_replace is not None:
            self._on_replace()

    def add(self, *entry) -> None:
        self._journal.add(*entry)
        if self._on_append is not None:
            self._on_append()


class _PrevoteSyncObj(SyncObj):
    """pysyncobj's SyncObj whose first election is hastened by a pre-vote (:mod:`idregistry._first_election`)
    while it has heard no leader. Everything runs in the Raft thread: the tick callback asks and stands,
    the transport hands over pre-vote messages."""

    def __init__(self, *args, first_election_rank: int = 0, **kwargs) -> None:
        self._first_election: FirstElection | None = None
        super().__init__(*args, **kwargs)
        missing = [n for n in _PRIVATE_INSTANCE_NAMES if not hasattr(self, n)]
        if missing:
            self.destroy()
            raise PysyncobjMismatch(f"pysyncobj {_INSTALLED_PYSYNCOBJ}: SyncObj lacks {missing}")
        self._first_election = FirstElection(time.monotonic(), first_election_rank, len(self.otherNodes) + 1)
        self.addOnTickCallback(self._first_election_tick)

    def first_election_statistics(self) -> FirstElectionStatistics | None:
        return self._first_election.statistics() if self._first_election is not None else None

    def _heard_leader(self) -> None:
        if self._first_election is not None:
            self._first_election.heard_leader()

    def _can_stand(self) -> bool:
        voted = self._SyncObj__votedForNodeId
        return self._getLeader() is None and (voted is None or voted == self.selfNode.id)

    def _first_election_tick(self) -> None:
        fe = self._first_election
        if fe is None or fe.done:
            return
        if self._getLeader() is not None:
            fe.heard_leader()
            return
        connected = [n for n in self.otherNodes if self.isNodeConnected(n)]
        step = fe.tick(time.monotonic(), self._can_stand(), connected)
        if isinstance(step, Ask):
            last = (self._SyncObj__getCurrentLogTerm(), self._SyncObj__getCurrentLogIndex())
            for node in step.peers:
                self._SyncObj__transport.send(node, {"type": PREVOTE, "round": step.round, "last": last})
        elif isinstance(step, Stand):
            log.info("Raft member %s: no leader known to any peer it reaches; standing for election now",
                     self.selfNode.address)
            self._SyncObj__raftElectionDeadline = 0.0      # pysyncobj stands at its next tick
            self._SyncObj__pipeNotifier.notify()

    def _on_prevote_message(self, node, message) -> None:
        if message["type"] == PREVOTE:
            granted = grants_prevote(
                leader_known=self._getLeader() is not None, voted_for=self._SyncObj__votedForNodeId,
                asker=node.id, asker_last=tuple(message["last"]),
                own_last=(self._SyncObj__getCurrentLogTerm(), self._SyncObj__getCurrentLogIndex()))
            self._SyncObj__transport.send(node, {"type": PREVOTE_REPLY, "round": message["round"],
                                                 "granted": granted})
        elif self._first_election is not None:
            self._first_election.reply(node, message["round"], bool(message["granted"]))


class _AckAfterSyncObj(_PrevoteSyncObj):
    """pysyncobj's SyncObj whose followers acknowledge appended entries only once they are on disk.

    pysyncobj's follower answers an ``append_entries`` as soon as the entries are in its journal's page
    cache. With ``ack_after_sync`` (the registry's fsync thread: ``fn`` runs once every entry written
    before the call is on disk), every acknowledgement waits in order for that; acknowledgements that need
    none (refusals) still wait behind earlier ones, so none overtakes another. The fsync thread wakes the
    Raft thread through pysyncobj's own pipe, and the waiting acknowledgements are sent from the tick.
    So an entry counts towards a majority only once it is on that member's disk."""

    def __init__(self, *args, ack_after_sync=None, on_append=None, on_replace=None,
                 data_dir: Path | None = None, **kwargs) -> None:
        self._ack_after_sync = ack_after_sync
        self._acks: deque = deque()      # (seq, node, reset, next_idx, success), in order; success needs a sync
        self._ack_seq = 0
        self._synced_seq = 0
        self._queued_unwoken = False
        super().__init__(*args, **kwargs)
        self.addOnTickCallback(self._wake_for_queued)
        if data_dir is not None:
            self._SyncObj__raftLog = _NotifyingJournal(self._SyncObj__raftLog, on_append, data_dir,
                                                      on_replace=on_replace)
        if ack_after_sync is not None:
            self.addOnTickCallback(self._send_synced_acks)

    def _applyCommand(self, command, callback, commandType=None):
        """pysyncobj's, but a command queued from the Raft thread itself (a completion submitting what
        queued behind it, see :class:`~idregistry._batcher.Batcher`) does not write to the wake-up pipe:
        this tick's ``_checkCommandsToApply`` (after the applies) or the next tick's (after a message)
        takes it anyway, and the write would only release the GIL in the Raft thread and wake its poll once
        more. A command still queued when the tick's callbacks run (:meth:`_wake_for_queued`) writes it
        then, so it never waits for the poll's timeout."""
        if threading.current_thread() is not self._SyncObj__thread:
            return SyncObj._applyCommand(self, command, callback, commandType)
        try:
            self._SyncObj__commandsQueue.put_nowait(
                (command if commandType is None else _bchr(commandType) + command, callback))
        except queue.Full:
            self._SyncObj__callErrCallback(FAIL_REASON.QUEUE_FULL, callback)
            return
        self._queued_unwoken = True

    def _wake_for_queued(self) -> None:
        """A tick callback (after ``_checkCommandsToApply``): wake the next poll if a command queued from
        this thread without a wake-up is still waiting."""
        if self._queued_unwoken:
            self._queued_unwoken = False
            if self._SyncObj__commandsQueue._FastQueue__queue:
                self._SyncObj__pipeNotifier.notify()

    def _SyncObj__sendNextNodeIdx(self, node, reset=False, nextNodeIdx=None, success=False):
        if self._ack_after_sync is None or (not success and not self._acks):
            return SyncObj._SyncObj__sendNextNodeIdx(self, node, reset, nextNodeIdx, success)
        if nextNodeIdx is None:    # what the log holds now, as pysyncobj would have sent it now
            nextNodeIdx = self._SyncObj__getCurrentLogIndex() + 1
        self._ack_seq += 1
        seq = self._ack_seq
        self._acks.append((seq, node, reset, nextNodeIdx, success))
        if success:
            self._ack_after_sync(lambda: self._synced(seq))

    def _SyncObj__applyLogEntries(self):
        """pysyncobj's, but a leader does not send an ``append_entries`` only to tell the followers its new
        commit index when a later one tells them anyway: when entries past the commit index are still
        waiting for a majority (their commit sends one) or commands wait to be appended this tick (each
        is sent at once, carrying the commit index). pysyncobj sends one to every follower after every
        apply, so each command cost two messages per follower and two acknowledgements. The last commit of
        a burst is still told at once, heartbeats are unchanged, and the leader's answers never waited for
        it; a follower applies (and answers lookups for) an entry up to one command later under load."""
        need = SyncObj._SyncObj__applyLogEntries(self)
        if need and (self._SyncObj__getCurrentLogIndex() > self._SyncObj__raftCommitIndex
                     or self._SyncObj__commandsQueue._FastQueue__queue):
            return False
        return need

    def commits_waiting(self) -> bool:
        """In the Raft thread: whether a commit waits on this member now: as leader, commands queued or
        entries not yet committed; as follower, acknowledgements waiting for the fsync."""
        if self._isLeader():
            return bool(self._SyncObj__commandsQueue._FastQueue__queue
                        or self._SyncObj__getCurrentLogIndex() > self._SyncObj__raftCommitIndex)
        return bool(self._acks)

    def _synced(self, seq: int) -> None:
        """In the fsync thread: every acknowledgement up to ``seq`` is on disk; wake the Raft thread."""
        if seq > self._synced_seq:
            self._synced_seq = seq
        self._SyncObj__pipeNotifier.notify()

    def _send_synced_acks(self) -> None:
        acks, synced = self._acks, self._synced_seq
        while acks and (acks[0][0] <= synced or not acks[0][4]):
            _, node, reset, next_idx, success = acks.popleft()
            SyncObj._SyncObj__sendNextNodeIdx(self, node, reset, next_idx, success)


class RaftReplica(RaftMember):
    """A running Raft member of one shard. ``submit(ops, callback)`` replicates one command; the callback
    runs in pysyncobj's thread as ``callback(results, error)`` with ``error`` 0 on success."""

    def __init__(self, self_addr: str, peers: list[str], data_dir: Path, state: ShardState,
                 settings: RaftSettings | None = None, ack_after_sync=None, on_append=None, on_replace=None,
                 holder: str = "registry replica") -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir = data_dir
        self._data_lock = lock_data_dir(data_dir, holder)      # before pysyncobj opens the journal
        self.self_addr = self_addr
        self._consumer = _StateConsumer(state, data_dir / SNAPSHOT_FILE)
        self.settings = settings or RaftSettings()
        others = [p for p in peers if p != self_addr]
        conf = self.settings.conf(data_dir, self._consumer.write_snapshot, self._consumer.read_snapshot,
                                  self._consumer.check_snapshot)
        # the once-a-second commit-index record is written beside the Raft thread (destroy() waits for it)
        self._meta_path = str(data_dir / JOURNAL_FILE) + ".meta"
        _DurableMetaStorer.background_paths.add(self._meta_path)
        try:
            self._sync = _AckAfterSyncObj(self_addr, others, conf=conf, consumers=[self._consumer],
                                          transportClass=_transport_class(self.settings.simulated_rtt_ms,
                                                                                 self.settings.compress_messages),
                                          ack_after_sync=ack_after_sync, on_append=on_append, on_replace=on_replace,
                                          data_dir=data_dir,
                                          first_election_rank=self.settings.first_election_rank)
        except BaseException:
            _DurableMetaStorer.background_paths.discard(self._meta_path)
            self._data_lock.close()
            raise
        self._consumer.on_loaded = self._align_journal
        self._consumer.busy = self._sync.commits_waiting
        self._destroyed = threading.Event()

    def _align_journal(self, raft_data) -> None:
        """When a snapshot is read (in the Raft thread, before pysyncobj compares it with the journal): if
        the journal still starts before the snapshot's last two entries and holds them further in, a crash
        came between the snapshot's rename and the journal's compaction; drop what the snapshot covers, as
        that compaction would have. pysyncobj would otherwise clear the whole journal down to those two
        entries, losing every later entry, which this replica may have acknowledged (so counted towards a
        majority)."""
        journal = self._sync._SyncObj__raftLog
        last, prev = raft_data[0], raft_data[1]
        n = len(journal)
        if not isinstance(journal, CompactingJournal) or n < 2 or journal[0] == prev:
            return
        k = prev[1] - journal[0][1]
        if 0 < k < n - 1 and journal[k] == prev and journal[k + 1] == last:
            log.warning("registry replica %s: the Raft journal starts at entry %d, before the snapshot's "
                        "(%d): compacting it now (a stop between the snapshot and the compaction)",
                        self.self_addr, journal[0][1], prev[1])
            journal.deleteEntriesTo(k)

    @property
    def state(self) -> ShardState:
        return self._consumer.state

    def submit(self, ops, callback) -> None:
        """What ``self._consumer.apply(ops, callback=callback)`` would queue, pickled with protocol
        :data:`COMMAND_PICKLE_PROTOCOL` instead of pysyncobj's 2 (which writes the packed timestamps as a
        latin-1 string rebuilt by a call on every replica). pysyncobj reads either back, journals
        included."""
        sync, consumer_id = self._sync, id(self._consumer)
        func_id = sync._methodToID[(consumer_id, sync._getFuncName((consumer_id, "apply")))]
        sync._applyCommand(pickle.dumps((func_id, (ops,)), COMMAND_PICKLE_PROTOCOL), callback,
                           _COMMAND_TYPE.REGULAR)

    def first_election_statistics(self) -> FirstElectionStatistics | None:
        """How this member's first election went (pre-vote rounds, refusals, early standings)."""
        return self._sync.first_election_statistics()

    def journal_path(self) -> str:
        return str(self.data_dir / JOURNAL_FILE)

    def add_tick_callback(self, callback) -> None:
        self._sync.addOnTickCallback(callback)

    def destroy(self) -> None:
        """Leave the group and release the data dir (only once pysyncobj has stopped writing to it)."""
        if not self._destroyed.is_set():
            self._destroyed.set()
            self._sync.destroy()
            thread = getattr(self._sync, "_SyncObj__thread", None)
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=5)
            self._consumer.wait_snapshot(timeout=30)     # no write into the data dir once it is let go
            _DurableMetaStorer.settle()
            _DurableMetaStorer.background_paths.discard(self._meta_path)
            self._data_lock.close()


