"""The ``photon`` command line as scripts use it: --version, an example in every command's help,
--config from PHOTON_CONFIG, --json on the commands that print figures, ``config --check`` reporting every
error at once and warning about unreachable S3 buckets and ports in use, and ``status`` as a probe."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from photon import free_port
from photon.app.cli import EXAMPLES, build_parser, main


def photon(*args, env=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "photon.app.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


@pytest.mark.timeout(60)
def test_version_and_an_example_in_every_commands_help():
    r = photon("--version")
    assert r.returncode == 0 and r.stdout.startswith("photon 0.")
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    assert set(commands) == set(EXAMPLES)
    for name, sub in commands.items():
        text = sub.format_help()
        assert f"example:\n  photon {name}" in text, name
    r = photon("registry", "status", "--help")
    assert r.returncode == 0 and "examples:\n  photon registry status" in r.stdout


def _write_config(path, text: str):
    path.write_text(text)
    return path


@pytest.mark.timeout(60)
def test_config_from_the_environment(tmp_path):
    r = photon("gen", "--out", str(tmp_path), "--queries", "200", "--json")
    assert r.returncode == 0, r.stderr
    made = json.loads(r.stdout)
    assert made["queries"] == 200 and made["config"] == str(tmp_path / "photon.toml") and made["regions"] == ["a"]
    env = {"PHOTON_CONFIG": str(tmp_path / "photon.toml")}
    r = photon("config", "--check", "--offline", env=env)
    assert r.returncode == 0 and "1 region(s): a" in r.stdout
    r = photon("status", "--interval", "0", "--json", env=env)          # no --config: PHOTON_CONFIG
    assert r.returncode == 1 and json.loads(r.stdout)["ok"] is False
    r = photon("registry", "status", "--timeout", "1", env=env)        # the registry room's parser too
    assert "registry unavailable" in r.stderr and r.returncode == 1
    r = photon("status")
    assert r.returncode == 2 and "--config" in r.stderr                 # neither: argparse names it


@pytest.mark.timeout(60)
def test_config_check_reports_every_error_at_once(tmp_path):
    cfg = _write_config(tmp_path / "photon.toml", """
[join]
unjoinable_after_s = -1
color = "blue"
[registry]
fsync = "sometimes"
[nonsense]
x = 1
[[regions]]
name = "a"
log_root = "l"
state_dir = "s"
port_base = 70000
""")
    r = photon("config", "--check", str(cfg), "--json")
    assert r.returncode == 2
    found = json.loads(r.stdout)
    errors = "\n".join(found["errors"])
    for expected in ("[join].unjoinable_after_s must be > 0", "[join]: unknown key 'color'",
                     "[registry].fsync must be one of", "unknown section [nonsense]",
                     "missing required key 'output_root'", "port_base must be at most"):
        assert expected in errors, (expected, errors)
    assert len(found["errors"]) == 6 and found["ok"] is False
    r = photon("config", "--check", str(cfg))
    assert r.returncode == 2 and r.stderr.count("error: ") == 6 and "6 error(s)" in r.stderr
    r = photon("run", "--config", str(cfg))                 # a run still stops at the first, as before
    assert r.returncode == 2 and r.stderr.count("configuration error") == 1


@pytest.mark.timeout(60)
def test_config_check_warns_about_ports_in_use_and_unreachable_buckets(tmp_path):
    closed = free_port()                                     # nothing listens there: S3 unreachable
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        base = port - 10                                     # region a's first joiner's gRPC port: taken
        cfg = _write_config(tmp_path / "photon.toml", f"""
