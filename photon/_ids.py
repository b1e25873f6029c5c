"""Event ids: ``<server_ip>:<process_id>:<timestamp_us>``.

``timestamp_us`` is microseconds since the Unix epoch, zero-padded to 16 digits and strictly increasing
within one process, so ids of one ``server_ip:process_id`` compare lexicographically in time order. The
timestamp is the event's time for sharding, garbage collection and log-file-map lookups.
"""
from __future__ import annotations

import operator
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


def key_and_time(event_id: str) -> tuple[str, int]:
    """A well-formed id's key (``<server_ip>:<process_id>``, what the event store's positions and the log-file
    map are kept by) and its timestamp: the slicing of the hot paths, for an id that passed
    :func:`is_event_id` (nothing is checked here; :func:`parse_event_id` says what is wrong with a bad one).
    :data:`ID_KEY` and :data:`ID_TIME_DIGITS` are the same slices for ``map`` over many ids."""
    return event_id[:-TIMESTAMP_DIGITS - 1], int(event_id[-TIMESTAMP_DIGITS:])


ID_KEY = operator.itemgetter(slice(None, -TIMESTAMP_DIGITS - 1))
"""``ID_KEY(event_id)``: the key of a well-formed id (see :func:`key_and_time`)."""
ID_TIME_DIGITS = operator.itemgetter(slice(-TIMESTAMP_DIGITS, None))
"""``ID_TIME_DIGITS(event_id)``: the timestamp digits of a well-formed id (zero-padded: text order is time order)."""


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


# ---- events as users have them: any id plus an event-time field ------------------------------------------

TIME_FORMATS = ("epoch_us", "epoch_ms", "epoch_s", "rfc3339")
"""How a time field is written: integer (or decimal) microseconds, milliseconds or seconds since the Unix
epoch (a JSON number or a string of one), or an RFC 3339 timestamp with a zone
(``2025-11-21T08:00:00.123456Z``, ``...+01:00``; fractions past microseconds are truncated)."""
MAX_CUSTOM_ID_CHARS = 256
"""The longest id a stream with a time field accepts (a key is held by the registry for every click)."""
MAX_TIME_US = 10**TIMESTAMP_DIGITS - 1
_SCALE = {"epoch_us": 1, "epoch_ms": 1_000, "epoch_s": 1_000_000}
_EPOCH = None


def _rfc3339_us(text: str) -> int:
    from datetime import datetime, timedelta, timezone
    global _EPOCH
    t = text.strip().upper()
    if len(t) < 19 or t[10] not in "T ":
        raise ValueError("is not an RFC 3339 date and time")
    dt = datetime.fromisoformat(t)
    if dt.tzinfo is None:
        raise ValueError("has no time zone (RFC 3339 needs Z or an offset such as +01:00)")
    if _EPOCH is None:
        _EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
    return (dt - _EPOCH) // timedelta(microseconds=1)


def parse_event_time(value, time_format: str) -> int:
    """An event's time field as microseconds since the epoch; ValueError saying what is wrong (not a
    number or timestamp, out of range ``[0, 10**16)`` µs, a boolean, ...)."""
    if time_format == "rfc3339":
        if not isinstance(value, str):
            raise ValueError(f"{value!r} is not an RFC 3339 string")
        try:
            us = _rfc3339_us(value)
        except ValueError as e:
            raise ValueError(f"{value!r} {e}" if "RFC" in str(e) or "zone" in str(e)
                             else f"{value!r} is not an RFC 3339 date and time") from None
    else:
        scale = _SCALE.get(time_format)
        if scale is None:
            raise ValueError(f"unknown time format {time_format!r} (one of {', '.join(TIME_FORMATS)})")
        if type(value) is int:
            us = value * scale
        elif type(value) is float and value == value and abs(value) != float("inf"):
            us = round(value * scale)
        elif type(value) is str:
            from decimal import Decimal, InvalidOperation
            try:
                d = Decimal(value.strip())
                if not d.is_finite():
                    raise InvalidOperation
            except InvalidOperation:
                raise ValueError(f"{value!r} is not a number ({time_format})") from None
            us = int((d * scale).to_integral_value())
        else:
            raise ValueError(f"{value!r} is not a number ({time_format})")
    if not 0 <= us <= MAX_TIME_US:
        raise ValueError(f"{value!r} is out of range ({us} µs is not in [0, 10**{TIMESTAMP_DIGITS}))")
    return us


