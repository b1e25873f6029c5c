"""The threaded shell over real files, with the joiners and the registry replaced by the FAKES in dispatcher_fakes.py."""
from __future__ import annotations

import time

import orjson
import pytest

from dispatcher import DispatcherLocked, DispatcherStatistics, read_status, serve
from dispatcher._state import snapshot_events
from photon import load_config, wait_until
from dispatcher_fakes import FakeJoinerClient, FakeJoinService, FakeRegistry
from dispatcher_helpers import (append, append_lines, click_id, click_line, config, query_id,
                                      read_jsonl_dir, write_config)


@pytest.fixture
def service():
    s = FakeJoinService()
    yield s
    s.close()


def start(cfg, service, registry=True, **kw):
    return serve(cfg, "r1", ["127.0.0.1:1", "127.0.0.1:2"],
                 registry_client=FakeRegistry(service) if registry else None,
                 joiner_client=lambda a: FakeJoinerClient(a, service), **kw)


def test_growing_files_half_lines_and_new_files_are_all_joined_once(tmp_path, service):
    cfg = config(tmp_path)
    clicks = tmp_path / "logs" / "clicks"
    service.add_queries(query_id(n) for n in range(400))
    append_lines(clicks / "w1" / "c-0001.jsonl", [click_line(n) for n in range(100)])
    d = start(cfg, service)
    try:
        wait_until(lambda: len(service.joined) == 100, 20, message="first file joined")
        # a line written in two halves is read only once complete
        half = click_line(100)
        append(clicks / "w1" / "c-0001.jsonl", half[:20])
        wait_until(lambda: d.statistics().pending_bytes == 20, 10, message="half line pending")
        assert not service.is_joined(click_id(100))
        append(clicks / "w1" / "c-0001.jsonl", half[20:] + b"\n")
        # new files at other depths, and a file that keeps growing
        append_lines(clicks / "w2" / "deep" / "c-0001.jsonl", [click_line(n) for n in range(101, 200)])
        append_lines(clicks / "w1" / "c-0002.jsonl", [click_line(n) for n in range(200, 300)])
        append_lines(clicks / "w1" / "c-0001.jsonl", [click_line(n) for n in range(300, 400)])
        wait_until(lambda: len(service.joined) == 400, 20, message="all 400 clicks joined")
        wait_until(lambda: (read_status(cfg.regions[0].state_dir) or {}).get("caught_up"), 10,
                   message="status caught_up")
    finally:
        d.stop()
    assert max(service.joined.values()) == 1
    assert service.max_concurrent <= 4 and max(service.request_sizes) <= 50
    status = read_status(cfg.regions[0].state_dir)
    assert status["joined"] == 400 and status["events_read"] == 400 and status["pending_bytes"] == 0
    assert status["in_flight"] == 0 and status["retry_queue"] == 0 and status["bad_records"] == 0
    assert set(status["join_latency_ms"]) == {"p50", "p90", "p99"}
    assert set(status) >= {f for f in DispatcherStatistics.__dataclass_fields__}


def test_waiting_clicks_join_late_or_become_unjoinable_and_bad_lines_are_quarantined(tmp_path, service):
    cfg = config(tmp_path, unjoinable_after_s=0.6)
    f = tmp_path / "logs" / "clicks" / "c.jsonl"
    lines = [click_line(1), b"{oops", click_line(2), orjson.dumps({"click_id": click_id(3)}), click_line(4)]
    append_lines(f, lines)
    d = start(cfg, service)
    try:
        wait_until(lambda: d.statistics().retry_queue + d.statistics().in_flight == 3, 10,
                   message="three clicks waiting for their queries")
        service.add_queries([query_id(2)])  # query 2 arrives late: click 2 joins on a retry
        wait_until(lambda: service.is_joined(click_id(2)), 10, message="late click joined")
        wait_until(lambda: d.statistics().unjoinable == 2 and d.statistics().caught_up, 10,
                   message="clicks 1 and 4 given up")
    finally:
        d.stop()
    region = cfg.regions[0]
    unjoinable = read_jsonl_dir(region.unjoinable_dir)
    assert sorted(u["click_id"] for u in unjoinable) == [click_id(1), click_id(4)]
    bad = read_jsonl_dir(region.quarantine_dir)
    offsets = [0]
    for ln in lines:
        offsets.append(offsets[-1] + len(ln) + 1)
    assert [(b["file"], b["offset"], b["raw"]) for b in bad] == [
        ("c.jsonl", offsets[1], "{oops"), ("c.jsonl", offsets[3], lines[3].decode())]
    assert "missing field 'query_id'" in bad[1]["reason"]
    s = d.statistics()
    assert (s.bad_records, s.joined, s.unjoinable, s.attempts >= 3 * 3) == (2, 1, 2, True)


