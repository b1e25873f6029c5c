"""The one place that builds Photon's Spark session, shows job progress and turns Spark errors into one line.

Every batch job (``photon verify``, ``recover``, ``sql``, ``compact``, ``eventstore build-map``) calls
:func:`spark_session` with the run's :class:`photon.PhotonConfig`; the ``[spark]`` section chooses the master
(``local[*]`` by default, any ``spark://`` master otherwise), the driver memory and extra settings. Spark's own
log is quiet (errors only, see ``log4j2-quiet.properties``); :func:`spark_error` gives a readable line, with
the Java stack only when asked. Nothing is downloaded: only the jars the pyspark wheel ships are used.

A session is one per process (Spark's rule); :func:`spark_session` returns the running one if there is one,
so tests can share a single session across many jobs.
"""
from __future__ import annotations

import logging
import os
import re
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

from photon import PhotonConfig, SparkConfig
from photon.app import _class_archive, _launch, _scanner

QUIET_LOG4J = Path(__file__).with_name("log4j2-quiet.properties")
PROGRESS_INTERVAL_S = 0.5
JAVA_OPTION_KEYS = ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions")
SHORT_JOB_JIT = "-XX:TieredStopAtLevel=1"     # C1 only: compiles cheaply, runs code more slowly than C2
JIT_FLAGS = ("TieredStopAtLevel", "TieredCompilation", "CompilationMode")    # the user's choice wins
SHORT_JOB_GC = "-XX:+UseSerialGC"   # one thread, no concurrent work, the cheapest write barrier for C1's code
GC_FLAG_ENV = ("JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS")   # where else a JVM takes flags from


PY4J_INTERRUPT = "KeyboardInterrupt while sending command."
PY4J_INTERRUPT_CLOSE = "Exception occurred while shutting down connection"   # the same interrupt's clean-up
# Where py4j logs them: the first through the root logger itself, the second through its client-server module's
# logger (a logger's filters see only what is logged through it, not what its children pass up).
_PY4J_INTERRUPT_LOGGERS = {"": PY4J_INTERRUPT, "py4j.clientserver": PY4J_INTERRUPT_CLOSE}


class _QuietInterrupt(logging.Filter):
    """py4j logs an interrupted call to the JVM (Ctrl-C, or a job's SIGTERM turned into KeyboardInterrupt) with
    its Python stack, and then, when the JVM has already closed its end, the failed shutdown of that call's socket
    with a second stack; the job reports the interruption itself (a line, exit 130), so those two records are
    dropped unless ``--verbose``. py4j only shuts a socket down that way after an interrupted call."""

    def __init__(self, message: str):
        super().__init__()
        self.message = message

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != self.message


def quiet_py4j_interrupts() -> None:
    """Put a :class:`_QuietInterrupt` on each logger py4j reports an interrupted call through (once)."""
    for name, message in _PY4J_INTERRUPT_LOGGERS.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _QuietInterrupt) for f in logger.filters):
            logger.addFilter(_QuietInterrupt(message))


def spark_session(config: PhotonConfig | None = None, app_name: str = "photon", *, verbose: bool = False,
                  input_bytes: int | None = None):
    """The process's SparkSession, built from ``config.spark`` on first use (later calls return it).

    ``verbose`` keeps Spark's own warnings on (``--verbose`` of the CLI). JVM flags given in ``[spark].conf``
    (``spark.driver.extraJavaOptions``, e.g. ``-XX:TieredStopAtLevel=1`` for short jobs on a small machine)
    are added to the quiet log's option, not put in its place. ``input_bytes``: the size of the job's input
    when the caller knows it before the session starts (:func:`short_job_options`)."""
    from pyspark.sql import SparkSession

    if not verbose:
        quiet_py4j_interrupts()
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    spark_cfg = config.spark if config is not None else None
    builder = SparkSession.builder.appName(app_name)
    builder = builder.master(spark_cfg.master if spark_cfg else "local[*]")
    scanner = scanner_jar(config)
    archive = class_archive_plan(config, scanner)
    # Executors (and local[*] workers) must run this interpreter with Photon importable.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    try:
        session = _started(_configured(builder, session_settings(config, verbose, archive, input_bytes, scanner)), config)
    except Exception as e:
        if archive is None or "JAVA_GATEWAY_EXITED" not in str(e):
            raise
        archive = None       # a JVM that would not start with the class archive's flags starts without them
        session = _started(_configured(builder, session_settings(config, verbose, None, input_bytes, scanner)), config)
    session.sparkContext.setLogLevel("WARN" if verbose else "ERROR")
    if archive is not None:
        gateway = session.sparkContext._gateway
        jvm_system = gateway.jvm.java.lang.System

        def quiet_stdout():       # the dump's note, printed on the JVM's System.out, goes nowhere
            java_io = gateway.jvm.java.io
            sink = java_io.PrintStream(java_io.OutputStream.nullOutputStream())
            jvm_system.setOut(sink)
            if not jvm_system.out.equals(sink):
                raise RuntimeError("the driver's System.out was not replaced")
        _class_archive.after_start(archive, gateway.proc.pid, quiet_stdout)
    return session


