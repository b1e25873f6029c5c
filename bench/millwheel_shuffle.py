"""The two-stage shuffle the process benchmark runs (the paper's bucket-and-sort, §8): numbers are
injected at a steady rate (or as fast as they go), ``bucket`` (keyed by the number) counts each one and
re-keys it to its bucket, ``sort`` (keyed by the bucket) keeps each bucket's count and range and notes each
record's delay: its arrival time less its injection time (one machine, one wall clock).

``build(input, out)`` is what ``millwheel worker`` calls in every worker process. ``input`` is a JSON file:
``{"total": N, "rate": R (0: as fast as it goes), "guarantees": true|false}``, optionally with
``"go": PATH, "warmup_rate": W``: until the file ``PATH`` exists the injector sends warm-up records at W
records/s (marked, not measured: they let the master spread the intervals over the workers, as in a
running system), then the N measured ones. Guarantees on means exactly-once and strong productions on both
stages, off means neither (weak productions, no dedup). Each process appends ``(number, injected_us,
arrived_us)`` triples of int64 of the measured records to ``<out>/delays-<pid>.bin`` within ``FLUSH_S`` of
noting them (and at exit): the samples of every record processed are on disk while the cluster is still idle,
so a worker that ends without running its exit handlers (killed after its stop's timeout) loses none. The
measured numbers are distinct, so :func:`read_delays` counts each record once and tells the duplicates.
"""
from __future__ import annotations

import atexit
import json
import os
import threading
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path

from millwheel import STRONG, WEAK, Computation, Injector, Poll, Topology

BUCKETS = 100
FLUSH_S = 0.1
"""How soon a noted sample is on disk: well within the cluster's idle settle (two looks 0.3 s apart)."""


class RateInjector(Injector):
    """``rate`` numbers per second (or as fast as polled when rate is 0) until ``total`` are out; each is
    timestamped at injection, so its watermark estimate is the current time. With ``go``: first warm-up
    numbers (``{"w": 1}`` in the value) at ``warmup_rate`` until the file ``go`` exists."""

    def __init__(self, rate: int, total: int, go: str | None = None, warmup_rate: int = 1000) -> None:
        self.rate, self.total, self.go, self.warmup_rate = rate, total, go, warmup_rate
        self.sent = self.warm = 0
        self.started_us: int | None = None
        self.warm_started_us: int | None = None

    def restore(self, position) -> None:
        if isinstance(position, list):
            self.warm, self.sent = int(position[0]), int(position[1])
        else:
            self.sent = int(position or 0)
        if self.sent:
            self.go = None          # measuring had begun

    def poll(self, max_records: int, now_us: int) -> Poll:
        if self.go is not None:
            if not os.path.exists(self.go):
                return self._warm_up(max_records, now_us)
            self.go = None
        if self.started_us is None:
            self.started_us = now_us
        due = self.total if not self.rate else min(self.total, (now_us - self.started_us) * self.rate // 1_000_000)
        n = max(0, min(max_records, due - self.sent))
        records = [(str(i * 7919 % 1_000_003), {"n": i * 7919 % 1_000_003}, now_us)
                   for i in range(self.sent, self.sent + n)]
        self.sent += n
        return Poll(records, [self.warm, self.sent], now_us, self.sent >= self.total)

    def _warm_up(self, max_records: int, now_us: int) -> Poll:
        if self.warm_started_us is None:
            self.warm_started_us = now_us
        due = (now_us - self.warm_started_us) * self.warmup_rate // 1_000_000
        n = max(0, min(max_records, due - self.warm))
        base = 500_000 + self.warm       # other numbers than the measured ones' (keys seen once, as theirs)
        records = [(str((base + i) * 7919 % 1_000_003), {"n": (base + i) * 7919 % 1_000_003, "w": 1}, now_us)
                   for i in range(n)]
        self.warm += n
        return Poll(records, [self.warm, self.sent], now_us, False)


class _Delays:
    """This process's delay samples, appended to its file by a flusher thread every ``FLUSH_S`` and at
    exit (a process stopped by SIGKILL runs no exit handler: only what the flusher wrote survives it)."""

    def __init__(self) -> None:
        self.path: Path | None = None
        self.buf = array("q")
        self.lock = threading.Lock()
        self._flusher: threading.Thread | None = None
        self._stop = threading.Event()
        atexit.register(self.close)

    def note(self, number: int, injected_us: int) -> None:
        with self.lock:
            self.buf.extend((number, injected_us, time.time_ns() // 1000))
            if self._flusher is None:
                self._flusher = threading.Thread(target=self._flush_often, name="delays-flusher", daemon=True)
                self._flusher.start()

    def _flush_often(self) -> None:
        while not self._stop.wait(FLUSH_S):
            self.flush()

    def flush(self) -> None:
        with self.lock:
            buf, self.buf = self.buf, array("q")
            if buf and self.path is not None:
                with open(self.path, "ab") as f:
                    buf.tofile(f)

    def close(self) -> None:
        self._stop.set()
        self.flush()


DELAYS = _Delays()


class Bucket(Computation):
    def process_record(self, ctx, record):
        ctx.state = (ctx.state or 0) + 1
        ctx.produce("buckets", record.value, key=str(record.value["n"] % BUCKETS))

    def process_timer(self, ctx, timer):
        pass


class Sort(Computation):
    def process_record(self, ctx, record):
        n = record.value["n"]
        st = ctx.state or {"count": 0, "lo": n, "hi": n}
        ctx.state = {"count": st["count"] + 1, "lo": min(st["lo"], n), "hi": max(st["hi"], n)}
        if "w" not in record.value:
            DELAYS.note(n, record.timestamp_us)

    def process_timer(self, ctx, timer):
        pass


def _with(cls: type, guarantees: bool) -> type:
    return type(cls.__name__, (cls,), {"exactly_once": guarantees, "productions": STRONG if guarantees else WEAK})


def build(input: str, out: str) -> Topology:
    spec = json.loads(Path(input).read_text())
    DELAYS.path = Path(out) / f"delays-{os.getpid()}.bin"
    g = bool(spec["guarantees"])
    t = Topology()
    t.add_injector("numbers", lambda: RateInjector(int(spec["rate"]), int(spec["total"]), spec.get("go"),
                                                   int(spec.get("warmup_rate", 1000))), produces="numbers")
    t.add_computation("bucket", _with(Bucket, g), consumes=["numbers"], produces=["buckets"])
    t.add_computation("sort", _with(Sort, g), consumes=["buckets"])
    return t


@dataclass
class Delays:
    """The delay samples under an output folder: one ``(injected_us, arrived_us)`` pair per measured record
    (its first sample), and how many samples were of a record already sampled (processed twice)."""
    pairs: list[tuple[int, int]] = field(default_factory=list)
    duplicates: int = 0


def read_delays(out: Path) -> Delays:
    """Every measured record's ``(injected_us, arrived_us)`` the processes wrote under ``out``."""
    first: dict[int, tuple[int, int]] = {}
    duplicates = 0
    for f in sorted(Path(out).glob("delays-*.bin")):
        a = array("q")
        raw = f.read_bytes()
        a.frombytes(raw[:len(raw) - len(raw) % (3 * a.itemsize)])   # a write cut short by a kill: whole triples
        for n, injected, arrived in zip(a[0::3], a[1::3], a[2::3]):
            if n in first:
                duplicates += 1
                first[n] = min(first[n], (injected, arrived), key=lambda p: p[1])
            else:
                first[n] = (injected, arrived)
    return Delays(list(first.values()), duplicates)
