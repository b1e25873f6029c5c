"""Class-data sharing for the Spark driver's JVM: an application class archive (AppCDS) kept in Photon's cache.

A fresh JVM spends much of a short Spark job's CPU loading, verifying and linking Spark's classes from its
280 jars (a session's start and a one-line query: 14.8-16.7 CPU-s without an archive, 8.9 with one, on a
loaded 2-core machine). JDK 13+ can write the classes a JVM loaded into a *dynamic archive* that a later JVM
maps instead of loading them again. Lifecycle, per process (:func:`plan` then :func:`after_start`):

1. Before the JVM starts, :func:`plan` names the archive of this Java and these jars
   (``<cache>/spark-classes-<key>-<bytes>.jsa``, the key a hash of the ``java`` binary's and every jar's path,
   size and time, so a new JDK or pyspark gets a new file; nothing is downloaded). If a file is there and
   holds the bytes its name states the JVM is started with ``-XX:SharedArchiveFile`` (one of another size
   is removed: a JVM may crash on a truncated archive rather than refuse it); if not, with
   ``-XX:+RecordDynamicDumpInfo``.
2. After the session started, :func:`after_start` checks (``/proc/<pid>/maps``) that the JVM mapped the
   archive; one it refused (stale, truncated, another JVM's) is removed so that the next run writes a good
   one. Without an archive it asks, at this interpreter's exit (the JVM then holds every class the jobs
   used), ``jcmd <pid> VM.cds dynamic_dump`` into a file of its own and renames that into place: readers
   see a whole archive or none, and two processes writing at once both write whole files.

Nothing here can fail a job: a JVM that cannot use an archive runs without one (only slower), and every
error of writing one (no ``jcmd`` beside ``java``, a full disk, a JVM that exited) is ignored. The JVM's own
CDS messages are turned off (``-Xlog:cds*=off``) and its other lines go to stderr, so that none reaches a
job's output on stdout; the dump's own note (printed by the JVM's Java code on ``System.out`` at the
interpreter's exit, after the job's output) goes nowhere, the shell passing a ``before_dump`` that points the
JVM's ``System.out`` at a stream that discards it; no dump is asked for when that fails.
"""
from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

ARCHIVE_FORMAT = 1               # bump when the way archives are made changes
DUMP_TIMEOUT_S = 300.0
# CDS warnings (a refused archive, classes it skips) go nowhere, and the JVM's own lines to stderr, never into
# a job's output on stdout
QUIET = "-Xlog:cds*=off -XX:+DisplayVMOutputToStderr"


@dataclass(frozen=True)
class ArchivePlan:
    """What :func:`plan` decided: the archive's path, whether it existed when the JVM was started, and the
    JVM flags that go with it."""
    path: Path
    exists: bool

    @property
    def java_options(self) -> str:
        if self.exists:
            return f"-XX:SharedArchiveFile={self.path} {QUIET}"
        return f"-XX:+RecordDynamicDumpInfo {QUIET}"

    def mapped_by(self, pid: int) -> bool | None:
        """Whether the JVM ``pid`` maps this archive (None where ``/proc`` cannot tell)."""
        return mapped(pid, self.path)


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/photon``, else ``~/.cache/photon``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "photon"


