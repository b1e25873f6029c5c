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

import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path


import idregistry
import joiner
from photon import (PhotonConfig, SourceError, list_log_files, local_folder, output_snapshot, recovery_stream,
                    storage_kind, stream_objects)
from photon._ids import ID_REGEX, TIMESTAMP_DIGITS, EventIds
from photon._output import LINE_COLUMN, compacted_lines, pinned_compacted, pinned_paths
from photon._spark_io import new_staging, stream_text, union_all
from photon.app import _exports, _scanner
from photon.app._liveness import STOPPED, UNSEEN, verdicts

REPORT_KEYS = ("foreign_events", "joined", "duplicates", "lost", "recoverable", "pending", "unjoinable",
               "wrongly_unjoinable")
ID_PATTERN = f"^{ID_REGEX}$"          # the pipeline's own id format (photon._ids), for Spark's rlike
LEDGER_REASON = "in a lost-ids ledger"
STOPPED_REASON = "its joiner is no longer running"
AGED_REASON = "registered over [verify].lost_after_s ago by a joiner that cannot be seen"
TOKEN_PREFIX = r"^(.*)/[^/]*$"        # a token's joiner (host:port/pid/start_us) without its sequence number
MASK_REGIONS = 62                     # up to this many regions, an id's regions are a bit mask in a long
LOOKUP_ON_DRIVER = 50_000             # ids needing more (lost, duplicated, unjoinable everywhere) up to this
                                      # many are collected and looked up by value, beyond it by joins in Spark


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


@dataclass
class _Lines:
    """The lines of one input or output, each read by Spark where it lies: ``files`` (published or logged
    JSONL, read in place), ``staged`` (one file holding the committed prefixes of in-progress output files,
    read on the driver when the output was listed, so that what Spark sees is that moment's committed
    prefix; each non-empty line as the driver split it) and ``frames`` (DataFrames with a ``value`` column:
    S3 objects through :func:`photon._spark_io.stream_text`, compacted partitions' Parquet folders)."""
    files: list = field(default_factory=list)
    staged: list = field(default_factory=list)
    frames: list = field(default_factory=list)

    def values(self, spark, files_keyed=None, with_file: bool = False):
        """Rows ``(value)``: every line as text; with ``files_keyed`` (a set of :func:`_file_key` values), of
        ``files`` only those whose key is in it (Spark prunes the others before reading: a filter on the
        file's metadata), every line of the other sources; with ``with_file`` also ``file``, the
        :func:`_file_key` of the line's file (null for lines of ``staged`` and ``frames``)."""
        from pyspark.sql import functions as F
        no_file = [F.lit(None).cast("long").alias("file")] if with_file else []
        frames = [df.select("value", *no_file) for df in self.frames]
        if self.files:
            text = spark.read.text(self.files)
            if files_keyed is not None:
                text = text.filter(_file_key_in(files_keyed))
            frames.append(text.select("value", *([_file_key().alias("file")] if with_file else [])))
        if self.staged:
            frames.append(spark.read.text(self.staged, lineSep="\n").filter(F.col("value") != "")
                          .select("value", *no_file))
        if frames:
            return union_all(frames)
        rows = _no_rows(spark, "value")
        return rows.withColumn("file", F.lit(None).cast("long")) if with_file else rows

    def ids(self, spark, id_field: "str | EventIds", with_file: bool = False, scan: "_Scan | None" = None):
        """Rows ``(id)``: each line's id as :func:`_ids` reads it (null on a line without a readable one);
        with ``with_file`` also ``file``, the :func:`_file_key` of the line's file (null for lines of
        ``staged`` and ``frames``). With ``scan`` (a :class:`_Scan`), ``files`` are read by its strict-shape
        scanner but those it names for the JSON reader, and lines it rejects are left out (the caller reads
        their files again with the JSON reader: :func:`run_verify`).

        Files are read by Spark's JSON reader with a schema of the id field alone (about a third of
        ``json_tuple``'s CPU per line: no line is materialised as text; the reader still parses and checks
        the whole line, so a line that is not valid JSON has no id); lines of other frames and custom ids
        (the pipeline's own key function needs the line) go through :func:`_ids`. Two readings differ from
        ``json_tuple``'s: a blank line is skipped (here in every source: it holds no click), and a line
        holding a JSON array of objects is read as one record per object (Photon writes neither; the
        pipeline quarantines both)."""
        from pyspark.sql import functions as F
        not_blank = F.col("value").rlike(r"\S")
        no_file = [F.lit(None).cast("long").alias("file")] if with_file else []
        file = [_file_key().alias("file")] if with_file else []
        if isinstance(id_field, EventIds) and id_field.custom:
            return _ids(self.values(spark, with_file=with_file).filter(not_blank), id_field) \
                .select("id", *(["file"] if with_file else []))
        name = id_field.id_field if isinstance(id_field, EventIds) else id_field
        column = "`" + name.replace("`", "``") + "`"
        schema = f"{column} STRING"
        frames = [_ids(df.select("value").filter(not_blank), name).select("id", *no_file) for df in self.frames]
        if self.files and scan is not None and _scanner.plain_name(name):
            frames += scan.ids(spark, self.files, name, column, with_file)
        elif self.files:
            frames.append(spark.read.schema(schema).json(self.files).select(F.col(column).alias("id"), *file))
        if self.staged:
            frames.append(spark.read.schema(schema).option("lineSep", "\n").json(self.staged)
                          .select(F.col(column).alias("id"), *no_file))
        return union_all(frames) if frames else _no_ids(spark, with_file)


