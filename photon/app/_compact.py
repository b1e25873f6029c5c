"""``photon compact``: closed hours of the output folders moved from the JSONL table to the Parquet table.

Each output folder ``<output_root>/<kind>`` (``joined``, ``unjoinable``) is the JSONL table; beside it,
``<output_root>/<kind>_parquet`` is the Parquet table, partitioned the same way (``date=D/hour=H``). Every
published hour is visible in exactly one of them, so a plain reader reads the Parquet table, then the JSONL
table, and gets every row once (README "Output contract"; the one window is below).

A partition (one UTC hour of join time) is *closed* once its hour ended more than ``[compact].close_after_s``
ago and no file in it is open (no commit record names one, no in-progress file is there). Per run, for each
output folder:

0. swaps that an earlier run began and did not finish (it was killed) are finished, steps 4-5 below;
1. each closed partition's published JSONL files are read with Spark (each line parsed with the table's
   schema and also kept whole in the ``_line`` column), sorted by ``[compact].sort_by`` and written as
   Parquet to ``<kind>/_compacted/g<N>/date=D/hour=H/`` (hidden: every reader skips ``_`` folders);
2. the Parquet is checked to hold exactly as many rows as the JSONL has lines;
3. the compaction record ``_compaction.json`` is replaced atomically (fsynced), naming the partition, its
   Parquet and the JSONL files it replaces: from then on Photon's readers take the hour from the Parquet
   (see :mod:`photon._output`);
4. *hide*: the JSONL hour folder ``<kind>/date=D/hour=H`` is renamed to
   ``<kind>/_compacted/g<N>/jsonl/date=D/hour=H`` (one atomic rename; out of every plain reader's sight);
5. *show*: the Parquet folder is renamed to ``<kind>_parquet/date=D/hour=H`` (one atomic rename);
6. kept JSONL folders swapped out at least ``[compact].keep_jsonl_s`` ago are deleted (Photon's readers that
   listed their files before step 4 read them there until then), and so are readers' pin folders
   (``<kind>/_pinned/``, :func:`photon._output.pinned_paths`) older than that.

Hide before show: the hour is never visible in both tables, so no reader counts it twice. A reader that
lists the Parquet table first and the JSONL table second (the README's order) misses the hour only when
the swap falls between its two listings; one that lists them the other way round counts it twice in that
case. A reader that listed the hour's JSONL files before step 4 and opens one after fails (file not
found); it never counts wrongly. A run killed between steps 4 and 5 leaves the hour in neither table for
plain readers until the next run finishes the swap (Photon's readers still count it, from the record).
"""
from __future__ import annotations

import os
import shutil
import time
from dataclasses import astuple, dataclass
from pathlib import Path

import orjson

from photon import PhotonConfig, fsync_path, output_snapshot, write_atomic
from photon._output import (COMPACTION_RECORD, LINE_COLUMN, PINS_DIR, compaction_record, object_compaction_record,
                            parquet_publisher, parquet_table, partition_start_us)
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


def closed_partitions(root: Path, now_us: int, close_after_s: float) -> dict[str, list[str]]:
    """Closed, not yet compacted partitions of output folder ``root`` -> their published file names."""
    snap = output_snapshot(root)
    by_part: dict[str, list[str]] = {}
    for rel in snap.published:
        part, _, name = rel.rpartition("/")
        by_part.setdefault(part, []).append(name)
    open_parts = {rel.rpartition("/")[0] for rel in snap.open}
    recorded = compaction_record(root)
    out = {}
    for part, names in sorted(by_part.items()):
        start = partition_start_us(part)
        if start is None or part in recorded or part in open_parts:
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


SWAP_HOOK = None
"""Test pause point: called as ``SWAP_HOOK(step, root, partition)`` after each step of a swap (``"written"``,
``"recorded"``, ``"hidden"``, ``"shown"``); None in production."""


def _step(step: str, root: Path, part: str) -> None:
    if SWAP_HOOK is not None:
        SWAP_HOOK(step, root, part)


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


