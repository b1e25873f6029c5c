"""The batcher's waiting and answering: concurrent requests leave as one command and each gets its own
result; a failed command fails each of its requests; a request never answered times out; closing fails
what is still queued. Commands are applied to a real ShardState in a thread of their own, as Raft's
thread does."""
from __future__ import annotations

import queue
import threading

import pytest

from idregistry._batcher import QUEUE_FULL, Batcher, Rejected
from idregistry._state import OP_COMMIT, CommitResult, ShardState
from photon import wait_until


class _Applier:
    """``submit(ops, callback)``: applies each command in its own thread once ``gate`` is open (or fails
    it with ``fail_with``)."""

    def __init__(self) -> None:
        self.state = ShardState(0)
        self.gate = threading.Event()
        self.gate.set()
        self.fail_with = 0
        self.commands: list[int] = []
        self.held: queue.SimpleQueue = queue.SimpleQueue()

    def submit(self, ops, callback) -> None:
        self.commands.append(len(ops))

        def run() -> None:
            self.gate.wait(30)
            if self.fail_with:
                callback(None, self.fail_with)
            else:
                callback(self.state.apply(ops), 0)
        threading.Thread(target=run, daemon=True).start()


def _ids(n: int, pid: int) -> list[str]:
    return [f"10.6.6.6:{pid}:17637120{k:08d}" for k in range(1, n + 1)]


@pytest.mark.timeout(60)
def test_concurrent_requests_share_a_command_and_each_gets_its_result():
    applier = _Applier()
    b = Batcher(applier.submit, lambda reason: reason == QUEUE_FULL, max_in_flight=1)
    try:
        applier.gate.clear()                       # the first command stays in flight: the rest queue up
        results: dict[int, bytes] = {}
        threads = [threading.Thread(target=lambda k=k: results.__setitem__(
            k, b.run((OP_COMMIT, f"t{k % 2}", _ids(3, 1 + k % 4)), 3)), daemon=True) for k in range(8)]
        for t in threads:
            t.start()
        wait_until(lambda: b.queue_depth() + sum(applier.commands) >= 8 and len(applier.commands) >= 1, 10,
                   message="every request queued or submitted")
        applier.gate.set()
        for t in threads:
            t.join(30)
        assert sorted(results) == list(range(8))
        assert len(applier.commands) < 8, "queued requests left one command each"
        # requests k and k + 4 carry the same ids with the same token: both are OK, in one command or two
        assert all(r == bytes([CommitResult.OK.value]) * 3 for r in results.values()), results
        assert all(applier.state.contains(i) for k in range(4) for i in _ids(3, 1 + k))
    finally:
        b.close()


@pytest.mark.timeout(60)
def test_a_failed_command_fails_every_request_and_an_unanswered_one_times_out():
    applier = _Applier()
    b = Batcher(applier.submit, lambda reason: reason == QUEUE_FULL)
    try:
        applier.fail_with = QUEUE_FULL
        with pytest.raises(Rejected) as e:
            b.run((OP_COMMIT, "t", _ids(2, 9)), 2)
        assert e.value.overloaded and e.value.reason == QUEUE_FULL
        applier.fail_with = 0
        applier.gate.clear()
        with pytest.raises(TimeoutError):
            b.run((OP_COMMIT, "t", _ids(2, 10)), 2, timeout=0.3)
        applier.gate.set()
        assert b.run((OP_COMMIT, "t", _ids(2, 11)), 2) == bytes([CommitResult.OK.value]) * 2
    finally:
        b.close()


