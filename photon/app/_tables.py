"""Photon's logs as Spark tables: the joined output, the input streams, unjoinable events and quarantine,
across every region of a config. Schemas are ``[sql]``'s when given; otherwise each stream's is inferred
from a sample of it and cached under the state dir (:func:`stream_schemas`).

Every DataFrame here is a snapshot taken when it is made, following the output contract (see
:mod:`photon._output`): published JSONL files, the committed prefix of files still being written (copied
to a scratch folder, since Spark cannot read part of a file) and compacted Parquet partitions, each line
once. A line that is not JSON or lacks its id field is not a row (the id column is never NULL); a value of
the wrong type reads as NULL; neither fails a query.

Tables (names from the config): ``joined`` (foreign fields, the primary nested as a struct under
``[join].nest_primary_as``, ``_photon``, ``region``, ``date``, ``hour``), one per input stream
(``queries``, ``clicks``: its fields and ``region``), ``unjoinable`` (foreign fields, ``region``, ``date``,
``hour``) and ``quarantine`` (``file``, ``offset``, ``reason``, ``raw``, ``at_us``, ``source``,
``region``).

Over S3 (``s3://`` log or output roots) the tables hold the same rows: objects are read with boto3 inside
Spark tasks (:func:`photon._spark_io.stream_text`, :func:`photon.read_stream_json`) and lines parsed with the same
schemas; an output published to S3 is read as :func:`photon._output.s3_output_snapshot` says (published
objects plus what the region's staging folder still holds, so a query beside the region sees lines as
fresh as over a local root), ``date`` and ``hour`` taken from the objects' partition path; the quarantine
is the region's local quarantine files plus uploaded ones not held locally.
"""
from __future__ import annotations

import atexit
import shutil
from dataclasses import dataclass
import tempfile
import time
import uuid
from pathlib import Path

from photon import PhotonConfig, local_folder, output_snapshot, read_stream_json, stream_objects, write_atomic
from photon._output import LINE_COLUMN, pinned_compacted, pinned_paths
from photon._spark_io import stream_text, union_all

PHOTON_DDL = "region STRING, joiner STRING, joined_at_us BIGINT"
QUARANTINE_DDL = "file STRING, offset BIGINT, reason STRING, raw STRING, at_us BIGINT"
_scratch_root: Path | None = None


def _ddl(spark, text: str):
    from pyspark.sql.types import StructType, _parse_datatype_string

    parsed = _parse_datatype_string(text)
    if not isinstance(parsed, StructType):
        raise ValueError(f"not a list of fields: {text!r}")
    return parsed


SCHEMA_CACHE = "sql/schemas.json"
"""Under the first region's ``state_dir``: the schemas inferred for streams without an explicit ``[sql]``
schema, ``{"<stream>": {"ddl", "lines", "at_us"}}``."""
SAMPLE_READ_BYTES = 4 << 20


@dataclass(frozen=True)
class StreamSchema:
    """One stream's schema and where it came from: ``"config"`` (``[sql]``), ``"inferred"`` (sampled now),
    ``"cached"`` (sampled earlier, read from :data:`SCHEMA_CACHE`) or ``"ids"`` (nothing to sample)."""
    ddl: str
    origin: str
    lines: int = 0


def schema_cache_path(config: PhotonConfig) -> Path:
    return Path(config.regions[0].state_dir) / SCHEMA_CACHE


def sample_stream(config: PhotonConfig, stream: str, n: int) -> list[bytes]:
    """Up to ``n`` complete lines of ``stream`` over every pipeline region, newest files first (local or
    S3, through the source layer)."""
    from photon import open_source

    out: list[bytes] = []
    for region in config.pipeline_regions:
        try:
            source = open_source(region.stream_url(stream), config.s3)
            objects = sorted(source.scan().values(), key=lambda o: o.name, reverse=True)
        except (OSError, ValueError):
            continue
        per_region = n // max(1, len(config.pipeline_regions)) or n
        got: list[bytes] = []
        for o in objects:
            if len(got) >= per_region or o.size <= 0:
                break
            try:
                data, _ = source.read(o.name, 0, min(o.size, SAMPLE_READ_BYTES))
            except OSError:
                continue
            got += [x for x in data[: data.rfind(b"\n") + 1].split(b"\n") if x.strip()][: per_region - len(got)]
        out += got
    return out[:n]


