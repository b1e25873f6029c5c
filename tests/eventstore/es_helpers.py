"""Helpers of the event store tests: query ids and lines, a photon.toml on temporary folders."""
from __future__ import annotations

from pathlib import Path

import orjson
from photon import format_event_id


def query_id(n: int) -> str:
    return format_event_id("10.0.0.1", 4242, 1_763_712_000_000_000 + n)


def query_line(n: int, **extra) -> bytes:
    return orjson.dumps({"query_id": query_id(n), "q": f"shoes {n:06d}", **extra})


def write_photon_toml(tmp_path: Path, **sections) -> Path:
    lines = []
    for name, table in sections.items():
        lines.append(f"[{name}]")
        for k, v in table.items():
            lines.append(f"{k} = {orjson.dumps(v).decode()}")
    lines += ["[[regions]]", 'name = "a"', f'log_root = "{tmp_path / "logs"}"',
              f'output_root = "{tmp_path / "out"}"', f'state_dir = "{tmp_path / "state"}"']
    path = tmp_path / "photon.toml"
    path.write_text("\n".join(lines) + "\n")
    return path




def read_serving_address(proc, what: str) -> str:
    """The ``host:port`` a service process prints once ready (``<what> ... serving on host:port``)."""
    line = proc.stdout.readline().decode()
    assert line.startswith(what) and " serving on " in line, f"{what} did not start: {line!r}"
    return line.rsplit(" ", 1)[1].strip()


