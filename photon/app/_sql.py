"""``photon sql``: Spark SQL over Photon's tables (see :mod:`photon.app._tables`), one query or a prompt.

Each query re-registers the tables first, so it sees every line committed before it started (the output
contract's freshness: about ``[joiner].commit_interval_ms`` after a joined line is written). Results print
as a table, CSV or JSON lines, to standard output or ``--out``. A failing query prints one line as Spark
reports it (the Java stack only with ``--verbose``) and the prompt goes on.
"""
from __future__ import annotations

import csv
import datetime
import io
import logging
import os
import sys
from pathlib import Path

import orjson

from photon import PhotonConfig
from photon.app._spark import progress, spark_error, spark_session
from photon.app._tables import pin_snippet, register_tables, schema_cache_path, stream_schemas

FORMATS = ("table", "csv", "json")
HISTORY_FILE = "~/.photon_sql_history"
MAX_CELL = 60
QUERY_ERROR_LOGGER = "SQLQueryContextLogger"


def _plain(value):
    """A cell's value as JSON-able data (rows and structs as objects, dates as ISO text)."""
    if hasattr(value, "asDict"):
        return {k: _plain(v) for k, v in value.asDict().items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    return value


def _cell(value) -> str:
    value = _plain(value)
    if value is None:
        return "NULL"
    if isinstance(value, (dict, list)):
        return orjson.dumps(value).decode()
    return str(value)


def format_rows(columns: list[str], rows: list, fmt: str) -> str:
    """The rows as ``table`` (aligned, boxed like Spark's ``show``), ``csv`` (with a header) or ``json``
    (one object per line)."""
    if fmt == "json":
        return "".join(orjson.dumps(dict(zip(columns, (_plain(v) for v in row)))).decode() + "\n" for row in rows)
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(columns)
        w.writerows([["" if v is None else _cell(v) for v in row] for row in rows])
        return buf.getvalue()
    cells = [[_cell(v) for v in row] for row in rows]
    cells = [[c if len(c) <= MAX_CELL else c[: MAX_CELL - 3] + "..." for c in row] for row in cells]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    sep = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    line = lambda vals: "| " + " | ".join(v.rjust(w) for v, w in zip(vals, widths)) + " |"   # noqa: E731
    out = [sep, line(columns), sep, *(line(r) for r in cells), sep,
           f"({len(rows)} row{'s' if len(rows) != 1 else ''})"]
    return "\n".join(out) + "\n"


def run_query(config: PhotonConfig, spark, query: str, fmt: str = "table", show_progress: bool | None = None):
    """Register the tables afresh, run ``query`` and return its text in ``fmt``; Spark's exceptions pass."""
    register_tables(config, spark)
    with progress(spark, "photon sql", show_progress):
        df = spark.sql(query)
        rows = df.collect()
    return format_rows(df.columns, rows, fmt)


def _emit(text: str, out: str | None) -> None:
    if out:
        Path(out).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
        sys.stdout.flush()


def _one(config, spark, query: str, fmt: str, out: str | None, verbose: bool) -> int:
    query = query.strip().rstrip(";").strip()
    if not query:
        return 0
    # PySpark logs every failed query with its Java stack on this logger; we print one line instead
    logging.getLogger(QUERY_ERROR_LOGGER).setLevel(logging.NOTSET if verbose else logging.CRITICAL)
    try:
        _emit(run_query(config, spark, query, fmt), out)
    except Exception as e:         # a query error is the user's: one line, as Spark says it
        print(f"photon sql: {spark_error(e, verbose)}", file=sys.stderr, flush=True)
        return 1
    return 0


def interactive(config, spark, fmt: str, out: str | None, verbose: bool, stdin=None) -> int:
    """The prompt: a statement runs when a line ends with ``;`` or at an empty line; ``exit``, ``quit`` or
    end of input leave. History is kept in ``~/.photon_sql_history`` (readline)."""
    stdin = stdin or sys.stdin
    tty = stdin.isatty()
    history = os.path.expanduser(HISTORY_FILE)
    if tty:
        import readline
        try:
            readline.read_history_file(history)
        except (FileNotFoundError, OSError):
            pass
        print(f"photon sql: tables {', '.join(register_tables(config, spark))}; end a statement with ';', "
              f"leave with exit", file=sys.stderr)
    buf: list[str] = []
    code = 0
    while True:
        try:
            line = input("photon sql> " if not buf else "        ...> ") if tty else stdin.readline()
        except EOFError:
            line = None
        if line is None or (not tty and line == ""):
            if buf:
                code = _one(config, spark, " ".join(buf), fmt, out, verbose) or code
            break
        text = line.strip()
        if not buf and text.lower().rstrip(";") in ("exit", "quit"):
            break
        if text:
            buf.append(text)
        if buf and (not text or text.endswith(";")):
            code = _one(config, spark, " ".join(buf), fmt, out, verbose) or code
            buf = []
    if tty:
        import readline
        try:
            readline.write_history_file(history)
        except OSError:
            pass
    return code


def announce_schemas(config: PhotonConfig, schemas: dict, stream=None) -> None:
    """Say on standard error which schemas were inferred (sampled now: with the ``[sql]`` lines that pin
    them; taken from the cache: one line)."""
    stream = stream or sys.stderr
    j = config.join
    names = {"foreign": j.foreign_stream, "primary": j.primary_stream}
    fresh = {k: s for k, s in schemas.items() if s.origin == "inferred"}
    cached = [names[k] for k, s in schemas.items() if s.origin == "cached"]
    bare = [names[k] for k, s in schemas.items() if s.origin == "ids"]
    where = schema_cache_path(config)
    if fresh:
        said = ", ".join(f"{names[k]} from {s.lines} lines" for k, s in fresh.items())
        print(f"photon sql: no [sql] schema given; inferred {said} (cached in {where}; --infer-schemas samples "
              f"again). To pin them, put this in {config.path or 'the config'}:\n"
              f"{pin_snippet({k: s for k, s in schemas.items() if s.origin != 'config'})}", file=stream, flush=True)
    if cached:
        print(f"photon sql: schemas of {', '.join(cached)} as inferred earlier ({where}; pin them in [sql], or "
              f"--infer-schemas to sample again)", file=stream, flush=True)
    if bare:
        print(f"photon sql: nothing to sample in {', '.join(bare)}: only its id fields are columns", file=stream,
              flush=True)


def sql_command(config: PhotonConfig, query: str | None, fmt: str = "table", out: str | None = None,
                verbose: bool = False, infer_schemas: bool = False) -> int:
    """``photon sql``: 0 when every query ran, 1 when one failed. Without ``[sql]`` schemas, the streams'
    schemas are inferred from a sample and cached (``infer_schemas``: sample again)."""
    spark = spark_session(config, "photon-sql", verbose=verbose)
    announce_schemas(config, stream_schemas(config, spark, refresh=infer_schemas))
    if query is None:
        return interactive(config, spark, fmt, out, verbose)
    return _one(config, spark, query, fmt, out, verbose)
