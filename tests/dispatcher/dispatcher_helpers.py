"""Small builders for dispatcher tests: a region config under a tmp folder and click/query lines."""
from __future__ import annotations

import time
from pathlib import Path

import orjson

from photon import format_event_id, load_config, read_output_lines

START = time.time_ns() // 1000 - 600_000_000  # recent: the registry refuses ids older than its GC horizon


def click_id(n: int, writer: int = 1) -> str:
    return format_event_id("10.0.0.1", writer, START + n)


def query_id(n: int) -> str:
    return format_event_id("10.0.0.2", 9, START - 1_000_000 + n)


def click_line(n: int, q: int | None = None, writer: int = 1) -> bytes:
    return orjson.dumps({"click_id": click_id(n, writer), "query_id": query_id(n if q is None else q),
                         "ad": f"ad-{n % 7}", "cost_micros": 1000 + n})


def query_line(n: int) -> bytes:
    return orjson.dumps({"query_id": query_id(n), "text": f"query {n}"})


def write_config(root: Path, *, unjoinable_after_s: float = 60.0, extra: str = "") -> Path:
    """A photon.toml with one region ``r1`` under ``root`` (logs/, out/, state/)."""
    for d in ("logs/clicks", "logs/queries", "out", "state"):
        (root / d).mkdir(parents=True, exist_ok=True)
    path = root / "photon.toml"
    path.write_text(f"""
[join]
unjoinable_after_s = {unjoinable_after_s}

[dispatcher]
batch_size = 50
backlog_batch_size = 50
max_in_flight = 4
retry_initial_s = 0.02
retry_max_s = 0.2
min_attempts = 3
checkpoint_interval_s = 0.05
poll_interval_s = 0.01
{extra}

[[regions]]
name = "r1"
log_root = "logs"
output_root = "out"
state_dir = "state"
""")
    return path


def config(root: Path, **kw):
    return load_config(write_config(root, **kw))


def append(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as f:
        f.write(data)


def append_lines(path: Path, lines: list[bytes]) -> None:
    append(path, b"".join(ln + b"\n" for ln in lines))


def read_jsonl_dir(directory: Path) -> list[dict]:
    """Every committed line of an output folder (joined/, unjoinable/: partitioned, see the output contract)
    or of the quarantine folder."""
    return [orjson.loads(ln) for ln in read_output_lines(directory)] if directory.is_dir() else []
