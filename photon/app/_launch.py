"""Starting the Spark driver's JVM without ``spark-submit``'s launcher JVM: the launch command kept in Photon's cache.

PySpark starts its driver through ``bin/spark-submit``: three shell scripts, then a first JVM
(``org.apache.spark.launcher.Main``, over the classpath of every Spark jar) whose only work is to print the
command of the second, the driver's, which the script then ``exec``-s. That first JVM and the scripts cost
0.5-0.8 s of a cold start before the driver's JVM begins (docs/history/performance.md, "Thirteenth pass: the
verification job's start"). Their
result depends only on their inputs: the arguments (the session's settings), the environment, the Spark
home (its scripts, jars and conf folder) and the ``java`` binary. So, per process (:func:`plan`, then
:func:`start` or :func:`record`):

1. Before the driver starts, :func:`plan` hashes every one of those inputs into a key
   (``<cache>/spark-launch-<key>.json``).
2. With no entry under the key, the session starts as PySpark starts it, and :func:`record` then reads what
   the scripts ``exec``-ed from the running driver itself (``/proc/<pid>/cmdline`` and ``environ``: its
   argument vector, and the variables the scripts set or removed) and writes them under the key (a file of
   this process's own renamed into place).
3. With an entry, :func:`start` runs that command directly with the same environment (the scripts' changes
   applied to this process's own), as PySpark's ``launch_gateway`` would (stdin a pipe, SIGINT ignored, the
   connection file's path in ``_PYSPARK_DRIVER_CONN_INFO_PATH``), and connects PySpark's gateway to it.

Any change of an input gives another key, hence the launcher again: a new JDK or pyspark (the ``java``
binary's and every jar's path, size and time, as for the class archive), the Spark home's scripts and the
names in it, its ``spark-defaults.conf`` (content), any environment variable (but the connection file's
path, which is new each time, and the shell's own ``PWD``, ``OLDPWD``, ``_`` and ``SHLVL``, which change with
every ``cd`` and command and which neither the scripts nor the launcher read) and every setting of the
session (the JVM flags among them: the class archive's, the short job's JIT flag). A variable that changes
from login to login (``SSH_CLIENT``) therefore costs the launcher once per login; the cache keeps the 32
entries used last. A Spark home whose conf folder has a ``spark-env.sh`` (a script, whose result may change
from run to run) is always started by PySpark.
Nothing here can fail a job: no ``/proc``, a driver that is not a ``java`` process, a damaged entry or a
command that does not start (the entry is removed) all go back to PySpark's own start.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shlex
import shutil
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path
from subprocess import PIPE, Popen

from photon import wait_until, write_atomic
from photon.app import _class_archive

LAUNCH_FORMAT = 1                      # bump when the entry's content or the key's inputs change
CONN_INFO = "_PYSPARK_DRIVER_CONN_INFO_PATH"    # new for every start: not an input
# Set by every shell to where it is and what it ran, and read by neither the scripts nor the launcher: not inputs
# (what the scripts themselves set of them, ``SHLVL`` and ``_``, is replayed like any other change)
SHELL_VARIABLES = frozenset({CONN_INFO, "PWD", "OLDPWD", "_", "SHLVL"})
SCRIPTS = ("bin/spark-submit", "bin/spark-class", "bin/load-spark-env.sh", "bin/find-spark-home")
CONF_FILES = ("spark-defaults.conf", "spark-env.sh")
START_TIMEOUT_S = 300.0
KEEP_ENTRIES = 32                      # each distinct environment and settings has one (a few KB)


@dataclass(frozen=True)
class LaunchPlan:
    """What :func:`plan` found: the entry's path, the environment the key was computed from, and the
    command and environment changes of the entry (None when there is none yet)."""
    path: Path
    env: dict
    command: list | None = None
    set_env: dict | None = None
    unset_env: tuple = ()


def submit_args(options: dict, env: dict) -> list:
    """The arguments PySpark's ``launch_gateway`` gives ``spark-submit`` for a session of ``options`` in the
    environment ``env``."""
    args = []
    for key, value in options.items():
        args += ["--conf", f"{key}={value}"]
    extra = env.get("PYSPARK_SUBMIT_ARGS", "pyspark-shell")
    if env.get("SPARK_TESTING"):
        extra = " ".join(["--conf spark.ui.enabled=false", extra])
    return args + shlex.split(extra)


def spark_conf_dir(env: dict) -> Path:
    """The folder ``load-spark-env.sh`` and the launcher read (``SPARK_CONF_DIR``, else ``<home>/conf``)."""
    return Path(env.get("SPARK_CONF_DIR") or _class_archive.spark_home(env) / "conf")


def launch_key(options: dict, env: dict) -> str | None:
    """A hash of everything ``spark-submit`` and its launcher read (module docstring), or None where the
    inputs cannot be read (no ``java``, no Spark home)."""
    java, jars = _class_archive.spark_java(), _class_archive.spark_jars()
    if java is None or jars is None:
        return None
    home = _class_archive.spark_home(env)
    conf_dir = spark_conf_dir(env)
    h = hashlib.sha256(f"{LAUNCH_FORMAT}\0{_class_archive.archive_key(java, jars)}\0{home}\0".encode())
    h.update(json.dumps([submit_args(options, env),
                         sorted((k, v) for k, v in env.items() if k not in SHELL_VARIABLES),
                         sorted(os.listdir(home))]).encode())
    for script in SCRIPTS:
        path = home / script
        st = path.stat() if path.exists() else None
        h.update(f"{script}\0{st.st_size if st else -1}\0{st.st_mtime_ns if st else -1}\0".encode())
    for name in CONF_FILES:
        path = conf_dir / name
        h.update(name.encode() + b"\0" + (path.read_bytes() if path.is_file() else b"\1missing") + b"\0")
    return h.hexdigest()[:24]


def plan(cache_dir: Path, options: dict) -> LaunchPlan | None:
    """The launch of a driver for a session of ``options`` (module docstring), or None where PySpark must
    start it itself: a gateway given in the environment, a Spark Connect session, a ``spark-env.sh`` in
    Spark's conf folder, not Linux."""
    if platform.system() != "Linux" or "PYSPARK_GATEWAY_PORT" in os.environ \
            or any(k in os.environ for k in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")) \
            or "spark.remote" in options or str(options.get("spark.api.mode", "")).lower() == "connect":
        return None
    env = dict(os.environ)
    try:
        if (spark_conf_dir(env) / "spark-env.sh").exists():
            return None
        key = launch_key(options, env)
    except (OSError, ImportError, ValueError):
        return None
    if key is None:
        return None
    path = cache_dir / f"spark-launch-{key}.json"
    try:
        entry = json.loads(path.read_text())
        command, set_env, unset_env = entry["command"], entry["set_env"], entry["unset_env"]
        if not (isinstance(command, list) and command and all(isinstance(a, str) for a in command)
                and isinstance(set_env, dict) and isinstance(unset_env, list)):
            raise ValueError("malformed")
    except FileNotFoundError:
        return LaunchPlan(path, env)
    except (OSError, ValueError, KeyError, TypeError):
        _class_archive.remove(path)
        return LaunchPlan(path, env)
    with contextlib.suppress(OSError):
        os.utime(path)                 # used last: kept by :func:`_prune`
    return LaunchPlan(path, env, command, {str(k): str(v) for k, v in set_env.items()},
                      tuple(str(k) for k in unset_env))


def record(launch: LaunchPlan, jvm_pid: int) -> bool:
    """Write the command and environment changes of the driver ``jvm_pid`` that ``spark-submit`` started
    (for the environment ``launch.env``) under ``launch.path``; False (nothing written) where ``/proc``
    cannot tell or the process is not a ``java`` binary."""
    try:
        if os.path.basename(os.path.realpath(f"/proc/{jvm_pid}/exe")) != "java":
            return False
        with open(f"/proc/{jvm_pid}/cmdline", "rb") as f:
            command = [a.decode("utf-8", "surrogateescape") for a in f.read().split(b"\0")[:-1]]
        with open(f"/proc/{jvm_pid}/environ", "rb") as f:
            proc_env = dict(item.decode("utf-8", "surrogateescape").split("=", 1)
                            for item in f.read().split(b"\0") if b"=" in item)
    except (OSError, ValueError):
        return False
    if not command or CONN_INFO not in proc_env:
        return False
    set_env = {k: v for k, v in proc_env.items() if k != CONN_INFO and launch.env.get(k) != v}
    unset_env = sorted(k for k in launch.env if k not in proc_env and k != CONN_INFO)
    try:
        launch.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(launch.path, json.dumps({"command": command, "set_env": set_env,
                                              "unset_env": unset_env}).encode())
        _prune(launch.path.parent)
        return True
    except OSError:
        return False


def start(launch: LaunchPlan):
    """Start the driver with ``launch``'s command and connect PySpark's gateway to it (``gateway.proc`` the
    driver's process, as with PySpark's own start); None, with the entry removed, when it does not start."""
    env = {k: v for k, v in launch.env.items() if k not in launch.unset_env}
    env.update(launch.set_env)
    conn_dir = tempfile.mkdtemp()
    proc = None
    try:
        conn_info = os.path.join(conn_dir, "conn-info")
        env[CONN_INFO] = conn_info

        def ignore_sigint():
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            proc = Popen(launch.command, stdin=PIPE, env=env, preexec_fn=ignore_sigint)
        except OSError:
            _class_archive.remove(launch.path)
            return None
        with contextlib.suppress(TimeoutError):
            wait_until(lambda: proc.poll() is not None or os.path.isfile(conn_info), START_TIMEOUT_S, 0.05,
                       "the Spark driver's connection file")
        if not os.path.isfile(conn_info):
            _stop(proc)
            _class_archive.remove(launch.path)
            return None
        from pyspark.serializers import UTF8Deserializer, read_int
        with open(conn_info, "rb") as info:
            port, secret = read_int(info), UTF8Deserializer().loads(info)
    finally:
        shutil.rmtree(conn_dir, ignore_errors=True)
    try:
        gateway = _connect(port, secret)
    except Exception:           # noqa: BLE001 - PySpark then starts a driver of its own
        _stop(proc)
        return None
    gateway.proc = proc
    return gateway


def _connect(port: int, secret: str):
    """PySpark's own gateway to a running driver (``launch_gateway`` given its port and secret in the
    environment, as for a driver started by someone else), the environment restored afterwards."""
    from pyspark.java_gateway import launch_gateway

    saved = {k: os.environ.get(k) for k in ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET")}
    os.environ["PYSPARK_GATEWAY_PORT"], os.environ["PYSPARK_GATEWAY_SECRET"] = str(port), secret
    try:
        return launch_gateway()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _prune(cache_dir: Path, keep: int = KEEP_ENTRIES) -> None:
    """Remove all but the ``keep`` entries used last (a hit touches its entry)."""
    with contextlib.suppress(OSError):
        entries = sorted(cache_dir.glob("spark-launch-*.json"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
        for path in entries[keep:]:
            _class_archive.remove(path)


def _stop(proc) -> None:
    with contextlib.suppress(OSError):
        proc.kill()
    with contextlib.suppress(Exception):
        proc.wait(timeout=10)
