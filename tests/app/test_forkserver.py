"""The fork server with the real supervisor: a service forked from the pre-imported parent runs as
``python -m`` would, is restarted forked after a SIGKILL, reports its exit status, stops in role order; a
fork server that dies takes its children with it and the supervisor starts them directly from then on."""
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from photon import ProcessSpec, wait_until
from photon.app import Supervisor
from photon.app._forkserver import ForkServer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROBE = textwrap.dedent("""
    import gc, os, signal, sys, threading, time
    preloaded = "grpc" in sys.modules and "joiner._server" in sys.modules   # before this module imports anything
    frozen = gc.get_freeze_count() > 10000            # the fork server's imports, never walked by a collection
    name, log = sys.argv[1], sys.argv[2]
    def on_term(*_):
        with open(log, "a") as f:
            f.write(name + "\\n")
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    if __name__ == "__main__":
        print(f"ready pid={os.getpid()} ppid={os.getppid()} preloaded={preloaded} "
              f"process={os.environ.get('PHOTON_PROCESS')} sid={os.getsid(0) == os.getpid()} "
              f"threads={threading.active_count()} argv0={os.path.basename(sys.argv[0])} "
              f"gc={gc.isenabled()} frozen={frozen}", flush=True)
        if len(sys.argv) > 3:
            sys.exit(int(sys.argv[3]))
        while True:
            time.sleep(0.05)
""")


@pytest.fixture
def forked(tmp_path):
    """A supervisor with a fork server whose interpreter can import the probe module ``fs_probe``."""
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "fs_probe.py").write_text(PROBE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(mods), REPO, os.environ.get("PYTHONPATH", "")])}
    messages = []
    server = ForkServer(env, tmp_path / "logs" / "forkserver.log", echo=messages.append)
    sup = Supervisor(tmp_path / "logs", tmp_path / "launcher.json", env=env, echo=messages.append, forkserver=server)
    sup.messages = messages
    server.start()
    try:
        yield sup
    finally:
        sup.stop(grace_s=5)
        server.close()


def _spec(tmp_path, name, role, *extra):
    return ProcessSpec(name, [sys.executable, "-m", "fs_probe", name, str(tmp_path / "stopped.txt"), *extra],
                       role, "a")


def _ready_lines(tmp_path, name) -> list[str]:
    log = tmp_path / "logs" / f"{name}.log"
    return [x for x in log.read_text().splitlines() if x.startswith("ready")] if log.exists() else []


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _state(tmp_path) -> dict:
    return json.loads((tmp_path / "launcher.json").read_text())


@pytest.mark.timeout(120)
def test_a_forked_service_is_killed_restarted_forked_and_stopped_in_order(tmp_path, forked):
    server = forked.forkserver
    roles = [("r0", "registry"), ("es", "eventstore"), ("j0", "joiner"), ("d", "dispatcher")]
    forked.ensure([_spec(tmp_path, n, r) for n, r in roles])
    wait_until(lambda: all(len(_ready_lines(tmp_path, n)) == 1 for n, _ in roles), 60, message="children ready")
    state = _state(tmp_path)
    assert state["forkserver_pid"] == server.pid
    first = forked.pid("j0")
    for name, _ in roles:
        pid = forked.pid(name)
        assert state["processes"][name]["forked"] is True and state["processes"][name]["pid"] == pid
        assert _ppid(pid) == server.pid                       # a child of the fork server, not of this process
        line = _ready_lines(tmp_path, name)[0]
        # its imports were done before it ran (and are frozen); its own session and environment; one thread;
        # run as -m would; the collector on, as in a fresh interpreter
        assert f"ready pid={pid} ppid={server.pid} preloaded=True process={name} sid=True threads=1 " \
               f"argv0=fs_probe.py gc=True frozen=True" == line, line

    os.kill(first, signal.SIGKILL)

    def restarted():
        forked.poll()
        return forked.pid("j0") not in (None, first)
    wait_until(restarted, 30, message="j0 restarted")
    wait_until(lambda: len(_ready_lines(tmp_path, "j0")) == 2, 30, message="restarted j0 ready")
    assert any(f"j0 (pid {first}) killed by SIGKILL" in m for m in forked.messages), forked.messages
    again = forked.pid("j0")
    assert _ppid(again) == server.pid and _state(tmp_path)["processes"]["j0"]["forked"] is True
    assert _state(tmp_path)["processes"]["j0"]["restarts"] == 1
    assert "preloaded=True" in _ready_lines(tmp_path, "j0")[1]

    forked.ensure([_spec(tmp_path, "quits", "joiner", "7")])        # an exit status comes through
    wait_until(lambda: (forked.poll(), any("quits" in m and "exited with status 7" in m
                                           for m in forked.messages))[1], 30, message="status 7 reported")

    forked.stop(grace_s=10)
    stopped = (tmp_path / "stopped.txt").read_text().split()
    assert stopped[:2] == ["d", "j0"] and stopped[-2:] == ["es", "r0"], stopped
    assert all(c.proc.poll() is not None for c in forked.children.values() if c.proc is not None)
    assert server.proc.wait(timeout=10) == 0                        # the fork server ends last, cleanly
    assert forked.children["r0"].proc.returncode == 0


