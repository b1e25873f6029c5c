"""The cyclic garbage collector of a long-running pipeline process, set once it serves.

A dispatcher holds tens of thousands of unresolved clicks (a list each), a joiner and an event store make
several objects per event they handle: with CPython's default thresholds (a collection every 700 net
allocations of container objects, a full one every 100 of those) the collector keeps walking every object
of the process, start-up's modules, classes and protobuf descriptors included, while none of those objects
ever forms a reference cycle. Measured on the dispatcher's core over the 1M-query workload's 152K clicks
(docs/history/performance.md, "Fifth pass: the collector"): about a sixth of its CPU per click was the collector.
"""
from __future__ import annotations

import gc

GEN0_THRESHOLD = 20_000
"""Net container allocations between two young collections (CPython's default: 700). The older generations'
thresholds stay at their defaults (a collection of generation ``n`` every 10 of generation ``n - 1``)."""


def settle_gc() -> None:
    """Call once the process serves: every object alive now (imports, servers, configuration) is moved to
    the permanent generation (``gc.freeze``), which collections do not walk, and young collections run
    every :data:`GEN0_THRESHOLD` allocations. Cycles are still collected, only less often."""
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)
