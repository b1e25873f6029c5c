"""The state store in PostgreSQL, shared by every worker of every machine (MillWheel paper §6.2).

Same contract as :class:`millwheel._store.Store`. One :meth:`PostgresStore.commit` is one call of the
server-side function ``commit_v2`` (created with the tables), one statement in its own transaction:

1. it takes a shared advisory lock per interval the batch writes to (held until the transaction ends; a
   :meth:`claim` takes the interval's lock exclusively before it commits, see ``_FENCE_LOCK``), then
   reads their sequencers in a statement of its own (a fresh snapshot, READ COMMITTED: it sees every
   claim that committed before its locks were granted). A row lock (``FOR SHARE``) did the same before,
   but locking a row writes it (its header, a WAL record, a dirtied page) on every commit;
2. if any differs from the write's, it raises (SQLSTATE ``MW001``; the whole call rolls back, nothing is
   written) and the store raises :class:`StaleSequencer` with its message;
3. else the batch's net effect (see :func:`fold`), one statement per table over all its rows: state upserts
   and deletes, timer deletes and upserts, dedup ids, the row of the batch's new productions (one per
   sender interval, see below), rows of acked productions deleted or marked, and records set aside. Each
   part comes as one JSON array of arrays (see :func:`commit_arguments`); the transaction commits when the
   call returns.

One statement, one round trip, no ``BEGIN``/``COMMIT`` messages, prepared once per session, and PL/pgSQL
keeps its statements' plans for the session.

**Productions, a row per commit.** A commit's strong productions of one sender interval are one row of
``production_batches`` (the fields as JSON, the values as one ``bytea``), not a row each: productions are
inserted and deleted a row at a time, not one by one. :class:`ProductionRows` knows which row
holds which unacked id; an ack of some of a row's productions appends their ids to the row's ``acked``
column (so :meth:`PostgresStore.pending_productions`, which a new owner reads, returns exactly the unacked
ones, as before), and the ack of the last one deletes the row. A schema that still has the per-production
``productions`` table of earlier versions is upgraded when the store opens.

A claim that comes after a commit's lock waits for it, and a commit that comes after a claim sees
the new sequencer: a worker that lost its interval can never write. (Every process sharing a schema must
run this version: an older one's claim takes no advisory lock, and an older one's commit locks rows.)

Connection loss (a restarted or failed-over server) is retried with backoff for ``retry_s`` seconds
(tenacity), on fresh connections, unless the process is stopping (:meth:`PostgresStore.give_up_when`: then
the call raises :class:`StoreAbandoned` at once; :meth:`PostgresStore.interrupt` also cuts off the calls
in progress, by shutting their sockets down, for a server that hangs rather than refuses). A commit whose outcome is unknown (the connection broke around the
COMMIT) is first looked up by its dedup ids: if they are all stored, the batch landed and is not applied
again. Otherwise it is applied again; every part of a write sets a value (state, timers, ids,
productions), so applying a batch twice leaves what applying it once leaves.

URL: ``postgresql://user[:password]@host[:port]/database[?schema=NAME][&retry_s=SECONDS]
[&idle_in_transaction_s=SECONDS]`` plus any libpq parameter. ``idle_in_transaction_s`` (default 5, the
master's lease; 0: off) is how long the server lets one of the store's sessions sit idle inside a
transaction before it ends the session and releases its locks. Tables live in ``schema`` (default ``millwheel``), created on first use.
"""
from __future__ import annotations

import os
import re
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Mapping
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import orjson
import psycopg
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, stop_when_event_set, wait_exponential

from millwheel._store import (KEEP, SetAsideRecord, StaleSequencer, Store, StoreAbandoned, StoredProduction, Write,
                              _Keep, keep_newest)

DEFAULT_SCHEMA = "millwheel"
DEFAULT_RETRY_S = 60.0
DEFAULT_IDLE_IN_TRANSACTION_S = 5.0
_FIRST_WAIT_S = 0.05
"""The wait before the second attempt after a lost connection; each later wait doubles, up to 2 s."""
_LOST = (psycopg.OperationalError, psycopg.errors.IdleInTransactionSessionTimeout)
"""A lost connection: the server went away, or ended a session left idle inside a transaction (the first
statement after that is answered with the timeout's error, an ``InternalError``, not an ``OperationalError``)."""
_IDENT = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")

_CLAIMED = ("LEFT JOIN intervals i ON i.computation = r.name AND i.interval_id = r.interval_id "
            "LEFT JOIN wm_granted g ON g.name = r.name AND g.interval_id = r.interval_id "
            "WHERE (i.sequencer IS NULL OR i.sequencer <= r.sequencer) "
            "AND (g.sequencer IS NULL OR g.sequencer <= r.sequencer)")
"""Keeps the reports of an interval neither claimed nor granted under a newer sequencer than theirs (a
fence in the report's own statement: a report of an owner that lost the interval changes nothing)."""

_REPORT = ("INSERT INTO wm_reports SELECT r.* FROM unnest(%b::text[], %b::int[], %b::bigint[], %b::bigint[], "
           "%b::bigint[], %b::bigint[]) AS r (name, interval_id, sequencer, low, input, oldest) " + _CLAIMED +
           " ON CONFLICT (name, interval_id) DO UPDATE SET "
           "sequencer = EXCLUDED.sequencer, low = EXCLUDED.low, input = EXCLUDED.input, oldest = EXCLUDED.oldest "
           "WHERE wm_reports.sequencer <= EXCLUDED.sequencer")