@pytest.mark.timeout(120)
def test_children_end_with_a_killed_fork_server_and_are_started_directly_after(tmp_path, forked):
    server = forked.forkserver
    forked.ensure([_spec(tmp_path, "j0", "joiner"), _spec(tmp_path, "d", "dispatcher")])
    wait_until(lambda: all(_ready_lines(tmp_path, n) for n in ("j0", "d")), 60, message="children ready")
    old = {n: forked.pid(n) for n in ("j0", "d")}
    os.kill(server.pid, signal.SIGKILL)

    def restarted_directly():
        forked.poll()
        return all(forked.pid(n) not in (None, old[n]) for n in old)
    wait_until(restarted_directly, 60, message="both restarted")
    for name, pid in old.items():               # the old ones got SIGTERM with their parent and stopped
        wait_until(lambda pid=pid: not os.path.exists(f"/proc/{pid}"), 10, message=f"old {name} gone")
        assert any(f"{name} (pid {pid}) ended with its fork server" in m for m in forked.messages)
        assert _ppid(forked.pid(name)) == os.getpid()
        assert _state(tmp_path)["processes"][name]["forked"] is False
    assert _state(tmp_path)["forkserver_pid"] is None
    assert any("fork server has ended" in m and "starting processes directly" in m for m in forked.messages)
    wait_until(lambda: all(len(_ready_lines(tmp_path, n)) == 2 for n in old), 60, message="restarted ready")
    assert sorted((tmp_path / "stopped.txt").read_text().split()) == ["d", "j0"]   # SIGTERM, not SIGKILL


@pytest.mark.timeout(60)
def test_only_python_m_with_the_fork_servers_environment_is_forked(tmp_path):
    env = {**os.environ, "PYTHONPATH": REPO}
    server = ForkServer(env, tmp_path / "forkserver.log")
    argv = [sys.executable, "-m", "joiner.main", "--config", "x"]
    assert server.can_fork(argv, {**env, "PHOTON_PROCESS": "a-j0", "PHOTON_REGION": "a",
                                  "PHOTON_METRICS_ADDR": "127.0.0.1:1"})
    assert not server.can_fork(argv, {**env, "PHOTON_TEST_KILL_AFTER_COMMIT": "x"})   # read when imported
    assert not server.can_fork([sys.executable, "-c", "pass"], env)
    assert not server.can_fork([sys.executable, "-X", "importtime", "-m", "joiner.main"], env)
    assert not server.can_fork(["/usr/bin/python3", "-m", "joiner.main"], env)
    server.close()
    assert not server.can_fork(argv, env)                       # closed: processes start directly


