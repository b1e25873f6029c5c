"""The dispatcher's core alone, per click: ``python -m bench.dispatcher_core [--queries N | --gen DIR] [--runs 3] [--json]``.

The workload is ``bench.compare``'s (``photon gen``, one region, ``--queries`` queries, about 0.15 clicks per
query), generated into a temporary folder, or an existing ``photon gen`` output (``--gen``: its ``photon.toml``
and ``logs/``; ``bench.compare --keep`` leaves one in ``<work>/gen``). The click lines are fed to a
:class:`dispatcher._state.DispatcherState` in chunks as its read-ahead asks; every registry lookup is answered
"absent" at once and every joiner request JOINED after a simulated 300 ms (so clicks cross checkpoints, as in a
backlog); every checkpoint is serialized with orjson as the shell writes it. Printed: CPU
(``time.process_time``) per click, best of ``--runs``, first with CPython's default collector, then after
``photon.settle_gc()`` (what the dispatcher's process does once serving); and checkpoint bytes per click.

``--store-behind S``: the joiners' event store is still reading its backlog, as at a cold start of
``bench.compare``: it reads the queries in time order, through the clicks' whole query time span in ``S``
simulated seconds; every answer until then says ``store_behind`` with the store's position, and a click whose
query's time is past it comes back THROTTLED. So the core holds clicks back for the store and releases them
(``held_for_store_per_click`` printed), which the default run never does.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import orjson

from bench._common import emit
from dispatcher import (Checkpoint, ChunkRead, DispatcherState, JoinAnswered, LinesRead, Lookup, LookupAnswered,
                        SendBatch, TimePassed, encode_delta)
from photon import ID_TIME_DIGITS, TIMESTAMP_DIGITS, Outcome, load_config, settle_gc

CHUNK_LINES = 4000
JOIN_AFTER_US = 300_000
STEP_US = 10_000
_THROTTLED_OR_JOINED = (Outcome.THROTTLED, Outcome.JOINED)


def read_chunks(root: Path) -> list[ChunkRead]:
    chunks = []
    for f in sorted(root.glob("logs/*/clicks/**/*.jsonl")):
        lines = f.read_bytes().split(b"\n")[:-1]
        offsets, at = [], 0
        for line in lines:
            offsets.append(at)
            at += len(line) + 1
        for i in range(0, len(lines), CHUNK_LINES):
            end = offsets[i + CHUNK_LINES] if i + CHUNK_LINES < len(lines) else at
            chunks.append(ChunkRead(str(f), offsets[i:i + CHUNK_LINES], lines[i:i + CHUNK_LINES], end))
    return chunks


def query_span_us(chunks: list[ChunkRead], ref_field: str) -> tuple[int, int]:
    """The earliest and latest query time (from the ref ids) of the click lines in ``chunks``."""
    times = []
    for c in chunks:
        for line in c.lines:
            try:
                ref = orjson.loads(line).get(ref_field)
            except (orjson.JSONDecodeError, AttributeError):
                continue
            digits = ID_TIME_DIGITS(ref) if type(ref) is str else ""
            if digits.isdigit():
                times.append(int(digits))
    return min(times), max(times)


class _BehindStore:
    """The event store's position while it reads its backlog: the query span read linearly in ``read_us``."""

    def __init__(self, span: tuple[int, int], start_us: int, read_us: int) -> None:
        self.first, self.last = span
        self.start_us, self.read_us = start_us, read_us

    def position(self, now: int) -> int:
        return self.first + (self.last - self.first) * (now - self.start_us) // self.read_us

    def answer(self, batch_id: int, refs: list[str], now: int) -> JoinAnswered:
        at = self.position(now)
        if at >= self.last:
            return JoinAnswered(batch_id, [Outcome.JOINED] * len(refs), now)
        read = f"{at:0{TIMESTAMP_DIGITS}d}".__ge__     # (the ids' time digits: text order is time order)
        outcomes = list(map(_THROTTLED_OR_JOINED.__getitem__, map(read, map(ID_TIME_DIGITS, refs))))
        return JoinAnswered(batch_id, outcomes, now, True, {}, at)