[s3]
endpoint_url = "http://127.0.0.1:{closed}"
connect_timeout_s = 1.0
read_timeout_s = 1.0
[[regions]]
name = "a"
log_root = "s3://no-such-bucket/logs"
output_root = "out"
state_dir = "state"
port_base = {base}
""")
        r = photon("config", "--check", str(cfg), "--json",
                   env={"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"})
    assert r.returncode == 0, r.stderr                       # warnings only: the file is valid
    warnings = json.loads(r.stdout)["warnings"]
    assert any(f"port 127.0.0.1:{port} (a-j0) is in use" in w for w in warnings), warnings
    assert any("S3 unreachable" in w and "no-such-bucket" in w and f"127.0.0.1:{closed}" in w for w in warnings), warnings
    assert not (tmp_path / "state").exists()                 # checking writes nothing into a state dir


@pytest.mark.timeout(300)
def test_compact_prints_its_figures_as_json(tmp_path, spark, capsys):
    from photon.app import GenOptions, generate
    generate(GenOptions(out=str(tmp_path), queries=100, seed=2))
    (tmp_path / "out" / "a" / "joined").mkdir(parents=True, exist_ok=True)
    assert main(["compact", "--config", str(tmp_path / "photon.toml"), "--json"]) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert figures["partitions_compacted"] == 0 and figures["lines_compacted"] == 0 and "seconds" in figures


@pytest.mark.timeout(120)
def test_run_names_a_state_dir_or_output_root_that_cannot_be_a_folder(tmp_path):
    """A file where ``state_dir`` or ``output_root`` should be a folder is a configuration error naming the
    key (exit 2, before any process starts), not a traceback from the launcher's mkdir."""
    r = photon("gen", "--out", str(tmp_path), "--queries", "50")
    assert r.returncode == 0, r.stderr
    (tmp_path / "in-the-way").write_text("not a folder\n")
    good = (tmp_path / "photon.toml").read_text()
    for key in ("state_dir", "output_root"):
        lines = [f'{key} = "in-the-way"' if line.startswith(f"{key} =") else line for line in good.splitlines()]
        config = _write_config(tmp_path / f"bad-{key}.toml", "\n".join(lines) + "\n")
        r = photon("run", "--config", str(config), "--until-caught-up", "--timeout", "30", timeout=90)
        assert r.returncode == 2, (key, r.returncode, r.stderr[-2000:])
        assert "Traceback" not in r.stderr, r.stderr[-2000:]
        assert f"[[regions]].{key}" in r.stderr and "in-the-way is a file, not a folder" in r.stderr, r.stderr
        assert str(config) in r.stderr


@pytest.mark.timeout(120)
def test_out_of_range_options_are_usage_errors(tmp_path):
    """A count, fraction or duration outside its range is refused by the parser naming the option (exit 2):
    never a traceback (``gen --writers 0``, ``gen --regions ,``), a workload of nonsense (``--bad-lines 2``)
    or a run that times out at once (``run --timeout -5``)."""
    r = photon("gen", "--out", str(tmp_path / "w"), "--queries", "50")
    assert r.returncode == 0, r.stderr
    config = str(tmp_path / "w" / "photon.toml")
    cases = [(["gen", "--out", str(tmp_path / "g"), "--writers", "0"], "--writers"),
             (["gen", "--out", str(tmp_path / "g"), "--regions", ","], "--regions"),
             (["gen", "--out", str(tmp_path / "g"), "--regions", "a,a"], "--regions"),
             (["gen", "--out", str(tmp_path / "g"), "--bad-lines", "2"], "--bad-lines"),
             (["gen", "--out", str(tmp_path / "g"), "--queries", "-5"], "--queries"),
             (["gen", "--out", str(tmp_path / "g"), "--clicks-per-query", "nan"], "--clicks-per-query"),
             (["run", "--config", config, "--timeout", "-5"], "--timeout"),
             (["status", "--config", config, "--interval", "-1"], "--interval"),
             (["region", "down", "a", "--config", config, "--wait", "0"], "--wait")]
    for argv, option in cases:
        r = photon(*argv)
        assert r.returncode == 2, (argv, r.returncode, r.stdout[-500:], r.stderr[-2000:])
        assert "Traceback" not in r.stderr and f"argument {option}:" in r.stderr, (argv, r.stderr[-2000:])
    assert not (tmp_path / "g").exists()                       # nothing was written for a refused gen


