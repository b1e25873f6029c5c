"""The primary reader's bulk indexing (ids read by msgspec, ``photon.StringFields``) against a line-by-line
reading with ``orjson.loads``, on chunks mixing good lines with every kind of line on which msgspec and orjson
differ (tests/json_lines.py): the same lines kept with their offsets and ids, the same quarantine records
(offset, reason, raw), the same key and timestamps; also chunks read by the primary reader's own tailer,
which marks ``plain`` those it finds no number in that can overflow (indexed then without the bytes checks)."""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventstore._packed import unpack_time
from eventstore._source import LocalFiles
from eventstore._state import index_lines, split_photon_ids
from photon import LogChunk, format_event_id
from tests.eventstore.test_es_packed import _read_line_by_line, index_as_read_line_by_line
from tests.json_lines import json_line, odd_lines, production_recursion_limit

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


def _tailed_and_indexed(lines: list[bytes], read_bytes: int) -> list[bool]:
    """Index each chunk the primary reader's tailer reads from a file of ``lines``, checked against a
    line-by-line reading and against the same chunk not marked ``plain``; the chunks' ``plain``."""
    plain = []
    with tempfile.TemporaryDirectory() as root:
        (Path(root) / "q.jsonl").write_bytes(b"".join(line + b"\n" for line in lines))
        tailer = LocalFiles(root).tailer(None, None)
        tailer.read_bytes = read_bytes
        while chunks := tailer.poll():
            for chunk in chunks:
                kept: list[int] = []
                with production_recursion_limit():
                    found = index_lines(chunk, "query_id", kept)
                    unchecked = index_lines(LogChunk(chunk.file, chunk.offsets, chunk.lines, chunk.end), "query_id")
                want_kept, want_bad = _read_line_by_line(chunk.lines, chunk.offsets)
                assert list(zip(kept, found.ids, found.lines)) == want_kept
                assert [(b.offset, b.reason, b.raw) for b in found.bad] == want_bad
                assert found == unchecked
                plain.append(chunk.plain)
    return plain


@pytest.mark.timeout(240)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=chunk(), read_bytes=st.sampled_from([100, 1000, 1 << 20]))
def test_the_tailers_chunks_plain_or_not_are_indexed_as_line_by_line(lines, read_bytes):
    _tailed_and_indexed([x for x in lines if b"\n" not in x], read_bytes)


@pytest.mark.timeout(60)
def test_the_tailer_marks_plain_the_chunks_without_a_number_that_can_overflow():
    good = [b'{"query_id":"%s","q":"shoes","n":1e99}' % format_event_id("10.0.0.1", 4242, BASE_US + k).encode()
            for k in range(3)]
    assert _tailed_and_indexed(good, 1 << 20) == [True]
    for big in (b"1e999", b"9" * 309):
        assert _tailed_and_indexed([good[0], good[1][:-1] + b',"a":' + big + b"}", good[2]], 1 << 20) == [False]
