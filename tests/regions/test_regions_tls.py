"""TLS between regions: the pipeline runs with mutual TLS on every gRPC connection and a secret on Raft;
a client without a certificate signed by the CA is refused; a replica without the Raft secret cannot join
its group."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import grpc
import pytest

import idregistry
from photon import load_config, tls_env, wait_until
from photon.app import make_certs
from regions_helpers import joinable, regions_workload, union_joined, wait_all_joined

PROBE_ID = "10.0.0.1:1:" + "1" * 16


def _lookup_with(env: dict, address: str) -> None:
    """Look an id up in a fresh process whose TLS is set by ``env`` (raises on refusal)."""
    code = ("import idregistry,sys; c=idregistry.RegistryClient([sys.argv[1]], retry_timeout_s=3); "
            f"print(c.lookup([{PROBE_ID!r}]))")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PHOTON_TLS") and not k.startswith("PHOTON_RAFT")}
    r = subprocess.run([sys.executable, "-c", code, address], env={**clean, **env}, capture_output=True, text=True,
                       timeout=60)
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "failed")


@pytest.mark.timeout(240)
def test_pipeline_over_mutual_tls_and_clients_without_a_signed_certificate_are_refused(tmp_path, region_run):
    paths = make_certs(tmp_path / "certs")
    rogue = make_certs(tmp_path / "rogue")            # a certificate from another CA
    tls = {k: paths[k] for k in ("ca", "cert", "key", "raft_secret_file")}
    config_path = regions_workload(tmp_path, regions=("a", "b"), queries=2000, tls=tls)
    config = load_config(config_path)
    runs = [region_run(config_path, n).start() for n in ("a", "b")]
    expected = joinable(tmp_path)
    wait_all_joined(config, expected, 150, runs=runs)
    address = idregistry.registry_endpoints(config, ["a"], near="a")[0]
    _lookup_with(tls_env(config), address)                                   # the right certificate: served
    with pytest.raises(RuntimeError):
        _lookup_with({}, address)                                            # no TLS at all
    with pytest.raises(RuntimeError):                                        # trusts the CA, wrong client cert
        _lookup_with({**tls_env(config), "PHOTON_TLS_CERT": rogue["cert"], "PHOTON_TLS_KEY": rogue["key"]}, address)
    with pytest.raises(RuntimeError):                                        # no client certificate at all
        _lookup_with({**tls_env(config), "PHOTON_TLS_CERT": "/dev/null", "PHOTON_TLS_KEY": "/dev/null"}, address)
    joiner_addr = next(p["argv"] for n, p in runs[0].processes().items() if n == "a-j0")
    port = joiner_addr[joiner_addr.index("--port") + 1]
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    with pytest.raises(grpc.FutureTimeoutError):                             # a plain channel never gets ready
        grpc.channel_ready_future(channel).result(timeout=3)
    channel.close()
    for run in runs:
        assert run.stop() == 0
    ids = union_joined(config)
    assert set(ids) == expected and max(ids.values()) == 1


@pytest.mark.timeout(120)
def test_a_replica_without_the_raft_secret_cannot_join_its_group(tmp_path, procs):
    paths = make_certs(tmp_path / "certs")
    config_path = regions_workload(tmp_path, regions=("a",), queries=100,
                                   registry={"replicas": 3}, tls={"raft_secret_file": paths["raft_secret_file"]})
    config = load_config(config_path)
    specs = idregistry.registry_processes(config)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PHOTON_RAFT")}
    for spec in specs:
        env = dict(clean) if spec.name.endswith("r2") else {**clean, **tls_env(config)}
        procs.start(list(spec.argv), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = idregistry.RegistryClient([s.address for s in specs], retry_timeout_s=30)
    try:
        fresh = f"10.0.0.1:1:{time.time_ns() // 1000:016d}"
        assert client.commit([fresh], "tok") == [idregistry.CommitResult.OK]   # 2 of 3 with the secret commit
        rows = {r["replica"]: r for r in client.status()}
        assert rows[2].get("leader", "") == "" and not rows[2].get("is_leader")
        # a replica that did not answer one status call (a row with "error") is asked again
        answered = {}

        def all_answered_and_both_hold_the_id():
            answered.clear()
            answered.update({r["replica"]: r for r in client.status()})
            return (all("error" not in r for r in answered.values())
                    and all(answered[i].get("ids_held") == 1 for i in (0, 1)))
        wait_until(all_answered_and_both_hold_the_id, 20,
                   message="every replica answers and both replicas with the secret hold the id")
        assert answered[2]["ids_held"] == 0 and answered[2].get("leader", "") == ""
    finally:
        client.close()


@pytest.mark.timeout(120)
def test_with_tls_on_raft_is_encrypted_without_a_secret_file_and_refuses_to_run_in_the_clear(tmp_path, procs,
                                                                                           monkeypatch):
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from pysyncobj.utility import TcpUtility, UtilityException
    from photon import raft_secret
    paths = make_certs(tmp_path / "certs")
    config_path = regions_workload(tmp_path, regions=("a",), queries=100, registry={"replicas": 3},
                                   tls={k: paths[k] for k in ("ca", "cert", "key")})     # no raft_secret_file
    config = load_config(config_path)
    specs = idregistry.registry_processes(config)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PHOTON_TLS", "PHOTON_RAFT"))}
    for spec in specs[:2]:
        procs.start(list(spec.argv), env={**clean, **tls_env(config)}, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL)
    plain = procs.start(list(specs[2].argv), env=clean, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for key, value in tls_env(config).items():
        monkeypatch.setenv(key, value)
    secret, source = raft_secret()
    assert secret and source == "derived from the [tls] key"
    client = idregistry.RegistryClient([s.address for s in specs[:2]], retry_timeout_s=30)
    channel = grpc.insecure_channel(specs[2].address)
    try:
        fresh = f"10.0.0.1:1:{time.time_ns() // 1000:016d}"
        assert client.commit([fresh], "tok") == [idregistry.CommitResult.OK]     # the two with TLS commit
        raft0 = specs[0].argv[-1]
        raft0 = __import__("json").loads(raft0)["raft_peers"][0]
        assert TcpUtility(password=secret, timeout=5).executeCommand(raft0, ["status"])["leader"] is not None
        with pytest.raises(UtilityException):          # Raft in the clear gets no answer from a TLS replica
            TcpUtility(password=None, timeout=3).executeCommand(raft0, ["status"])
        with pytest.raises(UtilityException):          # nor does a wrong secret
            TcpUtility(password="not-the-secret", timeout=3).executeCommand(raft0, ["status"])
        stub = health_pb2_grpc.HealthStub(channel)     # the replica without TLS never finds a leader
        assert stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status == \
            health_pb2.HealthCheckResponse.NOT_SERVING
        plain.terminate()
        plain.wait(timeout=20)
        # TLS on but no secret can be had (the key is not a private key): the replica refuses to start
        bad = procs.start(list(specs[2].argv), env={**clean, **tls_env(config), "PHOTON_TLS_KEY": paths["cert"]},
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert bad.wait(timeout=30) == 2
        err = bad.stderr.read().decode()
        assert "refusing to start" in err and "Raft secret" in err and "clear" in err
    finally:
        channel.close()
        client.close()


@pytest.mark.timeout(60)
def test_metrics_are_served_over_mutual_tls_when_tls_is_on(tmp_path, monkeypatch):
    import ssl
    import urllib.request
    from photon import free_port, scrape, serve_metrics
    paths = make_certs(tmp_path / "certs")
    rogue = make_certs(tmp_path / "rogue")
    config_path = regions_workload(tmp_path, regions=("a",), queries=10,
                                   tls={k: paths[k] for k in ("ca", "cert", "key")})
    env = tls_env(load_config(config_path))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    address = f"127.0.0.1:{free_port()}"
    assert serve_metrics("probe", lambda: {"served": 3}, address, region="a", process="probe-0") == address
    m = scrape(address)
    assert m is not None and m["photon_up"] == 1.0 and m["photon_probe_served"] == 3.0
    with pytest.raises(OSError):                      # plain HTTP gets no metrics
        urllib.request.urlopen(f"http://{address}/metrics", timeout=3).read()
    monkeypatch.setenv("PHOTON_TLS_CERT", rogue["cert"])
    monkeypatch.setenv("PHOTON_TLS_KEY", rogue["key"])
    assert scrape(address) is None                    # a client certificate from another CA is refused
    ctx = ssl.create_default_context(cafile=paths["ca"])
    ctx.check_hostname = False
    with pytest.raises(OSError):                      # no client certificate at all
        urllib.request.urlopen(f"https://{address}/metrics", timeout=3, context=ctx).read()
