"""The primary reader's bulk path against a line-by-line reading, on random chunks (Hypothesis).

The bulk path indexes a chunk with one orjson map, one regular-expression pass over the ids and the
timestamps packed from one ``bytes.fromhex`` of their digits; the cache puts a chunk with one running sum
of the lines' charges. Here every chunk is also read one line at a time, with nothing in bulk: the same
lines kept (with their offsets), the same quarantine records with the same reasons, the same key and
timestamps, the same map entries and marks, the same read position, and the same lookups for every id
put and for ids that are near misses of them (other keys, widths, digits, neighbouring times).
"""
from __future__ import annotations

from array import array
from itertools import accumulate

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventstore._map import MapEmitter
from eventstore._packed import pack_time, packed_times, unpack_time
from eventstore._state import EventCache, IndexedLines, _one_writer, _other_widths, index_lines, split_photon_ids
from photon import BadEventId, LogChunk, is_event_id, parse_event_id, parse_record
from tests.json_lines import production_recursion_limit

BASE_US = 1_763_712_000_000_000
WRITERS = ["10.0.0.1:4242", "10.0.0.1:4243", "10.0.0.12:4242"]
ARABIC_ONE = "\u0661"


def _line(event_id, **extra) -> bytes:
    return orjson.dumps({"query_id": event_id, "q": "shoes", **extra})


@st.composite
def odd_line(draw) -> bytes:
    """A line a reader must quarantine, or keep as another writer's, or keep though it is odd."""
    ts = BASE_US + draw(st.integers(0, 10**6))
    key = draw(st.sampled_from(WRITERS))
    kind = draw(st.integers(0, 17))
    digits = f"{ts:016d}"
    return [
        b"not json",
        b'{"query_id": "10.0.0.1:1:00000000000", broken',          # the generator's kinds of bad line
        orjson.dumps({"note": "no id here"}),
        orjson.dumps({"query_id": "not-an-id-7", "x": "also-bad"}),
        b'["an", "array"]',
        b"", b"{}", b"null", b'"s"',
        _line(7) if kind == 9 else _line(None),                   # ids that are not strings
        _line(f"{key}:{digits[:-1]}"),                              # 15 digits
        _line(f"{key}:{digits}0"),                                  # 17 digits
        _line(f"{key}:{ARABIC_ONE}{digits[1:]}"),                   # a non-ASCII digit
        _line(f"{key}:+{digits[1:]}"),                              # a sign, an underscore
        _line(f"{key}:{digits[:4]}_{digits[5:]}"),
        _line(f"{key.replace(':', '')}:1:{digits}"),                # another (well-formed) key
        _line(f"{key}\n:{digits}"),                                 # a newline inside the id
        _line(f":{digits}"),                                        # no key at all
    ][kind]


@st.composite
def chunks(draw) -> list[bytes]:
    """Mostly one writer's lines in time order (as a primary log file is), with odd lines among them;
    sometimes other writers' ids, repeated or backward times."""
    n = draw(st.integers(1, 120))
    main = draw(st.sampled_from(WRITERS))
    mixed = draw(st.booleans())
    ordered = draw(st.sampled_from(["increasing", "increasing", "repeats", "any"]))
    bad_share = draw(st.sampled_from([0.0, 0.0, 0.02, 0.2, 0.9]))
    ts = BASE_US + draw(st.integers(0, 10**9))
    lines = []
    for _ in range(n):
        if draw(st.floats(0, 1)) < bad_share:
            lines.append(draw(odd_line()))
            continue
        step = {"increasing": draw(st.integers(1, 10**6)), "repeats": draw(st.sampled_from([0, 1, 50])),
                "any": draw(st.integers(-10**6, 10**6))}[ordered]
        ts = max(0, ts + step)
        key = draw(st.sampled_from(WRITERS)) if mixed else main
        lines.append(_line(f"{key}:{ts:016d}", n=draw(st.integers(0, 9)), text="é" * draw(st.integers(0, 2))))
    return lines


