"""Time as an injected dependency. Times are integer microseconds since the Unix epoch.

Deciding cores never read the clock themselves: shells pass ``clock.now_us()`` in, and tests use
:class:`FakeClock`, which only moves when told and refuses to move backwards.
"""
from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now_us(self) -> int:
        """Wall-clock microseconds since the Unix epoch."""

    def monotonic_us(self) -> int:
        """Microseconds on a clock that never goes backwards (for timeouts and latencies in-process)."""


class SystemClock:
    def now_us(self) -> int:
        return time.time_ns() // 1000

    def monotonic_us(self) -> int:
        return time.monotonic_ns() // 1000


class FakeClock:
    """A clock for tests: starts at ``start_us`` and moves only by :meth:`advance` or :meth:`set`."""

    def __init__(self, start_us: int = 1_763_712_000_000_000) -> None:
        self._now = start_us
        self._lock = threading.Lock()

    def now_us(self) -> int:
        return self._now

    def monotonic_us(self) -> int:
        return self._now

    def advance(self, us: int) -> int:
        if us < 0:
            raise ValueError(f"FakeClock cannot go backwards (advance by {us} us)")
        with self._lock:
            self._now += us
            return self._now

    def set(self, now_us: int) -> None:
        with self._lock:
            if now_us < self._now:
                raise ValueError(f"FakeClock cannot go backwards ({now_us} < {self._now})")
            self._now = now_us
