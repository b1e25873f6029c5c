"""The journal's deltas and the full snapshot: format 3 of the deltas (the events as columns, their lines as
bytes after the delta's JSON line) and format 2 (the same columns, the lines as one string inside the JSON)
rebuild the same checkpoint as format 1 (the same events as rows) on random histories, and all restore to the
same state; a journal or a snapshot of formats 1 and 2 is still read (also from the files), a journal cut anywhere
loads its complete records only, and a delta or snapshot of an unknown format is refused before anything is
applied."""
from __future__ import annotations

import dataclasses
import random

import orjson
import pytest
from test_dispatcher_property import START, Harness, make_lines

from dispatcher import DispatcherState
from dispatcher._files import CheckpointFiles, decode_journal, encode_delta, load_checkpoint
from dispatcher._state import (
    CHECKPOINT_FORMAT,
    DELTA_FORMAT,
    Checkpoint,
    StopRequested,
    TimePassed,
    apply_delta,
    delta_events,
    snapshot_as_rows,
    snapshot_events,
)
from photon import format_event_id


def roundtrip(obj):
    return orjson.loads(orjson.dumps(obj))


class TwoWays(Harness):
    """The property test's harness, keeping beside the checkpoint rebuilt from the deltas as the journal holds
    them (format 3) one rebuilt from the same deltas written the old way (format 1: the added events as rows,
    taken from the state's own snapshot at that moment) and one from them written as format 2 (the lines as
    text inside the JSON line)."""

    def __init__(self, *args) -> None:
        self.old = None
        self.two = None                   # the same checkpoint from the deltas written as format 2
        self.rows = None                  # the same checkpoint with its snapshot written as rows (format 1)
        self.deltas = self.listed = 0     # deltas compared; of those, with a line holding a newline
        super().__init__(*args)

    def start(self, snapshot):
        self.cfg = dataclasses.replace(self.cfg, checkpoint_interval_s=0.0)   # a checkpoint at every change
        super().start(snapshot)

    def apply(self, cmds):
        for c in cmds:
            if type(c) is Checkpoint:
                if c.snapshot is not None:
                    self.old = roundtrip(c.snapshot)
                    self.two = roundtrip(c.snapshot)
                    self.rows = roundtrip(rows_snapshot(self.core, c.snapshot))
                else:
                    [new] = decode_journal(encode_delta(c.delta))        # as the journal holds it
                    assert new["format"] == DELTA_FORMAT == 3 and "add" not in new
                    self.rows = apply_delta(self.rows, decode_journal(encode_delta(c.delta))[0])
                    raws = new["added"]["raws"]
                    assert type(raws) is bytes and raws == c.delta["added"]["raws"]
                    text = [r[2] for r in delta_events(new)]      # format 2: one string, or the lines one by one
                    text = "\n".join(text) if not any("\n" in t for t in text) else text
                    two = {**new, "format": 2, "added": {k: v for k, v in new["added"].items() if k != "lens"}}
                    two["added"]["raws"] = text
                    self.two = apply_delta(self.two, roundtrip(two))
                    rows = {e[0]: e for e in snapshot_events(roundtrip(self.core.snapshot(self.now)))}
                    old = {k: v for k, v in new.items() if k not in ("format", "added")}
                    old["add"] = [rows[i] for i in new["added"]["ids"]]
                    self.old = apply_delta(self.old, roundtrip(old))
                    self.deltas += 1
                    self.listed += type(text) is list
        super().apply(cmds)
        assert self.checkpoint == self.old == self.two
        if self.checkpoint is not None:       # the snapshot's own format: columns, format 2
            assert self.checkpoint["format"] == CHECKPOINT_FORMAT == 2 and type(self.checkpoint["events"]) is dict
            assert self.rows["format"] == 1   # the rows' checkpoint holds the same events and the rest alike
            assert snapshot_events(self.checkpoint) == self.rows["events"]
            assert {**self.checkpoint, "format": 1, "events": self.rows["events"]} == self.rows
            assert snapshot_as_rows(self.checkpoint) == self.rows


