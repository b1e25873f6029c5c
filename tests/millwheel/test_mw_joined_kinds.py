"""``JoinedInjector`` over output published to S3 (a real moto_server): it reads through the output kind's
reader, so a pipeline whose output root is ``s3://`` feeds MillWheel the same records, once each, and a
restored injector resumes exactly after its position."""
from __future__ import annotations

import orjson
import pytest

from millwheel import JoinedInjector
from mw_helpers import BASE_US, joined_event
from photon import load_config, open_output_sink

pytestmark = pytest.mark.timeout(120)

NOW = BASE_US + 3_600_000_000


def s3_config(tmp_path, bucket) -> str:
    path = tmp_path / "photon.toml"
    path.write_text("[s3]\nlist_interval_s = 0.0\nfull_list_interval_s = 0.01\n" + "".join(
        f'[[regions]]\nname = "{r}"\nlog_root = "{tmp_path}/logs/{r}"\n'
        f'output_root = "{bucket.url(f"out/{r}")}"\nstate_dir = "{tmp_path}/state/{r}"\n' for r in ("a", "b")))
    return str(path)


def writer(cfg, region: str):
    config = load_config(cfg)
    reg = config.region(region)
    return open_output_sink(reg.output_url("joined"), f"{region}-j0", staging=reg.joined_dir, s3=config.s3,
                            roll_interval_s=3600, commit_interval_s=3600)


def publish(w, events) -> None:
    w.sync(w.write_lines([orjson.dumps(e) for e in events]))
    w.roll()


def test_joined_injector_reads_every_regions_output_published_to_s3_once_and_resumes(s3, tmp_path):
    cfg = s3_config(tmp_path, s3)
    a_events = [joined_event(NOW - 30_000_000 + i, "adv-1", i) for i in range(3)]
    b_events = [joined_event(NOW - 20_000_000 + i, "adv-2", 10 + i) for i in range(2)]
    wa, wb = writer(cfg, "a"), writer(cfg, "b")
    publish(wa, a_events)
    publish(wb, b_events)
    assert len(s3.keys("out/a/joined/date=")) == 1 and len(s3.keys("out/b/joined/date=")) == 1
    inj = JoinedInjector(cfg)
    inj.restore(None)
    p = inj.poll(100, NOW)
    assert sorted(r[0] for r in p.records) == sorted(e["click_id"] for e in a_events + b_events)
    assert p.caught_up and inj.poll(100, NOW).records == []
    more = [joined_event(NOW - 1_000_000, "adv-1", 99)]
    publish(wb, more)
    again = JoinedInjector(cfg)
    again.restore(p.position)
    assert [r[0] for r in again.poll(100, NOW).records] == [more[0]["click_id"]]


def test_joined_injector_over_one_s3_output_folder(s3, tmp_path):
    cfg = s3_config(tmp_path, s3)
    events = [joined_event(NOW - 10_000_000 + i, "adv-3", i) for i in range(4)]
    publish(writer(cfg, "a"), events)
    inj = JoinedInjector(s3.url("out/a/joined"))
    inj.restore(None)
    got = inj.poll(100, NOW)
    assert sorted(r[0] for r in got.records) == sorted(e["click_id"] for e in events)
    assert got.caught_up
