"""``photon compact``: closed partitions of the output folders rewritten as Parquet and swapped in.

A partition (``date=D/hour=H``, one UTC hour of join time) is *closed* once its hour ended more than
``[compact].close_after_s`` ago and no file in it is open (no commit record names one, no in-progress
file is there). Compaction of one output folder, per run:

1. each closed partition's published JSONL files are read with Spark (each line parsed with the table's
   explicit schema and also kept whole in the ``_line`` column), sorted by ``[compact].sort_by`` and
   written as Parquet to ``_compacted/g<N>/date=D/hour=H/`` (hidden from folder-listing readers);
2. the Parquet is checked to hold exactly as many rows as the JSONL has lines;
3. the compaction record ``_compaction.json`` is replaced atomically (fsynced), naming the partition's
   Parquet folder and the JSONL files it replaces: from then on a reader following the contract takes
   those lines from the Parquet and not from the JSONL (see :mod:`photon._output` for the order a reader
   reads in, which is what makes the swap exact);
4. JSONL files swapped out at least ``[compact].keep_jsonl_s`` ago are deleted (readers that listed them
   before the swap may still be reading them until then).
"""
from __future__ import annotations

import calendar
import os
import time
from dataclasses import astuple, dataclass
from pathlib import Path

import orjson

from photon import PhotonConfig, output_snapshot, write_atomic
from photon._output import COMPACTION_RECORD, LINE_COLUMN, compaction_record
from photon.app._periodic import PeriodicChild

HOUR_US = 3600 * 1_000_000


@dataclass(frozen=True)
class CompactionStatistics:
    partitions_compacted: int = 0
    lines_compacted: int = 0
    jsonl_files_swapped: int = 0
    jsonl_files_deleted: int = 0

    def __add__(self, o: "CompactionStatistics") -> "CompactionStatistics":
        return CompactionStatistics(*(a + b for a, b in zip(astuple(self), astuple(o))))


def partition_start_us(partition: str) -> int | None:
    """``date=YYYY-MM-DD/hour=HH`` -> its first microsecond (UTC), None for anything else."""
    try:
        d, h = partition.split("/")
        t = time.strptime(f"{d.removeprefix('date=')} {h.removeprefix('hour=')}", "%Y-%m-%d %H")
    except ValueError:
        return None
    return calendar.timegm(t) * 1_000_000


def closed_partitions(root: Path, now_us: int, close_after_s: float) -> dict[str, list[str]]:
    """Closed, not yet compacted partitions of output folder ``root`` -> their published file names."""
    snap = output_snapshot(root)
    by_part: dict[str, list[str]] = {}
    for rel in snap.published:
        part, _, name = rel.rpartition("/")
        by_part.setdefault(part, []).append(name)
    open_parts = {rel.rpartition("/")[0] for rel in snap.open}
    out = {}
    for part, names in sorted(by_part.items()):
        start = partition_start_us(part)
        if start is None or part in snap.compacted or part in open_parts:
            continue
        if start + HOUR_US + int(close_after_s * 1e6) > now_us:
            continue
        if any((root / part).glob(".*.inprogress")):
            continue
        out[part] = sorted(names)
    return out


def _next_generation(root: Path) -> int:
    gens = [int(p.name[1:]) for p in (root / "_compacted").glob("g*") if p.name[1:].isdigit()]
    return max(gens, default=0) + 1


def compact_partition(spark, root: Path, part: str, names: list[str], schema, sort_by: list[str],
                      target: Path) -> int:
    """Write one partition's JSONL as sorted Parquet under ``target``; returns the rows written (checked
    against the lines read)."""
    from pyspark.sql import functions as F

    paths = [str(root / part / n) for n in names]
    lines = sum((root / part / n).read_bytes().count(b"\n") for n in names)
    text = spark.read.text(paths)
    df = text.select(F.from_json("value", schema, {"mode": "PERMISSIVE"}).alias("r"),
                     F.col("value").alias(LINE_COLUMN)).select("r.*", LINE_COLUMN)
    df.coalesce(1).sortWithinPartitions(*[F.col(c) for c in sort_by]).write.mode("overwrite").parquet(str(target))
    written = spark.read.parquet(str(target)).count()
    if written != lines:
        raise RuntimeError(f"compacting {root / part}: wrote {written} rows for {lines} lines; not swapped in")
    return written


def compact_folder(spark, root: str | Path, schema, sort_by: list[str], config: PhotonConfig,
                   now_us: int | None = None) -> CompactionStatistics:
    """Compact the closed partitions of one output folder and delete JSONL swapped out long enough ago."""
    root = Path(root)
    stats = CompactionStatistics()
    if not root.is_dir():
        return stats
    todo = closed_partitions(root, now_us if now_us is not None else time.time_ns() // 1000,
                             config.compact.close_after_s)
    gen = _next_generation(root) if todo else 0
    for part, names in todo.items():
        rel_dir = f"_compacted/g{gen:06d}/{part}"
        rows = compact_partition(spark, root, part, names, schema, sort_by, root / rel_dir)
        record = compaction_record(root)
        record[part] = {"path": rel_dir, "files": names, "at_us": time.time_ns() // 1000}
        write_atomic(root / COMPACTION_RECORD, orjson.dumps({"partitions": record}), durable=True)
        stats += CompactionStatistics(1, rows, len(names), 0)
    return stats + delete_swapped_out(root, config.compact.keep_jsonl_s,     # after this run's swaps
                                      now_us if now_us is not None else time.time_ns() // 1000)


def delete_swapped_out(root: Path, keep_s: float, now_us: int) -> CompactionStatistics:
    """Delete the JSONL files that compacted partitions replaced at least ``keep_s`` ago."""
    deleted = 0
    for part, entry in compaction_record(root).items():
        if entry.get("at_us", now_us) + int(keep_s * 1e6) > now_us:
            continue
        for name in entry.get("files", []):
            try:
                os.unlink(root / part / name)
                deleted += 1
            except FileNotFoundError:
                pass
    return CompactionStatistics(jsonl_files_deleted=deleted)


def compact(config: PhotonConfig, spark=None, regions=None, now_us: int | None = None) -> CompactionStatistics:
    """``photon compact``: every region's joined and unjoinable output."""
    from photon.app._spark import spark_session
    from photon.app._tables import foreign_schema, joined_schema

    spark = spark or spark_session(config, "photon-compact")
    sort_by = config.compact.sort_by or [config.join.foreign_id_field]
    stats = CompactionStatistics()
    for region in config.pipeline_regions_of(regions):
        if region.output_on_s3:     # its local folders only stage uploads: compacting them would drop files
            continue
        stats += compact_folder(spark, region.joined_dir, joined_schema(config, spark), sort_by, config, now_us)
        stats += compact_folder(spark, region.unjoinable_dir, foreign_schema(config, spark),
                                [config.join.foreign_id_field], config, now_us)
    return stats


class PeriodicCompaction(PeriodicChild):
    """``photon run --compact``: ``photon compact`` as a child process every ``[compact].every_s``, for
    ``regions`` (the launcher's pipeline regions; None: every region)."""

    def __init__(self, config: PhotonConfig, env: dict, log_dir: Path, echo, regions=None) -> None:
        args = ["compact", "--config", config.path] + (["--regions", ",".join(regions)] if regions else [])
        super().__init__("compaction", args, config.compact.every_s, env, Path(log_dir) / "compact.log", echo)
