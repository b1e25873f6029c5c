"""The Spark set-up every batch job shares: config, one session, readable errors, progress lines."""
from __future__ import annotations

import io
import os
import re
import threading
from pathlib import Path

import pytest

from photon import ConfigError, parse_config, wait_until
from photon.app import Progress, spark_error, spark_session

REGION = {"name": "a", "log_root": "/l", "output_root": "/o", "state_dir": "/s"}


def test_spark_section_defaults_and_validation():
    cfg = parse_config({"regions": [REGION]})
    assert cfg.spark.master == "local[*]" and cfg.spark.conf == {}
    cfg = parse_config({"regions": [REGION], "spark": {"conf": {"spark.executor.memory": "4g", "x.flag": True}}})
    assert cfg.spark.conf == {"spark.executor.memory": "4g", "x.flag": "true"}
    with pytest.raises(ConfigError, match=r"\[spark\]: unknown key 'mastr'"):
        parse_config({"regions": [REGION], "spark": {"mastr": "local"}})
    with pytest.raises(ConfigError, match=r"\[spark\].conf.bad must be a string"):
        parse_config({"regions": [REGION], "spark": {"conf": {"bad": [1]}}})


def test_jvm_flags_of_the_spark_section_are_added_to_the_quiet_log_option():
    from photon.app._spark import QUIET_LOG4J, session_settings
    quiet = f"-Dlog4j2.configurationFile=file:{QUIET_LOG4J}"
    assert session_settings(parse_config({"regions": [REGION]}))["spark.driver.extraJavaOptions"] == quiet
    cfg = parse_config({"regions": [REGION], "spark": {"conf": {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
                                                                "spark.executor.memory": "4g"}}})
    settings = session_settings(cfg)
    assert settings["spark.driver.extraJavaOptions"] == quiet + " -XX:TieredStopAtLevel=1"
    assert settings["spark.executor.extraJavaOptions"] == quiet and settings["spark.executor.memory"] == "4g"
    assert session_settings(cfg, verbose=True)["spark.driver.extraJavaOptions"] == "-XX:TieredStopAtLevel=1"


def test_session_is_shared_and_quiet(spark):
    assert spark_session(None) is spark
    assert spark.conf.get("spark.ui.enabled") == "false"
    assert spark.range(10).count() == 10


def test_errors_are_one_line_without_java_stack(spark):
    with pytest.raises(Exception) as info:
        spark.sql("SELECT no_such_column FROM range(3)").collect()
    line = spark_error(info.value)
    assert "no_such_column" in line and "\n" not in line and "\tat " not in line
    assert len(spark_error(info.value, verbose=True)) > len(line)


def test_progress_names_running_stages(spark):
    def _slow(x):
        import time
        time.sleep(1.5)        # stands for a task's work: the job must still run when progress is read
        return x

    out = io.StringIO()
    with Progress(spark, "count", enabled=True, stream=out) as p:
        job = threading.Thread(target=lambda: spark.sparkContext.parallelize(range(4), 4).map(_slow).count())
        job.start()
        seen = []
        wait_until(lambda: seen.append(p.line()) or seen[-1] is not None, timeout=60, message="a running stage")
        job.join(timeout=60)
    assert re.fullmatch(r"count: stage \d+ \(\d/4 tasks\)", seen[-1]), seen[-1]
    assert p.line() is None            # nothing runs any more


