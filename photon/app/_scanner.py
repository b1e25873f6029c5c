"""The verification job's strict-shape scanner: a Java class compiled at first use and put on the driver's classpath.

Spark's JSON reader parses and checks each whole line to give its id: 4.5-5.0 task CPU-s per 2M lines under
C1, against 0.9 for reading the lines as text (docs/history/performance.md, "Fifteenth pass: the verification
job's reading"). For lines of one
strict shape (``java/PhotonStrictId.java``: ``{"<id field>":"<id>"`` then plain members, ``}`` and the end
of the line) the id can be read from the line's bytes without a parse, and such a line is surely valid
JSON whose id is that one. :mod:`photon.app._verify` reads the ids of every file with it and reads with the
JSON reader every file in which it met a line of another shape, so the result is always the JSON reader's.

Lifecycle, per process:

1. Before the driver's JVM starts, :func:`jar` gives the jar of the class for this source and this JDK
   (``<cache>/photon-scanner-<key>.jar``, the key a hash of the Java source, the ``java`` binary and the
   JDK's ``release`` file, and Spark's SQL API jar it compiles against): compiled with the JDK's ``javac``
   into a folder of this process's own and zipped into a file renamed into place, the first time only.
   Without ``javac`` (a JRE), or when compiling fails, there is no jar: one log line, and the job reads
   with the JSON reader as before.
2. :func:`photon.app._spark.spark_session` puts the jar on the driver's classpath
   (``spark.driver.extraClassPath``, local masters only: the class is not shipped to other executors); the
   class archive's key and the cached launch's key (the session's settings) change with it.
3. :func:`function` registers the class as a SQL function of the session (``registerJavaFunction``), and
   its id format test (:func:`well_formed_expression`) beside it, and gives the first one's name, or None
   (one log line) where the class is not loadable in the driver's JVM (a session started without the jar,
   another master): the JSON reader then reads every file, and the id format test is Spark's string
   functions'.

Before the job, :func:`sample_strict` reads the first :data:`SAMPLE_BYTES` of each local file on the driver
and tests its whole lines for the same shape (:func:`strict_line`, the class's test in Python): a file whose
sample holds a line of another shape is read by the JSON reader in the job's first run, so that a file the
scanner would reject is not read twice. The sample decides only which reader reads a file first, never the
result: a file whose sample is strict but which holds another line later is read again by the JSON reader
(the job's rerun), as every file was before the sample.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

from photon.app import _class_archive

SOURCE = Path(__file__).with_name("java") / "PhotonStrictId.java"
CLASS_NAME = "photon.PhotonStrictId"
FUNCTION = "photon_strict_id"
WELL_FORMED = "photon_well_formed_id"        # the id format's byte test (the class's WellFormed), beside it
SCANNER_FORMAT = 1                 # bump when the jar's making changes
COMPILE_TIMEOUT_S = 180.0
# javac's own JVM: one short run of one file, so the first JIT tier only and the serial collector (as for a
# short job's driver, photon.app._spark.short_job_options): less CPU than C2 compiling javac itself
JAVAC_JVM_FLAGS = ("-J-XX:TieredStopAtLevel=1", "-J-XX:+UseSerialGC")
SAMPLE_BYTES = 1 << 16             # read of each local file on the driver before the job (sample_strict)
log = logging.getLogger("photon.verify")


def _javac(java: Path) -> str | None:
    """The ``javac`` of the JDK whose ``java`` Spark runs, else the one on the PATH."""
    beside = java.parent / "javac"
    return str(beside) if beside.exists() else shutil.which("javac")


def _sql_api_jar(jars: Path) -> Path | None:
    found = sorted(jars.glob("spark-sql-api*.jar"))
    return found[0] if found else None


def _compile_classpath(jars: Path) -> str:
    """What the class is compiled against: Spark's SQL API jar alone (it imports only ``UDF1``/``UDF2`` from
    it), else every Spark jar. javac opens every jar of its classpath: 4-5 CPU-s with Spark's 280 against
    about 1.2 with the one
    (docs/history/performance.md, "Twenty-second pass: the test suite's processes start faster")."""
    api = _sql_api_jar(jars)
    return str(api) if api is not None else str(jars / "*")


def jar_key(source: bytes, java: Path, jars: Path) -> str:
    """A hash of the Java source, the ``java`` binary (path, size, time), the JDK's ``release`` file (its
    version) and Spark's SQL API jar's name: equal keys, the same class."""
    h = hashlib.sha256(f"{SCANNER_FORMAT}\0".encode())
    h.update(hashlib.sha256(source).digest())
    st = java.stat()
    h.update(f"\0{java}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    release = java.parent.parent / "release"
    with contextlib.suppress(OSError):
        h.update(release.read_bytes())
    api = _sql_api_jar(jars)
    h.update(f"\0{api.name if api else ''}".encode())
    return h.hexdigest()[:20]


def jar(cache_dir: Path, source: Path = SOURCE) -> Path | None:
    """The scanner's jar for this JDK and Spark (compiled now when missing), or None (logged) when it
    cannot be had: no ``java`` or Spark jars, no ``javac``, a failed compile, a cache folder not writable."""
    java, jars = _class_archive.spark_java(), _class_archive.spark_jars()
    if java is None or jars is None:
        return None
    try:
        text = source.read_bytes()
        path = Path(cache_dir) / f"photon-scanner-{jar_key(text, java, jars)}.jar"
        if path.is_file():
            return path
    except OSError as e:
        log.warning("verify: the strict-shape scanner is not used (%s); ids are read by Spark's JSON reader", e)
        return None
    javac = _javac(java)
    if javac is None:
        log.warning("verify: no javac beside %s or on the PATH: the strict-shape scanner is not compiled; "
                    "ids are read by Spark's JSON reader", java)
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="photon-scanner-", dir=path.parent) as tmp:
            classes = Path(tmp) / "classes"
            classes.mkdir()
            r = subprocess.run([javac, *JAVAC_JVM_FLAGS, "-nowarn", "-cp", _compile_classpath(jars), "-d",
                                str(classes), str(source)], check=False, capture_output=True, text=True,
                               timeout=COMPILE_TIMEOUT_S)
            if r.returncode != 0:
                last = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
                log.warning("verify: compiling the strict-shape scanner failed (%s); ids are read by Spark's "
                            "JSON reader", last[0])
                return None
            fd, part = tempfile.mkstemp(prefix=".scanner-", suffix=".jar", dir=path.parent)
            os.close(fd)
            with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as z:
                z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\n\r\n")
                for f in sorted(classes.rglob("*.class")):
                    z.write(f, f.relative_to(classes).as_posix())
            os.replace(part, path)
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("verify: compiling the strict-shape scanner failed (%s); ids are read by Spark's JSON "
                    "reader", e)
        return None
    return path


def function(spark, class_name: str | None = None) -> str | None:
    """The SQL function of the scanner in ``spark`` (registered now), or None (logged) where its class is not
    on the driver's classpath or the master is not local (the class is on the driver's classpath only)."""
    master = spark.sparkContext.master
    if not master.startswith("local"):
        return None
    try:
        spark.udf.registerJavaFunction(FUNCTION, class_name or CLASS_NAME, "binary")
        spark.udf.registerJavaFunction(WELL_FORMED, (class_name or CLASS_NAME) + "$WellFormed", "boolean")
    except Exception as e:          # noqa: BLE001 - any failure means the JSON reader reads every file
        first = next((ln for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
        log.warning("verify: the strict-shape scanner is not on the driver's classpath (%s); ids are read by "
                    "Spark's JSON reader", first[:200])
        return None
    return FUNCTION


def expression(function: str, name: str) -> str:
    """The SQL expression of a text line's (``value``) id by the scanner's ``function`` (:func:`function`) for
    the field ``name`` (:func:`plain_name`): a string, or null where the line is not of the strict shape.
    The class gives the id's bytes (plain ASCII: their UTF-8 as they stand) and the cast to a string wraps
    them without a copy; a Java ``String`` would be encoded to UTF-8 again for Spark."""
    return f"CAST({function}(CAST(value AS BINARY), X'{name.encode().hex()}') AS STRING)"


def well_formed_expression(column: str) -> str:
    """The SQL expression of the id format's byte test (``photon.app._verify._cheaply_well_formed``, in one
    pass over the bytes of ``column``) by the class registered with :func:`function`: true only for ids the
    pipeline's pattern certainly accepts, false for the others, null for a null id."""
    return f"{WELL_FORMED}(CAST(`{column.replace('`', '``')}` AS BINARY))"


