"""Inputs as users have them: UUID ids and RFC 3339 event times (``photon gen --ids uuid``, configured by
``[join].primary_time_field`` / ``foreign_time_field``) through ``photon run``, ``photon verify`` and
``photon recover``: clicks lost between commit and write are found, re-joined, and nothing is joined twice."""
from __future__ import annotations

import json

import pytest

from photon import custom_key, key_id, parse_event_time, wait_until
from photon.app import GenOptions, generate, read_recoverable

from e2e_cli import KILL_ENV, run_cli


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_uuid_ids_with_rfc3339_times_are_joined_verified_and_recovered_once(
        tmp_path, pipeline, truth, spark, capsys, monkeypatch):
    s = generate(GenOptions(out=str(tmp_path), queries=3000, unjoinable_fraction=0.0, duplicate_fraction=0.02,
                            bad_line_fraction=0.003, seed=21, id_style="uuid"))
    assert s.duplicate_click_lines and s.bad_click_lines and s.bad_query_lines
    cfg = str(tmp_path / "photon.toml")
    with open(cfg, "a") as f:                   # small batches: the killed joiner's batch is part of the clicks
        f.write("\n[dispatcher]\nbatch_size = 40\n")
    marker = tmp_path / "killed-batch.txt"
    monkeypatch.setenv(KILL_ENV, str(marker))
    p = pipeline(cfg).start()
    joinable = truth(tmp_path, "joinable")
    assert all(len(c) == 36 and c.count("-") == 4 for c in joinable)            # UUIDs, not Photon ids

    def settled() -> bool:
        """The killed joiner's batch is out, and the dispatcher has read everything and resolved every
        click (a JOINED answer comes only after its line is committed, so the committed output is final)."""
        st = p.dispatcher_status()
        return marker.exists() and st.get("caught_up") is True and st.get("oldest_unresolved_us") == 0

    wait_until(settled, 150, interval=0.5, message="every click resolved after the kill")
    # lost: registered by the killed joiner but in no output. Its batch (the marker, Photon keys) and any
    # other batch it had committed at the registry when it was killed, or written but not committed.
    lost = joinable - set(p.joined_ids())
    lost_keys = set(marker.read_text().split())
    assert {key_id(k) for k in lost_keys} <= lost
    assert len(lost) < len(joinable)

    # the output keeps the user's fields unchanged: the key of a joined line is its click_id with its time
    row = p.joined(True)[0]
    assert row["click_id"] in joinable and row["query"]["query_id"] == row["query_id"]
    assert "click_time" in row and row["query"]["query_time"] <= row["click_time"]
    # bad lines are quarantined with the reason naming the field, the good ones around them joined
    reasons = [q["reason"] for q in p.quarantined()]
    assert len(reasons) >= s.bad_click_lines + s.bad_query_lines
    assert any("'click_time'" in r for r in reasons) and any("'query_time'" in r for r in reasons), reasons

    code, report, err = run_cli(capsys, "verify", "--config", cfg, "--json")
    assert code == 0, err
    assert report == {"foreign_events": len(joinable), "joined": len(joinable) - len(lost), "duplicates": 0,
                      "lost": len(lost), "recoverable": len(lost), "pending": 0, "unjoinable": 0,
                      "wrongly_unjoinable": 0}
    rows = read_recoverable(tmp_path / "state" / "a" / "verify" / "recoverable")
    assert {key_id(r["id"]) for r in rows} == lost and lost_keys <= {r["id"] for r in rows}   # keys, as registered
    for r in rows:                                                   # and recover re-injects the raw lines
        event = json.loads(r["raw"])
        assert r["id"] == custom_key(event["click_id"], parse_event_time(event["click_time"], "rfc3339"))

    code, done, err = run_cli(capsys, "recover", "--config", cfg, "--json")
    assert code == 0, err
    assert (done["candidates"], done["deleted"], done["reinjected"], done["token_changed"]) == \
        (len(lost), len(lost), len(lost), 0)

    wait_until(lambda: set(p.joined_ids(True)) == joinable, 150, interval=0.5, message="the recovered clicks joined")
    code, report, err = run_cli(capsys, "verify", "--config", cfg, "--json")
    assert code == 0, err
    assert (report["lost"], report["duplicates"], report["recoverable"], report["pending"]) == (0, 0, 0, 0)
    assert report["joined"] == report["foreign_events"] == len(joinable)
    ids = p.joined_ids(include_inprogress=True)
    assert set(ids) == joinable and max(ids.values()) == 1             # every joinable click, once


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_regions_with_uuid_ids_join_every_click_once_and_verify_finds_nothing_lost(
        tmp_path, pipeline, truth, spark, capsys):
    s = generate(GenOptions(out=str(tmp_path), queries=2000, regions=("a", "b"), unjoinable_fraction=0.02,
                            duplicate_fraction=0.02, bad_line_fraction=0.0, seed=22, id_style="uuid"))
    assert s.unjoinable_clicks and s.duplicate_click_lines
    cfg = str(tmp_path / "photon.toml")
    p = pipeline(cfg).start("--until-caught-up", "--timeout", "240", "--json")
    code = p.wait(300)
    assert code == 0, p.output_text()[-3000:]
    joinable, unjoinable = truth(tmp_path, "joinable"), truth(tmp_path, "unjoinable")
    ids = p.joined_ids()
    assert set(ids) == joinable and max(ids.values()) == 1       # each click once across both regions
    assert {r["_photon"]["region"] for r in p.joined()} <= {"a", "b"}

    code, report, err = run_cli(capsys, "verify", "--config", cfg, "--json")
    assert code == 0, err
    assert report == {"foreign_events": len(joinable) + len(unjoinable), "joined": len(joinable),
                      "duplicates": 0, "lost": 0, "recoverable": 0, "pending": 0,
                      "unjoinable": len(unjoinable), "wrongly_unjoinable": 0}