@dataclass
class _Scan:
    """One reading of the input and output files' ids by the strict-shape scanner (:mod:`photon.app._scanner`,
    the SQL ``function``): every file but those of ``json_keys`` (:func:`_file_key`s, read by Spark's JSON
    reader) is read as text and each line's id taken from its bytes; a line of another shape (null) is left
    out, and an observation on each reading (``readings``: the text read, the scanner's expression and the
    observation) counts those lines, so that :func:`run_verify` reads their files again with the JSON reader
    (:meth:`rejected` finds those files, in a job of its own and only when some line was left out: the count
    alone keeps the job's plan small, one aggregate of fixed width and no file key on the lines of files whose
    key nothing else needs). Files of ``json_paths``
    (paths as listed: those whose driver-side sample holds a line of another shape,
    :func:`photon.app._scanner.sample_strict`) are read by the JSON reader from the first run on. Lines the
    scanner takes are valid JSON whose id is the one it gives (docs/verify.md, "The job"), so the ids are the
    JSON reader's."""
    function: str
    json_keys: frozenset = frozenset()
    json_paths: frozenset = frozenset()
    readings: list = field(default_factory=list)

    def ids(self, spark, files: list[str], name: str, column: str, with_file: bool) -> list:
        """DataFrames of rows ``(id[, file])`` of ``files``: the scanner's for files in neither ``json_paths``
        nor ``json_keys``, the JSON reader's (of the id field ``name``, quoted as ``column``) for those in one."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F
        schema = f"{column} STRING"
        file = [_file_key().alias("file")] if with_file else []
        sampled = [f for f in files if f in self.json_paths]
        files = [f for f in files if f not in self.json_paths]
        frames = [spark.read.schema(schema).json(sampled).select(F.col(column).alias("id"), *file)] if sampled else []
        if not files:
            return frames
        text = spark.read.text(files)
        if self.json_keys:
            text = text.filter(~_file_key_in(self.json_keys))
        scanned_id = _scanner.expression(self.function, name)
        observation = Observation()
        self.readings.append((text, scanned_id, observation))
        scanned = text.select(F.expr(scanned_id).alias("id"), *file) \
            .observe(observation, F.count(F.when(F.col("id").isNull(), 1)).alias("lines"))
        frames.append(scanned.filter(F.col("id").isNotNull()))
        if self.json_keys:
            frames.append(spark.read.schema(schema).json(files).filter(_file_key_in(self.json_keys))
                          .select(F.col(column).alias("id"), *file))
        return frames

    def rejected(self) -> tuple[int, set]:
        """``(lines, file keys)`` the scanner did not take in the job just run: the lines counted by its
        observations; when there are some, their files' keys from one more Spark job over the same readings
        (the scanner again, the keys of the lines it refuses gathered)."""
        from pyspark.sql import functions as F
        lines = sum(int(observation.get["lines"] or 0) for *_, observation in self.readings)
        if not lines:
            return 0, set()
        refused = union_all([text.select(_file_key().alias("file"), F.expr(scanned_id).alias("id"))
                             .filter(F.col("id").isNull()).select("file") for text, scanned_id, _ in self.readings])
        got = refused.agg(F.collect_set("file").alias("files")).collect()[0]["files"] or ()
        return lines, {int(k) for k in got}


def _sampled_json_paths(config: PhotonConfig, outputs, foreign) -> frozenset:
    """The local files (of ``outputs`` and ``foreign``) whose first bytes, read on the driver, hold a line the
    strict-shape scanner would not take (:func:`photon.app._scanner.sample_strict`): the JSON reader reads them
    in the job's first run. Only which reader reads a file first depends on it, never the counts."""
    name = config.join.foreign_ids.id_field
    if not _scanner.plain_name(name):
        return frozenset()
    files = {f for _, lines in foreign for f in lines.files} | {f for *_, lines in outputs for f in lines.files}
    raw = name.encode()
    chosen = frozenset(f for f in files if not _scanner.sample_strict(f, raw))
    if chosen:
        _scanner.log.info("verify: %d of %d files hold lines not of the strict shape in their first %d bytes: "
                          "Spark's JSON reader reads them", len(chosen), len(files), _scanner.SAMPLE_BYTES)
    return chosen


def _file_key():
    """A file's key: a hash (Spark's ``xxhash64``) of its path as Spark's file reader gives it (the hidden
    ``_metadata.file_path``), the same for a file in every read of the same listing. The aggregation
    carries, for each id, the smallest key of the files holding its foreign lines, and the lookup of the
    lost ids reads only the files of their keys (:meth:`_Lines.values`): a filter on a file's metadata,
    which Spark applies to the listing, so the other files are not opened. Two files with one key are both
    read (never fewer)."""
    from pyspark.sql import functions as F
    return F.expr(FILE_KEY)


FILE_KEY = "xxhash64(`_metadata`.`file_path`)"


def _file_key_in(keys):
    """The line's file has one of ``keys`` (:func:`_file_key`), as one SQL expression (one call into the JVM)."""
    from pyspark.sql import functions as F
    if not keys:
        return F.lit(False)
    literal = {-1 << 63: "(-9223372036854775807L - 1L)"}
    return F.expr(f"{FILE_KEY} IN ({','.join(literal.get(k, f'{int(k)}L') for k in sorted(keys))})")


def _no_ids(spark, with_file: bool):
    """No rows of :meth:`_Lines.ids`."""
    from pyspark.sql import functions as F
    rows = _no_rows(spark, "id")
    return rows.withColumn("file", F.lit(None).cast("long")) if with_file else rows


def _no_rows(spark, *columns: str):
    """An empty DataFrame of string ``columns`` (planned in the JVM: no Python rows)."""
    from pyspark.sql import functions as F
    return spark.range(0).select(*(F.lit(None).cast("string").alias(c) for c in columns))


def _lines(files: list[str], partial: list[tuple[str, bytes]], staging: str | None, more=None,
           parquet: list[str] = (), spark=None) -> _Lines:
    """A :class:`_Lines` of published files, the committed prefixes ``partial`` of in-progress files
    (written now to one file in ``staging``), compacted partitions' Parquet folders and ``more`` (a DataFrame
    with a ``value`` column)."""
    from pyspark.sql import functions as F
    lines = _Lines(files=list(files))
    if more is not None:
        lines.frames.append(more.select("value"))
    if parquet:    # each compacted line is kept as written, in one column
        lines.frames.append(spark.read.parquet(*parquet).select(F.col(LINE_COLUMN).cast("string").alias("value")))
    data = b"".join(d if d.endswith(b"\n") else d + b"\n" for _, d in partial)
    if data.strip(b"\n"):
        path = Path(tempfile.mkstemp(suffix=".jsonl", dir=staging)[1])
        path.write_bytes(data.decode("utf-8", "replace").encode("utf-8"))
        lines.staged.append(str(path))
    return lines


def _in_window(since_us, until_us):
    """True where the timestamp of column ``id`` is inside ``[since_us, until_us)`` (either bound optional);
    null (the row left out) where the id has none: a malformed foreign id counts nowhere, and an output line's
    is kept by its ``bad`` (:func:`_per_id`). A ``try_cast``: with ANSI casts (Spark 4's default) a cast
    of such an id failed the whole job."""
    from pyspark.sql import functions as F
    ts = F.substring("id", -TIMESTAMP_DIGITS, TIMESTAMP_DIGITS).try_cast("long")
    cond = F.lit(True)
    if since_us is not None:
        cond = cond & (ts >= since_us)
    if until_us is not None:
        cond = cond & (ts < until_us)
    return cond


def _cheaply_well_formed(column: str, scanner: str | None = None):
    """True only for ids that :data:`ID_PATTERN` certainly accepts, tested on their UTF-8 bytes without
    decoding them to a Java ``String`` or running a regular expression; false (or null) for every other id,
    which :func:`_well_formed` then gives to the pattern. Accepted: ``<prefix>:<pid>:<time>`` where

    * the time (after the last ``:``) is 16 bytes that cast to a number of 16 digits, i.e. at least 10^15
      (Spark's string-to-number cast skips blanks and control bytes around the digits and takes a sign or a
      decimal point, but each of those takes a byte, leaving fewer than 16 digits: so all 16 bytes are ASCII
      digits, the first not 0);
    * the pid (between the last two ``:``) is k bytes, 1 <= k <= 15, casting to at least 10^(k-1) (the same
      argument: k ASCII digits, the first not 0);
    * the prefix (before them) is at least one byte, does not start with ``:``, and no byte of the id is a
      ``\\n``.

    Such an id ends in an ASCII digit, so the pattern's ``$`` (which also matches before a final line
    terminator) has nothing to treat specially, and ``[^:\\n][^\\n]*`` takes the prefix. Ids with a zero
    pid or time of fewer digits, line terminators, or any other shape go to the pattern: the result is
    always the pattern's (``tests/app/test_verify_id_format.py``). With ``scanner`` (the strict-shape
    scanner's function is registered, :func:`photon.app._scanner.function`) the same test runs in one pass
    over the id's bytes in its class (:func:`photon.app._scanner.well_formed_expression`), where these
    string functions cut three substrings and cast two of them per id."""
    from pyspark.sql import functions as F
    if scanner is not None:
        return F.expr(_scanner.well_formed_expression(column))
    c = F.col(column)
    time_text = F.substring_index(c, ":", -1)
    pid_text = F.substring_index(F.substring_index(c, ":", -2), ":", 1)
    pid_len = F.octet_length(pid_text)
    return ((F.octet_length(time_text) == TIMESTAMP_DIGITS)
            & (time_text.try_cast("bigint") >= 10 ** (TIMESTAMP_DIGITS - 1))
            & pid_len.between(1, 15)
            & (pid_text.try_cast("bigint") >= F.pow(F.lit(10.0), pid_len - 1))
            & (F.octet_length(c) - pid_len - (TIMESTAMP_DIGITS + 2) >= 1)
            & ~c.startswith(":") & ~c.contains("\n"))