def plain_name(name: str) -> bool:
    """Whether the scanner can look for the field ``name``: 1-1024 printable ASCII characters, no ``"`` or
    ``\\`` (it compares the line's bytes with the name's as a JSON string without escapes)."""
    return 0 < len(name) <= 1024 and all(0x20 <= ord(c) <= 0x7E and c not in '"\\' for c in name)


_PLAIN = rb'[\x20\x21\x23-\x5b\x5d-\x7e]'
_STRING = rb'"' + _PLAIN + rb'{0,65536}"'                      # MAX_STRING
_NAME = rb'"(' + _PLAIN + rb'{0,1024})"'                       # MAX_NAME
_INNER_NAME = rb'"' + _PLAIN + rb'{0,1024}"'
_NUMBER = rb'-?(?:0|[1-9][0-9]{0,17})(?:\.[0-9]{1,18})?(?:[eE][+-]?[0-9]{1,3})?'   # MAX_DIGITS, MAX_EXPONENT
_UTF8 = (rb'[\xc2-\xdf][\x80-\xbf]|\xe0[\xa0-\xbf][\x80-\xbf]|[\xe1-\xec\xee\xef][\x80-\xbf]{2}'
         rb'|\xed[\x80-\x9f][\x80-\xbf]|\xf0[\x90-\xbf][\x80-\xbf]{2}|[\xf1-\xf3][\x80-\xbf]{3}'
         rb'|\xf4[\x80-\x8f][\x80-\xbf]{2}')
