"""The state store behind one interface: SQLite (embedded, on disk, one process), PostgreSQL (shared by
every worker, in :mod:`millwheel._pgstore`) and an in-memory twin.

Everything the runtime persists goes through :meth:`Store.commit`: a list of :class:`Write`, one per key
checkpoint (state, timer changes, processed record ids, new productions, productions now acked). Each
write carries the writer's *sequencer* for the key's interval; a write whose sequencer is not the
interval's current one is rejected (:class:`StaleSequencer`) and nothing of the batch is written, so a
zombie worker that lost its interval can never change state, timers or productions (paper §6.2).
Claiming an interval (:meth:`Store.claim`) bumps its sequencer and so fences every older writer.

SQLite commits a whole batch of key checkpoints in one transaction (each key's write is atomic; batching
across keys amortizes the commit). WAL journal with ``synchronous=NORMAL`` by default: durable across a
process crash, not a power loss; ``?synchronous=FULL`` in the URL for that.
"""
from __future__ import annotations

import sqlite3
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping
from urllib.parse import parse_qs


def keep_newest(table: dict, reports, claimed: Callable[[str, int], int] | None = None) -> dict:
    """Put each report ``(name, interval, sequencer, ...)`` into ``table`` (``(name, interval)`` -> row) unless
    the row held for its interval carries a newer sequencer, or (with ``claimed``: the interval's claimed
    sequencer) the interval has been claimed under a newer one; returns ``table``. Reports of a worker that
    lost its interval (an older sequencer) change nothing."""
    for r in reports:
        key = (r[0], r[1])
        old = table.get(key)
        if (old is None or old[2] <= r[2]) and (claimed is None or claimed(r[0], r[1]) <= r[2]):
            table[key] = tuple(r)
    return table


class StaleSequencer(RuntimeError):
    """A write carried an old sequencer: another writer has claimed the interval since."""


class StoreAbandoned(RuntimeError):
    """A store call given up because its process is stopping (see :meth:`Store.give_up_when`): the store
    did not answer, and it was not tried again. Whatever it would have written was not acked to anyone:
    the interval's next owner redoes it."""


class _Keep:
    def __repr__(self) -> str:
        return "KEEP"


KEEP = _Keep()
"""``Write.state`` value meaning: leave the key's state as it is."""


@dataclass(slots=True)
class StoredProduction:
    """A production as stored and sent (made per record, never changed after: not frozen, whose __init__
    costs about 5x a plain slotted one)."""
    id: str
    stream: str
    key: str
    value: bytes
    timestamp_us: int
    produced_at_us: int


@dataclass(frozen=True, slots=True)
class SetAsideRecord:
    """A record on which user code kept failing, set aside instead of stopping the runtime: its
    computation, key, id, the last error's text and how many attempts were made, and the record itself
    (value as JSON, timestamp, sender, production time) so that it can be looked at and injected again."""
    computation: str
    id: str
    key: str
    error: str
    attempts: int
    value: bytes
    timestamp_us: int
    sender: str
    produced_at_us: int


@dataclass(slots=True)
class Write:
    """One atomic checkpoint of one key (``key=None``: no per-key part, e.g. acked productions only)."""
    computation: str
    interval: int
    sequencer: int
    key: str | None = None
    state: bytes | None | _Keep = KEEP
    timers_set: list[tuple[str, int, str]] = field(default_factory=list)
    timers_deleted: list[str] = field(default_factory=list)
    processed: list[tuple[str, str, int]] = field(default_factory=list)
    productions: list[StoredProduction] = field(default_factory=list)
    productions_done: list[str] = field(default_factory=list)
    set_aside: list[SetAsideRecord] = field(default_factory=list)
    """Records of this key set aside (their ids are in ``processed`` too, so repeats are dropped)."""