def _reason(raw: bytes) -> str:
    """What is wrong with a line, as a reader of one line at a time says it."""
    event, reason = parse_record(raw, ("query_id",))
    if event is None:
        return reason
    try:
        parse_event_id(event["query_id"])
    except BadEventId as e:
        return str(e)
    return "id does not parse"


def _read_line_by_line(lines: list[bytes], offsets: list[int]):
    kept, bad = [], []
    for off, raw in zip(offsets, lines):
        try:
            event = orjson.loads(raw)
        except orjson.JSONDecodeError:
            event = None
        if isinstance(event, dict) and type(event.get("query_id")) is str and is_event_id(event["query_id"]):
            kept.append((off, event["query_id"], raw))
        else:
            bad.append((off, _reason(raw), raw))
    return kept, bad


def index_as_read_line_by_line(lines: list[bytes], start: int) -> tuple[IndexedLines, list[int]]:
    """``index_lines`` of ``lines`` (a chunk starting at byte ``start``) at the default recursion limit
    (Hypothesis raises it; the msgspec path needs the default), checked against a line-by-line reading with
    ``orjson.loads``: the lines kept with their offsets and ids, the quarantine records (offset, reason, raw).
    Returns what it indexed and the offsets of the lines kept."""
    offsets, pos = [], start
    for line in lines:
        offsets.append(pos)
        pos += len(line) + 1
    want_kept, want_bad = _read_line_by_line(lines, offsets)
    map_offsets: list[int] = []
    with production_recursion_limit():
        found = index_lines(LogChunk("w/q.jsonl", offsets, lines, pos), "query_id", map_offsets)
    assert list(zip(map_offsets, found.ids, found.lines)) == want_kept
    assert [(b.offset, b.reason, b.raw) for b in found.bad] == want_bad
    assert all(b.file == "w/q.jsonl" for b in found.bad)
    return found, map_offsets


PARTIAL = b'{"query_id":"10.0.0.1:4242:1763712000000001","n":1e999,"c":"\xc3'
"""What follows a chunk's lines in the bytes they were read from: a line not complete yet."""


def _is_utf8(line: bytes) -> bool:
    try:
        line.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _near_misses(ids: list[str]) -> list[str]:
    out = []
    for event_id in ids[:20]:
        key, _, digits = event_id.rpartition(":")
        ts = int(digits)
        out += [f"{key}:{ts + 1:016d}", f"{key}:{max(0, ts - 1):016d}", f"{key}0:{digits}", f"{key}:{digits}0",
                f"{key}:{digits[1:]}", f"{key}:{ARABIC_ONE}{digits[1:]}", f"10.9.9.9:1:{digits}", digits]
    return out


