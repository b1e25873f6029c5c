"""``python -m bench.tailer [--queries N | --logs DIR] [--runs R] [--baseline CHECKOUT] [--json]``: CPU per line of
:class:`photon.LogTailer`.

Generates a primary stream of ``--queries`` query lines (``photon gen``'s shape, as ``bench.compare`` does) or uses
the stream folder ``--logs``, then measures, as CPU time (``time.process_time``) per line, the best of ``--runs``:

* ``poll``: a fresh tailer reading the whole stream from byte 0, ``poll(8 MiB)`` until caught up (files read
  from the page cache), as the event store's reader does;
* ``lines``: the splitting alone (the tailer's ``_lines``) over the stream's bytes held in memory, cut into
  ``--chunk``-byte pieces at arbitrary places (so most pieces end in a partial line);
* ``poll_lines_per_s``: lines per CPU second of ``poll``.

``--baseline`` names another checkout of the project; its ``photon/_tail.py``, ``_logs.py`` and ``_source.py`` are loaded
beside this one and measured in the same process, runs alternated, so the two are compared under the same load.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path

from bench._common import emit

import photon
from photon import LogTailer, open_source

POLL_BYTES = 8 << 20


def load_baseline(checkout: Path):
    """The ``LogTailer`` of another checkout (its module loaded by path), with that checkout's ``line_offsets``, and
    a maker of that checkout's local source."""
    mods = {}
    for name in ("_logs", "_source", "_tail"):
        spec = importlib.util.spec_from_file_location(f"baseline{name}", checkout / "photon" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        mods[name] = mod
    mods["_tail"].line_offsets = mods["_logs"].line_offsets
    return mods["_tail"].LogTailer, mods["_source"].LocalSource


def poll_all(tailer, source) -> int:
    t = tailer(source)
    lines = 0
    while True:
        chunks = t.poll(POLL_BYTES)
        lines += sum(len(c.lines) for c in chunks)
        if not chunks and t.caught_up:
            return lines


def split_all(tailer, pieces: list[tuple[str, bytes]]) -> int:
    """The tailer's splitting step alone (its ``_lines``, what a poll does with the bytes it read)."""
    t = tailer(tempfile.gettempdir())
    lines = 0
    for name, data in pieces:
        start = t.offsets.get(name, 0)
        chunk = t._lines(name, start, data)
        if chunk is not None:
            lines += len(chunk.lines)
    return lines


def pieces_of(stream: Path, chunk: int) -> list[tuple[str, bytes]]:
    """Each file's bytes as a reader sees them: from its read offset, ``chunk`` bytes at a time."""
    out = []
    for f in sorted(stream.rglob("*.jsonl")):
        data = f.read_bytes()
        pos = 0
        while pos < len(data):
            piece = data[pos:pos + chunk]
            cut = piece.rfind(b"\n") + 1
            out.append((str(f), piece))
            pos += cut or len(piece)
    return out


def best_of(fn, runs: int) -> tuple[float, int]:
    best, lines = float("inf"), 0
    for _ in range(runs):
        t0 = time.process_time()
        lines = fn()
        best = min(best, time.process_time() - t0)
    return best, lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.tailer")
    ap.add_argument("--queries", type=int, default=1_000_000)
    ap.add_argument("--logs", type=Path, help="a stream folder to read instead of a generated one")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--chunk", type=int, default=4 << 20, help="bytes per piece of the splitting alone")
    ap.add_argument("--baseline", type=Path, help="another checkout to measure beside this one")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-tailer-") as tmp:
        stream = args.logs
        if stream is None:
            from photon.app import GenOptions, generate
            generate(GenOptions(out=tmp, queries=args.queries, clicks_per_query=0.0, regions=("a",)))
            stream = Path(tmp) / "logs" / "a" / "queries"
        trees = {"this": (LogTailer, open_source)}
        if args.baseline is not None:
            trees["baseline"] = load_baseline(args.baseline)
        pieces = pieces_of(stream, args.chunk)
        figures: dict = {"stream": str(stream), "bytes": sum(f.stat().st_size for f in stream.rglob("*.jsonl")),
                         "photon": os.path.dirname(photon.__file__)}
        results: dict = {k: {"poll": float("inf"), "lines": float("inf")} for k in trees}
        n = 0
        for _ in range(args.runs):              # trees alternated, each run the best of one
            for key, (tailer, source) in trees.items():
                s, n = best_of(lambda: poll_all(tailer, source(str(stream))), 1)
                results[key]["poll"] = min(results[key]["poll"], s)
                s, m = best_of(lambda: split_all(tailer, pieces), 1)
                results[key]["lines"] = min(results[key]["lines"], s)
                if m != n:
                    raise SystemExit(f"{key}: the splitting alone found {m} lines, the tailer {n}")
        figures["input_lines"] = n
        for key, r in results.items():
            figures[f"{key}_poll_ns_per_line"] = round(r["poll"] / n * 1e9, 1)
            figures[f"{key}_lines_ns_per_line"] = round(r["lines"] / n * 1e9, 1)
            figures[f"{key}_poll_lines_per_s"] = round(n / r["poll"]) if r["poll"] > 0 else 0
        figures["load_average"] = round(os.getloadavg()[0], 1)
        emit(figures, args.json, f"LogTailer, best of {args.runs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
