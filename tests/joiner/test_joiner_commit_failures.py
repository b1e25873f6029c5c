"""Every step from an OK registry commit to a durable, committed output line (write, fsync, commit record,
roll) may fail; each failure ends with the ids in the lost-ids ledger and the events answered LOST (never
JOINED, never left to count as already registered), the joiner throttled until a probe write succeeds, and
nothing of them in the output (not even later: the lines are cut back)."""
from __future__ import annotations

import errno
import os
import threading

import orjson
import pytest

import joiner
from joiner import Outcome
from photon import read_output_lines, wait_until

from fake_registry import FakeRegistry
from joiner_helpers import clicks, write_queries

J, AJ, NF, T, U, L = Outcome


def fail_fsync(monkeypatch):
    def failing(fd):
        raise OSError(errno.EIO, "Input/output error")
    monkeypatch.setattr(os, "fdatasync", failing)


def fail_record(monkeypatch):
    real = os.replace

    def replace(src, dst):
        if "_committed" in str(dst):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(src, dst)
    monkeypatch.setattr(os, "replace", replace)


def output_ids(s, include_inprogress=False):
    return [orjson.loads(line)["click_id"] for line in read_output_lines(s.joined_dir, include_inprogress)]


@pytest.mark.parametrize("inject,words", [(fail_fsync, "fsync"), (fail_record, "commit record")])
def test_a_failed_commit_after_an_ok_registration_is_a_loss_in_the_ledger(stack, monkeypatch, inject, words):
    reg = FakeRegistry()
    # the first probe comes writer_probe_s after the failure; a failing commit record leaves the probe's
    # write working, so the door stays shut only until then: long enough for the checks below on a busy host
    s = stack(reg, writer_probe_s=2.0, roll_interval_s=3600)
    write_queries(s.root, range(60))
    s.wait_queries(60)
    assert s.client.join(*clicks(range(10))) == [J] * 10
    inject(monkeypatch)

    ids, refs, raws = clicks(range(10, 30))
    assert s.client.join(ids, refs, raws) == [L] * 20             # registered, cut back, in the ledger
    token = reg.commits[-1][1]
    lost = joiner.read_lost(s.root / "state")
    assert [e["id"] for e in lost] == ids and {e["token"] for e in lost} == {token}
    assert all(words in e["reason"] for e in lost)
    assert not set(output_ids(s, include_inprogress=True)) & set(ids)   # not even in the hidden file

    commits = len(reg.commits)
    assert s.client.join(*clicks(range(30, 40))) == [T] * 10       # throttled at the door while it fails
    assert len(reg.commits) == commits
    assert words in s.client.status()["writer_error"]

    monkeypatch.undo()
    wait_until(lambda: s.client.join(*clicks(range(30, 40))) == [J] * 10, 30,
               message="joining resumes once a probe write succeeds")
    s.server.stop()
    assert sorted(output_ids(s)) == sorted(clicks(range(10))[0] + clicks(range(30, 40))[0])


def test_a_failure_the_roller_meets_first_closes_the_gate(stack, monkeypatch):
    reg = FakeRegistry()
    s = stack(reg, writer_probe_s=0.05, roll_interval_s=0.05)
    write_queries(s.root, range(500))
    s.wait_queries(500)
    assert s.client.join(*clicks(range(10))) == [J] * 10
    joined = clicks(range(10))[0]
    real = os.fdatasync

    failed = threading.Event()

    def failing_in_the_roller(fd):      # the roller meets it first; from then on every fsync fails
        if failed.is_set() or threading.current_thread().name.endswith("-roller"):
            failed.set()
            raise OSError(errno.EIO, "Input/output error")
        return real(fd)
    monkeypatch.setattr(os, "fdatasync", failing_in_the_roller)
    keeper = iter(range(100, 500, 10))

    def roller_failed() -> bool:
        if "fsync" in s.client.status()["writer_error"]:
            return True
        # the roller may have published the open file before the failure was in place: give it another
        k = next(keeper)
        ids, refs, raws = clicks(range(k, k + 10))
        joined.extend(i for i, answer in zip(ids, s.client.join(ids, refs, raws)) if answer == J)
        return False
    wait_until(roller_failed, 10, interval=0.3, message="the roller's failure")
    commits = len(reg.commits)
    assert s.client.join(*clicks(range(10, 20))) == [T] * 10
    assert len(reg.commits) == commits                         # nothing registered while nothing can be written
    monkeypatch.undo()
    wait_until(lambda: s.client.join(*clicks(range(10, 20))) == [J] * 10, 10, message="joining resumes")
    s.server.stop()
    assert sorted(output_ids(s)) == sorted(joined + clicks(range(10, 20))[0])


def test_a_killed_joiners_uncommitted_lines_go_to_the_ledger_at_restart_and_never_into_the_output(stack):
    from photon import RollingWriter
    reg = FakeRegistry()
    s = stack(reg, roll_interval_s=3600)
    # what a killed joiner "a-j1" left: two committed lines, then three whole lines its record does not vouch
    # for (written after the last commit) and a torn one
    dead = RollingWriter(s.joined_dir, "a-j1", roll_interval_s=3600, commit_interval_s=3600)
    line = lambda i: orjson.dumps({"click_id": i, "query_id": "q", "_photon": {"joiner": "a-j1"}})
    dead.sync(dead.write_lines([line("c-1"), line("c-2")]))
    dead.write_lines([line("x-1"), line("x-2"), line("x-3")])
    dead._f.write(b'{"click_id":"torn')
    dead._f.close()
    counted = output_ids(s)
    assert counted == ["c-1", "c-2"]
    again = joiner.serve(s.config, "a", "a-j1", eventstore=s.store.address, registry=reg)
    try:
        assert output_ids(s) == counted                         # what readers counted, nothing more
        assert not list(s.joined_dir.rglob(".*.inprogress"))
        lost = joiner.read_lost(s.root / "state")
        assert [e["id"] for e in lost] == ["x-1", "x-2", "x-3"]
        assert {e["token"] for e in lost} == {""} and all("commit record" in e["reason"] for e in lost)
        assert again.statistics().lost_ids == 3
    finally:
        again.stop()
