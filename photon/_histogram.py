"""A mergeable latency histogram: counts per logarithmic bucket, so that percentiles over any number of
processes and over a whole run come from adding counts, not from keeping (or truncating) samples."""
from __future__ import annotations

import math

SUB_BUCKETS = 16
"""Buckets per doubling: bucket ``k`` holds durations in ``[2**(k/16), 2**((k+1)/16))`` µs (4.4% wide)."""


class LatencyHistogram:
    """Durations in integer microseconds. A percentile is reported as its bucket's geometric middle, so it
    is within 2.2% of the nearest-rank value of the samples. Not thread-safe; the JSON form
    (:meth:`to_json`, ``{"<bucket>": count}``) is what status files carry and :meth:`from_json` reads."""

    __slots__ = ("counts", "total")

    def __init__(self, counts: dict[int, int] | None = None) -> None:
        self.counts: dict[int, int] = dict(counts or {})
        self.total = sum(self.counts.values())

    def add(self, duration_us: int, count: int = 1) -> None:
        """Count ``count`` durations of ``duration_us`` each."""
        k = 0 if duration_us < 1 else int(math.log2(duration_us) * SUB_BUCKETS)
        self.counts[k] = self.counts.get(k, 0) + count
        self.total += count

    def merge(self, other: "LatencyHistogram") -> "LatencyHistogram":
        """Add ``other``'s counts into this one; returns self."""
        for k, n in other.counts.items():
            self.counts[k] = self.counts.get(k, 0) + n
        self.total += other.total
        return self

    def percentile_ms(self, p: float) -> float:
        """The nearest-rank ``p``-th percentile in milliseconds (0.0 when empty)."""
        if not self.total:
            return 0.0
        rank = max(1, math.ceil(p * self.total / 100))
        seen = 0
        for k in sorted(self.counts):
            seen += self.counts[k]
            if seen >= rank:
                return round(2 ** ((k + 0.5) / SUB_BUCKETS) / 1000.0, 3)
        return 0.0  # not reached

    def percentiles_ms(self, points=(50, 90, 99)) -> dict:
        """``{"p50": ms, ...}``, or ``{}`` when empty."""
        return {f"p{p}": self.percentile_ms(p) for p in points} if self.total else {}

    def cumulative_counts(self, bounds_us) -> list[int]:
        """For each upper bound (µs, ascending) the number of durations surely at or below it, then the
        total (Prometheus's cumulative ``le`` buckets, ``+Inf`` last). A bucket counts towards a bound only
        when it ends at or below it, so a count is never overstated (a duration may be counted one bound
        late, by at most one bucket's 4.4%)."""
        out, items, i, seen = [], sorted(self.counts.items()), 0, 0
        for bound in bounds_us:
            while i < len(items) and 2 ** ((items[i][0] + 1) / SUB_BUCKETS) <= bound:
                seen += items[i][1]
                i += 1
            out.append(seen)
        out.append(self.total)
        return out

    def approx_sum_us(self) -> float:
        """The sum of the durations, each taken as its bucket's geometric middle (within 2.2%)."""
        return sum(n * 2 ** ((k + 0.5) / SUB_BUCKETS) for k, n in self.counts.items())

    def to_json(self) -> dict:
        return {str(k): n for k, n in sorted(self.counts.items())}

    @classmethod
    def from_json(cls, data) -> "LatencyHistogram":
        """Reads :meth:`to_json`'s form; anything else (missing, malformed) gives an empty histogram."""
        if not isinstance(data, dict):
            return cls()
        try:
            return cls({int(k): int(n) for k, n in data.items() if int(n) > 0})
        except (TypeError, ValueError):
            return cls()
