"""Helpers of the event store tests: query ids and lines."""
from __future__ import annotations

import orjson
from photon import format_event_id


def query_id(n: int) -> str:
    return format_event_id("10.0.0.1", 4242, 1_763_712_000_000_000 + n)


def query_line(n: int, **extra) -> bytes:
    return orjson.dumps({"query_id": query_id(n), "q": f"shoes {n:06d}", **extra})


def query_lines_by_id(root) -> dict[str, bytes]:
    """Every well-formed query line under ``root`` (a local folder), by its ``query_id``."""
    from pathlib import Path
    lines = {}
    for f in Path(root).rglob("*.jsonl"):
        for line in f.read_bytes().splitlines():
            try:
                lines[orjson.loads(line)["query_id"]] = line
            except (orjson.JSONDecodeError, KeyError, TypeError):
                pass
    return {i: line for i, line in lines.items() if i.count(":") == 2 and i.rsplit(":", 1)[1].isdigit()}
