"""A full output disk (a real tmpfs, ENOSPC) pauses the dispatcher instead of ending it or losing events: no
checkpoint moves past clicks whose unjoinable write failed, the status says what it waits for, and the
dispatcher goes on by itself once there is room; stopped while paused, a restart writes them."""
from __future__ import annotations

import orjson

from dispatcher import read_status
from dispatcher._files import load_checkpoint
from photon import read_output_lines, wait_until

from dispatcher_helpers import append_lines, click_id, click_line, config
from test_dispatcher_shell import start
from dispatcher_fakes import FakeJoinService


def unjoinable_ids(region) -> list[str]:
    return sorted(orjson.loads(x)["click_id"] for x in read_output_lines(region.unjoinable_dir, include_inprogress=True))


def test_full_output_disk_pauses_and_never_checkpoints_past_unwritten_unjoinables(small_disk, tmp_path):
    service = FakeJoinService()
    cfg = config(tmp_path, unjoinable_after_s=0.2)
    region = cfg.regions[0]
    disk = small_disk(tmp_path / "out", "300k")
    clicks = tmp_path / "logs" / "clicks" / "c.jsonl"
    d = None
    try:
        disk.fill()
        append_lines(clicks, [click_line(n) for n in range(20)])       # no query ever: unjoinable
        d = start(cfg, service)
        wait_until(lambda: "No space left" in (read_status(region.state_dir) or {}).get("waiting_for_disk", ""), 20,
                   message="the dispatcher paused on the full disk, saying so")
        disk.resize("4m")
        wait_until(lambda: len(unjoinable_ids(region)) == 20
                   and d.statistics().caught_up and not d.statistics().waiting_for_disk, 20,
                   message="resumed by itself: every unjoinable click written")
        assert d.running

        disk.resize("1m")
        disk.fill(".filler2")
        append_lines(clicks, [click_line(n) for n in range(20, 40)])
        wait_until(lambda: d.statistics().waiting_for_disk, 20, message="paused again")
        d.stop()
        d = None
        snap = load_checkpoint(tmp_path / "state" / "dispatcher")
        held = {e[0] for e in snap["events"]}
        past = snap["offsets"].get("c.jsonl", 0)
        lines = clicks.read_bytes()
        unread = {orjson.loads(x)["click_id"] for x in lines[past:].splitlines() if x}
        written = set(unjoinable_ids(region))
        for n in range(20, 40):       # each is written, or still covered by the checkpoint
            assert click_id(n) in written | held | unread, n
        disk.resize("8m")
        d = start(cfg, service)
        wait_until(lambda: d.statistics().caught_up and d.statistics().unjoinable >= 20, 20, message="restarted")
        wait_until(lambda: unjoinable_ids(region) == sorted(click_id(n) for n in range(40)), 20,
                   message="every unjoinable click exactly once")
    finally:
        if d is not None:
            d.stop()
        service.close()
