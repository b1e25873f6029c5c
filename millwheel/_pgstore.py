"""The state store in PostgreSQL, shared by every worker of every machine (MillWheel paper §6.2).

Same contract as :class:`millwheel._store.Store`. One :meth:`PostgresStore.commit` is one transaction:

1. ``SELECT ... FROM intervals WHERE (computation, interval_id) IN (...) FOR SHARE``: reads the sequencer
   of every interval the batch writes to and locks those rows against a concurrent :meth:`claim` (which
   updates the row) until the transaction ends;
2. the batch's net effect (see :func:`fold`), one statement per table over arrays (``unnest``):
   state upserts and deletes, timer deletes and upserts, dedup ids, productions and acked productions,
   and records set aside;
3. if any sequencer read in 1 differs from the write's: roll back and raise :class:`StaleSequencer`;
   else commit.

The statements go out in one pipeline, so a batch of key checkpoints costs one round trip and one
commit. A claim that comes after a commit's lock waits for it, and a commit that comes after a claim sees
the new sequencer: a worker that lost its interval can never write.

Connection loss (a restarted or failed-over server) is retried with backoff for ``retry_s`` seconds
(tenacity), on fresh connections. A commit whose outcome is unknown (the connection broke around the
COMMIT) is first looked up by its dedup ids: if they are all stored, the batch landed and is not applied
again. Otherwise it is applied again; every part of a write sets a value (state, timers, ids,
productions), so applying a batch twice leaves what applying it once leaves.

URL: ``postgresql://user[:password]@host[:port]/database[?schema=NAME][&retry_s=SECONDS]`` plus any
libpq parameter. Tables live in ``schema`` (default ``millwheel``), created on first use.
"""
from __future__ import annotations

import re
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Mapping
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

from millwheel._store import KEEP, SetAsideRecord, StaleSequencer, Store, StoredProduction, Write, _Keep, keep_newest

DEFAULT_SCHEMA = "millwheel"
DEFAULT_RETRY_S = 60.0
_IDENT = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")

_CLAIMED = ("LEFT JOIN intervals i ON i.computation = r.name AND i.interval_id = r.interval_id "
            "WHERE i.sequencer IS NULL OR i.sequencer <= r.sequencer")
"""Keeps the reports of an interval not claimed under a newer sequencer than theirs (a fence in the
report's own statement: a report of an owner that lost the interval changes nothing)."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS intervals (computation TEXT, interval_id INTEGER, sequencer BIGINT NOT NULL,
    PRIMARY KEY (computation, interval_id));
CREATE TABLE IF NOT EXISTS state (computation TEXT, key TEXT, value BYTEA NOT NULL,
    PRIMARY KEY (computation, key));
CREATE TABLE IF NOT EXISTS timers (computation TEXT, key TEXT, tag TEXT, ts BIGINT NOT NULL,
    domain TEXT NOT NULL, interval_id INTEGER NOT NULL, PRIMARY KEY (computation, key, tag));
CREATE INDEX IF NOT EXISTS timers_by_interval ON timers (computation, interval_id);
CREATE TABLE IF NOT EXISTS dedup (computation TEXT, id TEXT, sender TEXT NOT NULL,
    produced_at BIGINT NOT NULL, interval_id INTEGER NOT NULL, PRIMARY KEY (computation, id));
CREATE INDEX IF NOT EXISTS dedup_by_sender ON dedup (computation, sender, produced_at);
CREATE TABLE IF NOT EXISTS gc_floors (computation TEXT, sender TEXT, floor BIGINT NOT NULL,
    PRIMARY KEY (computation, sender));
CREATE TABLE IF NOT EXISTS productions (sender TEXT, interval_id INTEGER, id TEXT, stream TEXT NOT NULL,
    key TEXT NOT NULL, value BYTEA NOT NULL, ts BIGINT NOT NULL, produced_at BIGINT NOT NULL,
    PRIMARY KEY (sender, interval_id, id));
CREATE TABLE IF NOT EXISTS watermarks (name TEXT PRIMARY KEY, wm BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS production_floors (sender TEXT, interval_id INTEGER, sequencer BIGINT NOT NULL,
    oldest BIGINT NOT NULL, PRIMARY KEY (sender, interval_id));
CREATE TABLE IF NOT EXISTS set_aside (computation TEXT, id TEXT, key TEXT NOT NULL, interval_id INTEGER NOT NULL,
    error TEXT NOT NULL, attempts INTEGER NOT NULL, value BYTEA NOT NULL, ts BIGINT NOT NULL,
    sender TEXT NOT NULL, produced_at BIGINT NOT NULL, PRIMARY KEY (computation, id));
CREATE TABLE IF NOT EXISTS wm_reports (name TEXT, interval_id INTEGER, sequencer BIGINT NOT NULL,
    low BIGINT NOT NULL, input BIGINT, oldest BIGINT, PRIMARY KEY (name, interval_id));
CREATE TABLE IF NOT EXISTS wm_cuts (name TEXT, interval_id INTEGER, sequencer BIGINT NOT NULL,
    epoch BIGINT NOT NULL, cut BIGINT, PRIMARY KEY (name, interval_id));
CREATE TABLE IF NOT EXISTS wm_epochs (component TEXT PRIMARY KEY, epoch BIGINT NOT NULL,
    external BIGINT NOT NULL, cohort TEXT NOT NULL);
"""

