"""A worker process's threads are batch threads (``millwheel/_sched.py``): set once before any thread
starts, inherited by every thread started after it, and by nothing started before it."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux's SCHED_BATCH")]

PROBE = """
import json, os, sys, threading
from concurrent import futures
from millwheel._sched import batch_threads, thread_policy
early = futures.ThreadPoolExecutor(1)
before = early.submit(thread_policy).result()       # a thread started before the call
ok = batch_threads() if sys.argv[1] == "batch" else None
seen = {}
def child():
    seen["child"] = thread_policy()
    grandchild = threading.Thread(target=lambda: seen.__setitem__("grandchild", thread_policy()))
    grandchild.start()
    grandchild.join()
t = threading.Thread(target=child)
t.start()
t.join()
print(json.dumps({"ok": ok, "main": thread_policy(), "early": early.submit(thread_policy).result(),
                  "before": before, **seen}))
"""


def probe(mode: str) -> dict:
    import json
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=50,
                         check=True).stdout
    return json.loads(out)


def test_threads_started_after_batch_threads_are_batch_threads_and_earlier_ones_are_not():
    got = probe("batch")
    assert got["ok"] is True
    assert got["main"] == got["child"] == got["grandchild"] == os.SCHED_BATCH, got
    inherited = os.sched_getscheduler(0)      # what a process started from here has without the call
    assert inherited != os.SCHED_BATCH
    assert got["before"] == got["early"] == inherited, got
    plain = probe("default")
    assert plain["main"] == plain["child"] == plain["grandchild"] == inherited, plain
