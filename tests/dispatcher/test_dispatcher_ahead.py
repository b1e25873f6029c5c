"""Property: the clicks held back for the event store (AheadOfStore: sorted runs per query key, cut at the
store's position) are held and released exactly as a plain model does it (one list of held clicks, each
released once the store has read past its query's time, or after the time limit, in the order held), on any
interleaving of reads (clicks held, some of them held again after being released), answers with the
store's position (which never goes back), the store caught up, time passing and clicks resolved."""
from __future__ import annotations

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_dispatcher_state import QKEY, chunk, line, of, qtime, state

from dispatcher._files import decode_journal, encode_delta
from dispatcher._state import (
    AheadOfStore,
    Checkpoint,
    JoinAnswered,
    LinesRead,
    SendBatch,
    TimePassed,
    apply_delta,
    later_position,
    time_text,
)
from photon import (
    ID_KEY,
    ID_TIME_DIGITS,
    TIMESTAMP_DIGITS,
    FakeClock,
    Outcome,
    format_event_id,
    id_timestamp_us,
    key_and_time,
)

KEYS = [("10.0.0.2", 2), ("10.0.0.3", 7), ("10.0.0.4", 1)]
START = 1_763_712_000_000_000
LIMIT_US = 1_000_000


class Model:
    """The old behaviour, plainly: held click -> (key, time, since) in the order held."""

    def __init__(self) -> None:
        self.held: dict[str, tuple[str, int, int]] = {}

    def hold(self, cids, refs, now):
        for cid, ref in zip(cids, refs):
            key, t = key_and_time(ref)
            self.held[cid] = (key, t, now)

    def release(self, read_to, through):
        out = [cid for cid, (key, t, _) in self.held.items()
               if read_to is None or t <= read_to.get(key, through)]
        for cid in out:
            del self.held[cid]
        return out

    def expired(self, oldest):
        out = []
        for cid, (_, _, since) in self.held.items():
            if since > oldest:
                break
            out.append(cid)
        for cid in out:
            del self.held[cid]
        return out

    def forget(self, ids):
        for cid in ids:
            self.held.pop(cid, None)


def per_key_in_time_order(released: list[str], refs: dict[str, str]) -> dict[str, list[str]]:
    by_key: dict[str, list[str]] = {}
    for cid in released:
        by_key.setdefault(ID_KEY(refs[cid]), []).append(cid)
    return by_key


ops = st.lists(st.one_of(
    st.tuples(st.just("read"), st.lists(st.tuples(st.integers(0, 2), st.integers(0, 40)), min_size=1, max_size=12)),
    st.tuples(st.just("again"), st.integers(1, 12)),
    st.tuples(st.just("answer"), st.dictionaries(st.integers(0, 2), st.integers(-1, 45), max_size=3),
              st.integers(-1, 45)),
    st.tuples(st.just("caught_up")),
    st.tuples(st.just("time"), st.integers(0, 1_500_000)),
    st.tuples(st.just("resolve"), st.integers(1, 6)),
), max_size=60)


@pytest.mark.timeout(120)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, slack=st.sampled_from([0, 1024]))
@example(ops=[("read", [(0, 5), (1, 3)]), ("time", 1_500_000), ("again", 2), ("answer", {}, 10)], slack=1024)
def test_the_runs_hold_and_release_like_the_plain_model(ops, slack):
    import dispatcher._state as core
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(core, "OLDEST_HEAP_SLACK", slack)         # 0: the runs are rebuilt often
        check_against_the_model(ops, slack)