_CHECK = ("SELECT computation, interval_id, sequencer FROM intervals WHERE (computation, interval_id) IN "
          "(SELECT * FROM unnest(%b::text[], %b::int[])) ORDER BY computation, interval_id FOR SHARE")
_STATE_PUT = ("INSERT INTO state (computation, key, value) SELECT * FROM unnest(%b::text[], %b::text[], "
              "%b::bytea[]) ON CONFLICT (computation, key) DO UPDATE SET value = EXCLUDED.value")
_STATE_DEL = "DELETE FROM state WHERE (computation, key) IN (SELECT * FROM unnest(%b::text[], %b::text[]))"
_TIMER_DEL = ("DELETE FROM timers WHERE (computation, key, tag) IN "
              "(SELECT * FROM unnest(%b::text[], %b::text[], %b::text[]))")
_TIMER_PUT = ("INSERT INTO timers (computation, key, tag, ts, domain, interval_id) SELECT * FROM "
              "unnest(%b::text[], %b::text[], %b::text[], %b::bigint[], %b::text[], %b::int[]) "
              "ON CONFLICT (computation, key, tag) DO UPDATE SET ts = EXCLUDED.ts, domain = EXCLUDED.domain, "
              "interval_id = EXCLUDED.interval_id")
_DEDUP_PUT = ("INSERT INTO dedup (computation, id, sender, produced_at, interval_id) SELECT * FROM "
              "unnest(%b::text[], %b::text[], %b::text[], %b::bigint[], %b::int[]) "
              "ON CONFLICT (computation, id) DO NOTHING")
_PROD_PUT = ("INSERT INTO productions (sender, interval_id, id, stream, key, value, ts, produced_at) "
             "SELECT * FROM unnest(%b::text[], %b::int[], %b::text[], %b::text[], %b::text[], %b::bytea[], "
             "%b::bigint[], %b::bigint[]) ON CONFLICT (sender, interval_id, id) DO UPDATE SET "
             "stream = EXCLUDED.stream, key = EXCLUDED.key, value = EXCLUDED.value, ts = EXCLUDED.ts, "
             "produced_at = EXCLUDED.produced_at")
_PROD_DEL = ("DELETE FROM productions WHERE (sender, interval_id, id) IN "
             "(SELECT * FROM unnest(%b::text[], %b::int[], %b::text[]))")