def rows_snapshot(core: DispatcherState, snap: dict) -> dict:
    """``snap`` (the core's snapshot just taken) as format 1 wrote it: a row per event, from the core's own
    records, as the snapshot was built before it held columns."""
    dups = core._dups
    return {**snap, "format": 1, "events": [[i, r[0], r[1].decode(), r[2], r[3], [d.decode() for d in dups.get(i, [])]]
                                            for i, r in core._events.items()]}


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
    deltas = listed = rows_restores = 0
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
                            for c in (h.checkpoint, h.old, h.rows, h.two)]
                for other in restored[1:]:
                    assert restored[0].snapshot(h.now) == other.snapshot(h.now)
                    assert restored[0].statistics() == other.statistics()
                    assert list(restored[0]._queued) == list(other._queued)   # re-sent in the same order
                rows_restores += h.rows is not None
                h.crash()
            else:
                h.stop_and_restart()
        deltas += h.deltas
        listed += h.listed
    assert deltas >= 3000 and listed >= 50 and rows_restores >= 200, (deltas, listed, rows_restores)   # they did happen


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
    with pytest.raises(ValueError, match="format 4"):
        apply_delta(snap, {"format": 4, "written_at_us": 2, "offsets": {}, "added": {}, "recovered": [], "dup": [],
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
    assert added["raws"] == b"\n".join(lines[2:]) and added["lens"] == list(map(len, lines[2:])) and added["dups"] == {}
    record = encode_delta(cp.delta)          # the lines as they are after the JSON line, not escaped inside it
    assert record.endswith(b"\n" + b"\n".join(lines[2:]) + b"\n") and record.count(b"\n") == 1 + 3
    assert decode_journal(record) == [cp.delta]
    assert added["ids"] == [format_event_id("10.0.0.1", 1, START + k) for k in range(2, 5)]
    assert added["attempts"] == [0, 0, 0] and added["first_seen"] == [START + 1] * 3


class Files(Harness):
    """The property test's harness writing its checkpoints into two folders as the shell does, one with each
    full snapshot as written (format 2), one with it as format 1 wrote it (rows); the journals the same."""

    def __init__(self, root, *args) -> None:
        self.files = [CheckpointFiles(root / "new"), CheckpointFiles(root / "old")]
        for f in self.files:
            f.directory.mkdir()
        self.fulls = 0
        super().__init__(*args)

    def apply(self, cmds):
        for c in cmds:
            if type(c) is Checkpoint and c.snapshot is not None:
                self.files[0].save_snapshot(c.snapshot)
                self.files[1].save_snapshot(rows_snapshot(self.core, c.snapshot))
                self.fulls += 1
            elif type(c) is Checkpoint:
                for f in self.files:
                    f.append_delta(c.delta)
        super().apply(cmds)


@pytest.mark.timeout(120)
def test_a_snapshot_file_of_format_1_and_one_of_format_2_load_and_restore_to_the_same_state(tmp_path):
    """Random histories written into checkpoint files twice (the snapshots as columns, and as rows the way
    format 1 wrote them; the same journal after each): at every crash both folders load to the same checkpoint,
    which is the one the harness rebuilt in memory, and restore to the same state, re-sending in the same order."""
    restores = 0
    for seed in range(60):
        rng = random.Random(seed)
        lines = (lines_with_newlines if seed % 2 else make_lines)(rng, rng.randrange(10, 60))
        root = tmp_path / str(seed)
        root.mkdir()
        h = Files(root, lines, rng.random() < 0.5, rng.randrange(1, 8), rng.randrange(1, 5))
        for _ in range(rng.randrange(20, 80)):
            a = rng.choice(["read", "read", "answer", "answer", "answer", "tick", "crash", "stop"])
            if h.step(a, rng):
                continue
            if a == "stop":
                h.apply(h.core.handle(StopRequested(h.now)))
            new, old = (load_checkpoint(f.directory) for f in h.files)
            if h.checkpoint is None:              # nothing read yet: nothing written
                assert new is old is None
                h.start(None)
                continue
            assert new["format"] == old["format"] == 1 and new == old     # both loaded as rows
            assert {k: v for k, v in new.items() if k != "journal"} == snapshot_as_rows(h.checkpoint)
            cores = [DispatcherState(h.join, h.cfg, lookups=h.lookups, restore=c) for c in (new, old, h.checkpoint)]
            for other in cores[1:]:
                assert cores[0].snapshot(h.now) == other.snapshot(h.now)
                assert cores[0].statistics() == other.statistics()
                assert list(cores[0]._queued) == list(other._queued)
            restores += 1
            h.start(h.checkpoint)
        for f in h.files:
            f.close()
    assert restores >= 60, restores


def test_a_snapshot_of_an_unknown_format_is_refused_before_anything_is_applied(tmp_path):
    snap = {"format": 3, "written_at_us": 1, "offsets": {"a": 10}, "events": {"ids": []}, "recovered": [],
            "counters": {}, "join_latency_hist": {}}
    before = roundtrip(snap)
    new = {"format": 2, "written_at_us": 2, "offsets": {}, "recovered": [], "dup": [], "sent": [], "gone": [],
           "counters": {}, "join_latency_hist": {},
           "added": {"ids": ["z"], "refs": ["qz"], "raws": "{}", "first_seen": [7], "attempts": [0], "dups": {}}}
    with pytest.raises(ValueError, match="format 3"):
        apply_delta(snap, new)
    assert snap == before
    with pytest.raises(ValueError, match="format 3"):
        snapshot_events(snap)
    CheckpointFiles(tmp_path).save_snapshot(snap)
    with pytest.raises(ValueError, match="format 3"):
        load_checkpoint(tmp_path)