def run_once(config, chunks: list[ChunkRead], behind_s: float = 0.0,
             span: tuple[int, int] | None = None) -> tuple[float, int, int, int]:
    """(CPU seconds, clicks joined, checkpoint bytes, clicks held for the store) of one pass over ``chunks``;
    with ``behind_s``, the store reads the queries of ``span`` in that many simulated seconds."""
    core = DispatcherState(config.join, config.dispatcher, lookups=True, jitter=None)
    now, pending, next_chunk, checkpoint_bytes = 1_000_000_000, [], 0, 0
    store = _BehindStore(span, now, int(behind_s * 1e6)) if behind_s else None
    started = time.process_time()
    while True:
        now += STEP_US
        events = []
        while pending and pending[0][0] <= now:
            _, batch_id, refs = pending.pop(0)
            events.append(JoinAnswered(batch_id, [Outcome.JOINED] * len(refs), now) if store is None
                          else store.answer(batch_id, refs, now))
        taken: list = []
        wanted = core.lines_wanted()
        while wanted > 0 and next_chunk < len(chunks):
            taken.append(chunks[next_chunk])
            wanted -= len(chunks[next_chunk].lines)
            next_chunk += 1
        events += [LinesRead(taken, now), TimePassed(now)]
        commands = core.handle(*events)
        while commands:
            more = []
            for c in commands:
                if type(c) is Lookup:
                    more += core.handle(LookupAnswered(c.batch_id, [False] * len(c.ids), now))
                elif type(c) is SendBatch:
                    pending.append((now + JOIN_AFTER_US, c.batch_id, c.ref_ids))
                elif type(c) is Checkpoint:
                    checkpoint_bytes += len(orjson.dumps(c.snapshot) if c.snapshot is not None
                                            else encode_delta(c.delta))
            commands = more
        if next_chunk >= len(chunks) and not pending and core.caught_up:
            cpu = time.process_time() - started
            stats = core.statistics()
            return cpu, stats.joined, checkpoint_bytes, stats.held_for_store


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=1_000_000)
    ap.add_argument("--gen", type=Path, help="an existing photon gen output instead of a new workload")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--store-behind", type=float, default=0.0, metavar="S",
                    help="the event store reads the clicks' query span in S simulated seconds (0: caught up)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    temp = Path(tempfile.mkdtemp(prefix="photon-core-")) if args.gen is None else None
    try:
        if temp is not None:
            from bench.compare import generate_workload
            args.gen = temp / "gen"
            generate_workload(args.gen, args.queries)
        config = load_config(args.gen / "photon.toml")
        chunks = read_chunks(args.gen)
        clicks = sum(len(c.lines) for c in chunks)
        if not clicks:
            print(f"no click logs under {args.gen}/logs", file=sys.stderr)
            return 2
        figures: dict = {"click_lines": clicks, "store_behind_s": args.store_behind}
        span = query_span_us(chunks, config.join.foreign_ref_field) if args.store_behind else None
        for gc_mode in ("default", "settle"):
            if gc_mode == "settle":
                settle_gc()
            cpu, joined, nbytes, held = min(run_once(config, chunks, args.store_behind, span)
                                            for _ in range(args.runs))
            figures[f"gc_{gc_mode}_cpu_us_per_click"] = round(cpu / clicks * 1e6, 2)
            figures[f"gc_{gc_mode}_clicks_per_s"] = round(clicks / cpu)
            figures["joined"] = joined
            figures["checkpoint_bytes_per_click"] = round(nbytes / clicks)
            figures["held_for_store_per_click"] = round(held / clicks, 3)
        emit(figures, args.json, f"Dispatcher core, best of {args.runs} runs per collector setting")
        return 0
    finally:
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
