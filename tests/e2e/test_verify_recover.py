"""Exactly once, eventually: clicks lost between commit and write are found by ``photon verify``, re-joined
after ``photon recover``, and nothing is ever joined twice (real pipeline, registry and local Spark)."""
from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

from photon import read_output_lines, wait_until
from photon.app import cli
from photon.app import GenOptions, generate, read_recoverable

from e2e_cli import KILL_ENV, run_cli


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_run_that_caught_up_with_clicks_registered_in_no_output_shows_them_lost_and_exits_5(
        tmp_path, pipeline, truth, monkeypatch):
    """The killed joiner's batch is registered, not written; the dispatcher's retry finds it registered (all
    it can know: already registered). The summary reconciles the registry with the output and says lost."""
    generate(GenOptions(out=str(tmp_path), queries=2000, unjoinable_fraction=0.0, duplicate_fraction=0.0,
                        bad_line_fraction=0.0, seed=12))
    marker = tmp_path / "killed-batch.txt"
    monkeypatch.setenv(KILL_ENV, str(marker))
    p = pipeline(tmp_path / "photon.toml").start("--until-caught-up", "--timeout", "180", "--json")
    code = p.wait(220)
    text = p.output_text()
    lost = set(marker.read_text().split())
    assert lost and code == 5, text[-3000:]
    summary = json.loads(text.strip().splitlines()[-1])
    assert summary["exit_code"] == 5 and summary["total"]["lost_in_run"] == len(lost)
    rec = summary["reconciliation"]
    assert (rec["lost"], rec["lost_by_region"], rec["error"]) == (len(lost), {"a": len(lost)}, "")
    assert set(Path(rec["lost_file"]).read_text().split()) == lost
    assert summary["total"]["already_registered"] >= len(lost) and summary["total"]["lost_awaiting_recovery"] == 0
    assert set(p.joined_ids()) == truth(tmp_path, "joinable") - lost
    assert f"{len(lost)} of them in no region's output: LOST" in text
    assert f"photon: {len(lost)} click(s) lost in this run, awaiting recovery (exit 5)" in text


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_lost_clicks_are_found_recovered_and_joined_once(tmp_path, pipeline, truth, spark, capsys, monkeypatch):
    generate(GenOptions(out=str(tmp_path), queries=3000, unjoinable_fraction=0.0, duplicate_fraction=0.0,
                        bad_line_fraction=0.0, seed=11))
    cfg = str(tmp_path / "photon.toml")
    marker = tmp_path / "killed-batch.txt"
    monkeypatch.setenv(KILL_ENV, str(marker))
    p = pipeline(cfg).start()                       # runs on through verify and recover
    joinable = truth(tmp_path, "joinable")
    wait_until(lambda: marker.exists() and set(p.joined_ids(True)) == joinable - set(marker.read_text().split()),
               120, interval=0.5, message="every click joined but the killed joiner's batch")
    lost = set(marker.read_text().split())
    assert lost and not lost & set(p.joined_ids(True))     # exactly the killed batch is missing

    code, report, err = run_cli(capsys, "verify", "--config", cfg, "--json")
    assert code == 0, err
    assert report == {"foreign_events": len(joinable), "joined": len(joinable) - len(lost), "duplicates": 0,
                      "lost": len(lost), "recoverable": len(lost), "pending": 0, "unjoinable": 0,
                      "wrongly_unjoinable": 0}
    assert {r["id"] for r in read_recoverable(tmp_path / "state" / "a" / "verify" / "recoverable")} == lost

    code, done, err = run_cli(capsys, "recover", "--config", cfg, "--json")
    assert code == 0, err
    assert (done["candidates"], done["deleted"], done["reinjected"], done["token_changed"]) == \
        (len(lost), len(lost), len(lost), 0)
    code, again, err = run_cli(capsys, "recover", "--config", cfg, "--json")   # nothing left to do twice
    assert code == 0 and again["candidates"] == 0 and again["deleted"] == 0, err

    wait_until(lambda: set(p.joined_ids(True)) == joinable, 120, interval=0.5,
               message="the recovered clicks joined")
    p2 = p
    code, report, err = run_cli(capsys, "verify", "--config", cfg, "--json")
    assert code == 0, err
    assert report["lost"] == 0 and report["duplicates"] == 0 and report["recoverable"] == 0
    assert report["joined"] == report["foreign_events"] == len(joinable) and report["pending"] == 0
    ids = p.joined_ids(include_inprogress=True)
    assert set(ids) == joinable and max(ids.values()) == 1                # every joinable click, once

    # a duplicated joined line planted in the output: non-zero exit naming the id
    joined_dir = Path(p2.config.regions[0].joined_dir)
    line = read_output_lines(joined_dir)[0]
    dup_id = orjson.loads(line)["click_id"]
    (joined_dir / "planted-1-000001.jsonl").write_bytes(line + b"\n")
    code, report, err = run_cli(capsys, "verify", "--config", cfg, "--json")
    assert code == 1 and report["duplicates"] == 1
    assert f"{dup_id} (2 times)" in err
    code, done, err = run_cli(capsys, "recover", "--config", cfg)
    assert code == 1 and "recovering nothing" in err
    (joined_dir / "planted-1-000001.jsonl").unlink()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_photon_run_clears_tokens_of_published_output_periodically(tmp_path, pipeline, truth):
    import idregistry
    generate(GenOptions(out=str(tmp_path), queries=2000, unjoinable_fraction=0.0, duplicate_fraction=0.0,
                        bad_line_fraction=0.0, seed=5))
    cfg = tmp_path / "photon.toml"
    with open(cfg, "a") as f:
        f.write("\n[registry]\nclear_tokens_every_s = 1\n\n[joiner]\nroll_interval_s = 1\n")
    p = pipeline(cfg).start()
    joinable = truth(tmp_path, "joinable")
    wait_until(lambda: set(p.joined_ids()) == joinable, 120, interval=0.5,
               message="every joinable click in published output")
    client = idregistry.connect(idregistry.registry_endpoints(p.config))
    try:
        def all_cleared() -> bool:
            tokens = {i: t for i, t, _ in client.export(0)}
            return set(tokens) == joinable and set(tokens.values()) == {""}
        wait_until(all_cleared, 60, interval=0.5, message="every joined id's token cleared during the run")
        shard = client.statistics().shards[0]
        assert shard.tokens_dropped_ids == len(joinable)          # every run's token array dropped
        assert shard.bytes_saved_by_clearing == 4 * len(joinable)
    finally:
        client.close()
    import re
    wait_until(lambda: re.search(r"clear-tokens: cleared [1-9]", p.output_text()), 30, interval=0.5,
               message="the launcher shows a clear-tokens run that cleared tokens")
    assert p.stop() == 0
    totals = re.findall(r"clear-tokens ran \d+ time\(s\): (\d+) tokens cleared; the registry saves (\d+) bytes",
                        p.output_text())
    assert totals == [(str(len(joinable)), str(4 * len(joinable)))]


