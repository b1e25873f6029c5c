"""The primary reader's bulk indexing (ids read by msgspec, ``photon.StringFields``) against a line-by-line
reading with ``orjson.loads``, on chunks mixing good lines with every kind of line on which msgspec and orjson
differ (tests/json_lines.py): the same lines kept with their offsets and ids, the same quarantine records
(offset, reason, raw), the same key and timestamps."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import eventstore._state as es_state
from eventstore._packed import unpack_time
from eventstore._state import split_photon_ids
from photon import format_event_id, string_fields
from tests.eventstore.test_es_packed import index_as_read_line_by_line
from tests.json_lines import by_orjson, json_line, odd_lines, production_recursion_limit

BASE_US = 1_763_712_000_000_000


def _check(lines: list[bytes], start: int) -> None:
    found, _ = index_as_read_line_by_line(lines, start)
    ids = found.ids
    assert found.timed == (split_photon_ids(ids) if ids else None)
    if found.timed is not None:
        assert [unpack_time(t) for t in found.timed[1]] == [int(i[-16:]) for i in ids]


@st.composite
def chunk(draw) -> list[bytes]:
    """Lines of one writer in time order, each good one with an odd value beside its id, or an odd line."""
    n = draw(st.integers(1, 60))
    out = []
    for k in range(n):
        good_id = format_event_id("10.0.0.1", 4242, BASE_US + k)
        out.append(draw(json_line("query_id", good_id)))
    return out


@pytest.mark.timeout(240)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=chunk(), start=st.integers(0, 1 << 40))
def test_a_chunk_with_lines_msgspec_and_orjson_differ_on_is_indexed_as_line_by_line(lines, start):
    _check(lines, start)


@pytest.mark.timeout(60)
def test_each_odd_line_among_good_ones_is_quarantined_or_kept_as_line_by_line():
    good = [b'{"query_id":"%s","q":"shoes"}' % format_event_id("10.0.0.1", 4242, BASE_US + k).encode()
            for k in range(3)]
    odd = odd_lines("query_id", format_event_id("10.0.0.1", 4242, BASE_US + 1))
    for line in odd:
        _check([good[0], line, good[2]], 0)
    _check(odd, 7)


@st.composite
def sliced_chunk(draw) -> tuple[list[bytes], int]:
    """Lines as :func:`chunk` draws them (often many odd ones together, so that a slice may go to orjson
    throughout while its neighbours do not), and a slice size smaller than the chunk."""
    n = draw(st.integers(2, 80))
    lines = []
    for k in range(n):
        good_id = format_event_id("10.0.0.1", 4242, BASE_US + k)
        lines.append(draw(json_line("query_id", good_id)))
    return lines, draw(st.integers(1, n - 1))


@pytest.mark.timeout(240)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=sliced_chunk(), start=st.integers(0, 1 << 20))
def test_ids_read_a_slice_at_a_time_are_each_lines_own_and_the_whole_chunks(drawn, start):
    """``read_ids`` (slices of READ_SLICE lines) against orjson line by line and against the whole chunk read
    at once: the same value for every line, the same missing positions; the index made through it is the
    line-by-line reading's."""
    lines, size = drawn
    with production_recursion_limit():
        whole = string_fields("query_id").read(lines)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(es_state, "READ_SLICE", size)
        with production_recursion_limit():
            values, missing = es_state.read_ids(lines, "query_id")
        want = by_orjson(lines, ("query_id",))
        assert values == want
        assert missing == [k for k, v in enumerate(want) if v is None]
        assert (values, missing) == whole
        _check(lines, start)


@pytest.mark.timeout(60)
def test_a_chunk_longer_than_a_slice_is_read_in_slices_with_the_positions_of_the_chunk(monkeypatch):
    """Odd lines at the first and last line of every slice of the real READ_SLICE: their positions are the
    chunk's, not the slice's."""
    size = es_state.READ_SLICE
    n = 3 * size + 5
    lines = [b'{"query_id":"%s","q":"x"}' % format_event_id("10.0.0.1", 4242, BASE_US + k).encode()
             for k in range(n)]
    odd = [k for lo in range(0, n, size) for k in (lo, min(n, lo + size) - 1)]
    for j, k in enumerate(odd):
        lines[k] = (b'{"query_id":7}', b'{"query_id":"x","a":1e999}', b"[1]")[j % 3]
    calls = []
    read = string_fields("query_id").read
    monkeypatch.setattr(type(string_fields("query_id")), "read",
                        lambda self, part: calls.append(len(part)) or read(part))
    with production_recursion_limit():
        values, missing = es_state.read_ids(lines, "query_id")
    assert calls == [size, size, size, 5]
    assert missing == odd
    assert values == by_orjson(lines, ("query_id",))
