"""One conformance suite for the output pair of every kind in the scheme map (photon._storage.SCHEMES):
an OutputSink (photon.open_output_sink: the writer over the output folder itself, or over a local staging
folder with the kind's publisher) and an OutputReader (photon.output_reader) of the same output. Local
folders, S3 (a real moto_server) and in-memory objects each run every test; a kind that is not run here may
not be registered (the first test says so).

The contract (README "Output contract"): a line counts once its writer committed it (sync), never before;
every committed line is read exactly once by a snapshot (published files, committed prefixes of open files,
the staging folder of a kind that uploads); published files never change; a tailer returns each line once
across rolls and resumes exactly from its offsets; a crashed writer's closed files are published by its
successor and the lines beyond its commit record are never output.
"""
from __future__ import annotations

import uuid
from pathlib import Path

import orjson
import pytest

from photon import OutputReader, OutputSink, open_output_sink, output_reader, storage_kind
from photon import _kind_memory as memory
from photon._config import S3Config
from photon._storage import SCHEMES

pytestmark = pytest.mark.timeout(120)

FAST = S3Config(list_interval_s=0.0, full_list_interval_s=0.0, retry_attempts=3, retry_max_s=0.2)
KINDS = ["file", "s3", "memory"]


@pytest.fixture(params=KINDS)
def url(request, tmp_path):
    if request.param == "file":
        yield f"file://{tmp_path}/out/joined"
    elif request.param == "s3":
        yield request.getfixturevalue("s3").url("out/joined")
    else:
        bucket = f"b-{uuid.uuid4().hex[:8]}"
        yield f"memory://{bucket}/out/joined"
        memory.clear(bucket)


@pytest.fixture
def staging(tmp_path) -> Path:
    return tmp_path / "state" / "outbox" / "joined"


def sink(url: str, staging: Path, prefix: str = "r-j0"):
    return open_output_sink(url, prefix, staging=staging, s3=FAST, roll_interval_s=3600, commit_interval_s=3600)


def reader(url: str, staging: Path | None) -> OutputReader:
    return output_reader(url, FAST, outbox=staging)


def events(n0: int, n1: int) -> list[bytes]:
    return [orjson.dumps({"click_id": f"c{i}", "n": i}) for i in range(n0, n1)]


def read_tail(tailer) -> list[bytes]:
    return [line for chunk in tailer.poll() for line in chunk.lines]


def test_every_registered_scheme_runs_this_suite():
    assert sorted(KINDS) == sorted(SCHEMES)


def test_the_pair_follows_the_protocols(url, staging):
    w = sink(url, staging)
    r = reader(url, staging)
    assert isinstance(w, OutputSink) and isinstance(r, OutputReader)
    assert r.lines() == [] and r.count() == 0 and r.published() == []
    w.roll()


def test_a_line_counts_once_committed_and_never_before(url, staging):
    w = sink(url, staging)
    w.sync(w.write_lines(events(0, 1)))
    ticket = w.write_lines(events(1, 3))
    assert reader(url, staging).lines() == events(0, 1)      # written, not committed
    w.sync(ticket)
    assert reader(url, staging).lines() == events(0, 3)
    assert reader(url, staging).count() == 3
    w.roll()


def test_published_files_are_read_whole_and_once(url, staging):
    w = sink(url, staging)
    w.sync(w.write_lines(events(0, 3)))
    w.roll()
    w.sync(w.write_lines(events(3, 5)))          # the next open file: committed, not published
    r = reader(url, staging)
    assert sorted(r.lines()) == sorted(events(0, 5))
    [name] = r.published()
    assert name.endswith(".jsonl") and "/" in name            # date=.../hour=.../<file>
    assert r.read(name) == b"".join(e + b"\n" for e in events(0, 3))
    # a reader that sees only the published output (no staging folder) counts closed files only
    assert sorted(reader(url, None).lines()) == sorted(events(0, 3 if not storage_kind(url).in_place else 5))
    w.roll()
    assert sorted(reader(url, staging).lines()) == sorted(events(0, 5))
    assert sorted(reader(url, None).lines()) == sorted(events(0, 5))


def test_a_tailer_returns_each_line_once_across_rolls_and_resumes_from_its_offsets(url, staging):
    w = sink(url, staging)
    tailer = reader(url, staging).tailer()
    w.sync(w.write_lines(events(0, 2)))
    w.roll()
    got = read_tail(tailer)
    assert got == events(0, 2)
    w.sync(w.write_lines(events(2, 4)))
    w.roll()
    assert read_tail(tailer) == events(2, 4)
    assert read_tail(tailer) == [] and tailer.pending_bytes() == 0
    resumed = reader(url, staging).tailer(dict(tailer.offsets))
    w.sync(w.write_lines(events(4, 5)))
    w.roll()
    assert read_tail(resumed) == events(4, 5)


def test_object_kinds_say_how_fresh_their_published_output_is(url, staging):
    w = sink(url, staging)
    w.sync(w.write_lines(events(0, 1)))
    w.roll()
    fresh = reader(url, staging).freshness()
    if storage_kind(url).in_place:
        assert fresh == {}                          # committed lines are read where they are written
    else:
        assert set(fresh) == {"r-j0"} and fresh["r-j0"] > 0
    w.roll()


def test_a_successor_publishes_what_a_crashed_writer_left_and_never_what_it_did_not_commit(url, staging):
    dead = sink(url, staging)
    dead.sync(dead.write_lines(events(0, 2)))
    dead.write_lines(events(2, 3))                   # never committed: the writer dies here
    dead._f.close()
    successor = sink(url, staging)
    orphans = successor.recover_orphans()
    assert orphans.cut_lines == events(2, 3)
    assert sorted(reader(url, staging).lines()) == sorted(events(0, 2))
    assert sorted(reader(url, None).lines()) == sorted(events(0, 2))      # published, for every kind
    successor.roll()
