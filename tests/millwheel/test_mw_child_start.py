"""Starting a child process of ``millwheel run`` (a master replica, a worker): a child that never says it
serves, or says something else and goes on running, is killed and named within the start's limit instead of
hanging the run (before: the first line was read without a limit, and a child that printed another line and
kept running made the run fail with an uncaught ``TimeoutExpired``)."""
from __future__ import annotations

import signal
import sys

import pytest

from millwheel._cluster import ChildDidNotStart, Processes

pytestmark = pytest.mark.timeout(60)
READY = "test child serving on "


def _child(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_child_that_says_it_serves_is_started_and_its_address_returned():
    procs = Processes()
    try:
        p, address = procs.start(_child(f"import sys, time; print({READY!r} + '127.0.0.1:1', flush=True); "
                                        "time.sleep(600)"), READY, timeout_s=30)
        assert address == "127.0.0.1:1" and p.poll() is None
    finally:
        assert procs.stop(timeout_s=5) == []


@pytest.mark.parametrize("code, named", [
    ("import time; time.sleep(600)", "had not said it serves 2 s after its start"),
    ("import time; print('warming up', flush=True); time.sleep(600)", "it said 'warming up'"),
], ids=["says-nothing", "says-something-else-and-runs-on"])
def test_a_child_that_does_not_say_it_serves_in_time_is_killed_and_named(code, named):
    procs = Processes()
    with pytest.raises(ChildDidNotStart) as e:
        procs.start(_child(code), READY, timeout_s=1.5)
    p = procs.procs[-1]
    assert p.returncode == -signal.SIGKILL        # killed, and reaped: nothing of it left running
    assert f"pid {p.pid}" in str(e.value) and named in str(e.value)


def test_a_child_that_exits_before_it_serves_is_named_with_its_status():
    procs = Processes()
    with pytest.raises(ChildDidNotStart) as e:
        procs.start(_child("import sys; sys.exit(7)"), READY, timeout_s=30)
    assert "exit 7" in str(e.value)
