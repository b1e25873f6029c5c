"""The lookup on the driver (few lost ids): the recoverable rule run in Python over the lost ids' rows, and
their registry entries read from the export by pyarrow, each held to what Spark gave for the same rows before
(the rule by ``_mark_lost`` over a SQL table of the rows; the entries by Spark's reading of the export)."""
from __future__ import annotations

import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from photon.app._liveness import STOPPED, UNSEEN
from photon.app._verify import (EXPORT_COLUMNS, RECOVERABLE_COLUMNS, TOKEN_PREFIX, _export_columns, _export_entries,
                                _mark_lost, _one_of, _read_export, _recoverable_rows, _sql_literal, _token_prefix)

TERMINATORS = ("\n", "\r", "\r\n", "\u0085", "\u2028", "\u2029")


def _spark_rule(spark, lost: list, judged: dict, aged_before_us: int) -> list[tuple]:
    """The recoverable rows as the code before ran the rule: ``_mark_lost`` in Spark over an inline table
    of ``lost``, the joiners' verdicts by a ``CASE`` on the token's prefix (``regexp_extract``)."""
    from pyspark.sql import functions as F
    if not lost:
        return []
    values = ",".join("(" + ",".join(_sql_literal(v) for v in row) + ")" for row in lost)
    table = spark.sql(f"SELECT * FROM VALUES {values} AS t(id, token, registered_us, raw, ref, in_ledger)")
    table = table.select("id", F.col("token").cast("string").alias("token"),
                         F.col("registered_us").cast("long").alias("registered_us"),
                         F.col("raw").cast("string").alias("raw"), F.col("ref").cast("string").alias("ref"),
                         F.col("in_ledger").cast("boolean").alias("in_ledger"))
    cases = [(p, v) for p, v in sorted(judged.items()) if v in (STOPPED, UNSEEN)]
    verdict = F.expr("CASE prefix " + " ".join(f"WHEN {_sql_literal(p)} THEN {_sql_literal(v)}" for p, v in cases)
                     + " END") if cases else F.lit(None).cast("string")
    table = table.withColumn("prefix", F.regexp_extract("token", TOKEN_PREFIX, 1)).withColumn("verdict", verdict) \
        .withColumn("n_out", F.lit(None).cast("long"))
    return [tuple(r) for r in _mark_lost(table, aged_before_us).filter("is_recoverable")
            .select(*(c for c, _ in RECOVERABLE_COLUMNS)).collect()]


def _token(rnd: random.Random, prefixes: list[str]) -> str | None:
    kind = rnd.random()
    if kind < 0.08:
        return None
    if kind < 0.14:
        return ""
    if kind < 0.2:
        return rnd.choice(["no-slash", "a" + rnd.choice(TERMINATORS) + "b", "/", "//", "x/"])
    token = f"{rnd.choice(prefixes)}/{rnd.randint(0, 99)}"
    if rnd.random() < 0.2:      # a line terminator somewhere: in the prefix, after the last /, at the end
        at = rnd.randint(0, len(token))
        token = token[:at] + rnd.choice(TERMINATORS) + token[at:]
    return token


def _lost_rows(seed: int, n: int, aged_before_us: int):
    rnd = random.Random(seed)
    prefixes = [f"127.0.0.1:{5000 + i}/{100 + i}/{10**15 + i}" for i in range(6)]
    prefixes += ["h\n:1/2/3", "h:1/2\r/3", "h\u2028:1/2/3", ""]
    judged = {p: rnd.choice([STOPPED, UNSEEN, "alive", "other"]) for p in prefixes if rnd.random() < 0.9}
    times = [None, 0, -5, 1, aged_before_us - 1, aged_before_us, aged_before_us + 1, 10**16]
    rows = []
    for k in range(n):
        raw = rnd.choice([None, f'{{"click_id":"c{k}","query_id":"q{k}"}}', "it's \\ a \"line\"\n", "é\u2028"])
        ref = rnd.choice([None, f"q{k}", "", "o'\\x"])
        rows.append((f"c{k}", _token(rnd, prefixes), rnd.choice(times), raw, ref, rnd.random() < 0.3))
    return rows, judged


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_rule_in_python_gives_sparks_rows(spark, seed):
    aged_before_us = 1_700_000_000_000_000
    rows, judged = _lost_rows(seed, 400, aged_before_us)
    got = _recoverable_rows(rows, judged, aged_before_us)
    want = _spark_rule(spark, rows, judged, aged_before_us)
    assert sorted(got, key=repr) == sorted(want, key=repr)
    reasons = {r[4] for r in got}
    assert len(reasons) == 3 and 0 < len(got) < len(rows), reasons      # every reason met, some rows left out