def test_class_archive_flags_go_to_the_driver_only(tmp_path):
    from photon.app._class_archive import QUIET, ArchivePlan
    from photon.app._spark import QUIET_LOG4J, class_archive_plan, session_settings
    cfg = parse_config({"regions": [REGION], "spark": {"cache_dir": str(tmp_path)}})
    plan = class_archive_plan(cfg)
    assert plan is not None and plan.path.parent == tmp_path and plan.path.name.startswith("spark-classes-")
    assert not plan.exists and plan.java_options == f"-XX:+RecordDynamicDumpInfo {QUIET}"
    whole, cut = tmp_path / f"{plan.path.stem}3.jsa", tmp_path / f"{plan.path.stem}99.jsa"
    whole.write_bytes(b"abc")
    cut.write_bytes(b"abc")                     # not the size its name states: removed, never used
    assert class_archive_plan(cfg) == ArchivePlan(whole, True) and not cut.exists()
    whole.unlink()
    settings = session_settings(cfg, archive=plan)
    quiet = f"-Dlog4j2.configurationFile=file:{QUIET_LOG4J}"
    assert settings["spark.driver.extraJavaOptions"] == f"{quiet} -XX:+RecordDynamicDumpInfo {QUIET}"
    assert settings["spark.executor.extraJavaOptions"] == quiet
    there = ArchivePlan(tmp_path / "a.jsa", True)
    assert session_settings(cfg, verbose=True, archive=there)["spark.driver.extraJavaOptions"] \
        == f"-XX:SharedArchiveFile={tmp_path / 'a.jsa'} {QUIET}"
    assert class_archive_plan(parse_config({"regions": [REGION], "spark": {"class_archive": False}})) is None
    assert class_archive_plan(cfg).path == plan.path            # same Java, same jars: same archive


_ARCHIVE_CHILD = """
import sys
from pathlib import Path
from photon import parse_config
from photon.app import spark_session
from photon.app._class_archive import mapped
from photon.app import _class_archive
if sys.argv[2:] == ["bad-flags"]:      # flags the JVM refuses: the session must start without them
    _class_archive.ArchivePlan.java_options = property(lambda self: "-XX:+NoSuchJvmFlagAtAll")
cfg = parse_config({"regions": [{"name": "a", "log_root": "/l", "output_root": "/o", "state_dir": "/s"}],
                    "spark": {"master": "local[1]", "cache_dir": sys.argv[1]}})
spark = spark_session(cfg, "archive-test", input_bytes=0)      # small, as `photon verify` of small input
assert spark.range(100).selectExpr("sum(id) AS s").collect()[0].s == 4950
archives = sorted(Path(sys.argv[1]).glob("*.jsa"))
print("mapped" if archives and mapped(spark.sparkContext._gateway.proc.pid, archives[0]) else "not mapped")
"""


_LAUNCH_CHILD = """
import json, os, sys
from photon import parse_config
from photon.app import spark_session
spark_cfg = {"master": "local[1]", "cache_dir": sys.argv[1], "class_archive": False}
spark_cfg.update(json.loads(sys.argv[2]))
cfg = parse_config({"regions": [{"name": "a", "log_root": "/l", "output_root": "/o", "state_dir": "/s"}],
                    "spark": spark_cfg})
spark = spark_session(cfg, "launch-test", input_bytes=0)       # small, as `photon verify` of small input
assert spark.range(100).selectExpr("sum(id) AS s").collect()[0].s == 4950
proc = spark.sparkContext._gateway.proc
with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
    cmdline = f.read().decode().split(chr(0))[:-1]
with open(f"/proc/{proc.pid}/environ", "rb") as f:
    environ = sorted(x for x in f.read().decode().split(chr(0)) if x and not x.startswith("_PYSPARK_DRIVER_CONN_INFO_PATH="))
print(json.dumps({"direct": not str(proc.args[0]).endswith("spark-submit"), "cmdline": cmdline, "environ": environ}))
"""


