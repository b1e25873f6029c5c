"""This process's CPU by thread kind, for ``millwheel status`` and the benchmark's per-thread figures.

:func:`thread_cpu_ms` reads each live thread's time on a CPU from ``/proc/self/task/<tid>/schedstat``
(nanoseconds, not the 10 ms ticks of ``stat``), names it by its Python thread's name with the numbers that
tell threads of one kind apart dropped (``millwheel-worker-0`` → ``millwheel-worker``,
``mw-peer-rpc_3`` → ``mw-peer-rpc``, ``millwheel-peer-127.0.0.1:4001`` → ``millwheel-peer``,
``Thread-1 (_serve)`` → ``Thread (_serve)``), and puts
threads Python did not start (gRPC's own, ``event_engine`` and the like) under ``native``; what threads
that have ended used is ``ended`` (the process's CPU time less the live threads'). The figures only grow,
so the difference of two readings is what each kind used between them, except that a thread's time moves
to ``ended`` when it ends (and, between the end of its Python part and its exit, shows under ``native``).
Empty where ``/proc`` is not.
"""
from __future__ import annotations

import os
import re
import threading
import time
from collections import Counter

_NUMBERED = re.compile(r"(-[^-\s]*:\d+|[-_]\d+)$")      # -host:port, -0, _3
_ANONYMOUS = re.compile(r"^Thread-\d+ ")              # threading's default name: "Thread-1 (_serve)"


def thread_kind(name: str) -> str:
    """The kind of a Python thread named ``name``: the name without the suffix that numbers it."""
    return _ANONYMOUS.sub("Thread ", _NUMBERED.sub("", name))


def thread_cpu_ms() -> dict[str, float]:
    """CPU milliseconds used so far by this process's threads, summed per kind (see the module docstring)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    per: Counter = Counter()
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return {}
    total = time.process_time_ns()
    live = 0
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue              # ended meanwhile
        live += ns
        name = names.get(int(tid))
        per["native" if name is None else thread_kind(name)] += ns
    per["ended"] += max(0, total - live)
    return {k: round(v / 1e6, 3) for k, v in per.items()}