@pytest.mark.timeout(180)
def test_photon_run_forks_every_service_restarts_a_killed_one_forked_and_stops_all(tmp_path, procs):
    from collections import Counter

    from photon import load_config, read_output_lines
    from photon.app import GenOptions, generate
    s = generate(GenOptions(out=str(tmp_path), queries=2000, seed=3))
    config = load_config(s.config)
    state = tmp_path / "state" / "a" / "launcher.json"
    with open(tmp_path / "launcher.log", "ab") as log:
        run = procs.python("-m", "photon.app.cli", "run", "--config", s.config, stdout=log, stderr=log)

    def listed():
        try:
            st = json.loads(state.read_text())
        except (OSError, ValueError):
            return None
        return st if st.get("forkserver_pid") and all(p["pid"] for p in st["processes"].values()) else None
    wait_until(listed, 60, message="every process listed")
    st = listed()
    server = st["forkserver_pid"]
    assert {p["role"] for p in st["processes"].values()} == {"registry", "eventstore", "joiner", "dispatcher"}
    for name, p in st["processes"].items():
        assert p["forked"] is True and _ppid(p["pid"]) == server, (name, p)
        room = p["argv"][2].split(".")[0]                     # it names itself after its room once forked
        wait_until(lambda p=p, room=room: Path(f"/proc/{p['pid']}/comm").read_text().strip() == room, 30,
                   message=f"{name} named {room}")
    joined = config.regions[0].joined_dir
    wait_until(lambda: list(read_output_lines(joined)), 60, message="a first committed join")
    first = st["processes"]["a-j0"]["pid"]
    os.kill(first, signal.SIGKILL)

    def restarted():
        p = (listed() or {"processes": {}})["processes"].get("a-j0", {})
        return p.get("pid") not in (None, first) and p.get("restarts") == 1 and p
    wait_until(restarted, 60, message="a-j0 restarted")
    assert restarted()["forked"] is True and _ppid(restarted()["pid"]) == server
    os.killpg(run.pid, signal.SIGTERM)                       # as Ctrl-C / systemd stop it
    # A joiner killed between registering clicks and committing their output leaves them lost until the
    # recovery job runs: the launcher then exits 5 and says so; otherwise it exits 0.
    code = run.wait(timeout=90)
    log_text = (tmp_path / "launcher.log").read_text()
    assert code in (0, 5), log_text[-3000:]
    assert (code == 5) == ("awaiting recovery (exit 5)" in log_text), log_text[-3000:]
    final = json.loads(state.read_text())
    for pid in [server, *(p["pid"] for p in st["processes"].values()), restarted_pid := final["processes"]["a-j0"]["pid"]]:
        wait_until(lambda pid=pid: not os.path.exists(f"/proc/{pid}"), 10, message=f"pid {pid} gone")
    assert restarted_pid not in (None, first)
    assert "killed by SIGKILL" in (tmp_path / "launcher.log").read_text()
    ids = Counter(json.loads(line)[config.join.foreign_id_field] for line in read_output_lines(joined))
    assert ids and max(ids.values()) == 1


@pytest.mark.timeout(120)
def test_an_early_fork_server_prints_nowhere_until_taken_and_ends_when_not_taken(tmp_path):
    from photon.app import _forkserver as fs
    log = tmp_path / "state" / "logs" / "forkserver.log"
    env = fs.checkout_env(os.environ)
    fs.start_early()                       # as `python -m photon.app.cli run` does before its own imports
    refused = fs._early.proc
    assert fs.take_early({**env, "PHOTON_TLS_CA": "ca.pem"}, log) is None     # another environment: not used
    wait_until(lambda: refused.poll() is not None, 10, message="the unused fork server ended")
    fs.start_early()
    discarded = fs._early.proc
    fs.discard_early()                     # no launcher took it (a config error, a held region)
    wait_until(lambda: discarded.poll() is not None, 10, message="the discarded fork server ended")
    assert not (tmp_path / "state").exists()

    fs.start_early()
    server = fs.take_early(env, log)
    try:
        assert server is not None and fs._early is None
        wait_until(lambda: server._sock is not None, 5)
        assert not log.exists()            # not before the launcher holds its state dirs
        server.start()                     # what the launcher calls once it holds them: the log is placed
        out = tmp_path / "child.out"
        with open(out, "wb") as f:
            child = server.spawn([sys.executable, "-m", "json.tool", "--help"], env, f.fileno())
        assert child.wait(timeout=60) == 0 and "usage" in out.read_text()
        # what it printed before its log was placed (into memory) is in the log, then what came after
        wait_until(lambda: log.exists() and "preloaded" in log.read_text(), 30, message="its log")
        lines = log.read_text().splitlines()
        assert lines[0].startswith("fork server serving on its socket") and "at monotonic" in lines[0], lines
    finally:
        if server is not None:
            server.close()


