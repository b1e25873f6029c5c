"""The output contract: hidden in-progress files, partitioned published files, the commit record, and the
readers that honour it (read_output_lines, OutputTailer)."""
from __future__ import annotations

import os
import re
import time

import orjson

from photon import OutputTailer, RollingWriter, output_snapshot, read_output_lines, write_atomic
from photon._logs import partition_of

LINE = re.compile(r"^date=\d{4}-\d{2}-\d{2}/hour=\d{2}/(\.a-j0-\d+-\d{6}\.jsonl\.inprogress|a-j0-\d+-\d{6}\.jsonl)$")


def lines(*ns):
    return [orjson.dumps({"n": n}) for n in ns]


def record(root, prefix="a-j0"):
    return orjson.loads((root / "_committed" / f"{prefix}.json").read_bytes())


def test_in_progress_files_are_hidden_partitioned_and_committed_by_the_record(tmp_path):
    w = RollingWriter(tmp_path, "a-j0", roll_interval_s=3600, commit_interval_s=3600)
    w.write_lines(lines(1, 2))                        # the first write publishes the record at once
    [path] = [p for p in tmp_path.rglob("*.jsonl*") if "_committed" not in p.parts]
    rel = path.relative_to(tmp_path).as_posix()
    assert LINE.match(rel) and path.name.startswith(".")            # hidden from folder-listing readers
    assert rel.startswith(partition_of(time.time_ns() // 1000)[:10])
    assert record(tmp_path)["open"] == {rel.replace("/.", "/").removesuffix(".inprogress"): path.stat().st_size}
    assert read_output_lines(tmp_path) == lines(1, 2)
    w.write_lines(lines(3))                           # within commit_interval_s: not committed yet
    assert read_output_lines(tmp_path) == lines(1, 2)
    assert read_output_lines(tmp_path, include_inprogress=True) == lines(1, 2, 3)
    w.flush_commits()
    assert read_output_lines(tmp_path) == lines(1, 2, 3)
    w.roll()
    assert record(tmp_path)["open"] == {}
    [published] = [p for p in tmp_path.rglob("*.jsonl") if "_committed" not in p.parts]
    assert not published.name.startswith(".") and published.read_bytes() == b"".join(x + b"\n" for x in lines(1, 2, 3))
    assert read_output_lines(tmp_path) == lines(1, 2, 3)


def test_a_file_published_after_the_record_was_read_is_counted_once(tmp_path):
    w = RollingWriter(tmp_path, "a-j0", roll_interval_s=3600, commit_interval_s=0)
    w.write_lines(lines(1, 2))
    stale = (tmp_path / "_committed" / "a-j0.json").read_bytes()
    w.roll()                                          # published; then a reader finds the old record
    write_atomic(tmp_path / "_committed" / "a-j0.json", stale)
    snap = output_snapshot(tmp_path)
    assert snap.open == {} and len(snap.published) == 1               # the listing wins
    assert read_output_lines(tmp_path) == lines(1, 2)
    w2 = RollingWriter(tmp_path, "a-j1", roll_interval_s=3600, commit_interval_s=0)
    w2.write_lines(lines(5, 6))
    snap = output_snapshot(tmp_path)                  # listed while open ...
    w2.write_lines(lines(7))
    w2.roll()                                         # ... published before it is read: same bytes
    [rel] = snap.open
    assert snap.read_open(rel).splitlines() == lines(5, 6)


def test_output_tailer_reads_committed_lines_then_the_published_file_without_repeats(tmp_path):
    w = RollingWriter(tmp_path, "a-j0", roll_interval_s=3600, commit_interval_s=3600)
    tailer = OutputTailer(tmp_path)
    assert tailer.poll() == []
    w.write_lines(lines(1, 2))
    w.write_lines(lines(3))                           # not committed yet
    got = [ln for c in tailer.poll() for ln in c.lines]
    assert got == lines(1, 2) and tailer.pending_bytes() == 0
    w.flush_commits()
    assert [ln for c in tailer.poll() for ln in c.lines] == lines(3)
    w.write_lines(lines(4))
    w.roll()
    assert [ln for c in tailer.poll() for ln in c.lines] == lines(4)
    resumed = OutputTailer(tmp_path, tailer.offsets)  # resuming from its offsets reads nothing again
    assert resumed.poll() == []
    assert [ln for c in OutputTailer(tmp_path).poll() for ln in c.lines] == lines(1, 2, 3, 4)


def test_recovered_orphans_are_published_and_the_dead_writers_record_reset(tmp_path):
    w = RollingWriter(tmp_path, "a-j0", roll_interval_s=3600, commit_interval_s=0)
    w.write_lines(lines(1))
    w._f.close()                                      # dies without rolling
    orphan = next(tmp_path.rglob(".a-j0-*.inprogress"))
    with open(orphan, "ab") as f:
        f.write(b'{"n":')
    assert read_output_lines(tmp_path) == lines(1)    # the committed prefix is visible meanwhile
    again = RollingWriter(tmp_path, "a-j0")
    [published] = again.recover_orphans().published
    assert published.parent == orphan.parent and published.name == orphan.name[1:-len(".inprogress")]
    assert record(tmp_path)["open"] == {} and read_output_lines(tmp_path) == lines(1)


def test_a_file_never_spans_two_hours(tmp_path, monkeypatch):
    w = RollingWriter(tmp_path, "a-j0", roll_interval_s=3600, commit_interval_s=0)
    hour = 3600 * 1_000_000_000
    t0 = (time.time_ns() // hour) * hour + hour - 1_000_000       # 1 ms before the hour ends
    monkeypatch.setattr(time, "time_ns", lambda: t0)
    w.write_lines(lines(1))
    monkeypatch.setattr(time, "time_ns", lambda: t0 + 2_000_000)
    w.write_lines(lines(2))
    w.roll()
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.jsonl") if "_committed" not in p.parts)
    assert len(files) == 2 and files[0].split("/")[1] != files[1].split("/")[1]
    assert read_output_lines(tmp_path) == lines(1, 2)
    assert os.path.isdir(tmp_path / "_committed")