def test_the_token_prefix_is_javas_regexp_extract(spark):
    from pyspark.sql import functions as F
    tokens = ["a/b/c/1", "a/b", "/", "//", "x/", "/y", "none", "", "a/b\n", "a\n/b", "a/b\n/c", "a/\nb", "a\r\n/b",
              "a/b/\u0085", "\u2028a/b", "a/b\u2029/c", "a\u0085b/c/d", "é/ü/1", "a/b/c\r\n"]
    got = [_token_prefix(t) for t in tokens]
    df = spark.createDataFrame([(t,) for t in tokens], "token string")
    want = [r.p for r in df.select(F.regexp_extract("token", TOKEN_PREFIX, 1).alias("p")).collect()]
    assert got == want


def _write(path, ids, tokens, times=None, dictionary=False):
    columns = {"id": pa.array(ids, pa.string()), "token": pa.array(tokens, pa.string()),
               "timestamp_us": pa.array([1] * len(ids), pa.int64())}
    if times is not None:
        columns["registered_us"] = pa.array(times, pa.int64())
    pq.write_table(pa.table(columns), path, use_dictionary=dictionary)


def _spark_entries(spark, files, ids) -> dict:
    """The entries as the code before read them: Spark's reading of the export, filtered by value."""
    from pyspark.sql import functions as F
    exported = _read_export(spark, files)
    registered_us = F.col("registered_us") if "registered_us" in exported.columns else F.lit(0).cast("long")
    rows = exported.filter(F.col("token").isNotNull() & _one_of("id", ids)) \
        .select("id", "token", registered_us.cast("long").alias("t")).collect()
    entries = {}
    for r in rows:
        entries.setdefault(r.id, (r.token, r.t))
    return entries


@pytest.mark.parametrize("shape", ["format2", "format1", "dictionary", "mixed"])
def test_the_entries_read_by_pyarrow_are_sparks(spark, tmp_path, shape):
    rnd = random.Random(7)
    files = []
    ids_all = []
    for shard in range(3):
        ids = [f"10.1.1.1:77:{10**15 + shard * 1000 + k}" for k in range(300)]
        tokens = [rnd.choice([None, "", f"h:1/{shard}/{k % 7}/1"]) for k in range(300)]
        times = [rnd.choice([None, 0, 10**15 + k]) for k in range(300)]
        with_times = shape != "format1" and not (shape == "mixed" and shard == 1)
        path = tmp_path / f"shard-{shard}.parquet"
        _write(path, ids, tokens, times if with_times else None, dictionary=shape in ("dictionary", "mixed"))
        files.append(str(path))
        ids_all += ids
    wanted = rnd.sample(ids_all, 200) + ["not-there", ""]
    assert _export_columns(files) is not None
    assert ("registered_us" in _export_columns(files)) == (shape in ("format2", "dictionary"))
    got = _export_entries(files, wanted, _export_columns(files))
    assert got == _spark_entries(spark, files, wanted)
    assert any(t == "" for t, _ in got.values()) and any(v is None for _, v in got.values()) == (
        shape in ("format2", "dictionary"))


def test_an_export_of_other_types_is_left_to_spark(tmp_path):
    path = tmp_path / "shard-0.parquet"
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int64()), "token": pa.array(["a", "b"])}), path)
    assert _export_columns([str(path)]) is None
    assert {n for n, _ in EXPORT_COLUMNS} >= {"id", "token", "registered_us"}