def _well_formed(column: str, scanner: str | None = None):
    """``column`` follows the pipeline's id format (:data:`ID_PATTERN` as Java reads it; null for a null id):
    the cheap byte test (:func:`_cheaply_well_formed`) first, the pattern only for ids it does not vouch for.
    A conditional, not an ``OR``: Spark's subexpression elimination may hoist both sides of an ``OR`` used
    twice in a projection, never an expression that only one branch of a conditional needs."""
    from pyspark.sql import functions as F
    return F.when(F.coalesce(_cheaply_well_formed(column, scanner), F.lit(False)), F.lit(True)) \
        .otherwise(F.col(column).rlike(ID_PATTERN))


def _window(df, since_us, until_us):
    return df if since_us is None and until_us is None else df.filter(_in_window(since_us, until_us))


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
    """One region's ``kind`` output as :class:`_Lines` and the ``(name, read)`` sources
    :func:`_first_bad_line` searches."""
    folder = region.joined_dir if kind == "joined" else region.unjoinable_dir
    output = region.output_reader(kind, config.s3)
    if output.folder is not None:
        files, partial, parquet = list_output(output.folder)
        sources = [(f, lambda f=f: Path(f).read_bytes()) for f in files]
        sources += [(name, lambda d=data: d) for name, data in partial]
        sources += [(f, lambda f=f: b"".join(x + b"\n" for x in compacted_lines(Path(f), "."))) for f in parquet]
        staging = _staging(config) if partial else None
        return _lines(files, partial, staging, parquet=parquet, spark=spark), sources
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
    return (_lines([], partial, _staging(config), objects),
            sources + [(n, lambda d=d: d) for n, d in partial])


def _region_bit(index: int, n_regions: int):
    """The literal that marks a row as coming from the pipeline region of that index, of ``n_regions``
    (see :func:`_regions`): its bit, or the index itself beyond :data:`MASK_REGIONS` regions."""
    from pyspark.sql import functions as F
    return F.lit(1 << index if n_regions <= MASK_REGIONS else index).cast("long")


def _regions(column: str, n_regions: int):
    """``(aggregate, count)``: an aggregate of ``column`` (the region marks of :func:`_region_bit`, null on
    rows of other sources) and the number of distinct regions it held (null when none): a bit mask ORed
    together when there are at most :data:`MASK_REGIONS` regions (one plain aggregate, no distinct), else a
    set of region indexes."""
    from pyspark.sql import functions as F
    if n_regions <= MASK_REGIONS:
        return F.bit_or(column).alias(column), F.bit_count(column)
    return F.collect_set(column).alias(column), F.when(F.size(column) > 0, F.size(column))


def _read_outputs(spark, config: PhotonConfig):
    """Every region's joined and unjoinable output: ``(frames, sources)``, ``frames`` being
    ``[(region index, region name, kind, lines)]`` (:class:`_Lines`; their ids as :meth:`_Lines.ids` reads
    them, null or malformed on a line without a readable id) and ``sources`` the ``(region, kind) ->
    sources`` that :func:`_first_bad_line` searches."""
    frames, sources = [], {}
    for index, region in enumerate(config.pipeline_regions):
        root = region.output_root
        if not storage_kind(root).exists(root, config.s3):
            raise VerifyInputError(f"region {region.name}: output folder {root} does not exist")
        for kind in ("joined", "unjoinable"):
            df, sources[(region.name, kind)] = _output_lines(spark, config, region, kind)
            frames.append((index, region.name, kind, df))
    return frames, sources


def _bad_line_error(spark, config: PhotonConfig, frames, sources) -> VerifyInputError:
    """The error naming the first output line without a readable id (the aggregation found one; this
    looks for it line by line, only on this failure path)."""
    from pyspark.sql import functions as F
    id_field, ids = config.join.foreign_id_field, config.join.foreign_ids
    bad = union_all([_ids(lines.values(spark), ids)
                     .select("value", F.lit(name).alias("region"), F.lit(kind).alias("kind"), "id")
                     .filter((F.col("id").isNull() & F.col("value").rlike(r"\S")) | ~F.col("id").rlike(ID_PATTERN))
                     for _, name, kind, lines in frames])
    rows = bad.limit(5).collect()
    if not rows:        # pragma: no cover - the aggregation saw one
        return VerifyInputError("an output line without a readable id (not found again)")
    where = _first_bad_line(sources[(rows[0].region, rows[0].kind)], id_field, [r.value for r in rows])
    what = f"{id_field!r}" + (f" and {ids.time_field!r}" if ids.custom else "")
    return VerifyInputError(f"region {rows[0].region}: {rows[0].kind} output line without a readable "
                            f"{what} in {where}: {rows[0].value[:120]!r}")


def _input_lines(spark, config: PhotonConfig, region, stream: str):
    """Rows ``(value)`` of ``stream`` and its recovery stream in ``region``'s log root."""
    url = region.stream_url(stream)
    root = local_folder(url)
    if root is not None:        # a local folder: Spark reads its files in place
        if not root.is_dir():
            raise VerifyInputError(f"region {region.name}: input folder {root} does not exist")
        files = [str(root / f) for f in list_log_files(root)]
        recovery = local_folder(region.stream_url(recovery_stream(stream)))
        files += [str(recovery / f) for f in list_log_files(recovery)]
        return _Lines(files=files)
    recovery = region.stream_url(recovery_stream(stream))
    try:
        objects = stream_objects(url, config.s3)
        if not objects:
            raise VerifyInputError(f"region {region.name}: input {url} holds no objects")
        df = stream_text(spark, url, config.s3, objects, _staging(config)).unionByName(
            stream_text(spark, recovery, config.s3, None, _staging(config)))
    except (SourceError, OSError) as e:
        raise VerifyInputError(f"region {region.name}: input {url}: {e}") from None
    return _lines([], [], None, df)


def _read_input(spark, config: PhotonConfig, stream: str, id_field, ref_field: str | None, user_id: bool = False,
                checked: bool = True):
    """Every region's input lines of ``stream`` (and its recovery folder) as ``(value, id, [ref,] bit)``,
    ``bit`` the region's mark (:func:`_region_bit`); lines without a well-formed id are left out (the
    pipeline quarantines them), or with ``checked=False`` only those without one, the caller checking the
    format (once per id rather than per line). ``id_field``: see :func:`_ids`."""
    from pyspark.sql import functions as F
    frames = []
    for index, region in enumerate(config.pipeline_regions):
        df = _ids(_input_lines(spark, config, region, stream).values(spark), id_field, ref_field, user_id)
        good = F.col("id").isNotNull() if (isinstance(id_field, EventIds) and id_field.custom) or not checked \
            else _well_formed("id")
        frames.append(df.filter(good).withColumn("bit", _region_bit(index, len(config.pipeline_regions))))
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

def input_bytes(config: PhotonConfig) -> int | None:
    """Bytes of every region's foreign input (and recovery stream) and output, as their local folders hold
    them now, or None when some are not local (S3): the job's size, known before Spark starts
    (:func:`photon.app._spark.short_job_options`). Only a size: nothing here is read."""
    total = 0
    for region in config.pipeline_regions:
        folders = [local_folder(region.stream_url(s)) for s in (config.join.foreign_stream,
                                                                 recovery_stream(config.join.foreign_stream))]
        folders.append(local_folder(region.output_root))
        if any(f is None for f in folders):
            return None
        total += sum(_exports.folder_bytes(folder) for folder in folders)
    return total


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