def test_restart_resumes_from_the_checkpoint_without_joining_twice(tmp_path, service):
    cfg = config(tmp_path)
    f = tmp_path / "logs" / "clicks" / "c.jsonl"
    service.add_queries(query_id(n) for n in range(300))
    append_lines(f, [click_line(n) for n in range(300)])
    service.hold.clear()  # requests wait: the dispatcher stops with events in flight
    d = start(cfg, service)
    # in flight at the joiners (held there), not only in registry lookups: the loop, no longer waiting in the
    # checkpoint's fsync, may be stopped before a looked-up request is sent
    wait_until(lambda: d.statistics().in_flight > 0 and service.requests > 0, 10, message="events in flight")
    d.stop()
    snap = orjson.loads((tmp_path / "state" / "dispatcher" / "checkpoint.json").read_bytes())
    assert snap["format"] == 2 and len(snapshot_events(snap)) == 300 and snap["offsets"] == {"c.jsonl": f.stat().st_size}
    service.hold.set()  # the held requests now join (as if answered after the dispatcher stopped)
    wait_until(lambda: len(service.joined) > 0, 10, message="held requests joined")
    d = start(cfg, service)
    try:
        wait_until(lambda: d.statistics().caught_up, 20, message="caught up after restart")
    finally:
        d.stop()
    assert len(service.joined) == 300 and max(service.joined.values()) == 1
    s = d.statistics()
    assert s.joined + s.already_registered >= 300


def test_unavailable_joiners_and_registry_delay_but_lose_nothing(tmp_path, service):
    cfg = config(tmp_path, unjoinable_after_s=0.2)
    service.add_queries(query_id(n) for n in range(50))
    service.unavailable = True
    registry = FakeRegistry(service)
    registry.failing = True
    append_lines(tmp_path / "logs" / "clicks" / "c.jsonl", [click_line(n) for n in range(50)])
    d = serve(cfg, "r1", ["127.0.0.1:1"], registry_client=registry,
              joiner_client=lambda a: FakeJoinerClient(a, service))
    try:
        wait_until(lambda: d.statistics().join_failures >= 5, 10, message="repeated joiner failures")
        assert d.statistics().unjoinable == 0 and d.statistics().lookup_failures >= 5
        service.unavailable = False
        registry.failing = False
        wait_until(lambda: d.statistics().caught_up, 10, message="caught up once the joiner is back")
    finally:
        d.stop()
    assert len(service.joined) == 50 and d.statistics().unjoinable == 0


def test_throttled_requests_are_retried(tmp_path, service):
    cfg = config(tmp_path)
    service.add_queries(query_id(n) for n in range(10))
    service.throttle_next = 3
    append_lines(tmp_path / "logs" / "clicks" / "c.jsonl", [click_line(n) for n in range(10)])
    d = start(cfg, service, registry=False)
    try:
        wait_until(lambda: d.statistics().caught_up, 10, message="caught up after throttling")
    finally:
        d.stop()
    # every event of the three throttled requests was sent once more
    assert len(service.joined) == 10 and len(service.request_sizes) >= 4
    assert d.statistics().attempts == 10 + sum(service.request_sizes[:3])


def test_a_second_dispatcher_on_the_same_state_is_refused(tmp_path, service):
    cfg = config(tmp_path)
    d = start(cfg, service)
    try:
        with pytest.raises(DispatcherLocked):
            start(cfg, service)
    finally:
        d.stop()


def test_an_idle_dispatcher_keeps_scanning_and_sends_a_lone_click(tmp_path, service):
    cfg = config(tmp_path)
    state_dir = cfg.regions[0].state_dir
    service.add_queries([query_id(1)])
    d = start(cfg, service)
    try:
        since = time.time_ns() // 1000
        wait_until(lambda: (s := read_status(state_dir)) and s["caught_up"] and s["scan_at_us"] > since, 10,
                   message="a fresh caught-up status")
        assert read_status(state_dir)["scan_at_us"] <= time.time_ns() // 1000  # the system's wall clock
        append_lines(tmp_path / "logs" / "clicks" / "c.jsonl", [click_line(1)])
        wait_until(lambda: service.is_joined(click_id(1)), 5, message="the lone click joined")
        assert service.request_sizes == [1]
        since = time.time_ns() // 1000
        wait_until(lambda: (s := read_status(state_dir)) and s["caught_up"] and s["scan_at_us"] > since, 10,
                   message="caught up again after the click")
    finally:
        d.stop()