class Store:
    """The interface. Thread-safe. See the module docstring for the contract."""

    identity: str | None = None
    """A name made once for this store's data (kept in it): sequencers are comparable only within one
    store, so a fence kept outside the store (:class:`millwheel.FileSink`'s) records it beside the
    sequencer and starts again when the store is another one (replaced, or a new one on the same output).
    ``None``: a store that keeps none."""

    def claim(self, computation: str, interval: int, sequencer: int | None = None) -> int:
        """Make the caller the interval's single writer; returns its sequencer. Without ``sequencer`` the
        stored one is bumped (one process owns everything). With one (given by a master, whose sequencers
        only grow) it is stored as the interval's, unless the stored one is larger: then a newer owner
        holds the interval and :class:`StaleSequencer` is raised. Claiming the same sequencer again is
        allowed (a retried grant)."""
        raise NotImplementedError

    def commit(self, writes: list[Write]) -> None:
        raise NotImplementedError

    def read_states(self, computation: str, keys: Iterable[str]) -> dict[str, bytes]:
        """State of each key that has one."""
        raise NotImplementedError

    def read_timers(self, computation: str, intervals: Iterable[int]) -> list[tuple[str, str, int, str]]:
        """``(key, tag, timestamp_us, domain)`` of every timer of keys in the intervals."""
        raise NotImplementedError

    def seen(self, computation: str, ids: Iterable[str]) -> set[str]:
        """The ids among ``ids`` whose records this computation has committed (dedup truth)."""
        raise NotImplementedError

    def dedup_ids(self, computation: str, intervals: Iterable[int]) -> list[str]:
        raise NotImplementedError

    def gc_dedup(self, computation: str, sender: str, floor_us: int,
                 intervals: Mapping[int, int] | None = None) -> int:
        """Forget ids from ``sender`` produced before ``floor_us`` (no sender can retry them any more);
        the floor only rises. With ``intervals`` (interval -> the caller's sequencer), only ids of those
        intervals whose sequencer is still the caller's are deleted, and only below ``floor_us`` (the
        floor the caller's cores apply, which may be below the stored one), in the same transaction that
        raises the floor (a worker process collects the intervals it holds; an owner claiming one
        afterwards reads the raised floor). Returns how many were deleted."""
        raise NotImplementedError

    def report_production_floors(self, reports: Iterable[tuple[str, int, int, int]]) -> None:
        """Record ``(sender, interval, sequencer, oldest_us)``: no production of the sender's interval that
        a consumer may still receive as new was produced before ``oldest_us``. Each replaces the interval's
        stored report unless that one has a larger sequencer (as :meth:`report_watermarks`)."""
        raise NotImplementedError

    def read_production_floors(self) -> list[tuple[str, int, int, int]]:
        """Every interval's last :meth:`report_production_floors` report."""
        raise NotImplementedError

    def gc_floors(self, computation: str) -> dict[str, int]:
        raise NotImplementedError

    def pending_productions(self, sender: str, interval: int) -> list[StoredProduction]:
        raise NotImplementedError

    def set_aside_records(self, computation: str | None = None) -> list[SetAsideRecord]:
        """The records set aside (of ``computation``, or of all), in (computation, id) order."""
        raise NotImplementedError

    def read_watermarks(self) -> dict[str, int]:
        raise NotImplementedError

    def save_watermarks(self, watermarks: dict[str, int]) -> None:
        """Persist published watermarks; a stored value never decreases."""
        raise NotImplementedError

    def report_watermarks(self, reports: Iterable[tuple]) -> None:
        """Record interval low watermark reports ``(name, interval, sequencer, low_us, input_us, oldest_us)``
        (the last two may be ``None``): each replaces the interval's stored report unless that one has a
        larger sequencer, or the interval has been claimed (:meth:`claim`) under a larger one since, in the
        same statement: a report of a fenced owner changes nothing, also before the new owner has reported
        (the interval keeps its last value until then). Worker processes share their reports through the
        store, and each computes the authority's publication from all of them."""
        raise NotImplementedError

    def read_watermark_reports(self) -> list[tuple]:
        """Every interval's last report, as given to :meth:`report_watermarks`."""
        raise NotImplementedError

    def report_and_read_watermarks(self, reports: Iterable[tuple]) -> list[tuple]:
        """:meth:`report_watermarks`, then :meth:`read_watermark_reports` (a store may do both in one
        statement)."""
        self.report_watermarks(reports)
        return self.read_watermark_reports()

    def record_grants(self, grants: Iterable[tuple[str, int, int]]) -> None:
        """Record ``(name, interval, sequencer)``: the master has granted the interval under ``sequencer``
        (a process read it in the master's map). The stored grant only rises. From then on the interval's
        watermark and cut reports under an older sequencer are refused, as after a claim (:meth:`claim`),
        also before the new owner has claimed: the old owner of an interval moved, split or merged reports
        under its old sequencer until its next heartbeat, and a report statement of a process stopped after
        its lease check lands when it resumes. Commits are not fenced by grants, only by claims."""
        raise NotImplementedError

    def report_cuts(self, reports: Iterable[tuple]) -> None:
        """Record the cut reports of intervals of computations on a cycle ``(name, interval, sequencer,
        epoch, cut_us)`` (``cut_us`` may be ``None``), each replacing the interval's stored one unless that
        has a larger sequencer or the interval has been claimed under one (as :meth:`report_watermarks`)."""
        raise NotImplementedError

    def read_cuts(self) -> list[tuple]:
        """Every interval's last :meth:`report_cuts` report."""
        raise NotImplementedError

    def advance_epoch(self, component: str, epoch: int, external_us: int, cohort: str) -> None:
        """Announce cut epoch ``epoch`` of cyclic component ``component`` with what it was decided from
        (``external_us``, ``cohort``), only if the stored epoch is ``epoch - 1`` or there is none: of
        several processes deciding the same step, one wins, atomically."""
        raise NotImplementedError

    def read_epochs(self) -> list[tuple[str, int, int, str]]:
        """Every component's announced epoch: ``(component, epoch, external_us, cohort)``."""
        raise NotImplementedError

    interruptible = False
    """Its calls can hang (a server that stops answering) and :meth:`interrupt` cuts them off."""

    def give_up_when(self, event: threading.Event) -> None:
        """Once ``event`` is set (the process is stopping), a call that fails on a lost connection is not
        tried again, and a wait between attempts ends at once: it raises :class:`StoreAbandoned`. Stores
        that never retry ignore this."""

    def interrupt(self) -> None:
        """Cut off the calls in progress (a server that stopped answering leaves them hanging) and refuse
        new ones, each with :class:`StoreAbandoned`; for a process that must stop now. Stores whose calls
        cannot hang ignore this."""

    def close(self) -> None:
        pass


