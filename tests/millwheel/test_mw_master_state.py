"""The master's placement core, without a cluster: facts in, commands out, the map's invariants under
random fact sequences (Hypothesis), replay, and the rebalancing policy's decisions and hysteresis."""
from __future__ import annotations

import ast
import random
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from millwheel import MillWheelConfigError
from millwheel._master_state import (KEY_MIN, Assign, ComputationDeclared, Heartbeat, IntervalLoad, LeaderChanged,
                                     LoadReported, MasterState, Merge, Move, PlacementPolicy, Revoke, Split,
                                     TimePassed, WorkerJoined, WorkerLeft, WorkerLoad)

pytestmark = pytest.mark.timeout(120)

S = 1_000_000
LEASE = 5 * S


def policy(**kw) -> PlacementPolicy:
    base = dict(lease_us=LEASE, cooldown_us=2 * S, load_ttl_us=30 * S)
    base.update(kw)
    return PlacementPolicy(**base)


def joined(state: MasterState, name: str, now: int, registration: str | None = None) -> int:
    state.handle(WorkerJoined(name, f"{name}:1", registration or f"{name}-reg", now))
    return state.workers[name].incarnation


def load_of(state: MasterState, worker: str, rates: dict[str, float], split_keys: dict[str, str] | None = None):
    """The load report ``worker`` would send now: its intervals (by lo) at the given rates."""
    split_keys = split_keys or {}
    view = state.view_of(worker)
    return WorkerLoad(cpu=0.5, queue=0, intervals=tuple(
        IntervalLoad(i.computation, i.lo, i.sequencer, rates.get(i.lo, 0.0), split_keys.get(i.lo, ""))
        for i in view.intervals))


def check_invariants(state: MasterState) -> None:
    for name, comp in state.computations.items():
        slots = comp.slots
        assert slots[0].lo == KEY_MIN and slots[-1].hi is None, name
        for a, b in zip(slots, slots[1:]):
            assert a.hi == b.lo, (name, a, b)
        for s in slots:
            assert s.hi is None or s.lo < s.hi, s
            assert s.sequencer <= comp.last_sequencer
        assert len({s.sequencer for s in slots}) == len(slots), "two intervals share a sequencer"
        if state.workers:
            assert all(s.worker in state.workers for s in slots), "an interval without a live owner"
        else:
            assert all(s.worker == "" for s in slots)


# ---- unit behaviour -----------------------------------------------------------------------------------

