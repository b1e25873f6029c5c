"""The output writer's commit: every failure between a write and a committed line ends with the record and the
bytes agreeing (lines cut back and reported lost, or vouched for whole), never with a reader counting a line
that is later gone or a restarted writer publishing one no reader counted."""
import errno
import os
import threading

import orjson
import pytest

from photon import FakeClock, LinesLost, RollingWriter, read_output_lines
from photon import _writer
from photon._logs import partition_of, wait_until


def lines(*ns):
    return [orjson.dumps({"n": n}) for n in ns]


def record(root, prefix="a-j0"):
    return orjson.loads((root / "_committed" / f"{prefix}.json").read_bytes())


def inprogress(root):
    return sorted(root.rglob(".*.inprogress"))


def published(root):
    return sorted(p for p in root.rglob("*.jsonl") if "_committed" not in p.parts and not p.name.startswith("."))


def test_sync_makes_lines_durable_then_committed_and_one_commit_covers_many_writers(tmp_path, monkeypatch):
    synced = []
    real = os.fdatasync
    monkeypatch.setattr(_writer.os, "fdatasync", lambda fd: (synced.append(fd), real(fd))[1])
    w = RollingWriter(tmp_path, "a-j0", roll_interval_s=3600, commit_interval_s=3600)
    t1 = w.write_lines(lines(1))                     # the first write commits at once
    assert synced and read_output_lines(tmp_path) == lines(1)
    t2 = w.write_lines(lines(2))
    assert read_output_lines(tmp_path) == lines(1)   # written, not committed: not counted
    before = w.stats.commits
    w.sync(t2)
    assert read_output_lines(tmp_path) == lines(1, 2) and w.stats.commits == before + 1
    w.sync(t1)                                       # already committed: nothing to do
    assert w.stats.commits == before + 1

    # many threads, each write followed by its sync: every line committed, far fewer commits than writes
    def worker(k):
        for i in range(50):
            w.sync(w.write_lines(lines(1000 * (k + 1) + i)))
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    got = read_output_lines(tmp_path)
    assert len(got) == 2 + 400 and len(set(got)) == len(got)
    w.roll()


@pytest.mark.timeout(30)
def test_writes_go_on_during_a_commit_and_the_next_commit_covers_them_all(tmp_path, monkeypatch):
    """A group commit: its fsyncs run without the writer's lock, so requests append meanwhile; they are not
    vouched for by it (the record names the size when it began) and one next commit covers all of them."""
    w = RollingWriter(tmp_path, "a-j0", roll_interval_s=3600, commit_interval_s=3600)
    w.sync(w.write_lines(lines(0)))
    real, hold, held = os.fdatasync, threading.Event(), threading.Event()

    def slow(fd):
        if not held.is_set():
            held.set()
            assert hold.wait(20)
        real(fd)
    monkeypatch.setattr(_writer.os, "fdatasync", slow)
    first = threading.Thread(target=lambda: w.sync(w.write_lines(lines(1))))
    first.start()
    wait_until(held.is_set, 10, message="the first commit's fsync")
    commits = w.stats.commits
    tickets = [w.write_lines(lines(n)) for n in (2, 3, 4)]   # not blocked by the commit in flight
    assert record(tmp_path)["open"] == {k: len(lines(0)[0]) + 1 for k in record(tmp_path)["open"]}
    later = [threading.Thread(target=w.sync, args=(t,)) for t in tickets]
    for t in later:
        t.start()
    hold.set()
    for t in [first, *later]:
        t.join(10)
        assert not t.is_alive()
    assert w.stats.commits == commits + 2                 # the held one, then one for lines 2-4 together
    assert sorted(read_output_lines(tmp_path)) == sorted(lines(0, 1, 2, 3, 4))
    [size] = record(tmp_path)["open"].values()
    assert size == sum(len(x) + 1 for x in lines(0, 1, 2, 3, 4))
    w.roll()


