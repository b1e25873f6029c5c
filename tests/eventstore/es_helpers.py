"""Helpers of the event store tests: query ids and lines."""
from __future__ import annotations

import orjson
from photon import format_event_id


def query_id(n: int) -> str:
    return format_event_id("10.0.0.1", 4242, 1_763_712_000_000_000 + n)


def query_line(n: int, **extra) -> bytes:
    return orjson.dumps({"query_id": query_id(n), "q": f"shoes {n:06d}", **extra})
