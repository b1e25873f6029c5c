"""The joined output as a live input: ``JoinedInjector`` over a Photon config reads every pipeline region's
committed output and takes its watermark from the joined horizon (the dispatchers' oldest unresolved click,
or their last complete scan less the log delay), so windows close seconds after they end."""
from __future__ import annotations

import orjson

from millwheel import JoinedInjector
from mw_helpers import BASE_US, joined_event
from photon import RollingWriter, joined_horizon_us, load_config

NOW = BASE_US + 3_600_000_000
DELAY = 2_000_000


def config(tmp_path):
    path = tmp_path / "photon.toml"
    path.write_text("".join(f'[[regions]]\nname = "{r}"\nlog_root = "{tmp_path}/logs/{r}"\n'
                            f'output_root = "{tmp_path}/out/{r}"\nstate_dir = "{tmp_path}/state/{r}"\n'
                            for r in ("a", "b")))
    return path


def status(tmp_path, region, **fields):
    d = tmp_path / "state" / region / "dispatcher"
    d.mkdir(parents=True, exist_ok=True)
    (d / "status.json").write_bytes(orjson.dumps({"scan_at_us": NOW, "pending_bytes": 0,
                                                  "oldest_unresolved_us": 0, **fields}))


def write(cfg, region, events, commit=True):
    w = RollingWriter(load_config(cfg).region(region).joined_dir, f"{region}-j0", roll_interval_s=3600,
                      commit_interval_s=3600)
    ticket = w.write_lines([orjson.dumps(e) for e in events])
    if commit:
        w.sync(ticket)
    return w


def test_the_horizon_is_the_oldest_unresolved_click_or_the_last_scan_less_the_delay(tmp_path):
    status(tmp_path, "a", oldest_unresolved_us=NOW - 50_000_000)
    status(tmp_path, "b")
    dirs = [tmp_path / "state" / r for r in ("a", "b")]
    assert joined_horizon_us(dirs, NOW, DELAY) == NOW - 50_000_000
    status(tmp_path, "a")
    assert joined_horizon_us(dirs, NOW, DELAY) == NOW - DELAY
    status(tmp_path, "a", pending_bytes=10)                  # lines left unread: unknown, holds
    assert joined_horizon_us(dirs, NOW, DELAY) == 0
    status(tmp_path, "a", scan_at_us=NOW - 60_000_000)       # a is down: b alone decides
    assert joined_horizon_us(dirs, NOW, DELAY) == NOW - DELAY
    status(tmp_path, "b", scan_at_us=NOW - 60_000_000)       # nobody live: the caller falls back
    assert joined_horizon_us(dirs, NOW, DELAY) is None


def test_joined_injector_over_a_config_reads_every_region_and_follows_the_horizon(tmp_path):
    cfg = config(tmp_path)
    a_events = [joined_event(NOW - 30_000_000 + i, "adv-1", i) for i in range(3)]
    b_events = [joined_event(NOW - 20_000_000 + i, "adv-2", 10 + i) for i in range(2)]
    wa = write(cfg, "a", a_events)
    wb = write(cfg, "b", b_events)
    status(tmp_path, "a", oldest_unresolved_us=NOW - 40_000_000)
    status(tmp_path, "b")
    inj = JoinedInjector(cfg, log_delay_us=DELAY)
    inj.restore(None)
    p = inj.poll(100, NOW)
    assert sorted(r[0] for r in p.records) == sorted(e["click_id"] for e in a_events + b_events)
    assert p.caught_up and p.watermark_us == NOW - 40_000_000      # a still holds an older click
    status(tmp_path, "a")
    assert inj.poll(100, NOW).watermark_us == NOW - DELAY           # nothing unresolved anywhere
    # a resumed injector reads only what came after its position, from both regions
    more = [joined_event(NOW - 1_000_000, "adv-1", 99)]
    wb.sync(wb.write_lines([orjson.dumps(e) for e in more]))
    again = JoinedInjector(cfg, log_delay_us=DELAY)
    again.restore(p.position)
    assert [r[0] for r in again.poll(100, NOW).records] == [more[0]["click_id"]]
    for w in (wa, wb):
        w.roll()


def test_uncommitted_lines_are_not_read_and_a_dead_pipeline_falls_back_to_the_files(tmp_path):
    cfg = config(tmp_path)
    w = write(cfg, "a", [joined_event(NOW - 5_000_000, "adv-1", 1)])
    w.write_lines([orjson.dumps(joined_event(NOW - 4_000_000, "adv-1", 2))])     # not committed yet
    status(tmp_path, "a", scan_at_us=NOW - 60_000_000)
    inj = JoinedInjector(cfg, log_delay_us=DELAY, max_delay_us=30_000_000)
    inj.restore(None)
    p = inj.poll(100, NOW)
    assert len(p.records) == 1                                      # the uncommitted line is not output yet
    assert p.watermark_us <= NOW - 30_000_000                       # no live dispatcher: from the files
    w.sync()
    assert len(inj.poll(100, NOW).records) == 1
    w.roll()
