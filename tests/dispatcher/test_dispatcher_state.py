"""The pure core: facts in, commands out, time from a FakeClock."""
from __future__ import annotations

import orjson
import pytest

from dispatcher import DispatcherConfig, DispatcherState
from dispatcher._files import decode_journal, encode_delta
from dispatcher._state import (Checkpoint, ChunkRead, JoinAnswered, JoinFailed, LinesRead, Lookup,
                               LookupAnswered, LookupFailed, QuarantineRecords, SendBatch,
                               StopRequested, TimePassed, WriteUnjoinable, apply_delta, backoff_table_us, delta_events,
                               percentiles_ms, snapshot_events)
from dispatcher._state import STORE_POSITION_PROBE_US
from photon import FakeClock, JoinConfig, Outcome, format_event_id, id_timestamp_us

S = 1_000_000


def cid(n: int) -> str:
    return format_event_id("10.0.0.1", 7, 1_763_712_000_000_000 + n)


def qid(n: int) -> str:
    return format_event_id("10.0.0.2", 9, 1_763_711_000_000_000 + n)


def line(n: int, q: int | None = None, **extra) -> bytes:
    return orjson.dumps({"click_id": cid(n), "query_id": qid(n if q is None else q), **extra})


def chunk(lines: list[bytes], file: str = "w0/clicks-1.jsonl", start: int = 0) -> ChunkRead:
    offsets, pos = [], start
    for ln in lines:
        offsets.append(pos)
        pos += len(ln) + 1
    return ChunkRead(file, offsets, lines, pos)


def state(lookups=False, restore=None, share=None, **over) -> DispatcherState:
    d = dict(batch_size=100, max_in_flight=4, retry_initial_s=0.25, retry_max_s=8.0, min_attempts=3,
             checkpoint_interval_s=0.2)
    d.update(over)
    d.setdefault("backlog_batch_size", d["batch_size"])   # requests of batch_size unless a test says otherwise
    return DispatcherState(JoinConfig(unjoinable_after_s=60.0), DispatcherConfig(**d), lookups=lookups,
                           restore=restore, share=share)


def of(cmds, kind):
    return [c for c in cmds if type(c) is kind]


class Saved:
    """What the checkpoint files hold: the last full snapshot with every later delta applied."""

    def __init__(self) -> None:
        self.snap = None
        self.full = self.deltas = 0

    def take(self, cmds):
        for cp in of(cmds, Checkpoint):
            if cp.snapshot is not None:
                assert cp.delta is None
                self.snap = orjson.loads(orjson.dumps(cp.snapshot))
                self.full += 1
            else:
                assert self.snap is not None, "a delta before any full checkpoint"
                apply_delta(self.snap, decode_journal(encode_delta(cp.delta))[0])
                self.deltas += 1
        return cmds


def test_idle_dispatcher_sends_a_lone_click_at_once():
    clock = FakeClock()
    st = state()
    cmds = st.handle(LinesRead([chunk([line(1)])], clock.now_us()))
    [send] = of(cmds, SendBatch)
    assert send.ids == [cid(1)] and send.ref_ids == [qid(1)] and send.raws == [line(1)]
    assert st.statistics().in_flight == 1 and st.statistics().attempts == 1


def test_batches_are_bounded_by_batch_size_and_max_in_flight():
    clock = FakeClock()
    st = state(batch_size=10, max_in_flight=3)
    cmds = st.handle(LinesRead([chunk([line(i) for i in range(45)])], clock.now_us()))
    sends = of(cmds, SendBatch)
    assert [len(s.ids) for s in sends] == [10, 10, 10]
    assert st.statistics().queued == 15 and st.statistics().requests_in_flight == 3
    cmds = st.handle(JoinAnswered(sends[0].batch_id, [Outcome.JOINED] * 10, clock.advance(1000)))
    assert [len(s.ids) for s in of(cmds, SendBatch)] == [10]
    assert st.statistics().joined == 10


def test_a_backlog_goes_out_in_bigger_requests_spread_over_the_free_slots():
    clock = FakeClock()
    st = state(batch_size=10, max_in_flight=3, backlog_batch_size=25)
    assert st.lines_wanted() == 75                     # read ahead: max_in_flight backlog requests
    cmds = st.handle(LinesRead([chunk([line(i) for i in range(100)])], clock.now_us()))
    sends = of(cmds, SendBatch)
    assert [len(s.ids) for s in sends] == [25, 25, 25]  # at most backlog_batch_size each
    assert st.statistics().queued == 25
    cmds = st.handle(JoinAnswered(sends[0].batch_id, [Outcome.JOINED] * 25, clock.advance(1000)))
    assert [len(s.ids) for s in of(cmds, SendBatch)] == [25]
    for s in sends[1:] + of(cmds, SendBatch):
        st.handle(JoinAnswered(s.batch_id, [Outcome.JOINED] * 25, clock.advance(1000)))
    # little queued: requests of batch_size go at once, never held back to fill a bigger one
    cmds = st.handle(LinesRead([chunk([line(i) for i in range(100, 112)], start=10_000)], clock.advance(1000)))
    assert [len(s.ids) for s in of(cmds, SendBatch)] == [10, 2]
    # 40 queued over 3 free slots: spread evenly (14, 13, 13), none below batch_size
    more = state(batch_size=10, max_in_flight=3, backlog_batch_size=25)
    cmds = more.handle(LinesRead([chunk([line(i) for i in range(40)])], clock.now_us()))
    assert [len(s.ids) for s in of(cmds, SendBatch)] == [14, 13, 13]
    assert more.statistics().joined == 0 and st.statistics().joined == 100


def test_lookup_drops_present_ids_and_a_failed_lookup_sends_anyway():
    clock = FakeClock()
    st = state(lookups=True)
    [lk] = of(st.handle(LinesRead([chunk([line(1), line(2), line(3)])], clock.now_us())), Lookup)
    assert lk.ids == [cid(1), cid(2), cid(3)]
    [send] = of(st.handle(LookupAnswered(lk.batch_id, [False, True, False], clock.now_us())), SendBatch)
    assert send.ids == [cid(1), cid(3)]
    assert st.statistics().already_registered == 1 and st.statistics().in_flight == 2
    [lk2] = of(st.handle(LinesRead([chunk([line(4)], start=1000)], clock.now_us())), Lookup)
    [send2] = of(st.handle(LookupFailed(lk2.batch_id, "down", clock.now_us())), SendBatch)
    assert send2.ids == [cid(4)]
    assert st.statistics().lookup_failures == 1
    # a batch whose ids are all present needs no joiner request
    [lk3] = of(st.handle(LinesRead([chunk([line(5)], start=2000)], clock.now_us())), Lookup)
    assert of(st.handle(LookupAnswered(lk3.batch_id, [True], clock.now_us())), SendBatch) == []
    assert st.statistics().requests_in_flight == 2


