"""A worker process's CPU by thread kind (``millwheel._cpu``, shown by ``millwheel status``): a thread's time
is counted under its name without its number, and stays counted (as ``ended``) once the thread ends."""
from __future__ import annotations

import os
import threading
import time

import pytest

from millwheel._cpu import thread_cpu_ms, thread_kind
from photon import wait_until

pytestmark = pytest.mark.timeout(60)


def test_thread_names_lose_the_suffix_that_numbers_them():
    assert thread_kind("millwheel-worker-0") == "millwheel-worker"
    assert thread_kind("mw-peer-rpc_12") == "mw-peer-rpc"
    assert thread_kind("millwheel-peer-127.0.0.1:4001") == "millwheel-peer"
    assert thread_kind("millwheel-peer-[::1]:4001") == "millwheel-peer"
    assert thread_kind("Thread-3 (_serve)") == "Thread (_serve)"
    assert thread_kind("millwheel-process-coordinator") == "millwheel-process-coordinator"
    assert thread_kind("MainThread") == "MainThread"


def _burn(cpu_s: float, go_on: threading.Event) -> None:
    end = time.thread_time() + cpu_s
    while time.thread_time() < end:
        pass
    go_on.wait(30)


def test_a_threads_cpu_is_counted_under_its_kind_and_as_ended_once_it_ends():
    before = thread_cpu_ms()
    go_on = threading.Event()
    threads = [threading.Thread(target=_burn, args=(0.1, go_on), name=f"burner-{i}") for i in range(2)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 30
        while thread_cpu_ms().get("burner", 0.0) < 190 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert thread_cpu_ms().get("burner", 0.0) >= 190        # 2 x 100 ms, read from schedstat
    finally:
        go_on.set()
        for t in threads:
            t.join(30)
    # join returns before the OS thread is gone (meanwhile it counts as ``native``)
    tids = {str(t.native_id) for t in threads}
    wait_until(lambda: not tids & set(os.listdir("/proc/self/task")), 10, message="the threads gone")
    after = thread_cpu_ms()
    assert "burner" not in after
    assert after["ended"] - before.get("ended", 0.0) >= 190