def check_against_the_model(ops, slack):
    ahead, model = AheadOfStore(), Model()
    refs: dict[str, str] = {}
    released_before: list[str] = []            # released, not resolved: may come back and be held again
    read_to: dict[str, int] = {}
    through = -1
    now, n = 0, 0

    def hold(cids):
        hold_refs = [refs[c] for c in cids]
        ahead.hold(list(map(ID_KEY, hold_refs)), list(map(ID_TIME_DIGITS, hold_refs)), cids, now)
        model.hold(cids, hold_refs, now)
        ahead.rebuild_if_outgrown(refs.__getitem__)
        assert ahead.entries() <= 2 * len(ahead) + slack     # released entries do not pile up

    def same(got, want):
        assert sorted(got) == sorted(want)
        assert len(got) == len(set(got))      # each once
        by_key = per_key_in_time_order(got, refs)
        for cids in by_key.values():          # a key's in (query time, id) order
            assert cids == sorted(cids, key=lambda c: (ID_TIME_DIGITS(refs[c]), c))
        released_before.extend(got)

    for op in ops:
        kind = op[0]
        if kind == "read":
            cids = []
            for k, dt in op[1]:
                n += 1
                cid = format_event_id("10.0.0.1", 1, START + 10_000 + n)
                refs[cid] = format_event_id(*KEYS[k], START + dt)
                cids.append(cid)
            hold(cids)
        elif kind == "again" and released_before:
            cids = list(dict.fromkeys(released_before[-op[1]:]))
            del released_before[-op[1]:]
            hold(cids)
        elif kind == "answer":
            named = {key_and_time(format_event_id(*KEYS[k], START))[0]: START + t for k, t in op[1].items()}
            read_to, through = later_position(read_to, through, named, START + op[2] if op[2] >= 0 else -1)
            same(ahead.release(read_to, through), model.release(read_to, through))
        elif kind == "caught_up":
            same(ahead.release(None, 0), model.release(None, 0))
        elif kind == "time":
            now += op[1]
            got = ahead.expired(now - LIMIT_US)
            assert got == model.expired(now - LIMIT_US)   # in the order held
            released_before.extend(got)
        elif kind == "resolve":
            gone = list(model.held)[:op[1]] + released_before[:op[1]]
            del released_before[:op[1]]
            ahead.forget(gone)
            model.forget(gone)
        assert ahead.since == {c: since for c, (_, _, since) in model.held.items()}
        assert list(ahead.since) == list(model.held)
        assert len(ahead) == len(model.held)
    same(ahead.release(None, 0), model.release(None, 0))
    assert not ahead.since and ahead.entries() == 0


def test_a_time_as_text_compares_like_the_number():
    digits = [ID_TIME_DIGITS(format_event_id("10.0.0.2", 2, t)) for t in (0, 1, 999, START, 10**TIMESTAMP_DIGITS - 1)]
    for limit in (-1, 0, 1, 998, 999, 1000, START - 1, START, 10**TIMESTAMP_DIGITS - 1, 10**TIMESTAMP_DIGITS,
                  10**(TIMESTAMP_DIGITS + 2)):
        assert [d > time_text(limit) for d in digits] == [int(d) > limit for d in digits]


steps = st.lists(st.one_of(
    st.tuples(st.just("read"), st.integers(1, 30)),
    st.tuples(st.just("answer"), st.integers(0, 60), st.booleans()),    # store's position; store behind
    st.tuples(st.just("time"), st.integers(1_000, 3_000_000)),
    st.tuples(st.just("restart")),                                      # from the last checkpoint
), max_size=40)


