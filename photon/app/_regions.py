"""A region taken down and brought back against a running deployment (``photon region down|up``).

The operator's wish is a small file in the region's state dir, ``region-control.json``
(``{"down": bool, "hard": bool, "seq": n}``); the ``photon run`` that runs the region polls it, takes every
process of the region down (SIGKILL all at once with ``hard``, else stopped in order) or starts them again,
and answers in ``region-state.json`` with the same ``seq``. The wish is durable: a launcher started while
its region is marked down keeps it down until ``photon region up``. On another machine the command
reaches the launcher's control endpoint (:mod:`photon.app._control`), which writes the same wish.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from photon import ConfigError, LockHeld, PhotonConfig, lock_holder, wait_until, write_atomic

CONTROL_FILE = "region-control.json"
STATE_FILE = "region-state.json"
LAUNCHER_FILE = "launcher.json"      # in a launcher's first region's state dir: its processes and pids
LOCK_FILE = "launcher.lock"          # in each state dir a launcher runs: held while it runs
LAUNCHER_HOLDER = "photon run"       # what a launcher writes into LOCK_FILE after its pid


class RegionControlError(RuntimeError):
    """The region's launcher is not running here, or did not act in time."""


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def read_region_control(state_dir) -> dict:
    """The operator's latest wish for a region (``{}`` when none)."""
    return _read(Path(state_dir) / CONTROL_FILE)


def read_region_state(state_dir) -> dict:
    """What the region's launcher last did about it (``{}`` when nothing)."""
    return _read(Path(state_dir) / STATE_FILE)


def write_region_state(state_dir, seq: int, down: bool, processes: list[str]) -> None:
    write_atomic(Path(state_dir) / STATE_FILE, json.dumps(
        {"seq": seq, "down": down, "processes": processes, "at_us": time.time_ns() // 1000}).encode(), durable=True)


def held_by_launcher(held: LockHeld) -> bool:
    """True when a state dir's lock is held by a launcher (older launchers wrote only their pid), not by a
    verify/recover job that brought the registry up itself."""
    return held.describe().startswith(LAUNCHER_HOLDER) or held.describe() == f"pid {held.pid}"


def _launcher_running(state_dir: Path) -> bool:
    held = lock_holder(state_dir / LOCK_FILE)
    return held is not None and held_by_launcher(held)


def set_region(config: PhotonConfig, name: str, down: bool, hard: bool = False, wait_s: float = 60.0) -> dict:
    """Ask the running ``photon run`` of region ``name`` to take it down (``down``; SIGKILL with ``hard``)
    or bring it back, and wait until it has: returns its answer (``{"seq", "down", "processes", "at_us"}``,
    ``processes`` naming what it stopped or started).

    From any machine holding the config when the region has a ``port_base`` and the config authenticates
    control requests (``[tls]`` or ``[control].secret_file``): through the launcher's control endpoint
    (:mod:`photon.app._control`). Otherwise on the launcher's own machine, through its state dir. Raises
    :class:`RegionControlError` when neither reaches a launcher of the region, or it did not act within
    ``wait_s``."""
    from photon.app._control import ControlError, auth_kind, set_region_remote
    region = config.region(name)
    state_dir = Path(region.state_dir)
    if region.port_base and auth_kind(config):
        try:
            return set_region_remote(config, region, down, hard, wait_s)
        except ControlError as e:
            raise RegionControlError(str(e)) from None
    if not _launcher_running(state_dir):
        raise RegionControlError(f"no photon run runs region {name!r} here (its state dir {state_dir} is not "
                                 f"locked by a launcher); run this command where the region runs, or give the "
                                 f"region a port_base and the config [tls] or [control].secret_file to control "
                                 f"it from any machine")
    return wish_and_wait(config, name, down, hard, wait_s)


def wish_and_wait(config: PhotonConfig, name: str, down: bool, hard: bool, wait_s: float) -> dict:
    """Write the wish into region ``name``'s state dir and wait for its launcher's answer (this machine)."""
    state_dir = Path(config.region(name).state_dir)
    seq = int(read_region_control(state_dir).get("seq", 0)) + 1
    write_atomic(state_dir / CONTROL_FILE, json.dumps({"down": down, "hard": hard, "seq": seq}).encode(),
                 durable=True)
    try:
        wait_until(lambda: read_region_state(state_dir).get("seq", 0) >= seq, wait_s, interval=0.05,
                   message=f"region {name} {'down' if down else 'up'}")
    except TimeoutError:
        raise RegionControlError(f"the launcher of region {name!r} did not act within {wait_s:g} s") from None
    return read_region_state(state_dir)


def region_down(config: PhotonConfig, name: str, hard: bool = False, wait_s: float = 60.0) -> dict:
    """Take region ``name`` down during a run: every process of it, its registry replicas included, stops
    (SIGKILL all at once with ``hard``) and stays down until :func:`region_up`. See :func:`set_region`."""
    return set_region(config, name, True, hard, wait_s)


def region_up(config: PhotonConfig, name: str, wait_s: float = 60.0) -> dict:
    """Bring region ``name`` back: its processes start again and catch up (see :func:`set_region`)."""
    return set_region(config, name, False, False, wait_s)


class RegionControls:
    """The launcher's side: ``apply(supervisor)`` acts on every new wish for the regions it runs."""

    def __init__(self, regions: list, echo) -> None:
        self.regions = regions
        self.echo = echo
        self._applied: dict[str, int] = {}

    def apply(self, supervisor) -> None:
        for region in self.regions:
            wish = read_region_control(region.state_dir)
            seq = int(wish.get("seq", 0))
            if not wish or self._applied.get(region.name) == seq:
                continue
            self._applied[region.name] = seq
            if wish.get("down"):
                names = supervisor.hold_region(region.name, hard=bool(wish.get("hard")))
                how = "killed (SIGKILL)" if wish.get("hard") else "stopped"
                self.echo(f"region {region.name} is down: {len(names)} processes {how}; "
                          f"`photon region up {region.name}` brings it back")
            else:
                names = supervisor.release_region(region.name)
                self.echo(f"region {region.name} is up again: {len(names)} processes started")
            write_region_state(region.state_dir, seq, bool(wish.get("down")), names)


def check_region_name(config: PhotonConfig, name: str) -> None:
    if name not in {r.name for r in config.regions}:
        raise ConfigError(f"{config.path}: no region named {name!r} (have {[r.name for r in config.regions]})")
