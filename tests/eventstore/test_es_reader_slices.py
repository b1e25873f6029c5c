"""The primary reader indexing each chunk in slices (``INDEX_SLICE_LINES``, the interpreter handed to waiting
lookups between them) against the same reader indexing each chunk whole, on random logs (Hypothesis): files
of one writer and of several writers mixed, good lines among every kind of odd line (tests/json_lines.py),
passes small enough to cut files. Two stores read the same logs pass by pass: after every pass the same read
positions, counts and lookups; at the end the same map entries and marks and the same quarantine records."""
from __future__ import annotations

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import eventstore._shell as shell
from eventstore._shell import CacheEventStore, ReaderOptions, slices
from photon import LogChunk, format_event_id
from tests.json_lines import json_line, production_recursion_limit

BASE_US = 1_763_712_000_000_000
KEYS = [("10.0.0.1", 4242), ("10.0.0.2", 4242), ("10.0.0.1", 7)]


@st.composite
def primary_logs(draw) -> dict[str, list[bytes]]:
    """Files (relative path -> lines): each of one writer in time order, or of several interleaved."""
    files: dict[str, list[bytes]] = {}
    ts = [BASE_US] * len(KEYS)
    for f in range(draw(st.integers(1, 4))):
        writers = draw(st.sampled_from([[0], [1], [2], [0, 1], [0, 1, 2]]))
        lines = []
        for _ in range(draw(st.integers(0, 120))):
            w = draw(st.sampled_from(writers))
            ts[w] += draw(st.sampled_from([1, 1, 1, 3, 0]))
            lines.append(draw(json_line("query_id", format_event_id(*KEYS[w], ts[w]))).replace(b"\n", b" "))
        files[f"w{f % 2}/queries-{f:05d}.jsonl"] = lines
    return files


def _store(tmp_path, root, name: str) -> CacheEventStore:
    opts = ReaderOptions(state_dir=tmp_path / name / "state", map_dir=tmp_path / name / "map",
                         map_every_s=0.000_005, map_every_kb=1)
    return CacheEventStore("a", root, "query_id", 1 << 30, tmp_path / name / "quarantine", opts)


def _quarantined(store: CacheEventStore) -> list[tuple]:
    path = store._quarantine.path
    if not path.exists():
        return []
    return [(e["file"], e["offset"], e["reason"], e["raw"]) for e in map(orjson.loads, path.read_bytes().splitlines())]


@pytest.mark.timeout(280)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(logs=primary_logs(), slice_lines=st.integers(1, 9), pass_bytes=st.integers(200, 6000))
def test_a_reader_indexing_in_slices_reads_as_one_indexing_whole_chunks(tmp_path_factory, monkeypatch, logs,
                                                                        slice_lines, pass_bytes):
    tmp_path = tmp_path_factory.mktemp("slices")
    root = tmp_path / "queries"
    ids = []
    for rel, lines in logs.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"".join(line + b"\n" for line in lines))
        for line in lines:
            try:
                value = orjson.loads(line).get("query_id")
            except (orjson.JSONDecodeError, AttributeError):
                continue
            if isinstance(value, str):
                ids.append(value)
    monkeypatch.setattr(shell, "POLL_MAX_BYTES", pass_bytes)
    monkeypatch.setattr(shell, "MIN_FILE_READ_BYTES", 100)
    whole, sliced = _store(tmp_path, root, "whole"), _store(tmp_path, root, "sliced")
    fields = ("lines_read", "bytes_read", "events_indexed", "bad_records", "map_entries_written", "entries")
    with production_recursion_limit():
        for _ in range(1000):
            monkeypatch.setattr(shell, "INDEX_SLICE_LINES", 1 << 30)
            whole.read_once()
            monkeypatch.setattr(shell, "INDEX_SLICE_LINES", slice_lines)
            sliced.read_once()
            assert sliced.read_to_us == whole.read_to_us
            a, b = whole.statistics(), sliced.statistics()
            assert [getattr(b, f) for f in fields] == [getattr(a, f) for f in fields]
            assert sliced.lookup(ids) == whole.lookup(ids)
            if whole.read_to_us is None:
                break
    assert whole.read_to_us is None and sliced.read_to_us is None
    assert sliced._emitter.marks() == whole._emitter.marks()
    whole.checkpoint(), sliced.checkpoint()
    assert [e.to_json() for e in sliced._map.read_all()[0]] == [e.to_json() for e in whole._map.read_all()[0]]
    assert _quarantined(sliced) == _quarantined(whole)
    whole.close(), sliced.close()


def test_slices_of_a_chunk_cover_it_and_end_where_the_next_starts():
    lines = [b"a" * k for k in range(7)]
    offsets = [100, 101, 103, 106, 110, 115, 121]
    chunk = LogChunk("f", offsets, lines, 140)          # (bad lines skipped after the last one: end past it)
    assert list(slices(chunk, 7)) == [chunk]
    parts = list(slices(chunk, 3))
    assert [p.lines for p in parts] == [lines[0:3], lines[3:6], lines[6:7]]
    assert [p.offsets for p in parts] == [offsets[0:3], offsets[3:6], offsets[6:7]]
    assert [p.end for p in parts] == [106, 121, 140]
    assert all(p.file == "f" for p in parts)
