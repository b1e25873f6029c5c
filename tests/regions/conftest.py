"""Fixtures of the multi-region tests: a launcher per region, stopped at teardown, and the at-most-once
invariant checked over the union of every region's output after every test."""
from __future__ import annotations

import pytest

from regions_helpers import RegionRun, union_joined


@pytest.fixture
def region_run(procs):
    made: list[RegionRun] = []

    def make(config_path, region: str, prefix=()) -> RegionRun:
        run = RegionRun(procs, config_path, region, prefix)
        made.append(run)
        return run

    yield make
    for run in reversed(made):
        if run.proc is not None and run.proc.poll() is None:
            run.stop()
    if made:
        dups = {k: v for k, v in union_joined(made[0].config).items() if v > 1}
        assert dups == {}, f"clicks joined more than once: {list(dups.items())[:10]}"