def spark_java() -> Path | None:
    """The ``java`` that Spark's launcher runs (``$JAVA_HOME/bin/java``, else the one on the PATH), resolved."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return Path(os.path.realpath(java)) if java and os.path.exists(java) else None


def spark_home(env) -> Path:
    """``SPARK_HOME`` of the environment ``env``, else the one PySpark finds (its own package folder)."""
    from pyspark.find_spark_home import _find_spark_home
    return Path(env.get("SPARK_HOME") or _find_spark_home())


def spark_jars() -> Path | None:
    """The folder of the jars Spark's JVM runs (``$SPARK_HOME/jars``, else pyspark's own)."""
    try:
        home = spark_home(os.environ)
    except Exception:                  # noqa: BLE001 - no Spark home: no archive
        return None
    jars = home / "jars"
    return jars if jars.is_dir() else None


def archive_key(java: Path, jars: Path, extra=()) -> str:
    """A hash of the JVM binary, every jar and the ``extra`` jars put before them on the driver's classpath
    (path, size, modification time): equal keys, same classes."""
    h = hashlib.sha256(f"{ARCHIVE_FORMAT}\0".encode())
    for path in [java, *sorted(jars.glob("*.jar")), *(Path(p) for p in extra)]:
        st = path.stat()
        h.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()[:20]


CONFLICTING_FLAGS = ("Xshare", "SharedArchiveFile", "ArchiveClassesAtExit", "DynamicDumpInfo", "DumpLoadedClassList",
                     "SharedClassListFile")


def plan(cache_dir: Path, java_options: str = "", extra=()) -> ArchivePlan | None:
    """The archive for a JVM about to start with ``java_options`` (the user's) and the ``extra`` jars on its
    classpath (:mod:`photon.app._scanner`'s) (see the module docstring), or
    None where there can be none: no ``java`` or Spark jars found, a JDK without its own (base) CDS archive
    (a JVM asked to record classes for a dump refuses to start without one), or class-data sharing flags
    of the user's own."""
    java, jars = spark_java(), spark_jars()
    if java is None or jars is None or any(flag in java_options for flag in CONFLICTING_FLAGS):
        return None
    if not any((java.parent.parent / "lib" / "server" / name).is_file() for name in ("classes.jsa",
                                                                                      "classes_nocoops.jsa")):
        return None
    try:
        prefix = f"spark-classes-{archive_key(java, jars, extra)}-"
        found = None
        for path in sorted(cache_dir.glob(f"{prefix}*.jsa")):
            if not _whole(path, prefix):
                remove(path)
            elif found is None:
                found = ArchivePlan(path, True)
    except OSError:
        return None
    return found or ArchivePlan(cache_dir / f"{prefix}.jsa", False)


def _whole(path: Path, prefix: str) -> bool:
    """Whether ``path`` (``<prefix><bytes>.jsa``) holds the bytes its name states: a JVM given a truncated
    archive may crash (SIGBUS on a page past the end) rather than refuse it, so the size is checked first."""
    size = path.name[len(prefix):-len(".jsa")]
    return size.isdigit() and path.stat().st_size == int(size)


def remove(path: Path) -> None:
    """Remove ``path``; a file that is not there or cannot be removed is left as it is."""
    try:
        path.unlink()
    except OSError:
        pass


def mapped(pid: int, path: Path) -> bool | None:
    """Whether process ``pid`` maps ``path`` (None where ``/proc`` cannot tell)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return any(line.rstrip("\n").endswith(str(path)) for line in f)
    except OSError:
        return None


def after_start(archive: ArchivePlan, jvm_pid: int, before_dump=None) -> None:
    """Once the JVM runs: remove an archive it refused; without one, write one at this interpreter's exit,
    calling ``before_dump()`` first. A ``before_dump`` that raises (a gateway already closed) means no archive
    this time: the dump's note would otherwise follow the job's output, and a later run writes the archive."""
    if archive.exists:
        if mapped(jvm_pid, archive.path) is False:
            remove(archive.path)
        return

    def at_exit():
        if before_dump is not None:
            try:
                before_dump()
            except Exception:       # noqa: BLE001 - its output not quietened: no dump, whose note would follow
                return
        dump(jvm_pid, archive.path)
    atexit.register(at_exit)


def dump(jvm_pid: int, path: Path, timeout_s: float = DUMP_TIMEOUT_S) -> bool:
    """Write the classes JVM ``jvm_pid`` (started with ``-XX:+RecordDynamicDumpInfo``) has loaded as
    ``<path's stem><bytes>.jsa`` (``path`` as :func:`plan` named it), through a file of this process's own
    renamed into place; False (nothing written) on any failure."""
    java = _java_of(jvm_pid)
    jcmd = java.with_name("jcmd") if java is not None else None
    if jcmd is None or not jcmd.exists():
        return False
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        r = subprocess.run([str(jcmd), str(jvm_pid), "VM.cds", "dynamic_dump", str(tmp)],
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout_s, check=False)
        size = tmp.stat().st_size if tmp.is_file() else 0
        if r.returncode != 0 or size == 0:
            return False
        os.replace(tmp, path.with_name(f"{path.stem}{size}.jsa"))
        return True
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        remove(tmp)


def _java_of(pid: int) -> Path | None:
    try:
        return Path(os.path.realpath(f"/proc/{pid}/exe"))
    except OSError:
        return None