def check_custom_id(value) -> str | None:
    """Why ``value`` cannot be an id of a stream with a time field, or None: a non-empty string of at most
    :data:`MAX_CUSTOM_ID_CHARS` characters, with no newline, not starting with ``:``."""
    if type(value) is not str:
        return f"is not a string but {type(value).__name__}"
    if not value or len(value) > MAX_CUSTOM_ID_CHARS:
        return f"must be 1 to {MAX_CUSTOM_ID_CHARS} characters, got {len(value)}"
    if "\n" in value or "\r" in value:
        return "holds a line break"
    if value[0] == ":":
        return "starts with ':'"
    return None


def custom_key(event_id: str, time_us: int) -> str:
    """The Photon key of a custom id with its time: ``<id>:0:<16-digit time_us>``, itself a valid event id
    that ``rsplit(':', 2)`` maps back to ``(id, '0', time)`` (so distinct ``(id, time)`` give distinct keys)."""
    return f"{event_id}:0:{time_us:0{TIMESTAMP_DIGITS}d}"


def key_id(key: str) -> str:
    """The user's id inside a key made by :func:`custom_key`."""
    return key.rsplit(":", 2)[0]


@dataclass(frozen=True)
class EventIds:
    """How one stream's events are identified: ``id_field`` and, optionally, ``time_field`` in
    ``time_format``. Without a time field ids are Photon ids (the time is inside them); with one, ids may be
    any string :func:`check_custom_id` accepts and the time comes from the field.

    :meth:`key` gives every event its **Photon key**, the id the registry, the dispatcher's bookkeeping and
    verify work on: the id itself for Photon ids, ``<id>:0:<time_us>`` (:func:`custom_key`) for custom ones.
    Output lines always keep the user's own fields unchanged.
    """
    id_field: str
    time_field: str = ""
    time_format: str = "epoch_us"

    @property
    def custom(self) -> bool:
        return bool(self.time_field)

    def key(self, event: dict) -> str:
        """The event's Photon key; raises :class:`BadEventId` naming the field that is missing or bad."""
        event_id = event.get(self.id_field)
        if not self.time_field:
            if type(event_id) is str and is_event_id(event_id):
                return event_id
            if event_id is None:
                raise BadEventId(f"no {self.id_field!r} field")
            parse_event_id(event_id)
            raise BadEventId(f"{self.id_field!r} {event_id!r} is not an event id")
        problem = check_custom_id(event_id)
        if problem:
            raise BadEventId(f"no {self.id_field!r} field" if event_id is None
                             else f"{self.id_field!r} {problem}: {str(event_id)[:80]!r}")
        return custom_key(event_id, self.time_us(event))

    def time_us(self, event: dict) -> int:
        """The event's time (µs): from its time field, or from inside its Photon id; :class:`BadEventId`
        naming the field when missing or unparseable."""
        if not self.time_field:
            return id_timestamp_us(event[self.id_field])
        if self.time_field not in event:
            raise BadEventId(f"no {self.time_field!r} field (the time field, {self.time_format})")
        try:
            return parse_event_time(event[self.time_field], self.time_format)
        except ValueError as e:
            raise BadEventId(f"time field {self.time_field!r}: {e}") from None

    def ref_problem(self, ref) -> str | None:
        """Why ``ref`` (a foreign event's reference to an event of this stream) can never name one, or None."""
        if not self.time_field:
            if type(ref) is str and is_event_id(ref):
                return None
            try:
                parse_event_id(ref)
            except BadEventId as e:
                return str(e)
            return f"{ref!r} is not an event id"
        return check_custom_id(ref)

    def key_of_line(self, line: str | bytes) -> str | None:
        """The key of one JSON log line, or None when the line is not a good event (for batch jobs)."""
        import orjson
        try:
            event = orjson.loads(line)
            return self.key(event) if type(event) is dict else None
        except (orjson.JSONDecodeError, BadEventId):
            return None
