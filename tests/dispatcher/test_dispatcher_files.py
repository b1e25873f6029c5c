"""The checkpoint files: a full snapshot plus a journal of deltas; a torn last line never counts."""
from __future__ import annotations

import orjson
import pytest

from dispatcher._files import CHECKPOINT_FILE, CheckpointFiles, load_checkpoint

pytestmark = pytest.mark.timeout(30)


def snapshot(events):
    return {"format": 1, "written_at_us": 1, "offsets": {"a": 10}, "events": events, "recovered": [],
            "counters": {"joined": 0}, "join_latency_hist": {}}


def delta(at, add=(), gone=(), sent=(), dup=(), offsets=None):
    return {"written_at_us": at, "offsets": offsets or {"a": 10 + at}, "add": list(add), "recovered": [],
            "dup": list(dup), "sent": list(sent), "gone": list(gone), "counters": {"joined": at},
            "join_latency_hist": {}}


def event(i, attempts=0):
    return [i, "q" + i, '{"c":"' + i + '"}', 5, attempts, []]


def test_load_applies_the_complete_journal_lines_and_ignores_a_torn_one(tmp_path):
    files = CheckpointFiles(tmp_path)
    assert load_checkpoint(tmp_path) is None
    files.save_snapshot(snapshot([event("x"), event("y")]))
    files.append_delta(delta(2, add=[event("z")], gone=["x"], sent=["y"], dup=[["y", "copy"]]))
    files.append_delta(delta(3, sent=["y", "z"]))
    journal = tmp_path / f"checkpoint.{files.journal}.log"
    with open(journal, "ab") as f:
        f.write(orjson.dumps(delta(4, gone=["y", "z"]))[:40])     # a crash in the middle of an append
    snap = load_checkpoint(tmp_path)
    assert snap["offsets"] == {"a": 13} and snap["counters"] == {"joined": 3} and snap["written_at_us"] == 3
    assert {e[0]: (e[4], e[5]) for e in snap["events"]} == {"y": (2, ["copy"]), "z": (1, [])}
    files.close()

    again = CheckpointFiles(tmp_path, snap["journal"])              # the next run starts with a full one
    again.save_snapshot(snap)
    assert not journal.exists() and orjson.loads((tmp_path / CHECKPOINT_FILE).read_bytes())["journal"] == 2
    assert load_checkpoint(tmp_path)["events"] == snap["events"]
    again.append_delta(delta(5, gone=["y"]))
    assert [e[0] for e in load_checkpoint(tmp_path)["events"]] == ["z"]
    again.close()


def test_a_failed_append_leaves_no_partial_line_once_retried(tmp_path, monkeypatch):
    import os
    files = CheckpointFiles(tmp_path)
    files.save_snapshot(snapshot([event("x")]))
    files.append_delta(delta(2, sent=["x"]))
    real = os.fdatasync
    calls = []

    def failing(fd):
        calls.append(fd)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fdatasync", failing)
    with pytest.raises(OSError):
        files.append_delta(delta(3, sent=["x"]))
    monkeypatch.setattr(os, "fdatasync", real)
    files.append_delta(delta(3, sent=["x"]))                        # the retry of the same delta
    snap = load_checkpoint(tmp_path)
    assert calls and snap["events"][0][4] == 2 and snap["written_at_us"] == 3
    files.close()
