"""A topology with a cycle in the one-process runtime: every click goes round ping → pong → ping a
bounded number of times; pong counts its clicks per window on the cycle (a watermark timer at each
window's end) and a downstream computation counts the clicks leaving the cycle per window. Both window
outputs equal the batch truth, each window once, and no record in the cycle is ever late (a watermark
that passed work in flight would flag it)."""
from __future__ import annotations

import random
import threading
from collections import Counter

import orjson
import pytest

from millwheel import (END_OF_TIME, WEAK, Computation, FileSink, ListInjector, LocalTransport, Runtime,
                       RuntimeConfig, Topology)
from photon import wait_until

HOPS = 3
WINDOW_US = 1_000


def window_of(ts: int) -> int:
    return ts - ts % WINDOW_US


class Ping(Computation):
    """Sends a click round the cycle until it has made ``HOPS`` trips, then lets it out."""

    def process_record(self, ctx, record):
        value = record.value
        if value["hops"] < HOPS:
            ctx.produce("ping_out", {**value, "hops": value["hops"] + 1}, record.timestamp_us)
        else:
            ctx.produce("done", value, record.timestamp_us)

    def process_timer(self, ctx, timer):
        pass


class Pong(Computation):
    """Sends every record back to ping; counts each click once (on its first trip) per window, and
    reports a window at its end (a watermark timer on the cycle)."""

    def process_record(self, ctx, record):
        if record.value["hops"] == 1:
            start = window_of(record.timestamp_us)
            st = ctx.state or {}
            st[str(start)] = st.get(str(start), 0) + 1
            ctx.state = st
            ctx.set_timer(f"w{start}", start + WINDOW_US)
        ctx.produce("pong_out", record.value, record.timestamp_us)

    def process_timer(self, ctx, timer):
        st = ctx.state
        start = timer.timestamp_us - WINDOW_US
        ctx.produce("pong_windows", {"key": ctx.key, "window": start, "n": st.pop(str(start))})
        ctx.state = st or None


class Windows(Computation):
    """Counts the clicks leaving the cycle per key and window; emits each window at its end."""

    def process_record(self, ctx, record):
        start = window_of(record.timestamp_us)
        st = ctx.state or {}
        st[str(start)] = st.get(str(start), 0) + 1
        ctx.state = st
        ctx.set_timer(f"w{start}", start + WINDOW_US)

    def process_timer(self, ctx, timer):
        st = ctx.state
        start = timer.timestamp_us - WINDOW_US
        ctx.produce("windows", {"key": ctx.key, "window": start, "n": st.pop(str(start))})
        ctx.state = st or None


class Bounce(Computation):
    """A cycle of one: re-injects each click into itself ``HOPS`` times, then lets it out; counts its
    clicks per window on their first pass and reports each window at its end (a timer on the cycle)."""

    def process_record(self, ctx, record):
        value = record.value
        if value["hops"] == 0:
            start = window_of(record.timestamp_us)
            st = ctx.state or {}
            st[str(start)] = st.get(str(start), 0) + 1
            ctx.state = st
            ctx.set_timer(f"w{start}", start + WINDOW_US)
        if value["hops"] < HOPS:
            ctx.produce("again", {**value, "hops": value["hops"] + 1}, record.timestamp_us)
        else:
            ctx.produce("done", value, record.timestamp_us)

    def process_timer(self, ctx, timer):
        st = ctx.state
        start = timer.timestamp_us - WINDOW_US
        ctx.produce("bounce_windows", {"key": ctx.key, "window": start, "n": st.pop(str(start))})
        ctx.state = st or None


class LossyTransport(LocalTransport):
    """Loses a fifth of the deliveries and sends a tenth twice (seeded): senders retry, receivers dedup."""
    may_lose = True

    def __init__(self, seed: int = 11) -> None:
        self.rng = random.Random(seed)
        self.lock = threading.Lock()

    def send(self, deliveries):
        kept = []
        with self.lock:
            for d in deliveries:
                r = self.rng.random()
                if r < 0.2:
                    continue
                kept.append(d)
                if r > 0.9:
                    kept.append(d)
        super().send(kept)


def clicks(n: int, keys: int = 5) -> list:
    rng = random.Random(3)
    out, ts = [], 1_000_000
    for i in range(n):
        ts += rng.randrange(0, 40)
        out.append((f"k{i % keys}", {"i": i, "hops": 0}, ts))
    return out


class WeakPing(Ping):
    productions = WEAK