def finish_swap(root: Path, part: str, entry: dict) -> None:
    """Steps 4 and 5 of the module docstring for one recorded partition, each only if not done yet
    (idempotent: also finishes a swap a killed run began). Hide first, then show; the hide's removal from
    the JSONL table is made durable before the show, so not even a power loss leaves the hour in both."""
    kept, staged, shown = root / entry["kept"], root / entry["path"], parquet_table(root) / part
    synced: set[Path] = set()
    if (root / part).is_dir():
        stray = sorted(p.name for p in (root / part).iterdir()
                       if not p.name.startswith(("_", ".")) and p.name not in entry.get("files", []))
        if stray:
            raise RuntimeError(f"cannot hide {root / part}: {stray} are not in its Parquet")
        if kept.exists():
            raise RuntimeError(f"cannot hide {root / part}: {kept} exists already")
        kept.parent.mkdir(parents=True, exist_ok=True)
        os.rename(root / part, kept)
        fsync_path((root / part).parent)
        synced.add(kept.parent)
    _step("hidden", root, part)
    if staged.is_dir():
        if shown.exists():
            raise RuntimeError(f"cannot show {staged}: {shown} exists already")
        shown.parent.mkdir(parents=True, exist_ok=True)
        os.rename(staged, shown)
        synced.update((shown.parent, staged.parent))
    for folder in synced:
        fsync_path(folder)
    _step("shown", root, part)


def _finish_earlier_swaps(root: Path) -> None:
    """Step 0: finish every recorded swap; an entry written before the Parquet table existed (no ``kept``)
    is given one first, so its hour moves to the Parquet table like any other."""
    record = compaction_record(root)
    todo = {part: e for part, e in record.items()
            if "kept" not in e or (root / part).is_dir() or (root / e["path"]).is_dir()}
    if not todo:
        return
    for part, entry in todo.items():
        if "kept" not in entry:
            entry["kept"] = f"{entry['path'][: -len(part)]}jsonl/{part}"
    write_atomic(root / COMPACTION_RECORD, orjson.dumps({"partitions": record}), durable=True)
    for part, entry in todo.items():
        finish_swap(root, part, entry)


