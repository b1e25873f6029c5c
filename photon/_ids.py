"""Event ids: ``<server_ip>:<process_id>:<timestamp_us>``.

``timestamp_us`` is microseconds since the Unix epoch, zero-padded to 16 digits and strictly increasing
within one process, so ids of one ``server_ip:process_id`` compare lexicographically in time order. The
timestamp is the event's time for sharding, garbage collection and log-file-map lookups.
"""
from __future__ import annotations

import os
import re
import socket
import threading
from dataclasses import dataclass

from photon._clock import Clock, SystemClock

TIMESTAMP_DIGITS = 16


ID_REGEX = r"[^:\n][^\n]*:[0-9]+:[0-9]{%d}" % TIMESTAMP_DIGITS
"""The id format as a regular expression (Python's and Java's syntax alike), unanchored."""
_ID_RE = re.compile(ID_REGEX + r"\Z")
is_event_id = _ID_RE.match
"""``is_event_id(text)`` is truthy iff ``text`` follows the id format (the hot-path check; use
:func:`parse_event_id` for the reason an id is bad)."""


class BadEventId(ValueError):
    """An id that does not follow ``<server_ip>:<process_id>:<timestamp_us>``; the message names it."""


@dataclass(frozen=True, slots=True)
class EventId:
    server_ip: str
    process_id: int
    timestamp_us: int

    def __str__(self) -> str:
        return format_event_id(self.server_ip, self.process_id, self.timestamp_us)


def format_event_id(server_ip: str, process_id: int, timestamp_us: int) -> str:
    if not 0 <= timestamp_us < 10**TIMESTAMP_DIGITS:
        raise BadEventId(f"timestamp {timestamp_us} does not fit in {TIMESTAMP_DIGITS} digits")
    return f"{server_ip}:{process_id}:{timestamp_us:0{TIMESTAMP_DIGITS}d}"


def parse_event_id(text: str) -> EventId:
    """Parse an id; raises :class:`BadEventId` naming the text when it does not follow the format."""
    if not isinstance(text, str):
        raise BadEventId(f"event id must be a string, got {type(text).__name__}: {text!r}")
    parts = text.rsplit(":", 2)
    if len(parts) != 3 or not parts[0] or "\n" in parts[0] or parts[0].startswith(":"):
        raise BadEventId(f"event id {text!r} is not <server_ip>:<process_id>:<timestamp_us>")
    ip, pid, ts = parts
    if not (pid.isascii() and pid.isdigit()):
        raise BadEventId(f"event id {text!r}: process id {pid!r} is not a number")
    if len(ts) != TIMESTAMP_DIGITS or not (ts.isascii() and ts.isdigit()):
        raise BadEventId(f"event id {text!r}: timestamp {ts!r} is not {TIMESTAMP_DIGITS} digits")
    return EventId(ip, int(pid), int(ts))


def id_timestamp_us(text: str) -> int:
    """The event time inside an id, without building an :class:`EventId` (hot path)."""
    ts = text[-TIMESTAMP_DIGITS:]
    if len(text) < TIMESTAMP_DIGITS + 4 or text[-TIMESTAMP_DIGITS - 1] != ":" or not ts.isdigit():
        raise BadEventId(f"event id {text!r} does not end in :<{TIMESTAMP_DIGITS}-digit timestamp_us>")
    return int(ts)


def local_ip() -> str:
    """This host's address for ids; loopback when the host has no resolvable name."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


class IdGenerator:
    """Makes ids for one process whose timestamps strictly increase even if the clock stalls or steps back.

    Thread-safe. ``next_id()`` returns the id string; ``next_timestamp()`` just the timestamp.
    """

    def __init__(self, server_ip: str | None = None, process_id: int | None = None,
                 clock: Clock | None = None) -> None:
        self.server_ip = server_ip if server_ip is not None else local_ip()
        self.process_id = process_id if process_id is not None else os.getpid()
        self._clock = clock or SystemClock()
        self._last = 0
        self._lock = threading.Lock()
        self._prefix = f"{self.server_ip}:{self.process_id}:"

    def next_timestamp(self) -> int:
        with self._lock:
            ts = max(self._clock.now_us(), self._last + 1)
            self._last = ts
            return ts

    def next_id(self) -> str:
        return f"{self._prefix}{self.next_timestamp():0{TIMESTAMP_DIGITS}d}"