"""Watermark reports ``(name, interval, sequencer, low_us, input_us, oldest_us)``, fenced (``_CLAIMED``)."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS intervals (computation TEXT, interval_id INTEGER, sequencer BIGINT NOT NULL,
    PRIMARY KEY (computation, interval_id));
CREATE TABLE IF NOT EXISTS state (computation TEXT, key TEXT, value BYTEA NOT NULL,
    PRIMARY KEY (computation, key));
CREATE TABLE IF NOT EXISTS timers (computation TEXT, key TEXT, tag TEXT, ts BIGINT NOT NULL,
    domain TEXT NOT NULL, interval_id INTEGER NOT NULL, PRIMARY KEY (computation, key, tag));
CREATE INDEX IF NOT EXISTS timers_by_interval ON timers (computation, interval_id);
CREATE TABLE IF NOT EXISTS dedup (computation TEXT, id TEXT, sender TEXT NOT NULL,
    produced_at BIGINT NOT NULL, interval_id INTEGER NOT NULL, PRIMARY KEY (computation, id));
CREATE INDEX IF NOT EXISTS dedup_by_time ON dedup USING brin (produced_at);
DROP INDEX IF EXISTS dedup_by_sender;
CREATE TABLE IF NOT EXISTS gc_floors (computation TEXT, sender TEXT, floor BIGINT NOT NULL,
    PRIMARY KEY (computation, sender));
CREATE TABLE IF NOT EXISTS production_batches (sender TEXT, interval_id INTEGER, batch TEXT, meta BYTEA NOT NULL,
    payload BYTEA NOT NULL, acked TEXT NOT NULL DEFAULT '', PRIMARY KEY (sender, interval_id, batch));
CREATE TABLE IF NOT EXISTS watermarks (name TEXT PRIMARY KEY, wm BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS production_floors (sender TEXT, interval_id INTEGER, sequencer BIGINT NOT NULL,
    oldest BIGINT NOT NULL, PRIMARY KEY (sender, interval_id));
CREATE TABLE IF NOT EXISTS set_aside (computation TEXT, id TEXT, key TEXT NOT NULL, interval_id INTEGER NOT NULL,
    error TEXT NOT NULL, attempts INTEGER NOT NULL, value BYTEA NOT NULL, ts BIGINT NOT NULL,
    sender TEXT NOT NULL, produced_at BIGINT NOT NULL, PRIMARY KEY (computation, id));
CREATE TABLE IF NOT EXISTS wm_reports (name TEXT, interval_id INTEGER, sequencer BIGINT NOT NULL,
    low BIGINT NOT NULL, input BIGINT, oldest BIGINT, PRIMARY KEY (name, interval_id));
CREATE TABLE IF NOT EXISTS wm_granted (name TEXT, interval_id INTEGER, sequencer BIGINT NOT NULL,
    PRIMARY KEY (name, interval_id));
CREATE TABLE IF NOT EXISTS wm_cuts (name TEXT, interval_id INTEGER, sequencer BIGINT NOT NULL,
    epoch BIGINT NOT NULL, cut BIGINT, PRIMARY KEY (name, interval_id));
CREATE TABLE IF NOT EXISTS wm_epochs (component TEXT PRIMARY KEY, epoch BIGINT NOT NULL,
    external BIGINT NOT NULL, cohort TEXT NOT NULL);
"""

_CHECK = ("SELECT computation, interval_id, sequencer FROM intervals WHERE (computation, interval_id) IN "
          "(SELECT * FROM unnest(%b::text[], %b::int[])) ORDER BY computation, interval_id FOR SHARE")
_FENCE_LOCK = "SELECT pg_advisory_xact_lock(hashtext(current_schema() || '/' || %s), %s)"
"""A claim's exclusive hold on its interval's fence lock until its transaction ends; a commit holds the lock of
each interval it writes to shared (``_COMMIT_FN``). The lock is named by the hash of the schema's and the
computation's names, and the interval: two schemas of one database do not share locks, and two names that
hash alike only share a lock (one waits, no fence passes). Locks live in the server's shared lock table, not
in a row, so taking one writes nothing; the table holds ``max_locks_per_transaction`` times the connections
(64 x 100 by default), far above a commit's intervals times the store's sessions."""


_BATCH_PUT = ("INSERT INTO production_batches (sender, interval_id, batch, meta, payload) SELECT * FROM "
              "unnest(%b::text[], %b::int[], %b::text[], %b::bytea[], %b::bytea[]) "
              "ON CONFLICT (sender, interval_id, batch) DO NOTHING")

