"""Reading a chunk of click lines in bulk decides every line as reading it alone would: the same quarantine
records (file, offset, reason), the same unresolved events and later copies, the same requests and journal,
and the same oldest unresolved time, whatever mix of good lines, bad lines and copies a chunk holds."""
from __future__ import annotations

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dispatcher import DispatcherConfig, DispatcherState
from dispatcher._state import ChunkRead, LinesRead, QuarantineRecords, TimePassed, snapshot_events
from photon import BadEventId, JoinConfig, format_event_id, is_event_id, parse_event_id
from tests.json_lines import by_orjson, json_line, odd_lines, production_recursion_limit

FILE = "w0/clicks-1.jsonl"
T0 = 1_763_712_000_000_000


def cid(n: int, writer: int = 7) -> str:
    return format_event_id("10.0.0.1", writer, T0 + n)


def qid(n: int) -> str:
    return format_event_id("10.0.0.2", 9, T0 - 1_000_000 + n)


def _line(kind: str, n: int) -> bytes:
    good = {"click_id": cid(n), "query_id": qid(n), "ad": "x"}
    if kind == "good":
        return orjson.dumps(good)
    if kind == "other_writer":
        return orjson.dumps({**good, "click_id": cid(n, writer=8)})
    if kind == "broken":
        return b'{"click_id": "' + cid(n).encode()
    if kind == "array":
        return orjson.dumps([cid(n), qid(n)])
    if kind == "scalar":
        return b"17"
    if kind == "missing_id":
        return orjson.dumps({"query_id": qid(n)})
    if kind == "missing_ref":
        return orjson.dumps({"click_id": cid(n)})
    if kind == "int_id":
        return orjson.dumps({**good, "click_id": n})
    if kind == "null_ref":
        return orjson.dumps({**good, "query_id": None})
    if kind == "bad_id":
        return orjson.dumps({**good, "click_id": cid(n)[:-1]})
    if kind == "bad_ref":
        return orjson.dumps({**good, "query_id": f"q-{n}"})
    if kind == "newline_id":
        return orjson.dumps({**good, "click_id": "10.0.0.1:7:\n" + cid(n)})
    if kind == "empty_id":
        return orjson.dumps({**good, "click_id": ""})
    raise AssertionError(kind)


KINDS = ["good"] * 8 + ["other_writer", "broken", "array", "scalar", "missing_id", "missing_ref", "int_id",
                        "null_ref", "bad_id", "bad_ref", "newline_id", "empty_id"]


def _chunks(lines: list[bytes], sizes: list[int], start: int) -> tuple[list[ChunkRead], int]:
    out, pos, i = [], start, 0
    for size in sizes:
        part = lines[i:i + size]
        if not part:
            break
        offsets = []
        for ln in part:
            offsets.append(pos)
            pos += len(ln) + 1
        out.append(ChunkRead(FILE, offsets, part, pos))
        i += size
    return out, pos


def _core() -> DispatcherState:
    cfg = DispatcherConfig(batch_size=5, max_in_flight=2, retry_initial_s=0.25, retry_max_s=8.0, min_attempts=3,
                           checkpoint_interval_s=0.2, max_unresolved=10_000)
    return DispatcherState(JoinConfig(unjoinable_after_s=60.0), cfg, lookups=False)


def _observe(core: DispatcherState, commands: list, now: int) -> dict:
    quarantined = [r for c in commands if type(c) is QuarantineRecords for r in c.records]
    return {"commands": [c for c in commands if type(c) is not QuarantineRecords], "quarantined": quarantined,
            "snapshot": core.snapshot(now), "delta": core.delta(now), "oldest": core.oldest_unresolved_us(),
            "stats": core.statistics()}


def _model(lines: list[bytes]) -> tuple[list[bytes], dict]:
    """Line by line, plainly: the bad lines, and each good id's first line and ref with its later copies."""
    bad, events = [], {}
    for raw, fields in zip(lines, by_orjson(lines, ("click_id", "query_id"))):
        if fields is None or not (is_event_id(fields[0]) and is_event_id(fields[1])):
            bad.append(raw)
            continue
        i, r = fields
        if i in events:
            events[i][2].append(raw.decode())
        else:
            events[i] = [r, raw.decode(), []]
    return bad, events


