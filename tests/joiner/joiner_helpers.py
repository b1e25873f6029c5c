"""Helpers of the joiner tests: ids and lines of queries and clicks, configs on temporary folders."""
from __future__ import annotations

import itertools
import os
import threading
from pathlib import Path

import orjson

from photon import format_event_id, parse_config, wait_until

from fake_registry import FakeRegistry

BASE_US = 1_763_712_000_000_000


def query_id(n: int) -> str:
    return format_event_id("10.0.0.1", 4242, BASE_US + n)


_click_pids = itertools.count(os.getpid() * 1000)


def fresh_click_pid() -> int:
    """A process id for click ids no other test of this process uses (the memory registry is shared)."""
    return next(_click_pids)


def click_id(n: int, pid: int = 77, base_us: int = BASE_US) -> str:
    return format_event_id("10.0.0.2", pid, base_us + 1_000_000 + n)


def query_line(n: int) -> bytes:
    return orjson.dumps({"query_id": query_id(n), "q": f"shoes {n:06d}", "ad": n % 7})


def click_line(n: int, query: int | None = None, pid: int = 77, base_us: int = BASE_US, **extra) -> bytes:
    return orjson.dumps({"click_id": click_id(n, pid, base_us), "query_id": query_id(n if query is None else query),
                         "pos": n % 3, **extra})


def clicks(ns, query=None, pid: int = 77, base_us: int = BASE_US) -> tuple[list[str], list[str], list[bytes]]:
    """Columns of a Join request for clicks ``ns`` (click n refers to query n unless ``query`` maps it);
    click n's id has the timestamp ``base_us`` + 1 s + n."""
    query = query or {}
    ids = [click_id(n, pid, base_us) for n in ns]
    refs = [query_id(query.get(n, n)) for n in ns]
    raws = [click_line(n, query.get(n, n), pid, base_us) for n in ns]
    return ids, refs, raws


def write_queries(root: Path, ns, name: str = "q.log") -> None:
    """Appends queries ``ns`` to a primary log file of region a."""
    d = root / "logs" / "queries"
    d.mkdir(parents=True, exist_ok=True)
    with open(d / name, "ab") as f:
        f.write(b"".join(query_line(n) + b"\n" for n in ns))


def join_held_in_commit(stack, n: int, **joiner_options):
    """A joiner (``stack(registry, **joiner_options)``) with queries 0..n-1 indexed and one request joining
    clicks 0..n-1 held inside the registry commit; returns (registry, stack, pending future). Setting
    ``registry.gate`` lets the commit go on."""
    reg = FakeRegistry()
    reg.gate = threading.Event()
    s = stack(reg, **joiner_options)
    write_queries(s.root, range(n))
    s.wait_queries(n)
    pending = s.client.join_future(*clicks(range(n)))
    wait_until(lambda: reg.waiting == 1, 10, message="the request inside the registry commit")
    return reg, s, pending


def config_data(root: Path, **sections) -> dict:
    return {**sections, "regions": [{"name": "a", "log_root": str(root / "logs"), "output_root": str(root / "out"),
                                     "state_dir": str(root / "state")}]}


def make_config(root: Path, **sections):
    return parse_config(config_data(root, **sections), str(root / "photon.toml"), root)


def published_files(out_dir: Path, pattern: str = "*.jsonl") -> list[Path]:
    """The published output files under ``out_dir`` (any partition; hidden names skipped)."""
    return sorted(f for f in out_dir.rglob(pattern)
                  if not any(part.startswith(("_", ".")) for part in f.relative_to(out_dir).parts))


def inprogress_files(out_dir: Path, prefix: str = "") -> list[Path]:
    """The output files still being written under ``out_dir`` (hidden: ``.<name>.jsonl.inprogress``)."""
    return sorted(out_dir.rglob(f".{prefix}*.jsonl.inprogress"))


def joined_lines(out_dir: Path, pattern: str = "*.jsonl") -> list[dict]:
    """Every joined event in the published output files under ``out_dir``."""
    return [orjson.loads(line) for f in published_files(out_dir, pattern) for line in f.read_bytes().splitlines()]