def _foreign_inputs(spark, config: PhotonConfig) -> list:
    """``[(region index, lines)]``: every region's foreign input and recovery stream (:class:`_Lines`),
    listed once: the aggregation reads their ids, the lost ids' lines are looked up in the same files."""
    return [(index, _input_lines(spark, config, region, config.join.foreign_stream))
            for index, region in enumerate(config.pipeline_regions)]


def _per_id(spark, config: PhotonConfig, export_files: list[str], since_us, until_us, outputs, foreign,
            scan: _Scan | None = None):
    """One row per id of every source, from one aggregation over them all (each input read once, ids only:
    every aggregation buffer is fixed-width, so Spark hashes the ids, sorts nothing and shuffles no line):
    ``id``, ``in_regions`` (regions whose foreign input holds it), ``n_out`` (its joined lines),
    ``u_regions`` (regions whose unjoinable output holds it), ``registered`` (the export holds it with a
    token), ``lost`` (registered and joined nowhere), ``everywhere`` (unjoinable in every region whose input
    holds it, joined nowhere, not registered) and ``bad``: output lines hold this id and it is not
    well-formed (or null: lines without it), which stops the job; ``file``: the smallest :func:`_file_key`
    of the local foreign files holding it (null when none does: only S3 objects, or not in the input),
    so that the lookup of a lost id reads only its file. ``outputs``: from :func:`_read_outputs`;
    ``foreign``: from :func:`_foreign_inputs`; ``scan``: the strict-shape scanner's reading of the local
    files (:class:`_Scan`), or None (the JSON reader).

    An id's format is checked once per id after the aggregation, not once per line: a foreign line whose
    id is malformed counts nowhere (the pipeline quarantines it), an output line's makes ``bad``."""
    from pyspark.sql import functions as F
    n_regions = len(config.pipeline_regions)
    ids = config.join.foreign_ids
    exported = _read_export(spark, export_files)
    registry = _window(exported, since_us, until_us).select(
        "id", F.when(F.col("token").isNotNull(), F.lit(1)).alias("reg"))
    rows = union_all([lines.ids(spark, ids, with_file=True, scan=scan).filter(F.col("id").isNotNull())
                      .select("id", _region_bit(index, n_regions).alias("in_bit"), "file") for index, lines in foreign])
    rows = _window(rows, since_us, until_us)
    for index, _, kind, lines in outputs:
        bit = _region_bit(index, n_regions)
        rows = rows.unionByName(
            lines.ids(spark, ids, scan=scan).select("id", (F.lit(1) if kind == "joined" else F.lit(None)).cast("long").alias("j"),
                                         (bit if kind == "unjoinable" else F.lit(None).cast("long")).alias("u_bit")),
            allowMissingColumns=True)
    rows = rows.unionByName(registry, allowMissingColumns=True)
    in_agg, in_regions = _regions("in_bit", n_regions)
    u_agg, u_regions = _regions("u_bit", n_regions)
    grouped = rows.groupBy("id").agg(in_agg, u_agg, F.sum("j").alias("n_out"), F.max("reg").alias("reg"),
                                     F.min("file").alias("file"))
    well_formed = F.coalesce(_well_formed("id", scan.function if scan is not None else None), F.lit(False))
    in_output = F.col("n_out").isNotNull() | u_regions.isNotNull()
    grouped = grouped.select(
        "id", F.when(F.col("id").isNotNull() & (well_formed | F.lit(ids.custom)), in_regions).alias("in_regions"),
        "n_out", u_regions.alias("u_regions"), "reg", (in_output & ~well_formed).alias("bad"), "file")
    if since_us is not None or until_us is not None:        # outputs' ids, here once per id
        grouped = grouped.filter(F.col("bad") | _in_window(since_us, until_us))
    registered = F.col("reg").isNotNull()
    lost = registered & F.col("n_out").isNull()
    unjoinable = F.col("u_regions").isNotNull() & F.col("n_out").isNull() & ~registered
    everywhere = unjoinable & F.col("in_regions").isNotNull() & (F.col("u_regions") >= F.col("in_regions"))
    return grouped.select("id", "in_regions", "n_out", "u_regions", registered.alias("registered"),
                          lost.alias("lost"), everywhere.alias("everywhere"), "bad", "file")


COUNTS = ("foreign_events", "joined", "duplicates", "lost", "pending", "unjoinable", "everywhere", "bad")
NEEDS_COLUMNS = ("id", "n_out", "in_regions", "lost", "everywhere", "file")


def _count_columns():
    """The report's counts (:data:`COUNTS`) as aggregates over the rows of :func:`_per_id`."""
    from pyspark.sql import functions as F
    c = F.col
    return [F.count("in_regions").alias("foreign_events"),
            F.count("n_out").alias("joined"),
            F.count(F.when(c("n_out") > 1, 1)).alias("duplicates"),
            F.count(F.when(c("lost"), 1)).alias("lost"),
            F.count(F.when(c("in_regions").isNotNull() & ~c("registered") & c("n_out").isNull()
                           & c("u_regions").isNull(), 1)).alias("pending"),
            F.count(F.when(c("u_regions").isNotNull() & c("n_out").isNull() & ~c("registered"), 1)).alias("unjoinable"),
            F.count(F.when(c("everywhere"), 1)).alias("everywhere"),
            F.count(F.when(c("bad"), 1)).alias("bad")]