_ASIDE_PUT = ("INSERT INTO set_aside (computation, id, key, interval_id, error, attempts, value, ts, sender, "
              "produced_at) SELECT * FROM unnest(%b::text[], %b::text[], %b::text[], %b::int[], %b::text[], "
              "%b::int[], %b::bytea[], %b::bigint[], %b::text[], %b::bigint[]) ON CONFLICT (computation, id) "
              "DO UPDATE SET error = EXCLUDED.error, attempts = EXCLUDED.attempts")
_LANDED = ("SELECT count(*) FROM dedup WHERE (computation, id) IN "
           "(SELECT * FROM unnest(%b::text[], %b::text[]))")


@dataclass
class NetEffect:
    """What a batch of writes leaves behind, with no two changes to the same row (so each table's
    changes can go out as one statement, in any order)."""
    sequencers: set[tuple[str, int, int]] = field(default_factory=set)
    state_put: dict[tuple[str, str], bytes] = field(default_factory=dict)
    state_del: set[tuple[str, str]] = field(default_factory=set)
    timer_put: dict[tuple[str, str, str], tuple[int, str, int]] = field(default_factory=dict)
    timer_del: set[tuple[str, str, str]] = field(default_factory=set)
    dedup: dict[tuple[str, str], tuple[str, int, int]] = field(default_factory=dict)
    prod_put: dict[tuple[str, int, str], StoredProduction] = field(default_factory=dict)
    prod_del: set[tuple[str, int, str]] = field(default_factory=set)
    set_aside: dict[tuple[str, str], tuple[SetAsideRecord, int]] = field(default_factory=dict)


def fold(writes: list[Write]) -> NetEffect:
    """The net effect of applying ``writes`` one after the other, in the order the SQLite store applies
    each write's parts (state, deleted timers, set timers, ids, productions, acked productions)."""
    n = NetEffect()
    for w in writes:
        c = w.computation
        n.sequencers.add((c, w.interval, w.sequencer))
        if w.key is not None:
            sk = (c, w.key)
            if w.state is None:
                n.state_put.pop(sk, None)
                n.state_del.add(sk)
            elif not isinstance(w.state, _Keep):
                n.state_del.discard(sk)
                n.state_put[sk] = bytes(w.state)
            for tag in w.timers_deleted:
                n.timer_put.pop((c, w.key, tag), None)
                n.timer_del.add((c, w.key, tag))
            for tag, ts, domain in w.timers_set:
                n.timer_del.discard((c, w.key, tag))
                n.timer_put[(c, w.key, tag)] = (ts, domain, w.interval)
            for rid, sender, at in w.processed:
                n.dedup[(c, rid)] = (sender, at, w.interval)
        for p in w.productions:
            n.prod_del.discard((c, w.interval, p.id))
            n.prod_put[(c, w.interval, p.id)] = p
        for pid in w.productions_done:
            n.prod_put.pop((c, w.interval, pid), None)
            n.prod_del.add((c, w.interval, pid))
        for r in w.set_aside:
            n.set_aside[(r.computation, r.id)] = (r, w.interval)
    return n


def _columns(rows, width: int) -> list[list]:
    cols: list[list] = [[] for _ in range(width)]
    for row in rows:
        for col, v in zip(cols, row):
            col.append(v)
    return cols


@dataclass(frozen=True)
class PostgresStatistics:
    commits: int
    """Batches committed (one transaction each)."""
    writes: int
    """Key checkpoints (``Write``) in those batches."""
    fenced: int
    """Batches refused because a sequencer was stale."""
    retries: int
    """Operations tried again after a lost connection."""
    already_applied: int
    """Retried commits found already landed (by their dedup ids) and not applied again."""
    connections_opened: int


