"""The dispatcher tails the recovery folder beside the foreign stream, with its own offsets."""
from __future__ import annotations

from photon import open_source

from dispatcher._recovery import StreamAndRecovery


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
