"""The photon command line as a user meets it: clear errors and exit codes."""
import subprocess
import sys

import pytest

from photon.app import GenOptions, generate


def photon(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "photon.app.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.timeout(60)
def test_bad_config_exits_2_naming_the_key(tmp_path):
    cfg = tmp_path / "photon.toml"
    cfg.write_text('[join]\nunjoinable_after_s = "soon"\n[[regions]]\nname = "a"\nlog_root = "l"\n'
                   'output_root = "o"\nstate_dir = "s"\n')
    r = photon("run", "--config", str(cfg), "--until-caught-up")
    assert r.returncode == 2
    assert "[join].unjoinable_after_s must be float" in r.stderr and str(cfg) in r.stderr
    r = photon("run", "--config", str(tmp_path / "missing.toml"))
    assert r.returncode == 2 and "missing.toml does not exist" in r.stderr
    r = photon("run", "--config", str(cfg).replace("photon", "x"), "--regions", "zz")
    assert r.returncode == 2
    cfg.write_text('[[regions]]\nname = "a"\nlog_root = "no-such-logs"\noutput_root = "o"\nstate_dir = "s"\n')
    r = photon("run", "--config", str(cfg), "--until-caught-up")
    assert r.returncode == 2
    assert f"[join].foreign_stream folder {tmp_path / 'no-such-logs' / 'clicks'} does not exist" in r.stderr


@pytest.mark.timeout(120)
def test_timeout_exits_3_naming_the_region_not_caught_up(tmp_path, procs):
    generate(GenOptions(out=str(tmp_path), queries=200, unjoinable_fraction=1.0, duplicate_fraction=0.0,
                        bad_line_fraction=0.0, unjoinable_after_s=600.0, seed=4))
    r = photon("run", "--config", str(tmp_path / "photon.toml"), "--until-caught-up", "--timeout", "8",
               "--json", timeout=100)
    assert r.returncode == 3, r.stderr[-2000:]
    assert "timed out after 8 s; not caught up: ['a']" in r.stderr
    assert '"exit_code": 3' in r.stdout.strip().splitlines()[-1]
    assert "retry" in r.stdout
    status = photon("status", "--config", str(tmp_path / "photon.toml"))
    assert status.returncode == 1                    # a probe: nothing runs any more, so not SERVING
    assert "a-dispatcher (region a): metrics at" in status.stderr and "deployment: NOT SERVING" in status.stdout
    assert "a-dispatcher" in status.stdout and "joiner a-j0" in status.stdout and "not found" in status.stdout


@pytest.mark.timeout(60)
def test_gen_and_config_check(tmp_path):
    r = photon("gen", "--out", str(tmp_path), "--queries", "1000", "--regions", "a,b")
    assert r.returncode == 0 and "for region(s) a, b" in r.stdout
    r = photon("config", "--check", str(tmp_path / "photon.toml"))
    assert r.returncode == 0 and "2 region(s): a, b" in r.stdout
    r = photon("config")
    assert "unjoinable_after_s" in r.stdout and "[registry]" in r.stdout


@pytest.mark.timeout(120)
def test_a_second_run_on_the_same_state_is_refused(tmp_path, pipeline):
    generate(GenOptions(out=str(tmp_path), queries=100, seed=4))
    p = pipeline(tmp_path / "photon.toml").start()
    p.wait_for_process("a-dispatcher")
    r = photon("run", "--config", str(tmp_path / "photon.toml"), "--until-caught-up", "--timeout", "30")
    assert r.returncode == 4
    assert f"already run by another photon run (pid {p.proc.pid})" in r.stderr
    assert p.proc.poll() is None                     # the first run is untouched


@pytest.mark.timeout(300)
def test_demo_joins_two_regions_exactly_once(tmp_path):
    r = photon("demo", "--dir", str(tmp_path / "demo"), "--queries", "5000", "--json", timeout=280)
    assert r.returncode == 0, r.stderr[-3000:]
    import json
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["demo"]["duplicates"] == 0 and result["demo"]["unexpected"] == 0
    assert result["demo"]["joined"] == result["demo"]["joinable"] > 0
    assert set(result["regions"]) == {"a", "b"}
    assert "photon demo: " in r.stdout and "Photon run summary" in r.stdout
