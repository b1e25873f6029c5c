"""Joined clicks counted per advertiser by two stages, with no timer anywhere: ``counts`` (keyed by advertiser)
counts each click and passes it on, ``totals`` (keyed by advertiser again, so records cross processes)
counts it again. A module for ``millwheel run`` in the watermark-exchange tests: records flow through every
process while nothing waits on a published watermark; each stage's state is its count per advertiser
(no file output, whose writes would not be fenced while the intervals spread at the start)."""
from __future__ import annotations

from pathlib import Path

from millwheel import Computation, JoinedInjector, Topology
from millwheel.examples.ad_windows import advertiser


class Count(Computation):
    """The number of clicks per advertiser; ``counts`` passes each click on."""

    def process_record(self, ctx, record) -> None:
        ctx.state = (ctx.state or 0) + 1
        if record.stream == "clicks":
            ctx.produce("counted", record.value, record.timestamp_us)

    def process_timer(self, ctx, timer) -> None:
        pass


def build(input: str, out: str) -> Topology:
    t = Topology()
    t.add_injector("joined", lambda: JoinedInjector(input, quarantine_dir=Path(out) / ".quarantine"),
                   produces="clicks")
    t.add_computation("counts", Count, consumes={"clicks": advertiser}, produces=["counted"])
    t.add_computation("totals", Count, consumes={"counted": advertiser})
    return t