@pytest.mark.timeout(120)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=steps)
def test_in_the_core_held_clicks_are_ahead_of_the_store_and_each_joined_once(steps):
    """The core with the store's position: after every step each held click's query is past the position
    (none held once the store is no longer behind), held clicks are unresolved and neither queued nor in
    flight; a restart from a full checkpoint holds nothing and keeps every unresolved click; in the end every
    click is joined once."""
    clock = FakeClock()
    make = lambda restore=None: state(batch_size=4, max_in_flight=2, retry_max_s=1.0, checkpoint_interval_s=0,
                                      restore=restore)
    core, read, out, snap = make(), 1, [], None
    position, behind = 0, False
    joined: list[str] = []

    def take(cmds):
        nonlocal snap
        out.extend(of(cmds, SendBatch))
        for c in of(cmds, Checkpoint):        # the checkpoint as a restart reads it: snapshot + deltas
            if c.snapshot is not None:
                snap = orjson.loads(orjson.dumps(c.snapshot))
            elif snap is not None:
                snap = apply_delta(snap, decode_journal(encode_delta(c.delta))[0])

    def check():
        held = core._ahead_since
        if core._store_read_to is None:
            assert not held
        for cid in held:
            ref = core._events[cid][0]
            assert id_timestamp_us(ref) > core._store_read_to.get(ID_KEY(ref), core._store_through_us)
        sent = {c for ids in core._batches.values() for c in ids}
        assert not set(held) & (sent | set(core._queued))
        assert set(held) <= core.unresolved_ids()

    for step in steps:
        if step[0] == "read":
            take(core.handle(LinesRead([chunk([line(i) for i in range(read, read + step[1])], start=read * 200)],
                                       clock.advance(100))))
            read += step[1]
        elif step[0] == "answer" and out:
            send = out.pop(0)
            if send.batch_id not in core._batches:
                continue
            position, behind = max(position, step[1]), step[2]
            outcomes = [Outcome.JOINED if not behind or id_timestamp_us(r) <= qtime(position) else Outcome.THROTTLED
                        for r in send.ref_ids]
            kw = ({"store_behind": True, "store_read_to": {QKEY: qtime(position)}, "store_read_through_us": 0}
                  if behind else {})
            joined += [c for c, o in zip(send.ids, outcomes) if o == Outcome.JOINED]
            take(core.handle(JoinAnswered(send.batch_id, outcomes, clock.advance(1_000), **kw)))
        elif step[0] == "time":
            take(core.handle(TimePassed(clock.advance(step[1]))))
        elif step[0] == "restart" and snap is not None:
            unresolved = core.unresolved_ids()
            core, out = make(restore=snap), []
            assert not core._ahead_since and core.unresolved_ids() >= unresolved - set(joined)
            joined = [c for c in joined if c not in core.unresolved_ids()]
            take(core.handle(TimePassed(clock.advance(1_000))))
        check()
    while core.unresolved_ids():                  # the store catches up: every click goes and is joined once
        take(core.handle(TimePassed(clock.advance(10_000))))
        while out:
            send = out.pop(0)
            if send.batch_id in core._batches:
                joined += send.ids
                take(core.handle(JoinAnswered(send.batch_id, [Outcome.JOINED] * len(send.ids), clock.advance(1_000))))
            check()
    assert sorted(joined) == sorted(set(joined))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clicks=st.lists(st.tuples(st.integers(0, 2), st.integers(-3, 40)), min_size=1, max_size=40),
       read_to=st.dictionaries(st.integers(0, 3), st.integers(-5, 45), max_size=4),
       through=st.integers(-5, 45), far=st.sampled_from([None, "before", "after"]),
       unhold=st.lists(st.integers(0, 39), max_size=10))
def test_the_check_of_clicks_against_the_stores_position_holds_what_a_click_by_click_check_holds(
        clicks, read_to, through, far, unhold):
    """``_not_ahead`` (one pass in C over the clicks' query keys and time digits, each key's position made
    once) holds, returns and counts exactly what a plain check click by click does: a click is held iff its
    query's time is past the position of its query's key (``through`` for a key not named) and it is not
    one let go by the time limit (those go once without the check)."""
    clock = FakeClock()
    core = state(batch_size=1, max_in_flight=1)
    lines = [orjson.dumps({"click_id": format_event_id("10.0.0.1", 1, START + 100 + k),
                           "query_id": format_event_id(*KEYS[key], START + 10 + t)}) for k, (key, t) in enumerate(clicks)]
    core.handle(LinesRead([chunk(lines)], clock.now_us()))
    cids = [orjson.loads(ln)["click_id"] for ln in lines]
    key_names = [f"{ip}:{pid}" for ip, pid in KEYS] + ["10.0.0.9:9"]
    position = {key_names[k]: START + 10 + t for k, t in read_to.items()}
    through_us = START + 10 + through
    if far == "before":
        through_us = -1                           # before every id's time: all of the key's clicks ahead
    elif far == "after":
        through_us = 10 ** TIMESTAMP_DIGITS       # past every id's time: none ahead
    core._store_read_to, core._store_through_us = position, through_us
    free = {cids[k] for k in unhold if k < len(cids)}
    core._unhold = set(free)
    held_before = dict(core._ahead_since)
    counted = core.counters["held_for_store"]
    now = clock.advance(5)

    expected_held = []
    for cid in cids:
        key, t = key_and_time(core._events[cid][0])
        if t > position.get(key, through_us) and cid not in free:
            expected_held.append(cid)
    got = core._not_ahead(list(cids), now)

    assert got == [c for c in cids if c not in expected_held]
    assert list(core._ahead_since) == list(held_before) + expected_held
    assert all(core._ahead_since[c] == now for c in expected_held)
    assert core.counters["held_for_store"] == counted + len(expected_held)
    assert core._unhold == set()
    # the hold keeps each held click under its query's key and time: released by the key's position
    released = core._ahead.release({}, 10 ** TIMESTAMP_DIGITS - 1)
    assert sorted(released) == sorted(set(held_before) | set(expected_held))