@pytest.mark.timeout(240)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=chunks(), start=st.integers(0, 1 << 40), block_kb=st.sampled_from([4, 32, 1 << 12]))
def test_the_bulk_path_agrees_with_a_line_by_line_reading(lines, start, block_kb):
    # the lines kept, their ids and offsets; the quarantine records with their reasons
    found, map_offsets = index_as_read_line_by_line(lines, start)

    # the key and timestamps: given exactly when the ids kept are one key's, strictly increasing
    ids = found.ids
    numbers = [int(i[-16:]) for i in ids]
    one_key = bool(ids) and len({i[:-17] for i in ids}) == 1
    increasing = all(a < b for a, b in zip(numbers, numbers[1:]))
    assert (found.timed is not None) == (one_key and increasing)
    if found.timed is not None:
        key, tss = found.timed
        assert key == ids[0][:-17] and [unpack_time(t) for t in tss] == numbers
        assert found.timed == split_photon_ids(ids)
        assert unpack_time(tss[-1]) == max(numbers)            # the reader's read position of the key

    # the map: entries and marks as observed line by line
    bulk, single = MapEmitter(50_000, 300), MapEmitter(50_000, 300)
    got = bulk.observe_many("w/q.jsonl", map_offsets, ids, found.timed)
    assert got == [e for e in map(single.observe, ["w/q.jsonl"] * len(ids), map_offsets, ids) if e is not None]
    assert bulk.marks() == single.marks()

    # the cache: every id put found with its line (the last of a repeated id), near misses not found
    cache, one_by_one = EventCache(block_kb << 16), EventCache(1 << 30)   # (blocks of block_kb KiB)
    cache.put_lines(ids, found.lines, found.timed)
    for event_id, raw in zip(ids, found.lines):
        one_by_one.put(event_id, raw)
    held = dict(zip(ids, found.lines))
    asked = ids + [i for i in _near_misses(ids) if i not in held]
    assert cache.lookup(asked) == [held.get(i) for i in asked] == one_by_one.lookup(asked)
    assert cache.statistics().entries == len(held) and cache.statistics().evictions == 0

    # the cache again, its blocks cut from the bytes the lines were read as (cut at the lines quarantined too)
    data = b"".join(line + b"\n" for line in lines) + PARTIAL
    chunk = LogChunk("w/q.jsonl", [start + k for k in accumulate([0, *(len(x) + 1 for x in lines[:-1])])],
                     lines, start + len(data) - len(PARTIAL), data)
    read = found.read_at(chunk)
    assert read is not None and read[2] == map_offsets
    if all(_is_utf8(line) for line in lines):       # (a tailer keeps the bytes only then: not checked again)
        with production_recursion_limit():
            again = index_lines(chunk, "query_id")
        assert (again.ids, again.lines, again.bad, again.timed, again.bad_at) == \
            (found.ids, found.lines, found.bad, found.timed, found.bad_at)
        assert again.read_at(chunk) == read
    from_bytes = EventCache(block_kb << 16)
    from_bytes.put_lines(ids, found.lines, found.timed, read)
    assert from_bytes.lookup(asked) == cache.lookup(asked)
    stats, want = from_bytes.statistics(), cache.statistics()
    assert stats.entries == want.entries and stats.puts == want.puts and stats.evictions == 0
    if not found.bad:                                 # (the same blocks: charged the same)
        assert (stats.bytes, stats.too_large) == (want.bytes, want.too_large)
    from_bytes.put_lines(ids, found.lines, found.timed, read)       # every id put again: replaced, not doubled
    assert from_bytes.lookup(asked) == cache.lookup(asked) and from_bytes.statistics().entries == len(held)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.integers(0, 10**16 - 1), min_size=1, max_size=50))
def test_packed_decimal_keeps_order_and_equality_and_comes_back(numbers):
    packed = packed_times("".join(f"{x:016d}" for x in numbers))
    assert list(packed) == [pack_time(x) for x in numbers] == [int(f"{x:016d}", 16) for x in numbers]
    assert [unpack_time(p) for p in packed] == numbers
    order = sorted(range(len(numbers)), key=numbers.__getitem__)
    assert sorted(range(len(numbers)), key=packed.__getitem__) == order
    assert all((a < b) == (pa < pb) and (a == b) == (pa == pb)
               for a, pa in zip(numbers, packed) for b, pb in zip(numbers, packed))
    assert pack_time(10**16) > max(packed)                    # a longer time still packs above


def _one_writer_id_by_id(ids: list[str], first: int = 0):
    """``eventstore._state._one_writer`` of ``ids`` worked out one id at a time (its reference)."""
    key = ids[first][:-17]
    if not key:
        return None
    good = [len(i) == len(key) + 17 and i.startswith(key + ":") and i[-16:].isascii() and i[-16:].isdigit()
            for i in ids]
    holes = [k for k, g in enumerate(good) if not g]
    if len(holes) == len(ids) or any(is_event_id(ids[k]) for k in holes):
        return None
    kept = [i for i, g in zip(ids, good) if g]
    if not is_event_id(kept[0]):
        return None
    numbers = [int(i[-16:]) for i in kept]
    if any(a >= b for a, b in zip(numbers, numbers[1:])):
        return kept, None, holes
    return kept, (key, array("Q", [pack_time(t) for t in numbers])), holes