line_spec = st.tuples(st.sampled_from(KINDS), st.integers(0, 30))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=st.lists(line_spec, max_size=30), second=st.lists(line_spec, min_size=1, max_size=60),
       sizes=st.lists(st.integers(1, 25), min_size=1, max_size=8))
def test_a_chunk_read_in_bulk_decides_each_line_as_read_alone(first, second, sizes):
    first_lines = [_line(k, n) for k, n in first]
    second_lines = [_line(k, n) for k, n in second]
    seen = []
    for per_line in (False, True):
        core = _core()
        now = T0
        chunks, end = _chunks(first_lines, [len(first_lines)], 0)   # some ids unresolved (and checkpointed) before
        with production_recursion_limit():                         # (Hypothesis raises it: see tests/json_lines.py)
            core.handle(LinesRead(chunks, now), TimePassed(now))
        now += 1_000_000                                             # (past the checkpoint interval)
        core.handle(TimePassed(now))
        now += 1_000
        chunks, _ = _chunks(second_lines, [1] * len(second_lines) if per_line else sizes * len(second_lines), end)
        with production_recursion_limit():
            out = core.handle(LinesRead(chunks, now))
        seen.append(_observe(core, out, now))
    bulk, alone = seen
    assert bulk == alone
    bad, events = _model(first_lines + second_lines)
    assert [raw for _, _, _, raw in bulk["quarantined"]] == bad[len(_model(first_lines)[0]):]
    assert {e[0]: [e[1], e[2], e[5]] for e in snapshot_events(bulk["snapshot"])} == events
    assert [e[0] for e in snapshot_events(bulk["snapshot"])] == list(events)
    assert bulk["oldest"] == (min(int(i[-16:]) for i in events) if events else 0)


def _repeats_one_by_one(cids: list[str], events: dict) -> list[int]:
    """Plainly: each position whose id is unresolved already or was seen earlier in the chunk."""
    seen, out = set(), []
    for k, cid in enumerate(cids):
        if cid in events or cid in seen:
            out.append(k)
        seen.add(cid)
    return out


@settings(max_examples=500, deadline=None)
@given(cids=st.lists(st.integers(0, 40), max_size=80), unresolved=st.sets(st.integers(0, 60), max_size=30),
       filler=st.integers(0, 3000))
def test_the_repeats_of_a_chunk_are_those_found_id_by_id(cids, unresolved, filler):
    """``_repeats`` (set operations over the chunk) equals the id-by-id answer, with the unresolved ids fewer
    or many more than the chunk's (the intersection iterates the smaller side)."""
    from dispatcher._state import _repeats
    ids = [f"10.0.0.1:1:{k:016d}" for k in cids]
    events = dict.fromkeys([f"10.0.0.1:1:{k:016d}" for k in unresolved] + [f"10.0.0.9:9:{k:016d}" for k in range(filler)])
    assert _repeats(ids, events) == _repeats_one_by_one(ids, events)


# ---- lines on which msgspec (the bulk reading of the two fields) and orjson differ -----------------------

def _problem(raw: bytes) -> str | None:
    """Why the dispatcher quarantines a line read alone with orjson (its reason text), or None for a good one."""
    try:
        rec = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        return f"not valid JSON: {e}"
    if type(rec) is not dict:
        return f"not a JSON object but {type(rec).__name__}"
    for name in ("click_id", "query_id"):
        value = rec.get(name)
        if value is None:
            return f"missing field {name!r}"
        if type(value) is not str:
            return f"field {name!r} is {type(value).__name__}, not a string"
    for name in ("click_id", "query_id"):
        try:
            parse_event_id(rec[name])
        except BadEventId as e:
            return str(e)
    return None


@st.composite
def _odd_chunk(draw) -> list[bytes]:
    n = draw(st.integers(1, 50))
    out = []
    for k in range(n):
        good = cid(k)                               # (the ref field holds a well-formed id too: the same text)
        field, other = draw(st.sampled_from([("click_id", "query_id"), ("query_id", "click_id")]))
        out.append(draw(json_line(field, good, other)))
    return out


