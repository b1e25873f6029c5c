"""The run summary never calls a loss a prevented duplicate: clicks of the lost-ids ledger, unrecorded ids of
a stopping joiner, and ids the registry holds but no output has (found by reconciling the registry export
with the output) are shown as lost, and make ``photon run`` exit 5."""
from __future__ import annotations

import orjson
import pytest

from idregistry import InMemoryRegistry, export_registry
from photon import FakeClock, RollingWriter, parse_config
from photon.app._reconcile import LOST_FILE, Reconciliation, reconcile
from photon.app._summary import build_summary, format_summary
from photon.app.cli import EXIT_LOST, run_exit_code

RUN_START_US = 1_763_712_000_000_000
A_JOINER, B_JOINER, ELSEWHERE = "127.0.0.1:7001", "127.0.0.1:7002", "10.9.9.9:7001"


def _config(tmp_path, regions=("a",)):
    return parse_config({"regions": [{"name": n, "log_root": str(tmp_path / n / "logs"),
                                      "output_root": str(tmp_path / n / "out"),
                                      "state_dir": str(tmp_path / n / "state")} for n in regions]},
                        str(tmp_path / "photon.toml"), tmp_path)


def _dispatcher_status(tmp_path, region="a", **counters):
    (tmp_path / region / "state" / "dispatcher").mkdir(parents=True, exist_ok=True)
    (tmp_path / region / "state" / "dispatcher" / "status.json").write_bytes(orjson.dumps(
        {"events_read": 100, "joined": 90, "wasted_joins": 8, "already_registered": 7, "unjoinable": 0,
         "lost": 0, **counters}))


def _joiner_status(tmp_path, name, unrecorded, written_at_us, region="a"):
    (tmp_path / region / "state" / "joiners").mkdir(parents=True, exist_ok=True)
    (tmp_path / region / "state" / "joiners" / f"{name}.json").write_bytes(orjson.dumps(
        {"name": name, "unrecorded_ids": unrecorded, "pid": 1, "written_at_us": written_at_us}))


def cid(n: int, host: str = "10.0.0.1") -> str:
    return f"{host}:100:{RUN_START_US - 3_600_000_000 + n:016d}"


@pytest.mark.timeout(30)
def test_ledger_ids_are_shown_as_lost_not_as_already_registered(tmp_path):
    config = _config(tmp_path)
    _dispatcher_status(tmp_path, lost=3)
    (tmp_path / "a" / "state" / "lost").mkdir(parents=True)
    entries = [{"id": f"c{i}", "token": "t", "at_us": RUN_START_US + 1, "reason": "output write failed: [Errno 28] "
                "No space left on device", "region": "a", "joiner": "a-j0"} for i in (1, 2, 3, 3)]
    (tmp_path / "a" / "state" / "lost" / "a-j0.jsonl").write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in entries))
    s = build_summary(config, 1.0)                   # photon status: the ledger, no run
    assert s["regions"]["a"]["lost_awaiting_recovery"] == 3
    assert s["regions"]["a"]["already_registered"] == 7 and s["regions"]["a"]["lost"] == 3
    text = format_summary(s)
    assert "lost-ids ledgers: 3 click(s)" in text and "already reg." in text and "dups prev." not in text
    run = build_summary(config, 1.0, since_us=RUN_START_US)          # a stopped run: its ledger entries
    assert run["total"]["lost_in_run"] == 3 and run_exit_code(0, run) == EXIT_LOST
    later = build_summary(config, 1.0, since_us=RUN_START_US + 10)   # a later run lost nothing itself
    assert later["total"]["lost_in_run"] == 0 and run_exit_code(0, later) == 0
    # recovery re-joined c2 (in region a's output now): no longer lost in that run; c1 and c3 still are
    w = RollingWriter(config.region("a").joined_dir, "a-j9", commit_interval_s=0)
    w.sync(w.write_lines([orjson.dumps({"click_id": "c2", "query_id": "q"})]))
    w.roll()
    run = build_summary(config, 1.0, since_us=RUN_START_US)
    assert run["total"]["lost_in_run"] == 2 and run_exit_code(0, run) == EXIT_LOST


@pytest.mark.timeout(30)
def test_unrecorded_ids_of_a_stopping_joiner_show_a_loss_and_exit_5(tmp_path):
    config = _config(tmp_path)
    _dispatcher_status(tmp_path)
    _joiner_status(tmp_path, "a-j0", 2, RUN_START_US + 5_000_000)     # written at this run's stop
    _joiner_status(tmp_path, "a-j1", 4, RUN_START_US - 5_000_000)     # an earlier run's joiner
    for code in (0, 3, 130):
        s = build_summary(config, 1.0, since_us=RUN_START_US)
        assert s["regions"]["a"]["unrecorded_ids"] == 2 and s["total"]["lost_in_run"] == 2
        assert run_exit_code(code, s) == EXIT_LOST
    # a reconciliation that found nothing (taken before the stop) never hides them
    s = build_summary(config, 1.0, since_us=RUN_START_US,
                      reconciliation=Reconciliation(RUN_START_US, registered=90, output_ids=90))
    assert s["total"]["lost_in_run"] == 2 and run_exit_code(0, s) == EXIT_LOST
    text = format_summary(s)
    assert "unrecorded: 2 registered id(s)" in text and "lost in this run: 2" in text
    row = next(line for line in text.splitlines() if line.startswith("a "))
    assert row.split()[7] == "2"                     # the lost column
    assert build_summary(config, 1.0)["regions"]["a"]["unrecorded_ids"] == 6   # photon status: every joiner's


