"""``examples.ad_windows`` with a cycle before its windows: every joined click goes round ping → pong →
ping ``HOPS`` times (keyed by advertiser, so the trips cross worker processes) before the per-minute
windows count it. A module for ``millwheel run`` in the cycle tests: its windows close only if the
watermark moves through the cycle."""
from __future__ import annotations

from pathlib import Path

from millwheel import Computation, FileSink, JoinedInjector, Topology
from millwheel.examples.ad_windows import ClickWindows, advertiser

HOPS = 3


class Ping(Computation):
    def process_record(self, ctx, record) -> None:
        hops = record.value.get("_hops", 0)
        if hops < HOPS:
            ctx.produce("ping_out", {**record.value, "_hops": hops + 1}, record.timestamp_us)
        else:
            ctx.produce("cycled", record.value, record.timestamp_us)

    def process_timer(self, ctx, timer) -> None:
        pass


class Pong(Computation):
    def process_record(self, ctx, record) -> None:
        ctx.produce("pong_out", record.value, record.timestamp_us)

    def process_timer(self, ctx, timer) -> None:
        pass


def build(input: str, out: str) -> Topology:
    out_dir = Path(out)
    t = Topology()
    t.add_injector("joined", lambda: JoinedInjector(input, quarantine_dir=out_dir / ".quarantine"),
                   produces="clicks")
    t.add_computation("ping", Ping, consumes={"clicks": advertiser, "pong_out": None},
                      produces=["ping_out", "cycled"])
    t.add_computation("pong", Pong, consumes=["ping_out"], produces=["pong_out"])
    t.add_computation("windows", ClickWindows, consumes=["cycled"], produces=["window_counts"])
    t.add_computation("window-sink", lambda: FileSink(out_dir / "windows.jsonl"),
                      consumes={"window_counts": FileSink.key})
    return t
