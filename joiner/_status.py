"""The joiners' status files: ``<state_dir>/joiners/<name>.json``, the latest :class:`JoinerStatistics` of each
joiner of a region (plus ``pid`` and ``written_at_us``), rewritten atomically about once a second and at
a clean stop, so ``photon status`` can show counters of running and finished joiners alike."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import orjson

from photon import write_atomic

STATUS_INTERVAL_S = 1.0


def status_path(state_dir: str | Path, name: str) -> Path:
    return Path(state_dir) / "joiners" / f"{name}.json"


def write_status(path: Path, stats, now_us: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, orjson.dumps({**dataclasses.asdict(stats), "pid": os.getpid(), "written_at_us": now_us}))


def read_status(state_dir: str | Path) -> dict[str, dict]:
    """Every joiner's latest status in a region's state folder, by joiner name (empty if none yet)."""
    out = {}
    for p in sorted((Path(state_dir) / "joiners").glob("*.json")):
        try:
            out[p.stem] = orjson.loads(p.read_bytes())
        except (FileNotFoundError, orjson.JSONDecodeError):
            continue
    return out
