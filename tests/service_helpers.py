"""Helpers shared by the tests that start Photon's services as processes: a one-region photon.toml on
temporary folders, and the address a service prints once it serves."""
from __future__ import annotations

from pathlib import Path

import orjson


def write_photon_toml(root: Path, **sections) -> Path:
    """``root/photon.toml`` with the given tables (``name={key: value}``) and one region ``a`` whose logs,
    output and state are ``root/logs``, ``root/out`` and ``root/state``."""
    lines = []
    for name, table in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {orjson.dumps(v).decode()}" for k, v in table.items()]
    lines += ["[[regions]]", 'name = "a"', f'log_root = "{root / "logs"}"', f'output_root = "{root / "out"}"',
              f'state_dir = "{root / "state"}"']
    path = root / "photon.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def read_serving_address(proc, what: str) -> str:
    """The ``host:port`` a service process prints once ready (``<what> ... serving on host:port``)."""
    line = proc.stdout.readline().decode()
    assert line.startswith(what) and " serving on " in line, f"{what} did not start: {line!r}"
    return line.rsplit(" ", 1)[1].strip()