# One commit is one call of this function, in its own (implicit) transaction: one statement, one round
# trip, no BEGIN or COMMIT messages, nothing planned per call (PL/pgSQL keeps each statement's plan for the
# session). Its name carries a version: a change of its arguments is a new function, so processes of two
# versions never call each other's. Each part comes as one JSON array of arrays (see commit_arguments).
# ``enable_seqscan = off``: the tables it reads are small by their statistics but not on disk
# (production_batches gets a row inserted and one deleted per commit; until a vacuum its dead rows fill
# pages), and a plan kept for the session that scanned them cost more with every commit (10 records per
# commit: the DELETE of acked rows alone was a third of the function's time, and the function's time
# halved without the scans); every statement here is meant to go by a key.
_COMMIT_FN = r"""
CREATE OR REPLACE FUNCTION commit_v2(seqs json, state_put json, state_del json, timer_del json, timer_put json,
    dedup_put json, batch_put json, batch_del json, batch_ack json, aside json) RETURNS void LANGUAGE plpgsql
    SET enable_seqscan = off AS $fn$
DECLARE
    stale int;
    bad record;
BEGIN
    -- the intervals written to, locked against a claim until the end: a shared advisory lock each (a
    -- claim takes it exclusively before it commits), then their sequencers read in a statement of their
    -- own, so under a fresh snapshot that sees any claim that committed before the locks were granted
    PERFORM pg_advisory_xact_lock_shared(hashtext(current_schema() || '/' || (e->>0)), (e->>1)::int)
        FROM json_array_elements(seqs) AS e ORDER BY e->>0, (e->>1)::int;
    SELECT count(*) FILTER (WHERE coalesce(l.sequencer, 0) <> u.s) INTO stale
        FROM (SELECT e->>0 AS c, (e->>1)::int AS i, (e->>2)::bigint AS s FROM json_array_elements(seqs) AS e) AS u
        LEFT JOIN intervals l ON l.computation = u.c AND l.interval_id = u.i;
    IF stale > 0 THEN
        SELECT u.c, u.i, u.s, coalesce(v.sequencer, 0) AS cur INTO bad
            FROM (SELECT e->>0 AS c, (e->>1)::int AS i, (e->>2)::bigint AS s FROM json_array_elements(seqs) AS e) AS u
            LEFT JOIN intervals v ON v.computation = u.c AND v.interval_id = u.i
            WHERE coalesce(v.sequencer, 0) <> u.s ORDER BY u.c, u.i LIMIT 1;
        RAISE EXCEPTION USING ERRCODE = 'MW001', MESSAGE = format(
            'write to %L interval %s with sequencer %s rejected: current is %s (%s stale interval(s) in the batch)',
            bad.c, bad.i, bad.s, bad.cur, stale);
    END IF;
    IF state_put IS NOT NULL THEN
        INSERT INTO state (computation, key, value) SELECT e->>0, e->>1, decode(e->>2, 'hex')
            FROM json_array_elements(state_put) AS e
            ON CONFLICT (computation, key) DO UPDATE SET value = EXCLUDED.value;
    END IF;
    IF state_del IS NOT NULL THEN
        DELETE FROM state WHERE (computation, key) IN
            (SELECT e->>0, e->>1 FROM json_array_elements(state_del) AS e);
    END IF;
    IF timer_del IS NOT NULL THEN
        DELETE FROM timers WHERE (computation, key, tag) IN
            (SELECT e->>0, e->>1, e->>2 FROM json_array_elements(timer_del) AS e);
    END IF;
    IF timer_put IS NOT NULL THEN
        INSERT INTO timers (computation, key, tag, ts, domain, interval_id) SELECT e->>0, e->>1, e->>2,
            (e->>3)::bigint, e->>4, (e->>5)::int FROM json_array_elements(timer_put) AS e
            ON CONFLICT (computation, key, tag) DO UPDATE SET ts = EXCLUDED.ts, domain = EXCLUDED.domain,
            interval_id = EXCLUDED.interval_id;
    END IF;
    IF dedup_put IS NOT NULL THEN
        -- a plain INSERT first: its unique index checks each id as it inserts, where ON CONFLICT first
        -- looks every id up and then inserts it speculatively (about half the statement's time again);
        -- an id already stored (a batch applied again) rolls the plain one back and the ids go in with
        -- ON CONFLICT, as before
        BEGIN
            INSERT INTO dedup (computation, id, sender, produced_at, interval_id) SELECT e->>0, e->>1, e->>2,
                (e->>3)::bigint, (e->>4)::int FROM json_array_elements(dedup_put) AS e;
        EXCEPTION WHEN unique_violation THEN
            INSERT INTO dedup (computation, id, sender, produced_at, interval_id) SELECT e->>0, e->>1, e->>2,
                (e->>3)::bigint, (e->>4)::int FROM json_array_elements(dedup_put) AS e
                ON CONFLICT (computation, id) DO NOTHING;
        END;
    END IF;
    IF batch_put IS NOT NULL THEN
        INSERT INTO production_batches (sender, interval_id, batch, meta, payload)
            SELECT e->>0, (e->>1)::int, e->>2, decode(e->>3, 'hex'), decode(e->>4, 'hex')
            FROM json_array_elements(batch_put) AS e
            ON CONFLICT (sender, interval_id, batch) DO NOTHING;
    END IF;
    IF batch_del IS NOT NULL THEN
        DELETE FROM production_batches WHERE (sender, interval_id, batch) IN
            (SELECT e->>0, (e->>1)::int, e->>2 FROM json_array_elements(batch_del) AS e);
    END IF;
    IF batch_ack IS NOT NULL THEN
        UPDATE production_batches AS b SET acked = b.acked || u.chunk
            FROM (SELECT e->>0 AS sender, (e->>1)::int AS interval_id, e->>2 AS batch, e->>3 AS chunk
                  FROM json_array_elements(batch_ack) AS e) AS u
            WHERE b.sender = u.sender AND b.interval_id = u.interval_id AND b.batch = u.batch;
    END IF;
    IF aside IS NOT NULL THEN
        INSERT INTO set_aside (computation, id, key, interval_id, error, attempts, value, ts, sender, produced_at)
            SELECT e->>0, e->>1, e->>2, (e->>3)::int, e->>4, (e->>5)::int, decode(e->>6, 'hex'), (e->>7)::bigint,
            e->>8, (e->>9)::bigint FROM json_array_elements(aside) AS e
            ON CONFLICT (computation, id) DO UPDATE SET error = EXCLUDED.error, attempts = EXCLUDED.attempts;
    END IF;
END
$fn$"""
_COMMIT = "SELECT commit_v2(%s::json, %s::json, %s::json, %s::json, %s::json, %s::json, %s::json, %s::json, %s::json, %s::json)"
_STALE = "MW001"
"""The SQLSTATE the commit function raises when a sequencer is stale (the whole call rolls back)."""
_BATCH_GET = "SELECT batch, meta, payload, acked FROM production_batches WHERE sender = %s AND interval_id = %s"
_LANDED = ("SELECT count(*) FROM dedup WHERE (computation, id) IN "
           "(SELECT * FROM unnest(%b::text[], %b::text[]))")


