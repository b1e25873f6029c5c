"""What a replica guards when it starts: one replica per data dir (the lock it holds on ``replica.lock`` for
its life); replicas started for a job (``registry_processes(config, job=...)``) refuse the pipeline's
commits but serve the job's lookups, deletes and exports; and a restarted replica answers no lookup before
it has caught up (never a stale "present" for an id deleted before the restart). Real replica processes on
free ports."""
from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from photon import IdGenerator, wait_until
import idregistry
from idregistry import RegistryClient

from registry_helpers import make_config

GEN = IdGenerator("10.8.8.8", 88)


def _spec(argv: list[str]) -> dict:
    return json.loads(argv[argv.index("--spec") + 1])


def _answers(client: RegistryClient, address: str) -> bool:
    return "error" not in client.replica_status(address, timeout=1.0)


@pytest.mark.timeout(90)
def test_a_second_replica_on_the_same_data_dir_refuses_to_start_naming_the_dir_and_the_holder(tmp_path, procs):
    config = make_config(tmp_path, replicas=1)
    (spec,) = idregistry.registry_processes(config)
    first = procs.start(spec.argv)
    client = RegistryClient([spec.address], retry_timeout_s=20)
    try:
        wait_until(lambda: _answers(client, spec.address), 30, interval=0.1, message="the first replica answers")
        data_dir = _spec(spec.argv)["data_dir"]
        lock = os.path.join(data_dir, idregistry.DATA_LOCK_FILE)
        assert Path(lock).read_text().split()[0] == str(first.pid)

        second = procs.start(spec.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        _, err = second.communicate(timeout=30)
        assert second.returncode == 73, err
        text = err.decode()
        assert f"registry data dir {data_dir} is in use by pid {first.pid} (registry replica s0-r0)" in text
        assert first.poll() is None and _answers(client, spec.address)        # the first never noticed

        os.kill(first.pid, signal.SIGKILL)                    # a dead holder's lock is gone with it
        first.wait(timeout=10)
        third = procs.start(spec.argv)
        wait_until(lambda: _answers(client, spec.address), 30, interval=0.1, message="a new replica answers")
        assert third.poll() is None and Path(lock).read_text().split()[0] == str(third.pid)
    finally:
        client.close()


@pytest.mark.timeout(90)
def test_replicas_started_for_a_job_refuse_commits_and_serve_lookups_deletes_and_exports(tmp_path, procs):
    config = make_config(tmp_path)
    gen = IdGenerator("10.8.8.8", 89)
    kept, dropped = gen.next_id(), gen.next_id()
    pipeline = [procs.start(s.argv) for s in idregistry.registry_processes(config)]
    client = RegistryClient(idregistry.registry_endpoints(config), retry_timeout_s=30)
    try:
        assert client.commit([kept, dropped], "t1") == [idregistry.CommitResult.OK] * 2
        _wait_every_replica_answers(client)     # a majority commits while the third may still be starting
    finally:
        client.close()
    for p in pipeline:
        p.send_signal(signal.SIGTERM)
    for p in pipeline:
        assert p.wait(timeout=30) == 0

    specs = idregistry.registry_processes(config, job="photon verify (pid 4242)")
    assert all(_spec(s.argv)["job"] == "photon verify (pid 4242)" for s in specs)
    for s in specs:
        procs.start(s.argv)
    client = RegistryClient(idregistry.registry_endpoints(config), retry_timeout_s=30)
    # refusals are retried until the budget is spent: a short one for the refused calls only
    refused = RegistryClient(idregistry.registry_endpoints(config), retry_timeout_s=2)
    try:
        wait_until(lambda: any(r.get("is_leader") for r in client.status()), 30, interval=0.2,
                   message="a leader among the job's replicas")
        assert client.lookup([kept, dropped, gen.next_id()]) == [True, True, False]
        assert {i for i, _, _ in client.export(0)} == {kept, dropped}
        assert client.delete(dropped, "t1") is True
        with pytest.raises(idregistry.RegistryUnavailable, match=r"runs only for photon verify \(pid 4242\): "
                                                                 r"commits are refused"):
            refused.commit([gen.next_id()], "t2")
        with pytest.raises(idregistry.RegistryUnavailable, match="clearing tokens is refused"):
            refused.clear_tokens([kept])
        assert [(i, t) for i, t, _ in client.export(0)] == [(kept, "t1")]      # nothing else changed
    finally:
        client.close()
        refused.close()


def _wait_every_replica_answers(client) -> None:
    """Until every replica answers its status (a majority elects and commits before the third has started)."""
    wait_until(lambda: all("error" not in r for r in client.status()), 30, interval=0.05,
               message="every replica answering")


def _saved_commit_index(spec) -> int:
    """The commit index a replica saved in its term/vote record (pysyncobj saves it once a second)."""
    import pysyncobj.journal
    path = Path(_spec(spec.argv)["data_dir"]) / "raft.journal.meta"
    return pysyncobj.journal.loads(path.read_bytes()).get("raftCommitIndex", 1)


@pytest.mark.timeout(120)
def test_a_restarted_replica_never_answers_present_for_an_id_deleted_just_before_it_stopped(tmp_path, procs):
    """pysyncobj saves a replica's commit index once a second, so after a restart its copy lacks the last
    committed operations until a leader commits an entry of its term. Lookups wait for that (UNAVAILABLE,
    which clients retry) instead of answering "present" for an id recovery deleted: a dispatcher would drop
    the re-injected click as already joined."""
    from idregistry import registry_pb2 as pb
    from idregistry import registry_pb2_grpc as pb_grpc
    import grpc
    from photon.rpc import open_channel
    config = make_config(tmp_path)
    gen = IdGenerator("10.8.8.8", 90)
    ids = [gen.next_id() for _ in range(20)]
    specs = idregistry.registry_processes(config)
    running = [procs.start(s.argv) for s in specs]
    client = RegistryClient(idregistry.registry_endpoints(config), retry_timeout_s=30)
    try:
        assert client.commit(ids, "t1") == [idregistry.CommitResult.OK] * len(ids)
        _wait_every_replica_answers(client)
        committed = {r["address"]: r["commit_index"] for r in client.status()}
        wait_until(lambda: all(_saved_commit_index(s) >= committed[s.address] for s in specs), 30, interval=0.05,
                   message="every replica saved a commit index covering the commits")
        assert all(client.delete(i, "t1") for i in ids)
        deleted = {r["address"]: r["commit_index"] for r in client.status()}
    finally:
        client.close()
    for p in running:                  # killed right after the deletes: the journal holds them, the index not
        p.kill()
    for p in running:
        p.wait(timeout=30)
    assert any(_saved_commit_index(s) < deleted[s.address] for s in specs), "no replica is behind: no test"

    for s in specs:
        procs.start(s.argv)
    stubs = [pb_grpc.RegistryStub(open_channel(s.address, [])) for s in specs]
    answers: list[tuple] = []

    def every_replica_answers() -> bool:
        row = []
        for stub in stubs:
            try:
                row.append(tuple(stub.Lookup(pb.LookupRequest(ids=ids), timeout=1.0).present))
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.UNAVAILABLE, e
                row.append(None)
        answers.append(tuple(row))
        return None not in row
    wait_until(every_replica_answers, 60, interval=0.02, message="every restarted replica answers lookups")
    assert not [a for row in answers for a in row if a is not None and any(a)]   # never "present"
    assert answers[-1] == ((False,) * len(ids),) * len(specs)
