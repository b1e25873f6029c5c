"""``photon verify``: the Spark job that checks "exactly once, eventually" and finds the recoverable clicks.

Inputs, for every region of the config: the foreign input (``<log_root>/<foreign>/`` and the recovery
stream ``<log_root>/<foreign>-recovery/``), the joined output, the unjoinable output, the joiners' lost-ids
ledgers (``<state_dir>/lost/``), the registry export, and (only when some click is unjoinable everywhere)
the primary input. What it reports, counting distinct foreign ids inside the ``[since, until)`` window of
their id's timestamp (with ``[join].foreign_time_field``, ids are the events' Photon keys
``<id>:0:<time_us>``, photon.EventIds, computed from each line by the pipeline's own rule, and the window
is on the time field):

* ``foreign_events``: ids in the foreign input of any region (each id once, however often logged);
* ``joined``: ids in the joined output of any region; ``duplicates``: ids in it more than once (must be 0);
* ``lost``: ids held by the registry yet in no region's output;
* ``recoverable``: lost ids whose raw line is in the input and that a joiner's lost-ids ledger records
  under that same token, or whose token's joiner is no longer running (see :mod:`photon.app._liveness`),
  or whose joiner cannot be seen from here (another host without a status file, a token that does not
  parse) and which were registered more than ``[verify].lost_after_s`` ago (the export's
  ``registered_us``). A lost id of a joiner seen running is never recoverable: it may still write it;
* ``pending``: input ids neither registered, joined nor in an unjoinable log (still being worked on);
* ``unjoinable``: ids in an unjoinable log, neither joined nor registered;
* ``wrongly_unjoinable``: ids in the unjoinable log of every region whose input holds them, joined
  nowhere, whose primary exists in some region's primary input.

Order matters for recovery's safety: the registry export is taken first, then every joiner named by its
tokens is judged alive or not, and only then is the output listed. A joiner judged stopped wrote nothing
after the listing, so a lost id under its token stays lost until recovery deletes it.

Unreadable input is never taken as empty: a missing region folder, an incomplete export, or a joined or
unjoinable line that does not parse raises :class:`VerifyInputError` naming the place.

Over S3 (``s3://`` log or output roots) the same: input objects are read with boto3 inside Spark tasks
(:func:`photon._spark_io.stream_text`); the output of a region publishing to S3 is its published objects plus what
its staging folder (``<state_dir>/outbox``) still holds, taken as :func:`photon._output.s3_output_snapshot`
says. A missing bucket, an empty foreign prefix or an object that cannot be read raises
:class:`VerifyInputError` naming the ``s3://`` location.
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path


import idregistry
import joiner
from photon import (PhotonConfig, SourceError, list_log_files, local_folder, output_snapshot, recovery_stream,
                    storage_kind, stream_objects)
from photon._ids import ID_REGEX, TIMESTAMP_DIGITS, EventIds
from photon._output import LINE_COLUMN, compacted_lines, pinned_compacted, pinned_paths
from photon._spark_io import new_staging, stream_text, union_all
from photon.app._liveness import STOPPED, UNSEEN, verdicts

REPORT_KEYS = ("foreign_events", "joined", "duplicates", "lost", "recoverable", "pending", "unjoinable",
               "wrongly_unjoinable")
ID_PATTERN = f"^{ID_REGEX}$"          # the pipeline's own id format (photon._ids), for Spark's rlike
LEDGER_REASON = "in a lost-ids ledger"
STOPPED_REASON = "its joiner is no longer running"
AGED_REASON = "registered over [verify].lost_after_s ago by a joiner that cannot be seen"


class VerifyInputError(Exception):
    """Input the job could not read; the message names where."""


@dataclass(frozen=True)
class VerifyReport:
    foreign_events: int
    joined: int
    duplicates: int
    lost: int
    recoverable: int
    pending: int
    unjoinable: int
    wrongly_unjoinable: int
    duplicate_ids: tuple = ()             # up to 20 (id, times) of the duplicates
    recoverable_path: str = ""            # Parquet folder of the recoverable events
    export_dir: str = ""
    timings: dict = field(default_factory=dict)   # read_s, join_s, export_s

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in REPORT_KEYS}


def parse_time(text: str) -> int:
    """``--since``/``--until``: epoch seconds (``1763712000.5``), epoch microseconds (16+ digits) or
    ISO 8601 (``2025-11-21T08:00:00``, UTC unless it names a zone); returns microseconds."""
    from datetime import datetime, timezone
    t = text.strip()
    try:
        if t.isdigit() and len(t) >= 16:
            return int(t)
        return int(float(t) * 1_000_000)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(t)
    except ValueError:
        raise ValueError(f"not a time: {text!r} (epoch seconds, epoch microseconds or ISO 8601)") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(dt.timestamp() * 1_000_000)


# ---- reading ----------------------------------------------------------------------------------------

def list_output(directory: Path) -> tuple[list[str], list[tuple[str, bytes]], list[str]]:
    """``(published files, [(file, complete lines)], compacted Parquet folders)`` of an output folder, as the
    output contract says (:func:`photon.output_snapshot`): published JSONL files and the Parquet folders of
    compacted partitions (both read later by Spark, never through the driver: they never change, and the
    folders are pinned for this process's life), and read now the committed prefix of every open file."""
    published, partial, parquet = [], [], []
    if not directory.is_dir():
        return published, partial, parquet
    snap = output_snapshot(directory)
    published = [str(path) for path in pinned_paths(snap, time.time_ns() // 1000).values()]
    for rel in snap.open:
        data = snap.read_open(rel)
        partial.append((str(directory / rel), data[: data.rfind(b"\n") + 1]))
    parquet = [str(folder) for _, folder in sorted(pinned_compacted(snap).items())]
    return published, partial, parquet


def _lines_df(spark, files: list[str], partial: list[tuple[str, bytes]], region: str, more=None,
              parquet: list[str] = ()):
    """Rows ``(value, file, region)`` of published files and compacted partitions' Parquet folders (both read
    by Spark), in-progress lines and ``more`` (a DataFrame ``(value, file)``, e.g. from
    :func:`photon._spark_io.stream_text`)."""
    from pyspark.sql import functions as F
    frames = [] if more is None else [more]
    if files:
        frames.append(spark.read.text(files).select("value", F.input_file_name().alias("file")))
    if parquet:    # each compacted line is kept as written, in one column
        frames.append(spark.read.parquet(*parquet).select(F.col(LINE_COLUMN).cast("string").alias("value"),
                                                          F.input_file_name().alias("file")))
    rows = [(line.decode("utf-8", "replace"), name) for name, data in partial for line in data.split(b"\n") if line]
    if rows:
        frames.append(spark.createDataFrame(rows, "value string, file string"))
    if not frames:
        return spark.createDataFrame([], "value string, file string, region string")
    return union_all(frames).withColumn("region", F.lit(region))


def _window(df, since_us, until_us):
    from pyspark.sql import functions as F
    ts = F.substring("id", -TIMESTAMP_DIGITS, TIMESTAMP_DIGITS).cast("long")
    if since_us is not None:
        df = df.filter(ts >= since_us)
    if until_us is not None:
        df = df.filter(ts < until_us)
    return df


def _ids(df, id_field: "str | EventIds", extra: str | None = None, user_id: bool = False):
    """Adds ``id`` (and ``ref``, the ``extra`` field) to rows of JSON lines. Given a photon.EventIds with a
    time field, ``id`` is each line's Photon key (``<id>:0:<time_us>``, the one the registry holds; null for
    a line the pipeline quarantines), or with ``user_id`` the user's id of a good line."""
    from pyspark.sql import functions as F
    ids = id_field if isinstance(id_field, EventIds) else None
    field_name = ids.id_field if ids is not None else id_field
    cols = [field_name] + ([extra] if extra else [])
    parsed = df.select("*", F.json_tuple("value", *cols).alias(*(["id"] + (["ref"] if extra else []))))
    if ids is None or not ids.custom:
        return parsed
    key = F.udf(_key_of_line(ids), "string", useArrow=False)("value")     # no pandas here: plain rows
    return parsed.withColumn("id", F.when(key.isNotNull(), F.col("id")) if user_id else key)


def _key_of_line(ids: EventIds):
    """A picklable ``line -> Photon key | None`` for a Spark UDF (the pipeline's own rule, photon.EventIds)."""
    return ids.key_of_line


def _first_bad_line(sources, id_field: str, bad_values: list[str]) -> str:
    """Where the first of ``bad_values`` (lines without a readable id) is: ``file at byte N``; ``sources``
    are ``(name, read)`` pairs, ``read()`` giving the bytes Spark read."""
    wanted = {v.encode("utf-8", "replace") for v in bad_values}
    for name, read in sources:
        try:
            data = read()
        except OSError:
            continue
        pos = 0
        for line in data.split(b"\n"):
            if line in wanted:
                return f"{name} at byte {pos}"
            pos += len(line) + 1
    return "an unknown file"


def _staging(config: PhotonConfig) -> str:
    return new_staging(config.spark.local_dir or None)


def _output_lines(spark, config: PhotonConfig, region, kind: str):
    """One region's ``kind`` output as rows ``(value, file, region)`` and the ``(name, read)`` sources
    :func:`_first_bad_line` searches."""
    folder = region.joined_dir if kind == "joined" else region.unjoinable_dir
    output = region.output_reader(kind, config.s3)
    if output.folder is not None:
        files, partial, parquet = list_output(output.folder)
        sources = [(f, lambda f=f: Path(f).read_bytes()) for f in files]
        sources += [(name, lambda d=data: d) for name, data in partial]
        sources += [(f, lambda f=f: b"".join(x + b"\n" for x in compacted_lines(Path(f), "."))) for f in parquet]
        return _lines_df(spark, files, partial, region.name, parquet=parquet), sources
    url = region.output_url(kind)
    try:
        snap = output.snapshot()
        objects = stream_text(spark, url, config.s3, snap.objects, _staging(config))
    except (SourceError, OSError) as e:
        raise VerifyInputError(f"region {region.name}: {kind} output {url}: {e}") from None
    partial = [(f"{url}/{rel} (staged in {folder})", data) for rel, data in sorted(snap.local.items())]
    partial += [(f"{url}/{part} (compacted)", b"".join(line + b"\n" for line in snap.compacted_lines(part)))
                for part in sorted(snap.compacted)]
    sources = [(f"{url}/{o.name}", lambda n=o.name: snap.read(n)) for o in snap.objects]
    return _lines_df(spark, [], partial, region.name, objects), sources + [(n, lambda d=d: d) for n, d in partial]


def _read_outputs(spark, config: PhotonConfig):
    """Every region's joined and unjoinable output as rows ``(id, region, kind)`` (cached); raises
    :class:`VerifyInputError` naming the first line without a readable id."""
    from pyspark.sql import functions as F
    id_field = config.join.foreign_id_field
    ids = config.join.foreign_ids
    frames, sources = [], {}
    for region in config.pipeline_regions:
        root = region.output_root
        if not storage_kind(root).exists(root, config.s3):
            raise VerifyInputError(f"region {region.name}: output folder {root} does not exist")
        for kind in ("joined", "unjoinable"):
            df, sources[(region.name, kind)] = _output_lines(spark, config, region, kind)
            frames.append(_ids(df, ids).withColumn("kind", F.lit(kind)))
    out = union_all(frames).withColumn("bad", F.col("id").isNull() | ~F.col("id").rlike(ID_PATTERN)).cache()
    bad = out.filter("bad").select("value", "region", "kind").limit(5).collect()
    if bad:
        where = _first_bad_line(sources[(bad[0].region, bad[0].kind)], id_field, [r.value for r in bad])
        what = f"{id_field!r}" + (f" and {ids.time_field!r}" if ids.custom else "")
        raise VerifyInputError(f"region {bad[0].region}: {bad[0].kind} output line without a readable "
                               f"{what} in {where}: {bad[0].value[:120]!r}")
    return out


def _input_lines(spark, config: PhotonConfig, region, stream: str):
    """Rows ``(value, file, region)`` of ``stream`` and its recovery stream in ``region``'s log root."""
    url = region.stream_url(stream)
    root = local_folder(url)
    if root is not None:        # a local folder: Spark reads its files in place
        if not root.is_dir():
            raise VerifyInputError(f"region {region.name}: input folder {root} does not exist")
        files = [str(root / f) for f in list_log_files(root)]
        recovery = local_folder(region.stream_url(recovery_stream(stream)))
        files += [str(recovery / f) for f in list_log_files(recovery)]
        return _lines_df(spark, files, [], region.name)
    recovery = region.stream_url(recovery_stream(stream))
    try:
        objects = stream_objects(url, config.s3)
        if not objects:
            raise VerifyInputError(f"region {region.name}: input {url} holds no objects")
        df = stream_text(spark, url, config.s3, objects, _staging(config)).unionByName(
            stream_text(spark, recovery, config.s3, None, _staging(config)))
    except (SourceError, OSError) as e:
        raise VerifyInputError(f"region {region.name}: input {url}: {e}") from None
    return _lines_df(spark, [], [], region.name, df)


def _read_input(spark, config: PhotonConfig, stream: str, id_field, ref_field: str | None, user_id: bool = False):
    """Every region's input lines of ``stream`` (and its recovery folder) as ``(id, [ref,] value, region)``;
    lines without a well-formed id are left out (the pipeline quarantines them). ``id_field``: see
    :func:`_ids`."""
    from pyspark.sql import functions as F
    frames = []
    for region in config.pipeline_regions:
        df = _ids(_input_lines(spark, config, region, stream), id_field, ref_field, user_id)
        good = F.col("id").isNotNull() if isinstance(id_field, EventIds) and id_field.custom \
            else F.col("id").rlike(ID_PATTERN)
        frames.append(df.filter(good).drop("file"))
    return union_all(frames)


def check_inputs(config: PhotonConfig) -> None:
    """Fail fast, before the registry export, on a region whose foreign input or output root is missing:
    a local folder that does not exist, an S3 bucket that cannot be used, a foreign prefix with no objects."""
    for region in config.pipeline_regions:
        foreign = region.stream_url(config.join.foreign_stream)
        try:
            if local_folder(foreign) is None and not stream_objects(foreign, config.s3):
                raise VerifyInputError(f"region {region.name}: input {foreign} holds no objects")
            storage_kind(region.output_root).check(region.output_root, config.s3)
        except SourceError as e:
            raise VerifyInputError(f"region {region.name}: {e}") from None
        for folder in (foreign, region.output_root):
            if not storage_kind(folder).exists(folder, config.s3):
                raise VerifyInputError(f"region {region.name}: folder {folder} does not exist")


# ---- the job ----------------------------------------------------------------------------------------

def take_export(config: PhotonConfig, out: Path) -> Path:
    client = idregistry.connect(idregistry.registry_endpoints(config))
    try:
        idregistry.export_registry(client, out)
    finally:
        client.close()
    return out


def _mark_lost(every, aged_before_us: int):
    """Adds ``is_lost``, ``is_recoverable`` and its ``reason`` (the rule of the module docstring) to the
    joined-up rows (columns token, n_out, raw, in_ledger, verdict, registered_us)."""
    from pyspark.sql import functions as F
    in_ledger = F.coalesce("in_ledger", F.lit(False))
    stopped = F.coalesce(F.col("verdict") == STOPPED, F.lit(False))
    aged = F.coalesce((F.col("verdict") == UNSEEN) & (F.col("registered_us") > 0)
                      & (F.col("registered_us") < aged_before_us), F.lit(False))
    return every.withColumn("is_lost", F.col("token").isNotNull() & F.col("n_out").isNull()) \
        .withColumn("is_recoverable", F.col("is_lost") & (F.col("token") != "") & F.col("raw").isNotNull()
                    & (in_ledger | stopped | aged)) \
        .withColumn("reason", F.when(in_ledger, LEDGER_REASON).when(stopped, STOPPED_REASON).otherwise(AGED_REASON))


def run_verify(config: PhotonConfig, spark, *, since_us: int | None = None, until_us: int | None = None,
               export_dir: str | Path | None = None, out_dir: str | Path | None = None,
               show_progress: bool = False) -> VerifyReport:
    """Run the verification (see the module docstring); writes the recoverable events as Parquet under
    ``out_dir`` (default ``config.verify_dir``)/``recoverable`` with columns id, token, raw, ref, reason,
    registered_us."""
    from pyspark.sql import functions as F
    from photon.app._spark import progress

    out = Path(out_dir) if out_dir else config.verify_dir
    out.mkdir(parents=True, exist_ok=True)
    check_inputs(config)                        # fail before the (possibly long) export
    timings = {}
    t0 = time.perf_counter()
    if export_dir is None:
        export_dir = take_export(config, Path(tempfile.mkdtemp(prefix="export-", dir=out)))
    export_dir = Path(export_dir)
    try:
        manifest = idregistry.check_export(export_dir)
    except idregistry.ExportError as e:
        raise VerifyInputError(str(e)) from None
    timings["export_s"] = time.perf_counter() - t0

    with progress(spark, "verify", show_progress):
        t0 = time.perf_counter()
        export_files = [str(export_dir / s["file"]) for s in manifest["shards"].values()]
        exported = spark.read.parquet(*export_files)
        registered_us = F.col("registered_us") if "registered_us" in exported.columns else F.lit(0).cast("long")
        registered = _window(exported, since_us, until_us) \
            .select("id", "token", registered_us.alias("registered_us")) \
            .withColumn("prefix", F.regexp_extract("token", r"^(.*)/[^/]*$", 1))
        registered = registered.cache()
        prefixes = [r.prefix for r in registered.select("prefix").distinct().collect() if r.prefix]
        # judged before the output is listed: a joiner stopped now wrote all it ever will by the listing
        grace_us = int(config.verify.remote_joiner_grace_s * 1e6)
        now_us = time.time_ns() // 1000
        judged = verdicts(prefixes, [r.state_dir for r in config.regions], now_us, grace_us)
        aged_before_us = now_us - int(config.verify.lost_after_s * 1e6)
        ledger = [(e["id"], e["token"]) for r in config.regions for e in joiner.read_lost(r.state_dir)
                  if isinstance(e.get("token"), str)]

        cached_outputs = _read_outputs(spark, config)
        outputs = _window(cached_outputs, since_us, until_us)
        joined = outputs.filter(F.col("kind") == "joined").groupBy("id") \
            .agg(F.count(F.lit(1)).alias("n_out")).cache()
        unjoin = outputs.filter(F.col("kind") == "unjoinable").groupBy("id") \
            .agg(F.countDistinct("region").alias("u_regions")).cache()
        foreign = _window(_read_input(spark, config, config.join.foreign_stream, config.join.foreign_ids,
                                      config.join.foreign_ref_field), since_us, until_us)
        foreign = foreign.groupBy("id").agg(F.first("value").alias("raw"), F.first("ref").alias("ref"),
                                            F.countDistinct("region").alias("in_regions")).cache()
        for df in (joined, unjoin, foreign):
            df.count()
        timings["read_s"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        judged_df = spark.createDataFrame([(p, v) for p, v in judged.items() if v in (STOPPED, UNSEEN)],
                                          "prefix string, verdict string")
        ledger_df = spark.createDataFrame(ledger, "id string, token string").dropDuplicates() \
            .withColumn("in_ledger", F.lit(True))
        reg = registered.join(F.broadcast(judged_df), "prefix", "left") \
            .join(ledger_df, ["id", "token"], "left")
        every = foreign.join(joined, "id", "full").join(reg, "id", "full").join(unjoin, "id", "full")
        every = _mark_lost(every, aged_before_us) \
            .withColumn("is_unjoinable", F.col("u_regions").isNotNull() & F.col("n_out").isNull()
                        & F.col("token").isNull()) \
            .withColumn("everywhere", F.col("is_unjoinable") & F.col("in_regions").isNotNull()
                        & (F.col("u_regions") >= F.col("in_regions"))).cache()
        counts = every.agg(
            F.count("raw").alias("foreign_events"),
            F.count("n_out").alias("joined"),
            F.sum(F.when(F.col("n_out") > 1, 1).otherwise(0)).alias("duplicates"),
            F.sum(F.col("is_lost").cast("int")).alias("lost"),
            F.sum(F.col("is_recoverable").cast("int")).alias("recoverable"),
            F.sum((F.col("raw").isNotNull() & F.col("token").isNull() & F.col("n_out").isNull()
                   & F.col("u_regions").isNull()).cast("int")).alias("pending"),
            F.sum(F.col("is_unjoinable").cast("int")).alias("unjoinable"),
            F.sum(F.col("everywhere").cast("int")).alias("everywhere"),
        ).collect()[0].asDict()
        counts = {k: int(v or 0) for k, v in counts.items()}
        dups = tuple((r.id, int(r.n_out)) for r in every.filter(F.col("n_out") > 1)
                     .select("id", "n_out").orderBy("id").limit(20).collect())
        wrongly = 0
        if counts.pop("everywhere"):
            primary = _read_input(spark, config, config.join.primary_stream, config.join.primary_ids, None, True) \
                .select(F.col("id").alias("ref")).distinct()
            wrongly = every.filter("everywhere").join(primary, "ref", "left_semi").count()
        recoverable_path = out / "recoverable"
        every.filter("is_recoverable").select("id", "token", "raw", "ref", "reason", "registered_us") \
            .coalesce(1).write.mode("overwrite").parquet(str(recoverable_path))
        timings["join_s"] = time.perf_counter() - t0
        for df in (registered, cached_outputs, joined, unjoin, foreign, every):
            df.unpersist()
    return VerifyReport(**counts, wrongly_unjoinable=wrongly, duplicate_ids=dups,
                        recoverable_path=str(recoverable_path), export_dir=str(export_dir),
                        timings={k: round(v, 3) for k, v in timings.items()})


def read_recoverable(path: str | Path) -> list[dict]:
    """The rows a verify run wrote (``id, token, raw, ref, reason, registered_us``; 0 when a run of an
    earlier version wrote no time)."""
    import pyarrow.parquet as pq
    path = Path(path)
    files = sorted(p for p in path.glob("*.parquet")) if path.is_dir() else [path]
    rows = []
    for f in files:
        rows += pq.read_table(f).to_pylist()
    for r in rows:
        r["registered_us"] = r.get("registered_us") or 0
    return rows


def format_report(report: VerifyReport) -> str:
    rows = [(k, getattr(report, k)) for k in REPORT_KEYS]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v:>10}" for k, v in rows]
    if report.duplicate_ids:
        lines.append("duplicated ids: " + ", ".join(f"{i} ({n} times)" for i, n in report.duplicate_ids))
    if report.recoverable:
        lines.append(f"recoverable events written to {report.recoverable_path}")
    return "\n".join(lines)
