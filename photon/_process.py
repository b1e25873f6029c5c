"""What a service room hands the launcher: the processes it wants running, and the ports it keeps.

Each service room plans its own processes (``<room>.plan_processes(...)``) as :class:`ProcessSpec` values;
the launcher layer only starts, supervises and stops them, so a room's command line lives in that room.
"""
from __future__ import annotations

import json
import socket
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from photon._config import REGION_PORTS, RegionConfig
from photon._logs import write_atomic
from photon._service import free_port

PORTS_FILE = "ports.json"


@dataclass(frozen=True)
class ProcessSpec:
    """One process to keep running: a unique ``name``, its ``argv``, its ``role`` (registry, eventstore,
    joiner, dispatcher), the ``region`` it belongs to, and the ``address`` (``host:port``) it serves at,
    empty for a process that serves nothing (the dispatcher)."""
    name: str
    argv: list
    role: str
    region: str = ""
    address: str = ""
    metrics_address: str = ""    # host:port of its Prometheus metrics (given to it in PHOTON_METRICS_ADDR)


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def remembered_ports(state_dir: str | Path, key: str, host: str, count: int) -> list[int]:
    """``count`` ports for ``key`` (e.g. ``"joiners"``), chosen free once and remembered in
    ``<state_dir>/ports.json`` so that a restarted launcher gives the same processes the same ports.

    A remembered port that something else has taken since is replaced by a free one. Call it before the
    processes start: a port of a process that is running is not free."""
    path = Path(state_dir) / PORTS_FILE
    batch = getattr(_batch, "files", None)
    ports = batch.get(path) if batch is not None else None
    if ports is None:
        try:
            ports = json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            ports = {}
        if batch is not None:
            batch[path] = ports
    known = ports.get(key)
    known = [known] if isinstance(known, int) else known if isinstance(known, list) else []
    chosen = [p if isinstance(p, int) and _port_free(host, p) else free_port(host) for p in known[:count]]
    while len(chosen) < count:
        chosen.append(free_port(host))
    if chosen != known:
        ports[key] = chosen
        if batch is not None:
            _batch.changed.add(path)
        else:
            _write_ports(path, ports)
    return chosen


def _write_ports(path: Path, ports: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(ports, sort_keys=True).encode(), durable=True)


_batch = threading.local()


@contextmanager
def ports_written_once():
    """Within it (in this thread), :func:`remembered_ports` keeps the ports it chooses in memory and each
    ``ports.json`` it changed is written once, durably, when the block ends without an exception: a plan of
    a dozen processes costs one durable write per state dir instead of one per key (each a pair of fsyncs,
    tens of milliseconds on a busy disk, before the launcher starts anything). Start the processes after
    the block, never inside it."""
    if getattr(_batch, "files", None) is not None:      # nested: the outer block writes
        yield
        return
    _batch.files, _batch.changed = {}, set()
    try:
        yield
        for path in sorted(_batch.changed):
            _write_ports(path, _batch.files[path])
    finally:
        _batch.files, _batch.changed = None, set()


_PAIRED = {"joiners": ("joiners", 0), "joiner_metrics": ("joiners", 1), "eventstore": ("eventstore", 0),
           "eventstore_metrics": ("eventstore", 1), "logstore": ("logstore", 0), "logstore_metrics": ("logstore", 1)}


def region_ports(region: RegionConfig, key: str, host: str, count: int) -> list[int]:
    """``count`` ports for ``key`` of ``region``'s processes: fixed, derived from the region's
    ``port_base`` (offsets in :data:`photon._config.REGION_PORTS`; every machine sharing the config derives
    the same), or, without a ``port_base``, chosen free once and remembered in the region's state dir
    (:func:`remembered_ports`). Keys: ``eventstore``, ``eventstore_metrics``, ``logstore``,
    ``logstore_metrics``, ``dispatcher_metrics``, ``joiners``, ``joiner_metrics``."""
    if not region.port_base:
        return remembered_ports(region.state_dir, key, host, count)
    base = region.port_base
    if key in _PAIRED:          # process i: gRPC at +k + 2i, its metrics at +k + 2i + 1
        serving, is_metrics = _PAIRED[key]
        return [base + REGION_PORTS[serving] + 2 * i + is_metrics for i in range(count)]
    if key not in REGION_PORTS:
        raise KeyError(f"no fixed port named {key!r}")
    return [base + REGION_PORTS[key] + i for i in range(count)]