_ESCAPED = (rb'"(?:' + _PLAIN + rb'|\\["\\/bfnrt]|\\u(?![dD][89abcdefABCDEF])[0-9a-fA-F]{4}|' + _UTF8
            + rb'){0,65536}"')
_SCALAR = rb'(?:' + _ESCAPED + rb'|' + _NUMBER + rb'|true|false|null)'
_OBJECT = rb'\{(?:' + _INNER_NAME + rb':' + _SCALAR + rb'(?:,' + _INNER_NAME + rb':' + _SCALAR + rb')*)?\}'
_MEMBER = re.compile(rb',' + _NAME + rb':(?:' + _OBJECT + rb'|' + _SCALAR + rb')(?=[,}])')
_ID = re.compile(_STRING)


def strict_line(line: bytes, name: bytes) -> bool:
    """Whether the scanner (``java/PhotonStrictId.java``) takes ``line`` (without its line end) for the id
    field ``name``: the same shape, tested in Python on the driver's sample of a file (:func:`sample_strict`)."""
    k = len(name)
    if not 0 < k <= 1024 or not line.startswith(b'{"' + name + b'":') or not line.endswith(b"}"):
        return False
    m = _ID.match(line, k + 4)
    if m is None:
        return False
    p, n = m.end(), len(line)
    while p < n - 1:
        m = _MEMBER.match(line, p)
        if m is None or m.group(1) == name:
            return False
        p = m.end()
    return p == n - 1


def sample_strict(path: str, name: bytes, limit: int = SAMPLE_BYTES) -> bool:
    """Whether every whole line in the first ``limit`` bytes of the local file ``path`` is of the scanner's
    strict shape (:func:`strict_line`; a line torn by the limit is not tested). False when the file cannot be
    read here (the JSON reader reads it, and reports what it finds). Decides only the reader of the job's first
    run, never the result."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError:
        return False
    if len(data) > limit:
        data = data[: data.rfind(b"\n", 0, limit) + 1]
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return all(strict_line(ln[:-1] if ln.endswith(b"\r") else ln, name) for ln in lines)
