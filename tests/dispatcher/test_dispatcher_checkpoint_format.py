"""The journal's deltas: format 2 (the events read since as columns, their lines as one string) rebuilds the
same checkpoint as format 1 (the same events as rows) on random histories, and both restore to the same
state; a journal of format 1 is still read, and a delta of an unknown format is refused before it is applied."""
from __future__ import annotations

import dataclasses
import random

import orjson
import pytest
from test_dispatcher_property import START, Harness, make_lines

from dispatcher import DispatcherState
from dispatcher._state import (
    DELTA_FORMAT,
    Checkpoint,
    TimePassed,
    apply_delta,
    delta_events,
)
from photon import format_event_id


def roundtrip(obj):
    return orjson.loads(orjson.dumps(obj))


class TwoWays(Harness):
    """The property test's harness, keeping beside the checkpoint rebuilt from the deltas as written (format
    2) one rebuilt from the same deltas written the old way (format 1: the added events as rows, taken from
    the state's own snapshot at that moment)."""

    def __init__(self, *args) -> None:
        self.old = None
        self.deltas = self.listed = 0     # deltas compared; of those, with the lines one by one (a newline)
        super().__init__(*args)

    def start(self, snapshot):
        self.cfg = dataclasses.replace(self.cfg, checkpoint_interval_s=0.0)   # a checkpoint at every change
        super().start(snapshot)

    def apply(self, cmds):
        for c in cmds:
            if type(c) is Checkpoint:
                if c.snapshot is not None:
                    self.old = roundtrip(c.snapshot)
                else:
                    new = roundtrip(c.delta)
                    assert new["format"] == DELTA_FORMAT and "add" not in new
                    rows = {e[0]: e for e in roundtrip(self.core.snapshot(self.now))["events"]}
                    old = {k: v for k, v in new.items() if k not in ("format", "added")}
                    old["add"] = [rows[i] for i in new["added"]["ids"]]
                    self.old = apply_delta(self.old, roundtrip(old))
                    self.deltas += 1
                    self.listed += type(new["added"]["raws"]) is list
        super().apply(cmds)
        assert self.checkpoint == self.old
        if self.checkpoint is not None:       # the snapshot format itself is unchanged: rows, format 1
            assert self.checkpoint["format"] == 1


def lines_with_newlines(rng: random.Random, n: int) -> list[bytes]:
    """Lines as the property test makes them, some with a newline inside (JSON allows one between tokens; a
    delta then holds its lines one by one) and some copies of earlier clicks."""
    out = []
    for ln in make_lines(rng, n):
        if rng.random() < 0.1 and not ln.startswith(b"{broken"):
            ln = ln.replace(b",", b",\n", 1)
        out.append(ln)
    return out


@pytest.mark.timeout(120)
def test_a_checkpoint_written_the_new_way_restores_to_the_same_state_as_the_old_way():
    """300 random histories (seeded: the same each run) of reads, answers (some while the store is behind,
    with its position), failures, time, crashes and stops, with a checkpoint at every change: after every
    step the checkpoint rebuilt from the deltas as written equals the one rebuilt from the old way's, and at
    every crash both restore to the same state."""
    deltas = listed = 0
    for seed in range(300):
        rng = random.Random(seed)
        lines = (lines_with_newlines if seed % 2 else make_lines)(rng, rng.randrange(10, 60))
        h = TwoWays(lines, rng.random() < 0.5, rng.randrange(1, 8), rng.randrange(1, 5))
        for _ in range(rng.randrange(20, 80)):
            a = rng.choice(["read", "read", "answer", "answer", "answer", "tick", "crash", "stop"])
            if h.step(a, rng):
                pass
            elif a == "crash":
                restored = [DispatcherState(h.join, h.cfg, lookups=h.lookups, restore=roundtrip(c))
                            for c in (h.checkpoint, h.old)]
                assert restored[0].snapshot(h.now) == restored[1].snapshot(h.now)
                assert restored[0].statistics() == restored[1].statistics()
                h.crash()
            else:
                h.stop_and_restart()
        deltas += h.deltas
        listed += h.listed
    assert deltas >= 3000 and listed >= 50, (deltas, listed)     # the comparisons above did happen


def test_a_journal_line_of_format_1_is_still_read():
    snap = {"format": 1, "written_at_us": 1, "offsets": {"a": 10},
            "events": [["x", "qx", '{"c":"x"}', 5, 1, []], ["y", "qy", '{"c":"y"}', 6, 0, []]],
            "recovered": [], "counters": {}, "join_latency_hist": {}}
    old = {"written_at_us": 2, "offsets": {"a": 20}, "add": [["z", "qz", '{"c":"z"}', 7, 0, ['{"c":"z","n":2}']]],
           "recovered": [], "dup": [["y", '{"c":"y","n":2}']], "sent": ["x"], "gone": ["y"], "counters": {},
           "join_latency_hist": {}}
    assert delta_events(old) == old["add"]
    got = apply_delta(roundtrip(snap), roundtrip(old))
    assert got["events"] == [["x", "qx", '{"c":"x"}', 5, 2, []], ["z", "qz", '{"c":"z"}', 7, 0, ['{"c":"z","n":2}']]]
    new = {"format": 2, **{k: v for k, v in old.items() if k != "add"},
           "added": {"ids": ["z"], "refs": ["qz"], "raws": '{"c":"z"}', "first_seen": [7], "attempts": [0],
                     "dups": {"z": ['{"c":"z","n":2}']}}}
    assert apply_delta(roundtrip(snap), new) == got


def test_a_delta_of_an_unknown_format_is_refused_before_anything_is_applied():
    snap = {"format": 1, "written_at_us": 1, "offsets": {"a": 10}, "events": [["x", "qx", "{}", 5, 1, []]],
            "recovered": [], "counters": {}, "join_latency_hist": {}}
    before = roundtrip(snap)
    with pytest.raises(ValueError, match="format 3"):
        apply_delta(snap, {"format": 3, "written_at_us": 2, "offsets": {}, "added": {}, "recovered": [], "dup": [],
                           "sent": ["x"], "gone": ["x"], "counters": {}, "join_latency_hist": {}})
    assert snap == before


def test_a_delta_holds_the_lines_read_since_as_one_string():
    from dispatcher import DispatcherConfig
    from dispatcher._state import ChunkRead, LinesRead
    from photon import JoinConfig
    core = DispatcherState(JoinConfig(unjoinable_after_s=60.0),
                           DispatcherConfig(batch_size=1, max_in_flight=1, checkpoint_interval_s=0.0))
    lines = [orjson.dumps({"click_id": format_event_id("10.0.0.1", 1, START + k),
                           "query_id": format_event_id("10.0.0.2", 2, START + k)}) for k in range(5)]
    offsets = [sum(len(x) + 1 for x in lines[:k]) for k in range(5)]
    core.handle(LinesRead([ChunkRead("f", offsets[:2], lines[:2], offsets[2])], START))     # the full one
    [cp] = [c for c in core.handle(LinesRead([ChunkRead("f", offsets[2:], lines[2:], offsets[-1] + len(lines[-1]) + 1)],
                                             START + 1), TimePassed(START + 2)) if type(c) is Checkpoint]
    added = cp.delta["added"]
    assert added["raws"] == b"\n".join(lines[2:]).decode() and added["dups"] == {}
    assert added["ids"] == [format_event_id("10.0.0.1", 1, START + k) for k in range(2, 5)]
    assert added["attempts"] == [0, 0, 0] and added["first_seen"] == [START + 1] * 3