def test_a_failed_fsync_cuts_back_to_the_record_and_reports_the_lines_lost(tmp_path, monkeypatch):
    w = RollingWriter(tmp_path, "a-j0", roll_interval_s=3600, commit_interval_s=3600)
    w.sync(w.write_lines(lines(1, 2)))
    vouched = record(tmp_path)["open"]
    ticket = w.write_lines(lines(3))

    def failing(fd):
        raise OSError(errno.EIO, "Input/output error")
    monkeypatch.setattr(_writer.os, "fdatasync", failing)
    with pytest.raises(LinesLost):
        w.sync(ticket)
    assert "fsync" in w.error
    assert record(tmp_path)["open"] == vouched                 # the standing record still holds ...
    assert read_output_lines(tmp_path) == lines(1, 2)          # ... and the bytes agree with it
    assert read_output_lines(tmp_path, include_inprogress=True) == lines(1, 2)
    assert w.stats.commit_failures == 1 and w.stats.bytes_cut == len(lines(3)[0]) + 1
    monkeypatch.undo()
    w.sync(w.write_lines(lines(4)))                            # goes on in a new file
    with pytest.raises(LinesLost):
        w.sync(ticket)                                         # a lost ticket stays lost
    w.roll()
    assert sorted(read_output_lines(tmp_path)) == sorted(lines(1, 2, 4))
    assert inprogress(tmp_path) == [] and len(published(tmp_path)) == 2