def _read(lines: list[bytes], sizes: list[int]) -> dict:
    core = _core()
    chunks, _ = _chunks(lines, sizes * len(lines), 0)
    with production_recursion_limit():
        out = core.handle(LinesRead(chunks, T0))
    return _observe(core, out, T0)


@pytest.mark.timeout(240)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=_odd_chunk(), sizes=st.lists(st.integers(1, 60), min_size=1, max_size=4))
def test_lines_msgspec_and_orjson_differ_on_are_read_as_orjson_reads_them(lines, sizes):
    got = _read(lines, sizes)
    offsets = []
    pos = 0
    for raw in lines:
        offsets.append(pos)
        pos += len(raw) + 1
    want_bad = [(FILE, off, _problem(raw), raw) for off, raw in zip(offsets, lines) if _problem(raw) is not None]
    assert [tuple(r) for r in got["quarantined"]] == want_bad
    bad, events = _model(lines)
    assert [raw for _, _, _, raw in got["quarantined"]] == bad
    assert {e[0]: [e[1], e[2], e[5]] for e in snapshot_events(got["snapshot"])} == events
    assert got == _read(lines, [1])                  # the same, one line per chunk


@pytest.mark.timeout(60)
def test_each_odd_line_among_good_ones_is_read_as_orjson_reads_it():
    good = [_line("good", n) for n in range(3)]
    odd = odd_lines("click_id", cid(1), "query_id") + odd_lines("query_id", cid(1), "click_id")
    for line in odd:
        lines = [good[0], line, good[2]]
        got = _read(lines, [3])
        bad, events = _model(lines)
        assert [raw for _, _, _, raw in got["quarantined"]] == bad
        assert [r[2] for r in got["quarantined"]] == [_problem(raw) for raw in bad]
        assert {e[0]: [e[1], e[2], e[5]] for e in snapshot_events(got["snapshot"])} == events



def test_the_oldest_unresolved_time_after_the_runs_are_filtered_is_the_smallest_unresolved_one(monkeypatch):
    """``_OldestIds`` over 300 random histories (seeded) of chunks added (ids of three writers, out of order), ids
    resolved, and ids read again after being resolved (then in two runs), with its runs filtered whenever they
    are mostly resolved (no slack): each ask answers the smallest time among the unresolved ids, as a plain
    ``min`` does, and after a filtering each unresolved id is held exactly once, in runs sorted by time."""
    import random

    import dispatcher._state as state_module
    monkeypatch.setattr(state_module, "OLDEST_HEAP_SLACK", 0)
    filtered = sorted_again = 0
    for seed in range(300):
        rng = random.Random(seed)
        oldest = state_module._OldestIds()
        events: dict = {}
        for _ in range(rng.randrange(5, 60)):
            action = rng.choice(["add", "add", "resolve", "ask", "ask"])
            if action == "add":                  # (ids resolved before and read again: now in a second run)
                new = list(dict.fromkeys(c for c in (cid(rng.randrange(200), writer=7 + rng.randrange(3))
                                                     for _ in range(rng.randrange(1, 20))) if c not in events))
                oldest.add(new)
                events.update(dict.fromkeys(new))
            elif action == "resolve":
                share = rng.random()
                for c in [c for c in events if rng.random() < share]:
                    del events[c]
            else:
                before, seq = oldest._held, oldest._seq
                got = oldest.oldest_us(events)
                assert got == (min(int(c[-16:]) for c in events) if events else 0)
                if events and before > 2 * len(events):          # filtered (or sorted anew) just now
                    runs = [run[i:] for _, _, run, i in oldest._heap]
                    assert sorted(c for run in runs for c in run) == sorted(events) and oldest._held == len(events)
                    assert all(run == sorted(run, key=lambda c: c[-16:]) for run in runs)
                    if oldest._seq == seq + 1 and len(runs) == 1:
                        sorted_again += 1
                    else:
                        filtered += 1
    assert filtered >= 100 and sorted_again >= 10, (filtered, sorted_again)   # both ways did happen
