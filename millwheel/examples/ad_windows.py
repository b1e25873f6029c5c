"""Zeitgeist over Photon's joined clicks (MillWheel paper §2): per advertiser, clicks per one-minute
window, and a spike/dip detector against a per-advertiser model kept in state.

    joined clicks ──► windows (key: advertiser) ──► window_counts ──┬─► window-sink  → <out>/windows.jsonl
                                                                     └─► spikes (key: advertiser)
                                                                            └─► anomaly-sink → <out>/anomalies.jsonl

The advertiser is the nested primary event's ``advertiser_id``; the window is by the click id's
timestamp. A watermark timer at each window's end closes it: once the input low watermark passes the
end, no click of that window can still arrive (unless late), and the window is produced once. A late
click for a window already produced is counted in the advertiser's ``late`` tally, not re-emitted.

Run: ``millwheel run examples.ad_windows --input <photon output root or joined dir> --out <dir>``.
"""
from __future__ import annotations

import math
from pathlib import Path

from millwheel import WEAK, Computation, FileSink, JoinedInjector, Record, Topology

WINDOW_US = 60_000_000
ALPHA = 0.2          # weight of the newest window in the model
THRESHOLD = 3.0      # standard deviations
MIN_CLICKS = 5       # below this nothing counts as a spike or dip
MAX_GAP_WINDOWS = 60  # empty windows counted as zeros at most this many at a time


def advertiser(record: Record) -> str:
    return str(record.value["query"]["advertiser_id"])


class ClickWindows(Computation):
    """State per advertiser: ``{"open": {window_start: clicks}, "emitted_through": start, "late": n}``."""

    def process_record(self, ctx, record: Record) -> None:
        start = record.timestamp_us - record.timestamp_us % WINDOW_US
        st = ctx.state or {"open": {}, "emitted_through": -1, "late": 0}
        if start <= st["emitted_through"]:
            st["late"] += 1
        else:
            st["open"][str(start)] = st["open"].get(str(start), 0) + 1
            ctx.set_timer(f"w{start}", start + WINDOW_US)
        ctx.state = st

    def process_timer(self, ctx, timer) -> None:
        start = timer.timestamp_us - WINDOW_US
        st = ctx.state
        clicks = st["open"].pop(str(start), 0)
        st["emitted_through"] = max(st["emitted_through"], start)
        ctx.state = st
        ctx.produce("window_counts", {"advertiser_id": ctx.key, "window_start_us": start, "clicks": clicks})


class SpikeDetector(Computation):
    """An exponentially weighted mean and variance of clicks per window per advertiser; a window more
    than ``THRESHOLD`` deviations away is a spike or a dip. Windows with no clicks count as zeros.

    It is deterministic, so it uses weak productions (paper §6.1.2): alerts go out before its state is
    persisted; after a crash it recomputes the same alerts with the same ids and the sink drops repeats.
    """
    productions = WEAK

    def process_record(self, ctx, record: Record) -> None:
        w = record.value
        m = ctx.state or {"mean": float(w["clicks"]), "var": 0.0, "last": w["window_start_us"], "n": 0}
        gap = min(MAX_GAP_WINDOWS, max(0, (w["window_start_us"] - m["last"]) // WINDOW_US - 1))
        for i in range(gap):
            self._observe(ctx, m, 0, m["last"] + (i + 1) * WINDOW_US)
        self._observe(ctx, m, w["clicks"], w["window_start_us"])
        m["last"] = max(m["last"], w["window_start_us"])
        ctx.state = m

    def _observe(self, ctx, m: dict, clicks: int, start: int) -> None:
        std = math.sqrt(m["var"])
        expected = m["mean"]
        if m["n"] >= 3 and max(clicks, expected) >= MIN_CLICKS and abs(clicks - expected) > THRESHOLD * std + 1:
            kind = "spike" if clicks > expected else "dip"
            ctx.produce("anomalies", {"advertiser_id": ctx.key, "window_start_us": start, "kind": kind,
                                      "clicks": clicks, "expected": round(expected, 2)})
        diff = clicks - m["mean"]
        m["mean"] += ALPHA * diff
        m["var"] = (1 - ALPHA) * (m["var"] + ALPHA * diff * diff)
        m["n"] += 1

    def process_timer(self, ctx, timer) -> None:
        pass


def build(input: str, out: str, echo: bool = True, windows: type[Computation] | None = None) -> Topology:
    """The topology the ``millwheel run`` command starts (``windows``: the per-minute counter, ClickWindows
    unless given)."""
    out_dir = Path(out)
    t = Topology()
    t.add_injector("joined", lambda: JoinedInjector(input, quarantine_dir=out_dir / ".quarantine"),
                   produces="clicks")
    t.add_computation("windows", windows or ClickWindows, consumes={"clicks": advertiser},
                      produces=["window_counts"])
    t.add_computation("window-sink", lambda: FileSink(out_dir / "windows.jsonl", echo=echo),
                      consumes={"window_counts": FileSink.key})
    t.add_computation("spikes", SpikeDetector, consumes={"window_counts": lambda r: r.value["advertiser_id"]},
                      produces=["anomalies"])
    t.add_computation("anomaly-sink", lambda: FileSink(out_dir / "anomalies.jsonl", echo=False),
                      consumes={"anomalies": FileSink.key})
    return t