def test_every_interval_is_assigned_once_a_worker_joins_and_spread_over_workers():
    state = MasterState(policy(cooldown_us=0))
    assert state.handle(ComputationDeclared("c", ("g", "n", "t"), 1 * S)) == []    # nobody to own them yet
    assert [i.worker for i in state.interval_map("c")] == [""] * 4
    out = state.handle(WorkerJoined("w1", "h:1", "r1", 2 * S))
    assert [type(c) for c in out] == [Assign] * 4 and {c.worker for c in out} == {"w1"}
    joined(state, "w2", 3 * S)
    moves = []
    for t in range(1, 6):                                 # well within both leases
        moves += state.handle(TimePassed(3 * S + t * S // 10))
    assert len(moves) == 2 and all(isinstance(m, Move) and m.to_worker == "w2" for m in moves)
    owners = [i.worker for i in state.interval_map("c")]
    assert owners.count("w1") == owners.count("w2") == 2
    assert state.handle(TimePassed(4 * S)) == []         # balanced: 2 and 2, nothing more to move
    check_invariants(state)


def test_a_worker_whose_lease_lapses_loses_its_intervals_with_new_sequencers():
    state = MasterState(policy(cooldown_us=0))
    state.handle(ComputationDeclared("c", ("m",), 0))
    inc1 = joined(state, "w1", 1 * S)
    inc2 = joined(state, "w2", 1 * S)
    state.handle(TimePassed(1 * S))
    before = {i.lo: i for i in state.interval_map("c")}
    assert {i.worker for i in before.values()} == {"w1", "w2"}
    # w1 keeps heartbeating, w2 goes silent
    for t in (2, 3, 4, 5):
        state.handle(Heartbeat("w1", inc1, t * S))
    assert state.handle(TimePassed(1 * S + LEASE - 1)) == []          # not yet
    out = state.handle(TimePassed(1 * S + LEASE))
    lost = [i for i in before.values() if i.worker == "w2"]
    assert [(type(c), c.worker) for c in out] == [(Revoke, "w2"), (Assign, "w1")]
    after = {i.lo: i for i in state.interval_map("c")}
    for i in lost:
        assert after[i.lo].worker == "w1" and after[i.lo].sequencer > i.sequencer
    assert "w2" not in state.workers and state.statistics().expired_workers == 1
    # the silent incarnation's heartbeat is not a lease any more: it must register again
    state.handle(Heartbeat("w2", inc2, 7 * S))
    assert not state.view_of("w2", inc2).known
    check_invariants(state)


def test_registration_retried_is_one_incarnation_and_a_new_one_revokes_the_old():
    state = MasterState(policy())
    state.handle(ComputationDeclared("c", (), 0))
    inc = joined(state, "w1", 1 * S, "attempt-1")
    seq = state.interval_map("c")[0].sequencer
    assert state.handle(WorkerJoined("w1", "w1:1", "attempt-1", 2 * S)) == []     # a retried RPC
    assert state.workers["w1"].incarnation == inc and state.interval_map("c")[0].sequencer == seq
    out = state.handle(WorkerJoined("w1", "w1:2", "attempt-2", 3 * S))          # restarted process
    assert [type(c) for c in out] == [Revoke, Assign]
    assert state.workers["w1"].incarnation > inc and state.interval_map("c")[0].sequencer > seq
    assert not state.view_of("w1", inc).known and state.view_of("w1").known


def test_worker_left_hands_its_intervals_on_at_once():
    state = MasterState(policy(cooldown_us=0))
    state.handle(ComputationDeclared("c", ("k",), 0))
    joined(state, "a", 1)
    inc_b = joined(state, "b", 1)
    state.handle(TimePassed(2))
    out = state.handle(WorkerLeft("b", inc_b, 3))
    assert [type(c) for c in out] == [Revoke, Assign]
    assert {i.worker for i in state.interval_map("c")} == {"a"}


def test_leader_change_restarts_leases():
    state = MasterState(policy())
    state.handle(ComputationDeclared("c", (), 0))
    joined(state, "w", 0)
    state.handle(LeaderChanged(LEASE - 1))            # a new leader, just before the lease would lapse
    assert state.handle(TimePassed(LEASE)) == []
    assert state.workers["w"].lease_until_us == 2 * LEASE - 1


def test_a_hot_interval_is_split_at_the_reported_key_and_both_halves_get_new_sequencers():
    state = MasterState(policy())
    state.handle(ComputationDeclared("c", ("d", "h", "p"), 0))
    inc = joined(state, "w", 0)
    old = {i.lo: i.sequencer for i in state.interval_map("c")}
    rates = {"": 100.0, "d": 2000.0, "h": 100.0, "p": 100.0}
    state.handle(Heartbeat("w", inc, 1 * S, load_of(state, "w", rates, {"d": "f"})))
    assert state.handle(TimePassed(1 * S)) == []                   # still cooling down since assigned
    state.handle(Heartbeat("w", inc, 3 * S, load_of(state, "w", rates, {"d": "f"})))
    out = state.handle(TimePassed(3 * S))
    assert out == [Split("c", "d", "f", "h", "w", old["d"], out[0].left_sequencer, out[0].right_sequencer)]
    assert old["d"] < out[0].left_sequencer < out[0].right_sequencer
    assert [i.lo for i in state.interval_map("c")] == ["", "d", "f", "h", "p"]
    check_invariants(state)


def test_no_split_below_the_minimum_rate_nor_without_a_key_to_split_at_and_the_cap_splits_a_lone_interval():
    state = MasterState(policy(split_min_rate=5000.0, max_interval_rate=1000.0))
    state.handle(ComputationDeclared("c", (), 0))
    inc = joined(state, "w", 0)
    state.handle(Heartbeat("w", inc, 3 * S, load_of(state, "w", {"": 900.0}, {"": "k"})))
    assert state.handle(TimePassed(3 * S)) == []
    # one hot key: the worker has no key inside the interval that would halve its traffic
    state.handle(Heartbeat("w", inc, 4 * S, load_of(state, "w", {"": 1500.0})))
    assert state.handle(TimePassed(4 * S)) == []
    state.handle(Heartbeat("w", inc, 5 * S, load_of(state, "w", {"": 1500.0}, {"": "k"})))
    out = state.handle(TimePassed(5 * S))
    assert len(out) == 1 and isinstance(out[0], Split) and out[0].mid == "k"


def test_the_coldest_adjacent_pair_is_merged_under_one_new_sequencer():
    state = MasterState(policy())
    state.handle(ComputationDeclared("c", ("d", "h", "p"), 0))
    inc = joined(state, "w", 0)
    seqs = {i.lo: i.sequencer for i in state.interval_map("c")}
    rates = {"": 1000.0, "d": 5.0, "h": 7.0, "p": 1000.0}
    state.handle(Heartbeat("w", inc, 3 * S, load_of(state, "w", rates)))
    out = state.handle(TimePassed(3 * S))
    assert out == [Merge("c", "d", "h", "p", "w", "w", "w", seqs["d"], seqs["h"], out[0].sequencer)]
    assert out[0].sequencer > max(seqs.values())
    assert [(i.lo, i.hi) for i in state.interval_map("c")] == [("", "d"), ("d", "p"), ("p", None)]


def test_an_overloaded_worker_gives_an_interval_to_the_least_loaded():
    state = MasterState(policy())
    state.handle(ComputationDeclared("c", ("d", "h", "p"), 0))
    a = joined(state, "a", 0)
    state.handle(TimePassed(3 * S))
    b = joined(state, "b", 3 * S)                # joins after everything was placed on a and cooled down
    rates = {"": 400.0, "d": 300.0, "h": 200.0, "p": 100.0}
    state.handle(Heartbeat("a", a, 6 * S, load_of(state, "a", rates)))
    state.handle(Heartbeat("b", b, 6 * S, load_of(state, "b", rates)))
    out = state.handle(TimePassed(6 * S))
    # loads 1000 vs 0: the best single move leaves max(1000 - w, w) smallest: the 400 interval
    assert out == [Move("c", "", "d", "a", "b", out[0].old_sequencer, out[0].sequencer)]
    assert out[0].sequencer > out[0].old_sequencer


def test_policy_is_validated_naming_the_option():
    with pytest.raises(MillWheelConfigError, match="lease_us"):
        PlacementPolicy(lease_us=0)
    with pytest.raises(MillWheelConfigError, match="merge_ratio"):
        PlacementPolicy(split_ratio=2.0, merge_ratio=1.5)
    with pytest.raises(MillWheelConfigError, match="unknown master option"):
        PlacementPolicy.from_mapping({"lease": 1})
    assert PlacementPolicy.from_mapping({"lease_us": 7}).lease_us == 7


@pytest.mark.parametrize("module", ["_master_state.py", "_master_facts.py"])
def test_the_placement_core_reads_no_clock_and_touches_no_socket_or_thread(module):
    tree = ast.parse((Path(__file__).resolve().parents[2] / "millwheel" / module).read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not {n.split(".")[0] for n in names} & {"time", "socket", "threading", "grpc", "pysyncobj",
                                                   "random", "subprocess", "os"}


# ---- properties ---------------------------------------------------------------------------------------

WORKERS = ["w0", "w1", "w2", "w3"]
LETTERS = "abcdefghijklmnopqrstuvwxyz"


class Driver:
    """Applies facts, records them for replay, and checks the map's invariants after each one."""

    def __init__(self, pol: PlacementPolicy) -> None:
        self.state = MasterState(pol)
        self.facts: list = []
        self.now = 1_000 * S
        self.issued: dict[str, int] = {}       # highest sequencer seen per computation
        self.key_seq: dict[tuple[str, str], int] = {}
        self.key_owner: dict[tuple[str, str], tuple] = {}

    def apply(self, fact) -> list:
        self.facts.append(fact)
        out = self.state.handle(fact)
        for c in out:
            new = [c.left_sequencer, c.right_sequencer] if isinstance(c, Split) else \
                [] if isinstance(c, Revoke) else [c.sequencer]
            for s in new:       # every command hands out sequencers above any handed out before
                assert s > self.issued.get(c.computation, 0), (c, self.issued)
                self.issued[c.computation] = s
        check_invariants(self.state)
        self._check_keys()
        return out

    def _check_keys(self) -> None:
        for interval in self.state.interval_map():
            for key in [interval.lo, interval.lo + "m", *LETTERS]:
                if not interval.covers(key):
                    continue
                k = (interval.computation, key)
                holding = (interval.lo, interval.hi, interval.worker)
                before = self.key_seq.get(k)
                if before is not None:
                    assert interval.sequencer >= before, (k, before, interval)
                    if self.key_owner[k] != holding and self.key_owner[k][2] and interval.worker:
                        assert interval.sequencer > before, (k, self.key_owner[k], interval)
                self.key_seq[k] = interval.sequencer
                self.key_owner[k] = holding


def step(d: Driver, data) -> None:
    state = d.state
    d.now += data.draw(st.integers(0, 3 * S), label="dt")
    kind = data.draw(st.sampled_from(["join", "beat", "beat", "load", "leave", "time", "time", "declare",
                                      "leader"]), label="kind")
    name = data.draw(st.sampled_from(WORKERS), label="worker")
    w = state.workers.get(name)
    if kind == "join":
        reg = data.draw(st.sampled_from(["r1", "r2", "r3"]), label="registration")
        d.apply(WorkerJoined(name, f"{name}:9", reg, d.now))
    elif kind in ("beat", "load") and w is not None:
        rates = {i.lo: data.draw(st.sampled_from([0.0, 1.0, 10.0, 100.0, 1000.0, 5000.0]), label="rate")
                 for i in state.view_of(name).intervals}
        splits = {lo: data.draw(st.sampled_from(["", "c", "k", "kk", "s", lo + "m"]), label="split") for lo in rates}
        load = load_of(state, name, rates, splits)
        d.apply(Heartbeat(name, w.incarnation, d.now, load) if kind == "beat"
                else LoadReported(name, w.incarnation, d.now, load))
    elif kind == "leave" and w is not None:
        d.apply(WorkerLeft(name, w.incarnation, d.now))
    elif kind == "declare":
        comp = data.draw(st.sampled_from(["x", "y"]), label="computation")
        keys = data.draw(st.lists(st.text(LETTERS, min_size=1, max_size=2), max_size=4), label="split_keys")
        d.apply(ComputationDeclared(comp, tuple(keys), d.now))
    elif kind == "leader":
        d.apply(LeaderChanged(d.now))
    else:
        d.apply(TimePassed(d.now))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), cooldown=st.sampled_from([0, 2 * S]))
def test_random_facts_keep_the_map_whole_owned_and_fenced_and_replay_to_the_same_map(data, cooldown):
    d = Driver(policy(cooldown_us=cooldown, split_min_rate=50.0, max_intervals=12))
    d.apply(ComputationDeclared("x", ("m",), d.now))
    for _ in range(data.draw(st.integers(5, 60), label="steps")):
        step(d, data)
    replay = MasterState(d.state.policy)
    commands = []
    for fact in d.facts:
        commands.append(replay.handle(fact))
    assert replay.snapshot() == d.state.snapshot()
    assert replay.interval_map() == d.state.interval_map()
    again = MasterState(d.state.policy)
    assert [again.handle(f) for f in d.facts] == commands


# ---- hysteresis: steady load converges and then nothing moves -----------------------------------------

def letter_rates(weights: dict[str, float], lo: str, hi: str | None) -> tuple[float, str]:
    """The records/s of [lo, hi) when key ``<letter>...`` carries ``weights[letter]``, and the letter
    where the interval's traffic is halved (its split key)."""
    inside = [c for c in LETTERS if lo <= c and (hi is None or c < hi)]
    # a key starting with lo's first letter but above it belongs here too: count lo's letter if inside
    total = sum(weights.get(c, 0.0) for c in inside)
    acc, split = 0.0, ""
    for c in inside:
        acc += weights.get(c, 0.0)
        if acc >= total / 2 and c > lo:
            split = c
            break
    return total, split


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(weights=st.dictionaries(st.sampled_from(LETTERS), st.sampled_from([0.0, 1.0, 20.0, 300.0, 4000.0]),
                               min_size=1),
       n_workers=st.integers(1, 4), cuts=st.lists(st.sampled_from(LETTERS[1:]), max_size=6))
def test_steady_load_settles_and_then_no_interval_flaps(weights, n_workers, cuts):
    pol = policy(cooldown_us=2 * S, split_min_rate=50.0, max_intervals=40)
    state = MasterState(pol)
    now = 0
    state.handle(ComputationDeclared("c", tuple(cuts), now))
    inc = {f"w{i}": joined(state, f"w{i}", now) for i in range(n_workers)}
    history = []
    for _ in range(150):
        now += S
        for name, incarnation in inc.items():
            view = state.view_of(name)
            measured = {i.lo: letter_rates(weights, i.lo, i.hi) for i in view.intervals}
            load = WorkerLoad(intervals=tuple(IntervalLoad(i.computation, i.lo, i.sequencer, *measured[i.lo])
                                              for i in view.intervals))
            state.handle(Heartbeat(name, incarnation, now, load))
        history.append(state.handle(TimePassed(now)))
        check_invariants(state)
    assert all(h == [] for h in history[-40:]), [h for h in history[-40:] if h]


# ---- moves: only a large and lasting imbalance moves an interval --------------------------------------

def spread_cluster(pol: PlacementPolicy, n_workers: int, cuts: tuple[str, ...]):
    """A computation cut at ``cuts``, spread over ``n_workers`` workers (moves to starved workers), then
    left past every cooldown; returns the state, the incarnations and the time reached."""
    state = MasterState(pol)
    state.handle(ComputationDeclared("c", cuts, 0))
    inc = {f"w{i}": joined(state, f"w{i}", 0) for i in range(n_workers)}
    now = 0
    for _ in range(100):                           # past the cooldowns and the lasting-imbalance wait
        now += S // 10
        if now % S == 0:
            for name, incarnation in inc.items():
                state.handle(Heartbeat(name, incarnation, now))
        state.handle(TimePassed(now))
    return state, inc, now


def report_all(state: MasterState, inc: dict, now: int, rate_of) -> None:
    for name, incarnation in inc.items():
        rates = {i.lo: rate_of(name, i.lo) for i in state.view_of(name).intervals}
        state.handle(Heartbeat(name, incarnation, now, load_of(state, name, rates)))


@pytest.mark.parametrize("move_ratio", [1.25, 1.6])
@pytest.mark.parametrize("seed", [18, 19, 20])
def test_a_steady_even_load_with_noisy_reports_moves_nothing(move_ratio, seed):
    rnd = random.Random(seed)
    pol = policy(cooldown_us=S, move_ratio=move_ratio, split_min_rate=50.0)
    state, inc, now = spread_cluster(pol, 4, tuple("bcdefghi"))        # nine intervals on four workers
    assert sorted(Counter(i.worker for i in state.interval_map("c")).values()) == [2, 2, 2, 3]
    before = state.statistics()
    commands = []
    for _ in range(600):                           # 60 s of rounds, a report from every worker each 1.2 s
        now += S // 10
        if now % (12 * S // 10) == 0:
            # every interval carries the same records/s, each report off by up to +-20 %
            report_all(state, inc, now, lambda _w, _lo: 1000.0 * rnd.uniform(0.8, 1.2))
        commands += state.handle(TimePassed(now))
    assert commands == []
    after = state.statistics()
    assert (after.moves, after.splits, after.merges) == (before.moves, before.splits, before.merges)


def test_a_lasting_imbalance_moves_one_interval_but_a_brief_one_does_not():
    pol = policy(cooldown_us=S, move_after_us=3 * S, move_gap_us=5 * S, split_min_rate=1e9)
    state, inc, now = spread_cluster(pol, 2, ("d", "h", "l", "p", "t"))   # three intervals each
    a = state.interval_map("c")[0].worker
    b = ({"w0", "w1"} - {a}).pop()
    assert len(state.view_of(a).intervals) == len(state.view_of(b).intervals) == 3
    hot = {i.lo for i in state.view_of(a).intervals}

    def rates(spike: bool):     # a's intervals at 2.5 times b's: 7500 against 3000 records/s
        return lambda _w, lo: (2500.0 if spike and lo in hot else 1000.0)

    def rounds(n: int, spike: bool) -> list[list]:
        """``n`` rounds of 100 ms, every worker reporting at the start of each second: each round's commands."""
        nonlocal now
        got = []
        for k in range(n):
            if k % 10 == 0:
                report_all(state, inc, now, rates(spike))
            now += S // 10
            got.append(state.handle(TimePassed(now)))
        return got

    assert not any(rounds(50, False))                       # even
    assert not any(rounds(20, True)), "a brief spike moved an interval"    # a at 2.5 times b for 2 s
    assert not any(rounds(50, False)), "a brief spike moved an interval"
    lasting = rounds(60, True)                              # the same imbalance, lasting
    moves = [(k, c) for k, got in enumerate(lasting) for c in got]
    assert len(moves) == 1, moves
    k, move = moves[0]
    assert isinstance(move, Move) and (move.from_worker, move.to_worker) == (a, b)
    assert k >= 29, f"moved after {k / 10} s, before the imbalance lasted 3 s"
    assert len(state.view_of(a).intervals) == 2 and len(state.view_of(b).intervals) == 4