def infer_schema(spark, lines: list[bytes], id_fields: list[str]):
    """Spark's JSON schema inference over ``lines``; the id fields always STRING; None without a row."""
    from pyspark.sql.types import StringType, StructField, StructType

    if not lines:
        return None
    folder = _sample_dir()
    (folder / "sample.jsonl").write_bytes(b"".join(x + b"\n" for x in lines))
    schema = spark.read.json(str(folder / "sample.jsonl")).schema
    shutil.rmtree(folder, ignore_errors=True)
    fields = [StructField(f.name, StringType() if f.name in id_fields else f.dataType)
              for f in schema.fields if f.name != "_corrupt_record"]
    fields += [StructField(name, StringType()) for name in id_fields if name not in {f.name for f in fields}]
    return StructType(fields)


def stream_schemas(config: PhotonConfig, spark, refresh: bool = False) -> dict[str, StreamSchema]:
    """The schema of the foreign and the primary stream (keys ``"foreign"``, ``"primary"``): ``[sql]``'s
    when given (it always wins), else inferred from ``[sql].sample_lines`` lines of the stream and cached
    under the state dir (``refresh``: sample again)."""
    import orjson
    j = config.join
    wanted = {"foreign": (config.sql.foreign_schema, j.foreign_stream, [j.foreign_id_field, j.foreign_ref_field]),
              "primary": (config.sql.primary_schema, j.primary_stream, [j.primary_id_field])}
    cache_path = schema_cache_path(config)
    try:
        cache = {} if refresh else orjson.loads(cache_path.read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        cache = {}
    out, changed = {}, False
    for kind, (explicit, stream, ids) in wanted.items():
        if explicit:
            out[kind] = StreamSchema(explicit, "config")
            continue
        hit = cache.get(stream)
        if hit and hit.get("sample_lines") == config.sql.sample_lines and hit.get("ddl"):
            out[kind] = StreamSchema(hit["ddl"], "cached", int(hit.get("lines", 0)))
            continue
        lines = sample_stream(config, stream, config.sql.sample_lines)
        schema = infer_schema(spark, lines, ids)
        if schema is None:
            out[kind] = StreamSchema(", ".join(f"`{f}` STRING" for f in ids), "ids")
            continue
        ddl = ", ".join(type(schema)([f]).toDDL() for f in schema.fields)      # one field per item, readable
        out[kind] = StreamSchema(ddl, "inferred", len(lines))
        cache[stream] = {"ddl": out[kind].ddl, "lines": len(lines), "sample_lines": config.sql.sample_lines,
                         "at_us": time.time_ns() // 1000}
        changed = True
    if changed:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(cache_path, orjson.dumps(cache, option=orjson.OPT_INDENT_2))
    return out


def pin_snippet(schemas: dict[str, StreamSchema]) -> str:
    """The ``[sql]`` section that pins ``schemas`` (TOML)."""
    import json
    return "[sql]\n" + "".join(f"{kind}_schema = {json.dumps(s.ddl)}\n" for kind, s in schemas.items())


def foreign_schema(config: PhotonConfig, spark):
    return _ddl(spark, stream_schemas(config, spark)["foreign"].ddl)


def primary_schema(config: PhotonConfig, spark):
    return _ddl(spark, stream_schemas(config, spark)["primary"].ddl)


def joined_schema(config: PhotonConfig, spark):
    """The schema of one joined line: foreign fields, the nested primary, ``_photon``."""
    from pyspark.sql.types import StructField, StructType

    schema = foreign_schema(config, spark)
    fields = [f for f in schema.fields if f.name not in (config.join.nest_primary_as, "_photon")]
    fields.append(StructField(config.join.nest_primary_as, primary_schema(config, spark)))
    fields.append(StructField("_photon", _ddl(spark, PHOTON_DDL)))
    return StructType(fields)


def _sample_dir() -> Path:
    """A fresh scratch folder under the system's temp folder (removed when the process exits)."""
    global _scratch_root
    if _scratch_root is None:
        _scratch_root = Path(tempfile.mkdtemp(prefix="photon-tables-"))
        atexit.register(shutil.rmtree, _scratch_root, True)
    d = _scratch_root / uuid.uuid4().hex
    d.mkdir(parents=True)
    return d


def scratch_dir(config: PhotonConfig) -> Path:
    """A fresh folder for the committed prefixes of one snapshot (removed when the process exits)."""
    global _scratch_root
    if _scratch_root is None:
        base = config.spark.local_dir or None
        _scratch_root = Path(tempfile.mkdtemp(prefix="photon-tables-", dir=base))
        atexit.register(shutil.rmtree, _scratch_root, True)
    d = _scratch_root / uuid.uuid4().hex
    d.mkdir(parents=True)
    return d


def output_dataframe(spark, directory: str | Path, schema, id_field: str, scratch: Path):
    """One output folder (joined/ or unjoinable/) as a DataFrame with ``schema`` plus the partition columns
    ``date`` and ``hour``, following the output contract; None if it holds nothing yet."""
    from pyspark.sql import functions as F

    root = Path(directory)
    snap = output_snapshot(root)
    parts = []
    reader = spark.read.schema(schema).option("mode", "PERMISSIVE")
    by_base: dict[str, list[str]] = {}          # published files, pinned where compaction may move them
    for rel, path in pinned_paths(snap, time.time_ns() // 1000).items():
        by_base.setdefault(str(path)[: -len(rel) - 1], []).append(str(path))
    for base, files in sorted(by_base.items()):
        parts.append(reader.option("basePath", base).json(files))
    copies = []
    for rel in snap.open:
        data = snap.read_open(rel)
        data = data[: data.rfind(b"\n") + 1]
        if data:
            target = scratch / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            copies.append(str(target))
    if copies:
        parts.append(reader.option("basePath", str(scratch)).json(copies))
    by_table: dict[str, list[str]] = {}        # the Parquet table, or (mid-swap) a staging generation
    for part, folder in pinned_compacted(snap).items():
        by_table.setdefault(str(folder)[: -len(part) - 1], []).append(str(folder))
    for table, dirs in sorted(by_table.items()):
        df = spark.read.option("basePath", table).parquet(*dirs)
        have = {f.name: f.dataType for f in df.schema.fields}
        if all(have.get(f.name) == f.dataType for f in schema.fields):
            parts.append(df.select(*[F.col(f"`{f.name}`") for f in schema.fields], "date", "hour"))
        else:      # compacted under another schema: parse the kept lines with this one
            parsed = df.select(F.from_json(LINE_COLUMN, schema).alias("r"), "date", "hour")
            parts.append(parsed.select("r.*", "date", "hour"))
    df = union_all(parts)
    return None if df is None else df.where(F.col(f"`{id_field}`").isNotNull())


def _partition_columns(file_col):
    """``date`` and ``hour`` from an output file's path (``.../date=YYYY-MM-DD/hour=HH/...``), NULL elsewhere."""
    from pyspark.sql import functions as F

    date = F.regexp_extract(file_col, r"/date=([0-9]{4}-[0-9]{2}-[0-9]{2})/", 1)
    hour = F.regexp_extract(file_col, r"/hour=([0-9]{1,2})/", 1)
    return (F.when(date != "", F.to_date(date)).alias("date"),
            F.when(hour != "", hour.cast("int")).alias("hour"))


def object_output_dataframe(spark, output, schema, id_field: str, s3, scratch: Path):
    """An object kind's output (``output``: its :class:`photon.OutputReader`, e.g. S3's published objects
    and the region's staging folder) as :func:`output_dataframe` gives a local one; None if it holds
    nothing yet."""
    from pyspark.sql import functions as F

    snap = output.snapshot()
    url = output.url
    if not snap.objects and not snap.local and not snap.compacted:
        return None
    text = stream_text(spark, url, s3, snap.objects, scratch)
    rows = [(line.decode("utf-8", "replace"), f"{url}/{rel}") for rel, data in sorted(snap.local.items())
            for line in data.split(b"\n") if line]
    rows += [(line.decode("utf-8", "replace"), f"{url}/{part}/_compacted") for part in sorted(snap.compacted)
             for line in snap.compacted_lines(part)]     # compacted hours: their kept lines, from the Parquet
    if rows:
        text = text.unionByName(spark.createDataFrame(rows, "value string, file string"))
    parsed = text.select(F.from_json("value", schema, {"mode": "PERMISSIVE"}).alias("r"),
                         *_partition_columns(F.col("file")))
    return parsed.select("r.*", "date", "hour").where(F.col(f"`{id_field}`").isNotNull())


def _empty(spark, schema, *extra: str):
    from pyspark.sql.types import DateType, IntegerType, StringType, StructField, StructType

    types = {"region": StringType(), "date": DateType(), "hour": IntegerType(), "source": StringType()}
    return spark.createDataFrame([], StructType([*schema.fields, *(StructField(n, types[n]) for n in extra)]))


def _output_table(config: PhotonConfig, spark, kind: str, schema, regions=None):
    from pyspark.sql import functions as F

    scratch = scratch_dir(config)
    frames = []
    for region in config.pipeline_regions_of(regions):
        output = region.output_reader(kind, config.s3)
        if output.folder is None:
            df = object_output_dataframe(spark, output, schema, config.join.foreign_id_field, config.s3,
                                         scratch / region.name / kind)
        else:
            df = output_dataframe(spark, output.folder, schema, config.join.foreign_id_field, scratch / region.name)
        if df is None:
            continue
        frames.append(df.select(*[F.col(f"`{f.name}`") for f in schema.fields],
                                F.lit(region.name).alias("region"), "date", "hour"))
    out = union_all(frames)
    return out if out is not None else _empty(spark, schema, "region", "date", "hour")


def joined_dataframe(config: PhotonConfig, regions=None, spark=None):
    """The joined output of ``regions`` (names; default all) as one DataFrame: the ``joined`` table of
    ``photon sql`` (one row per committed joined line, see the module docstring)."""
    from photon.app._spark import spark_session

    spark = spark or spark_session(config, "photon")
    return _output_table(config, spark, "joined", joined_schema(config, spark), regions)


def unjoinable_dataframe(config: PhotonConfig, regions=None, spark=None):
    from photon.app._spark import spark_session

    spark = spark or spark_session(config, "photon")
    return _output_table(config, spark, "unjoinable", foreign_schema(config, spark), regions)


def stream_dataframe(config: PhotonConfig, stream: str, schema, id_field: str, spark, regions=None):
    """An input stream (every file below ``<log_root>/<stream>``, any depth) of every region."""
    from pyspark.sql import functions as F

    frames = []
    for region in config.pipeline_regions_of(regions):
        folder = local_folder(region.stream_url(stream))
        if folder is None:     # objects: read through the kind
            df = read_stream_json(spark, region.stream_url(stream), schema, config.s3, scratch_dir(config))
            frames.append(df.where(F.col(f"`{id_field}`").isNotNull()).withColumn("region", F.lit(region.name)))
            continue
        if not folder.is_dir() or not any(p.is_file() for p in folder.rglob("*")):
            continue
        frames.append(spark.read.schema(schema).option("mode", "PERMISSIVE").option("recursiveFileLookup", "true")
                      .json(str(folder)).where(F.col(f"`{id_field}`").isNotNull())
                      .withColumn("region", F.lit(region.name)))
    out = union_all(frames)
    return out if out is not None else _empty(spark, schema, "region")


def quarantine_dataframe(config: PhotonConfig, spark, regions=None):
    from pyspark.sql import functions as F

    schema = _ddl(spark, QUARANTINE_DDL)
    frames = []
    for region in config.pipeline_regions_of(regions):
        files = sorted(str(p) for p in Path(region.quarantine_dir).glob("*.jsonl")) \
            if Path(region.quarantine_dir).is_dir() else []
        if local_folder(region.output_url("quarantine")) is None:     # uploaded whole as they grow: a local copy is the newer one
            df = _s3_quarantine(spark, config, region, schema, files)
            if df is not None:
                frames.append(df)
            continue
        if not files:
            continue
        frames.append(spark.read.schema(schema).json(files).where(F.col("file").isNotNull())
                      .withColumn("source", F.regexp_extract(F.input_file_name(), r"([^/]+)\.jsonl$", 1))
                      .withColumn("region", F.lit(region.name)))
    out = union_all(frames)
    return out if out is not None else _empty(spark, schema, "source", "region")


def _s3_quarantine(spark, config: PhotonConfig, region, schema, local_files: list[str]):
    from pyspark.sql import functions as F

    url = region.output_url("quarantine")
    held = {Path(f).name for f in local_files}
    objects = [o for o in stream_objects(url, config.s3) if o.name.endswith(".jsonl") and "/" not in o.name
               and o.name not in held]
    text = stream_text(spark, url, config.s3, objects, scratch_dir(config))
    if local_files:
        text = text.unionByName(stream_text(spark, str(region.quarantine_dir), None,
                                            [o for o in stream_objects(str(region.quarantine_dir))
                                             if o.name in held]))
    parsed = text.select(F.from_json("value", schema).alias("r"), F.col("file").alias("_object"))
    return (parsed.select("r.*", F.regexp_extract("_object", r"([^/]+)\.jsonl$", 1).alias("source"))
            .where(F.col("file").isNotNull()).withColumn("region", F.lit(region.name)))


def table_dataframes(config: PhotonConfig, spark) -> dict:
    """Every table of ``photon sql`` by name, as DataFrames snapshotted now."""
    j = config.join
    return {
        "joined": joined_dataframe(config, spark=spark),
        j.primary_stream: stream_dataframe(config, j.primary_stream, primary_schema(config, spark),
                                           j.primary_id_field, spark),
        j.foreign_stream: stream_dataframe(config, j.foreign_stream, foreign_schema(config, spark),
                                           j.foreign_id_field, spark),
        "unjoinable": unjoinable_dataframe(config, spark=spark),
        "quarantine": quarantine_dataframe(config, spark),
    }


def register_tables(config: PhotonConfig, spark) -> list[str]:
    """(Re)register every table as a temporary view, snapshotted now; returns their names."""
    tables = table_dataframes(config, spark)
    for name, df in tables.items():
        df.createOrReplaceTempView(name)
    return sorted(tables)