@pytest.mark.timeout(60)
def test_closing_fails_what_is_still_queued():
    applier = _Applier()
    b = Batcher(applier.submit, lambda reason: False, max_in_flight=1)
    applier.gate.clear()
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            b.run((OP_COMMIT, "t", _ids(1, 20 + k)), 1, timeout=20)
        except BaseException as e:       # noqa: BLE001 (collected for the assertion)
            errors.append(e)
    threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(4)]
    threads[0].start()
    wait_until(lambda: len(applier.commands) == 1, 10, message="the first command in flight")
    for t in threads[1:]:
        t.start()
    wait_until(lambda: b.queue_depth() == 3, 10, message="three requests queued behind it")
    b.close()
    for t in threads[1:]:
        t.join(10)
    assert len(errors) == 3 and all(isinstance(e, Rejected) and not e.overloaded for e in errors), errors
    applier.gate.set()
    threads[0].join(10)
    assert len(errors) == 3, "the request in flight was answered after all"


@pytest.mark.timeout(60)
def test_closing_while_every_slot_is_in_flight_stops_the_loop_and_fails_the_queued():
    applier = _Applier()
    b = Batcher(applier.submit, lambda reason: reason == QUEUE_FULL, max_in_flight=1)
    applier.gate.clear()                           # the one command in flight is never answered before close
    outcomes: dict[str, object] = {}

    def request(name: str, pid: int) -> None:
        try:
            outcomes[name] = b.run((OP_COMMIT, "t", _ids(2, pid)), 2, timeout=30)
        except Exception as e:  # noqa: BLE001  (what the test looks at)
            outcomes[name] = e

    first = threading.Thread(target=request, args=("in flight", 1), daemon=True)
    first.start()
    wait_until(lambda: len(applier.commands) == 1, 10, message="the first command submitted")
    queued = threading.Thread(target=request, args=("queued", 2), daemon=True)
    queued.start()
    wait_until(lambda: b.queue_depth() == 1, 10, message="the second request queued behind the full slots")
    b.close()
    queued.join(10)
    assert isinstance(outcomes["queued"], Rejected)
    applier.gate.set()                             # the command in flight still answers its request
    first.join(10)
    assert len(applier.commands) == 1, "a command was submitted after close"
    with pytest.raises(Rejected):
        b.run((OP_COMMIT, "t", _ids(2, 3)), 2, timeout=5)
    assert outcomes["in flight"] == bytes([CommitResult.OK, CommitResult.OK])


@pytest.mark.timeout(60)
def test_a_completion_submits_what_queued_behind_it_before_answering_and_no_thread_of_its_own():
    applier = _Applier()
    submitted_by: list[str] = []
    plain_submit = applier.submit

    def submit(ops, callback) -> None:
        submitted_by.append(threading.current_thread().name)
        plain_submit(ops, callback)
    answered_before_next: list[bool] = []
    b = Batcher(submit, lambda reason: False, max_in_flight=1,
                deliver=lambda answer: (answered_before_next.append(len(applier.commands) < 2), answer()))
    try:
        applier.gate.clear()
        outcomes: dict[int, bytes] = {}
        first = threading.Thread(target=lambda: outcomes.__setitem__(1, b.run((OP_COMMIT, "t", _ids(2, 31)), 2)),
                                 name="handler-1", daemon=True)
        first.start()
        wait_until(lambda: len(applier.commands) == 1, 10, message="the first command submitted")
        second = threading.Thread(target=lambda: outcomes.__setitem__(2, b.run((OP_COMMIT, "t", _ids(2, 32)), 2)),
                                  name="handler-2", daemon=True)
        second.start()
        wait_until(lambda: b.queue_depth() == 1, 10, message="the second request queued behind the full slot")
        applier.gate.set()
        first.join(10)
        second.join(10)
        assert outcomes == {1: bytes([CommitResult.OK] * 2), 2: bytes([CommitResult.OK] * 2)}
        assert submitted_by[0] == "handler-1"      # a free slot: the request's own thread submits it
        assert submitted_by[1] not in ("handler-1", "handler-2"), submitted_by   # the completing thread did
        assert answered_before_next == [False, False], "the first answer went out before the next command"
        assert not any(t.name.startswith("registry-batcher") for t in threading.enumerate())
    finally:
        b.close()