def _open_memory(url: str) -> Store:
    return MemoryStore()


def _open_sqlite(url: str) -> Store:
    path, _, query = url[len("sqlite:///"):].partition("?")
    sync = parse_qs(query).get("synchronous", ["NORMAL"])[0].upper()
    if not path:
        raise ValueError(f"store url {url!r} names no file")
    return SQLiteStore(path, synchronous=sync)


def _open_postgres(url: str) -> Store:
    from millwheel._pgstore import PostgresStore  # psycopg is needed only by those who use it
    return PostgresStore.from_url(url)


SCHEMES = {"memory://": _open_memory, "sqlite:///": _open_sqlite, "postgresql://": _open_postgres,
           "postgres://": _open_postgres}
"""The one map from a store URL's scheme to the store kind that opens it."""


def open_store(url: str) -> Store:
    """``memory://``; ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db`` (append
    ``?synchronous=FULL`` to survive power loss); ``postgresql://user@host:port/db`` (``?schema=NAME``,
    ``?retry_s=SECONDS``, any libpq parameter; see :mod:`millwheel._pgstore`)."""
    for prefix, opener in SCHEMES.items():
        if url.startswith(prefix):
            return opener(url)
    raise ValueError(f"store url {url!r}: scheme must be one of {', '.join(SCHEMES)}")