def _counts(spark, per_id, folder: Path) -> tuple[dict, str]:
    """``(counts, schema)``: the report's counts (:data:`COUNTS`) over the rows of :func:`_per_id`, and the
    rows that need more (lost, duplicated, unjoinable everywhere: columns :data:`NEEDS_COLUMNS`, ``lost``
    and ``everywhere`` as 0/1) written to ``folder`` as Parquet (``schema``: their DDL, to read them back
    without a schema job), in **one** Spark job of two stages.

    The counts are an observation on the aggregation's output (Spark's ``observe``: each task folds its
    rows into the counts, merged on the driver, no shuffle), taken in the job's result stage, whose tasks'
    figures Spark merges once per partition whatever is retried; the rows that need more are the same
    stage's output. With no aggregation after it, the per-id aggregation runs without its partial step
    (:data:`COUNTS_SETTINGS`): nearly every id is distinct within an input partition, so the partial
    step would hash every row for nothing."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F
    c = F.col
    observation = Observation()
    needs = per_id.observe(observation, *_count_columns()) \
        .filter(c("lost") | (c("n_out") > 1) | c("everywhere")) \
        .select("id", "n_out", "in_regions", c("lost").cast("int").alias("lost"),
                c("everywhere").cast("int").alias("everywhere"), "file")
    schema = needs.schema.simpleString()[len("struct<"):-1].replace(":", " ")
    needs.write.mode("overwrite").parquet(str(folder))
    got = observation.get
    return {k: got[k] for k in COUNTS}, schema


class _Need(tuple):
    """One row that needs more, as :func:`_look_up_on_driver` reads it (attributes of :data:`NEEDS_COLUMNS`)."""
    __slots__ = ()
    id = property(lambda self: self[0])
    n_out = property(lambda self: self[1])
    in_regions = property(lambda self: self[2])
    lost = property(lambda self: self[3])
    everywhere = property(lambda self: self[4])
    file = property(lambda self: self[5])


def _read_needs(folder: Path) -> list:
    """The rows :func:`_counts` wrote, read on the driver (pyarrow): few, by :data:`LOOKUP_ON_DRIVER`."""
    import pyarrow.parquet as pq
    files = sorted(folder.glob("*.parquet"))
    rows = []
    for f in files:
        table = pq.read_table(f, columns=list(NEEDS_COLUMNS))
        rows += [_Need(r) for r in zip(*(table.column(k).to_pylist() for k in NEEDS_COLUMNS))]
    return rows


def _leading_id(field_name: str):
    """``(id, unsure)``, two columns over a line ``value``: ``id`` is the text between the line's third and fourth
    ``"`` when the line starts with the id field as a plain string (``{"click_id":"``, as Photon's generator and
    joiner write it), else ``""``; ``unsure`` is true where a JSON reading of the line could give another id:
    a ``\\`` anywhere (an escape in the id, or one spelling the field's name) or the field's quoted name
    again. Where ``id`` is not ``""`` and ``unsure`` is false, the line is valid JSON whose id is ``id``, or
    not valid JSON (no id at all): the string after ``{"click_id":"`` ends at the next ``"``, no escape
    before it, and no other member has the field's name. None when the field's name would need escaping in
    JSON. Only a pre-filter: the lines it keeps are parsed as JSON afterwards (:func:`_lines_of`). Cut by
    ``startswith``, ``substring_index`` and ``contains``, cheaper per line than a regular expression and a
    ``locate`` (docs/history/performance.md, "Fourteenth pass: the verification job's lookup cut")."""
    import re
    from pyspark.sql import functions as F
    if not re.fullmatch(r"[A-Za-z0-9_]+", field_name):
        return None
    value = F.col("value")
    quoted = f'"{field_name}"'
    leading = F.when(value.startswith("{" + quoted + ':"'),
                     F.substring_index(F.substring_index(value, '"', 4), '"', -1)).otherwise(F.lit(""))
    twice = F.substring_index(value, quoted, 2) != value      # shorter: the name a second time
    return leading, value.contains("\\") | twice


def _files_to_read(foreign, wanted_rows: list):
    """The :func:`_file_key` values of the local foreign files that hold the ``wanted_rows``' ids (their
    ``file``), or None when that is every file (no filter needed): lost clicks cluster in time, so a run with
    few losses reads few files again."""
    keys = {r.file for r in wanted_rows if r.file is not None}
    files = sum(len(lines.files) for _, lines in foreign)
    return None if len(keys) >= files else keys


def _cut(ids: EventIds, function: str | None):
    """``(id, unsure)``, two columns over a line ``value`` for :func:`_lines_of`'s pre-filter, or None (custom
    ids: every line is parsed). With the strict-shape scanner's SQL ``function`` (:mod:`photon.app._scanner`),
    ``id`` is its reading and ``""`` on a line of another shape (or whose id is empty), and ``unsure`` is
    false: a line it takes is valid JSON whose one top-level id field is that plain string, so ``json_tuple``
    gives that id. Without it, :func:`_leading_id`'s cut. A line whose ``id`` is ``""`` or which is
    ``unsure`` is vouched for by nothing: it is parsed."""
    from pyspark.sql import functions as F
    if ids.custom:
        return None
    if function is not None and _scanner.plain_name(ids.id_field):
        # another shape as "", not null: one column, so the filter reads the scanner's result once per line
        return F.coalesce(F.expr(_scanner.expression(function, ids.id_field)), F.lit("")), F.lit(False)
    return _leading_id(ids.id_field)


def _lines_of(spark, config: PhotonConfig, foreign, wanted, files_keyed=None, function: str | None = None):
    """``(id, raw, ref)``: one foreign line (as logged) and its reference of every id of ``wanted`` (rows
    ``(id)``, few: lost ids and those unjoinable everywhere) that some region's input holds. Read again from
    the same files; a cheap cut (:func:`_cut`: the strict-shape scanner's SQL ``function`` when there is one,
    else :func:`_leading_id`) keeps the lines whose leading id is wanted and those it cannot vouch for, and
    only those are parsed as JSON (``json_tuple``, as the pipeline's lines were read before).

    ``wanted`` may also be the ids themselves (a list, on the driver): then they are matched by value
    (:func:`_one_of`, no join, no shuffle) and every line of a wanted id is returned (the caller keeps one).
    ``files_keyed``: see :meth:`_Lines.values`."""
    from pyspark.sql import functions as F
    ids, ref_field = config.join.foreign_ids, config.join.foreign_ref_field
    leading = _cut(ids, function)
    by_value = isinstance(wanted, list)
    if not by_value:
        wanted = wanted.select("id").distinct()
    frames = []
    for _, lines in foreign:
        values = lines.values(spark, files_keyed)
        if leading is not None:
            fast, unsure = leading
            values = values.withColumn("fast", fast)
            if by_value:           # "" among the values: one IN over the cut id, not an OR reading it twice
                hit = _one_of("fast", sorted(set(wanted) | {""}))
            else:
                values = values.join(wanted.select(F.col("id").alias("fast"), F.lit(True).alias("hit")), "fast", "left")
                hit = F.col("hit").isNotNull() | (F.col("fast") == "")
            values = values.filter(hit | unsure).select("value")
        parsed = _ids(values, ids, ref_field)
        frames.append(parsed.filter(_one_of("id", wanted)) if by_value else parsed.join(wanted, "id", "left_semi"))
    found = union_all(frames)
    if by_value:
        return found.select("id", F.col("value").alias("raw"), "ref")
    return found.groupBy("id").agg(F.first(F.struct(F.col("value").alias("raw"), "ref")).alias("line")) \
        .select("id", "line.raw", "line.ref")


def _sql_literal(value) -> str:
    """``value`` (str, int, bool or None) as a Spark SQL literal."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return f"{value}L"
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _one_of(column: str, values: list):
    """``column IN (values)``, the values (strings) written into one SQL expression: one call into the JVM
    however many they are (the optimizer makes it a hash set), where ``isin`` makes a call per value."""
    from pyspark.sql import functions as F
    if not values:
        return F.lit(False)
    return F.expr(f"`{column}` IN ({','.join(_sql_literal(v) for v in values)})")


EXPORT_COLUMNS = (("id", "STRING"), ("token", "STRING"), ("registered_us", "BIGINT"))


def _export_columns(export_files: list[str]) -> set | None:
    """The columns of :data:`EXPORT_COLUMNS` that every export file's footer (read on the driver by pyarrow)
    states with the type the export writes, or None when a footer states another type or ``id`` and
    ``token`` are not both there (Spark then infers the schema itself)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    kinds = {"STRING": (pa.types.is_string, pa.types.is_large_string), "BIGINT": (pa.types.is_int64,)}
    common = None
    for path in export_files:
        schema = pq.read_schema(path)
        typed = set()
        for name, kind in EXPORT_COLUMNS:
            if name in schema.names:
                t = schema.field(name).type
                t = t.value_type if pa.types.is_dictionary(t) else t
                if not any(check(t) for check in kinds[kind]):
                    return None
                typed.add(name)
        common = typed if common is None else common & typed
    if not common or not {"id", "token"} <= common:
        return None
    return common


def _read_export(spark, export_files: list[str]):
    """The export's Parquet files as Spark reads them, with the columns :func:`run_verify` uses and the schema
    their footers state (:func:`_export_columns`), so that Spark runs no job to infer it; when a footer
    states other types than the export writes, Spark infers the schema itself."""
    common = _export_columns(export_files)
    if common is None:
        return spark.read.parquet(*export_files)
    return spark.read.schema(", ".join(f"`{n}` {k}" for n, k in EXPORT_COLUMNS if n in common)) \
        .parquet(*export_files)


def _export_entries(export_files: list[str], ids: list[str], columns: set) -> dict:
    """``{id: (token, registered_us)}``: the registry entry of each of ``ids`` that the export holds with a
    token (``registered_us`` 0 when the export has no such column, as :func:`_read_export`'s reading gives
    it), read on the driver (pyarrow: the id, token and time columns, filtered by value) for the few lost
    ids of :func:`_look_up_on_driver`; an id with two entries (two shards' copies taken at different
    moments) keeps the first, in the files' order. Only for an export whose footers
    :func:`_export_columns` accepts: ``columns`` is what it returned."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    if not ids:
        return {}
    with_time = "registered_us" in columns
    wanted = pa.array(ids, pa.string())
    entries = {}
    for path in export_files:
        table = pq.read_table(path, columns=["id", "token"] + (["registered_us"] if with_time else []))
        ident = table.column("id")
        if pa.types.is_dictionary(ident.type):
            ident = ident.cast(ident.type.value_type)
        keep = pc.and_(pc.is_in(ident.cast(pa.string()), value_set=wanted), pc.is_valid(table.column("token")))
        hits = table.filter(keep)
        times = hits.column("registered_us").to_pylist() if with_time else [0] * hits.num_rows
        for i, token, t in zip(hits.column("id").to_pylist(), hits.column("token").to_pylist(), times):
            entries.setdefault(i, (token, t))
    return entries


COUNTS_SETTINGS = {
    # Adaptive execution plans and submits each stage of the counts as a job of its own (five jobs, each
    # planned and code-generated afresh); off, the three stages are one job planned once. Nothing adaptive
    # is lost: the aggregation's partitions are hashed ids, even by construction, and it joins nothing.
    "spark.sql.adaptive.enabled": "false",
    # The per-id aggregation's partial step hashes every row of an input partition to fold nearly nothing
    # (an id is in one line of one foreign file, one of one output file, one export row): off, the rows
    # are shuffled as read and aggregated once. Only right with no other aggregation in the plan
    # (:func:`_counts` folds the counts by an observation instead).
    "spark.sql.execution.bypassPartialAggregation": "true",
}


@contextmanager
def sql_settings(spark, settings: dict):
    """The session's SQL ``settings`` for the block, those it had restored after (the session is shared)."""
    before = {k: spark.conf.get(k, None) for k in settings}
    for k, v in settings.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


def _token_prefixes(export_files: list[str], since_us, until_us) -> list[str]:
    """The joiners (token prefixes, :data:`TOKEN_PREFIX`) of the export's ids inside the window, read on
    the driver from the token column alone (dictionary-encoded: a few distinct values per many ids)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    windowed = since_us is not None or until_us is not None
    tokens = set()
    for path in export_files:
        reader = pq.ParquetFile(path, read_dictionary=["token"])
        for batch in reader.iter_batches(columns=["token"] + (["id"] if windowed else []), batch_size=1 << 20):
            column = batch.column(0)
            if windowed:
                ts = pc.cast(pc.utf8_slice_codeunits(batch.column(1), -TIMESTAMP_DIGITS), "int64")
                keep = pc.and_(pc.greater_equal(ts, since_us) if since_us is not None else pc.is_valid(ts),
                               pc.less(ts, until_us) if until_us is not None else pc.is_valid(ts))
                column = pc.filter(column, keep)
            tokens.update(t for t in pc.unique(column.cast("string") if hasattr(column, "dictionary")
                                               else column).to_pylist() if t)
    return sorted({p for t in tokens if (p := t.rpartition("/")[0])})


def run_verify(config: PhotonConfig, spark, *, since_us: int | None = None, until_us: int | None = None,
               export_dir: str | Path | None = None, out_dir: str | Path | None = None,
               show_progress: bool = False) -> VerifyReport:
    """Run the verification (see the module docstring); writes the recoverable events as Parquet under
    ``out_dir`` (default ``config.verify_dir``)/``recoverable`` with columns id, token, raw, ref, reason,
    registered_us.

    The plan: the export's token prefixes first (read on the driver from its token column, to judge the
    joiners before the output is listed); then every source (foreign input, joined and unjoinable output,
    export) is read once by Spark's own readers (local files as text through the strict-shape scanner,
    :class:`_Scan`, and the files holding lines of another shape again with the JSON reader and a schema of
    the id field alone; no Python per line) and grouped by id in one hash aggregation of ids and fixed-width counts, without a
    partial step; the counts are folded from its output by an observation, and only the lost, duplicated
    and unjoinable-everywhere ids are written out (:func:`_counts`: one Spark job of two stages,
    :data:`COUNTS_SETTINGS`); the export is read with its footers' schema (no inference job). The lost ids' lines and
    registry entries are then looked up (the input read again, the export's Parquet): by value in one scan
    of the files holding them (each id's file key, :func:`_file_key`) when the ids are few enough to collect
    (:func:`_look_up_on_driver`), else by joins
    (:func:`_look_up_in_spark`); nothing is read again when no id is lost or unjoinable everywhere.

    The export: taken into a new ``export-*`` folder of ``out_dir`` unless ``export_dir`` names one. A folder
    of ``out_dir``'s is held (shared lock) for the run, gets the report (``_report.json``) when the run
    finishes, and then the exports of older finished runs beyond ``[verify].keep_exports`` are removed; one
    whose run ended without a report is kept and named (:mod:`photon.app._exports`)."""
    out = Path(out_dir) if out_dir else config.verify_dir
    out.mkdir(parents=True, exist_ok=True)
    check_inputs(config)                        # fail before the (possibly long) export
    t0 = time.perf_counter()
    fresh = export_dir is None
    export_dir = Path(tempfile.mkdtemp(prefix=_exports.PREFIX, dir=out)) if fresh else Path(export_dir)
    own = _exports.is_own(export_dir, out)
    try:
        with _exports.using(export_dir) if own else nullcontext():
            if fresh:
                take_export(config, export_dir)
            report = _verify_against(config, spark, export_dir, out, since_us, until_us, show_progress, t0)
            if own:
                _exports.mark_finished(export_dir, asdict(report))
    except _exports.ExportGone as e:
        raise VerifyInputError(str(e)) from None
    _say_pruned(_exports.prune(out, config.verify.keep_exports, export_dir if own else None))
    return report


def _say_pruned(pruned) -> None:
    """The prune of the results folder's exports, in the log: what went, and (as a warning, on stderr) the
    exports kept because their runs ended without a report."""
    if pruned.removed:
        _scanner.log.info("verify: removed %d older run(s)' registry export(s): %s", len(pruned.removed),
                          ", ".join(pruned.removed))
    if pruned.unfinished:
        _scanner.log.warning(
            "verify: kept %d registry export(s) (%.1f MB) that no finished run's report names (their runs ended "
            "without a report: stopped, killed or failed; or they predate [verify].keep_exports); remove them "
            "once no longer needed: %s", len(pruned.unfinished), pruned.unfinished_bytes / 2**20,
            ", ".join(pruned.unfinished))
    for error in pruned.errors:
        _scanner.log.warning("verify: an older registry export could not be removed: %s", error)


def _verify_against(config: PhotonConfig, spark, export_dir: Path, out: Path, since_us, until_us,
                    show_progress: bool, t0: float) -> VerifyReport:
    """:func:`run_verify`'s job once its export is in ``export_dir`` (taken since ``t0``)."""
    from photon.app._spark import progress

    timings = {}
    try:
        manifest = idregistry.check_export(export_dir)
    except idregistry.ExportError as e:
        raise VerifyInputError(str(e)) from None
    timings["export_s"] = time.perf_counter() - t0

    with progress(spark, "verify", show_progress):
        t0 = time.perf_counter()
        export_files = [str(export_dir / s["file"]) for s in manifest["shards"].values()]
        with ThreadPoolExecutor(1) as pool:
            # the scanner's SQL functions are registered in the JVM (the class loaded, Spark's SQL parser's
            # first use) while the driver reads the export's tokens, judges the joiners and lists the files
            registering = pool.submit(_scanner.function, spark) if not config.join.foreign_ids.custom else None
            prefixes = _token_prefixes(export_files, since_us, until_us)
            # judged before the output is listed: a joiner stopped now wrote all it ever will by the listing
            grace_us = int(config.verify.remote_joiner_grace_s * 1e6)
            now_us = time.time_ns() // 1000
            judged = verdicts(prefixes, [r.state_dir for r in config.regions], now_us, grace_us)
            aged_before_us = now_us - int(config.verify.lost_after_s * 1e6)
            ledger = [(e["id"], e["token"]) for r in config.regions for e in joiner.read_lost(r.state_dir)
                      if isinstance(e.get("token"), str)]

            outputs, sources = _read_outputs(spark, config)       # lists the output
            foreign = _foreign_inputs(spark, config)
            # scanner: registered for the session (the lookups' cut); function: the counts still read with it
            # (None again when a rerun finds the same files refused)
            scanner = registering.result() if registering is not None else None
        needs_dir = Path(tempfile.mkdtemp(prefix="needs-", dir=out))
        try:
            function = scanner
            json_keys, json_paths = frozenset(), frozenset()
            if function is not None:
                json_paths = _sampled_json_paths(config, outputs, foreign)
            while True:     # again, with the JSON reader on the files holding lines the scanner did not take
                scan = _Scan(function, json_keys, json_paths) if function is not None else None
                with sql_settings(spark, COUNTS_SETTINGS):
                    counts, needs_schema = _counts(spark, _per_id(spark, config, export_files, since_us, until_us,
                                                                  outputs, foreign, scan), needs_dir)
                rejected, keys = scan.rejected() if scan is not None else (0, set())
                if not rejected:
                    break
                _scanner.log.info("verify: %d lines in %d files are not of the strict shape: those files are "
                                  "read again by Spark's JSON reader", rejected, len(keys - json_keys))
                if keys <= json_keys:       # a file changed between the job and the search for its refused lines
                    function = None
                json_keys = json_keys | keys
            timings["read_s"] = time.perf_counter() - t0

            t0 = time.perf_counter()
            if counts.pop("bad"):
                raise _bad_line_error(spark, config, outputs, sources)
            counts = {k: int(v or 0) for k, v in counts.items()}
            everywhere, lost_n = counts.pop("everywhere"), counts["lost"]
            recoverable_path = out / "recoverable"
            if counts["duplicates"] + everywhere + lost_n <= LOOKUP_ON_DRIVER:
                needs = _read_needs(needs_dir) if counts["duplicates"] or everywhere or lost_n else []
                dups, wrongly, rows = _look_up_on_driver(spark, config, foreign, needs, export_files, judged,
                                                         ledger, aged_before_us, scanner)
                _write_rows(rows, recoverable_path)
            else:
                every = spark.read.schema(needs_schema).parquet(str(needs_dir))
                dups, wrongly = _look_up_in_spark(spark, config, foreign, every, counts["duplicates"], everywhere,
                                                  lost_n, export_files, judged, ledger, aged_before_us,
                                                  recoverable_path, scanner)
            counts["recoverable"] = _parquet_rows(recoverable_path)    # counted from what was written
            timings["join_s"] = time.perf_counter() - t0
        finally:
            shutil.rmtree(needs_dir, ignore_errors=True)
    return VerifyReport(**counts, wrongly_unjoinable=wrongly, duplicate_ids=dups,
                        recoverable_path=str(recoverable_path), export_dir=str(export_dir),
                        timings={k: round(v, 3) for k, v in timings.items()})


def _look_up_in_spark(spark, config: PhotonConfig, foreign, every, duplicates: int, everywhere: int, lost_n: int,
                      export_files, judged, ledger, aged_before_us: int, recoverable_path: Path,
                      scanner: str | None = None):
    """``(duplicate ids, wrongly unjoinable)``, the recoverable rows written to ``recoverable_path``: the
    lookups by joins inside Spark, for more ids than :data:`LOOKUP_ON_DRIVER` (``every``: the rows
    :func:`_counts` wrote; ``scanner``: the strict-shape scanner's SQL function for the lines' cut,
    :func:`_cut`)."""
    from pyspark.sql import functions as F
    dups = ()
    if duplicates:
        dups = tuple((r.id, int(r.n_out)) for r in every.filter(F.col("n_out") > 1)
                     .select("id", "n_out").orderBy("id").limit(20).collect())
    wanted = every.filter(((F.col("lost") > 0) | (F.col("everywhere") > 0)) & F.col("in_regions").isNotNull())
    lines = _lines_of(spark, config, foreign, wanted, function=scanner) if everywhere or lost_n else None
    wrongly = 0
    if everywhere:
        primary = _read_input(spark, config, config.join.primary_stream, config.join.primary_ids, None, True) \
            .select(F.col("id").alias("ref")).distinct()
        wrongly = every.filter(F.col("everywhere") > 0).join(lines, "id").join(primary, "ref", "left_semi").count()
    recoverable = _recoverable(spark, every, lines, export_files, judged, ledger, aged_before_us) if lost_n \
        else spark.range(0).select(*(F.lit(None).cast(t).alias(c) for c, t in RECOVERABLE_COLUMNS))
    recoverable.coalesce(1).write.mode("overwrite").parquet(str(recoverable_path))
    return dups, wrongly


def _look_up_on_driver(spark, config: PhotonConfig, foreign, needs: list, export_files, judged, ledger,
                       aged_before_us: int, scanner: str | None = None):
    """``(duplicate ids, wrongly unjoinable, recoverable rows)`` when at most :data:`LOOKUP_ON_DRIVER` ids need
    more (``needs``: their rows, :func:`_read_needs`). The lost ids' lines and registry entries are found in
    one scan of the foreign input and the export filtered by value (:func:`_one_of`: no join, no shuffle,
    one job), and, when some id is unjoinable everywhere, the primaries of their references in one more;
    the recoverable rule
    (:func:`_recoverable_rows`) runs on the driver's rows. Nothing at all is read again when no id is lost
    or unjoinable everywhere. Of the local foreign files, only those of the wanted ids' ``file`` keys are read
    (:func:`_files_to_read`); an id not found in them (a line the JSON reader took as the id's and
    ``json_tuple`` does not, e.g. an array of objects) is looked up again in every file. ``scanner``: the
    strict-shape scanner's SQL function for the lines' cut (:func:`_cut`), or None."""
    from pyspark.sql import functions as F
    if not needs:
        return (), 0, []
    dups = tuple(sorted((r.id, int(r.n_out)) for r in needs if r.n_out is not None and r.n_out > 1)[:20])
    wanted_rows = [r for r in needs if (r.lost or r.everywhere) and r.in_regions is not None]
    wanted = sorted(r.id for r in wanted_rows)
    keys = _files_to_read(foreign, wanted_rows)
    lost = sorted(r.id for r in needs if r.lost)
    lines, entries = {}, {}

    def lines_of(ids, keyed):
        return _lines_of(spark, config, foreign, ids, keyed, scanner).select(
            "id", F.lit("line").alias("kind"), F.col("raw").alias("a"), F.col("ref").alias("b"),
            F.lit(None).cast("long").alias("c"))
    if wanted or lost:
        frames = []
        # the lost ids' registry entries on the driver (pyarrow), beside the Spark job of their lines
        columns = _export_columns(export_files) if lost else None
        on_driver = columns is not None
        with ThreadPoolExecutor(1) as pool:
            found = pool.submit(_export_entries, export_files, lost, columns) if on_driver else None
            if wanted:
                frames.append(lines_of(wanted, keys))
            if lost and not on_driver:        # footers of other types: Spark reads the export as before
                exported = _read_export(spark, export_files)
                registered_us = F.col("registered_us") if "registered_us" in exported.columns \
                    else F.lit(0).cast("long")
                frames.append(exported.filter(F.col("token").isNotNull() & _one_of("id", lost))
                              .select("id", F.lit("entry").alias("kind"), F.col("token").alias("a"),
                                      F.lit(None).cast("string").alias("b"), registered_us.cast("long").alias("c")))
            for r in union_all(frames).collect() if frames else ():   # an id's first line (and entry), as first()
                (lines if r.kind == "line" else entries).setdefault(r.id, (r.a, r.c) if r.kind == "entry" else r)
            if found is not None:
                entries.update(found.result())
        missing = [i for i in wanted if i not in lines]
        if keys is not None and missing:          # not in the files of its key: every file
            for r in lines_of(missing, None).collect():
                lines.setdefault(r.id, r)
    wrongly = 0
    if any(r.everywhere for r in needs):
        refs = [lines[r.id].b for r in needs if r.everywhere and r.id in lines]     # each one's first line's
        found = set()
        if any(ref is not None for ref in refs):
            primary = _read_input(spark, config, config.join.primary_stream, config.join.primary_ids, None, True)
            wanted_refs = sorted({ref for ref in refs if ref is not None})
            # no distinct() in Spark: its shuffle made this a second job; the matching lines are few, the set dedups
            found = {r.id for r in primary.filter(_one_of("id", wanted_refs)).select("id").collect()}
        wrongly = sum(1 for ref in refs if ref is not None and ref in found)
    in_ledger = set(ledger)
    rows = []
    for r in needs:
        if not r.lost:
            continue
        entry, line = entries.get(r.id), lines.get(r.id) if r.in_regions is not None else None
        token = entry[0] if entry is not None else None
        rows.append((r.id, token, entry[1] if entry is not None else None, line.a if line else None,
                     line.b if line else None, (r.id, token) in in_ledger))
    return dups, wrongly, _recoverable_rows(rows, judged, aged_before_us)


JAVA_LINE_TERMINATORS = frozenset("\n\r\u0085\u2028\u2029")     # what Java's regex ``.`` does not match


def _token_prefix(token: str) -> str:
    """``regexp_extract(token, TOKEN_PREFIX, 1)`` as Spark (Java's regular expressions) gives it: the text
    before the token's last ``/``, or ``""`` when there is no ``/`` or that text holds a line terminator
    (``.`` does not match one; ``[^/]*`` after the ``/`` matches anything, so the ``/`` must be the last)."""
    cut = token.rfind("/")
    prefix = token[:cut] if cut >= 0 else ""
    return "" if JAVA_LINE_TERMINATORS.intersection(prefix) else prefix


def _recoverable_rows(lost: list, judged: dict, aged_before_us: int) -> list[tuple]:
    """The recoverable rows (:data:`RECOVERABLE_COLUMNS`) of ``lost`` (``(id, token, registered_us, raw, ref,
    in_ledger)`` tuples, every id joined nowhere) by :func:`_mark_lost`'s rule, in Python on the driver's
    few rows (a SQL table of them cost the planning of a statement holding every raw line); held equal to
    the rule in Spark (:func:`_mark_lost`, as the code before ran it over a SQL table of these rows) by
    ``tests/app/test_verify_recoverable_rule.py``."""
    verdict_of = {p: v for p, v in judged.items() if v in (STOPPED, UNSEEN)}
    rows = []
    for id_, token, registered_us, raw, ref, in_ledger in lost:
        if token is None or token == "" or raw is None:          # not lost (no entry), cleared, or no line
            continue
        verdict = verdict_of.get(_token_prefix(token))
        stopped = verdict == STOPPED
        aged = verdict == UNSEEN and registered_us is not None and 0 < registered_us < aged_before_us
        if not (in_ledger or stopped or aged):
            continue
        reason = LEDGER_REASON if in_ledger else STOPPED_REASON if stopped else AGED_REASON
        rows.append((id_, token, raw, ref, reason, registered_us))
    return rows


def _write_rows(rows: list[tuple], folder: Path) -> None:
    """The recoverable rows as one Parquet file in ``folder`` (replaced), as Spark would write them."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq
    types = {"string": pa.string(), "bigint": pa.int64()}
    schema = pa.schema([(c, types[t]) for c, t in RECOVERABLE_COLUMNS])
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    table = pa.Table.from_pylist([dict(zip(schema.names, r)) for r in rows], schema=schema)
    pq.write_table(table, folder / "part-00000.parquet")


def _parquet_rows(folder: Path) -> int:
    """Rows of the Parquet files in ``folder``, from their footers."""
    import pyarrow.parquet as pq
    return sum(pq.ParquetFile(f).metadata.num_rows for f in sorted(folder.glob("*.parquet")))


RECOVERABLE_COLUMNS = (("id", "string"), ("token", "string"), ("raw", "string"), ("ref", "string"),
                       ("reason", "string"), ("registered_us", "bigint"))


def _recoverable(spark, every, lines, export_files: list[str], judged: dict, ledger: list, aged_before_us: int):
    """The lost ids that may be recovered (:func:`_mark_lost`): the rows of ``every`` (:func:`_counts`)
    that are lost, with their registry entry (token, registered_us: the export read again, those ids only),
    their line and reference (``lines``, :func:`_lines_of`), the verdict on their joiner and their ledger
    entries."""
    from pyspark.sql import functions as F
    lost_ids = every.filter(F.col("lost") > 0).select("id", "in_regions")
    exported = _read_export(spark, export_files)
    registered_us = F.col("registered_us") if "registered_us" in exported.columns else F.lit(0).cast("long")
    entries = exported.filter(F.col("token").isNotNull()).join(lost_ids.select("id"), "id", "left_semi") \
        .groupBy("id").agg(F.first(F.struct("token", registered_us.alias("registered_us"))).alias("reg"))
    lost = lost_ids.join(entries, "id", "left").join(lines, "id", "left").select(
        "id", F.col("reg.token").alias("token"), F.col("reg.registered_us").alias("registered_us"),
        F.when(F.col("in_regions").isNotNull(), F.col("raw")).alias("raw"),
        F.when(F.col("in_regions").isNotNull(), F.col("ref")).alias("ref"))
    judged_df = spark.createDataFrame([(p, v) for p, v in judged.items() if v in (STOPPED, UNSEEN)],
                                      "prefix string, verdict string")
    ledger_df = spark.createDataFrame(ledger, "id string, token string").dropDuplicates() \
        .withColumn("in_ledger", F.lit(True))
    lost = lost.withColumn("prefix", F.regexp_extract("token", TOKEN_PREFIX, 1)) \
        .join(F.broadcast(judged_df), "prefix", "left").join(ledger_df, ["id", "token"], "left") \
        .withColumn("n_out", F.lit(None).cast("long"))
    return _mark_lost(lost, aged_before_us).filter("is_recoverable") \
        .select(*(c for c, _ in RECOVERABLE_COLUMNS))


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
