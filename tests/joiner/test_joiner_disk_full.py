"""A joiner whose output disk fills up (a real tmpfs, ENOSPC): registered-but-unwritten ids go durably into the
lost-ids ledger, the joiner stops committing until its output folder takes writes again, and no torn line is
left in the output."""
from __future__ import annotations

import orjson

import joiner
from joiner import Outcome
from photon import read_output_lines, wait_until

from fake_registry import FakeRegistry
from joiner_helpers import clicks, write_queries

J, AJ, NF, T, U, L = Outcome


def test_full_output_disk_records_lost_ids_and_throttles_until_space_returns(small_disk, stack, tmp_path):
    disk = small_disk(tmp_path / "out", "300k")
    reg = FakeRegistry()
    s = stack(reg, writer_probe_s=0.05)
    write_queries(s.root, range(60))
    s.wait_queries(60)
    assert s.client.join(*clicks(range(10))) == [J] * 10
    disk.fill()

    ids, refs, raws = clicks(range(10, 30))
    # committed (OK), then the write fails: recorded as lost, answered LOST (the registry holds them)
    assert s.client.join(ids, refs, raws) == [L] * 20
    token = reg.commits[-1][1]
    lost = joiner.read_lost(s.root / "state")
    assert [e["id"] for e in lost] == ids
    assert {(e["token"], e["region"], e["joiner"]) for e in lost} == {(token, "a", "a-j0")}
    assert all("No space left on device" in e["reason"] and e["at_us"] > 0 for e in lost)

    # while the writer fails, nothing touches the registry: THROTTLED at the door
    commits = len(reg.commits)
    assert s.client.join(*clicks(range(30, 40))) == [T] * 10
    assert len(reg.commits) == commits
    st = s.client.status()
    assert st["lost_ids"] == 20 and st["write_failures"] == 1 and st["requests_throttled_writer"] >= 1
    assert "No space left on device" in st["writer_error"]

    disk.resize("4m")
    wait_until(lambda: s.client.join(*clicks(range(30, 40))) == [J] * 10, 10,
               message="joining resumes once the output disk has room")
    assert s.client.status()["writer_error"] == ""
    s.server.stop()
    out = [orjson.loads(line)["click_id"] for line in read_output_lines(s.joined_dir)]   # no torn line
    assert sorted(out) == sorted(clicks(range(10))[0] + clicks(range(30, 40))[0])
    assert not set(out) & set(ids)
    assert len(joiner.read_lost(s.root / "state")) == 20


def test_read_lost_skips_a_torn_last_line(tmp_path):
    d = tmp_path / "lost"
    d.mkdir()
    (d / "a-j0.jsonl").write_bytes(b'{"id": "x", "token": "t", "at_us": 1, "reason": "r", "region": "a", '
                                   b'"joiner": "a-j0"}\n{"id": "y", "tok')
    (d / "a-j1.jsonl").write_bytes(b'{"id": "z", "token": "u", "at_us": 2, "reason": "r", "region": "a", '
                                   b'"joiner": "a-j1"}\n')
    assert [e["id"] for e in joiner.read_lost(tmp_path)] == ["x", "z"]


def test_the_ledger_takes_every_append_after_the_first_and_after_a_torn_one(tmp_path):
    """Appends to a ledger that already holds entries (a second failure, or a joiner started again on the
    same state folder) add theirs after the ones there; a torn last line is skipped, the next entry kept."""
    from joiner._lost import LostLedger, lost_path
    ledger = LostLedger(tmp_path, "a", "a-j0")
    ledger.append(["x1", "x2"], "t1", 1, "first")
    ledger.append(["y1"], "t2", 2, "second")
    LostLedger(tmp_path, "a", "a-j0").append(["z1"], "t3", 3, "after a start again")
    with open(lost_path(tmp_path, "a-j0"), "ab") as f:
        f.write(b'{"id": "torn", "tok')                           # a crash in the middle of an append
    ledger.append(["w1"], "t4", 4, "after a torn append")
    lost = joiner.read_lost(tmp_path)
    assert [(e["id"], e["token"], e["reason"]) for e in lost] == [
        ("x1", "t1", "first"), ("x2", "t1", "first"), ("y1", "t2", "second"), ("z1", "t3", "after a start again"),
        ("w1", "t4", "after a torn append")]


class FutureRefusingRegistry(FakeRegistry):
    """Like the real registry: a commit holding an id timestamped beyond the skew bound is refused whole."""

    def __init__(self, newest_us: int) -> None:
        super().__init__()
        self.newest_us = newest_us

    def commit(self, ids, token):
        from photon import id_timestamp_us
        if any(id_timestamp_us(i) > self.newest_us for i in ids):
            raise ValueError("an id is timestamped beyond the clock-skew bound")
        return super().commit(ids, token)


def test_one_click_from_the_year_2100_is_decided_alone(stack):
    from joiner_helpers import BASE_US, click_id, click_line
    reg = FutureRefusingRegistry(newest_us=BASE_US + 10_000_000_000)
    s = stack(reg)
    write_queries(s.root, range(8))
    s.wait_queries(8)
    ids, refs, raws = clicks(range(8))
    far = 4_102_444_800_000_000 - BASE_US - 1_000_000        # 2100-01-01
    ids[5] = click_id(5, base_us=BASE_US + far)
    raws[5] = click_line(5, base_us=BASE_US + far)
    assert s.client.join(ids, refs, raws) == [J] * 5 + [U] + [J] * 2
    assert s.client.status()["refused_ids"] == 1