class WeakPong(Pong):
    productions = WEAK


def cycle_topology(records, out, weak: bool = False) -> Topology:
    t = Topology()
    t.add_injector("clicks", ListInjector(records), produces="clicks")
    t.add_computation("ping", WeakPing if weak else Ping, consumes=["clicks", "pong_out"],
                      produces=["ping_out", "done"])
    t.add_computation("pong", WeakPong if weak else Pong, consumes=["ping_out"], produces=["pong_out", "pong_windows"])
    t.add_computation("windows", Windows, consumes=["done"], produces=["windows"])
    t.add_computation("windows_sink", FileSink(out / "windows.jsonl"), consumes={"windows": FileSink.key})
    t.add_computation("pong_sink", FileSink(out / "pong_windows.jsonl"),
                      consumes={"pong_windows": FileSink.key})
    return t


def read_counts(path) -> dict:
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []
    keys = Counter((r["key"], r["window"]) for r in rows)
    assert [k for k, n in keys.items() if n > 1] == [], "a window was written more than once"
    return {(r["key"], r["window"]): r["n"] for r in rows}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport,weak", [("local", False), ("lossy", False), ("local", True)])
def test_windows_on_and_after_a_cycle_close_with_the_batch_truth(tmp_path, transport, weak):
    """Strong productions over a lossless and a lossy transport; weak productions (sent before their
    checkpoint, so held by their sender from the moment they are sent)."""
    records = clicks(1500)
    truth = dict(Counter((k, window_of(ts)) for k, _, ts in records))
    config = RuntimeConfig(store=f"sqlite:///{tmp_path / 'state.db'}", threads=2, intervals=8,
                           retry_delay_us=50_000)
    rt = Runtime(cycle_topology(records, tmp_path, weak), config,
                 transport=LossyTransport() if transport == "lossy" else None)
    with rt:
        rt.run_until_idle(timeout_s=90)
        assert read_counts(tmp_path / "windows.jsonl") == truth
        assert read_counts(tmp_path / "pong_windows.jsonl") == truth
        # idle means nothing is left to do (no timer can become due); the cycle's watermark may still
        # take an epoch or two to reach the end of its input
        wait_until(lambda: rt.statistics().computations["windows"].input_watermark_us == END_OF_TIME, 30,
                   message="the watermark through the cycle at the end of the input")
        stats = rt.statistics()
        auth = rt.authority.statistics()
    comps = stats.computations
    assert comps["ping"].records_processed == len(records) * (HOPS + 1)
    assert comps["pong"].records_processed == len(records) * HOPS
    assert all(c.late_records == 0 for c in comps.values()), {n: c.late_records for n, c in comps.items()}
    assert comps["ping"].low_watermark_us == comps["pong"].low_watermark_us == END_OF_TIME
    assert comps["windows"].input_watermark_us == END_OF_TIME
    assert auth.cycles == 1 and auth.cuts_published >= 2


@pytest.mark.timeout(120)
def test_a_computation_feeding_itself_closes_its_windows_and_those_after_it(tmp_path):
    records = clicks(800)
    truth = dict(Counter((k, window_of(ts)) for k, _, ts in records))
    t = Topology()
    t.add_injector("clicks", ListInjector(records), produces="clicks")
    t.add_computation("bounce", Bounce, consumes=["clicks", "again"],
                      produces=["again", "done", "bounce_windows"])
    t.add_computation("windows", Windows, consumes=["done"], produces=["windows"])
    t.add_computation("windows_sink", FileSink(tmp_path / "windows.jsonl"), consumes={"windows": FileSink.key})
    t.add_computation("bounce_sink", FileSink(tmp_path / "bounce.jsonl"),
                      consumes={"bounce_windows": FileSink.key})
    config = RuntimeConfig(store=f"sqlite:///{tmp_path / 'state.db'}", threads=2, intervals=4)
    with Runtime(t, config) as rt:
        rt.run_until_idle(timeout_s=90)
        assert read_counts(tmp_path / "windows.jsonl") == truth
        assert read_counts(tmp_path / "bounce.jsonl") == truth
        wait_until(lambda: rt.statistics().computations["windows"].input_watermark_us == END_OF_TIME, 30,
                   message="the watermark through the cycle at the end of the input")
        stats = rt.statistics()
    assert stats.computations["bounce"].records_processed == len(records) * (HOPS + 1)
    assert all(c.late_records == 0 for c in stats.computations.values())
    assert stats.computations["windows"].input_watermark_us == END_OF_TIME
