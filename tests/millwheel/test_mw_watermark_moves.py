"""Watermark reports and claims when intervals move under real faults: worker processes of ``millwheel
run`` (three master replicas, two workers) on the session's PostgreSQL, workers SIGSTOPped past their
lease and resumed. Every write of a watermark report is logged by a trigger in the test's schema, so what
the store accepted, and when, is read afterwards."""
from __future__ import annotations

import os
import signal
from urllib.parse import parse_qs, urlsplit

import psycopg
import pytest

from millwheel import RuntimeConfig
from millwheel._cluster import worker_status
from millwheel._routing import interval_of, slots_in
from millwheel._store import open_store
from photon import wait_until

from mw_cluster import START_S, ClusterRun

pytestmark = pytest.mark.timeout(600)

SLOTS = RuntimeConfig().intervals
"""Key intervals (slots) per computation of the runs here (the default)."""
LEASE_S = 8
"""The master's lease here (heartbeats every 2 s): long enough that a worker resumed after a move learns it
lost its intervals before the new owner's next heartbeat (the window a late report needs), and that a
worker whose claim waits keeps its intervals while records for it arrive."""

LOG_REPORTS = """
CREATE TABLE report_log (id BIGSERIAL PRIMARY KEY, name TEXT, interval_id INTEGER, sequencer BIGINT, low BIGINT);
CREATE FUNCTION log_report() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
    INSERT INTO report_log (name, interval_id, sequencer, low)
        VALUES (NEW.name, NEW.interval_id, NEW.sequencer, NEW.low);
    RETURN NEW;
END $$;
CREATE TRIGGER log_report AFTER INSERT OR UPDATE ON wm_reports FOR EACH ROW EXECUTE FUNCTION log_report();
"""


def _connect(pg_url: str) -> psycopg.Connection:
    parts = urlsplit(pg_url)
    schema = parse_qs(parts.query)["schema"][0]
    return psycopg.connect(parts._replace(query="").geturl(), autocommit=True,
                           options=f"-c search_path={schema}")


def _end_sessions(db: psycopg.Connection, pg_url: str, pid: int) -> None:
    """End the store sessions of stopped process ``pid``, as ``idle_in_transaction_session_timeout`` would:
    one stopped inside a transaction holds its row locks (share locks on its intervals' rows), and a new
    owner's claim of those intervals would wait for it. Resumed, it retries on new connections."""
    port = urlsplit(pg_url).port
    sockets = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            sockets.add(target[len("socket:["):-1])
    mine = []
    with open(f"/proc/{pid}/net/tcp") as table:          # the server listens on 127.0.0.1
        for line in table.readlines()[1:]:
            local, remote, inode = line.split()[1], line.split()[2], line.split()[9]
            if inode in sockets and int(remote.rsplit(":", 1)[1], 16) == port:
                mine.append(int(local.rsplit(":", 1)[1], 16))
    assert mine, "the stopped process has store sessions"
    db.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE client_port = ANY(%s)", (mine,))


def _slots(run: ClusterRun, intervals) -> dict[tuple[str, int], int]:
    """Each (computation, slot)'s sequencer in ``intervals`` (``(computation, lo, hi, sequencer)`` each; an
    injector: its one interval, 0)."""
    injectors = run.topology().injectors
    out = {}
    for name, lo, hi, seq in intervals:
        for s in [0] if name in injectors else slots_in(lo, hi, SLOTS):
            out[(name, s)] = seq
    return out