class PostgresStore(Store):
    """See the module docstring. Thread-safe: each call takes a connection from a small per-process pool."""

    def __init__(self, conninfo: str, schema: str = DEFAULT_SCHEMA, retry_s: float = DEFAULT_RETRY_S,
                 connect_timeout_s: int = 5) -> None:
        if not _IDENT.match(schema):
            raise ValueError(f"schema {schema!r} must be a lower-case SQL identifier")
        self.conninfo, self.schema, self.retry_s = conninfo, schema, retry_s
        self.connect_timeout_s = connect_timeout_s
        self._idle: list[psycopg.Connection] = []
        self._pool_lock = threading.Lock()
        self._closed = False
        self._counts = {"commits": 0, "writes": 0, "fenced": 0, "retries": 0, "already_applied": 0,
                        "connections_opened": 0}
        self._retry(self._create_schema)

    @classmethod
    def from_url(cls, url: str) -> "PostgresStore":
        """``postgresql://...?schema=NAME&retry_s=SECONDS``; the other parameters go to libpq."""
        parts = urlsplit(url)
        params = dict(parse_qsl(parts.query))
        schema = params.pop("schema", DEFAULT_SCHEMA)
        try:
            retry_s = float(params.pop("retry_s", DEFAULT_RETRY_S))
        except ValueError:
            raise ValueError(f"store url {url!r}: retry_s must be a number of seconds") from None
        return cls(urlunsplit(parts._replace(query=urlencode(params))), schema=schema, retry_s=retry_s)

    # ---- connections and retries ------------------------------------------------------------------
    def _connect(self) -> psycopg.Connection:
        conn = psycopg.connect(self.conninfo, autocommit=True, connect_timeout=self.connect_timeout_s)
        conn.execute(f"SET search_path TO {self.schema}")
        self._count("connections_opened")
        return conn

    @contextmanager
    def _conn(self) -> Iterator[psycopg.Connection]:
        with self._pool_lock:
            if self._closed:
                raise RuntimeError("the store is closed")
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            conn = self._connect()
        try:
            yield conn
        except psycopg.OperationalError:
            conn.close()
            self._drop_idle()  # the server went away: the idle connections are as dead as this one
            raise
        except BaseException:
            conn.close()
            raise
        with self._pool_lock:
            if self._closed:
                conn.close()
            else:
                self._idle.append(conn)

    def _drop_idle(self) -> None:
        with self._pool_lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _retry(self, fn, *args):
        """``fn(conn, attempt, *args)`` on a pooled connection, again on lost connections for ``retry_s``."""
        for attempt in Retrying(retry=retry_if_exception_type(psycopg.OperationalError),
                                wait=wait_exponential(multiplier=0.05, max=2.0),
                                stop=stop_after_delay(self.retry_s), reraise=True,
                                before_sleep=lambda _: self._count("retries")):
            with attempt:
                with self._conn() as conn:
                    return fn(conn, attempt.retry_state.attempt_number, *args)

    def _count(self, name: str, n: int = 1) -> None:
        with self._pool_lock:
            self._counts[name] += n

    def _create_schema(self, conn: psycopg.Connection, _attempt: int) -> None:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext('millwheel schema'))")  # one creator at a time
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {self.schema}")
            for stmt in SCHEMA.split(";"):
                if stmt.strip():
                    conn.execute(stmt)

    # ---- the contract --------------------------------------------------------------------------------
    def claim(self, computation: str, interval: int, sequencer: int | None = None) -> int:
        if sequencer is None:
            return self._retry(lambda conn, _: conn.execute(
                "INSERT INTO intervals VALUES (%s, %s, 1) ON CONFLICT (computation, interval_id) "
                "DO UPDATE SET sequencer = intervals.sequencer + 1 RETURNING sequencer",
                (computation, interval)).fetchone()[0])
        # a master's sequencer: stored unless a newer owner's is (then no row comes back)
        row = self._retry(lambda conn, _: conn.execute(
            "INSERT INTO intervals VALUES (%s, %s, %s) ON CONFLICT (computation, interval_id) "
            "DO UPDATE SET sequencer = EXCLUDED.sequencer WHERE intervals.sequencer <= EXCLUDED.sequencer "
            "RETURNING sequencer", (computation, interval, sequencer)).fetchone())
        if row is None:
            raise StaleSequencer(f"claim of {computation!r} interval {interval} with sequencer {sequencer} "
                                 f"refused: a newer owner holds it")
        return row[0]

    def commit(self, writes: list[Write]) -> None:
        if not writes:
            return
        net = fold(writes)
        if self._retry(self._commit, net):
            self._count("commits")
            self._count("writes", len(writes))

    def _commit(self, conn: psycopg.Connection, attempt: int, net: NetEffect) -> bool:
        if attempt > 1 and net.dedup and self._landed(conn, net):
            self._count("already_applied")
            return False
        wanted = {(c, i): s for c, i, s in net.sequencers}
        try:
            with conn.pipeline(), conn.transaction():
                check = conn.cursor()
                check.execute(_CHECK, _columns(wanted, 2))
                self._apply(conn, net)
                current = {(c, i): s for c, i, s in check.fetchall()}
                stale = sorted((c, i, s) for (c, i), s in wanted.items() if current.get((c, i), 0) != s)
                if stale:
                    c, i, s = stale[0]
                    raise StaleSequencer(f"write to {c!r} interval {i} with sequencer {s} rejected: current is "
                                         f"{current.get((c, i), 0)} ({len(stale)} stale interval(s) in the batch)")
        except StaleSequencer:
            self._count("fenced")
            raise
        return True

    @staticmethod
    def _landed(conn: psycopg.Connection, net: NetEffect) -> bool:
        """Whether every dedup id of the batch is stored: the batch committed (it is all or nothing)."""
        found = conn.execute(_LANDED, _columns(net.dedup, 2)).fetchone()[0]
        return found == len(net.dedup)

    @staticmethod
    def _apply(conn: psycopg.Connection, n: NetEffect) -> None:
        if n.state_put:
            conn.execute(_STATE_PUT, _columns(((c, k, v) for (c, k), v in n.state_put.items()), 3))
        if n.state_del:
            conn.execute(_STATE_DEL, _columns(n.state_del, 2))
        if n.timer_del:
            conn.execute(_TIMER_DEL, _columns(n.timer_del, 3))
        if n.timer_put:
            conn.execute(_TIMER_PUT, _columns(((c, k, t, ts, d, iv) for (c, k, t), (ts, d, iv)
                                               in n.timer_put.items()), 6))
        if n.dedup:
            conn.execute(_DEDUP_PUT, _columns(((c, i, s, at, iv) for (c, i), (s, at, iv) in n.dedup.items()), 5))
        if n.prod_put:
            conn.execute(_PROD_PUT, _columns(((s, iv, p.id, p.stream, p.key, p.value, p.timestamp_us,
                                               p.produced_at_us) for (s, iv, _), p in n.prod_put.items()), 8))
        if n.prod_del:
            conn.execute(_PROD_DEL, _columns(n.prod_del, 3))
        if n.set_aside:
            conn.execute(_ASIDE_PUT, _columns(((r.computation, r.id, r.key, iv, r.error, r.attempts, r.value,
                                                r.timestamp_us, r.sender, r.produced_at_us)
                                               for r, iv in n.set_aside.values()), 10))

    def read_states(self, computation: str, keys: Iterable[str]) -> dict[str, bytes]:
        keys = list(keys)
        if not keys:
            return {}
        rows = self._retry(lambda conn, _: conn.execute(
            "SELECT key, value FROM state WHERE computation = %s AND key = ANY(%b::text[])",
            (computation, keys)).fetchall())
        return {k: bytes(v) for k, v in rows}

    def read_timers(self, computation: str, intervals: Iterable[int]) -> list[tuple[str, str, int, str]]:
        ivs = list(intervals)
        if not ivs:
            return []
        rows = self._retry(lambda conn, _: conn.execute(
            "SELECT key, tag, ts, domain FROM timers WHERE computation = %s AND interval_id = ANY(%s::int[])",
            (computation, ivs)).fetchall())
        return [tuple(r) for r in rows]

    def seen(self, computation: str, ids: Iterable[str]) -> set[str]:
        ids = list(ids)
        if not ids:
            return set()
        rows = self._retry(lambda conn, _: conn.execute(
            "SELECT id FROM dedup WHERE computation = %s AND id = ANY(%b::text[])", (computation, ids)).fetchall())
        return {r[0] for r in rows}

    def dedup_ids(self, computation: str, intervals: Iterable[int]) -> list[str]:
        ivs = list(intervals)
        if not ivs:
            return []
        rows = self._retry(lambda conn, _: conn.execute(
            "SELECT id FROM dedup WHERE computation = %s AND interval_id = ANY(%s::int[])",
            (computation, ivs)).fetchall())
        return [r[0] for r in rows]

    def gc_dedup(self, computation: str, sender: str, floor_us: int,
                 intervals: Mapping[int, int] | None = None) -> int:
        def gc(conn: psycopg.Connection, _attempt: int) -> int:
            with conn.transaction():
                floor = conn.execute(
                    "INSERT INTO gc_floors VALUES (%s, %s, %s) ON CONFLICT (computation, sender) "
                    "DO UPDATE SET floor = GREATEST(gc_floors.floor, EXCLUDED.floor) RETURNING floor",
                    (computation, sender, floor_us)).fetchone()[0]
                if intervals is None:
                    return conn.execute("DELETE FROM dedup WHERE computation = %s AND sender = %s AND "
                                        "produced_at < %s", (computation, sender, floor)).rowcount
                # the intervals still ours, locked against a claim until the deletion commits (a claim
                # after it reads the raised floor)
                rows = conn.execute(_CHECK, ([computation] * len(intervals), list(intervals))).fetchall()
                mine = [i for c, i, seq in rows if intervals.get(i) == seq]
                if not mine:
                    return 0
                # below the caller's floor, which its cores apply (another process may have stored a higher
                # one that these cores have not seen)
                return conn.execute("DELETE FROM dedup WHERE computation = %s AND sender = %s AND produced_at < %s "
                                    "AND interval_id = ANY(%s::int[])", (computation, sender, floor_us, mine)).rowcount
        return self._retry(gc)

    def gc_floors(self, computation: str) -> dict[str, int]:
        return dict(self._retry(lambda conn, _: conn.execute(
            "SELECT sender, floor FROM gc_floors WHERE computation = %s", (computation,)).fetchall()))

    def set_aside_records(self, computation: str | None = None) -> list[SetAsideRecord]:
        rows = self._retry(lambda conn, _: conn.execute(
            "SELECT computation, id, key, error, attempts, value, ts, sender, produced_at FROM set_aside "
            "WHERE %s::text IS NULL OR computation = %s ORDER BY computation, id",
            (computation, computation)).fetchall())
        return [SetAsideRecord(c, i, k, e, a, bytes(v), ts, s, at) for c, i, k, e, a, v, ts, s, at in rows]

    def pending_productions(self, sender: str, interval: int) -> list[StoredProduction]:
        rows = self._retry(lambda conn, _: conn.execute(
            "SELECT id, stream, key, value, ts, produced_at FROM productions WHERE sender = %s AND "
            "interval_id = %s ORDER BY produced_at, id", (sender, interval)).fetchall())
        return [StoredProduction(i, s, k, bytes(v), ts, at) for i, s, k, v, ts, at in rows]

    def read_watermarks(self) -> dict[str, int]:
        return dict(self._retry(lambda conn, _: conn.execute("SELECT name, wm FROM watermarks").fetchall()))

    def save_watermarks(self, watermarks: dict[str, int]) -> None:
        if not watermarks:
            return
        self._retry(lambda conn, _: conn.execute(
            "INSERT INTO watermarks (name, wm) SELECT * FROM unnest(%s::text[], %s::bigint[]) "
            "ON CONFLICT (name) DO UPDATE SET wm = GREATEST(watermarks.wm, EXCLUDED.wm)",
            _columns(watermarks.items(), 2)))

    def report_watermarks(self, reports: Iterable[tuple]) -> None:
        last = keep_newest({}, reports)      # one row per interval (one statement cannot change a row twice)
        rows = list(last.values())
        if not rows:
            return
        self._retry(lambda conn, _: conn.execute(
            "INSERT INTO wm_reports SELECT r.* FROM unnest(%s::text[], %s::int[], %s::bigint[], %s::bigint[], "
            "%s::bigint[], %s::bigint[]) AS r (name, interval_id, sequencer, low, input, oldest) " + _CLAIMED +
            " ON CONFLICT (name, interval_id) DO UPDATE SET "
            "sequencer = EXCLUDED.sequencer, low = EXCLUDED.low, input = EXCLUDED.input, oldest = EXCLUDED.oldest "
            "WHERE wm_reports.sequencer <= EXCLUDED.sequencer", _columns(rows, 6)))

    def read_watermark_reports(self) -> list[tuple]:
        return self._retry(lambda conn, _: [tuple(r) for r in conn.execute("SELECT * FROM wm_reports").fetchall()])

    def report_cuts(self, reports: Iterable[tuple]) -> None:
        last = keep_newest({}, reports)      # one row per interval (one statement cannot change a row twice)
        if not last:
            return
        self._retry(lambda conn, _: conn.execute(
            "INSERT INTO wm_cuts SELECT r.* FROM unnest(%s::text[], %s::int[], %s::bigint[], %s::bigint[], "
            "%s::bigint[]) AS r (name, interval_id, sequencer, epoch, cut) " + _CLAIMED +
            " ON CONFLICT (name, interval_id) DO UPDATE SET sequencer = EXCLUDED.sequencer, "
            "epoch = EXCLUDED.epoch, cut = EXCLUDED.cut WHERE wm_cuts.sequencer <= EXCLUDED.sequencer",
            _columns(last.values(), 5)))

    def read_cuts(self) -> list[tuple]:
        return self._retry(lambda conn, _: [tuple(r) for r in conn.execute("SELECT * FROM wm_cuts").fetchall()])

    def advance_epoch(self, component: str, epoch: int, external_us: int, cohort: str) -> None:
        self._retry(lambda conn, _: conn.execute(
            "INSERT INTO wm_epochs VALUES (%s, %s, %s, %s) ON CONFLICT (component) DO UPDATE SET "
            "epoch = EXCLUDED.epoch, external = EXCLUDED.external, cohort = EXCLUDED.cohort "
            "WHERE wm_epochs.epoch = EXCLUDED.epoch - 1", (component, epoch, external_us, cohort)))

    def read_epochs(self) -> list[tuple[str, int, int, str]]:
        return self._retry(lambda conn, _: [tuple(r) for r in conn.execute("SELECT * FROM wm_epochs").fetchall()])

    def report_production_floors(self, reports: Iterable[tuple[str, int, int, int]]) -> None:
        last = keep_newest({}, reports)      # one row per interval (one statement cannot change a row twice)
        if not last:
            return
        self._retry(lambda conn, _: conn.execute(
            "INSERT INTO production_floors SELECT * FROM unnest(%s::text[], %s::int[], %s::bigint[], %s::bigint[]) "
            "ON CONFLICT (sender, interval_id) DO UPDATE SET sequencer = EXCLUDED.sequencer, oldest = EXCLUDED.oldest "
            "WHERE production_floors.sequencer <= EXCLUDED.sequencer", _columns(last.values(), 4)))

    def read_production_floors(self) -> list[tuple[str, int, int, int]]:
        return self._retry(lambda conn, _: [tuple(r) for r in conn.execute(
            "SELECT * FROM production_floors").fetchall()])

    def statistics(self) -> PostgresStatistics:
        with self._pool_lock:
            return PostgresStatistics(**self._counts)

    def close(self) -> None:
        with self._pool_lock:
            self._closed = True
        self._drop_idle()


__all__ = ["KEEP", "PostgresStatistics", "PostgresStore", "fold"]
