"""Low-watermark arithmetic (MillWheel paper §4.5). Pure: no threads, clocks or I/O.

Definitions used throughout the runtime:

* The *oldest work* of a computation is the smallest timestamp among its unfinished work: records
  delivered to it and not yet committed, its productions not yet acked by every consumer (stored or
  pending delivery), and its pending watermark timers (a pending timer holds the watermark at its
  timestamp, so what the timer produces at that timestamp is not late downstream).
* The *input low watermark* of computation A is the minimum of the low watermarks of every computation
  and injector producing to a stream A consumes. Watermark timers of A fire, and A's records are
  flagged late, against it.
* The *low watermark* of A = min(oldest work of A, input low watermark of A): the paper's
  "min(oldest work of A, low watermarks of all computations producing to A)".
* An injector's low watermark = min(its own published estimate, its oldest unacked production).
* Every published watermark is monotonic: a late record entering a computation's work cannot move it
  back (the record is flagged late instead). With cycles the greatest fixpoint is taken.
"""
from __future__ import annotations

import heapq
from typing import Mapping

NO_WATERMARK = 0
"""The watermark of something that knows nothing yet (no producers, no estimate)."""
END_OF_TIME = (1 << 63) - 1
"""The watermark of input that is complete: every timer can fire."""


class TimestampBag:
    """A multiset of timestamps with a fast minimum (lazy-deleting heap). Not thread-safe."""

    __slots__ = ("_counts", "_heap", "size")

    def __init__(self) -> None:
        self._counts: dict[int, int] = {}
        self._heap: list[int] = []
        self.size = 0

    def add(self, ts: int) -> None:
        c = self._counts.get(ts, 0)
        if c == 0:
            heapq.heappush(self._heap, ts)
        self._counts[ts] = c + 1
        self.size += 1

    def remove(self, ts: int) -> None:
        c = self._counts.get(ts, 0)
        if c <= 0:
            raise KeyError(f"timestamp {ts} is not in the bag")
        if c == 1:
            del self._counts[ts]
        else:
            self._counts[ts] = c - 1
        self.size -= 1

    def min(self) -> int | None:
        heap = self._heap
        while heap and heap[0] not in self._counts:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def __len__(self) -> int:
        return self.size


def _min_opt(a: int, b: int | None) -> int:
    return a if b is None or a <= b else b


def compute_watermarks(producers: Mapping[str, list[str]], oldest_work: Mapping[str, int | None],
                       injector_estimates: Mapping[str, int],
                       previous: Mapping[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    """Return ``(input_watermarks, low_watermarks)``.

    ``producers`` maps each computation to the names producing to it (computations or injectors);
    ``oldest_work`` gives each computation's and injector's oldest unfinished timestamp (``None``: no
    work); ``injector_estimates`` each injector's own estimate; ``previous`` the last published low
    watermarks, which the new ones never go below. ``low_watermarks`` covers injectors and computations;
    ``input_watermarks`` covers computations.
    """
    low: dict[str, int] = {}
    for name, estimate in injector_estimates.items():
        value = _min_opt(estimate, oldest_work.get(name))
        low[name] = max(previous.get(name, NO_WATERMARK), value)
    names = list(producers)
    for name in names:
        low[name] = END_OF_TIME
    inputs: dict[str, int] = {}
    for _ in range(len(names) + 2):
        changed = False
        for name in names:
            ins = [low.get(p, NO_WATERMARK) for p in producers[name]]
            inp = min(ins) if ins else NO_WATERMARK
            inputs[name] = inp
            value = max(previous.get(name, NO_WATERMARK), _min_opt(inp, oldest_work.get(name)))
            if value != low[name]:
                low[name] = value
                changed = True
        if not changed:
            break
    return inputs, low


def is_late(timestamp_us: int, input_watermark_us: int) -> bool:
    """A record is late when its timestamp is below the consumer's input low watermark: its producers
    had promised nothing older would come."""
    return timestamp_us < input_watermark_us


def advance(previous: int, candidate: int) -> int:
    """The next published value of a monotonic watermark."""
    return candidate if candidate > previous else previous
