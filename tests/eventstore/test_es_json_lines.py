"""The primary reader's bulk indexing (ids read by msgspec, ``photon.StringFields``) against a line-by-line
reading with ``orjson.loads``, on chunks mixing good lines with every kind of line on which msgspec and orjson
differ (tests/json_lines.py): the same lines kept with their offsets and ids, the same quarantine records
(offset, reason, raw), the same key and timestamps."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventstore._packed import unpack_time
from eventstore._state import split_photon_ids
from photon import format_event_id
from tests.eventstore.test_es_packed import index_as_read_line_by_line
from tests.json_lines import json_line, odd_lines

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