@st.composite
def one_writers_ids(draw) -> list[str]:
    """Mostly one key's ids (its timestamps mostly increasing), with ids that are not the key and 16 digits
    among them: near misses, other keys, odd strings, a key with characters special to regular expressions."""
    key = draw(st.sampled_from(["10.1.0.1:1000", "10.0.0.7:4242", "1.2.3.4:5", "a.b*c+(d):1", "x"]))
    n = draw(st.integers(1, 40))
    ts = BASE_US + draw(st.integers(0, 10**6))
    out = []
    for _ in range(n):
        if draw(st.integers(0, 5)) == 0:           # a long run of good ids (longer than an id)
            for _ in range(draw(st.integers(20, 90))):
                ts += 1
                out.append(f"{key}:{ts:016d}")
        ts += draw(st.sampled_from([1, 1, 1, 7, 0, -3]))
        digits = f"{ts:016d}"
        out.append(draw(st.sampled_from([f"{key}:{digits}"] * 8 + [
            f"{key}:{digits}0", f"{key}:{digits[1:]}", f"{key}0:{digits}", f"{key}:{ARABIC_ONE}{digits[1:]}",
            f"{key}:+{digits[1:]}", f"10.9.9.9:1:{digits}", f"{key}:{digits} ", f" {key}:{digits}", digits, "",
            "not-an-id", f"{key};{digits}"])))
    if draw(st.booleans()):
        out += draw(st.lists(st.text(max_size=40).filter(lambda t: "\n" not in t), max_size=3))
    return out


@pytest.mark.timeout(240)
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ids=one_writers_ids())
def test_one_writers_ids_taken_in_runs_agree_with_each_id_checked_alone(ids):
    assert _one_writer(ids, "\n".join(ids)) == _one_writer_id_by_id(ids)
    first = len(ids) // 2                   # (the reader takes the key from its first line with an id)
    assert _one_writer(ids, "\n".join(ids), first) == _one_writer_id_by_id(ids, first)


@st.composite
def one_writers_chunk(draw) -> list[str]:
    """A chunk of one key's ids, every one the key, ``:`` and 16 digits (the reader's usual chunk, taken by
    columns), or all but one: one id with one character replaced at any place (so it keeps the width), or
    the timestamps not increasing somewhere."""
    key = draw(st.sampled_from(["10.1.0.1:1000", "10.0.0.7:4242", "1.2.3.4:5", "a.b*c+(d):1", "x", "1:2"]))
    ts = BASE_US + draw(st.integers(0, 10**15))
    steps = draw(st.lists(st.sampled_from([1, 1, 1, 9, 10**6, 10**14]), min_size=1, max_size=300))
    ids = []
    for step in steps:
        ts = min(ts + step, 10**16 - 1)
        ids.append(f"{key}:{ts:016d}")
    kind = draw(st.integers(0, 3))
    if kind == 1:                                   # one character replaced: same width
        i = draw(st.integers(0, len(ids) - 1))
        at = draw(st.integers(0, len(ids[i]) - 1))
        char = draw(st.sampled_from(list("0123456789:.;+ xa") + [ARABIC_ONE, "\u00e9", "\x00"]))
        ids[i] = ids[i][:at] + char + ids[i][at + 1:]
    elif kind == 2 and len(ids) > 1:                # not increasing somewhere
        i = draw(st.integers(1, len(ids) - 1))
        ids[i] = ids[i - 1]
    return ids


@pytest.mark.timeout(240)
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ids=one_writers_chunk())
def test_one_writers_chunk_taken_by_columns_agrees_with_each_id_checked_alone(ids):
    """The columns' check and packing (every id the key and 16 digits) against the reference id by id."""
    assert _one_writer(ids, "\n".join(ids)) == _one_writer_id_by_id(ids)


@pytest.mark.timeout(120)
@settings(max_examples=300, deadline=None)
@given(lengths=st.lists(st.sampled_from([0, 1, 29, 30, 31, 255, 256, 300]), max_size=60),
       width=st.sampled_from([0, 1, 30, 255, 256, 300]))
def test_ids_of_other_widths_found_in_bulk_are_those_found_one_by_one(lengths, width):
    ids = ["x" * n for n in lengths]
    assert _other_widths(ids, width) == [i for i, x in enumerate(ids) if len(x) != width]
