"""The supervisor with real child processes: a killed child is restarted, and stop goes role by role."""
import os
import signal
import sys
import textwrap

import pytest

from photon import wait_until
from photon import ProcessSpec
from photon.app import Supervisor

CHILD = textwrap.dedent("""
    import signal, sys, time
    name, log = sys.argv[1], sys.argv[2]
    def on_term(*_):
        with open(log, "a") as f:
            f.write(name + "\\n")
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    print("ready", flush=True)
    while True:
        time.sleep(0.05)
""")


@pytest.fixture
def supervisor(tmp_path):
    messages = []
    sup = Supervisor(tmp_path / "logs", tmp_path / "launcher.json", echo=messages.append)
    sup.messages = messages
    yield sup
    sup.stop(grace_s=5)


def _ready(tmp_path, name) -> int:
    log = tmp_path / "logs" / f"{name}.log"
    return log.read_text().count("ready") if log.exists() else 0


def _spec(tmp_path, name, role):
    return ProcessSpec(name, [sys.executable, "-c", CHILD, name, str(tmp_path / "stopped.txt")], role, "a")


@pytest.mark.timeout(60)
def test_killed_child_is_restarted_and_stop_goes_in_role_order(tmp_path, supervisor):
    roles = [("r0", "registry"), ("es", "eventstore"), ("j0", "joiner"), ("d", "dispatcher")]
    supervisor.ensure([_spec(tmp_path, n, r) for n, r in roles])
    first = supervisor.pid("j0")
    assert first and all(supervisor.pid(n) for n, _ in roles)
    wait_until(lambda: all(_ready(tmp_path, n) == 1 for n, _ in roles), 20, message="children ready")
    os.kill(first, signal.SIGKILL)

    def restarted():
        supervisor.poll()
        return supervisor.pid("j0") not in (None, first)
    wait_until(restarted, 20, message="j0 restarted")
    wait_until(lambda: _ready(tmp_path, "j0") == 2, 20, message="restarted j0 ready")
    assert any("j0" in m and "killed by SIGKILL" in m for m in supervisor.messages)
    import json
    state = json.loads((tmp_path / "launcher.json").read_text())
    assert state["processes"]["j0"]["restarts"] == 1 and state["processes"]["j0"]["pid"] == supervisor.pid("j0")
    supervisor.ensure([_spec(tmp_path, "d", "dispatcher")])     # a known name is not started twice
    assert len(supervisor.children) == 4
    supervisor.stop(grace_s=10)
    assert (tmp_path / "stopped.txt").read_text().split() == ["d", "j0", "es", "r0"]
    assert all(c.proc.poll() is not None for c in supervisor.children.values())


@pytest.mark.timeout(60)
def test_a_child_that_ignores_sigterm_is_killed_after_the_grace(tmp_path, supervisor):
    stubborn = ProcessSpec("stubborn", [sys.executable, "-c",
                                        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                        "print('ready', flush=True)\ntime.sleep(60)"], "joiner")
    supervisor.ensure([stubborn])
    log = tmp_path / "logs" / "stubborn.log"
    wait_until(lambda: log.exists() and b"ready" in log.read_bytes(), 20, message="child ready")
    supervisor.stop(grace_s=1)
    assert supervisor.children["stubborn"].proc.returncode == -signal.SIGKILL
    assert any("did not stop" in m for m in supervisor.messages)