def test_a_hung_registry_delays_batches_by_the_lookup_deadline_only(tmp_path, service):
    cfg = config(tmp_path)
    service.add_queries(query_id(n) for n in range(300))
    registry = FakeRegistry(service)
    registry.answering.clear()
    append_lines(tmp_path / "logs" / "clicks" / "c.jsonl", [click_line(n) for n in range(300)])
    d = serve(cfg, "r1", ["127.0.0.1:1"], registry_client=registry, lookup_timeout_s=0.2,
              joiner_client=lambda a: FakeJoinerClient(a, service))
    try:
        wait_until(lambda: d.statistics().caught_up, 20, message="caught up without registry answers")
        assert len(service.joined) == 300 and d.statistics().lookup_failures >= 6
        registry.answering.set()  # the late answers are ignored: nothing is resolved twice
        append_lines(tmp_path / "logs" / "clicks" / "c.jsonl", [click_line(5)])
        wait_until(lambda: d.statistics().already_registered == 1 and d.statistics().caught_up, 10,
                   message="the repeated click dropped by the lookup")
    finally:
        registry.close()
        d.stop()
    assert max(service.joined.values()) == 1 and d.statistics().joined == 300


def test_output_written_after_the_last_checkpoint_is_not_written_again_after_a_crash(tmp_path, service):
    """A dispatcher that dies after writing unjoinable clicks and quarantine entries, but before its next
    checkpoint, reads those lines again when restarted; it must not write them twice."""
    cfg = config(tmp_path, unjoinable_after_s=0.3)
    region = cfg.regions[0]
    f = tmp_path / "logs" / "clicks" / "c.jsonl"
    checkpoint = tmp_path / "state" / "dispatcher" / "checkpoint.json"

    def run_until(unjoinable: int):
        d = start(cfg, service)
        try:
            wait_until(lambda: d.statistics().unjoinable == unjoinable and d.statistics().caught_up, 20,
                       message=f"{unjoinable} clicks given up")
        finally:
            d.stop()
        return d

    append_lines(f, [click_line(1), b"{bad one"])
    run_until(1)
    before_crash = checkpoint.read_bytes()
    append_lines(f, [click_line(2), b"{bad two"])
    run_until(2)
    checkpoint.write_bytes(before_crash)   # as if the run that wrote click 2 died before checkpointing it
    d = run_until(2)
    assert sorted(u["click_id"] for u in read_jsonl_dir(region.unjoinable_dir)) == [click_id(1), click_id(2)]
    assert sorted(b["raw"] for b in read_jsonl_dir(region.quarantine_dir)) == ["{bad one", "{bad two"]
    assert (d.unjoinable_repeats_skipped, d.quarantine.repeats_skipped) == (1, 1)
    checkpoint.unlink()                    # as if it died before its first checkpoint: all is read again
    d = run_until(2)
    assert sorted(u["click_id"] for u in read_jsonl_dir(region.unjoinable_dir)) == [click_id(1), click_id(2)]
    assert sorted(b["raw"] for b in read_jsonl_dir(region.quarantine_dir)) == ["{bad one", "{bad two"]
    assert (d.unjoinable_repeats_skipped, d.quarantine.repeats_skipped) == (2, 2)


def test_the_first_scan_reads_about_one_request_and_the_backlog_then_goes_in_backlog_batches(tmp_path, service):
    """At a cold start the first request carries about ``batch_size`` clicks (the first scan reads about that
    many lines, not the read-ahead's), so the first join waits for no backlog's worth of work; the scans after
    it read ahead as before and the backlog goes in requests of ``backlog_batch_size``; every click once."""
    path = write_config(tmp_path)
    path.write_text(path.read_text().replace("backlog_batch_size = 50", "backlog_batch_size = 400"))
    cfg = load_config(path)
    service.add_queries(query_id(n) for n in range(3000))
    append_lines(tmp_path / "logs" / "clicks" / "c-0001.jsonl", [click_line(n) for n in range(3000)])
    d = start(cfg, service)
    try:
        wait_until(lambda: len(service.joined) == 3000, 30, message="the backlog joined")
    finally:
        d.stop()
    assert max(service.joined.values()) == 1
    assert service.request_sizes[0] <= 50, service.request_sizes[:8]
    assert max(service.request_sizes) == 400, service.request_sizes


def held_until_opened(write, note=lambda *args: None):
    """``write`` held as a write waiting on the file system's journal: until the returned gate is set, each
    call (noted first by ``note``) sets ``entered`` and waits for the gate. Returns (held write, gate, entered)."""
    import threading
    gate, entered = threading.Event(), threading.Event()

    def held(*args):
        note(*args)
        if not gate.is_set():
            entered.set()
            gate.wait(30)
        write(*args)

    return held, gate, entered