class MemoryStore(Store):
    """The in-process twin: same contract, nothing survives the process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seq: dict[tuple[str, int], int] = {}
        self._state: dict[tuple[str, str], bytes] = {}
        self._timers: dict[tuple[str, str], dict[str, tuple[int, str, int]]] = {}
        self._dedup: dict[str, dict[str, tuple[str, int, int]]] = {}
        self._floors: dict[tuple[str, str], int] = {}
        self._prods: dict[tuple[str, int], dict[str, StoredProduction]] = {}
        self.identity = uuid.uuid4().hex
        self._wms: dict[str, int] = {}
        self._reports: dict[tuple[str, int], tuple] = {}
        self._granted: dict[tuple[str, int], int] = {}
        self._cuts: dict[tuple[str, int], tuple] = {}
        self._epochs: dict[str, tuple] = {}
        self._aside: dict[tuple[str, str], SetAsideRecord] = {}
        self._prod_floors: dict[tuple[str, int], tuple] = {}

    def claim(self, computation: str, interval: int, sequencer: int | None = None) -> int:
        with self._lock:
            seq = _claimed(computation, interval, self._seq.get((computation, interval), 0), sequencer)
            self._seq[(computation, interval)] = seq
            return seq

    def commit(self, writes: list[Write]) -> None:
        with self._lock:
            _check_sequencers(writes, lambda c, i: self._seq.get((c, i), 0))
            for w in writes:
                self._apply(w)

    def _apply(self, w: Write) -> None:
        if w.key is not None:
            sk = (w.computation, w.key)
            if w.state is None:
                self._state.pop(sk, None)
            elif not isinstance(w.state, _Keep):
                self._state[sk] = bytes(w.state)
            timers = self._timers.setdefault(sk, {})
            for tag in w.timers_deleted:
                timers.pop(tag, None)
            for tag, ts, domain in w.timers_set:
                timers[tag] = (ts, domain, w.interval)
            dedup = self._dedup.setdefault(w.computation, {})
            for rid, sender, produced_at in w.processed:
                dedup[rid] = (sender, produced_at, w.interval)
        prods = self._prods.setdefault((w.computation, w.interval), {})
        for p in w.productions:
            prods[p.id] = p
        for pid in w.productions_done:
            prods.pop(pid, None)
        for r in w.set_aside:
            self._aside[(r.computation, r.id)] = r

    def read_states(self, computation: str, keys: Iterable[str]) -> dict[str, bytes]:
        with self._lock:
            return {k: self._state[(computation, k)] for k in keys if (computation, k) in self._state}

    def read_timers(self, computation: str, intervals: Iterable[int]) -> list[tuple[str, str, int, str]]:
        wanted = set(intervals)
        with self._lock:
            return [(key, tag, ts, domain) for (c, key), timers in self._timers.items() if c == computation
                    for tag, (ts, domain, iv) in timers.items() if iv in wanted]

    def seen(self, computation: str, ids: Iterable[str]) -> set[str]:
        with self._lock:
            dedup = self._dedup.get(computation, {})
            return {i for i in ids if i in dedup}

    def dedup_ids(self, computation: str, intervals: Iterable[int]) -> list[str]:
        wanted = set(intervals)
        with self._lock:
            return [i for i, (_, _, iv) in self._dedup.get(computation, {}).items() if iv in wanted]

    def gc_dedup(self, computation: str, sender: str, floor_us: int,
                 intervals: Mapping[int, int] | None = None) -> int:
        with self._lock:
            floor = max(floor_us, self._floors.get((computation, sender), 0))
            self._floors[(computation, sender)] = floor
            dedup = self._dedup.get(computation, {})
            mine = None if intervals is None else \
                {i for i, seq in intervals.items() if self._seq.get((computation, i), 0) == seq}
            below = floor if intervals is None else floor_us
            old = [i for i, (s, at, iv) in dedup.items() if s == sender and at < below
                   and (mine is None or iv in mine)]
            for i in old:
                del dedup[i]
            return len(old)

    def gc_floors(self, computation: str) -> dict[str, int]:
        with self._lock:
            return {s: f for (c, s), f in self._floors.items() if c == computation}

    def set_aside_records(self, computation: str | None = None) -> list[SetAsideRecord]:
        with self._lock:
            return [r for k, r in sorted(self._aside.items()) if computation in (None, k[0])]

    def pending_productions(self, sender: str, interval: int) -> list[StoredProduction]:
        with self._lock:
            return sorted(self._prods.get((sender, interval), {}).values(), key=lambda p: p.produced_at_us)

    def read_watermarks(self) -> dict[str, int]:
        with self._lock:
            return dict(self._wms)

    def save_watermarks(self, watermarks: dict[str, int]) -> None:
        with self._lock:
            for name, wm in watermarks.items():
                self._wms[name] = max(wm, self._wms.get(name, wm))

    def _fence(self, c: str, i: int) -> int:
        return max(self._seq.get((c, i), 0), self._granted.get((c, i), 0))

    def report_watermarks(self, reports: Iterable[tuple]) -> None:
        with self._lock:
            keep_newest(self._reports, reports, self._fence)

    def record_grants(self, grants: Iterable[tuple[str, int, int]]) -> None:
        with self._lock:
            for c, i, seq in grants:
                self._granted[(c, i)] = max(seq, self._granted.get((c, i), 0))

    def read_watermark_reports(self) -> list[tuple]:
        with self._lock:
            return list(self._reports.values())

    def report_cuts(self, reports: Iterable[tuple]) -> None:
        with self._lock:
            keep_newest(self._cuts, reports, self._fence)

    def read_cuts(self) -> list[tuple]:
        with self._lock:
            return list(self._cuts.values())

    def advance_epoch(self, component: str, epoch: int, external_us: int, cohort: str) -> None:
        with self._lock:
            old = self._epochs.get(component)
            if old is None or old[1] == epoch - 1:
                self._epochs[component] = (component, epoch, external_us, cohort)

    def read_epochs(self) -> list[tuple[str, int, int, str]]:
        with self._lock:
            return list(self._epochs.values())

    def report_production_floors(self, reports: Iterable[tuple[str, int, int, int]]) -> None:
        with self._lock:
            keep_newest(self._prod_floors, reports)

    def read_production_floors(self) -> list[tuple[str, int, int, int]]:
        with self._lock:
            return list(self._prod_floors.values())


def _claimed(computation: str, interval: int, current: int, sequencer: int | None) -> int:
    """The sequencer a claim leaves (see :meth:`Store.claim`)."""
    if sequencer is None:
        return current + 1
    if sequencer < current:
        raise StaleSequencer(f"claim of {computation!r} interval {interval} with sequencer {sequencer} "
                             f"refused: a newer owner holds {current}")
    return sequencer


def _check_sequencers(writes: list[Write], current) -> None:
    stale = sorted({(w.computation, w.interval, w.sequencer) for w in writes
                    if current(w.computation, w.interval) != w.sequencer})
    if stale:
        c, i, s = stale[0]
        raise StaleSequencer(f"write to {c!r} interval {i} with sequencer {s} rejected: current is "
                             f"{current(c, i)} ({len(stale)} stale interval(s) in the batch)")


_CLAIMED = ("max(COALESCE((SELECT seq FROM sequencers WHERE computation = ?1 AND interval = ?2), 0), "
            "COALESCE((SELECT seq FROM wm_granted WHERE name = ?1 AND interval = ?2), 0))")
"""The claimed or granted sequencer of a report's interval, the larger (0: neither), for a fence in the
report's statement."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sequencers (computation TEXT, interval INTEGER, seq INTEGER NOT NULL,
    PRIMARY KEY (computation, interval)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS state (computation TEXT, key TEXT, value BLOB NOT NULL,
    PRIMARY KEY (computation, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS timers (computation TEXT, key TEXT, tag TEXT, ts INTEGER NOT NULL,
    domain TEXT NOT NULL, interval INTEGER NOT NULL, PRIMARY KEY (computation, key, tag)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS timers_by_interval ON timers (computation, interval);
CREATE TABLE IF NOT EXISTS dedup (computation TEXT, id TEXT, sender TEXT NOT NULL,
    produced_at INTEGER NOT NULL, interval INTEGER NOT NULL, PRIMARY KEY (computation, id)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS dedup_by_sender ON dedup (computation, sender, produced_at);
CREATE TABLE IF NOT EXISTS gc_floors (computation TEXT, sender TEXT, floor INTEGER NOT NULL,
    PRIMARY KEY (computation, sender)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS productions (sender TEXT, interval INTEGER, id TEXT, stream TEXT NOT NULL,
    key TEXT NOT NULL, value BLOB NOT NULL, ts INTEGER NOT NULL, produced_at INTEGER NOT NULL,
    PRIMARY KEY (sender, interval, id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS watermarks (name TEXT PRIMARY KEY, wm INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS production_floors (sender TEXT, interval INTEGER, seq INTEGER NOT NULL,
    oldest INTEGER NOT NULL, PRIMARY KEY (sender, interval)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS set_aside (computation TEXT, id TEXT, key TEXT NOT NULL, interval INTEGER NOT NULL,
    error TEXT NOT NULL, attempts INTEGER NOT NULL, value BLOB NOT NULL, ts INTEGER NOT NULL,
    sender TEXT NOT NULL, produced_at INTEGER NOT NULL, PRIMARY KEY (computation, id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS wm_reports (name TEXT, interval INTEGER, seq INTEGER NOT NULL, low INTEGER NOT NULL,
    input INTEGER, oldest INTEGER, PRIMARY KEY (name, interval)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS wm_granted (name TEXT, interval INTEGER, seq INTEGER NOT NULL,
    PRIMARY KEY (name, interval)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS wm_cuts (name TEXT, interval INTEGER, seq INTEGER NOT NULL, epoch INTEGER NOT NULL,
    cut INTEGER, PRIMARY KEY (name, interval)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS wm_epochs (component TEXT PRIMARY KEY, epoch INTEGER NOT NULL,
    external INTEGER NOT NULL, cohort TEXT NOT NULL) WITHOUT ROWID;
"""


class SQLiteStore(Store):
    """The default store: one SQLite file, one connection guarded by a lock, one transaction per
    :meth:`commit` (a batch of key checkpoints)."""

    def __init__(self, path: str | Path, synchronous: str = "NORMAL") -> None:
        if synchronous not in ("OFF", "NORMAL", "FULL"):
            raise ValueError(f"synchronous must be OFF, NORMAL or FULL, not {synchronous!r}")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={synchronous}")
        self._db.executescript(SCHEMA)
        self._db.execute("INSERT OR IGNORE INTO meta VALUES ('identity', ?)", (uuid.uuid4().hex,))
        self.identity = self._db.execute("SELECT value FROM meta WHERE name = 'identity'").fetchone()[0]

    def _seq(self, computation: str, interval: int) -> int:
        row = self._db.execute("SELECT seq FROM sequencers WHERE computation=? AND interval=?",
                               (computation, interval)).fetchone()
        return row[0] if row else 0

    def claim(self, computation: str, interval: int, sequencer: int | None = None) -> int:
        with self._lock, self._tx():
            seq = _claimed(computation, interval, self._seq(computation, interval), sequencer)
            self._db.execute("INSERT OR REPLACE INTO sequencers VALUES (?, ?, ?)", (computation, interval, seq))
            return seq

    def _tx(self):
        return _Transaction(self._db)

    def commit(self, writes: list[Write]) -> None:
        if not writes:
            return
        with self._lock, self._tx():
            _check_sequencers(writes, self._seq)
            for w in writes:
                self._apply(w)

    def _apply(self, w: Write) -> None:
        db, c = self._db, w.computation
        if w.key is not None:
            if w.state is None:
                db.execute("DELETE FROM state WHERE computation=? AND key=?", (c, w.key))
            elif not isinstance(w.state, _Keep):
                db.execute("INSERT OR REPLACE INTO state VALUES (?, ?, ?)", (c, w.key, w.state))
            if w.timers_deleted:
                db.executemany("DELETE FROM timers WHERE computation=? AND key=? AND tag=?",
                               [(c, w.key, t) for t in w.timers_deleted])
            if w.timers_set:
                db.executemany("INSERT OR REPLACE INTO timers VALUES (?, ?, ?, ?, ?, ?)",
                               [(c, w.key, t, ts, d, w.interval) for t, ts, d in w.timers_set])
            if w.processed:
                db.executemany("INSERT OR REPLACE INTO dedup VALUES (?, ?, ?, ?, ?)",
                               [(c, i, s, at, w.interval) for i, s, at in w.processed])
        if w.productions:
            db.executemany("INSERT OR REPLACE INTO productions VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                           [(c, w.interval, p.id, p.stream, p.key, p.value, p.timestamp_us, p.produced_at_us)
                            for p in w.productions])
        if w.productions_done:
            db.executemany("DELETE FROM productions WHERE sender=? AND interval=? AND id=?",
                           [(c, w.interval, i) for i in w.productions_done])
        if w.set_aside:
            db.executemany("INSERT OR REPLACE INTO set_aside VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                           [(r.computation, r.id, r.key, w.interval, r.error, r.attempts, r.value, r.timestamp_us,
                             r.sender, r.produced_at_us) for r in w.set_aside])

    def read_states(self, computation: str, keys: Iterable[str]) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        keys = list(keys)
        with self._lock:
            for i in range(0, len(keys), 500):
                part = keys[i:i + 500]
                q = f"SELECT key, value FROM state WHERE computation=? AND key IN ({','.join('?' * len(part))})"
                out.update(self._db.execute(q, (computation, *part)).fetchall())
        return out

    def read_timers(self, computation: str, intervals: Iterable[int]) -> list[tuple[str, str, int, str]]:
        ivs = list(intervals)
        if not ivs:
            return []
        with self._lock:
            q = (f"SELECT key, tag, ts, domain FROM timers WHERE computation=? "
                 f"AND interval IN ({','.join('?' * len(ivs))})")
            return [tuple(r) for r in self._db.execute(q, (computation, *ivs)).fetchall()]

    def seen(self, computation: str, ids: Iterable[str]) -> set[str]:
        ids = list(ids)
        out: set[str] = set()
        with self._lock:
            for i in range(0, len(ids), 500):
                part = ids[i:i + 500]
                q = f"SELECT id FROM dedup WHERE computation=? AND id IN ({','.join('?' * len(part))})"
                out.update(r[0] for r in self._db.execute(q, (computation, *part)))
        return out

    def dedup_ids(self, computation: str, intervals: Iterable[int]) -> list[str]:
        ivs = list(intervals)
        if not ivs:
            return []
        with self._lock:
            q = f"SELECT id FROM dedup WHERE computation=? AND interval IN ({','.join('?' * len(ivs))})"
            return [r[0] for r in self._db.execute(q, (computation, *ivs))]

    def gc_dedup(self, computation: str, sender: str, floor_us: int,
                 intervals: Mapping[int, int] | None = None) -> int:
        with self._lock, self._tx():
            row = self._db.execute("SELECT floor FROM gc_floors WHERE computation=? AND sender=?",
                                   (computation, sender)).fetchone()
            floor = max(floor_us, row[0] if row else 0)
            self._db.execute("INSERT OR REPLACE INTO gc_floors VALUES (?, ?, ?)", (computation, sender, floor))
            if intervals is None:
                cur = self._db.execute("DELETE FROM dedup WHERE computation=? AND sender=? AND produced_at<?",
                                       (computation, sender, floor))
                return cur.rowcount
            mine = [i for i, seq in intervals.items() if self._seq(computation, i) == seq]
            return sum(self._db.execute("DELETE FROM dedup WHERE computation=? AND sender=? AND produced_at<? "
                                        "AND interval=?", (computation, sender, floor_us, i)).rowcount for i in mine)

    def gc_floors(self, computation: str) -> dict[str, int]:
        with self._lock:
            return dict(self._db.execute("SELECT sender, floor FROM gc_floors WHERE computation=?",
                                         (computation,)).fetchall())

    def set_aside_records(self, computation: str | None = None) -> list[SetAsideRecord]:
        with self._lock:
            rows = self._db.execute(
                "SELECT computation, id, key, error, attempts, value, ts, sender, produced_at FROM set_aside "
                "WHERE ? IS NULL OR computation = ? ORDER BY computation, id", (computation, computation))
            return [SetAsideRecord(*r) for r in rows.fetchall()]

    def pending_productions(self, sender: str, interval: int) -> list[StoredProduction]:
        with self._lock:
            rows = self._db.execute("SELECT id, stream, key, value, ts, produced_at FROM productions "
                                    "WHERE sender=? AND interval=? ORDER BY produced_at", (sender, interval))
            return [StoredProduction(*r) for r in rows.fetchall()]

    def read_watermarks(self) -> dict[str, int]:
        with self._lock:
            return dict(self._db.execute("SELECT name, wm FROM watermarks").fetchall())

    def save_watermarks(self, watermarks: dict[str, int]) -> None:
        with self._lock, self._tx():
            self._db.executemany(
                "INSERT INTO watermarks VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET wm=max(wm, excluded.wm)",
                list(watermarks.items()))

    def report_watermarks(self, reports: Iterable[tuple]) -> None:
        with self._lock, self._tx():
            self._db.executemany(
                "INSERT INTO wm_reports SELECT ?1, ?2, ?3, ?4, ?5, ?6 WHERE ?3 >= " + _CLAIMED +
                " ON CONFLICT(name, interval) DO UPDATE SET "
                "seq=excluded.seq, low=excluded.low, input=excluded.input, oldest=excluded.oldest "
                "WHERE wm_reports.seq <= excluded.seq", [tuple(r) for r in reports])

    def read_watermark_reports(self) -> list[tuple]:
        with self._lock:
            return [tuple(r) for r in self._db.execute("SELECT * FROM wm_reports").fetchall()]

    def record_grants(self, grants: Iterable[tuple[str, int, int]]) -> None:
        with self._lock, self._tx():
            self._db.executemany(
                "INSERT INTO wm_granted VALUES (?, ?, ?) ON CONFLICT(name, interval) DO UPDATE SET "
                "seq=max(seq, excluded.seq)", [tuple(g) for g in grants])

    def report_cuts(self, reports: Iterable[tuple]) -> None:
        with self._lock, self._tx():
            self._db.executemany(
                "INSERT INTO wm_cuts SELECT ?1, ?2, ?3, ?4, ?5 WHERE ?3 >= " + _CLAIMED +
                " ON CONFLICT(name, interval) DO UPDATE SET "
                "seq=excluded.seq, epoch=excluded.epoch, cut=excluded.cut WHERE wm_cuts.seq <= excluded.seq",
                [tuple(r) for r in reports])

    def read_cuts(self) -> list[tuple]:
        with self._lock:
            return [tuple(r) for r in self._db.execute("SELECT * FROM wm_cuts").fetchall()]

    def advance_epoch(self, component: str, epoch: int, external_us: int, cohort: str) -> None:
        with self._lock, self._tx():
            self._db.execute(
                "INSERT INTO wm_epochs VALUES (?, ?, ?, ?) ON CONFLICT(component) DO UPDATE SET "
                "epoch=excluded.epoch, external=excluded.external, cohort=excluded.cohort "
                "WHERE wm_epochs.epoch = excluded.epoch - 1", (component, epoch, external_us, cohort))

    def read_epochs(self) -> list[tuple[str, int, int, str]]:
        with self._lock:
            return [tuple(r) for r in self._db.execute("SELECT * FROM wm_epochs").fetchall()]

    def report_production_floors(self, reports: Iterable[tuple[str, int, int, int]]) -> None:
        with self._lock, self._tx():
            self._db.executemany(
                "INSERT INTO production_floors VALUES (?, ?, ?, ?) ON CONFLICT(sender, interval) DO UPDATE SET "
                "seq=excluded.seq, oldest=excluded.oldest WHERE production_floors.seq <= excluded.seq",
                [tuple(r) for r in reports])

    def read_production_floors(self) -> list[tuple[str, int, int, int]]:
        with self._lock:
            return [tuple(r) for r in self._db.execute("SELECT * FROM production_floors").fetchall()]

    def close(self) -> None:
        with self._lock:
            self._db.close()


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type, exc, tb) -> None:
        self._db.execute("COMMIT" if exc_type is None else "ROLLBACK")
