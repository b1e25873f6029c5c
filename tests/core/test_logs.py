import os
import subprocess
import sys

import orjson

from photon import LogTailer, Quarantine, RollingWriter, parse_record


def test_tailer_reads_only_complete_lines_and_resumes(tmp_path):
    stream = tmp_path / "clicks"
    (stream / "w0").mkdir(parents=True)
    f = stream / "w0" / "c-0.jsonl"
    f.write_bytes(b'{"a":1}\n{"a":2}\n{"a":')
    t = LogTailer(stream)
    chunks = t.poll()
    assert [c.lines for c in chunks] == [[b'{"a":1}', b'{"a":2}']]
    assert chunks[0].offsets == [0, 8] and chunks[0].end == 16
    assert t.poll() == []                      # the half line is not written yet
    with open(f, "ab") as fh:
        fh.write(b'3}\n')
    chunks = t.poll()
    assert chunks[0].lines == [b'{"a":3}'] and chunks[0].offsets == [16]
    # a new tailer from the persisted offsets re-reads nothing and misses nothing
    (stream / "w1").mkdir()
    (stream / "w1" / "c-0.jsonl").write_bytes(b'{"b":1}\n')
    with open(f, "ab") as fh:
        fh.write(b'{"a":4}\n')
    t2 = LogTailer(stream, dict(t.offsets))
    got = {c.file: c.lines for c in t2.poll()}
    assert got == {os.path.join("w0", "c-0.jsonl"): [b'{"a":4}'], os.path.join("w1", "c-0.jsonl"): [b'{"b":1}']}
    assert t2.pending_bytes() == 0


def test_tailer_skips_inprogress_and_reports_shrunk_files(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "x.jsonl.inprogress").write_bytes(b'{"a":1}\n')
    (logs / "y.jsonl").write_bytes(b'{"a":1}\n')
    q = Quarantine(tmp_path / "q", "reader")
    t = LogTailer(logs, {"y.jsonl": 100}, quarantine=q)
    assert t.poll() == []
    assert t.shrunk == ["y.jsonl"]
    q.close()
    entry = orjson.loads((tmp_path / "q" / "reader.jsonl").read_bytes())
    assert entry["file"] == "y.jsonl" and entry["offset"] == 100 and "shrank from 100 to 8" in entry["reason"]
    with open(logs / "y.jsonl", "ab") as f:
        f.write(b'{"a":2}\n')
    assert [c.lines for c in t.poll()] == [[b'{"a":2}']]


def test_tailer_reads_a_line_longer_than_its_read_size(tmp_path):
    big = b'{"k":"' + b"x" * 5000 + b'"}'
    (tmp_path / "f").write_bytes(big + b"\n" + b'{"k":1}\n')
    t = LogTailer(tmp_path, read_bytes=1024)
    lines = [line for c in t.poll() for line in c.lines]
    lines += [line for c in t.poll() for line in c.lines]
    assert lines == [big, b'{"k":1}']


def test_parse_record_reasons():
    assert parse_record(b'{"id":"x"}', ["id"]) == ({"id": "x"}, None)
    assert "not valid JSON" in parse_record(b'{"id":', ["id"])[1]
    assert "missing field 'id'" == parse_record(b'{"x":1}', ["id"])[1]
    assert "not a JSON object" in parse_record(b'[1]', ["id"])[1]
    assert "is int, not a string" in parse_record(b'{"id":1}', ["id"])[1]


def test_tailer_says_when_a_poll_read_every_complete_line(tmp_path):
    complete = b"".join(b'{"n":%d}\n' % n for n in range(100))
    (tmp_path / "a.jsonl").write_bytes(complete + b'{"half')
    (tmp_path / "b.jsonl").write_bytes(b'{"b":1}\n' * 50)
    t = LogTailer(tmp_path, read_bytes=256)
    t.poll()
    assert not t.caught_up                 # a.jsonl was cut at the read size
    while not t.caught_up:
        t.poll()
    assert t.offsets["a.jsonl"] == len(complete)
    assert t.pending_bytes() == len(b'{"half')   # an unterminated last line does not hold it back
    t = LogTailer(tmp_path, read_bytes=1 << 20)
    t.poll(max_bytes=100)
    assert not t.caught_up                 # the budget ran out before b.jsonl
    t.poll(max_bytes=1 << 20)
    assert t.caught_up


