"""``examples.ad_windows`` with a windows computation that raises on one click, named by the environment
variable ``MW_POISON_CLICK`` (a click id): a module for ``millwheel run`` in the set-aside tests."""
from __future__ import annotations

import os
from pathlib import Path

from millwheel import FileSink, JoinedInjector, Topology
from millwheel.examples.ad_windows import ClickWindows, SpikeDetector, advertiser


class PoisonedWindows(ClickWindows):
    def process_record(self, ctx, record) -> None:
        super().process_record(ctx, record)      # changes the state first: a failed attempt must leave nothing
        if record.value["click_id"] == os.environ.get("MW_POISON_CLICK"):
            raise ValueError(f"poisoned click {record.value['click_id']}")


def build(input: str, out: str) -> Topology:
    out_dir = Path(out)
    t = Topology()
    t.add_injector("joined", lambda: JoinedInjector(input, quarantine_dir=out_dir / ".quarantine"), produces="clicks")
    t.add_computation("windows", PoisonedWindows, consumes={"clicks": advertiser}, produces=["window_counts"])
    t.add_computation("window-sink", lambda: FileSink(out_dir / "windows.jsonl", echo=False),
                      consumes={"window_counts": FileSink.key})
    t.add_computation("spikes", SpikeDetector, consumes={"window_counts": lambda r: r.value["advertiser_id"]},
                      produces=["anomalies"])
    t.add_computation("anomaly-sink", lambda: FileSink(out_dir / "anomalies.jsonl", echo=False),
                      consumes={"anomalies": FileSink.key})
    return t