def test_with_lookups_no_request_is_looked_up_while_every_slot_is_busy():
    clock = FakeClock()
    st = state(lookups=True, batch_size=10, max_in_flight=2)
    lookups = of(st.handle(LinesRead([chunk([line(i) for i in range(60)])], clock.now_us())), Lookup)
    cmds = [c for lk in lookups for c in st.handle(LookupAnswered(lk.batch_id, [False] * 10, clock.advance(10)))]
    assert len(of(cmds, SendBatch)) == 2 and not of(cmds, Lookup)
    assert st.statistics().requests_in_flight == 2 and st.statistics().queued == 40


def test_without_lookups_a_request_goes_straight_to_a_joiner_and_no_more_than_max_in_flight():
    clock = FakeClock()
    st = state(batch_size=10, max_in_flight=2)
    cmds = st.handle(LinesRead([chunk([line(i) for i in range(60)])], clock.now_us()))
    assert [len(s.ids) for s in of(cmds, SendBatch)] == [10, 10] and not of(cmds, Lookup)
    assert not of(st.handle(TimePassed(clock.advance(10))), SendBatch)
    assert st.statistics().requests_in_flight == 2 and st.statistics().queued == 40


def test_backoff_grows_and_caps():
    table = backoff_table_us(0.25, 8.0)
    assert table[:7] == [250_000, 500_000, 1_000_000, 2_000_000, 4_000_000, 8_000_000, 8_000_000]
    assert set(table[5:]) == {8_000_000}
    clock = FakeClock()
    st = state(min_attempts=1000)
    [send] = of(st.handle(LinesRead([chunk([line(1)])], clock.now_us())), SendBatch)
    delays = []
    for _ in range(8):
        now = clock.advance(1000)
        assert of(st.handle(JoinAnswered(send.batch_id, [Outcome.NOT_FOUND], now)), SendBatch) == []
        due = st.next_due_us()
        delays.append(due - now)
        assert st.statistics().retry_queue == 1
        assert of(st.handle(TimePassed(clock.set(due - 1) or due - 1)), SendBatch) == []  # not yet
        clock.set(due)
        [send] = of(st.handle(TimePassed(due)), SendBatch)
    assert delays == [250_000, 500_000, 1_000_000, 2_000_000, 4_000_000, 8_000_000, 8_000_000, 8_000_000]
    assert st.statistics().attempts == 9


def test_jitter_shortens_delays_by_at_most_a_fifth():
    class Rng:
        def random(self):
            return 0.999

    st = DispatcherState(JoinConfig(), DispatcherConfig(retry_initial_s=1.0, retry_max_s=1.0),
                         lookups=False, jitter=Rng())
    [send] = of(st.handle(LinesRead([chunk([line(1)])], 0)), SendBatch)
    st.handle(JoinAnswered(send.batch_id, [Outcome.THROTTLED], 10))
    assert 800_000 <= st.next_due_us() - 10 < 1_000_000


def test_retries_due_close_together_go_in_one_request_when_the_first_is_due():
    """A tail of retries on jittered delays goes in a few requests, not one per click: when a retry falls due,
    those due within a quarter of the first retry delay after it go with it; nothing goes before it is due."""
    clock = FakeClock()
    st = state()                                         # retry_initial_s=0.25: gathered within 62.5 ms
    sends = [of(st.handle(LinesRead([chunk([line(n)], start=100 * n)], clock.now_us())), SendBatch)[0]
             for n in (1, 2, 3, 4)]
    t0 = clock.now_us()
    for send, after_ms in zip(sends, (0, 10, 40, 100)):   # NOT_FOUND at t0 + 0, 10, 40, 100 ms
        assert of(st.handle(JoinAnswered(send.batch_id, [Outcome.NOT_FOUND], clock.set(t0 + after_ms * 1000)
                                         or t0 + after_ms * 1000)), SendBatch) == []
    first_due = t0 + 250_000
    assert st.next_due_us() == first_due
    assert of(st.handle(TimePassed(clock.set(first_due - 1) or first_due - 1)), SendBatch) == []   # not yet
    [send] = of(st.handle(TimePassed(clock.set(first_due) or first_due)), SendBatch)
    assert send.ids == [cid(1), cid(2), cid(3)]           # due at +250, +260, +290 ms: together
    assert st.statistics().retry_queue == 1 and st.next_due_us() == t0 + 350_000
    [send] = of(st.handle(TimePassed(clock.set(t0 + 350_000) or t0 + 350_000)), SendBatch)
    assert send.ids == [cid(4)]


def _drive_not_found(st, clock, send, step_us):
    """Answer NOT_FOUND after step_us, wait for the retry, return (give-up commands or None, send)."""
    now = clock.advance(step_us)
    given_up = st.statistics().unjoinable
    cmds = st.handle(JoinAnswered(send.batch_id, [Outcome.NOT_FOUND], now))
    if st.statistics().unjoinable > given_up:   # written right before the next checkpoint
        cmds += st.handle(TimePassed(clock.advance(S)))
        assert of(cmds, WriteUnjoinable) and type(cmds[-1]) is Checkpoint
        return cmds, None
    clock.set(st.next_due_us())
    [send] = of(st.handle(TimePassed(clock.now_us())), SendBatch)
    return None, send