def _started(builder, config: PhotonConfig | None):
    """``builder.getOrCreate()``, its driver JVM started by the launch command cached for these settings when
    there is one (:mod:`photon.app._launch`: no launcher JVM), else by PySpark, whose command is then cached."""
    from pyspark import SparkContext

    launch = None
    if SparkContext._gateway is None and (config is None or config.spark.cached_launch):
        launch = _launch.plan(cache_dir(config), dict(builder._options))
        if launch is not None and launch.command is not None:
            gateway = _launch.start(launch)
            if gateway is not None:
                SparkContext._ensure_initialized(gateway=gateway)
                launch = None
            else:           # the entry is gone: PySpark starts the driver, and its command is cached again
                launch = _launch.LaunchPlan(launch.path, launch.env)
    session = builder.getOrCreate()
    if launch is not None and session.sparkContext._gateway.proc is not None:
        _launch.record(launch, session.sparkContext._gateway.proc.pid)
    return session


def _configured(builder, settings: dict):
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder


def class_archive_plan(config: PhotonConfig | None = None, scanner: Path | None = None):
    """The driver JVM's class archive (:mod:`photon.app._class_archive`) for ``config.spark`` and the
    scanner's jar on the driver's classpath (or None): None when ``[spark].class_archive`` is off or there
    can be none."""
    spark_cfg = config.spark if config is not None else None
    if spark_cfg is not None and not spark_cfg.class_archive:
        return None
    return _class_archive.plan(cache_dir(config),
                               (spark_cfg.conf if spark_cfg else {}).get("spark.driver.extraJavaOptions", ""),
                               [scanner] if scanner is not None else ())


def scanner_jar(config: PhotonConfig | None = None) -> Path | None:
    """The verification job's strict-shape scanner (:mod:`photon.app._scanner`), compiled at first use into
    the cache folder, for the driver's classpath: None with a master that is not local (the class would be
    missing on the executors) or when it cannot be compiled (logged; the job then reads with the JSON reader)."""
    spark_cfg = config.spark if config is not None else None
    if not (spark_cfg.master if spark_cfg else "local[*]").startswith("local"):
        return None
    return _scanner.jar(cache_dir(config))


def cache_dir(config: PhotonConfig | None = None) -> Path:
    """``[spark].cache_dir``, else :func:`photon.app._class_archive.default_cache_dir`."""
    spark_cfg = config.spark if config is not None else None
    return Path(os.path.expanduser(spark_cfg.cache_dir)) if spark_cfg and spark_cfg.cache_dir \
        else _class_archive.default_cache_dir()


def short_job_options(config: PhotonConfig | None, input_bytes: int | None, environ=None) -> str:
    """The driver JVM's JIT and collector flags for a job of ``input_bytes`` (None: not known) (pure, given
    ``environ``, by default :data:`os.environ`): when the input is at most ``[spark].short_job_mb``, the first
    tier only (:data:`SHORT_JOB_JIT`: a fresh JVM spends more CPU compiling with C2 than C2's faster code
    saves in a short run; docs/history/performance.md, "Fifth pass: the JIT and code generation of a cold run")
    and the serial collector
    (:data:`SHORT_JOB_GC`: less CPU in the collector's threads and in the tasks, whose C1-compiled code runs
    G1's costlier write barrier on every reference store; the fifteenth pass). Nothing for a larger or
    unknown input; the JIT flag is left out when ``[spark].conf``'s ``spark.driver.extraJavaOptions`` sets
    JIT flags of its own, the collector when it or one of :data:`GC_FLAG_ENV` chooses a collector (a JVM
    given two collectors does not start)."""
    limit_mb = (config.spark if config is not None else SparkConfig()).short_job_mb
    user = (config.spark.conf if config is not None else {}).get("spark.driver.extraJavaOptions", "")
    if input_bytes is None or not limit_mb or input_bytes > limit_mb * 1_000_000:
        return ""
    environ = os.environ if environ is None else environ
    flags = [] if any(flag in user for flag in JIT_FLAGS) else [SHORT_JOB_JIT]
    chosen = [user, *(environ.get(k, "") for k in GC_FLAG_ENV)]
    if not any(re.search(r"-XX:[+-]Use\w*GC\b", text) for text in chosen):
        flags.append(SHORT_JOB_GC)
    return " ".join(flags)


