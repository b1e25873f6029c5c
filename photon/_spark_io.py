"""Reading a stream (local or S3) from Spark jobs, without hadoop-aws jars.

Spark cannot read ``s3://`` here (no hadoop-aws jars, nothing is downloaded at run time), so S3 objects are
fetched with boto3 inside Spark tasks. Two ways, both taking the object list from the source layer (so
Spark sees exactly the objects a dispatcher would: no ``.inprogress`` or hidden files, only complete lines
of the size listed):

* :func:`read_stream_json` -- tasks copy the objects to a local staging folder, then Spark's JSON reader reads
  them: about twice as fast as feeding lines through Python (DESIGN §5). Needs the staging folder to be
  visible to the driver and every executor, i.e. a local master (``local[*]``); on another master it falls
  back to :func:`stream_lines`.
* :func:`stream_lines` -- an RDD of ``(object name, byte offset, line bytes)``: every complete line with
  where it starts, for jobs that need positions (the log-file map) or raw lines.
* :func:`stream_text` -- a DataFrame ``(value, file)`` of every complete line with its object's location
  (verification, and the SQL tables parsing lines with ``from_json``): copied and read by Spark's text
  reader on a local master, from :func:`stream_lines` elsewhere.

An object that cannot be read in a task (deleted, permissions, an outage outlasting the retries) fails the
call on the driver with :class:`photon.ObjectUnreadable` naming its ``s3://`` location, never as nothing.

Pyspark is imported only inside these functions: the base never needs it to run the pipeline.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

from photon._source import Location, ObjectInfo, ObjectUnreadable, open_source, parse_location
from photon._config import S3Config
from photon._storage import storage_kind


def stream_objects(location: str | Location, s3: S3Config | None = None) -> list[ObjectInfo]:
    """Every object of the stream at ``location`` (path, ``file://`` or ``s3://bucket/prefix``) as the
    source layer lists it now, sorted by name. Raises :class:`photon.SourceError` for a misconfiguration."""
    source = open_source(location, s3)
    source.check()
    return list(source.scan().values())


def _task_access(location: Location, s3: S3Config | None):
    """What tasks need to reach ``location`` (the kind's :meth:`~photon.StorageKind.task_access`: for S3 the
    options with the endpoint resolved on the driver, and the driver's credentials)."""
    return storage_kind(location.url).task_access(location.url, s3)


def _task_source(location: Location, access):
    return storage_kind(location.url).task_source(location.url, access)


def task_source(location: str | Location, s3: S3Config | None = None):
    """A function, to ship to Spark tasks, that opens the source of ``location`` there with the driver's
    endpoint and credentials (see :func:`_task_access`); call it once per task."""
    loc = location if isinstance(location, Location) else parse_location(location)
    access = _task_access(loc, s3)
    return lambda: _task_source(loc, access)


def _fetch_complete(location: Location, access, name: str, size: int) -> bytes:
    """The object's first ``size`` bytes, cut after the last ``\\n`` (a task-side helper)."""
    source = _task_source(location, access)
    data, parts = b"", []
    pos = 0
    while pos < size:
        chunk, _ = source.read(name, pos, min(64 << 20, size - pos))
        if not chunk:
            break
        parts.append(chunk)
        pos += len(chunk)
    data = b"".join(parts)
    return data[: data.rfind(b"\n") + 1]


def stream_lines(spark, location: str | Location, s3: S3Config | None = None, objects=None,
                 slices: int | None = None):
    """RDD of ``(name, offset, line)`` for every complete line of every object (``objects``: a subset
    from :func:`stream_objects`; default all). Lines are bytes without their ``\\n``."""
    loc = location if isinstance(location, Location) else parse_location(location)
    objects = stream_objects(loc, s3) if objects is None else objects
    pairs = [(o.name, o.size) for o in objects if o.size > 0]
    sc = spark.sparkContext
    n = slices or max(1, min(len(pairs), sc.defaultParallelism * 4))

    access = _task_access(loc, s3)

    def lines_of(part):
        for name, size in part:
            data = _fetch_complete(loc, access, name, size)
            pos = 0
            for line in data.split(b"\n")[:-1]:
                yield name, pos, line
                pos += len(line) + 1

    return sc.parallelize(pairs, n).mapPartitions(lines_of)


def new_staging(base: str | Path | None = None) -> str:
    """A fresh staging folder (under ``base``, default the temporary folder), removed when the process exits."""
    path = tempfile.mkdtemp(prefix="photon-spark-", dir=base or None)
    atexit.register(shutil.rmtree, path, True)
    return path


def _url(location: Location, name: str) -> str:
    return storage_kind(location.url).join(location.url, name)


def stage_objects(spark, location: str | Location, dest: str | Path, s3: S3Config | None = None,
                  objects=None) -> dict[str, str]:
    """Copy every object (complete lines only, of the size listed) into ``dest`` inside Spark tasks,
    keeping relative names; returns object name -> local path (empty objects left out). ``dest`` must be
    visible to the executors (a local master). Raises :class:`photon.ObjectUnreadable` naming the first
    object a task could not read."""
    loc = location if isinstance(location, Location) else parse_location(location)
    objects = stream_objects(loc, s3) if objects is None else objects
    pairs = [(o.name, o.size) for o in objects if o.size > 0]
    if not pairs:
        return {}
    dest = str(Path(dest).resolve())
    sc = spark.sparkContext
    access = _task_access(loc, s3)

    def copy(part):
        for name, size in part:
            target = os.path.join(dest, *name.split("/"))
            try:
                data = _fetch_complete(loc, access, name, size)
            except OSError as e:      # gone, unreadable, or an outage outlasting the retries
                yield name, None, f"{type(e).__name__}: {e}"
                continue
            os.makedirs(os.path.dirname(target), exist_ok=True)
            tmp = target + ".part"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, target)
            yield name, target, ""

    done = sc.parallelize(pairs, max(1, min(len(pairs), sc.defaultParallelism * 4))).mapPartitions(copy).collect()
    failed = sorted((name, why) for name, target, why in done if target is None)
    if failed:
        name, why = failed[0]
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        raise ObjectUnreadable(f"{_url(loc, name)} could not be read{more}: {why}")
    return {name: target for name, target, _ in sorted(done)}


def _local_paths(spark, location: Location, objects: list[ObjectInfo], staging_dir) -> dict[str, str]:
    """Object name -> path Spark reads for the non-empty ``objects`` of a local stream: the file itself when
    it ends with a ``\\n``, else a copy of its complete part in ``staging_dir`` (a last line still being
    written left out)."""
    source = open_source(location)
    whole = [o for o in objects if source.read(o.name, o.size - 1, 1)[0] == b"\n"]
    paths = {o.name: str(Path(location.path, o.name)) for o in whole}
    cut = [o for o in objects if o not in whole]
    if cut:
        paths.update(stage_objects(spark, location, staging_dir or new_staging(), None, cut))
    return paths


def stream_text(spark, location: str | Location, s3: S3Config | None = None, objects=None,
                staging_dir: str | Path | None = None):
    """A DataFrame ``(value string, file string)``: every complete line (decoded as UTF-8, bad bytes
    replaced) of every object (``objects``: from :func:`stream_objects`; default all) with the location of
    its object (``s3://bucket/key`` or a local path). Local streams are read in place (a last line still
    being written left out); S3 objects are staged in ``staging_dir`` (default: a temporary folder removed
    at exit) on a local master, else read through :func:`stream_lines`."""
    from pyspark.sql import functions as F
    loc = location if isinstance(location, Location) else parse_location(location)
    objects = [o for o in (stream_objects(loc, s3) if objects is None else objects) if o.size > 0]
    if not objects:
        return spark.createDataFrame([], "value string, file string")
    if not loc.is_local and not spark.sparkContext.master.startswith("local"):
        base = loc.url.rstrip("/") + "/"
        rows = stream_lines(spark, loc, s3, objects).map(lambda t: (t[2].decode("utf-8", "replace"), base + t[0]))
        return spark.createDataFrame(rows, "value string, file string")
    if not loc.is_local:
        paths = stage_objects(spark, loc, staging_dir or new_staging(), s3, objects)
    else:
        paths = _local_paths(spark, loc, objects, staging_dir)
    if not paths:
        return spark.createDataFrame([], "value string, file string")
    names = spark.createDataFrame([("file://" + str(Path(p).resolve()), _url(loc, n)) for n, p in paths.items()],
                                  "uri string, file string")
    uri = F.expr("url_decode(replace(input_file_name(), '+', '%2B'))")     # '+' is literal in a path
    df = spark.read.text(list(paths.values())).withColumn("uri", uri)
    return df.join(F.broadcast(names), "uri", "left").select("value", "file")


def read_stream_json(spark, location: str | Location, schema=None, s3: S3Config | None = None,
              staging_dir: str | Path | None = None):
    """A DataFrame of the JSON lines of every object of the stream at ``location``. Local streams are read
    in place; S3 ones are copied by Spark tasks to ``staging_dir`` (default: a temporary folder removed at
    exit; keep it until the DataFrame's last action) and read there (a local master), or parsed from
    :func:`stream_lines` on any other master. ``schema`` (a ``StructType`` or DDL string) skips inference."""
    loc = location if isinstance(location, Location) else parse_location(location)
    objects = [o for o in stream_objects(loc, s3) if o.size > 0]
    reader = spark.read.schema(schema) if schema is not None else spark.read
    if not objects:
        if schema is None:
            from pyspark.sql.types import StructType
            return spark.createDataFrame([], StructType([]))
        return spark.createDataFrame([], schema)
    if loc.is_local:
        return reader.json(list(_local_paths(spark, loc, objects, staging_dir).values()))
    if spark.sparkContext.master.startswith("local"):
        return reader.json(list(stage_objects(spark, loc, staging_dir or new_staging(), s3, objects).values()))
    rdd = stream_lines(spark, loc, s3, objects).map(lambda t: t[2].decode("utf-8", "replace"))
    return reader.json(rdd)


def union_all(frames: list):
    """The rows of every DataFrame in ``frames`` (matched by column name) as one; None when there are none."""
    out = None
    for df in frames:
        out = df if out is None else out.unionByName(df)
    return out
