"""Rebalancing under load with real processes: three master replicas, two worker processes and the
session's PostgreSQL. Clicks are written so that one interval of ``windows`` is hot (its traffic halves
at a known slot) and two adjacent ones get nothing; while the records flow, the master splits the hot
interval at the key its owner reports and merges the idle pair, each worker gives up the old pieces and
takes up the new ones (loading their timers, dedup ids and productions first), and the windows still
equal the batch answer, each window once."""
from __future__ import annotations

import json
import sys
import threading

import pytest
from mw_cluster import ClusterRun

from millwheel._routing import interval_of, slot_key
from photon import wait_until

pytestmark = pytest.mark.timeout(300)

SLOTS = 16                       # RuntimeConfig.intervals' default: 4 initial intervals of 4 slots each
# thresholds low enough for a test's traffic, a cooldown short enough to act while it flows
MASTER_OPTIONS = ("split_min_rate=50", "cooldown_us=600000", "load_ttl_us=2000000")
# the injector bounded by what is in flight, so the records flow for several seconds
OPTIONS = ("injector_batch=100", "max_in_flight=300")


def _names_in_slot(slot: int, count: int) -> list[str]:
    out, n = [], 0
    while len(out) < count:
        name = f"adv-{n}"
        if interval_of(name, SLOTS) == slot:
            out.append(name)
        n += 1
    return out


def _traffic() -> tuple[list[str], str]:
    """Advertiser names to draw clicks from, and the slot key where the hot interval's traffic halves:
    slots 0 and 1 carry a quarter each, slot 2 half, of the hot interval [0000, 0004); slot 5 (interval
    [0004, 0008)) a trickle; slots 8-15 (the pair [0008, 000c), [000c, -)) nothing."""
    hot = _names_in_slot(0, 1) * 8 + _names_in_slot(1, 1) * 8 + _names_in_slot(2, 2) * 8
    warm = _names_in_slot(5, 1)
    return hot + warm, slot_key(2)


class Shapes:
    """Polls the master's map of ``windows`` while the run goes on: every set of bounds it had, and how
    many records ``windows`` had taken when each first appeared."""

    def __init__(self, run: ClusterRun) -> None:
        self.run = run
        self.seen: dict[tuple, int] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._main, daemon=True)
        self.thread.start()

    def processed(self) -> int:
        return sum(w["computations"].get("windows", {}).get("records", 0) for w in self.run.workers())

    def _main(self) -> None:
        while not self.stop.wait(0.1):
            rows = [iv for iv in self.run.client.interval_map("windows")]
            bounds = tuple(sorted((iv.lo, iv.hi) for iv in rows))
            if bounds not in self.seen:
                self.seen[bounds] = self.processed()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


@pytest.fixture
def rebalancing_run(reachable_tmp, pg_url):
    names, _ = _traffic()
    run = ClusterRun(reachable_tmp, pg_url, workers=2, n_clicks=30000, files=12, names=names,
                     master_options=MASTER_OPTIONS, options=OPTIONS)
    try:
        yield run
    finally:
        run.close()
        assert run.proc.poll() is not None


def test_a_hot_interval_is_split_and_an_idle_pair_merged_while_records_flow(rebalancing_run):
    run = rebalancing_run
    _, halves_at = _traffic()
    total = len(run.events)
    shapes = Shapes(run)
    try:
        def split_and_merged() -> bool:
            los = {lo for bounds in shapes.seen for lo, _ in bounds}
            merged = any((lo, hi) == ("0008", None) for bounds in shapes.seen for lo, hi in bounds)
            return halves_at in los and merged
        wait_until(split_and_merged, 120, message="the hot interval split and the idle pair merged")
    finally:
        shapes.close()
    split_at = min(n for bounds, n in shapes.seen.items() if any(lo == halves_at for lo, _ in bounds))
    merged_at = min(n for bounds, n in shapes.seen.items() if ("0008", None) in bounds)
    assert split_at < total and merged_at < total, \
        f"split after {split_at}, merge after {merged_at} of {total} records: not while they flowed"
    # no other split: the pieces carry half each, below the split threshold
    assert all(lo in ("", "0004", "0008", "000c", halves_at) for bounds in shapes.seen for lo, _ in bounds), \
        shapes.seen
    try:
        run.wait_idle()
    except TimeoutError:
        _explain(run)
        raise
    run.check()
    counters = [w["counters"] for w in run.workers()]
    assert sum(c.get("given_up", 0) for c in counters) >= 4, "the split and merged pieces were given up"
    st = run.client.status()
    assert max(r["splits"] for r in st) >= 1 and max(r["merges"] for r in st) >= 1


def _explain(run: ClusterRun) -> None:
    """What each worker says keeps it busy, the map, and the run's last output (for a cluster not idle)."""
    for w in run.workers():
        print(json.dumps({k: w.get(k) for k in ("worker", "intervals", "busy", "counters", "low_watermarks_us",
                                                "input_watermarks_us", "outstanding", "in_flight", "injectors",
                                                "transport")}), file=sys.stderr)
    print([(iv.computation, iv.lo, iv.hi, iv.worker, iv.sequencer) for iv in run.client.interval_map()],
          file=sys.stderr)
    print((run.out.parent / "run.log").read_text()[-5000:], file=sys.stderr)