@dataclass
class NetEffect:
    """What a batch of writes leaves behind, with no two changes to the same row (so each table's
    changes can go out as one statement, in any order). Productions are per sender interval: the new ones
    (by id, in order) and the acked ones, and ``batches`` names the row each sender interval's new ones go
    into (chosen once per commit, so a retried attempt writes the same row again)."""
    sequencers: set[tuple[str, int, int]] = field(default_factory=set)
    state_put: dict[tuple[str, str], bytes] = field(default_factory=dict)
    state_del: set[tuple[str, str]] = field(default_factory=set)
    timer_put: dict[tuple[str, str, str], tuple[int, str, int]] = field(default_factory=dict)
    timer_del: set[tuple[str, str, str]] = field(default_factory=set)
    dedup: dict[tuple[str, str], tuple[str, str, str, int, int]] = field(default_factory=dict)  # -> its row
    prod_put: dict[tuple[str, int], dict[str, StoredProduction]] = field(default_factory=dict)
    prod_done: dict[tuple[str, int], set[str]] = field(default_factory=dict)
    set_aside: dict[tuple[str, str], tuple[SetAsideRecord, int]] = field(default_factory=dict)
    batches: dict[tuple[str, int], str] = field(default_factory=dict)
    plan: _Plan | None = None


def fold(writes: list[Write]) -> NetEffect:
    """The net effect of applying ``writes`` one after the other, in the order the SQLite store applies
    each write's parts (state, deleted timers, set timers, ids, productions, acked productions)."""
    n = NetEffect()
    seqs, state_put, state_del, dedup = n.sequencers, n.state_put, n.state_del, n.dedup
    for w in writes:
        c = w.computation
        seqs.add((c, w.interval, w.sequencer))
        if w.key is not None:
            sk = (c, w.key)
            st = w.state
            if st is None:
                state_put.pop(sk, None)
                state_del.add(sk)
            elif not isinstance(st, _Keep):
                if state_del:
                    state_del.discard(sk)
                state_put[sk] = bytes(st)
            for tag in w.timers_deleted:
                n.timer_put.pop((c, w.key, tag), None)
                n.timer_del.add((c, w.key, tag))
            for tag, ts, domain in w.timers_set:
                n.timer_del.discard((c, w.key, tag))
                n.timer_put[(c, w.key, tag)] = (ts, domain, w.interval)
            iv = w.interval
            for rid, sender, at in w.processed:
                dedup[(c, rid)] = (c, rid, sender, at, iv)      # the row as the statement takes it
        if w.productions:
            pair = (c, w.interval)
            puts = n.prod_put.get(pair)
            if puts is None:
                puts = n.prod_put[pair] = {}
            done = n.prod_done.get(pair)
            for p in w.productions:
                if done:
                    done.discard(p.id)
                puts[p.id] = p
        if w.productions_done:
            pair = (c, w.interval)
            puts = n.prod_put.get(pair)
            done = n.prod_done.get(pair)
            if done is None:
                done = n.prod_done[pair] = set()
            for pid in w.productions_done:
                if puts:
                    puts.pop(pid, None)
                done.add(pid)
        for r in w.set_aside:
            n.set_aside[(r.computation, r.id)] = (r, w.interval)
    for pair, puts in n.prod_put.items():
        if puts:
            n.batches[pair] = uuid.uuid4().hex
    return n


def pack(prods: Iterable[StoredProduction]) -> tuple[bytes, bytes]:
    """Productions as one row's ``(meta, payload)``: the fields other than the values as a JSON array of
    ``[id, stream, key, value length, timestamp, production time]``, and the values one after another."""
    prods = list(prods)
    meta = orjson.dumps([(p.id, p.stream, p.key, len(p.value), p.timestamp_us, p.produced_at_us) for p in prods])
    return meta, b"".join([p.value for p in prods])


def unpack(meta: bytes, payload: bytes, acked: str = "") -> list[StoredProduction]:
    """The productions of a row that are not acked yet."""
    gone = {i for line in acked.splitlines() for i in orjson.loads(line)}
    out, at = [], 0
    payload = bytes(payload)
    for pid, stream, key, size, ts, produced_at in orjson.loads(bytes(meta)):
        if pid not in gone:
            out.append(StoredProduction(pid, stream, key, payload[at:at + size], ts, produced_at))
        at += size
    return out


def acked_chunk(ids: Iterable[str]) -> str:
    """Ids acked in a row that still holds unacked ones: one line of JSON, appended to the row's ``acked``."""
    return orjson.dumps(list(ids)).decode() + "\n"


