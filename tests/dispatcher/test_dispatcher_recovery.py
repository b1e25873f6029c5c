"""The dispatcher tails the recovery folder beside the foreign stream, with its own offsets."""
from __future__ import annotations

from photon import ObjectInfo, open_source

from dispatcher._recovery import MIN_FILE_READ_BYTES, StreamAndRecovery, oldest_first


def tailer(root, offsets=None):
    return StreamAndRecovery(open_source(str(root / "clicks")), open_source(str(root / "clicks-recovery")),
                             "clicks", offsets=offsets)


def test_reads_both_folders_and_resumes_each_from_its_own_offsets(tmp_path):
    (tmp_path / "clicks" / "w0").mkdir(parents=True)
    (tmp_path / "clicks" / "w0" / "a.jsonl").write_bytes(b'{"n": 1}\n{"n": 2}\n')
    t = tailer(tmp_path)
    assert [c.file for c in t.poll()] == ["w0/a.jsonl"]            # no recovery folder yet: nothing else
    rec = tmp_path / "clicks-recovery"
    rec.mkdir()
    (rec / "recovered-1.jsonl").write_bytes(b'{"n": 3}\n')
    (rec / ".recovered-2.jsonl.tmp").write_bytes(b'{"n": 4}\n')   # being written: invisible
    chunks = t.poll()
    assert [(c.file, c.lines) for c in chunks] == [("../clicks-recovery/recovered-1.jsonl", [b'{"n": 3}'])]
    assert (tmp_path / "clicks" / chunks[0].file).resolve() == (rec / "recovered-1.jsonl").resolve()
    assert t.offsets == {"w0/a.jsonl": 18, "../clicks-recovery/recovered-1.jsonl": 9}
    with open(rec / "recovered-1.jsonl", "ab") as f:
        f.write(b'{"n": 5}\n')
    resumed = tailer(tmp_path, t.offsets)
    assert [(c.file, c.lines) for c in resumed.poll()] == [("../clicks-recovery/recovered-1.jsonl", [b'{"n": 5}'])]
    assert resumed.pending_bytes() == 0 and resumed.caught_up


PAD = b"x" * 480     # lines of 512 bytes


def _writers(root, writers=3, files=2, lines=40):
    """``writers`` folders of ``files`` rolled files each; line ``n`` of writer ``w`` is ``{"w": w, "n": n}``
    (n counting on across the writer's files: its time order)."""
    for w in range(writers):
        folder = root / "clicks" / f"w{w}"
        folder.mkdir(parents=True)
        for f in range(files):
            (folder / f"clicks-{f:05d}.jsonl").write_bytes(b"".join(
                b'{"w": %d, "n": %03d, "pad": "%s"}\n' % (w, f * lines + n, PAD) for n in range(lines)))


def test_a_backlog_of_several_writers_is_read_side_by_side_oldest_first(tmp_path):
    _writers(tmp_path)
    t = tailer(tmp_path)
    line = len(b'{"w": 0, "n": 000, "pad": ""}\n') + len(PAD)
    assert 30 * line // 3 >= MIN_FILE_READ_BYTES
    first = t.poll(30 * line)              # a small budget: shared by each writer's first file, 10 lines each
    assert [(c.file, len(c.lines)) for c in first] == [
        ("w0/clicks-00000.jsonl", 10), ("w1/clicks-00000.jsonl", 10), ("w2/clicks-00000.jsonl", 10)]
    read = {w: [] for w in range(3)}
    for c in first:
        for raw in c.lines:
            read[int(raw[6:7])].append(int(raw[14:17]))
    while chunks := t.poll(30 * line):
        # a writer's later file is read only once its earlier one is done
        files = [c.file for c in chunks]
        for w in range(3):
            assert not (f"w{w}/clicks-00000.jsonl" in files and f"w{w}/clicks-00001.jsonl" in files)
        for c in chunks:
            for raw in c.lines:
                read[int(raw[6:7])].append(int(raw[14:17]))
    assert read == {w: list(range(80)) for w in range(3)}    # every line once, each writer's in its order
    assert t.caught_up and t.pending_bytes() == 0


def test_the_files_in_front_are_each_folders_first_unread_one():
    view = {n: ObjectInfo(n, 100, "v") for n in ("b/2", "a/1", "a/2", "b/1", "c/1", "top")}
    names, per_file = oldest_first(view, {"a/1": 100, "b/1": 40}, 1 << 20)
    assert names[:4] == ["a/2", "b/1", "c/1", "top"] and sorted(names) == sorted(view)
    assert per_file == (1 << 20) // 4
    names, per_file = oldest_first(view, {n: 100 for n in view}, 1 << 20)   # all read: none in front
    assert names == sorted(view) and per_file == 1 << 20
    assert oldest_first(view, {}, 100)[1] == MIN_FILE_READ_BYTES
