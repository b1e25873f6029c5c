"""``photon eventstore build-map``: the log-file map of a region's primary logs, built by Spark.

Every primary log file is cut into byte ranges of ``range_mb`` (a line belongs to the range it starts in);
one Spark task per range reads its lines and emits map entries by the W/M rule of ``[eventstore]``
(``map_every_s``, ``map_every_kb``), exactly as the primary reader does for a whole file; a range that
starts inside a file adds an entry for the first line of each key there. The entries are sorted by key,
timestamp, file and offset and written as JSON lines (the map's one format, see docs/eventstore.md) to a
folder next to the map, which is then renamed into it as ``spark-<build_us>``; older Spark builds are then
removed. Logs stores pick the new entries up while running.

An ``s3://`` primary stream is listed through the source layer and its ranges read by ranged GETs inside
the Spark tasks (boto3, the driver's endpoint and credentials): the same objects, names and byte offsets
the logs store's ranged GETs read.
"""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass

import eventstore
from photon import ObjectGone, PhotonConfig, local_folder
from photon._spark_io import task_source

SCHEMA = "key string, ts long, file string, offset long"


@dataclass(frozen=True)
class BuildMapResult:
    region: str
    files: int
    ranges: int
    primary_bytes: int
    entries: int
    out_dir: str
    seconds: float


def _ranged_reads(root: str, config: PhotonConfig):
    """A function for Spark tasks giving ``read_at(rel, offset, size)`` over the S3 prefix ``root``."""
    open_task_source = task_source(root, config.s3)

    def make():
        source = open_task_source()

        def read_at(rel: str, offset: int, size: int) -> bytes:
            try:
                return source.read(rel, offset, size)[0]
            except ObjectGone as e:
                raise FileNotFoundError(str(e)) from None
        return read_at
    return make


def build_map(config: PhotonConfig, region: str, *, range_mb: float = 64.0, session=None,
              show_progress: bool | None = None) -> BuildMapResult:
    """Build and publish the map of ``region``'s primary logs (see module docstring)."""
    from photon.app._spark import progress, spark_session
    t0 = time.monotonic()
    reg = config.region(region)
    es = config.eventstore
    root = reg.stream_url(config.join.primary_stream)
    ranges = eventstore.plan_map_ranges(root, max(1, int(range_mb * (1 << 20))), config.s3)
    read_at = _ranged_reads(root, config) if local_folder(root) is None else None
    spark = session or spark_session(config, "photon build-map")
    id_field, every_s, every_kb = config.join.primary_ids, es.map_every_s, es.map_every_kb
    build_us = time.time_ns() // 1000
    store = eventstore.store_dir(config, region)
    tmp = store / f"map-build-{build_us}"
    final = eventstore.map_dir(reg.state_dir) / f"{eventstore.SPARK_PREFIX}{build_us}"
    entries = 0
    with progress(spark, f"build-map {region}", show_progress):
        if ranges:
            rdd = spark.sparkContext.parallelize(ranges, len(ranges)).flatMap(
                lambda r: eventstore.scan_map_range(root, r[0], r[1], r[2], id_field, every_s, every_kb,
                                                    read_at() if read_at else None))
            df = spark.createDataFrame(rdd, SCHEMA).orderBy("key", "ts", "file", "offset").cache()
            entries = df.count()
            df.write.mode("overwrite").json(str(tmp))
            df.unpersist()
        else:
            tmp.mkdir(parents=True, exist_ok=True)
    for junk in tmp.glob("_*"):
        junk.unlink()
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(final)
    for old in final.parent.glob(f"{eventstore.SPARK_PREFIX}*"):
        if old != final and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
    return BuildMapResult(region, len({r[0] for r in ranges}), len(ranges), sum(r[2] - r[1] for r in ranges),
                          entries, str(final), round(time.monotonic() - t0, 3))