@pytest.mark.xdist_group("cold-jvms")
@pytest.mark.timeout(900)
def test_a_cached_launch_starts_the_same_driver_without_the_launcher_and_any_change_runs_the_launcher(tmp_path):
    """Real JVMs: a first run starts its driver through spark-submit and caches the command; the next, same
    settings and environment, starts the very same command with the very same environment directly; other
    settings, another environment variable, a damaged entry or one whose command does not start all go
    through spark-submit (and a job still runs right); ``cached_launch = false`` caches nothing."""
    import json
    import os
    import subprocess
    import sys
    from concurrent.futures import ThreadPoolExecutor

    def run(settings=None, cache=tmp_path, **env):
        r = subprocess.run([sys.executable, "-c", _LAUNCH_CHILD, str(cache), json.dumps(settings or {})],
                           capture_output=True, text=True, timeout=240, check=False, env={**os.environ, **env})
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout.strip().splitlines()[-1])

    def entries(cache=tmp_path):
        return sorted(cache.glob("spark-launch-*.json"))

    def together(*calls):          # independent children two at a time: each is a cold JVM's start
        with ThreadPoolExecutor(2) as pool:
            return [f.result() for f in [pool.submit(*c) for c in calls]]

    first = run()
    assert not first["direct"] and len(entries()) == 1
    entry = entries()[0]
    assert os.path.basename(first["cmdline"][0]) == "java" and "org.apache.spark.deploy.SparkSubmit" in first["cmdline"]
    assert {"-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"} <= set(first["cmdline"])     # a small job's driver
    # the same settings again; other settings (another key, the launcher again): each child writing only its
    # own entry
    again, other = together((run,), (run, {"driver_memory": "1g"}))
    assert again["direct"] and again["cmdline"] == first["cmdline"] and again["environ"] == first["environ"]
    assert not other["direct"] and "-Xmx1g" in other["cmdline"]
    assert len(entries()) == 2
    (other_entry,) = [p for p in entries() if p != entry]

    # another environment (the launcher, the variable passed on: a third key), beside a damaged entry (the
    # launcher, the entry written again whole)
    entry.write_text("{not json")
    env_changed, damaged = together((lambda: run(PHOTON_LAUNCH_TEST_VAR="1"),), (run,))
    assert not env_changed["direct"] and "PHOTON_LAUNCH_TEST_VAR=1" in env_changed["environ"]
    assert not damaged["direct"] and damaged["cmdline"] == first["cmdline"]
    assert json.loads(entry.read_text())["command"] == first["cmdline"]
    assert len(entries()) == 3

    # a command that does not start (the launcher, the entry written again), beside the other settings' entry
    # used directly
    stored = json.loads(entry.read_text())
    entry.write_text(json.dumps({**stored, "command": ["/bin/false"]}))
    failed, other_again = together((run,), (run, {"driver_memory": "1g"}))
    assert other_again["direct"] and other_again["cmdline"] == other["cmdline"]
    assert json.loads(other_entry.read_text())["command"] == other["cmdline"]
    assert not failed["direct"] and failed["cmdline"] == first["cmdline"]
    assert json.loads(entry.read_text())["command"] == first["cmdline"]
    # the entry written again is used directly; beside it, ``cached_launch = false`` in a cache folder of its
    # own caches nothing
    off_cache = tmp_path / "off"
    off_cache.mkdir()
    direct, off = together((run,), (lambda: run({"cached_launch": False}, cache=off_cache),))
    assert direct["direct"]
    assert not off["direct"] and not entries(off_cache)


def test_the_launch_key_follows_settings_environment_and_the_spark_conf_folder(tmp_path, monkeypatch):
    from photon.app._launch import launch_key, plan
    conf = tmp_path / "conf"
    conf.mkdir()
    env = {"SPARK_CONF_DIR": str(conf), "PATH": os.environ.get("PATH", "")}
    options = {"spark.master": "local[1]", "spark.driver.memory": "2g"}
    base = launch_key(options, env)
    assert base is not None and launch_key(dict(options), dict(env)) == base
    assert launch_key({**options, "spark.driver.memory": "1g"}, env) != base
    assert launch_key(options, {**env, "HADOOP_CONF_DIR": "/etc/hadoop"}) != base
    assert launch_key(options, {**env, "_PYSPARK_DRIVER_CONN_INFO_PATH": "/tmp/x"}) == base    # new every start
    for shell in ("PWD", "OLDPWD", "_", "SHLVL"):        # a shell's own, changed by every cd and command
        assert launch_key(options, {**env, shell: "/elsewhere"}) == base
    (conf / "spark-defaults.conf").write_text("spark.driver.memory 3g\n")
    with_defaults = launch_key(options, env)
    assert with_defaults != base
    (conf / "spark-defaults.conf").write_text("spark.driver.memory 4g\n")
    assert launch_key(options, env) not in (base, with_defaults)
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf))
    assert plan(tmp_path / "cache", options) is not None
    (conf / "spark-env.sh").write_text("export X=$(date +%s)\n")    # a script: never cached
    assert plan(tmp_path / "cache", options) is None
    assert launch_key(options, {**env, "PYSPARK_SUBMIT_ARGS": "--driver-memory 1g pyspark-shell"}) != \
        launch_key(options, env)


