"""The Spark set-up every batch job shares: config, one session, readable errors, progress lines."""
from __future__ import annotations

import io
import re
import threading

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
