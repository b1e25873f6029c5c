"""The output as two plain tables (README "Output contract"): closed hours move from ``joined/`` (JSONL) to
``joined_parquet/`` (Parquet) during ``photon compact``, and a reader with only Spark or DuckDB, reading the
Parquet table first and then the JSONL table, counts every joined row once: recent hours, compacted hours
and hours whose JSONL is gone. Real local SparkSession, real DuckDB."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import duckdb
import pytest

from photon import read_output_lines
from photon.app import compact, joined_dataframe
from photon.app import _compact
from photon._logs import partition_of

from test_sql import joined_line, make_config, write_history

pytestmark = pytest.mark.timeout(600)


def spark_plain_count(spark, out: Path) -> tuple[int, float, float]:
    """The README's Spark read: the Parquet table, then the JSONL table with its schema; returns the count
    and when the two listings began and ended (Spark lists when a DataFrame is made)."""
    t0 = time.monotonic()
    p = spark.read.option("mergeSchema", "true").parquet(str(out / "joined_parquet"))
    df = p.unionByName(spark.read.schema(p.schema).json(str(out / "joined")))
    t1 = time.monotonic()
    return df.count(), t0, t1


def duckdb_sql(out: Path, select: str = "*") -> str:
    """The README's DuckDB read (Parquet table first, then the JSONL table)."""
    return (f"SELECT {select} FROM read_parquet('{out}/joined_parquet/date=*/hour=*/*.parquet', "
            f"hive_partitioning = true, union_by_name = true) UNION ALL BY NAME "
            f"SELECT {select} FROM read_json_auto('{out}/joined/date=*/hour=*/*.jsonl', "
            f"hive_partitioning = true, union_by_name = true)")


def duckdb_plain_count(out: Path) -> tuple[int, float, float]:
    t0 = time.monotonic()
    with duckdb.connect() as con:
        [(n,)] = con.execute(f"SELECT count(*) FROM ({duckdb_sql(out, 'click_id')})").fetchall()
    return n, t0, time.monotonic()


def history(config, hours: int, files: int = 2, per_file: int = 40) -> tuple[list[bytes], dict[str, int]]:
    """Published files of ``hours`` past hours and one of an open hour (:func:`open_hour`, never closed); the
    lines and the rows per partition."""
    region = config.regions[0]
    lines, per_part = [], {}
    parts = [f"date=2024-05-01/hour={h:02d}" for h in range(hours)] + [open_hour()]
    for h, part in enumerate(parts):
        for f in range(files):
            chunk = [joined_line("a", 10_000 * h + 100 * f + n, adv=f"adv-{n % 4}") for n in range(per_file)]
            write_history(region.joined_dir, part, f"a-j0-1-{h:02d}{f:04d}.jsonl", chunk)
            lines += chunk
        per_part[part] = files * per_file
    return lines, per_part