@pytest.mark.xdist_group("cold-jvms")
@pytest.mark.timeout(600)
def test_class_archive_is_written_by_a_first_run_used_by_the_next_and_a_bad_one_costs_only_speed(tmp_path):
    """Real JVMs: one whose archive flags the JVM refuses starts without them; the next writes the archive at
    its exit (nothing on its output but the job's), the next maps it, and one given a damaged archive runs
    its job right and removes it."""
    import subprocess
    import sys
    from concurrent.futures import ThreadPoolExecutor

    def run(*args, cache=tmp_path):
        r = subprocess.run([sys.executable, "-c", _ARCHIVE_CHILD, str(cache), *args], capture_output=True,
                           text=True, timeout=240, check=False)
        assert r.returncode == 0, r.stderr[-3000:]
        assert "[cds" not in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]     # no JVM warning
        assert "dump to file" not in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]   # the dump's note
        lines = r.stdout.strip().splitlines()
        assert len(lines) == 1, r.stdout          # the job's output only
        return lines[0]

    refused = tmp_path / "refused"          # a cache folder of its own, so that both cold JVMs start together
    refused.mkdir()
    with ThreadPoolExecutor(2) as pool:
        bad, first = pool.submit(run, "bad-flags", cache=refused), pool.submit(run)
        assert bad.result() == "not mapped" and first.result() == "not mapped"
    assert not list(refused.glob("*.jsa"))
    archives = sorted(tmp_path.glob("*.jsa"))
    assert len(archives) == 1 and archives[0].suffix == ".jsa" and archives[0].stat().st_size > 1 << 20
    assert archives[0].name.endswith(f"-{archives[0].stat().st_size}.jsa")      # its size in its name
    assert run() == "mapped"
    archives[0].chmod(0o644)
    archives[0].write_bytes(archives[0].read_bytes()[:4096])      # truncated: not used, not kept
    assert run() == "not mapped"
    again = sorted(tmp_path.glob("*.jsa"))         # removed, and written again whole by the run that found it cut
    assert len(again) == 1 and again[0].name.endswith(f"-{again[0].stat().st_size}.jsa")
    assert again[0].stat().st_size > 4096
    assert not list(Path.cwd().glob("hs_err_pid*.log"))         # no JVM crashed on the way


