"""The whole pipeline on S3 (a real moto_server): both streams read from ``s3://`` and every output
(joined, unjoinable, quarantine) uploaded there; objects replaced by longer versions mid-run, a late object
that sorts before the ones already read, and a dispatcher killed and restarted while reading S3; then
``photon verify`` over those S3 roots (exact counts, and a planted duplicate object named)."""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import orjson
import pytest

from photon import wait_until
from photon.app import GenOptions, cli, generate


def _s3_config(tmp_path: Path, bucket, unjoinable_after_s: float) -> Path:
    text = (tmp_path / "photon.toml").read_text()
    text = text.replace('log_root = "logs/a"', f'log_root = "{bucket.url("logs/a")}"')
    text = text.replace('output_root = "out/a"', f'output_root = "{bucket.url("out/a")}"')
    text = text.replace("unjoinable_after_s = 5.0", f"unjoinable_after_s = {unjoinable_after_s}")
    text += "\n[s3]\nlist_interval_s = 0.05\nfull_list_interval_s = 0.5\nretry_max_s = 0.5\n"
    # joined output on S3 is read from published objects only: the joiners roll (publish) every 2 s rather
    # than every minute, so that a test waits for its clicks, not for the next roll
    text += "\n[joiner]\nroll_interval_s = 2\n"
    path = tmp_path / "photon-s3.toml"
    path.write_text(text)
    return path


def _files(tmp_path: Path, stream: str) -> list[Path]:
    return sorted(p for p in (tmp_path / "logs" / "a" / stream).rglob("*") if p.is_file())


def _key(tmp_path: Path, p: Path) -> str:
    return p.relative_to(tmp_path).as_posix()


def _s3_lines(bucket, prefix: str) -> list[dict]:
    out = []
    for key in bucket.keys(prefix):
        if "/_committed/" in key:            # the writers' freshness records, not output
            continue
        out += [orjson.loads(x) for x in bucket.get(key).splitlines() if x]
    return out


