"""``photon verify`` on a standalone Spark master and worker, both started from the Spark that pyspark ships
(bound to 127.0.0.1, free ports), the job run as a user runs it: a subprocess with ``[spark] master =
"spark://..."``. The test process's own local session is untouched."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import orjson
import pytest

import idregistry
from photon import IdGenerator, free_port, wait_until

GEN = IdGenerator("10.4.4.4", 4444)


def spark_home() -> Path:
    import pyspark
    return Path(pyspark.__file__).parent


def start(argv: list[str], log: Path, env: dict) -> subprocess.Popen:
    with open(log, "ab") as f:
        return subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def master_state(ui_port: int) -> dict:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as r:
            return json.loads(r.read())
    except OSError:
        return {}


@pytest.mark.slow
@pytest.mark.xdist_group("cold-jvms")
@pytest.mark.timeout(300)
def test_verify_runs_on_a_standalone_master_and_worker(tmp_path):
    home = spark_home()
    spark_class = str(home / "bin" / "spark-class")
    env = {**os.environ, "SPARK_HOME": str(home), "PYSPARK_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"}
    m_port, m_ui, w_port, w_ui = (free_port() for _ in range(4))
    master_url = f"spark://127.0.0.1:{m_port}"
    procs = []
    try:
        procs.append(start([spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                            "--port", str(m_port), "--webui-port", str(m_ui)], tmp_path / "master.log", env))
        procs.append(start([spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                            "--port", str(w_port), "--webui-port", str(w_ui), "--cores", "1", "--memory", "1g",
                            "--work-dir", str(tmp_path / "work"), master_url], tmp_path / "worker.log", env))
        wait_until(lambda: master_state(m_ui).get("aliveworkers") == 1, 90, interval=0.5,
                   message="the standalone worker registered with the master")

        # one region: 5 clicks, 3 joined, one registered and lost under a stopped joiner's token
        ids = [GEN.next_id() for _ in range(5)]
        lines = [orjson.dumps({"click_id": i, "query_id": i}) for i in ids]
        (tmp_path / "logs/clicks").mkdir(parents=True)
        (tmp_path / "logs/clicks/c.jsonl").write_bytes(b"".join(x + b"\n" for x in lines))
        (tmp_path / "out/joined").mkdir(parents=True)
        (tmp_path / "out/joined/a-j0-1-000001.jsonl").write_bytes(b"".join(x + b"\n" for x in lines[:3]))
        dead = subprocess.Popen(["true"])
        dead.wait()
        reg = idregistry.InMemoryRegistry()
        reg.commit(ids[:3], "127.0.0.1:1/1/1/1")
        reg.commit([ids[3]], f"127.0.0.1:2/{dead.pid}/{10**15}/1")
        idregistry.export_registry(reg, tmp_path / "export")
        (tmp_path / "photon.toml").write_text(
            '[[regions]]\nname = "a"\nlog_root = "logs"\noutput_root = "out"\nstate_dir = "state"\n\n'
            f'[spark]\nmaster = "{master_url}"\ndriver_memory = "1g"\nshuffle_partitions = 2\n'
            'conf = { "spark.executor.memory" = "512m", "spark.cores.max" = "1", '
            '"spark.driver.host" = "127.0.0.1", "spark.driver.bindAddress" = "127.0.0.1" }\n')
        r = subprocess.run([sys.executable, "-m", "photon.app.cli", "verify", "--config", str(tmp_path / "photon.toml"),
                            "--export", str(tmp_path / "export"), "--json"],
                           capture_output=True, text=True, env=env, timeout=240)
        assert r.returncode == 0, r.stderr[-2000:]
        assert json.loads(r.stdout.strip().splitlines()[-1]) == {
            "foreign_events": 5, "joined": 3, "duplicates": 0, "lost": 1, "recoverable": 1, "pending": 1,
            "unjoinable": 0, "wrongly_unjoinable": 0}
        apps = master_state(m_ui).get("completedapps", []) + master_state(m_ui).get("activeapps", [])
        assert any(a.get("name") == "photon-verify" for a in apps)        # the job ran on this master
        assert list((tmp_path / "work").glob("app-*/*/stderr"))           # with an executor on this worker
    finally:
        for p in reversed(procs):
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=30)