@pytest.mark.timeout(120)
def test_recover_from_a_path_that_is_not_verifys_output_is_named(tmp_path):
    """``photon recover --from`` a missing path (a traceback from pyarrow), a folder with no Parquet (which
    read as "0 recoverable": a mistyped folder hidden) or a file that is not Parquet: exit 2 naming it,
    before any registry or Spark starts."""
    r = photon("gen", "--out", str(tmp_path), "--queries", "50")
    assert r.returncode == 0, r.stderr
    config = str(tmp_path / "photon.toml")
    (tmp_path / "empty").mkdir()
    for path, words in ((tmp_path / "nowhere", "does not exist"), (tmp_path / "empty", "holds no .parquet file"),
                        (tmp_path / "photon.toml", "cannot be read")):
        r = photon("recover", "--config", config, "--from", str(path), "--dry-run")
        assert r.returncode == 2, (path, r.returncode, r.stderr[-2000:])
        assert "Traceback" not in r.stderr and f"--from {path} {words}" in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "state" / "a" / "registry").exists()      # no registry was started for the job


@pytest.mark.timeout(120)
def test_verify_and_recover_name_a_results_folder_that_cannot_be_one(tmp_path):
    """``--out`` (or ``[verify].out_dir``) with a file in its place: exit 2 naming it before the job starts
    (it was a traceback after the job's Spark scan)."""
    r = photon("gen", "--out", str(tmp_path), "--queries", "50")
    assert r.returncode == 0, r.stderr
    config = str(tmp_path / "photon.toml")
    for command, out in (("verify", tmp_path / "photon.toml"), ("recover", tmp_path / "photon.toml" / "below")):
        r = photon(command, "--config", config, "--out", str(out))
        assert r.returncode == 2, (command, r.returncode, r.stderr[-2000:])
        assert "Traceback" not in r.stderr and f"--out {out}: {tmp_path / 'photon.toml'} is a file" in r.stderr, \
            r.stderr[-2000:]


@pytest.mark.timeout(120)
def test_sql_names_an_out_path_it_cannot_write_before_the_query_runs(tmp_path):
    """``photon sql --out`` naming a folder or a file in a missing folder: exit 2 at once, not one line (exit 1)
    after Spark started and the query ran."""
    r = photon("gen", "--out", str(tmp_path), "--queries", "50")
    assert r.returncode == 0, r.stderr
    config = str(tmp_path / "photon.toml")
    for out, words in ((tmp_path, "is a folder"), (tmp_path / "nowhere" / "x.csv", "does not exist")):
        r = photon("sql", "--config", config, "SELECT 1", "--out", str(out))
        assert r.returncode == 2, (out, r.returncode, r.stderr[-2000:])
        assert f"--out {out}" in r.stderr and words in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert "Setting default log level" not in r.stderr, "refused before Spark started"


@pytest.mark.timeout(90)
def test_status_with_nothing_running_says_so_first(tmp_path, procs):
    """``photon status`` of a deployment none of whose processes answers: its first line says that nothing
    runs, before every process's own reason (exit 1, as before); with a launcher holding the region here
    (starting, or restarting its processes) it does not say so. Real processes hold the lock."""
    cfg = _write_config(tmp_path / "photon.toml", f"""
[[regions]]
name = "a"
log_root = "logs"
output_root = "out"
state_dir = "state"
port_base = {free_port() - 3}
""")
    args = ("status", "--config", str(cfg), "--interval", "0", "--timeout", "0.5")
    r = photon(*args)
    assert r.returncode == 1, r.stderr
    first, *rest = r.stdout.splitlines()
    assert first.startswith("nothing runs: none of the ") and " processes of this config answers" in first, first
    assert any("not answering at" in line for line in rest), r.stdout
    assert r.stderr.startswith("photon status: nothing runs: "), r.stderr
    assert "not every process is SERVING" in r.stderr.splitlines()[1], r.stderr
    r = photon(*args, "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["nothing_runs"] is True
    assert r.stderr.startswith("photon status: nothing runs: "), r.stderr

    holder = procs.python("-c", "import sys; from photon import hold_lock; f = hold_lock(sys.argv[1], 'photon run'); "
                          "print('held', flush=True); sys.stdin.read()", str(tmp_path / "state" / "launcher.lock"),
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert holder.stdout.readline().strip() == b"held"
    r = photon(*args, "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["nothing_runs"] is False
    assert "nothing runs" not in r.stderr and "not every process is SERVING" in r.stderr, r.stderr