def test_a_record_that_cannot_be_replaced_cuts_the_unvouched_lines(tmp_path, monkeypatch):
    w = RollingWriter(tmp_path, "a-j0", roll_interval_s=3600, commit_interval_s=3600)
    w.sync(w.write_lines(lines(1)))
    ticket = w.write_lines(lines(2, 3))
    real = os.replace

    def replace(src, dst):
        if str(dst).endswith("a-j0.json"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(src, dst)
    monkeypatch.setattr(_writer.os, "replace", replace)
    with pytest.raises(LinesLost):
        w.sync(ticket)
    assert read_output_lines(tmp_path, include_inprogress=True) == lines(1)
    assert not list((tmp_path / "_committed").glob(".*tmp"))   # no temporary record left behind
    monkeypatch.undo()
    w.roll()
    assert read_output_lines(tmp_path) == lines(1) and inprogress(tmp_path) == []


def test_a_rename_failing_on_the_file_system_keeps_the_file_whole_and_vouched_then_publishes_it(tmp_path):
    w = RollingWriter(tmp_path, "a-j0", roll_interval_s=3600, commit_interval_s=3600)
    w.sync(w.write_lines(lines(1, 2)))
    [hidden] = inprogress(tmp_path)
    blocker = hidden.with_name(hidden.name[1:-len(".inprogress")])
    (blocker / "x").mkdir(parents=True)              # a non-empty folder where the file is to be published
    t3 = w.write_lines(lines(3))
    w.roll()                                         # the rename fails (the target is a folder)
    assert "publishing" in w.error and w.stats.publish_failures == 1
    w.sync(t3)                                       # not lost: fsynced whole and vouched for by the record
    assert hidden.exists() and record(tmp_path)["open"] == {
        hidden.relative_to(tmp_path).as_posix().replace("/.", "/").removesuffix(".inprogress"): hidden.stat().st_size}
    assert read_output_lines(tmp_path) == lines(1, 2, 3)
    w.sync(w.write_lines(lines(4)))                  # the next write works (a new file), no ValueError
    assert sorted(read_output_lines(tmp_path)) == sorted(lines(1, 2, 3, 4))
    w.maybe_roll()                                   # still blocked: tried again, kept
    assert hidden.exists()
    (blocker / "x").rmdir()
    blocker.rmdir()
    w.maybe_roll()
    assert not hidden.exists() and blocker.read_bytes() == b"".join(x + b"\n" for x in lines(1, 2, 3))
    w.roll()
    assert sorted(read_output_lines(tmp_path)) == sorted(lines(1, 2, 3, 4))
    assert record(tmp_path)["open"] == {} and inprogress(tmp_path) == []


def test_a_rename_failure_then_a_crash_restarts_to_the_same_lines(tmp_path):
    w = RollingWriter(tmp_path, "a-j0", roll_interval_s=3600, commit_interval_s=3600)
    w.sync(w.write_lines(lines(1, 2)))
    [hidden] = inprogress(tmp_path)
    blocker = hidden.with_name(hidden.name[1:-len(".inprogress")])
    (blocker / "x").mkdir(parents=True)
    w.roll()
    counted = read_output_lines(tmp_path)
    w.write_lines(lines(3))                          # in a second file, not committed: dies here
    w._f.close()
    (blocker / "x").rmdir()
    blocker.rmdir()
    again = RollingWriter(tmp_path, "a-j0")
    orphans = again.recover_orphans()
    assert orphans.cut_lines == lines(3) and len(orphans.published) == 1
    assert read_output_lines(tmp_path) == counted == lines(1, 2)


def test_restart_publishes_what_the_record_vouched_for_and_sets_aside_the_rest(tmp_path):
    w = RollingWriter(tmp_path, "a-j0", roll_interval_s=3600, commit_interval_s=3600)
    w.sync(w.write_lines(lines(1, 2)))
    w.write_lines(lines(3, 4))                       # whole lines, flushed, not yet committed
    w._f.close()                                     # killed
    with open(inprogress(tmp_path)[0], "ab") as f:
        f.write(b'{"n":')                            # and a torn one: the kill came mid-write
    counted = read_output_lines(tmp_path)            # what verify sees while the writer is down
    assert counted == lines(1, 2)
    set_aside = []
    orphans = RollingWriter(tmp_path, "a-j0").recover_orphans(set_aside.extend)
    assert set_aside == orphans.cut_lines == lines(3, 4)
    assert read_output_lines(tmp_path) == counted    # nothing counted disappears, nothing uncounted appears
    assert record(tmp_path)["open"] == {} and inprogress(tmp_path) == []

    # if setting aside fails, nothing is cut and a later restart does it
    w = RollingWriter(tmp_path, "a-j1", roll_interval_s=3600, commit_interval_s=3600)
    w.sync(w.write_lines(lines(5)))
    w.write_lines(lines(6))
    w._f.close()

    def refuse(cut):
        raise OSError(errno.ENOSPC, "ledger full")
    with pytest.raises(OSError):
        RollingWriter(tmp_path, "a-j1").recover_orphans(refuse)
    assert RollingWriter(tmp_path, "a-j1").recover_orphans(set_aside.extend).cut_lines == lines(6)


def test_lines_are_stamped_with_the_time_that_chose_their_file(tmp_path):
    hour = 3600 * 1_000_000
    clock = FakeClock((1_763_712_000_000_000 // hour) * hour + hour - 1)     # 1 µs before the hour ends
    w = RollingWriter(tmp_path, "a-j0", roll_interval_s=3600, commit_interval_s=0, clock=clock)

    def stamp(now_us, ls):
        clock.advance(2)                             # time passes while the line is stamped: no matter
        return [orjson.dumps({"n": i, "at": now_us}) for i, _ in enumerate(ls)]
    w.sync(w.write_lines(lines(1), stamp))
    w.sync(w.write_lines(lines(2), stamp))
    w.roll()
    for path in published(tmp_path):
        part = path.parent.relative_to(tmp_path).as_posix()
        for line in path.read_bytes().splitlines():
            assert partition_of(orjson.loads(line)["at"]) == part
    assert len(published(tmp_path)) == 2


def test_a_stamp_may_hand_back_the_bytes_to_write_already_joined(tmp_path):
    """``stamp`` may return the lines joined, each ending in a newline (one join for a whole request): they
    are written and committed as those lines, and counted by the lines given."""
    w = RollingWriter(tmp_path, "a-j0", roll_interval_s=3600, commit_interval_s=3600, clock=FakeClock(1_763_712_000_000_000))
    w.sync(w.write_lines(lines(1, 2), lambda now_us, ls: b"".join(line + b"\n" for line in ls)))
    w.sync(w.write_lines(lines(3)))
    assert read_output_lines(tmp_path) == lines(1, 2, 3)
    assert w.stats.lines_written == 3 and w.stats.bytes_written == sum(len(x) + 1 for x in lines(1, 2, 3))
    w.close()


def test_a_start_with_nothing_to_recover_makes_no_durable_write(tmp_path, monkeypatch):
    """A writer that starts where no record vouches for anything (none yet, or one reset to nothing) writes
    no record at its start (a folder and two fsyncs before a service serves): a reader counts the same
    either way, and the first commit writes the record; one that vouches for something is reset as before."""
    replaced = []
    real = _writer.write_atomic
    monkeypatch.setattr(_writer, "write_atomic", lambda path, *a, **k: (replaced.append(path), real(path, *a, **k))[1])
    before = read_output_lines(tmp_path)
    assert RollingWriter(tmp_path, "a-j0").recover_orphans().published == []
    assert replaced == [] and not (tmp_path / "_committed").exists() and read_output_lines(tmp_path) == before

    w = RollingWriter(tmp_path, "a-j0", roll_interval_s=3600, commit_interval_s=3600)
    w.sync(w.write_lines(lines(1)))                   # the first commit writes the record
    assert replaced and record(tmp_path)["open"]
    w.roll()
    assert record(tmp_path)["open"] == {} and read_output_lines(tmp_path) == lines(1)
    replaced.clear()
    RollingWriter(tmp_path, "a-j0").recover_orphans()     # a clean stop before: nothing to reset
    assert replaced == [] and record(tmp_path)["open"] == {} and read_output_lines(tmp_path) == lines(1)

    w = RollingWriter(tmp_path, "a-j0", roll_interval_s=3600, commit_interval_s=3600)
    w.sync(w.write_lines(lines(2)))
    w._f.close()                                      # killed with a file open and vouched for
    orphans = RollingWriter(tmp_path, "a-j0").recover_orphans()
    assert len(orphans.published) == 1 and replaced and record(tmp_path)["open"] == {}
    assert sorted(read_output_lines(tmp_path)) == sorted(lines(1, 2)) and inprogress(tmp_path) == []


@pytest.mark.timeout(30)
def test_the_records_own_write_runs_beside_the_data_fsync_and_replaces_the_record_only_after_it(tmp_path,
                                                                                                monkeypatch):
    """A commit's two fsyncs overlap: the new record is written and fsynced under its temporary name while the
    data's fsync runs, and renamed over the record only once that fsync returned (never vouching for bytes that
    are not durable); a data fsync that fails leaves the standing record and no temporary one."""
    w = RollingWriter(tmp_path, "a-j0", roll_interval_s=3600, commit_interval_s=3600)
    w.sync(w.write_lines(lines(0)))
    vouched = record(tmp_path)["open"]
    real_datasync, real_fsync = os.fdatasync, os.fsync
    hold, held, fsynced = threading.Event(), threading.Event(), []

    def gated(fd):
        held.set()
        assert hold.wait(20)
        real_datasync(fd)

    def recording(fd):      # (file, whether the data's fsync had not returned yet: it cannot before `hold`)
        fsynced.append((os.readlink(f"/proc/self/fd/{fd}"), not hold.is_set()))
        real_fsync(fd)
    monkeypatch.setattr(_writer.os, "fdatasync", gated)
    monkeypatch.setattr(os, "fsync", recording)
    ticket = w.write_lines(lines(1))
    syncing = threading.Thread(target=w.sync, args=(ticket,))
    syncing.start()
    def temp():
        return list((tmp_path / "_committed").glob(".a-j0.json.*.tmp"))
    wait_until(lambda: held.is_set() and any(name.endswith(".tmp") and during for name, during in fsynced),
               10, message="the record's temporary file fsynced while the data's fsync is held")
    assert temp() and orjson.loads(temp()[0].read_bytes())["open"] != vouched   # the new record, not yet in place
    assert record(tmp_path)["open"] == vouched and read_output_lines(tmp_path) == lines(0)
    hold.set()
    syncing.join(10)
    assert not syncing.is_alive()
    assert read_output_lines(tmp_path) == lines(0, 1) and temp() == []

    def failing(fd):
        raise OSError(errno.EIO, "Input/output error")
    monkeypatch.setattr(_writer.os, "fdatasync", failing)
    vouched = record(tmp_path)["open"]
    with pytest.raises(LinesLost):
        w.sync(w.write_lines(lines(2)))
    assert "fsync" in w.error and record(tmp_path)["open"] == vouched and temp() == []
    assert read_output_lines(tmp_path, include_inprogress=True) == lines(0, 1)
    monkeypatch.undo()
    w.roll()


def test_a_commit_while_the_interpreter_shuts_down_runs_the_data_fsync_on_its_own_thread(tmp_path, monkeypatch):
    """The helper pool takes no new work once the interpreter shuts down (a roller thread may still commit
    then): the data's fsync then runs on the committing thread, before the record's write, and the lines are
    committed as ever."""
    from photon import _logs
    w = RollingWriter(tmp_path, "a-j0", roll_interval_s=3600, commit_interval_s=3600)
    w.sync(w.write_lines(lines(1)))                  # the pool exists now

    class ShutDown:
        def submit(self, fn):
            raise RuntimeError("cannot schedule new futures after interpreter shutdown")
    monkeypatch.setattr(_logs._Alongside, "_pool", ShutDown())
    order, real_datasync, real_fsync = [], os.fdatasync, os.fsync
    monkeypatch.setattr(_writer.os, "fdatasync",
                        lambda fd: (order.append(("data", threading.get_ident())), real_datasync(fd))[1])
    monkeypatch.setattr(os, "fsync", lambda fd: (order.append((os.readlink(f"/proc/self/fd/{fd}").endswith(".tmp")
                                                               and "record", threading.get_ident())), real_fsync(fd))[1])
    w.sync(w.write_lines(lines(2)))
    assert read_output_lines(tmp_path) == lines(1, 2)
    assert order[0] == ("data", threading.get_ident()) and ("record", threading.get_ident()) in order[1:]
    monkeypatch.undo()
    w.roll()
