"""Read-ahead is bounded by everything unresolved (queued, in flight and waiting for a retry): with every
join answered THROTTLED (as while the event store is stopped) over a large backlog, the dispatcher holds at
most ``max_unresolved`` + one scan's lines, in memory and in its checkpoint, and reads no further."""
from __future__ import annotations

from dispatcher._files import load_checkpoint
from dispatcher._shell import MIN_SCAN_BYTES
from photon import wait_until

from dispatcher_fakes import FakeJoinService
from dispatcher_helpers import append_lines, click_line, config, query_id
from test_dispatcher_shell import start


def test_a_stopped_event_store_over_a_large_backlog_keeps_unresolved_events_bounded(tmp_path):
    service = FakeJoinService()
    service.throttle_next = 10 ** 9            # every request THROTTLED: nothing can be decided
    cfg = config(tmp_path, extra="max_unresolved = 300")
    lines = [click_line(n) for n in range(5000)]
    append_lines(tmp_path / "logs" / "clicks" / "c.jsonl", lines)
    # one scan past the bound at most: its budget is about batch_size * max_in_flight lines (200) at the
    # first guess of 256 bytes a line, at least MIN_SCAN_BYTES
    bound = 300 + max(MIN_SCAN_BYTES, 200 * 256) // min(len(x) + 1 for x in lines) + 1
    d = start(cfg, service, registry=False)
    try:
        wait_until(lambda: service.requests >= 60 and d.statistics().retry_queue > 0, 30,
                   message="many throttled rounds")
        for _ in range(20):
            s = d.statistics()
            assert s.queued + s.in_flight + s.retry_queue <= bound
            assert s.events_read <= bound and s.pending_bytes > 0
        wait_until(lambda: load_checkpoint(tmp_path / "state" / "dispatcher") is not None, 10, message="checkpoint")
        assert len(load_checkpoint(tmp_path / "state" / "dispatcher")["events"]) <= bound
        service.throttle_next = 0
        service.add_queries(query_id(n) for n in range(5000))
        wait_until(lambda: len(service.joined) == 5000, 60, message="the whole backlog joined once allowed")
    finally:
        d.stop()
        service.close()