def test_a_status_write_that_waits_on_the_file_system_does_not_hold_the_joins(tmp_path, service, monkeypatch):
    """status.json is a view: while its write waits (a rename behind the file system's journal), the loop
    goes on reading and sending joins; the status catches up once the write returns."""
    import dispatcher._shell as shell
    slow_write, gate, entered = held_until_opened(shell.write_status)
    monkeypatch.setattr(shell, "write_status", slow_write)
    cfg = config(tmp_path)
    clicks = tmp_path / "logs" / "clicks"
    service.add_queries(query_id(n) for n in range(200))
    d = start(cfg, service)
    try:
        wait_until(entered.is_set, 20, message="a status write started and waits")
        append_lines(clicks / "w1" / "c-0001.jsonl", [click_line(n) for n in range(200)])
        wait_until(lambda: len(service.joined) == 200, 20, message="clicks joined while the status write waits")
        assert not gate.is_set()
        gate.set()
        wait_until(lambda: (read_status(cfg.regions[0].state_dir) or {}).get("joined") == 200, 10,
                   message="the status caught up")
    finally:
        gate.set()
        d.stop()
    assert read_status(cfg.regions[0].state_dir)["joined"] == 200


def test_a_hand_off_writes_only_the_latest_item_or_waits_for_each_in_order():
    """The status thread's hand-off writes only the latest item given (never an older after a newer); given
    with ``wait``, as checkpoints are, every item is written, in order, and a write's error is raised to
    the giver."""
    import random
    import threading
    import dispatcher._shell as shell
    for wait in (False, True):
        written, gate = [], threading.Event()

        def record(item):
            gate.wait(10)
            written.append(item)

        rng = random.Random(7)
        h = shell._HandOff("test", record)
        try:
            shown = list(range(200))
            for n in shown:
                if rng.random() < 0.1:
                    gate.set()
                elif rng.random() < 0.1 and not wait:
                    gate.clear()
                if wait and rng.random() < 0.2:
                    gate.set()
                h.give(n, wait=wait)
            gate.set()
            wait_until(lambda: h.idle() and written and written[-1] == shown[-1], 10, message="the latest written")
        finally:
            gate.set()
            h.close(timeout=10)
        assert written == sorted(set(written)) and set(written) <= set(shown) and written[-1] == 199
        assert h.written == len(written)
        if wait:
            assert written == shown
        else:
            assert len(written) < len(shown)          # items given while one waited replaced each other

    def fail(item):
        raise OSError(f"disk gone at {item}")

    h = shell._HandOff("test", fail)
    try:
        h.give(1, wait=True)
        with pytest.raises(OSError, match="disk gone at 1"):
            h.give(2, wait=True)
    finally:
        h.close(timeout=10)


def test_a_checkpoint_write_that_waits_on_the_file_system_does_not_hold_the_joins_and_checkpoints_stay_in_order(
        tmp_path, service, monkeypatch):
    """The checkpoint's fsync waits on the checkpoint thread: while one is held, the loop goes on joining,
    hands over no second checkpoint (one at a time, in order), and after the write returns and the dispatcher
    stops, a restart resumes from the final checkpoint with nothing read twice."""
    from dispatcher._files import CheckpointFiles
    calls = []
    slow_append, gate, entered = held_until_opened(CheckpointFiles.append_delta,
                                                   lambda self, delta: calls.append(delta["written_at_us"]))
    monkeypatch.setattr(CheckpointFiles, "append_delta", slow_append)
    path = write_config(tmp_path)
    # a checkpoint every 3 s: the loop works on between the held one and the next, which it then waits to hand over
    path.write_text(path.read_text().replace("checkpoint_interval_s = 0.05", "checkpoint_interval_s = 3.0"))
    cfg = load_config(path)
    clicks = tmp_path / "logs" / "clicks"
    service.add_queries(query_id(n) for n in range(300))
    append_lines(clicks / "w1" / "c-0001.jsonl", [click_line(n) for n in range(100)])
    d = start(cfg, service)
    try:
        wait_until(entered.is_set, 20, message="a checkpoint journal write started and waits")
        entered_at, held = time.monotonic(), len(calls)
        append_lines(clicks / "w1" / "c-0001.jsonl", [click_line(n) for n in range(100, 300)])
        wait_until(lambda: len(service.joined) == 300, 20, message="clicks joined while the checkpoint waits")
        time.sleep(max(0.0, entered_at + 3.5 - time.monotonic()))   # the next checkpoint is due meanwhile
        assert len(calls) == held, "a second checkpoint was handed over while one was being written"
        gate.set()
        wait_until(lambda: len(calls) > held, 10, message="checkpoints go on once the write returns")
    finally:
        gate.set()
        d.stop()
    assert calls == sorted(calls)
    assert max(service.joined.values()) == 1
    requests = len(service.request_sizes)
    d = start(cfg, service)      # resumes from the final checkpoint: nothing is read or sent again
    try:
        wait_until(lambda: d.statistics().caught_up, 10, message="restarted")
        time.sleep(0.3)
        assert d.statistics().events_read == 300 and d.statistics().pending_bytes == 0
    finally:
        d.stop()
    assert len(service.request_sizes) == requests
    assert len(service.joined) == 300 and max(service.joined.values()) == 1