def open_hour() -> str:
    """The next hour's partition: still open at the end of a test even when the clock's hour turns while it
    runs (this hour's partition would then close, with ``close_after_s = 0``, and be compacted)."""
    return partition_of(time.time_ns() // 1000 + 3_600_000_000)


def visible_hours(out: Path, table: str, ext: str) -> set[str]:
    return {f"{p.parent.parent.name}/{p.parent.name}" for p in (out / table).glob(f"date=*/hour=*/*.{ext}")}


def test_each_step_of_a_swap_keeps_every_hour_in_one_table_and_plain_reads_exact(spark, tmp_path, monkeypatch):
    config = make_config(tmp_path, regions=("a",), compact={"close_after_s": 0, "keep_jsonl_s": 0})
    out = tmp_path / "a" / "out"
    lines, per_part = history(config, hours=2)
    write_history(config.regions[0].joined_dir, "date=2024-04-30/hour=23", "a-j0-0-000001.jsonl",
                  [joined_line("a", 99_000 + n) for n in range(5)])
    lines += [joined_line("a", 99_000 + n) for n in range(5)]
    total = len(lines)
    first = compact(config, spark=spark, now_us=1714521600 * 1_000_000)   # 2024-05-01 00:00: only 04-30 23h
    assert first.partitions_compacted == 1
    seen: list[tuple] = []

    def at_step(step, root, part):
        if Path(root).name != "joined":
            return
        jsonl, parquet = visible_hours(out, "joined", "jsonl"), visible_hours(out, "joined_parquet", "parquet")
        assert not jsonl & parquet, (step, part, jsonl & parquet)       # never both visible
        spark_n, _, _ = spark_plain_count(spark, out)
        duck_n, _, _ = duckdb_plain_count(out)
        photon_n = len(read_output_lines(root))
        seen.append((step, part, part in jsonl, part in parquet, spark_n, duck_n, photon_n,
                     joined_dataframe(config, spark=spark).count()))

    monkeypatch.setattr(_compact, "SWAP_HOOK", at_step)
    stats = compact(config, spark=spark)
    assert stats.partitions_compacted == 2 and stats.jsonl_files_deleted == 5      # every JSONL swapped out
    for step, part, in_jsonl, in_parquet, spark_n, duck_n, photon_n, df_n in seen:
        assert photon_n == df_n == total, (step, part)            # Photon's readers: exact at every step
        where = {"written": (True, False), "recorded": (True, False), "hidden": (False, False),
                 "shown": (False, True)}[step]
        assert (in_jsonl, in_parquet) == where, (step, part)
        # plain readers: every row once, except between the two renames, where the hour is in neither
        expect = total - per_part[part] if step == "hidden" else total
        assert spark_n == duck_n == expect, (step, part, spark_n, duck_n, expect)
    assert [s[:2] for s in seen] == [(s, p) for p in sorted(per_part)[:2] for s in
                                     ("written", "recorded", "hidden", "shown")]
    # after compaction, the JSONL of every compacted hour deleted: both engines still read everything
    (open_part,) = [p for p in per_part if not p.startswith("date=2024-")]
    assert not list((out / "joined").rglob("*.jsonl")) or all(
        open_part in str(p) for p in (out / "joined").rglob("*.jsonl"))
    assert spark_plain_count(spark, out)[0] == duckdb_plain_count(out)[0] == total
    with duckdb.connect() as con:       # the same columns in both tables: structs by name, typed ids
        rows = dict(con.execute(f"SELECT query.advertiser_id, count(*) FROM ({duckdb_sql(out)}) GROUP BY 1")
                    .fetchall())
    assert sum(rows.values()) == total and rows["adv-0"] == 20 * 3 + 2     # 5 early lines: adv-(n%3)


def test_plain_spark_and_duckdb_reads_during_compaction_count_each_row_once(spark, tmp_path, monkeypatch):
    config = make_config(tmp_path, regions=("a",), compact={"close_after_s": 0, "keep_jsonl_s": 0})
    out = tmp_path / "a" / "out"
    lines, per_part = history(config, hours=8, files=3, per_file=30)
    total = len(lines)
    compact(config, spark=spark, now_us=1714521600 * 1_000_000 + 2 * 3_600_000_000)   # hours 00, 01 first
    swaps: list[list[float]] = []

    def at_step(step, root, part):
        if step == "recorded":
            swaps.append([time.monotonic(), float("inf")])       # the hide follows at once
        elif step == "shown":
            swaps[-1][1] = time.monotonic()

    monkeypatch.setattr(_compact, "SWAP_HOOK", at_step)
    errors: list[BaseException] = []
    done = threading.Event()

    def run():
        try:
            compact(config, spark=spark)
        except BaseException as e:     # noqa: BLE001 - reported by the test thread
            errors.append(e)
        finally:
            done.set()

    reads: list[tuple[str, int | None, float, float]] = []
    t = threading.Thread(target=run)
    t.start()
    try:
        while not done.is_set() or len(reads) < 4:
            for name, read in (("spark", lambda: spark_plain_count(spark, out)),
                               ("duckdb", lambda: duckdb_plain_count(out))):
                t0 = time.monotonic()
                try:
                    n, l0, l1 = read()
                except Exception as e:     # noqa: BLE001 - a file listed, then moved by a swap
                    text = str(e)
                    assert "FILE_NOT_EXIST" in text or "No such file" in text or "PATH_NOT_FOUND" in text, text
                    n, l0, l1 = None, t0, time.monotonic()
                reads.append((name, n, l0, l1))
    finally:
        t.join(timeout=300)
    assert not errors, errors
    assert len(swaps) == 6 and all(end < float("inf") for _, end in swaps)

    def straddles(l0, l1):
        return any(s0 <= l1 and s1 >= l0 for s0, s1 in swaps)

    exact = [r for r in reads if r[1] == total]
    for name, n, l0, l1 in reads:
        assert n is None or n <= total, (name, n, total)                  # never a row twice
        if n != total:
            assert straddles(l0, l1), (name, n, total)                   # a miss only across a swap
            if n is not None:
                missed = total - n
                assert missed in {sum(per_part[p] for p in combo) for combo in _subsets(per_part)}, missed
    assert len(exact) >= len(reads) // 2, reads
    print(f"\nplain reads during compaction: {len(reads)}, exact {len(exact)}, "
          f"short {sum(1 for r in reads if r[1] is not None and r[1] != total)}, "
          f"failed (file moved) {sum(1 for r in reads if r[1] is None)}; swaps {len(swaps)}, "
          f"longest hide-to-show {max(s1 - s0 for s0, s1 in swaps) * 1e3:.2f} ms")
    assert spark_plain_count(spark, out)[0] == duckdb_plain_count(out)[0] == total
    assert len(read_output_lines(config.regions[0].joined_dir)) == total


def _subsets(per_part: dict[str, int]):
    parts = sorted(per_part)
    for mask in range(1, 1 << len(parts)):
        yield [p for i, p in enumerate(parts) if mask >> i & 1]


def test_an_interrupted_swap_and_an_older_compaction_are_finished_by_the_next_run(spark, tmp_path, monkeypatch):
    config = make_config(tmp_path, regions=("a",), compact={"close_after_s": 0, "keep_jsonl_s": 3600})
    out = tmp_path / "a" / "out"
    lines, per_part = history(config, hours=2)
    total = len(lines)

    def killed(step, root, part):
        if step == "hidden" and part.endswith("hour=01"):
            raise KeyboardInterrupt("killed between hide and show")

    monkeypatch.setattr(_compact, "SWAP_HOOK", killed)
    with pytest.raises(KeyboardInterrupt):
        compact(config, spark=spark)
    monkeypatch.setattr(_compact, "SWAP_HOOK", None)
    assert len(read_output_lines(config.regions[0].joined_dir)) == total          # Photon's readers: all
    assert duckdb_plain_count(out)[0] == total - per_part["date=2024-05-01/hour=01"]   # plain: the window
    assert compact(config, spark=spark).partitions_compacted == 0                # finishes, compacts nothing
    assert spark_plain_count(spark, out)[0] == duckdb_plain_count(out)[0] == total
    assert visible_hours(out, "joined_parquet", "parquet") == set(sorted(per_part)[:2])
