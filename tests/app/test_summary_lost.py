"""The run summary shows clicks of the lost-ids ledger as lost, awaiting recovery (the joiner answered LOST
for them; the dispatcher counts them as lost, not among its prevented duplicates)."""
from __future__ import annotations

import orjson

from photon import parse_config
from photon.app._summary import build_summary, format_summary


def test_lost_ids_are_shown_as_lost_not_as_prevented_duplicates(tmp_path):
    config = parse_config({"regions": [{"name": "a", "log_root": str(tmp_path / "logs"),
                                        "output_root": str(tmp_path / "out"), "state_dir": str(tmp_path / "state")}]},
                          str(tmp_path / "photon.toml"), tmp_path)
    (tmp_path / "state" / "dispatcher").mkdir(parents=True)
    (tmp_path / "state" / "dispatcher" / "status.json").write_bytes(orjson.dumps(
        {"events_read": 100, "joined": 90, "wasted_joins": 8, "already_registered": 7, "unjoinable": 0,
         "lost": 3}))
    (tmp_path / "state" / "lost").mkdir()
    entries = [{"id": f"c{i}", "token": "t", "at_us": 1, "reason": "output write failed: [Errno 28] No space "
                "left on device", "region": "a", "joiner": "a-j0"} for i in (1, 2, 3, 3)]
    (tmp_path / "state" / "lost" / "a-j0.jsonl").write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in entries))
    s = build_summary(config, 1.0)
    assert s["regions"]["a"]["lost_awaiting_recovery"] == 3
    assert s["regions"]["a"]["already_registered"] == 7 and s["regions"]["a"]["lost"] == 3
    assert s["total"]["lost_awaiting_recovery"] == 3
    text = format_summary(s)
    assert "lost, awaiting recovery: 3" in text