def test_a_stopped_owners_late_reports_after_its_intervals_moved_are_not_stored(reachable_tmp, pg_url,
                                                                                 cluster_runs, stopped):
    """The worker holding the injector is SIGSTOPped past its lease; the master moves its intervals to the
    other worker, which is stopped too right after (before its next heartbeat claims them); the first is
    resumed. Its injector, which checks no lease, keeps stepping until the heartbeat gives it up, and its
    estimate (the clock, input caught up) changes at every step, so it reports under its old sequencer.
    Before the fix the store took those reports (no newer claim yet, and a newer report is what the store
    compared with): every process's authority would read the old owner's value for an interval the master
    had given away. Now its process writes no report while its lease has lapsed, and drops those of
    intervals it no longer holds; none under an older sequencer than the master's map lands after the move.
    (The heartbeat may give the injector up before it steps: then the round shows nothing, and another
    round is run, up to three.) Then the windows equal the batch, each once."""
    run = ClusterRun(reachable_tmp, pg_url, workers=2, n_clicks=2000, files=4,
                     master_options=(f"lease_us={LEASE_S * 1_000_000}",))
    cluster_runs.append(run)
    moves = []            # (log id at the move, the stopped worker's old sequencers) per round
    with _connect(pg_url) as db:
        wait_until(lambda: db.execute("SELECT to_regclass('wm_reports')").fetchone()[0] is not None, START_S,
                   message="the store's tables")
        db.execute(LOG_REPORTS)
        # a round shows the fix only if the resumed worker's injector stepped before its heartbeat gave it up
        # (a race in the worker): up to three rounds, until one did
        for _ in range(3):
            wait_until(lambda: any(w["injectors"].get("joined", {}).get("caught_up") for w in run.workers()),
                       START_S, message="the injector caught up")
            victim = next(w for w in run.workers() if "joined" in w["injectors"])
            other = next(w for w in run.workers() if w["worker"] != victim["worker"])
            held = _slots(run, [(iv["computation"], iv["lo"], iv["hi"], iv["sequencer"])
                                for iv in victim["intervals"]])
            os.kill(victim["pid"], signal.SIGSTOP)
            stopped.append(victim["pid"])
            _end_sessions(db, pg_url, victim["pid"])
            wait_until(lambda: all(iv.worker and iv.worker != victim["worker"] for iv in run.client.interval_map()),
                       LEASE_S * 4, interval=0.02, message="the stopped worker's intervals moved")
            os.kill(other["pid"], signal.SIGSTOP)         # its claims of them wait (its next heartbeat is later)
            stopped.append(other["pid"])
            _end_sessions(db, pg_url, other["pid"])
            moves.append((db.execute("SELECT coalesce(max(id), 0) FROM report_log").fetchone()[0], held))
            current = _slots(run, [(iv.computation, iv.lo, iv.hi, iv.sequencer) for iv in run.client.interval_map()])
            assert all(current[k] > seq for k, seq in held.items()), "every interval it held has a new sequencer"
            os.kill(victim["pid"], signal.SIGCONT)
            wait_until(lambda: worker_status(victim["address"]).get("incarnation", 0) > victim["incarnation"], 60,
                       message="the resumed worker learned it lost its intervals and registered again")
            os.kill(other["pid"], signal.SIGCONT)
            try:
                wait_until(lambda: _counter(worker_status(victim["address"]), "reports_dropped")
                           > _counter(victim, "reports_dropped"), 5, message="its late reports dropped")
                kept_out = True
            except TimeoutError:
                kept_out = False
            _assert_none_stale(db, moves)        # its late reports would be logged by now
            if kept_out:
                break
        else:
            pytest.fail("in three rounds the resumed worker never had a late report to keep out")
        run.wait_idle()
        run.check()
        _assert_none_stale(db, moves)


def _assert_none_stale(db: psycopg.Connection, moves: list) -> None:
    """No report under a stopped worker's old sequencers was stored after its intervals moved. (The other
    worker may write some under sequencers the master changed meanwhile, by merging its idle intervals,
    until its next heartbeat: the authorities that read the map ignore those.)"""
    stale = [r for moved_at, held in moves
             for r in db.execute("SELECT name, interval_id, sequencer, low FROM report_log WHERE id > %s",
                                 (moved_at,)).fetchall() if held.get((r[0], r[1]), -1) >= r[2]]
    assert not stale, f"a stopped worker's reports under its old sequencers stored after the move: {stale[:5]}"