def _write_output(config, region: str, ids: list[str], commit_only: list[str] = ()) -> RollingWriter:
    """Joined lines of ``ids`` published, and of ``commit_only`` committed in a file still open (until the
    returned writer is closed)."""
    w = RollingWriter(config.region(region).joined_dir, f"{region}-j0", commit_interval_s=0.0)
    w.write_lines([orjson.dumps({"click_id": i, "query": {"click_id": "not-this-one"}}) for i in ids])
    w.roll()
    if commit_only:
        w.write_lines([orjson.dumps({"click_id": i}) for i in commit_only])
        w.flush_commits()
    return w


@pytest.mark.timeout(60)
def test_reconcile_shows_registered_ids_in_no_output_as_lost(tmp_path):
    config = _config(tmp_path, ("a", "b"))
    for n in ("a", "b"):
        _dispatcher_status(tmp_path, n)
    clock = FakeClock(RUN_START_US - 60_000_000)
    registry = InMemoryRegistry(clock)
    before = [cid(n) for n in range(5)]
    registry.commit(before, f"{A_JOINER}/11/1/1")          # an earlier run's, never written: not this run's
    clock.set(RUN_START_US + 1_000_000)
    in_a, lost_a = [cid(n) for n in range(10, 16)], [cid(n) for n in range(16, 18)]
    in_b_from_a = [cid(18)]                                  # written by b after a recovery: in an output
    in_b = [cid(n) for n in range(20, 23)]
    elsewhere = [cid(n) for n in range(30, 32)]              # another launcher's joiner: not judged here
    registry.commit(in_a + lost_a + in_b_from_a, f"{A_JOINER}/12/{RUN_START_US}/1")
    registry.commit(in_b, f"{B_JOINER}/13/{RUN_START_US}/1")
    registry.commit(elsewhere, f"{ELSEWHERE}/14/{RUN_START_US}/1")
    open_writer = _write_output(config, "a", in_a[:4], commit_only=in_a[4:])
    _write_output(config, "b", in_b + in_b_from_a)
    export = tmp_path / "a" / "state" / "reconcile" / "export"
    export_registry(registry, export)
    progress: list[str] = []
    try:
        rec = reconcile(config, export, RUN_START_US, {A_JOINER: "a", B_JOINER: "b"}, echo=progress.append)
    finally:
        open_writer.close()
    assert (rec.registered, rec.lost, rec.lost_by_region, rec.error) == (12, 2, {"a": 2}, "")
    assert rec.output_ids == 10 and rec.regions_read == ("a", "b")
    assert (tmp_path / "a" / "state" / "reconcile" / LOST_FILE).read_text().split() == sorted(lost_a)
    assert any("region b: 4 joined ids" in m for m in progress)
    s = build_summary(config, 1.0, since_us=RUN_START_US, reconciliation=rec)
    assert (s["regions"]["a"]["lost_in_run"], s["regions"]["b"]["lost_in_run"]) == (2, 0)
    assert s["reconciliation"]["lost_sample"] == sorted(lost_a) and run_exit_code(0, s) == EXIT_LOST
    text = format_summary(s)
    assert "12 id(s) registered by this run's joiners, 2 of them in no region's output: LOST" in text
    # once written, nothing is lost and the list of an earlier reconciliation is gone
    _write_output(config, "a", lost_a)
    rec = reconcile(config, export, RUN_START_US, {A_JOINER: "a", B_JOINER: "b"})
    assert (rec.registered, rec.lost, rec.lost_file) == (12, 0, "")
    assert not (tmp_path / "a" / "state" / "reconcile" / LOST_FILE).exists()
    s = build_summary(config, 1.0, since_us=RUN_START_US, reconciliation=rec)
    assert s["total"]["lost_in_run"] == 0 and run_exit_code(0, s) == 0


@pytest.mark.timeout(30)
def test_a_failed_reconciliation_is_said_and_falls_back_to_the_ledgers(tmp_path):
    config = _config(tmp_path)
    _dispatcher_status(tmp_path)
    rec = Reconciliation(RUN_START_US, error="the registry export failed: RegistryUnavailable: no leader")
    s = build_summary(config, 1.0, since_us=RUN_START_US, reconciliation=rec)
    assert s["total"]["lost_in_run"] == 0
    assert "not reconciled with the output (the registry export failed" in format_summary(s)