def test_quarantine_names_file_offset_reason_and_raw(tmp_path):
    q = Quarantine(tmp_path / "q", "dispatcher-a")
    q.add("w0/c-0.jsonl", 42, "not valid JSON", b"{broken")
    q.close()
    entry = orjson.loads((tmp_path / "q" / "dispatcher-a.jsonl").read_bytes())
    assert entry["file"] == "w0/c-0.jsonl" and entry["offset"] == 42 and entry["raw"] == "{broken"
    assert q.count == 1


def test_a_restarted_quarantine_skips_what_it_already_holds_past_the_resume_offsets(tmp_path):
    q = Quarantine(tmp_path, "dispatcher-a")
    for file, offset in (("c-0", 10), ("c-0", 90), ("c-1", 5)):
        q.add(file, offset, "bad", b"{x")
    q.close()
    with open(q.path, "ab") as f:
        f.write(b'{"file": "c-1", "off')         # the process died in the middle of an entry
    q = Quarantine(tmp_path, "dispatcher-a")
    assert q.skip_known({"c-0": 50}) == 2            # c-0@90 (past 50) and c-1@5 (c-1 is read from 0)
    for file, offset in (("c-0", 90), ("c-1", 5), ("c-0", 90), ("c-2", 0)):
        q.add(file, offset, "bad", b"{x")
    q.close()
    entries = [orjson.loads(line) for line in q.path.read_bytes().splitlines()]
    assert [(e["file"], e["offset"]) for e in entries] == [
        ("c-0", 10), ("c-0", 90), ("c-1", 5), ("c-0", 90), ("c-2", 0)]   # a second report of c-0@90 is new
    assert (q.count, q.repeats_skipped) == (2, 2)


SHARED_WRITER = """
import sys
from photon import Quarantine
q = Quarantine(sys.argv[1], "injector", shared=True)
offsets = range(300) if sys.argv[2] == "up" else range(299, -1, -1)
for o in offsets:
    q.add("c-%d" % (o % 3), o, "bad", b"{x")
q.close()
print(q.count, q.repeats_skipped)
"""


