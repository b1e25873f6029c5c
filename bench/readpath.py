"""``python -m bench.readpath DIR [--id-field F] [--rounds N] [--json]``: the primary reader's path alone.

The event store's own tailer (``LocalFiles(DIR).tailer``, as a cache server reads its primary logs) polls every
file under ``DIR`` from byte 0 (16 MB a poll) and ``index_lines`` indexes each chunk, in this process, with no
cache, map or server around them: thread CPU per line of the polls, of the indexing, and of its two largest
steps (``StringFields``' checks, ``_flagged``, and the one-writer pass, ``_one_writer``), each timed by a
wrapper, best of ``--rounds``. ``DIR`` is typically a ``bench.compare`` run's ``gen/logs/<region>/queries``
(its page cache warm after the first round). CPU is per line, so runs on a shared host compare when
alternated.
"""
from __future__ import annotations

import argparse
import time

from bench._common import emit

import eventstore._state as state
import photon._bulk as bulk
from eventstore._source import LocalFiles


def _timed(module, name: str, spent: dict) -> None:
    fn = getattr(module, name)

    def wrapper(*args, **kwargs):
        start = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name] += time.thread_time() - start

    setattr(module, name, wrapper)


def one_round(root: str, id_field: str, spent: dict) -> dict:
    for key in spent:
        spent[key] = 0.0
    tailer = LocalFiles(root).tailer(None, None)
    lines = 0
    while True:
        start = time.thread_time()
        chunks = tailer.poll(16 << 20)
        spent["poll"] += time.thread_time() - start
        if not chunks:
            break
        for chunk in chunks:
            start = time.thread_time()
            state.index_lines(chunk, id_field, [])
            spent["index_lines"] += time.thread_time() - start
            lines += len(chunk.lines)
    return {f"{key}_ns_per_line": round(value / max(1, lines) * 1e9, 1) for key, value in spent.items()} | \
        {"lines": lines}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir", help="a folder of primary log files (JSON lines)")
    p.add_argument("--id-field", default="query_id")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    spent = {"poll": 0.0, "index_lines": 0.0, "_flagged": 0.0, "_one_writer": 0.0}
    _timed(bulk, "_flagged", spent)
    _timed(state, "_one_writer", spent)
    rounds = [one_round(args.dir, args.id_field, spent) for _ in range(max(1, args.rounds))]
    best = {key: min(r[key] for r in rounds) for key in rounds[0]}
    emit(best, args.json, f"The primary reader's path over {args.dir} (best of {len(rounds)} rounds)")


if __name__ == "__main__":
    main()
