"""``photon compact`` over output published to S3 (a real moto_server, the session's one SparkSession): closed
hours move from the JSONL table ``<output_root>/joined`` to the Parquet table ``<output_root>/joined_parquet``
(each hour in exactly one of them once a swap is done), and every reader of the output kind (snapshot,
tailers begun before or after, the ``joined`` SQL table) counts every row once, also after the kept JSONL
is deleted."""
from __future__ import annotations

import time

import orjson
import pytest

from photon import parse_config, read_output_lines
from photon._logs import partition_of
from photon.app import compact, joined_dataframe

pytestmark = pytest.mark.timeout(600)

HOURS = ["date=2024-05-01/hour=00", "date=2024-05-01/hour=01"]
AFTER = 1714532400 * 1_000_000          # 2024-05-01 03:00 UTC: both hours ended


def joined_line(n: int) -> bytes:
    return orjson.dumps({"click_id": f"10.2.0.1:1:{n:016d}", "query_id": f"q{n}", "cost_micros": 100,
                         "query": {"query_id": f"q{n}", "advertiser_id": f"adv-{n % 3}"},
                         "_photon": {"region": "a", "joiner": "a-j0", "joined_at_us": n}})


def config(tmp_path, bucket, **compact_options):
    return parse_config({"regions": [{"name": "a", "log_root": str(tmp_path / "logs"),
                                      "output_root": bucket.url("out/a"), "state_dir": str(tmp_path / "state")}],
                         "s3": {"list_interval_s": 0.0, "full_list_interval_s": 0.01},
                         "sql": {"foreign_schema": "click_id STRING, query_id STRING, cost_micros BIGINT",
                                 "primary_schema": "query_id STRING, advertiser_id STRING"},
                         "compact": compact_options}, str(tmp_path / "photon.toml"), tmp_path)


def publish_history(bucket) -> list[bytes]:
    """Two files in each past hour and one in the current hour (never closed), published as a writer does."""
    lines = []
    for h, part in enumerate([*HOURS, partition_of(time.time_ns() // 1000)]):
        for f in range(2):
            chunk = [joined_line(1000 * h + 100 * f + n) for n in range(30)]
            bucket.put(f"out/a/joined/{part}/a-j0-1-{h:02d}{f:04d}.jsonl", b"".join(x + b"\n" for x in chunk))
            lines += chunk
    return lines


def hours_of(bucket, table: str, ext: str) -> set[str]:
    return {"/".join(k.split("/")[3:5]) for k in bucket.keys(f"out/a/{table}/date=") if k.endswith(ext)}


def read_tail(tailer) -> list[bytes]:
    return [line for chunk in tailer.poll() for line in chunk.lines]


def test_compaction_moves_closed_hours_to_the_parquet_table_and_readers_count_each_row_once(tmp_path, s3, spark):
    cfg = config(tmp_path, s3, close_after_s=0, keep_jsonl_s=3600)
    lines = publish_history(s3)
    output = cfg.regions[0].output_reader("joined", cfg.s3)
    early = output.tailer()
    assert sorted(read_tail(early)) == sorted(lines)          # a tailer that read everything before

    stats = compact(cfg, spark=spark, now_us=AFTER)

    assert stats.partitions_compacted == 2 and stats.lines_compacted == 120 and stats.jsonl_files_swapped == 4
    assert hours_of(s3, "joined_parquet", ".parquet") == set(HOURS)         # shown
    assert not hours_of(s3, "joined", ".jsonl") & set(HOURS)                 # hidden: each hour in one table
    assert len([k for k in s3.keys("out/a/joined/_compacted/") if k.endswith(".jsonl")]) == 4   # kept
    assert sorted(read_output_lines(output.url, s3=cfg.s3)) == sorted(lines)
    assert output.count() == len(lines)
    assert read_tail(early) == []                            # nothing twice for a tailer begun before
    fresh = output.tailer()
    assert sorted(read_tail(fresh)) == sorted(lines)         # compacted hours from the Parquet, once
    assert read_tail(fresh) == []
    assert joined_dataframe(cfg, spark=spark).count() == len(lines)
    assert compact(cfg, spark=spark, now_us=AFTER).partitions_compacted == 0   # nothing left to do

    later = config(tmp_path, s3, close_after_s=0, keep_jsonl_s=0)
    gone = compact(later, spark=spark, now_us=time.time_ns() // 1000 + 1)     # the current hour stays open
    assert gone.jsonl_files_deleted == 4
    assert [k for k in s3.keys("out/a/joined/_compacted/") if k.endswith(".jsonl")] == []
    assert sorted(read_output_lines(output.url, s3=cfg.s3)) == sorted(lines)      # JSONL gone: Parquet
    assert sorted(read_tail(later.regions[0].output_reader("joined", later.s3).tailer())) == sorted(lines)
