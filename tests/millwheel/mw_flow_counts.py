"""Joined clicks counted per advertiser with no timer anywhere: every click's id goes on to one file sink.
A module for ``millwheel run`` in the watermark-exchange tests: records flow through every process while
nothing waits on a published watermark."""
from __future__ import annotations

from pathlib import Path

from millwheel import Computation, FileSink, JoinedInjector, Topology
from millwheel.examples.ad_windows import advertiser


class Counts(Computation):
    def process_record(self, ctx, record) -> None:
        ctx.state = (ctx.state or 0) + 1
        ctx.produce("seen", {"click_id": record.value["click_id"]}, record.timestamp_us)

    def process_timer(self, ctx, timer) -> None:
        pass


def build(input: str, out: str) -> Topology:
    out_dir = Path(out)
    t = Topology()
    t.add_injector("joined", lambda: JoinedInjector(input, quarantine_dir=out_dir / ".quarantine"),
                   produces="clicks")
    t.add_computation("counts", Counts, consumes={"clicks": advertiser}, produces=["seen"])
    t.add_computation("seen-sink", lambda: FileSink(out_dir / "seen.jsonl"), consumes={"seen": FileSink.key})
    return t
