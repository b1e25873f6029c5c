"""The registry for verify/recover/export when no pipeline runs it (``registry_for_job``): a running registry
is used as it is; with none answering, every replica is started from its data for the job only (pipeline
commits refused, no ``photon run`` and no second replica beside it) and stopped at the end, also when the
job fails or gets SIGTERM; replicas whose data is not on this machine, a ``photon run`` or another job
holding the regions are named. Real replica processes on free ports."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import idregistry
from photon import IdGenerator, load_config, lock_holder, wait_until
from photon.app import JobRegistryError, registry_for_job
from photon.app._jobregistry import RUNNING, STARTED, WAITING, answering

GEN = IdGenerator("10.9.9.9", 99)
REGIONS = ("a", "b", "c")            # 5 replicas per shard, spread 2/2/1


def make_config(root: Path):
    text = "".join(f'[[regions]]\nname = "{r}"\nlog_root = "logs/{r}"\noutput_root = "out/{r}"\n'
                   f'state_dir = "state/{r}"\n' for r in REGIONS)
    (root / "photon.toml").write_text(text)
    for r in REGIONS:
        for stream in ("queries", "clicks"):
            (root / "logs" / r / stream).mkdir(parents=True, exist_ok=True)
    return load_config(root / "photon.toml")


def job_pids(config) -> list[int]:
    state = json.loads((config.verify_dir / "job-registry" / "processes.json").read_text())
    return [p["pid"] for p in state["processes"].values() if p["pid"]]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def hold(procs, path: Path, what: str) -> subprocess.Popen:
    """Another process holding ``path``'s lock as ``what`` until its stdin closes."""
    p = procs.python("-c", "import sys; from photon import hold_lock; f = hold_lock(sys.argv[1], sys.argv[2]); "
                     "print('held', flush=True); sys.stdin.read()", str(path), what,
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert p.stdout.readline().strip() == b"held"
    return p


@pytest.mark.timeout(180)
def test_with_no_replica_answering_the_job_runs_the_registry_from_its_data_for_its_duration_only(tmp_path, procs):
    config = make_config(tmp_path)
    ids = [GEN.next_id() for _ in range(3)]
    pipeline = [procs.start(s.argv) for s in idregistry.registry_processes(config)]   # as photon run would
    client = idregistry.RegistryClient(idregistry.registry_endpoints(config), retry_timeout_s=30)
    try:
        assert client.commit(ids, "t1") == [idregistry.CommitResult.OK] * 3
    finally:
        client.close()
    said: list[str] = []
    with registry_for_job(config, "photon verify", echo=said.append) as mode:      # a registry runs: used
        assert mode == RUNNING and said == []
    places = idregistry.replica_places(config)
    # a majority elects and commits while the others may still be starting (a SIGTERM before a replica has
    # installed its handler ends it by the signal): stop them once every one answers
    wait_until(lambda: len(answering(places)) == len(places), 60, interval=0.1, message="every replica answering")
    for p in pipeline:
        p.send_signal(signal.SIGTERM)
    for p in pipeline:
        assert p.wait(timeout=30) == 0
    assert len(places) == 5 and answering(places) == []

    with registry_for_job(config, "photon verify", echo=said.append) as mode:
        assert mode == STARTED
        assert said[0].startswith("registry not running: starting its 5 replicas from ")
        assert all(str(p.data_dir.parent.parent) in said[0] for p in places)
        assert said[1].startswith("leader elected after ")
        pids = job_pids(config)
        assert len(pids) == 5 and all(alive(pid) for pid in pids)
        client = idregistry.RegistryClient(idregistry.registry_endpoints(config), retry_timeout_s=2)
        try:
            assert {i for i, _, _ in client.export(0)} == set(ids)
            assert client.delete(ids[0], "t1") is True
            with pytest.raises(idregistry.RegistryUnavailable, match="runs only for photon verify"):
                client.commit([GEN.next_id()], "t2")                     # pipeline traffic is refused
        finally:
            client.close()
        run = subprocess.run([sys.executable, "-m", "photon.app.cli", "run", "--config", str(config.path)],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 4, run.stderr
        assert f"region 'a' is already run by photon verify (pid {os.getpid()})" in run.stderr
        launcher_replica = idregistry.registry_processes(config)[0]    # what a launcher would start now
        second = subprocess.run(launcher_replica.argv, capture_output=True, text=True, timeout=60)
        assert second.returncode == 73
        assert (f"registry data dir {places[0].data_dir} is in use by pid {pids[0]} (registry replica s0-r0 "
                f"for photon verify (pid {os.getpid()}))") in second.stderr
    assert said[2].startswith("registry stopped (5 replicas, up ")
    assert not any(alive(pid) for pid in pids)
    assert lock_holder(Path(config.region("a").state_dir) / "launcher.lock") is None
    assert all(lock_holder(p.data_dir / idregistry.DATA_LOCK_FILE) is None for p in places)

    for interrupt in (lambda: os.kill(os.getpid(), signal.SIGTERM), lambda: 1 / 0):   # SIGTERM, a failing job
        with pytest.raises((KeyboardInterrupt, ZeroDivisionError)):
            with registry_for_job(config, "photon recover", echo=said.append):
                pids = job_pids(config)
                interrupt()
                wait_until(lambda: False, 5, message="the signal")           # SIGTERM is raised here
        assert said[-1].startswith("registry stopped") and not any(alive(pid) for pid in pids)
    assert answering(places) == []
    with registry_for_job(config, "photon registry export", echo=said.append):   # the data survived all that
        client = idregistry.RegistryClient(idregistry.registry_endpoints(config), retry_timeout_s=10)
        try:
            assert {i for i, _, _ in client.export(0)} == set(ids[1:])
        finally:
            client.close()


@pytest.mark.timeout(60)
def test_replicas_whose_data_is_not_on_this_machine_are_named_and_nothing_starts(tmp_path):
    config = make_config(tmp_path)
    places = idregistry.replica_places(config)
    for p in places:
        if p.region == "a":                   # this machine has region a's replicas; b's and c's are elsewhere
            p.data_dir.mkdir(parents=True)
    said: list[str] = []
    with pytest.raises(JobRegistryError) as e:
        with registry_for_job(config, "photon verify", echo=said.append):
            pytest.fail("the job ran without a registry")
    text = str(e.value)
    for p in places:
        named = f"shard 0 replica {p.replica} (region {p.region}, {p.grpc_address}): no data dir {p.data_dir}"
        assert (named in text) == (p.region != "a"), text
    assert said == [] and not (config.verify_dir / "job-registry").exists()
    assert lock_holder(Path(config.region("a").state_dir) / "launcher.lock") is None


@pytest.mark.timeout(60)
def test_a_photon_run_here_is_waited_for_and_another_job_is_named(tmp_path, procs):
    config = make_config(tmp_path)
    lock = Path(config.region("a").state_dir) / "launcher.lock"
    holder = hold(procs, lock, "photon run")
    said: list[str] = []
    with registry_for_job(config, "photon verify", echo=said.append) as mode:
        assert mode == WAITING
    assert said == [f"no registry replica answers; photon run (pid {holder.pid}) runs here and restarts them: "
                    f"waiting for them"]
    assert not (config.verify_dir / "job-registry").exists()
    holder.stdin.close()
    holder.wait(timeout=10)

    other = hold(procs, lock, "photon recover")
    with pytest.raises(JobRegistryError, match=rf"photon recover \(pid {other.pid}\) holds this machine's regions"):
        with registry_for_job(config, "photon verify", echo=said.append):
            pytest.fail("the job ran beside another job's registry")


@pytest.mark.timeout(300)
def test_a_verify_stopped_by_sigterm_in_its_spark_job_says_so_without_a_stack(tmp_path):
    """``photon verify`` with no pipeline running, SIGTERMed while its Spark job runs (after the registry
    export is written): it stops the registry it started, says it was interrupted and exits 130, and py4j's
    record of the interrupted call (a Python stack on stderr) is not shown. Real processes throughout."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cli = [sys.executable, "-m", "photon.app.cli"]
    subprocess.run([*cli, "gen", "--out", str(tmp_path), "--queries", "300"], check=True, capture_output=True,
                   timeout=60)
    config = str(tmp_path / "photon.toml")
    r = subprocess.run([*cli, "run", "--config", config, "--until-caught-up", "--timeout", "120"],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    verify_dir = load_config(config).verify_dir
    before = set(verify_dir.glob("export-*")) if verify_dir.exists() else set()
    log = tmp_path / "verify.err"
    with open(log, "w") as err:
        p = subprocess.Popen([*cli, "verify", "--config", config], stdout=subprocess.DEVNULL, stderr=err, env=env)
        try:
            wait_until(lambda: any((d / "_export.json").exists() for d in set(verify_dir.glob("export-*")) - before)
                       or p.poll() is not None, 120, message="verify's registry export")
            assert p.poll() is None, log.read_text()[-2000:]
            p.send_signal(signal.SIGTERM)
            assert p.wait(timeout=60) == 130, log.read_text()[-2000:]
        finally:
            if p.poll() is None:
                p.kill()
    text = log.read_text()
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    assert "registry stopped" in text and "photon verify: interrupted" in text, text[-3000:]
    wait_until(lambda: not any(alive(pid) for pid in job_pids(load_config(config))), 30,
               message="the job's replicas to exit")


@pytest.mark.timeout(240)
def test_a_config_whose_pipeline_never_ran_says_nothing_was_registered(tmp_path):
    """``photon verify`` / ``recover`` on a config never run (no registry data on this machine): exit 5 with
    a message that says nothing was ever registered and names the state dir, not only "start the registry
    where its data is". Real processes; nothing is started."""
    cli = [sys.executable, "-m", "photon.app.cli"]
    subprocess.run([*cli, "gen", "--out", str(tmp_path), "--queries", "100"], check=True, capture_output=True,
                   timeout=60)
    config = load_config(tmp_path / "photon.toml")
    for job in ("verify", "recover"):
        r = subprocess.run([*cli, job, "--config", str(tmp_path / "photon.toml")], capture_output=True, text=True,
                           timeout=180)
        assert r.returncode == 5, r.stderr[-2000:]
        assert f"photon {job}: nothing was ever registered here" in r.stderr, r.stderr[-2000:]
        assert f"state dir {config.regions[0].state_dir} here" in r.stderr, r.stderr[-2000:]
        assert "Traceback" not in r.stderr and not (config.verify_dir / "job-registry").exists()
