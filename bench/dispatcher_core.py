"""The dispatcher's core alone, per click: ``python -m bench.dispatcher_core [--queries N | --gen DIR] [--runs 3] [--json]``.

The workload is ``bench.compare``'s (``photon gen``, one region, ``--queries`` queries, about 0.15 clicks per
query), generated into a temporary folder, or an existing ``photon gen`` output (``--gen``: its ``photon.toml``
and ``logs/``; ``bench.compare --keep`` leaves one in ``<work>/gen``). The click lines are fed to a
:class:`dispatcher._state.DispatcherState` in chunks as its read-ahead asks; every registry lookup is answered
"absent" at once and every joiner request JOINED after a simulated 300 ms (so clicks cross checkpoints, as in a
backlog); every checkpoint is serialized with orjson as the shell writes it. Printed: CPU
(``time.process_time``) per click, best of ``--runs``, first with CPython's default collector, then after
``photon.settle_gc()`` (what the dispatcher's process does once serving); and checkpoint bytes per click.
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
from photon import load_config, settle_gc

CHUNK_LINES = 4000
JOIN_AFTER_US = 300_000
STEP_US = 10_000


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


def run_once(config, chunks: list[ChunkRead]) -> tuple[float, int, int]:
    """(CPU seconds, clicks joined, checkpoint bytes) of one pass over ``chunks``."""
    core = DispatcherState(config.join, config.dispatcher, lookups=True, jitter=None)
    now, pending, next_chunk, checkpoint_bytes = 1_000_000_000, [], 0, 0
    started = time.process_time()
    while True:
        now += STEP_US
        events = []
        while pending and pending[0][0] <= now:
            _, batch_id, n = pending.pop(0)
            events.append(JoinAnswered(batch_id, [0] * n, now))
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
                    pending.append((now + JOIN_AFTER_US, c.batch_id, len(c.ids)))
                elif type(c) is Checkpoint:
                    checkpoint_bytes += len(orjson.dumps(c.snapshot) if c.snapshot is not None
                                            else encode_delta(c.delta))
            commands = more
        if next_chunk >= len(chunks) and not pending and not core.statistics().queued:
            return time.process_time() - started, core.statistics().joined, checkpoint_bytes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=1_000_000)
    ap.add_argument("--gen", type=Path, help="an existing photon gen output instead of a new workload")
    ap.add_argument("--runs", type=int, default=3)
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
        figures: dict = {"click_lines": clicks}
        for gc_mode in ("default", "settle"):
            if gc_mode == "settle":
                settle_gc()
            cpu, joined, nbytes = min(run_once(config, chunks) for _ in range(args.runs))
            figures[f"gc_{gc_mode}_cpu_us_per_click"] = round(cpu / clicks * 1e6, 2)
            figures[f"gc_{gc_mode}_clicks_per_s"] = round(clicks / cpu)
            figures["joined"] = joined
            figures["checkpoint_bytes_per_click"] = round(nbytes / clicks)
        emit(figures, args.json, f"Dispatcher core, best of {args.runs} runs per collector setting")
        return 0
    finally:
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
