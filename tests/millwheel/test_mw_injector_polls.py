"""An injector's wait between polls: a tick after a poll that gave records (a source producing steadily has
more due within a tick), the longer idle wait only once a poll found nothing after an empty one."""
from __future__ import annotations

import threading

import pytest
from test_mw_runtime import QueueInjector, topo

from millwheel import Runtime, RuntimeConfig
from millwheel._injector_shell import IDLE_POLL_US
from millwheel._store import SQLiteStore
from photon import wait_until


class NotedQueueInjector(QueueInjector):
    """Notes ("poll", records given) in ``log``; the shell's waits are noted there too."""

    def __init__(self, log: list, lock: threading.Lock) -> None:
        super().__init__()
        self.log, self.log_lock = log, lock

    def poll(self, max_records, now_us):
        p = super().poll(max_records, now_us)
        with self.log_lock:
            self.log.append(("poll", len(p.records)))
        return p


@pytest.mark.timeout(60)
def test_an_injector_polls_again_after_a_tick_when_its_last_poll_gave_records(tmp_path):
    log: list = []
    lock = threading.Lock()
    inj = NotedQueueInjector(log, lock)
    cfg = RuntimeConfig(threads=1, intervals=1, tick_us=2_000)
    rt = Runtime(topo(inj), cfg, store=SQLiteStore(str(tmp_path / "s.db")))
    rt.start()
    try:
        shell = rt.injectors["in"]
        take = shell.inbox.take

        def noted_take(limit, timeout_s):
            if limit == 0:                         # a wait between polls (not the step's look at its acks)
                with lock:
                    log.append(("wait", timeout_s))
            return take(limit, timeout_s)
        shell.inbox.take = noted_take
        wait_until(lambda: sum(1 for e in list(log) if e[0] == "wait") >= 2, 30, message="idle polls")
        for i in range(3):
            inj.push([(f"k{i}", {"i": i}, 1_000_000 + i)], estimate=1_000_000 + i)
            with lock:
                mark = len(log)
            wait_until(lambda mark=mark: sum(1 for e in log[mark:] if e[0] == "wait") >= 3, 30,
                       message="polls after it")
        with lock:
            events = list(log)
        after_records, after_empty = [], []     # each wait by the two polls before it
        polls: list = []
        for kind, v in events:
            if kind == "poll":
                polls.append(v)
            elif polls[-2:] == [1, 0]:
                after_records.append(v)
            elif polls[-2:] == [0, 0]:
                after_empty.append(v)
        assert after_records, events
        assert set(after_records) == {cfg.tick_us / 1e6}, events
        assert set(after_empty) == {IDLE_POLL_US / 1e6}, events
        wait_until(lambda: rt.statistics().computations["count"].records_processed == 3, 30, message="counted")
    finally:
        rt.stop()
