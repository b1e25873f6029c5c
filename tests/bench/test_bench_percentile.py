"""The benchmarks' percentiles are the standard library's (interpolated, numpy's default method)."""
from __future__ import annotations

import random

import pytest

from bench._common import percentile


def test_percentiles_interpolate_between_the_nearest_samples_and_handle_few_values():
    values = list(range(1, 101))
    random.Random(3).shuffle(values)
    assert percentile(values, 50) == 50.5 and percentile(values, 90) == pytest.approx(90.1)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile([7.0], 99) == 7.0 and percentile([], 50) == 0.0
    assert percentile([1, 3], 50) == 2.0
    assert percentile(values, 100) == 100.0 and percentile(values, 0) == 1.0
    for bad in (101, -1, 50.5):
        with pytest.raises(ValueError):
            percentile(values, bad)