def compact_folder(spark, root: str | Path, schema, sort_by: list[str], config: PhotonConfig,
                   now_us: int | None = None) -> CompactionStatistics:
    """Compact the closed partitions of one output folder and delete JSONL swapped out long enough ago."""
    root = Path(root)
    stats = CompactionStatistics()
    if not root.is_dir():
        return stats
    _finish_earlier_swaps(root)
    todo = closed_partitions(root, now_us if now_us is not None else time.time_ns() // 1000,
                             config.compact.close_after_s)
    gen = _next_generation(root) if todo else 0
    for part, names in todo.items():
        staged = f"_compacted/g{gen:06d}/{part}"
        rows = compact_partition(spark, root, part, names, schema, sort_by, root / staged)
        _step("written", root, part)
        record = compaction_record(root)
        entry = record[part] = {"path": staged, "kept": f"_compacted/g{gen:06d}/jsonl/{part}", "files": names,
                                "at_us": time.time_ns() // 1000}
        write_atomic(root / COMPACTION_RECORD, orjson.dumps({"partitions": record}), durable=True)
        _step("recorded", root, part)
        finish_swap(root, part, entry)
        stats += CompactionStatistics(1, rows, len(names), 0)
    return stats + delete_swapped_out(root, config.compact.keep_jsonl_s,     # after this run's swaps
                                      now_us if now_us is not None else time.time_ns() // 1000)


def delete_swapped_out(root: Path, keep_s: float, now_us: int) -> CompactionStatistics:
    """Delete the kept JSONL of partitions swapped out at least ``keep_s`` ago (and the empty folders their
    generation leaves)."""
    deleted = 0
    for part, entry in compaction_record(root).items():
        if entry.get("at_us", now_us) + int(keep_s * 1e6) > now_us or "kept" not in entry:
            continue
        kept = root / entry["kept"]
        if kept.is_dir():
            deleted += sum(1 for p in kept.iterdir() if p.name.endswith(".jsonl"))
            shutil.rmtree(kept)
        gen = root / Path(entry["path"]).parts[0] / Path(entry["path"]).parts[1]
        for folder in sorted((p for p in gen.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [gen, gen.parent]:
            try:
                folder.rmdir()                       # only empty ones: Parquet not shown yet stays
            except OSError:
                pass
    pins = root / PINS_DIR
    for folder in pins.iterdir() if pins.is_dir() else ():     # pins of readers gone (killed) long ago
        try:
            if folder.stat().st_mtime * 1e6 + keep_s * 1e6 <= now_us:
                shutil.rmtree(folder, ignore_errors=True)
        except FileNotFoundError:
            pass
    return CompactionStatistics(jsonl_files_deleted=deleted)


# ---- object kinds (S3) ---------------------------------------------------------------------------------
#
# The same tables and the same record, with copies and deletes where a folder has renames: the closed
# partition's JSONL objects are copied to a local scratch folder and compacted there by Spark (step 1-2);
# the Parquet files are uploaded under ``<kind>/_compacted/g<N>/<partition>/`` (hidden); the record object
# ``<kind>/_compaction.json`` is put (3); *hide*: each JSONL object is copied to its kept name
# ``<kind>/_compacted/g<N>/jsonl/<partition>/<file>`` and deleted (4); *show*: each Parquet object is copied
# to ``<kind>_parquet/<partition>/`` and its staging copy deleted (5); kept objects are deleted after
# ``keep_jsonl_s`` (6). An object store has no atomic rename of a folder: during the hide a plain reader
# listing the JSONL table may see part of the hour (Photon's readers take the hour from the record, whole);
# hide before show still means a plain reader never counts a row twice.


def _object_partitions(snap, now_us: int, close_after_s: float) -> dict[str, list[str]]:
    """Closed, not yet compacted partitions of an object output snapshot -> their object names: the hour
    ended ``close_after_s`` ago, no line of it is still staged locally (open, or closed and not uploaded)."""
    by_part: dict[str, list[str]] = {}
    for o in snap.objects:
        part, _, name = o.name.rpartition("/")
        by_part.setdefault(part, []).append(name)
    staged = {rel.rpartition("/")[0] for rel in snap.local}
    out = {}
    for part, names in sorted(by_part.items()):
        start = partition_start_us(part)
        if start is None or part in snap.compacted or part in staged:
            continue
        if start + HOUR_US + int(close_after_s * 1e6) > now_us:
            continue
        out[part] = sorted(names)
    return out


def finish_object_swap(publisher, part: str, entry: dict, listed: set[str]) -> None:
    """Steps 4 and 5 for one recorded partition of an object output (``listed``: the object names below
    ``publisher`` now), each only if not done yet (also finishes a swap a killed run began)."""
    stray = sorted(n for n in listed if n.startswith(part + "/") and n.endswith(".jsonl")
                   and n.rpartition("/")[2] not in entry.get("files", []))
    if stray:
        raise RuntimeError(f"cannot hide {publisher.url}/{part}: {stray} are not in its Parquet")
    for name in entry.get("files", []):
        if f"{part}/{name}" in listed:
            publisher.put(f"{entry['kept']}/{name}", publisher.read(f"{part}/{name}"))
            publisher.delete(f"{part}/{name}")
    _step("hidden", Path(publisher.url), part)
    table = parquet_publisher(publisher).child(part)
    for name in sorted(n for n in listed if n.startswith(entry["path"] + "/")):
        table.put(name[len(entry["path"]) + 1:], publisher.read(name))
        publisher.delete(name)
    _step("shown", Path(publisher.url), part)


def compact_objects(spark, output, schema, sort_by: list[str], config: PhotonConfig,
                    now_us: int | None = None) -> CompactionStatistics:
    """Compact the closed partitions of one object output (``output``: its :class:`photon.OutputReader`)
    and delete kept JSONL objects swapped out long enough ago (see the comment above)."""
    import tempfile

    now_us = now_us if now_us is not None else time.time_ns() // 1000
    pub = output.publisher
    stats = CompactionStatistics()
    record = object_compaction_record(pub)
    listed = {o.name for o in pub.objects()}
    for part, entry in record.items():                                  # step 0: swaps a killed run began
        if any(n.startswith((part + "/", entry["path"] + "/")) for n in listed if not n.startswith(entry["kept"])):
            finish_object_swap(pub, part, entry, listed)
    todo = _object_partitions(output.snapshot(), now_us, config.compact.close_after_s)
    gen = f"g{time.time_ns() // 1000:020d}"
    with tempfile.TemporaryDirectory(prefix="photon-compact-", dir=config.spark.local_dir or None) as tmp:
        for part, names in todo.items():
            scratch = Path(tmp) / "jsonl"
            for name in names:
                target = scratch / part / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(pub.read(f"{part}/{name}"))
            written = Path(tmp) / "parquet" / part
            rows = compact_partition(spark, scratch, part, names, schema, sort_by, written)
            staged = f"_compacted/{gen}/{part}"
            for f in sorted(written.glob("*.parquet")):
                pub.put(f"{staged}/{f.name}", f.read_bytes())
            _step("written", Path(pub.url), part)
            record = object_compaction_record(pub)
            entry = record[part] = {"path": staged, "kept": f"_compacted/{gen}/jsonl/{part}", "files": names,
                                    "at_us": time.time_ns() // 1000}
            pub.put(COMPACTION_RECORD, orjson.dumps({"partitions": record}))
            _step("recorded", Path(pub.url), part)
            finish_object_swap(pub, part, entry, {o.name for o in pub.objects()})
            stats += CompactionStatistics(1, rows, len(names), 0)
    deleted = 0
    listed = {o.name for o in pub.objects()}
    for part, entry in object_compaction_record(pub).items():          # step 6
        if entry.get("at_us", now_us) + int(config.compact.keep_jsonl_s * 1e6) > now_us:
            continue
        for name in sorted(n for n in listed if n.startswith(entry["kept"] + "/")):
            pub.delete(name)
            deleted += name.endswith(".jsonl")
    return stats + CompactionStatistics(jsonl_files_deleted=deleted)


def compact(config: PhotonConfig, spark=None, regions=None, now_us: int | None = None) -> CompactionStatistics:
    """``photon compact``: every region's joined and unjoinable output."""
    from photon.app._spark import spark_session
    from photon.app._tables import foreign_schema, joined_schema

    spark = spark or spark_session(config, "photon-compact")
    sort_by = config.compact.sort_by or [config.join.foreign_id_field]
    stats = CompactionStatistics()
    for region in config.pipeline_regions_of(regions):
        for kind, schema, order in (("joined", joined_schema(config, spark), sort_by),
                                    ("unjoinable", foreign_schema(config, spark), [config.join.foreign_id_field])):
            output = region.output_reader(kind, config.s3)
            if output.folder is None:     # objects: its local folder only stages uploads
                stats += compact_objects(spark, output, schema, order, config, now_us)
                continue
            stats += compact_folder(spark, output.folder, schema, order, config, now_us)
    return stats


class PeriodicCompaction(PeriodicChild):
    """``photon run --compact``: ``photon compact`` as a child process every ``[compact].every_s``, for
    ``regions`` (the launcher's pipeline regions; None: every region)."""

    def __init__(self, config: PhotonConfig, env: dict, log_dir: Path, echo, regions=None) -> None:
        args = ["compact", "--config", config.path] + (["--regions", ",".join(regions)] if regions else [])
        super().__init__("compaction", args, config.compact.every_s, env, Path(log_dir) / "compact.log", echo)