class LeaderKiller:
    """A registry client whose ``delete`` SIGKILLs the shard's leader once, just before the ``after``-th
    conditional delete (recover sends them from several threads at once)."""

    def __init__(self, client, after: int) -> None:
        import threading
        self.client, self.after, self.calls, self.killed = client, after, 0, None
        self._lock = threading.Lock()

    def delete(self, event_id: str, token: str) -> bool:
        import os
        import signal
        with self._lock:
            self.calls += 1
            if self.calls == self.after and self.killed is None:
                leader = next(r for r in self.client.status() if r.get("is_leader"))
                os.kill(leader["pid"], signal.SIGKILL)
                self.killed = leader["pid"]
        return self.client.delete(event_id, token)

    def lookup(self, ids):
        return self.client.lookup(ids)


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_leader_killed_during_deletes_and_joiner_killed_during_rejoin_never_join_twice(
        tmp_path, pipeline, truth, spark, monkeypatch):
    """Recover's conditional deletes lose their registry leader after a few deletes (recover completes on
    the new leader, or is run again and resumes), and a joiner is SIGKILLed as the re-injected clicks are
    being joined (what it loses is found and recovered again): in the end 0 lost, 0 duplicates, every
    joinable click in the output once."""
    import os
    import signal
    import idregistry
    from photon import load_config
    from photon.app import run_recover, run_verify
    generate(GenOptions(out=str(tmp_path), queries=3000, unjoinable_fraction=0.0, duplicate_fraction=0.0,
                        bad_line_fraction=0.0, seed=13))
    cfg = tmp_path / "photon.toml"
    with open(cfg, "a") as f:
        f.write("\n[registry]\nclear_tokens_every_s = 0\n")
    marker = tmp_path / "killed-batch.txt"
    monkeypatch.setenv(KILL_ENV, str(marker))
    p = pipeline(cfg).start()
    joinable = truth(tmp_path, "joinable")
    wait_until(lambda: marker.exists() and set(p.joined_ids(True)) == joinable - set(marker.read_text().split()),
               120, interval=0.5, message="every click joined but the killed joiner's batch")
    lost = set(marker.read_text().split())
    assert len(lost) >= 5
    config = load_config(cfg)
    report = run_verify(config, spark)
    assert (report.lost, report.recoverable, report.duplicates) == (len(lost), len(lost), 0)

    client = idregistry.RegistryClient(idregistry.registry_endpoints(config), retry_timeout_s=60)
    try:
        killer = LeaderKiller(client, after=3)
        try:
            run_recover(config, report.recoverable_path, client=killer)
        except idregistry.RegistryUnavailable:         # gave up waiting for a new leader: run it again
            run_recover(config, report.recoverable_path, client=client)
        assert killer.killed is not None
        recovered = {orjson.loads(x)["click_id"] for f in (tmp_path / "logs/a/clicks-recovery").glob("*.jsonl")
                     for x in f.read_bytes().splitlines()}
        assert recovered == lost                                # every lost click re-injected, whatever the kill
        # the re-injected clicks are being joined: SIGKILL a joiner now
        victim = p.wait_for_process("a-j0")
        os.kill(victim, signal.SIGKILL)
        for _ in range(4):                               # what the killed joiner lost is lost again: recover it
            try:
                wait_until(lambda: set(p.joined_ids(True)) == joinable, 45, interval=0.5,
                           message="every joinable click joined")
                break
            except TimeoutError:
                again = run_verify(config, spark)
                assert again.duplicates == 0
                run_recover(config, again.recoverable_path, client=client)
    finally:
        client.close()
    wait_until(lambda: set(p.joined_ids(True)) == joinable, 60, interval=0.5, message="every joinable click joined")
    final = run_verify(config, spark)
    assert final.as_dict() == {"foreign_events": len(joinable), "joined": len(joinable), "duplicates": 0, "lost": 0,
                               "recoverable": 0, "pending": 0, "unjoinable": 0, "wrongly_unjoinable": 0}
    ids = p.joined_ids(include_inprogress=True)
    assert set(ids) == joinable and max(ids.values()) == 1


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_full_output_disk_mid_run_then_verify_and_recover_make_it_exact(small_disk, tmp_path, pipeline, truth,
                                                                        spark, capsys):
    """``photon run`` whose joined output folder is a small tmpfs that fills mid-run: joiners put the clicks
    they registered but could not write into their lost-ids ledgers, the run pauses instead of dying, and
    goes on by itself once the disk grows. Then verify finds exactly the ledger's clicks, recover re-injects
    them, the pipeline joins them, and verify reports 0 lost, 0 duplicates."""
    import joiner
    generate(GenOptions(out=str(tmp_path), queries=4000, unjoinable_fraction=0.0, duplicate_fraction=0.0,
                        bad_line_fraction=0.0, seed=17))
    # small requests also for the backlog: the disk fills while many are still to come, so the pause shows
    cfg = tmp_path / "photon.toml"
    with open(cfg, "a") as f:
        f.write("\n[registry]\nclear_tokens_every_s = 0\n\n[joiner]\nwriter_probe_s = 0.2\n"
                "\n[dispatcher]\nbatch_size = 20\nbacklog_batch_size = 20\n")
    disk = small_disk(tmp_path / "out/a/joined", "48k")      # about a third of the joined lines fit
    p = pipeline(cfg).start()
    joinable = truth(tmp_path, "joinable")
    state_dir = p.config.regions[0].state_dir
    wait_until(lambda: joiner.read_lost(state_dir), 120, interval=0.3, message="clicks in a lost-ids ledger")

    def paused() -> bool:                                   # the joiners answer THROTTLED while writes fail
        st = joiner.read_status(state_dir).values()
        return any(j.get("writer_error") for j in st) and sum(j.get("requests_throttled_writer", 0) for j in st) > 0
    wait_until(paused, 60, interval=0.3, message="the run pauses for the disk")
    assert p.proc.poll() is None                                   # paused, not dead
    assert set(p.joined_ids(True)) < joinable
    disk.resize("8m")
    ledger = {e["id"] for e in joiner.read_lost(state_dir)}
    assert ledger and all("No space left on device" in e["reason"] for e in joiner.read_lost(state_dir))
    wait_until(lambda: set(p.joined_ids(True)) == joinable - ledger, 120, interval=0.5,
               message="the run goes on by itself and joins every click but the ledger's")

    code, report, err = run_cli(capsys, "verify", "--config", str(cfg), "--json")
    assert code == 0, err
    assert report == {"foreign_events": len(joinable), "joined": len(joinable) - len(ledger), "duplicates": 0,
                      "lost": len(ledger), "recoverable": len(ledger), "pending": 0, "unjoinable": 0,
                      "wrongly_unjoinable": 0}
    assert {r["id"] for r in read_recoverable(tmp_path / "state" / "a" / "verify" / "recoverable")} == ledger
    code, done, err = run_cli(capsys, "recover", "--config", str(cfg), "--json")
    assert code == 0, err
    assert (done["deleted"], done["reinjected"]) == (len(ledger), len(ledger))
    wait_until(lambda: set(p.joined_ids(True)) == joinable, 120, interval=0.5, message="the recovered clicks joined")
    code, report, err = run_cli(capsys, "verify", "--config", str(cfg), "--json")
    assert code == 0, err
    assert (report["lost"], report["duplicates"], report["joined"], report["pending"]) == (0, 0, len(joinable), 0)
    ids = p.joined_ids(include_inprogress=True)
    assert set(ids) == joinable and max(ids.values()) == 1


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_photon_run_exits_5_after_a_full_disk_then_verify_and_recover_bring_the_registry_up_themselves(
        small_disk, tmp_path, pipeline, truth, spark, capsys):
    """As a new user meets it: ``photon run --until-caught-up`` whose joined output disk fills for a few
    seconds exits 5 (clicks lost, awaiting recovery) and stops the registry with it. ``photon verify`` and
    ``photon recover``, with no replica answering, start the registry's replicas from their data for the job
    and stop them after: verify finds exactly the ledger's clicks, recover re-injects them, a second run
    joins them (exit 0), and verify reports 0 lost. ``photon registry export`` works the same way."""
    import joiner
    from photon.app import replicas_answering
    generate(GenOptions(out=str(tmp_path), queries=4000, unjoinable_fraction=0.0, duplicate_fraction=0.0,
                        bad_line_fraction=0.0, seed=19))
    cfg = tmp_path / "photon.toml"
    with open(cfg, "a") as f:
        f.write("\n[registry]\nclear_tokens_every_s = 0\n\n[joiner]\nwriter_probe_s = 0.2\n"
                "\n[dispatcher]\nbatch_size = 20\nbacklog_batch_size = 20\n")
    disk = small_disk(tmp_path / "out/a/joined", "48k")      # about a third of the joined lines fit
    first = pipeline(cfg).start("--until-caught-up")
    joinable = truth(tmp_path, "joinable")
    state_dir = first.config.regions[0].state_dir
    wait_until(lambda: joiner.read_lost(state_dir), 120, interval=0.3, message="clicks in a lost-ids ledger")
    wait_until(lambda: any(j.get("writer_error") for j in joiner.read_status(state_dir).values()), 60,
               interval=0.3, message="the run pauses for the disk")
    disk.resize("8m")                                         # full for a few seconds only
    assert first.wait(timeout=180) == 5
    assert "click(s) lost in this run, awaiting recovery (exit 5)" in first.output_text()
    ledger = {e["id"] for e in joiner.read_lost(state_dir)}
    assert ledger and set(first.joined_ids(True)) == joinable - ledger
    replicas = first.config.registry.replicas                 # per shard; one shard here
    assert replicas_answering(first.config) == []               # the run stopped the registry with it

    code, report, err = run_cli(capsys, "verify", "--config", str(cfg), "--json")
    assert code == 0, err
    assert report == {"foreign_events": len(joinable), "joined": len(joinable) - len(ledger), "duplicates": 0,
                      "lost": len(ledger), "recoverable": len(ledger), "pending": 0, "unjoinable": 0,
                      "wrongly_unjoinable": 0}
    progress = [x for x in err.splitlines() if x.startswith("photon verify: ")]
    assert progress[0].startswith(f"photon verify: registry not running: starting its {replicas} replicas from "
                                  f"{tmp_path / 'state/a/registry'} ")
    assert progress[1].startswith("photon verify: leader elected after ")
    assert progress[2].startswith(f"photon verify: registry stopped ({replicas} replicas")
    assert replicas_answering(first.config) == []           # stopped after the job
    assert {r["id"] for r in read_recoverable(tmp_path / "state" / "a" / "verify" / "recoverable")} == ledger

    code, done, err = run_cli(capsys, "recover", "--config", str(cfg), "--json")
    assert code == 0, err
    assert (done["candidates"], done["deleted"], done["reinjected"], done["token_changed"]) == \
        (len(ledger), len(ledger), len(ledger), 0)
    assert "photon recover: registry stopped" in err and replicas_answering(first.config) == []

    second = pipeline(cfg).start("--until-caught-up")
    assert second.wait(timeout=180) == 0
    ids = second.joined_ids(include_inprogress=True)
    assert set(ids) == joinable and max(ids.values()) == 1
    code, report, err = run_cli(capsys, "verify", "--config", str(cfg), "--json")
    assert code == 0, err
    assert (report["lost"], report["duplicates"], report["joined"], report["pending"]) == (0, 0, len(joinable), 0)

    capsys.readouterr()
    assert cli.main(["registry", "export", "--config", str(cfg), "--out", str(tmp_path / "export")]) == 0
    out, err = capsys.readouterr()
    assert f"exported {len(joinable)} ids" in out and "photon registry export: registry stopped" in err
    assert replicas_answering(first.config) == []