def test_a_job_known_to_be_small_starts_its_driver_jvm_with_the_first_jit_tier_only_and_the_serial_collector(
        monkeypatch):
    from photon.app._spark import GC_FLAG_ENV, QUIET_LOG4J, SHORT_JOB_GC, SHORT_JOB_JIT, session_settings, \
        short_job_options
    for name in GC_FLAG_ENV:
        monkeypatch.delenv(name, raising=False)
    quiet = f"-Dlog4j2.configurationFile=file:{QUIET_LOG4J}"
    short = f"{SHORT_JOB_JIT} {SHORT_JOB_GC}"
    assert short == "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    cfg = parse_config({"regions": [REGION]})
    assert cfg.spark.short_job_mb == 256
    small = session_settings(cfg, input_bytes=200_000_000)
    assert small["spark.driver.extraJavaOptions"] == f"{quiet} {short}"
    assert small["spark.executor.extraJavaOptions"] == quiet
    assert session_settings(None, input_bytes=256_000_000)["spark.driver.extraJavaOptions"] == f"{quiet} {short}"
    for size in (None, 256_000_001, 5_000_000_000):       # unknown or large: C2 too, and G1
        assert session_settings(cfg, input_bytes=size)["spark.driver.extraJavaOptions"] == quiet
    never = parse_config({"regions": [REGION], "spark": {"short_job_mb": 0}})
    assert session_settings(never, input_bytes=1)["spark.driver.extraJavaOptions"] == quiet
    own = parse_config({"regions": [REGION], "spark": {"conf": {"spark.driver.extraJavaOptions": "-XX:-TieredCompilation"}}})
    assert session_settings(own, input_bytes=1)["spark.driver.extraJavaOptions"] == \
        f"{quiet} {SHORT_JOB_GC} -XX:-TieredCompilation"
    # a collector chosen by the user, in the session's flags or where else the JVM takes flags from, is kept:
    # a JVM given two collectors does not start
    for flags in ("-XX:+UseG1GC", "-Xmx3g -XX:+UseParallelGC", "-XX:+UseZGC -XX:TieredStopAtLevel=1"):
        own_gc = parse_config({"regions": [REGION], "spark": {"conf": {"spark.driver.extraJavaOptions": flags}}})
        assert SHORT_JOB_GC not in session_settings(own_gc, input_bytes=1)["spark.driver.extraJavaOptions"]
        for name in GC_FLAG_ENV:
            assert short_job_options(cfg, 1, {name: flags}) == SHORT_JOB_JIT
    assert short_job_options(cfg, 1, {"JAVA_TOOL_OPTIONS": "-Xlog:gc -XX:MaxGCPauseMillis=50"}) == short
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-XX:+UseShenandoahGC")
    assert session_settings(cfg, input_bytes=1)["spark.driver.extraJavaOptions"] == f"{quiet} {SHORT_JOB_JIT}"
    with pytest.raises(ConfigError, match=r"short_job_mb.*>= 0"):
        parse_config({"regions": [REGION], "spark": {"short_job_mb": -1}})


def test_verify_input_size_is_the_local_input_and_output_and_unknown_on_s3(tmp_path):
    from photon.app._verify import input_bytes
    region = {"name": "a", "log_root": str(tmp_path / "logs"), "output_root": str(tmp_path / "out"),
              "state_dir": str(tmp_path / "state")}
    cfg = parse_config({"regions": [region]})
    (tmp_path / "logs/clicks").mkdir(parents=True)
    (tmp_path / "logs/clicks/c-1.jsonl").write_bytes(b"x" * 1000)
    (tmp_path / "logs/clicks-recovery").mkdir()
    (tmp_path / "logs/clicks-recovery/r.jsonl").write_bytes(b"x" * 20)
    (tmp_path / "logs/queries").mkdir()
    (tmp_path / "logs/queries/q.jsonl").write_bytes(b"x" * 5000)      # the primary input: not read by the counts
    (tmp_path / "out/joined").mkdir(parents=True)
    (tmp_path / "out/joined/a.jsonl").write_bytes(b"x" * 300)
    assert input_bytes(cfg) == 1320
    remote = parse_config({"regions": [{**region, "output_root": "s3://bucket/out"}]})
    assert input_bytes(remote) is None


def test_no_class_archive_is_dumped_when_the_drivers_output_could_not_be_quietened(monkeypatch, tmp_path):
    """The dump's note is printed on the JVM's System.out: when pointing that at a discarding stream fails (a
    gateway already closed at exit), no dump is asked for; when it works, the dump follows."""
    import atexit

    from photon.app import _class_archive
    dumps, hooks = [], []
    monkeypatch.setattr(_class_archive, "dump", lambda pid, path: dumps.append((pid, path)))
    monkeypatch.setattr(atexit, "register", hooks.append)
    plan = _class_archive.ArchivePlan(tmp_path / "a.jsa", False)

    def closed():
        raise ConnectionError("gateway closed")
    _class_archive.after_start(plan, 4242, closed)
    _class_archive.after_start(plan, 4343, lambda: None)
    for hook in hooks:
        hook()
    assert dumps == [(4343, plan.path)]