def test_unjoinable_needs_both_enough_attempts_and_enough_age():
    # many quick attempts: not given up before 60 s have passed
    clock = FakeClock()
    st = state(retry_initial_s=0.01, retry_max_s=0.01)
    t0 = clock.now_us()
    [send] = of(st.handle(LinesRead([chunk([line(1)])], t0)), SendBatch)
    gave_up = None
    while gave_up is None:
        gave_up, send = _drive_not_found(st, clock, send, 1000)
    assert clock.now_us() - t0 >= 60 * S
    assert st.statistics().attempts > 3
    [w] = of(gave_up, WriteUnjoinable)
    assert w.raws == [line(1)] and st.statistics().unjoinable == 1 and st.unresolved_ids() == set()

    # old but too few attempts: a slow joiner answers NOT_FOUND after 70 s, twice; only the third gives up
    clock = FakeClock()
    st = state()
    [send] = of(st.handle(LinesRead([chunk([line(2)])], clock.now_us())), SendBatch)
    gave_up, send = _drive_not_found(st, clock, send, 70 * S)
    assert gave_up is None
    gave_up, send = _drive_not_found(st, clock, send, 70 * S)
    assert gave_up is None
    gave_up, _ = _drive_not_found(st, clock, send, 1)
    assert of(gave_up, WriteUnjoinable)[0].raws == [line(2)]