def test_a_shared_quarantine_holds_each_line_once_whoever_reports_it(tmp_path):
    """Two processes read the same input (an injector moved while its old owner still reads) and report the
    same 300 bad lines, in opposite orders and at the same time: each (file, offset) is written once, and a
    torn entry left by a killed writer is cut off and its line written whole by the next report."""
    procs = [subprocess.Popen([sys.executable, "-c", SHARED_WRITER, str(tmp_path), order], stdout=subprocess.PIPE)
             for order in ("up", "down")]
    outs = [p.communicate(timeout=60)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    path = tmp_path / "injector.jsonl"
    keys = [(e["file"], e["offset"]) for e in map(orjson.loads, path.read_bytes().splitlines())]
    assert sorted(keys) == sorted((f"c-{o % 3}", o) for o in range(300))
    assert sum(int(c) for c, _ in outs) == 300 and sum(int(r) for _, r in outs) == 300
    with open(path, "ab") as f:
        f.write(b'{"file": "c-0", "offset": 300, "rea')     # killed in the middle of an entry
    q = Quarantine(tmp_path, "injector", shared=True)
    q.add("c-0", 300, "bad", b"{x")
    q.add("c-1", 7, "bad", b"{x")                           # already there
    q.close()
    lines = path.read_bytes().splitlines()
    assert len(lines) == 301 and orjson.loads(lines[-1])["offset"] == 300
    assert (q.count, q.repeats_skipped) == (1, 1)


def data_files(root):
    """Output files (published or in progress) below ``root``, not the commit records."""
    return sorted(p for p in root.rglob("*.jsonl*") if "_committed" not in p.parts)


def test_rolling_writer_lists_the_lines_an_earlier_run_wrote_since_a_time(tmp_path):
    w = RollingWriter(tmp_path, "dispatcher-a", roll_interval_s=3600)
    w.write_lines([b'{"n":1}'])
    w.roll()
    old = next(tmp_path.rglob("dispatcher-a-*.jsonl"))
    os.utime(old, ns=(1_000_000_000, 1_000_000_000))     # written long ago
    w.sync(w.write_lines([b'{"n":2}', b'{"n":3}']))      # committed ...
    w._f.close()                                         # ... then died without rolling
    other = RollingWriter(tmp_path, "a-j0")
    other.write_lines([b'{"n":9}'])
    other.roll()
    again = RollingWriter(tmp_path, "dispatcher-a")
    again.recover_orphans()
    assert again.lines_written_since(2_000_000) == [b'{"n":2}', b'{"n":3}']
    assert sorted(again.lines_written_since(0)) == [b'{"n":1}', b'{"n":2}', b'{"n":3}']


def test_rolling_writer_publishes_whole_files_and_recovers_orphans(tmp_path):
    w = RollingWriter(tmp_path, "a-j0", roll_interval_s=3600, roll_bytes=30)
    w.write_lines([b'{"n":1}', b'{"n":2}'])
    assert [p.name.endswith(".inprogress") and p.name.startswith(".") for p in data_files(tmp_path)] == [True]
    w.write_lines([b'{"n":3}' * 3])            # crosses roll_bytes: published
    assert sorted(p.suffix for p in data_files(tmp_path)) == [".jsonl"]
    w.write_lines([b'{"n":4}'])
    w.sync()                                   # committed: the record vouches for it
    w.write_lines([b'{"n":6}'])                # not committed (within commit_interval_s)
    w._f.close()                               # the writer dies without rolling
    # a crash leaves an in-progress file with a torn last line; a successor publishes what the record
    # vouched for and sets the whole lines beyond it aside
    orphan = next(tmp_path.rglob("*.inprogress"))
    with open(orphan, "ab") as f:
        f.write(b'{"n":5')
    set_aside = []
    successor = RollingWriter(tmp_path, "a-j0")
    orphans = successor.recover_orphans(set_aside.append)
    assert len(orphans.published) == 1 and orphans.published[0].read_bytes() == b'{"n":4}\n'
    assert orphans.cut_lines == [b'{"n":6}'] and set_aside == [[b'{"n":6}']]
    assert not list(tmp_path.rglob("*.inprogress"))
    other = RollingWriter(tmp_path, "a-j1")
    assert other.recover_orphans().published == []


def test_write_atomic_replaces_whole_files_and_leaves_no_temp(tmp_path):
    from photon import write_atomic
    target = tmp_path / "status.json"
    write_atomic(target, b'{"n":1}')
    write_atomic(target, b'{"n":2}', durable=True)
    assert target.read_bytes() == b'{"n":2}'
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]


def test_pending_bytes_counts_files_the_poll_budget_left_unread(tmp_path):
    for name in ("a.jsonl", "b.jsonl"):
        (tmp_path / name).write_bytes(b'{"k":1}\n' * 100)
    (tmp_path / "c.jsonl").write_bytes(b'{"k":1}\n{"half"')
    t = LogTailer(tmp_path, read_bytes=1 << 20)
    chunks = t.poll(max_bytes=800)                      # the whole budget goes to a.jsonl
    assert [c.file for c in chunks] == ["a.jsonl"]
    assert t.pending_bytes() == 800 + 8 + 7             # all of b, c's complete line and its half line
    while t.poll():
        pass
    assert t.pending_bytes() == 7                      # only the line still being written


def test_wait_until_names_what_it_waited_for_and_what_it_last_saw():
    import pytest

    from photon import wait_until
    seen = []
    with pytest.raises(TimeoutError, match=r"waiting for the count at 3; last seen \[1, 1\]"):
        wait_until(lambda: seen.append(1) and False, 0.05, interval=0.01,
                   message=lambda: f"the count at 3; last seen {seen[:2]}")
    with pytest.raises(TimeoutError, match="waiting for a plain message"):
        wait_until(lambda: False, 0.01, message="a plain message")
