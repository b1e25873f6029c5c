"""The joined horizon: an event time before which no more joined lines can appear, for readers of the joined
output that need a low watermark (MillWheel's ``JoinedInjector``).

A joiner answers JOINED only once the joined line is committed under the output contract, so a click its
dispatcher has resolved is already in the output (or in none: unjoinable, lost for the recovery job). A line
can still appear only for a click that some dispatcher holds unresolved (queued, in flight, waiting for a
retry) or has not read yet. Each dispatcher's status file (``<state_dir>/dispatcher/status.json``, rewritten
about every 100 ms) says both: ``oldest_unresolved_us`` (the event time of the oldest unresolved click, 0 when
none) and ``scan_at_us`` / ``pending_bytes`` (when it last looked at its logs, and how much was left unread).

A region's horizon is its oldest unresolved click's time; with nothing unresolved and nothing left unread, the
time of its last scan minus ``log_delay_us`` (a click's line may reach its log that much after the click);
with lines left unread, unknown (0: hold). The joined horizon is the minimum over the regions whose dispatcher
scanned within ``stale_after_us`` (a region that is down holds nothing back: the other regions read the same
clicks), or None when no region's dispatcher is live (the caller falls back to what it sees in the files).

Limits: it reads status files, so only a reader on the dispatchers' machine (or sharing their state folders)
gets it; a click recovered later by ``photon recover`` arrives after the horizon passed it (late).
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

import orjson

DISPATCHER_DIR = "dispatcher"
"""Folder (under a region's ``state_dir``) of its dispatcher's checkpoint, status and lock."""
DISPATCHER_STATUS_FILE = "status.json"


def dispatcher_status_path(state_dir: str | Path) -> Path:
    return Path(state_dir) / DISPATCHER_DIR / DISPATCHER_STATUS_FILE


def region_horizon_us(status: dict, log_delay_us: int) -> int:
    """One dispatcher's horizon from its status (see the module docstring); 0 when unknown."""
    oldest = int(status.get("oldest_unresolved_us", 0) or 0)
    if oldest:
        return oldest
    if int(status.get("pending_bytes", 0) or 0) > 0:
        return 0
    return max(0, int(status.get("scan_at_us", 0) or 0) - log_delay_us)


def joined_horizon_us(state_dirs: Iterable[str | Path], now_us: int, log_delay_us: int = 2_000_000,
                      stale_after_us: int = 10_000_000) -> int | None:
    """The joined horizon over the regions whose state folders are ``state_dirs`` (module docstring)."""
    horizons = []
    for state_dir in state_dirs:
        try:
            status = orjson.loads(dispatcher_status_path(state_dir).read_bytes())
        except (FileNotFoundError, orjson.JSONDecodeError):
            continue
        if now_us - int(status.get("scan_at_us", 0) or 0) > stale_after_us:
            continue
        horizons.append(region_horizon_us(status, log_delay_us))
    return min(horizons) if horizons else None