def test_throttled_and_failed_requests_retry_without_giving_up():
    clock = FakeClock()
    st = state(min_attempts=1)
    [send] = of(st.handle(LinesRead([chunk([line(1), line(2)])], clock.now_us())), SendBatch)
    cmds = st.handle(JoinFailed(send.batch_id, "unavailable", clock.advance(100 * S)))
    assert of(cmds, WriteUnjoinable) == [] and st.statistics().retry_queue == 2
    clock.set(st.next_due_us())
    [send] = of(st.handle(TimePassed(clock.now_us())), SendBatch)
    cmds = st.handle(JoinAnswered(send.batch_id, [Outcome.THROTTLED, Outcome.UNJOINABLE], clock.advance(1)))
    cmds += st.handle(TimePassed(clock.advance(S // 10)))
    assert of(cmds, WriteUnjoinable) == []                    # given up: written before the next checkpoint
    cmds = st.handle(TimePassed(clock.advance(S)))
    assert of(cmds, WriteUnjoinable)[0].raws == [line(2)] and [type(c) for c in cmds][-2:] == [WriteUnjoinable,
                                                                                               Checkpoint]
    assert st.unresolved_ids() == {cid(1)} and st.statistics().join_failures == 1


def test_a_lost_answer_resolves_the_event_as_lost_never_retried_nor_a_prevented_duplicate():
    """LOST: registered, its output write failed, in the joiner's lost-ids ledger: the recovery job's now."""
    clock = FakeClock()
    st = state(batch_size=10)
    saved = Saved()
    [send] = of(saved.take(st.handle(LinesRead([chunk([line(1), line(2), line(1)])], clock.now_us()))), SendBatch)
    cmds = saved.take(st.handle(JoinAnswered(send.batch_id, [Outcome.LOST, Outcome.JOINED], clock.advance(1))))
    assert of(cmds, WriteUnjoinable) == []
    s = st.statistics()
    assert (s.lost, s.joined, s.wasted_joins, s.retry_queue) == (1, 1, 0, 0)
    assert s.already_registered == 1              # the second line of the lost id: a real duplicate
    assert st.unresolved_ids() == set() and st.next_due_us() is None
    [cp] = of(saved.take(st.handle(TimePassed(clock.advance(S)))), Checkpoint)
    assert sorted(cp.delta["gone"]) == [cid(1), cid(2)]  # (in any order) both were in the first (full) checkpoint
    assert snapshot_events(saved.snap) == [] and saved.snap["counters"]["lost"] == 1


def test_a_duplicate_of_an_unresolved_id_is_not_sent_and_is_resolved_with_it():
    clock = FakeClock()
    st = state(batch_size=10)
    [send] = of(st.handle(LinesRead([chunk([line(1), line(2), line(1)])], clock.now_us())), SendBatch)
    assert send.ids == [cid(1), cid(2)]
    # another copy arrives while the first is in flight: still not sent
    assert of(st.handle(LinesRead([chunk([line(1, extra=1)], start=500)], clock.now_us())), SendBatch) == []
    st.handle(JoinAnswered(send.batch_id, [Outcome.NOT_FOUND, Outcome.JOINED], clock.advance(1)))
    # and while it waits for its retry
    assert of(st.handle(LinesRead([chunk([line(1)], start=900)], clock.now_us())), SendBatch) == []
    clock.set(st.next_due_us())
    [send] = of(st.handle(TimePassed(clock.now_us())), SendBatch)
    assert send.ids == [cid(1)]
    st.handle(JoinAnswered(send.batch_id, [Outcome.JOINED], clock.advance(1)))
    s = st.statistics()
    assert (s.events_read, s.joined, s.already_registered) == (5, 2, 3)
    # an unjoinable id takes its copies with it to the unjoinable output
    [send] = of(st.handle(LinesRead([chunk([line(3), line(3, extra=2)], start=2000)], clock.now_us())),
                SendBatch)
    cmds = st.handle(JoinAnswered(send.batch_id, [Outcome.UNJOINABLE], clock.advance(1)))
    cmds += st.handle(StopRequested(clock.advance(1)))       # a stop writes them too, before its checkpoint
    assert of(cmds, WriteUnjoinable)[0].raws == [line(3), line(3, extra=2)]
    assert st.statistics().unjoinable == 2


def test_bad_records_are_quarantined_with_their_offsets_and_the_good_ones_go_on():
    clock = FakeClock()
    st = state(batch_size=10)
    lines = [line(1), b"{not json", b"[1, 2]", orjson.dumps({"query_id": qid(1)}),
             orjson.dumps({"click_id": 5, "query_id": qid(1)}), orjson.dumps({"click_id": "nope", "query_id": qid(1)}),
             orjson.dumps({"click_id": cid(9), "query_id": "10.0.0.2:9:123"}), b"", line(2)]
    ch = chunk(lines, file="a/b/c.jsonl", start=100)
    cmds = st.handle(LinesRead([ch], clock.now_us()))
    [q] = of(cmds, QuarantineRecords)
    assert [(f, o) for f, o, _, _ in q.records] == [("a/b/c.jsonl", ch.offsets[i]) for i in range(1, 8)]
    reasons = [r for _, _, r, _ in q.records]
    assert reasons[0].startswith("not valid JSON") and reasons[1] == "not a JSON object but list"
    assert reasons[2] == "missing field 'click_id'" and reasons[3] == "field 'click_id' is int, not a string"
    assert "'nope'" in reasons[4] and "10.0.0.2:9:123" in reasons[5]
    assert [raw for *_, raw in q.records] == lines[1:8]
    assert of(cmds, SendBatch)[0].ids == [cid(1), cid(2)]
    s = st.statistics()
    assert (s.events_read, s.bad_records) == (9, 7)
    assert st.offsets == {"a/b/c.jsonl": ch.end}


def test_checkpoint_keeps_every_unresolved_event_and_resume_sends_them_again():
    clock = FakeClock()
    st = state(batch_size=2, max_in_flight=2)
    saved = Saved()
    t0 = clock.now_us()
    ch = chunk([line(i) for i in range(1, 7)] + [line(6)])
    cmds = saved.take(st.handle(LinesRead([ch], t0)))
    b1, b2 = of(cmds, SendBatch)
    [cp] = of(cmds, Checkpoint)                 # the first one is full
    assert len(snapshot_events(cp.snapshot)) == 6 and cp.snapshot["offsets"] == {"w0/clicks-1.jsonl": ch.end}
    clock.advance(S)
    cmds = saved.take(st.handle(JoinAnswered(b1.batch_id, [Outcome.JOINED, Outcome.NOT_FOUND], clock.now_us())))
    [b3] = of(cmds, SendBatch)  # ids 3, 4 in b2 still in flight, 2 waits for a retry, 5, 6 now in b3
    [cp] = of(cmds, Checkpoint)                 # later ones only say what changed
    assert cp.snapshot is None and delta_events(cp.delta) == [] and cp.delta["gone"] == [cid(1)]
    assert sorted(cp.delta["sent"]) == [cid(5), cid(6)]
    snap = saved.snap  # what the files hold
    assert snap["format"] == 2 and snap["written_at_us"] == clock.now_us()
    events = {e[0]: e for e in snapshot_events(snap)}
    assert set(events) == {cid(i) for i in range(2, 7)}
    assert events[cid(2)] == [cid(2), qid(2), line(2).decode(), t0, 1, []]
    assert events[cid(6)] == [cid(6), qid(6), line(6).decode(), t0, 1, [line(6).decode()]]
    assert snap["counters"]["joined"] == 1
    assert snap["events"] == orjson.loads(orjson.dumps(st.snapshot(clock.now_us())))["events"]
    # no change, no checkpoint; a change before the interval waits for it
    assert of(st.handle(TimePassed(clock.advance(S))), Checkpoint) == []

    resumed = state(batch_size=10, restore=snap)
    assert resumed.offsets == {"w0/clicks-1.jsonl": ch.end}
    [send] = of(resumed.handle(TimePassed(clock.advance(1))), SendBatch)
    assert sorted(send.ids) == [cid(i) for i in range(2, 7)]
    cmds = resumed.handle(JoinAnswered(send.batch_id, [Outcome.JOINED if i == cid(6) else Outcome.ALREADY_REGISTERED
                                                       for i in send.ids], clock.advance(1)))
    s = resumed.statistics()
    assert (s.joined, s.wasted_joins, s.already_registered) == (2, 4, 5)
    assert resumed.unresolved_ids() == set()
    assert of(resumed.handle(StopRequested(clock.advance(1))), Checkpoint)[0].snapshot["events"]["ids"] == []


def test_checkpoints_come_at_most_once_per_interval():
    clock = FakeClock()
    st = state()
    assert of(st.handle(LinesRead([chunk([line(1)])], clock.now_us())), Checkpoint)
    assert of(st.handle(LinesRead([chunk([line(2)], start=100)], clock.advance(100_000))), Checkpoint) == []
    assert of(st.handle(TimePassed(clock.advance(100_000))), Checkpoint)
    assert of(st.handle(TimePassed(clock.advance(300_000))), Checkpoint) == []


def test_a_delta_holds_only_what_changed_and_events_resolved_between_checkpoints_are_in_none():
    clock = FakeClock()
    st = state(batch_size=10, max_in_flight=1)
    saved = Saved()
    lines = [line(i) for i in range(1, 20_001)]                 # 20,000 unresolved: the first checkpoint
    cmds = saved.take(st.handle(LinesRead([chunk(lines)], clock.now_us())))
    assert len(snapshot_events(of(cmds, Checkpoint)[0].snapshot)) == 20_000
    [send] = of(cmds, SendBatch)
    # a new click read, sent and joined before the next checkpoint, one old one joined: neither is rewritten
    cmds = saved.take(st.handle(JoinAnswered(send.batch_id, [Outcome.JOINED] * 10, clock.advance(S))))
    [cp] = of(cmds, Checkpoint)
    assert (cp.snapshot, delta_events(cp.delta), len(cp.delta["gone"]), len(cp.delta["sent"])) == (None, [], 10, 10)
    assert len(encode_delta(cp.delta)) < 2_000
    assert len(snapshot_events(saved.snap)) == 19_990
    [send] = of(cmds, SendBatch)
    cmds = saved.take(st.handle(LinesRead([chunk([line(30_000), line(30_000, extra=1)], start=10**7)],
                                          clock.now_us()),
                                JoinAnswered(send.batch_id, [Outcome.JOINED] * 10, clock.advance(S))))
    [cp] = of(cmds, Checkpoint)
    assert [e[0] for e in delta_events(cp.delta)] == [cid(30_000)] and delta_events(cp.delta)[0][5] == [line(30_000, extra=1).decode()]
    assert saved.snap["events"] == orjson.loads(orjson.dumps(st.snapshot(clock.now_us())))["events"]
    assert saved.snap["offsets"] == st.offsets and saved.snap["counters"]["joined"] == 20
    assert (saved.full, saved.deltas) == (1, 2)


def test_a_full_checkpoint_replaces_the_journal_once_it_outgrows_the_unresolved_events(monkeypatch):
    import dispatcher._state as core
    monkeypatch.setattr(core, "JOURNAL_COMPACT_MIN_ENTRIES", 20)
    clock = FakeClock()
    st = state(batch_size=5, max_in_flight=1)
    saved = Saved()
    [send] = of(saved.take(st.handle(LinesRead([chunk([line(i) for i in range(1, 9)])], clock.now_us()))),
                SendBatch)
    kinds = []
    for _ in range(6):           # every answer NOT_FOUND: only "sent" entries, 5 per checkpoint
        cmds = saved.take(st.handle(JoinAnswered(send.batch_id, [Outcome.NOT_FOUND] * len(send.ids),
                                                 clock.advance(S))))
        clock.set(st.next_due_us())
        cmds += saved.take(st.handle(TimePassed(clock.now_us())))
        kinds += ["full" if cp.snapshot is not None else "delta" for cp in of(cmds, Checkpoint)]
        [send] = of(cmds, SendBatch)
    assert "full" in kinds and kinds[0] == "delta"
    assert saved.snap["events"] == orjson.loads(orjson.dumps(st.snapshot(clock.now_us())))["events"]


def test_caught_up_only_when_the_scan_was_empty_and_nothing_is_unresolved():
    clock = FakeClock()
    st = state()
    assert not st.caught_up
    [send] = of(st.handle(LinesRead([chunk([line(1)])], clock.now_us())), SendBatch)
    st.handle(LinesRead([], clock.advance(10)))
    assert not st.caught_up and st.statistics().scan_at_us == clock.now_us()
    st.handle(JoinAnswered(send.batch_id, [Outcome.NOT_FOUND], clock.advance(10)))
    assert not st.caught_up and st.statistics().retry_queue == 1
    clock.set(st.next_due_us())
    [send] = of(st.handle(TimePassed(clock.now_us())), SendBatch)
    st.handle(JoinAnswered(send.batch_id, [Outcome.JOINED], clock.advance(10)))
    assert st.caught_up
    st.handle(LinesRead([chunk([line(2)], start=100)], clock.advance(10)))
    assert not st.caught_up


def test_latency_percentiles():
    assert percentiles_ms([]) == {}
    assert percentiles_ms([i * 1000 for i in range(1, 101)]) == {"p50": 50.0, "p90": 90.0, "p99": 99.0}
    clock = FakeClock()
    st = state()
    [send] = of(st.handle(LinesRead([chunk([line(1)])], clock.now_us())), SendBatch)
    st.handle(JoinAnswered(send.batch_id, [Outcome.JOINED], clock.advance(12_000)))
    assert st.statistics().join_latency_ms == {"p50": 12.0, "p90": 12.0, "p99": 12.0}


def test_unknown_checkpoint_format_is_refused():
    with pytest.raises(ValueError, match="format"):
        state(restore={"format": 99, "offsets": {}, "events": []})


def test_the_oldest_unresolved_click_is_reported_until_it_is_resolved():
    clock = FakeClock()
    st = state()
    assert st.statistics().oldest_unresolved_us == 0
    cmds = st.handle(LinesRead([chunk([line(5), line(2), line(9)])], clock.now_us()))
    assert st.statistics().oldest_unresolved_us == id_timestamp_us(cid(2))   # the smallest time, not the first
    [send] = of(cmds, SendBatch)
    outcomes = bytearray(Outcome.JOINED if i == cid(2) else Outcome.THROTTLED for i in send.ids)
    st.handle(JoinAnswered(send.batch_id, outcomes, clock.advance(1000)))
    assert st.statistics().oldest_unresolved_us == id_timestamp_us(cid(5))   # 2 joined; 5 and 9 wait


def test_a_recovered_click_is_never_dropped_on_a_lookup_the_commit_decides():
    """photon recover deleted it from the registry just before; a replica that has not seen the delete yet may
    still say present. A click of the recovery stream goes to a joiner anyway (its checkpoint says so too)."""
    clock = FakeClock()
    st = state(lookups=True)
    cmds = st.handle(LinesRead([chunk([line(1)], file="../clicks-recovery/r-1.jsonl"), chunk([line(2)])],
                               clock.now_us()))
    lookups = of(cmds, Lookup)
    assert sorted(i for lk in lookups for i in lk.ids) == [cid(1), cid(2)]
    sent = []
    for lk in lookups:
        sent += of(st.handle(LookupAnswered(lk.batch_id, [True] * len(lk.ids), clock.advance(10))), SendBatch)
    assert [s.ids for s in sent] == [[cid(1)]]                # the plain click 2 was dropped as registered
    snap = st.snapshot(clock.now_us())
    assert snap["recovered"] == [cid(1)]
    again = state(lookups=True, restore=snap)
    [lk] = of(again.handle(TimePassed(clock.advance(10))), Lookup)
    assert of(again.handle(LookupAnswered(lk.batch_id, [True], clock.advance(10))), SendBatch)[0].ids == [cid(1)]


def test_clicks_throttled_while_the_store_catches_up_wait_for_it_instead_of_backing_off():
    """A cold start: the event store is still reading its backlog, so a click whose query it has not read
    comes back THROTTLED with store_behind. It waits (no retry by backoff) until an answer says the store
    is no longer behind; meanwhile one batch of them goes out every STORE_PROBE_EVERY_US as a probe."""
    from dispatcher._state import STORE_PROBE_EVERY_US
    clock = FakeClock()
    st = state(batch_size=2, max_in_flight=1)
    [send] = of(st.handle(LinesRead([chunk([line(i) for i in range(1, 6)])], clock.now_us())), SendBatch)
    assert send.ids == [cid(1), cid(2)]
    cmds = st.handle(JoinAnswered(send.batch_id, [Outcome.THROTTLED, Outcome.JOINED], clock.advance(1_000),
                                  store_behind=True))
    [send] = of(cmds, SendBatch)                        # new clicks go on being sent at once
    assert send.ids == [cid(3), cid(4)] and st.statistics().waiting_for_store == 1
    assert st.statistics().retry_queue == 0 and not st.caught_up
    cmds = st.handle(JoinAnswered(send.batch_id, [Outcome.THROTTLED, Outcome.THROTTLED], clock.advance(1_000),
                                  store_behind=True))
    [send] = of(cmds, SendBatch)
    assert send.ids == [cid(5)] and st.statistics().waiting_for_store == 3
    cmds = st.handle(JoinAnswered(send.batch_id, [Outcome.THROTTLED], clock.advance(1_000), store_behind=True))
    assert of(cmds, SendBatch) == []                    # nothing out: the next probe is due later, not a backoff
    probe_at = st.next_due_us()
    assert probe_at > clock.now_us() and st.statistics().waiting_for_store == 4
    clock.set(probe_at)
    [probe] = of(st.handle(TimePassed(clock.now_us())), SendBatch)
    assert probe.ids == [cid(1), cid(3)]                # the longest waiting, one batch
    cmds = st.handle(JoinAnswered(probe.batch_id, [Outcome.THROTTLED, Outcome.THROTTLED], clock.advance(1_000),
                                  store_behind=True))
    assert of(cmds, SendBatch) == [] and st.next_due_us() >= clock.now_us() + STORE_PROBE_EVERY_US - 1_000
    clock.set(st.next_due_us())
    [probe] = of(st.handle(TimePassed(clock.now_us())), SendBatch)
    assert probe.ids == [cid(4), cid(5)]
    # the store has caught up: everything still waiting goes out at once
    cmds = st.handle(JoinAnswered(probe.batch_id, [Outcome.JOINED, Outcome.JOINED], clock.advance(1_000)))
    [send] = of(cmds, SendBatch)
    assert send.ids == [cid(1), cid(3)] and st.statistics().waiting_for_store == 0
    st.handle(JoinAnswered(send.batch_id, [Outcome.JOINED, Outcome.JOINED], clock.advance(1_000)))
    s = st.statistics()
    assert (s.joined, s.unjoinable) == (5, 0) and s.attempts == 11 and st.unresolved_ids() == set()


def test_a_click_waits_for_the_store_at_most_the_longest_retry_delay_while_answers_keep_coming():
    """Answers that keep saying "behind" while new clicks flow send no probe, and hold no click back longer
    than the longest retry delay (here 1 s)."""
    clock = FakeClock()
    st = state(batch_size=1, max_in_flight=1, retry_max_s=1.0)
    [send] = of(st.handle(LinesRead([chunk([line(1)])], clock.now_us())), SendBatch)
    sent, pos = [], 100
    for n in range(2, 40):        # one new click per 50 ms; every answer THROTTLED with store_behind
        sent.append((clock.now_us(), send.ids))
        new = chunk([line(n)], start=pos)
        pos = new.end
        cmds = st.handle(LinesRead([new], clock.advance(50_000)),
                         JoinAnswered(send.batch_id, [Outcome.THROTTLED], clock.now_us(), store_behind=True))
        [send] = of(cmds, SendBatch)
    times = [t for t, ids in sent if ids == [cid(1)]]
    assert len(times) == 2                                  # no probe while answers keep coming ...
    assert S <= times[1] - times[0] <= S + 150_000          # ... and released once it waited 1 s
    assert st.statistics().waiting_for_store > 0


QKEY = "10.0.0.2:9"


def qtime(n: int) -> int:
    return id_timestamp_us(qid(n))


def test_clicks_whose_query_the_store_has_not_read_are_held_back_until_it_has():
    """A cold start with the store's position: a click whose query's time is past what the event store has
    read of that query's key is not sent (it would come back THROTTLED) but held back, and goes, in front, as
    soon as an answer says the store has read past it; with every click held and nothing out, an empty
    request asks how far the store has read. Each click is sent once, but the one sent before the first
    answer told the dispatcher where the store was."""
    clock = FakeClock()
    st = state(batch_size=2, max_in_flight=1)
    [send] = of(st.handle(LinesRead([chunk([line(i) for i in range(1, 7)])], clock.now_us())), SendBatch)
    assert send.ids == [cid(1), cid(2)]
    cmds = st.handle(JoinAnswered(send.batch_id, [Outcome.JOINED, Outcome.THROTTLED], clock.advance(1_000),
                                  store_behind=True, store_read_to={QKEY: qtime(1)}, store_read_through_us=0))
    [probe] = of(cmds, SendBatch)                       # 2 to 6 are all past the store: only a probe goes
    assert probe.ids == [] and probe.ref_ids == [] and probe.raws == []
    s = st.statistics()
    assert (s.ahead_of_store, s.waiting_for_store, s.held_for_store, s.store_probes) == (5, 5, 5, 1)
    assert not st.caught_up and s.retry_queue == 0 and s.oldest_unresolved_us == id_timestamp_us(cid(2))
    cmds = st.handle(JoinAnswered(probe.batch_id, [], clock.advance(1_000), store_behind=True,
                                  store_read_to={QKEY: qtime(4)}, store_read_through_us=0))
    [send] = of(cmds, SendBatch)
    assert send.ids == [cid(2), cid(3)] and st.statistics().ahead_of_store == 2
    cmds = st.handle(JoinAnswered(send.batch_id, [Outcome.JOINED, Outcome.JOINED], clock.advance(1_000),
                                  store_behind=True, store_read_to={QKEY: qtime(4)}, store_read_through_us=0))
    [send] = of(cmds, SendBatch)
    assert send.ids == [cid(4)]
    # the store has caught up (no position any more): everything held goes
    cmds = st.handle(JoinAnswered(send.batch_id, [Outcome.JOINED], clock.advance(1_000)))
    [send] = of(cmds, SendBatch)
    assert send.ids == [cid(5), cid(6)] and st.statistics().ahead_of_store == 0
    st.handle(JoinAnswered(send.batch_id, [Outcome.JOINED, Outcome.JOINED], clock.advance(1_000)))
    s = st.statistics()
    assert (s.joined, s.attempts, s.held_for_store, s.store_probes) == (6, 7, 5, 1)
    st.handle(LinesRead([], clock.advance(1_000)))
    assert st.unresolved_ids() == set() and st.caught_up


@pytest.mark.timeout(10)
def test_a_request_holds_each_writers_ids_together_in_time_order():
    """Clicks of two writers, released by the store's progress in their queries' order (the writers
    interleaved), go in one request with each writer's ids together and in time order: the registry packs a
    writer's run of ids as one item and takes a mix id by id."""
    clock = FakeClock()
    st = state(batch_size=10, max_in_flight=1)
    other = [format_event_id("10.0.0.5", 3, 1_763_712_000_000_000 + n) for n in range(1, 5)]
    # writer 10.0.0.1:7 clicks 1-4 on queries 1, 3, 5, 7; writer 10.0.0.5:3 clicks on queries 2, 4, 6, 8
    a = chunk([line(n, q=2 * n - 1) for n in range(1, 5)], file="w0/clicks-1.jsonl")
    b = chunk([orjson.dumps({"click_id": c, "query_id": qid(2 * n + 2)}) for n, c in enumerate(other)],
              file="w1/clicks-1.jsonl")
    [probe] = of(st.handle(LinesRead([a, b], clock.now_us())), SendBatch)
    assert probe.ids == sorted(probe.ids) and len(probe.ids) == 8
    cmds = st.handle(JoinAnswered(probe.batch_id, [Outcome.THROTTLED] * 8, clock.advance(1_000), store_behind=True,
                                  store_read_to={QKEY: qtime(0)}, store_read_through_us=0))
    [empty] = of(cmds, SendBatch)
    assert empty.ids == [] and st.statistics().ahead_of_store == 8
    cmds = st.handle(JoinAnswered(empty.batch_id, [], clock.advance(1_000), store_behind=True,
                                  store_read_to={QKEY: qtime(8)}, store_read_through_us=0))
    [send] = of(cmds, SendBatch)
    assert send.ids == [cid(1), cid(2), cid(3), cid(4)] + other
    assert send.ref_ids == [qid(1), qid(3), qid(5), qid(7), qid(2), qid(4), qid(6), qid(8)]


@pytest.mark.timeout(10)
def test_an_answer_carrying_an_older_store_position_does_not_hold_back_clicks_again():
    """Requests sent at once come back in any order, each with the store's position its lookup saw: the
    dispatcher keeps the later position key by key, so a click released by one answer is not held again by an
    older one that arrives after it."""
    clock = FakeClock()
    st = state(batch_size=1, max_in_flight=2)
    [a, b] = of(st.handle(LinesRead([chunk([line(i) for i in range(1, 7)])], clock.now_us())), SendBatch)
    behind = dict(store_behind=True, store_read_through_us=0)
    cmds = st.handle(JoinAnswered(a.batch_id, [Outcome.JOINED], clock.advance(1_000),
                                  store_read_to={QKEY: qtime(2)}, **behind))
    assert of(cmds, SendBatch) == [] and st.statistics().ahead_of_store == 4      # 3 to 6 held
    cmds = st.handle(JoinAnswered(b.batch_id, [Outcome.JOINED], clock.advance(1_000),
                                  store_read_to={QKEY: qtime(5)}, **behind))
    [c, d] = of(cmds, SendBatch)                       # 3, 4 and 5 released; two slots
    assert (c.ids, d.ids) == ([cid(3)], [cid(4)]) and st.statistics().queued == 1
    cmds = st.handle(JoinAnswered(c.batch_id, [Outcome.JOINED], clock.advance(1_000),
                                  store_read_to={QKEY: qtime(2)}, **behind))   # an older lookup's position
    [e] = of(cmds, SendBatch)
    assert e.ids == [cid(5)]
    s = st.statistics()
    assert (s.held_for_store, s.ahead_of_store) == (4, 1)


def test_the_later_of_two_store_positions_is_taken_key_by_key():
    from dispatcher._state import later_position
    assert later_position({"k1": 10, "k2": 50}, 5, {"k1": 20, "k3": 7}, 30) == ({"k1": 20, "k2": 50, "k3": 7}, 30)
    assert later_position({}, 40, {"k1": 20}, 30) == ({"k1": 40}, 40)


def test_clicks_held_back_for_the_store_count_against_the_read_ahead():
    """A cold start does not read the click logs far ahead of the store: held clicks take the place of queued
    ones in the read-ahead (backlog_batch_size x max_in_flight), so the rest stays in the logs until the store
    has read their queries."""
    clock = FakeClock()
    st = state(batch_size=5, max_in_flight=2)
    assert st.lines_wanted() == 10
    [a, b] = of(st.handle(LinesRead([chunk([line(i) for i in range(1, 11)])], clock.now_us())), SendBatch)
    assert st.lines_wanted() == 10                     # all ten in flight, none queued
    behind = dict(store_behind=True, store_read_to={QKEY: qtime(2)}, store_read_through_us=0)
    st.handle(JoinAnswered(a.batch_id, [Outcome.JOINED] * 2 + [Outcome.THROTTLED] * 3, clock.advance(1_000), **behind))
    assert st.statistics().ahead_of_store == 3 and st.lines_wanted() == 7
    cmds = st.handle(JoinAnswered(b.batch_id, [Outcome.THROTTLED] * 5, clock.advance(1_000), **behind))
    assert st.statistics().ahead_of_store == 8 and st.lines_wanted() == 2
    [probe] = of(cmds, SendBatch)                      # nothing else out: how far has the store read?
    assert probe.ids == []
    st.handle(JoinAnswered(probe.batch_id, [], clock.advance(1_000), store_behind=True,
                           store_read_to={QKEY: qtime(6)}, store_read_through_us=0))
    assert st.statistics().ahead_of_store == 4 and st.lines_wanted() == 10 - 4 - 0


def test_a_click_is_held_only_for_its_own_query_key_and_a_key_the_store_has_not_met_waits_for_read_through():
    clock = FakeClock()
    st = state(batch_size=10, max_in_flight=1)
    other = format_event_id("10.0.0.3", 5, 1_763_711_000_000_000 + 50)          # a key the store has not met
    lines = [line(1), line(2), orjson.dumps({"click_id": cid(3), "query_id": other})]
    [send] = of(st.handle(LinesRead([chunk(lines)], clock.now_us())), SendBatch)
    cmds = st.handle(JoinAnswered(send.batch_id, [Outcome.THROTTLED] * 3, clock.advance(1_000), store_behind=True,
                                  store_read_to={QKEY: qtime(5)}, store_read_through_us=qtime(0)))
    [send] = of(cmds, SendBatch)                        # 1 and 2 are read (not found: back to waiting), 3 held
    assert send.ids == [] and st.statistics().ahead_of_store == 1
    assert st.statistics().waiting_for_store == 3
    cmds = st.handle(JoinAnswered(send.batch_id, [], clock.advance(1_000), store_behind=True,
                                  store_read_to={QKEY: qtime(9)}, store_read_through_us=id_timestamp_us(other)))
    assert st.statistics().ahead_of_store == 0          # the store has read every key up to its time


def test_a_held_click_goes_after_the_longest_retry_delay_and_a_missing_query_is_then_retried_as_usual():
    """A position that never passes the query (a query never logged, a store that stays behind) holds its click
    at most ``retry_max_s``; then the click is sent, and with the store caught up its NOT_FOUND answers follow
    the normal schedule until it is given up as unjoinable."""
    clock = FakeClock()
    st = DispatcherState(JoinConfig(unjoinable_after_s=3.0),
                         DispatcherConfig(batch_size=10, backlog_batch_size=10, max_in_flight=1, retry_initial_s=0.25,
                                          retry_max_s=1.0, min_attempts=3, checkpoint_interval_s=0.2), lookups=False)
    [send] = of(st.handle(LinesRead([chunk([line(7)])], clock.now_us())), SendBatch)
    behind = dict(store_behind=True, store_read_to={QKEY: qtime(1)}, store_read_through_us=0)
    cmds = st.handle(JoinAnswered(send.batch_id, [Outcome.THROTTLED], clock.advance(1_000), **behind))
    held_at = clock.now_us()
    sent = []
    while True:                                         # probes (every STORE_POSITION_PROBE_US) keep saying behind
        for c in of(cmds, SendBatch):
            if c.ids:
                sent.append(clock.now_us())
                break
            cmds = st.handle(JoinAnswered(c.batch_id, [], clock.advance(1_000), **behind))
        else:
            clock.set(st.next_due_us())
            cmds = st.handle(TimePassed(clock.now_us()))
            continue
        break
    assert S <= sent[0] - held_at <= S + 60_000         # held no longer than retry_max_s
    probes = S / STORE_POSITION_PROBE_US                # one probe per interval while held (15-25 at 50 ms)
    assert 0.75 * probes <= st.statistics().store_probes <= 1.25 * probes
    assert st.statistics().oldest_unresolved_us == id_timestamp_us(cid(7))
    [send] = of(cmds, SendBatch)
    attempts = 2
    while True:                                         # the store has caught up: NOT_FOUND, retried, given up
        cmds = st.handle(JoinAnswered(send.batch_id, [Outcome.NOT_FOUND], clock.advance(1_000)))
        if st.statistics().unjoinable:
            break
        while not of(cmds, SendBatch):
            clock.set(st.next_due_us())
            cmds = st.handle(TimePassed(clock.now_us()))
        [send] = of(cmds, SendBatch)
        attempts += 1
    s = st.statistics()
    assert s.unjoinable == 1 and s.attempts == attempts >= 3 and s.ahead_of_store == 0


def test_clicks_held_again_and_again_leave_no_trail_in_the_hold(monkeypatch):
    """A store that stays behind: each click goes every retry_max_s, comes back THROTTLED and is held again,
    while the others stay held. The hold's heaps (released clicks leave them lazily) are rebuilt before they
    outgrow what is held."""
    import dispatcher._state as core
    monkeypatch.setattr(core, "OLDEST_HEAP_SLACK", 0)
    clock = FakeClock()
    st = state(batch_size=1, max_in_flight=1, retry_max_s=0.1)
    [send] = of(st.handle(LinesRead([chunk([line(i) for i in range(10, 30)])], clock.now_us())), SendBatch)
    behind = dict(store_behind=True, store_read_to={QKEY: qtime(1)}, store_read_through_us=0)
    sent = 0
    for _ in range(300):
        cmds = st.handle(JoinAnswered(send.batch_id, [Outcome.THROTTLED] * len(send.ids), clock.advance(1_000),
                                      **behind))
        while not of(cmds, SendBatch):
            clock.set(st.next_due_us())
            cmds = st.handle(TimePassed(clock.now_us()))
        [send] = of(cmds, SendBatch)
        sent += bool(send.ids)
        assert st._ahead.entries() <= 2 * 20 + 1      # not one entry per time held
    assert sent >= 100 and len(st.unresolved_ids()) == 20


def test_a_delta_of_an_id_resolved_and_read_again_keeps_the_new_event():
    clock = FakeClock()
    st = state(batch_size=1, max_in_flight=1)
    saved = Saved()
    [send] = of(saved.take(st.handle(LinesRead([chunk([line(1)])], clock.now_us()))), SendBatch)   # full
    cmds = st.handle(JoinAnswered(send.batch_id, [Outcome.JOINED], clock.advance(1_000)),
                     LinesRead([chunk([line(1, extra=1)], start=500)], clock.advance(1_000)))
    saved.take(cmds + st.handle(TimePassed(clock.advance(S))))
    assert [e[0] for e in snapshot_events(saved.snap)] == [cid(1)] == list(st.unresolved_ids())
    assert snapshot_events(saved.snap)[0][2] == line(1, extra=1).decode()


@pytest.mark.timeout(10)
def test_a_click_released_by_the_stores_progress_is_not_checked_against_it_again(monkeypatch):
    """Clicks held back for the store and released (in front of the queue) by an answer saying it has read
    past their queries go without a second check against its position (which never goes back, so they would
    pass): each click is checked once, held once, and sent in the same order as before."""
    clock = FakeClock()
    st = state(batch_size=2, max_in_flight=1)
    checked: list[str] = []
    check = st._not_ahead
    monkeypatch.setattr(st, "_not_ahead", lambda cids, now: checked.extend(cids) or check(cids, now))
    [send] = of(st.handle(LinesRead([chunk([line(i) for i in range(1, 8)])], clock.now_us())), SendBatch)
    assert send.ids == [cid(1), cid(2)] and checked == []          # the store's position not known yet
    behind = {"store_behind": True, "store_read_through_us": 0}
    [probe] = of(st.handle(JoinAnswered(send.batch_id, [Outcome.JOINED] * 2, clock.advance(1_000),
                                        store_read_to={QKEY: qtime(2)}, **behind)), SendBatch)
    assert probe.ids == [] and checked == [cid(i) for i in range(3, 8)]       # all held: only a probe goes
    [send] = of(st.handle(JoinAnswered(probe.batch_id, [], clock.advance(1_000), store_read_to={QKEY: qtime(5)},
                                       **behind)), SendBatch)
    assert send.ids == [cid(3), cid(4)] and st.statistics().queued == 1   # 3, 4, 5 released, 5 still queued
    [send] = of(st.handle(JoinAnswered(send.batch_id, [Outcome.JOINED] * 2, clock.advance(1_000),
                                       store_read_to={QKEY: qtime(5)}, **behind)), SendBatch)
    assert send.ids == [cid(5)]
    assert checked == [cid(i) for i in range(3, 8)]                   # none of 3, 4, 5 checked a second time
    s = st.statistics()
    assert (s.held_for_store, s.ahead_of_store, s.queued) == (5, 2, 0)
    # a THROTTLED answer for a click released that way is checked as before (the store has read past its
    # query, so it waits for the store instead of being held)
    cmds = st.handle(JoinAnswered(send.batch_id, [Outcome.THROTTLED], clock.advance(1_000),
                                  store_read_to={QKEY: qtime(4)}, **behind))
    assert of(cmds, SendBatch) == [] and checked == [cid(i) for i in range(3, 8)] + [cid(5)]
    s = st.statistics()
    assert (s.held_for_store, s.ahead_of_store, s.waiting_for_store) == (5, 2, 3)
