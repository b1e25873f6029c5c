"""``bench.compare``'s rate after the first join counts only the clicks that became visible after it."""
from __future__ import annotations

from bench.compare import after_first_rate


def test_the_rate_after_the_first_join_counts_the_clicks_seen_after_it_and_is_none_when_none_came_after():
    assert after_first_rate(1000, 100, 2.0) == 450.0         # 900 clicks after the first look, over 2 s
    assert after_first_rate(1000, 0, 4.0) == 250.0
    assert after_first_rate(1000, 1000, 0.03) is None         # one batch held the whole backlog: nothing to rate
    assert after_first_rate(1000, 999, 0.0) is None
