"""Operating a deployment from another machine: regions a, b and the registry-only c each in their own
network namespace (each its own address, as on separate machines), and the operator on machine a holding
only the config (a copy whose state dirs and log roots do not exist there). ``photon status`` reaches every
process over the network and is a probe (exit 0 only when all answer SERVING); ``photon region down|up b``
reaches region b's launcher through its authenticated control endpoint; a request signed with another
secret is refused."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from bench.netns import RegionNetwork, namespaces_refused
from photon import wait_until
from regions_helpers import joinable, regions_workload, union_joined

_refused = namespaces_refused()
pytestmark = pytest.mark.skipif(_refused is not None, reason=f"network namespaces refused: {_refused}")


def _cli(prefix, *args, timeout=90):
    return subprocess.run([*prefix, sys.executable, "-m", "photon.app.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.timeout(300)
def test_status_and_region_control_from_another_machine(tmp_path, region_run):
    names = ["a", "b", "c"]
    secret = tmp_path / "control.secret"
    secret.write_text("a-shared-secret-of-the-deployment-0123456789\n")
    with RegionNetwork(names) as net:
        config_path = regions_workload(tmp_path / "deploy", regions=("a", "b"), registry_only=("c",), queries=1500,
                                       hosts={n: net.host(n) for n in names},
                                       control={"secret_file": str(secret)})
        # machine a's operator holds the config, not the regions' state dirs or logs
        elsewhere = tmp_path / "operator"
        elsewhere.mkdir()
        remote = elsewhere / "photon.toml"
        shutil.copy(config_path, remote)
        impostor = elsewhere / "impostor.toml"
        (elsewhere / "other.secret").write_text("another-secret-altogether-0123456789abcdef\n")
        impostor.write_text(remote.read_text().replace(str(secret), str(elsewhere / "other.secret")))
        on_a = net.prefix("a")

        runs = {n: region_run(config_path, n, prefix=net.prefix(n)).start() for n in names}

        def status(*extra):
            r = _cli(on_a, "status", "--config", str(remote), "--json", "--interval", "0", "--timeout", "2", *extra)
            return r.returncode, (json.loads(r.stdout) if r.stdout.strip() else {}), r.stderr

        wait_until(lambda: status()[0] == 0, 120, interval=1.0, message="every process SERVING, seen from a")
        code, st, _ = status()
        assert st["ok"] and st["problems"] == [] and st["source"] == "config"
        assert {n: st["regions"][n]["state"] for n in names} == {"a": "up", "b": "up", "c": "up"}
        assert st["regions"]["b"]["launcher"] == "control" and st["regions"]["b"]["lost"] == 0
        assert st["leaders"]["0"]["region"] in names
        assert len([p for p in st["processes"] if p["role"] == "registry"]) == 5
        assert {a.rsplit(":", 1)[0] for p in st["processes"] if p["region"] == "b"
                for a in (p["address"], p["metrics_address"]) if a} == {net.host("b")}
        assert all(p["pid"] for p in st["processes"])
        assert not (elsewhere / "state").exists() and not (elsewhere / "logs").exists()

        r = _cli(on_a, "region", "down", "b", "--hard", "--config", str(remote), "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["down"] is True
        assert f"control: region b down --hard asked from {net.host('a')}" in runs["b"].output_text()
        # b's two replicas went with it: a and c may be NOT_SERVING until a new leader is elected there
        wait_until(lambda: {n: s["state"] for n, s in status()[1]["regions"].items()} ==
                   {"a": "up", "b": "down (photon region down)", "c": "up"}, 60, interval=1.0,
                   message="a and c up, b down on purpose, seen from a")
        code, st, err = status()
        assert code == 1 and not st["ok"]
        assert st["leaders"]["0"]["region"] in ("a", "c")
        assert "b-dispatcher (region b): region taken down (photon region down)" in err
        assert _cli(on_a, "status", "--config", str(remote), "--interval", "0", "--region", "a,c").returncode == 0

        r = _cli(on_a, "region", "up", "b", "--config", str(impostor))
        assert r.returncode == 1 and "answered 401" in r.stderr and "bad signature" in r.stderr
        assert status()[1]["regions"]["b"]["state"] == "down (photon region down)"

        r = _cli(on_a, "region", "up", "b", "--config", str(remote))
        assert r.returncode == 0 and "region b is up: 7 processes started" in r.stdout, r.stderr   # 5 + 2 replicas
        wait_until(lambda: status()[0] == 0, 90, interval=1.0, message="region b SERVING again, seen from a")
        wait_until(lambda: set(union_joined(runs["a"].config)) >= joinable(tmp_path / "deploy"), 120, interval=1.0,
                   message="every joinable click joined")
        for n in names:
            runs[n].stop()