CLAIMS_WAITING = ("SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                  "AND query LIKE 'INSERT INTO intervals%%' ORDER BY query_start")


def _counter(status: dict, name: str, section: str = "counters") -> int:
    return status.get(section, {}).get(name, 0)


def test_a_claim_refused_drops_the_records_kept_for_it_and_their_senders_send_them_again(
        reachable_tmp, pg_url, cluster_runs, stopped):
    """A claim refused because the store's sequencer moved on, end to end. Three workers: P holds the
    injector, Q holds ``windows`` intervals, X is the third. Q is SIGSTOPped past its lease; X is stopped
    too just before Q's lease ends, and once the master has given Q's intervals to P and X, the test takes
    a share lock on the store's rows of the ``windows`` slots given to X (commits go on under share
    locks; a claim waits) and resumes X. X's claim of them waits, while P's injector already sends X their
    records, which X keeps for the claim. X is SIGSTOPped there, past its lease, its store sessions (the
    waiting claim's among them) are ended and the lock released; the master gives X's intervals to P,
    which claims them under newer sequencers. X, resumed, retries its claim on a new connection under its
    old sequencer: refused. X drops the records kept for it uncommitted and asks their sender to send them
    again, and the windows equal the batch, each once. (P sends again each copy still unacked when the
    request comes; it may have sent them all already, to itself, when its map read told it the slot's
    owner had changed, and then the request sends nothing.)"""
    # one advertiser per slot of ``windows``, so that every slot, the one whose claim waits included, has
    # records; and enough input that the injector still sends when the claim waits (tens of seconds in)
    names = {}
    for n in range(1000):
        names.setdefault(interval_of(f"adv-{n}", SLOTS), f"adv-{n}")
    run = ClusterRun(reachable_tmp, pg_url, workers=3, n_clicks=100000, files=16, names=sorted(names.values()),
                     master_options=(f"lease_us={LEASE_S * 1_000_000}",))
    cluster_runs.append(run)
    wait_until(lambda: run.processed() > 500 and any("joined" in w["injectors"] for w in run.workers()), START_S,
               message="records flowing")
    workers = run.workers()
    p = next(w for w in workers if "joined" in w["injectors"])
    q = next((w for w in workers if w is not p and any(iv["computation"] == "windows" for iv in w["intervals"])),
             None)
    assert q is not None, f"no worker but the injector's holds a windows interval: {run.why_busy()}"
    x = next(w for w in workers if w is not p and w is not q)
    with _connect(pg_url) as db, _connect(pg_url) as lock:
        os.kill(q["pid"], signal.SIGSTOP)
        stopped.append(q["pid"])
        _end_sessions(db, pg_url, q["pid"])
        q_until = max(iv.lease_until_us for iv in run.client.interval_map() if iv.worker == q["worker"])
        wait_until(lambda: _master_now(run) > q_until - 1_500_000, LEASE_S * 2, message="Q's lease nearly over")
        os.kill(x["pid"], signal.SIGSTOP)            # for a moment: it must not claim before the lock is taken
        stopped.append(x["pid"])
        wait_until(lambda: all(iv.worker and iv.worker != q["worker"] for iv in run.client.interval_map()),
                   LEASE_S * 2, interval=0.02, message="Q's intervals given to the others")
        claimed = dict(db.execute("SELECT interval_id, sequencer FROM intervals WHERE computation = 'windows'")
                       .fetchall())
        given = [s for iv in run.client.interval_map() if iv.computation == "windows" and iv.worker == x["worker"]
                 for s in slots_in(iv.lo, iv.hi, SLOTS) if claimed.get(s, 0) < iv.sequencer]
        assert given, f"no windows interval of Q given to X: {run.why_busy()}"
        lock.autocommit = False
        lock.execute("SELECT * FROM intervals WHERE computation = 'windows' AND interval_id = ANY(%s) FOR SHARE",
                     (given,))
        os.kill(x["pid"], signal.SIGCONT)
        wait_until(lambda: "unreachable" not in worker_status(x["address"]), 30, message="X resumed")
        before = worker_status(x["address"])
        wait_until(lambda: db.execute(CLAIMS_WAITING).fetchall(), 60, interval=0.05,
                   message="X's claim of a windows slot waiting")
        try:
            wait_until(lambda: _counter(worker_status(x["address"]), "taken_before_claim")
                       > _counter(before, "taken_before_claim"), 30, message="records kept for the claim")
        except TimeoutError:
            raise TimeoutError(f"no records kept for the claim: {run.why_busy()}") from None
        os.kill(x["pid"], signal.SIGSTOP)
        _end_sessions(db, pg_url, x["pid"])           # the waiting claim's session too
        lock.rollback()                                # the lock released
        wait_until(lambda: all(iv.worker == p["worker"] for iv in run.client.interval_map()
                               if iv.computation == "windows"), LEASE_S * 3,
                   message="X's windows intervals given to P")
        wait_until(lambda: _windows_claimed(db, run), 60, message="every windows slot claimed by P")
        os.kill(x["pid"], signal.SIGCONT)
    wait_until(lambda: _counter(worker_status(x["address"]), "stale_grants") > _counter(before, "stale_grants"),
               60, message="the claim refused")
    wait_until(lambda: _counter(worker_status(x["address"]), "dropped_for_refused_claims") > 0, 30,
               message="the records kept for the refused claim dropped")
    wait_until(lambda: _counter(worker_status(x["address"]), "resend_requests", "transport")
               > _counter(before, "resend_requests", "transport"), 30, message="their sender asked for them again")
    os.kill(q["pid"], signal.SIGCONT)
    run.wait_idle()
    run.check()


def _master_now(run: ClusterRun) -> int:
    """The master's time (its leader's clock, as every replica applied it)."""
    return max((r.get("master_now_us", 0) for r in run.client.status()), default=0)


def _windows_claimed(db: psycopg.Connection, run: ClusterRun) -> bool:
    """Every slot of ``windows`` is claimed in the store under its sequencer in the master's map."""
    return not _windows_unclaimed(db, run)


def _windows_unclaimed(db: psycopg.Connection, run: ClusterRun) -> set:
    want = {(s, iv.sequencer) for iv in run.client.interval_map() if iv.computation == "windows"
            for s in slots_in(iv.lo, iv.hi, SLOTS)}
    got = set(db.execute("SELECT interval_id, sequencer FROM intervals WHERE computation = 'windows'").fetchall())
    return want - got


def test_a_report_statement_resumed_after_its_interval_moved_is_refused_once_any_process_read_the_move(
        reachable_tmp, pg_url, cluster_runs, stopped):
    """Three workers. V, holding the injector, is SIGSTOPped past its lease; the master gives the injector
    to R, which is SIGSTOPped too before its next heartbeat claims it (its sessions ended); the third
    keeps running and reads the master's map at its heartbeat. Then a report of the injector under V's old
    sequencer is written, as the statement of V that had passed its lease check when V was stopped would
    be when V resumes (the test writes it itself: the moment of a stop inside ``_write_reports`` cannot be
    chosen). Before the fix the store took it: no newer claim yet, and the store knew nothing else of the
    master's grants. Now the third process has recorded the master's grant in the store (``wm_granted``)
    and the statement changes nothing. (If R claimed before it was stopped, the round proves nothing and
    another is run, up to three.) Then the windows equal the batch, each once."""
    run = ClusterRun(reachable_tmp, pg_url, workers=3, n_clicks=2000, files=4,
                     master_options=(f"lease_us={LEASE_S * 1_000_000}",))
    cluster_runs.append(run)
    late = open_store(pg_url)
    try:
        with _connect(pg_url) as db:
            for _ in range(3):
                wait_until(lambda: any(w["injectors"].get("joined", {}).get("caught_up") for w in run.workers()),
                           START_S, message="the injector caught up")
                workers = run.workers()
                v = next(w for w in workers if "joined" in w["injectors"])
                old = next(iv["sequencer"] for iv in v["intervals"] if iv["computation"] == "joined")
                wait_until(lambda: db.execute("SELECT sequencer FROM wm_reports WHERE name = 'joined' "
                                              "AND interval_id = 0").fetchone() == (old,), 30,
                           message="the injector reported under its sequencer")
                os.kill(v["pid"], signal.SIGSTOP)
                stopped.append(v["pid"])
                _end_sessions(db, pg_url, v["pid"])

                def injector_owner():
                    iv = next(iv for iv in run.client.interval_map() if iv.computation == "joined")
                    return iv.worker if iv.worker and iv.worker != v["worker"] else None
                wait_until(injector_owner, LEASE_S * 4, interval=0.02, message="the injector moved")
                r = next(w for w in workers if w["worker"] == injector_owner())
                os.kill(r["pid"], signal.SIGSTOP)         # its claim waits (its next heartbeat is later)
                stopped.append(r["pid"])
                _end_sessions(db, pg_url, r["pid"])
                new = next(iv.sequencer for iv in run.client.interval_map() if iv.computation == "joined")
                try:     # the third's next heartbeat reads the map (every quarter of the lease)
                    wait_until(lambda: _granted(db, "joined", 0) >= new, LEASE_S,
                               message="the third recorded the master's grant")
                except TimeoutError:
                    pass       # (before the fix nothing recorded grants; the statement below shows it)
                claimed = db.execute("SELECT sequencer FROM intervals WHERE computation = 'joined' "
                                     "AND interval_id = 0").fetchone()
                if claimed is not None and claimed[0] >= new:     # R claimed before it was stopped
                    for pid in (v["pid"], r["pid"]):
                        os.kill(pid, signal.SIGCONT)
                    wait_until(lambda: "unreachable" not in worker_status(v["address"]), 30, message="V resumed")
                    continue
                stored = db.execute("SELECT * FROM wm_reports WHERE name = 'joined' AND interval_id = 0").fetchone()
                far = stored[3] + 10 ** 12
                late.report_watermarks([("joined", 0, old, far, far, None)])
                after = db.execute("SELECT * FROM wm_reports WHERE name = 'joined' AND interval_id = 0").fetchone()
                assert after == stored, f"a report under the moved injector's old sequencer {old} was stored " \
                                        f"(the master granted {new}): {after}"
                for pid in (v["pid"], r["pid"]):
                    os.kill(pid, signal.SIGCONT)
                break
            else:
                pytest.fail("in three rounds the injector's new owner always claimed before it was stopped")
    finally:
        late.close()
    run.wait_idle()
    run.check()


def _granted(db: psycopg.Connection, name: str, interval: int) -> int:
    """The master's grant of ``interval`` of ``name`` recorded in the store (0: none, or no such table)."""
    if db.execute("SELECT to_regclass('wm_granted')").fetchone()[0] is None:
        return 0
    row = db.execute("SELECT sequencer FROM wm_granted WHERE name = %s AND interval_id = %s",
                     (name, interval)).fetchone()
    return row[0] if row else 0