@pytest.mark.timeout(60)
def test_the_registry_is_forked_before_the_other_rooms_are_imported_and_they_before_their_own(tmp_path):
    """The fork server serves once :data:`PRELOAD_FIRST` is imported; a request for a later room's main
    module imports it first (a second request for it, nothing), one for any other module everything still
    to come (checked in a fresh interpreter, which has imported nothing of Photon's)."""
    script = textwrap.dedent("""
        import sys
        from photon.app._forkserver import PRELOAD_FIRST, PRELOAD_LATER, _Preloader
        for name in PRELOAD_FIRST:
            __import__(name)
        p = _Preloader(PRELOAD_LATER)
        p.ensure("idregistry.main")
        assert p.pending == list(PRELOAD_LATER) and "joiner.main" not in sys.modules, p.pending
        p.ensure("joiner.main")
        assert "joiner.main" in sys.modules and p.pending == ["eventstore.main", "dispatcher.main"], p.pending
        assert "dispatcher.main" not in sys.modules
        p.ensure("joiner.main")       # a second joiner: its room is imported, nothing else is waited for
        assert p.pending == ["eventstore.main", "dispatcher.main"], p.pending
        p.ensure("fs_probe")
        assert p.pending == [] and "dispatcher.main" in sys.modules and not p.unsafe
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": REPO}, capture_output=True,
                       text=True, timeout=50, check=False)
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == "ok", r.stderr[-3000:]


@pytest.mark.timeout(120)
def test_a_photon_run_refused_for_a_held_region_writes_nothing_there(tmp_path, procs):
    """The fork server starts before the launcher reads its config; a launcher then refused (the region is
    held) leaves no fork-server log (nor anything else) in that region's state dir."""
    from photon import hold_lock, load_config
    from photon.app import GenOptions, generate
    from photon.app._regions import LOCK_FILE
    s = generate(GenOptions(out=str(tmp_path), queries=200, seed=3))
    state_dir = Path(load_config(s.config).regions[0].state_dir)
    held = hold_lock(state_dir / LOCK_FILE, "photon verify")
    try:
        before = sorted(p.name for p in state_dir.iterdir())
        run = procs.python("-m", "photon.app.cli", "run", "--config", s.config, stderr=subprocess.PIPE)
        _, err = run.communicate(timeout=60)
        assert run.returncode == 4 and b"already run by photon verify" in err, err
        assert sorted(p.name for p in state_dir.iterdir()) == before == [LOCK_FILE]
    finally:
        held.close()


@pytest.mark.timeout(60)
def test_a_module_imported_while_serving_that_leaves_a_thread_stops_the_forking(tmp_path):
    """Once a module imported while serving has started a thread, forking is no longer safe: every request
    is then answered with an error (the launcher starts that process directly)."""
    (tmp_path / "threaded_mod.py").write_text("import threading, time\n"
                                              "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n")
    script = textwrap.dedent("""
        from photon.app._forkserver import _Preloader
        p = _Preloader(["json", "threaded_mod"])
        p.next()
        assert not p.unsafe, p.unsafe
        p.next()
        assert p.pending == [] and p.unsafe.startswith("2 threads after importing threaded_mod"), p.unsafe
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": f"{tmp_path}:{REPO}"},
                       capture_output=True, text=True, timeout=50, check=False)
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == "ok", (r.stdout, r.stderr[-3000:])


@pytest.mark.timeout(60)
def test_a_supervisor_asks_the_fork_server_for_every_new_process_before_it_awaits_an_answer(tmp_path):
    """``ensure`` sends every fork request before it reads the first answer, so the fork server forks them
    back to back (asked one by one, each next request waited behind the import of a later room's modules,
    which the fork server does whenever no request waits). Here a stand-in for the fork server answers only
    once it holds every request (or after 5 s, having seen fewer); an answer that is an error starts that
    process directly, the others stay forked, in the order asked."""
    import socket
    import threading

    from photon.app._forkserver import _send
    env = dict(os.environ)
    server = ForkServer(env)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    stand_ins = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
    server.proc, server._sock = stand_ins[0], ours          # as if started: the stand-in below answers
    names = ["r0", "r1", "r2", "j0"]
    seen: list = []

    def fork_server() -> None:
        requests = []
        theirs.settimeout(5.0)
        try:
            while len(requests) < len(names):
                data, fds, _, _ = socket.recv_fds(theirs, 1 << 20, 4)
                requests.append(json.loads(data))
                for fd in fds:
                    os.close(fd)
        except TimeoutError:
            pass
        seen.append(len(requests))
        forked = iter(stand_ins)
        for request in requests:
            if request["env"]["PHOTON_PROCESS"] == "r2":
                _send(theirs, {"id": request["id"], "error": "no fork for this one"})
                continue
            child = next(forked)
            pidfd = os.pidfd_open(child.pid)
            _send(theirs, {"id": request["id"], "pid": child.pid}, [pidfd])
            os.close(pidfd)

    peer = threading.Thread(target=fork_server, daemon=True)
    peer.start()
    messages = []
    sup = Supervisor(tmp_path / "logs", tmp_path / "launcher.json", env=env, echo=messages.append, forkserver=server)
    try:
        sup.ensure([ProcessSpec(n, [sys.executable, "-m", "json.tool", "--help"], "registry", "a") for n in names])
        peer.join(10)
        assert seen == [len(names)], seen
        state = _state(tmp_path)["processes"]
        assert [state[n]["forked"] for n in names] == [True, True, False, True], state
        assert [state[n]["pid"] for n in ("r0", "r1", "j0")] == [p.pid for p in stand_ins], state
        assert state["r2"]["pid"] not in {p.pid for p in stand_ins}
        assert any("r2: no fork for this one; starting it directly" in m for m in messages), messages
    finally:
        for p in stand_ins:
            p.kill()
            p.wait()
        sup.children["r2"].proc.wait(timeout=30)
        theirs.close()
        server.close()


@pytest.mark.timeout(60)
def test_a_direct_start_that_fails_leaves_no_forked_process_untracked(tmp_path):
    """Of one ``ensure``, the processes the fork server forked are tracked before any is started directly: a
    direct start that raises (here a program that does not exist) leaves each forked one with its pid, never a
    forked process the supervisor would start a second time."""
    import socket
    import threading

    from photon.app._forkserver import _send
    env = dict(os.environ)
    server = ForkServer(env)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    stand_in = subprocess.Popen(["sleep", "60"])
    server.proc, server._sock = stand_in, ours

    def fork_server() -> None:
        data, fds, _, _ = socket.recv_fds(theirs, 1 << 20, 4)
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(stand_in.pid)
        _send(theirs, {"id": json.loads(data)["id"], "pid": stand_in.pid}, [pidfd])
        os.close(pidfd)

    threading.Thread(target=fork_server, daemon=True).start()
    sup = Supervisor(tmp_path / "logs", tmp_path / "launcher.json", env=env, echo=lambda m: None, forkserver=server)
    try:
        with pytest.raises(OSError):
            sup.ensure([ProcessSpec("direct", [str(tmp_path / "no-such-program")], "registry", "a"),
                        ProcessSpec("forked", [sys.executable, "-m", "json.tool", "--help"], "joiner", "a")])
        assert sup.children["forked"].proc is not None and sup.children["forked"].proc.pid == stand_in.pid
        assert sup.pid("forked") == stand_in.pid
    finally:
        stand_in.kill()
        stand_in.wait()
        theirs.close()
        server.close()