def session_settings(config: PhotonConfig | None = None, verbose: bool = False, archive=None,
                     input_bytes: int | None = None, scanner: Path | None = None) -> dict:
    """The settings :func:`spark_session` builds a session with, from ``config.spark``, the driver's class
    archive (an :class:`photon.app._class_archive.ArchivePlan`, or None), the job's input size
    (:func:`short_job_options`) and the scanner's jar (:func:`scanner_jar`, or None: put after the user's
    ``spark.driver.extraClassPath``) (pure)."""
    spark_cfg = config.spark if config is not None else None
    java_opts = "" if verbose else f"-Dlog4j2.configurationFile=file:{QUIET_LOG4J}"
    driver_opts = f"{java_opts} {archive.java_options}".strip() if archive is not None else java_opts
    driver_opts = f"{driver_opts} {short_job_options(config, input_bytes)}".strip()
    settings = {
        "spark.driver.memory": spark_cfg.driver_memory if spark_cfg else "2g",
        "spark.sql.shuffle.partitions": str(spark_cfg.shuffle_partitions if spark_cfg else 8),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.extraJavaOptions": driver_opts,
        "spark.executor.extraJavaOptions": java_opts,
        "spark.sql.sources.partitionColumnTypeInference.enabled": "true",
    }
    if spark_cfg and spark_cfg.local_dir:
        settings["spark.local.dir"] = spark_cfg.local_dir
    extra = dict(spark_cfg.conf if spark_cfg else {})
    for key in JAVA_OPTION_KEYS:    # the user's JVM flags go after the quiet log's, not instead of it
        if key in extra:
            settings[key] = f"{settings[key]} {extra.pop(key)}".strip()
    if scanner is not None:
        user = extra.pop("spark.driver.extraClassPath", "")
        settings["spark.driver.extraClassPath"] = f"{user}{os.pathsep}{scanner}" if user else str(scanner)
    settings.update(extra)
    return settings


def spark_error(exc: BaseException, verbose: bool = False) -> str:
    """One readable line for a Spark failure (an analysis error, a failed task, a Java exception); the full
    Java stack only with ``verbose``."""
    text = str(exc)
    if verbose:
        return text
    try:
        from py4j.protocol import Py4JJavaError
    except ImportError:        # pragma: no cover - py4j ships with pyspark
        Py4JJavaError = ()
    if Py4JJavaError and isinstance(exc, Py4JJavaError):
        text = str(exc.java_exception.toString())
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(exc).__name__)
    for marker in ("\n\tat ", "JVM stacktrace:"):
        first = first.split(marker)[0]
    return first


class Progress:
    """Shows a running job's stages and tasks on a terminal, one line rewritten in place, from Spark's status
    tracker. Silent when ``enabled`` is false (``--json``, or output that is not a terminal)."""

    def __init__(self, session, label: str, enabled: bool | None = None, stream=None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.label = label
        self._tracker = session.sparkContext.statusTracker()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spark-progress", daemon=True)
        self._shown = False

    def line(self) -> str | None:
        """``label: stage N (done/total tasks)[, ...]`` for the stages running now, or None."""
        parts = []
        for stage_id in sorted(self._tracker.getActiveStageIds()):
            info = self._tracker.getStageInfo(stage_id)
            if info is not None:
                parts.append(f"stage {stage_id} ({info.numCompletedTasks}/{info.numTasks} tasks)")
        return f"{self.label}: " + ", ".join(parts) if parts else None

    def _run(self) -> None:
        while not self._stop.wait(PROGRESS_INTERVAL_S):
            text = self.line()
            if text:
                self.stream.write("\r\033[K" + text)
                self.stream.flush()
                self._shown = True

    def __enter__(self) -> "Progress":
        if self.enabled:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        if self._shown:
            self.stream.write("\r\033[K")
            self.stream.flush()


@contextmanager
def progress(session, label: str, enabled: bool | None = None):
    """``with progress(spark, "verify"): ...`` shows stages and tasks while the block runs."""
    with Progress(session, label, enabled) as p:
        yield p