@dataclass
class _Plan:
    """One commit's changes to the production rows: rows to insert and delete, and what the bookkeeping
    of unacked ids becomes once the commit has landed."""
    put: list[tuple[str, int, str, bytes, bytes]] = field(default_factory=list)
    delete: list[tuple[str, int, str]] = field(default_factory=list)
    ack: list[tuple[str, int, str, str]] = field(default_factory=list)   # a row's newly acked ids (a chunk)
    removed: dict[tuple[str, int], dict[str, set[str]]] = field(default_factory=dict)   # pair -> batch -> ids


class ProductionRows:
    """Which checkpointed production is in which row, for the sender intervals this process writes (one row
    per commit and sender interval, deleted once its last production is acked). Filled by the commits that
    land here and by :meth:`PostgresStore.pending_productions` (which a new owner calls before anything
    else); a sender interval whose acked ids are not known here is read from the store first. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.rows: dict[tuple[str, int], dict[str, set[str]]] = {}    # pair -> batch -> unacked ids
        self.where: dict[tuple[str, int], dict[str, str]] = {}        # pair -> id -> batch
        self.loaded: set[tuple[str, int]] = set()                     # pairs read from the store

    def load(self, pair: tuple[str, int], rows: dict[str, list[str]]) -> None:
        """What the store holds for ``pair`` now (batch -> ids), replacing what was known."""
        with self._lock:
            self.rows[pair] = {b: set(ids) for b, ids in rows.items()}
            self.where[pair] = {i: b for b, ids in rows.items() for i in ids}
            self.loaded.add(pair)

    def unknown(self, net: NetEffect) -> list[tuple[str, int]]:
        """Sender intervals with acked ids in no known row that were never read from the store."""
        with self._lock:
            out = []
            for pair, done in net.prod_done.items():
                if pair in self.loaded:
                    continue
                where = self.where.get(pair, {})
                if any(i not in where for i in done):
                    out.append(pair)
            return out

    def plan(self, net: NetEffect) -> _Plan:
        """The rows ``net`` inserts and deletes: a row goes when every id in it is acked (or written again
        into this commit's row)."""
        plan = _Plan()
        with self._lock:
            for pair in set(net.prod_done) | set(net.prod_put):
                rows, where = self.rows.get(pair, {}), self.where.get(pair, {})
                gone: dict[str, set[str]] = {}
                for ids in (net.prod_done.get(pair, ()), net.prod_put.get(pair, ())):
                    for i in ids:
                        b = where.get(i)
                        if b is not None:
                            gone.setdefault(b, set()).add(i)
                for b, ids in gone.items():
                    if len(rows[b]) == len(ids):
                        plan.delete.append((pair[0], pair[1], b))
                    else:
                        plan.ack.append((pair[0], pair[1], b, acked_chunk(ids)))
                if gone:
                    plan.removed[pair] = gone
                puts = net.prod_put.get(pair)
                if puts:
                    plan.put.append((pair[0], pair[1], net.batches[pair], *pack(puts.values())))
        return plan

    def landed(self, net: NetEffect, plan: _Plan) -> None:
        """The commit of ``plan`` landed: its acked ids leave their rows, its new row holds its ids."""
        with self._lock:
            for pair, gone in plan.removed.items():
                rows, where = self.rows.setdefault(pair, {}), self.where.setdefault(pair, {})
                for b, ids in gone.items():
                    left = rows.get(b)
                    if left is not None:
                        left -= ids
                        if not left:
                            del rows[b]
                    for i in ids:
                        if where.get(i) == b:
                            del where[i]
            for pair, batch in net.batches.items():
                ids = net.prod_put[pair]
                self.rows.setdefault(pair, {})[batch] = set(ids)
                where = self.where.setdefault(pair, {})
                for i in ids:
                    where[i] = batch


def _json(rows: list) -> str:
    return orjson.dumps(rows).decode()


def _columns(rows, width: int) -> list[list]:
    cols: list[list] = [[] for _ in range(width)]
    for row in rows:
        for col, v in zip(cols, row):
            col.append(v)
    return cols


def commit_arguments(n: NetEffect) -> list[str | None]:
    """The arguments of the commit function (see ``_COMMIT``) for a batch's net effect: each part one JSON
    array of arrays (``bytea`` as hex), encoded in one ``orjson`` call (psycopg dumps an array parameter
    element by element in Python: about 14 µs an array, more than the rest of a small commit's Python);
    an empty part is NULL (its statement is skipped)."""
    wanted: dict[tuple[str, int], int] = {}
    for c, i, seq in n.sequencers:
        wanted[(c, i)] = seq
    plan = n.plan
    return [_json([(c, i, seq) for (c, i), seq in wanted.items()]),
            _json([(c, k, v.hex()) for (c, k), v in n.state_put.items()]) if n.state_put else None,
            _json(list(n.state_del)) if n.state_del else None,
            _json(list(n.timer_del)) if n.timer_del else None,
            _json([(c, k, t, ts, d, iv) for (c, k, t), (ts, d, iv) in n.timer_put.items()]) if n.timer_put else None,
            _json(list(n.dedup.values())) if n.dedup else None,
            _json([(s, i, b, meta.hex(), payload.hex()) for s, i, b, meta, payload in plan.put])
            if plan is not None and plan.put else None,
            _json(plan.delete) if plan is not None and plan.delete else None,
            _json(plan.ack) if plan is not None and plan.ack else None,
            _json([(r.computation, r.id, r.key, iv, r.error, r.attempts, r.value.hex(), r.timestamp_us, r.sender,
                    r.produced_at_us) for r, iv in n.set_aside.values()]) if n.set_aside else None]


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
    abandoned: int = 0
    """Calls given up (not tried again) because the process was stopping."""
    interrupted: int = 0
    """Calls in progress cut off by :meth:`PostgresStore.interrupt`."""


class PostgresStore(Store):
    """See the module docstring. Thread-safe: each call takes a connection from a small per-process pool."""

    interruptible = True

    def __init__(self, conninfo: str, schema: str = DEFAULT_SCHEMA, retry_s: float = DEFAULT_RETRY_S,
                 connect_timeout_s: int = 5, idle_in_transaction_s: float = DEFAULT_IDLE_IN_TRANSACTION_S) -> None:
        if not _IDENT.match(schema):
            raise ValueError(f"schema {schema!r} must be a lower-case SQL identifier")
        if not idle_in_transaction_s >= 0:
            raise ValueError(f"idle_in_transaction_s must be 0 (off) or a positive number of seconds, "
                             f"not {idle_in_transaction_s!r}")
        self.conninfo, self.schema, self.retry_s = conninfo, schema, retry_s
        self.idle_in_transaction_s = idle_in_transaction_s
        self.connect_timeout_s = connect_timeout_s
        self._idle: list[psycopg.Connection] = []
        self._busy: set[psycopg.Connection] = set()     # connections in a call now (see interrupt)
        self._pool_lock = threading.Lock()
        self._closed = False
        self._giving_up = threading.Event()      # never set unless give_up_when is called
        self._interrupted = False
        self._rows = ProductionRows()
        self._counts = {"commits": 0, "writes": 0, "fenced": 0, "retries": 0, "already_applied": 0,
                        "connections_opened": 0, "abandoned": 0, "interrupted": 0}
        self._retry(self._create_schema)

    @classmethod
    def from_url(cls, url: str) -> "PostgresStore":
        """``postgresql://...?schema=NAME&retry_s=SECONDS&idle_in_transaction_s=SECONDS``; the other
        parameters go to libpq."""
        parts = urlsplit(url)
        params = dict(parse_qsl(parts.query))
        schema = params.pop("schema", DEFAULT_SCHEMA)
        seconds = {}
        for name, default in (("retry_s", DEFAULT_RETRY_S), ("idle_in_transaction_s", DEFAULT_IDLE_IN_TRANSACTION_S)):
            try:
                seconds[name] = float(params.pop(name, default))
            except ValueError:
                raise ValueError(f"store url {url!r}: {name} must be a number of seconds") from None
            if not seconds[name] >= 0:
                raise ValueError(f"store url {url!r}: {name} must not be negative")
        return cls(urlunsplit(parts._replace(query=urlencode(params))), schema=schema, **seconds)

    # ---- connections and retries ------------------------------------------------------------------
    def _connect(self) -> psycopg.Connection:
        conn = psycopg.connect(self.conninfo, autocommit=True, connect_timeout=self.connect_timeout_s)
        conn.execute(f"SET search_path TO {self.schema}")
        # a worker stopped inside a transaction (SIGSTOP, a hung host) would hold the row locks it took
        # there, and a new owner's claim of its intervals would wait for them for ever; the server ends
        # such a session, and the stopped worker's commit, if it ever resumes, is retried and fenced
        conn.execute(f"SET idle_in_transaction_session_timeout = {round(self.idle_in_transaction_s * 1000)}")
        # the commit's fence reads the sequencers after its locks under a fresh snapshot: READ COMMITTED
        # (a server whose default is stricter would give the whole call the snapshot it began with)
        conn.execute("SET default_transaction_isolation = 'read committed'")
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
        with self._pool_lock:
            if self._interrupted:
                conn.close()
                raise StoreAbandoned("the store was interrupted: its process is stopping")
            self._busy.add(conn)
        try:
            yield conn
        except psycopg.OperationalError:
            self._release(conn)
            conn.close()
            self._drop_idle()  # the server went away: the idle connections are as dead as this one
            raise
        except BaseException:
            self._release(conn)
            conn.close()
            raise
        with self._pool_lock:
            self._busy.discard(conn)
            if self._closed or self._interrupted:
                conn.close()
            else:
                self._idle.append(conn)

    def _release(self, conn: psycopg.Connection) -> None:
        """Out of :attr:`_busy` before it is closed (its socket number may be reused at once)."""
        with self._pool_lock:
            self._busy.discard(conn)

    def _drop_idle(self) -> None:
        with self._pool_lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _retry(self, fn, *args):
        """``fn(conn, attempt, *args)`` on a pooled connection, again on lost connections for ``retry_s``
        (none once the process is stopping: :class:`StoreAbandoned`). The first attempt is a plain call
        (tenacity's loop costs about 25 µs a call, as much as a small commit's own Python)."""
        started = time.monotonic()
        try:
            try:
                with self._conn() as conn:
                    return fn(conn, 1, *args)
            except _LOST as e:
                left = self.retry_s - (time.monotonic() - started)
                if self._giving_up.is_set() or left <= 0:
                    raise
                first = e
            self._count("retries")
            if self._giving_up.wait(_FIRST_WAIT_S):
                raise first     # stopping meanwhile: no second attempt (see below)
            for attempt in Retrying(retry=retry_if_exception_type(_LOST),
                                    wait=wait_exponential(multiplier=2 * _FIRST_WAIT_S, max=2.0),
                                    stop=stop_after_delay(max(0.0, left - _FIRST_WAIT_S))
                                    | stop_when_event_set(self._giving_up),
                                    sleep=self._giving_up.wait, reraise=True,
                                    before_sleep=lambda _: self._count("retries")):
                with attempt:
                    with self._conn() as conn:
                        return fn(conn, attempt.retry_state.attempt_number + 1, *args)
        except _LOST as e:
            if not self._giving_up.is_set():
                raise
            self._count("abandoned")
            raise StoreAbandoned(f"PostgreSQL did not answer and the process is stopping: {_first_line(e)}") from e
        except StoreAbandoned:
            self._count("abandoned")
            raise

    def give_up_when(self, event: threading.Event) -> None:
        self._giving_up = event

    def interrupt(self) -> None:
        """See :meth:`Store.interrupt`: every connection in a call has its socket shut down (the call
        waiting on it wakes with a lost connection, which is not tried again), and new calls are refused."""
        with self._pool_lock:
            self._interrupted = True
            busy = list(self._busy)
            for conn in busy:   # under the lock: no socket of these is closed (and its number reused) meanwhile
                try:
                    with socket.socket(fileno=os.dup(conn.pgconn.socket)) as sock:
                        sock.shutdown(socket.SHUT_RDWR)
                except (OSError, psycopg.Error):
                    pass        # closed meanwhile: nothing to cut off
            self._counts["interrupted"] += len(busy)
        self._drop_idle()

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
            conn.execute(_COMMIT_FN)
            conn.execute("INSERT INTO meta VALUES ('identity', %s) ON CONFLICT (name) DO NOTHING", (uuid.uuid4().hex,))
            self.identity = conn.execute("SELECT value FROM meta WHERE name = 'identity'").fetchone()[0]
            # the commit function of the version before: its fence (a row lock) does not hold against this
            # version's claims (which take an advisory lock), so a process still calling it fails loudly
            conn.execute(f"DROP FUNCTION IF EXISTS commit_v1({', '.join(['json'] * 10)})")
            if conn.execute("SELECT to_regclass(%s)", (f"{self.schema}.productions",)).fetchone()[0] is not None:
                self._upgrade_productions(conn)

    @staticmethod
    def _upgrade_productions(conn: psycopg.Connection) -> None:
        """A schema written before productions were stored a row per commit had a row per production in
        ``productions``: move them, one row per sender interval, and drop that table (in the schema's
        creating transaction; stop every worker of the older version before starting this one)."""
        per: dict[tuple[str, int], list[StoredProduction]] = {}
        for sender, iv, pid, stream, key, value, ts, at in conn.execute(
                "SELECT sender, interval_id, id, stream, key, value, ts, produced_at FROM productions "
                "ORDER BY produced_at, id").fetchall():
            per.setdefault((sender, iv), []).append(StoredProduction(pid, stream, key, bytes(value), ts, at))
        rows = [(sender, iv, "upgraded", *pack(prods)) for (sender, iv), prods in per.items()]
        if rows:
            conn.execute(_BATCH_PUT, _columns(rows, 5))
        conn.execute("DROP TABLE productions")

    # ---- the contract --------------------------------------------------------------------------------
    def claim(self, computation: str, interval: int, sequencer: int | None = None) -> int:
        # the row first (a claim waits on a row lock as before), then the interval's fence lock exclusively:
        # it waits for every commit in flight to the interval, and a commit that asks for it later waits
        # for this claim and then reads its sequencer (see _COMMIT_FN)
        if sequencer is None:
            stmt, args = ("INSERT INTO intervals VALUES (%s, %s, 1) ON CONFLICT (computation, interval_id) "
                          "DO UPDATE SET sequencer = intervals.sequencer + 1 RETURNING sequencer",
                          (computation, interval))
        else:   # a master's sequencer: stored unless a newer owner's is (then no row comes back)
            stmt, args = ("INSERT INTO intervals VALUES (%s, %s, %s) ON CONFLICT (computation, interval_id) "
                          "DO UPDATE SET sequencer = EXCLUDED.sequencer WHERE intervals.sequencer <= "
                          "EXCLUDED.sequencer RETURNING sequencer", (computation, interval, sequencer))

        def claim(conn: psycopg.Connection, _attempt: int):
            with conn.transaction():
                row = conn.execute(stmt, args).fetchone()
                if row is not None:
                    conn.execute(_FENCE_LOCK, (computation, interval))
                return row
        row = self._retry(claim)
        if row is None:
            raise StaleSequencer(f"claim of {computation!r} interval {interval} with sequencer {sequencer} "
                                 f"refused: a newer owner holds it")
        return row[0]

    def commit(self, writes: list[Write]) -> None:
        if not writes:
            return
        net = fold(writes)
        landed = self._retry(self._commit, net)
        if net.plan is not None:       # applied now or by an attempt whose answer was lost: either way, in
            self._rows.landed(net, net.plan)
        if landed:
            self._count("commits")
            self._count("writes", len(writes))

    def _commit(self, conn: psycopg.Connection, attempt: int, net: NetEffect) -> bool:
        if attempt > 1 and net.dedup and self._landed(conn, net):
            self._count("already_applied")
            return False
        if net.plan is None and (net.prod_put or net.prod_done):
            # (planned once: the bookkeeping changes only when a commit lands, so every attempt of this
            # one would plan the same rows, and an attempt whose answer was lost applied this plan)
            for sender, interval in self._rows.unknown(net):
                self._read_rows(conn, sender, interval)
            net.plan = self._rows.plan(net)
        try:
            conn.execute(_COMMIT, commit_arguments(net), prepare=True)
        except psycopg.Error as e:
            if e.sqlstate != _STALE:
                raise
            net.plan = None
            self._count("fenced")
            raise StaleSequencer(e.diag.message_primary) from None
        return True

    @staticmethod
    def _landed(conn: psycopg.Connection, net: NetEffect) -> bool:
        """Whether every dedup id of the batch is stored: the batch committed (it is all or nothing)."""
        found = conn.execute(_LANDED, _columns(net.dedup, 2)).fetchone()[0]
        return found == len(net.dedup)

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
            "SELECT key, tag, ts, domain FROM timers WHERE computation = %s AND interval_id = ANY(%b::int[])",
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
            "SELECT id FROM dedup WHERE computation = %s AND interval_id = ANY(%b::int[])",
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
                                    "AND interval_id = ANY(%b::int[])", (computation, sender, floor_us, mine)).rowcount
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
        """Also tells this process which rows hold them (a new owner calls this before acking any)."""
        return self._retry(lambda conn, _: self._read_rows(conn, sender, interval))

    def _read_rows(self, conn: psycopg.Connection, sender: str, interval: int) -> list[StoredProduction]:
        rows = conn.execute(_BATCH_GET, (sender, interval)).fetchall()
        by_id: dict[str, StoredProduction] = {}
        members: dict[str, list[str]] = {}
        for batch, meta, payload, acked in rows:
            prods = unpack(meta, payload, acked)
            members[batch] = [p.id for p in prods]
            for p in prods:
                by_id.setdefault(p.id, p)   # written again by a later commit: the same production
        self._rows.load((sender, interval), members)
        return sorted(by_id.values(), key=lambda p: (p.produced_at_us, p.id))

    def read_watermarks(self) -> dict[str, int]:
        return dict(self._retry(lambda conn, _: conn.execute("SELECT name, wm FROM watermarks").fetchall()))

    def save_watermarks(self, watermarks: dict[str, int]) -> None:
        if not watermarks:
            return
        self._retry(lambda conn, _: conn.execute(
            "INSERT INTO watermarks (name, wm) SELECT * FROM unnest(%b::text[], %b::bigint[]) "
            "ON CONFLICT (name) DO UPDATE SET wm = GREATEST(watermarks.wm, EXCLUDED.wm)",
            _columns(watermarks.items(), 2)))

    def report_watermarks(self, reports: Iterable[tuple]) -> None:
        last = keep_newest({}, reports)      # one row per interval (one statement cannot change a row twice)
        rows = list(last.values())
        if not rows:
            return
        self._retry(lambda conn, _: conn.execute(_REPORT, _columns(rows, 6)))

    def read_watermark_reports(self) -> list[tuple]:
        return self._retry(lambda conn, _: [tuple(r) for r in conn.execute("SELECT * FROM wm_reports").fetchall()])

    def report_and_read_watermarks(self, reports: Iterable[tuple]) -> list[tuple]:
        """One statement: the rows the reports changed (after the fences, as :meth:`report_watermarks`) and
        every other interval's stored report."""
        rows = list(keep_newest({}, reports).values())
        if not rows:
            return self.read_watermark_reports()
        return self._retry(lambda conn, _: [tuple(r) for r in conn.execute(
            "WITH w AS (" + _REPORT + " RETURNING wm_reports.*) SELECT * FROM w UNION ALL SELECT * FROM wm_reports r "
            "WHERE NOT EXISTS (SELECT 1 FROM w WHERE w.name = r.name AND w.interval_id = r.interval_id)",
            _columns(rows, 6)).fetchall()])

    def record_grants(self, grants: Iterable[tuple[str, int, int]]) -> None:
        last: dict[tuple[str, int], int] = {}     # one row per interval (one statement cannot change a row twice)
        for c, i, seq in grants:
            last[(c, i)] = max(seq, last.get((c, i), 0))
        if not last:
            return
        rows = [(c, i, seq) for (c, i), seq in sorted(last.items())]
        self._retry(lambda conn, _: conn.execute(
            "INSERT INTO wm_granted SELECT * FROM unnest(%b::text[], %b::int[], %b::bigint[]) "
            "ON CONFLICT (name, interval_id) DO UPDATE SET sequencer = EXCLUDED.sequencer "
            "WHERE wm_granted.sequencer < EXCLUDED.sequencer", _columns(rows, 3)))

    def report_cuts(self, reports: Iterable[tuple]) -> None:
        last = keep_newest({}, reports)      # one row per interval (one statement cannot change a row twice)
        if not last:
            return
        self._retry(lambda conn, _: conn.execute(
            "INSERT INTO wm_cuts SELECT r.* FROM unnest(%b::text[], %b::int[], %b::bigint[], %b::bigint[], "
            "%b::bigint[]) AS r (name, interval_id, sequencer, epoch, cut) " + _CLAIMED +
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
            "INSERT INTO production_floors SELECT * FROM unnest(%b::text[], %b::int[], %b::bigint[], %b::bigint[]) "
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


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


__all__ = ["KEEP", "PostgresStatistics", "PostgresStore", "fold"]