def _verify(capsys, cfg: Path) -> tuple[int, dict | None, str]:
    capsys.readouterr()
    code = cli.main(["verify", "--config", str(cfg), "--json"])
    out, err = capsys.readouterr()
    last = out.strip().splitlines()[-1] if out.strip() else ""
    return code, (json.loads(last) if last.startswith("{") else None), err


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_both_streams_and_the_output_on_s3_with_longer_versions_and_a_late_object(tmp_path, s3, pipeline, truth,
                                                                                   spark, capsys):
    s = generate(GenOptions(out=str(tmp_path), queries=4000, writers=2, rotate_lines=800, unjoinable_fraction=0.03,
                            duplicate_fraction=0.02, bad_line_fraction=0.003, seed=5))
    queries, clicks = _files(tmp_path, "queries"), _files(tmp_path, "clicks")
    late = queries[0]                       # w0's first object: sorts before everything listed before it
    grown = clicks[-1]                      # the newest click object: first a cut, then longer versions
    data = grown.read_bytes()
    for p in queries[1:] + clicks[:-1]:
        s3.put(_key(tmp_path, p), p.read_bytes())
    s3.put(_key(tmp_path, grown), data[: len(data) // 3])          # ends in the middle of a line
    p = pipeline(_s3_config(tmp_path, s3, unjoinable_after_s=20.0)).start()
    wait_until(lambda: p.dispatcher_status().get("events_read", 0) > 0, 120, interval=0.1,
               message="the dispatcher reading clicks from S3")
    s3.put(_key(tmp_path, grown), data[: 2 * len(data) // 3])      # replaced by a longer version of itself
    s3.put(_key(tmp_path, late), late.read_bytes())
    wait_until(lambda: p.dispatcher_status().get("events_read", 0) > 0 and
               len(p.joined_ids(include_inprogress=True)) > 0, 60, message="clicks joined")
    s3.put(_key(tmp_path, grown), data)                            # and its whole final version
    joinable, unjoinable = truth(tmp_path, "joinable"), truth(tmp_path, "unjoinable")
    wait_until(lambda: set(p.joined_ids()) >= joinable, 120, interval=0.5,
               message="every joinable click joined and uploaded")
    wait_until(lambda: p.dispatcher_status().get("unjoinable", 0) >= len(unjoinable), 60, interval=0.5,
               message="the unjoinable clicks given up")

    code, report, err = _verify(capsys, p.config_path)        # over the S3 roots, the registry still up
    assert code == 0, err
    assert report == {"foreign_events": len(joinable | unjoinable), "joined": len(joinable), "duplicates": 0,
                      "lost": 0, "recoverable": 0, "pending": 0, "unjoinable": len(unjoinable),
                      "wrongly_unjoinable": 0}
    key = sorted(k for k in s3.keys("out/a/joined/") if k.endswith(".jsonl"))[0]
    planted = key.rsplit("/", 1)[0] + "/zz-planted-1-000001.jsonl"
    s3.put(planted, s3.get(key))                              # a duplicate object
    try:
        code, report, err = _verify(capsys, p.config_path)
        ids = [orjson.loads(x)["click_id"] for x in s3.get(key).splitlines()]
        assert code == 1 and report["duplicates"] == len(ids), err
        assert f"{min(ids)} (2 times)" in err and "joined more than once" in err
    finally:
        s3.delete(planted)
    assert p.stop() == 0, p.output_text()[-3000:]
    assert set(p.joined_ids()) == joinable
    keys = [k for k in s3.keys("out/a/") if "/_committed/" not in k]
    records = [k for k in s3.keys("out/a/") if "/_committed/" in k]
    assert keys and all(k.endswith(".jsonl") and "/." not in k for k in keys), keys
    assert {k.split("/")[2] for k in records} == {"joined", "unjoinable"}    # freshness records
    for k in records:                        # each names an object of its writer that is there
        rec = orjson.loads(s3.get(k))
        last = f"{k.rsplit('/_committed/', 1)[0]}/{rec['last']}"
        assert last in keys and rec["last"].rsplit("/", 1)[1].startswith(rec["writer"] + "-"), (k, rec)
    assert {k.split("/")[2] for k in keys} == {"joined", "unjoinable", "quarantine"}
    assert {r["click_id"] for r in _s3_lines(s3, "out/a/unjoinable/")} == unjoinable
    bad = _s3_lines(s3, "out/a/quarantine/")
    assert len({(q["file"], q["offset"]) for q in bad}) == s.bad_query_lines + s.bad_click_lines
    for q in bad:                            # each entry points at its very line in the S3 object
        stream = "queries" if s3.keys(f"logs/a/queries/{q['file']}") else "clicks"
        line = s3.get(f"logs/a/{stream}/{q['file']}")[q["offset"]:].split(b"\n", 1)[0]
        assert line.decode() == q["raw"] and q["reason"]
    assert not list((Path(p.config.regions[0].state_dir) / "outbox" / "joined").glob("*.jsonl"))


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_dispatcher_killed_while_reading_s3_resumes_without_loss_or_duplicates(tmp_path, s3, pipeline, truth):
    generate(GenOptions(out=str(tmp_path), queries=20_000, writers=2, rotate_lines=2000, unjoinable_fraction=0.0,
                        duplicate_fraction=0.0, bad_line_fraction=0.0, seed=9))
    for p in _files(tmp_path, "queries") + _files(tmp_path, "clicks"):
        s3.put(_key(tmp_path, p), p.read_bytes())
    p = pipeline(_s3_config(tmp_path, s3, unjoinable_after_s=60.0))
    p.start()
    joinable = truth(tmp_path, "joinable")
    pid = p.wait_for_process("a-dispatcher")
    wait_until(lambda: len(p.joined_ids(include_inprogress=True)) >= len(joinable) // 5, 120, interval=0.05,
               message="a fifth of the clicks joined")
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: p.pid("a-dispatcher") not in (None, pid), 60, message="the dispatcher restarted")
    wait_until(lambda: set(p.joined_ids()) >= joinable, 150, interval=0.5,
               message="every click joined after the restart")
    assert p.processes()["a-dispatcher"]["restarts"] >= 1
    assert p.stop() == 0
    assert set(p.joined_ids()) == joinable
