"""``photon sql`` on a config written by hand, with no ``[sql]`` section: the streams' schemas are inferred
from a sample (Spark's JSON inference), printed with the ``[sql]`` lines that pin them, cached under the
state dir; explicit schemas win. Real local SparkSession."""
from __future__ import annotations

import time
import tomllib
from pathlib import Path

import orjson
import pytest

from photon import load_config
from photon.app._sql import sql_command
from photon.app._tables import schema_cache_path, stream_schemas

from test_sql import joined_line, write_history

pytestmark = pytest.mark.timeout(300)
QUERY = "SELECT query.advertiser_id AS adv, count(*) AS n, sum(cost_micros) AS spend FROM joined GROUP BY 1 ORDER BY 1"


def hand_written(tmp_path: Path, extra: str = "") -> Path:
    """A config as a new user writes it: one region, no [sql]; logs and joined output in place."""
    (tmp_path / "photon.toml").write_text(
        f'{extra}[[regions]]\nname = "a"\nlog_root = "logs"\noutput_root = "out"\nstate_dir = "state"\n')
    logs = tmp_path / "logs"
    (logs / "queries").mkdir(parents=True, exist_ok=True)
    (logs / "clicks").mkdir(parents=True, exist_ok=True)
    (logs / "queries" / "q-1.log").write_bytes(b"".join(orjson.dumps(
        {"query_id": f"q{n}", "advertiser_id": f"adv-{n % 3}", "country": "NZ"}) + b"\n" for n in range(60)))
    (logs / "clicks" / "c-1.log").write_bytes(b"".join(orjson.dumps(
        {"click_id": f"10.2.0.1:1:{n:016d}", "query_id": f"q{n}", "cost_micros": 100}) + b"\n" for n in range(60)))
    write_history(tmp_path / "out" / "joined", "date=2024-05-01/hour=07", "a-j0-1-000001.jsonl",
                  [joined_line("a", n) for n in range(60)])
    return tmp_path / "photon.toml"


def run(config, capsys, query=QUERY, **kw) -> tuple[list[dict], str, float]:
    t0 = time.monotonic()
    code = sql_command(config, query, "json", **kw)
    took = time.monotonic() - t0
    out, err = capsys.readouterr()
    assert code == 0, err
    return [orjson.loads(x) for x in out.splitlines()], err, took


def test_a_hand_written_config_queries_nested_fields_by_inferred_schemas_cached_and_pinnable(
        spark, tmp_path, capsys):
    config = load_config(hand_written(tmp_path))
    rows, err, first = run(config, capsys)
    assert rows == [{"adv": f"adv-{k}", "n": 20, "spend": 2000} for k in range(3)]
    assert "inferred clicks from 60 lines, queries from 60 lines" in err
    snippet = err[err.index("\n[sql]\n") + 1:]
    pinned = tomllib.loads(snippet)["sql"]
    assert pinned == {"foreign_schema": "click_id STRING, cost_micros BIGINT, query_id STRING",
                      "primary_schema": "advertiser_id STRING, country STRING, query_id STRING"}
    assert schema_cache_path(config).exists()
    rows2, err2, second = run(config, capsys)                    # from the cache: no sampling
    assert rows2 == rows and "as inferred earlier" in err2 and "\n[sql]\n" not in err2
    # pinning: the printed lines in the config give the same answer and nothing is inferred
    (tmp_path / "photon.toml").write_text(snippet + (tmp_path / "photon.toml").read_text())
    rows3, err3, _ = run(load_config(tmp_path / "photon.toml"), capsys)
    assert rows3 == rows and err3 == ""
    t0 = time.monotonic()
    stream_schemas(config, spark, refresh=True)
    sampled = time.monotonic() - t0
    t0 = time.monotonic()
    assert {s.origin for s in stream_schemas(config, spark).values()} == {"cached"}
    cached = time.monotonic() - t0
    with capsys.disabled():
        print(f"schemas: sampled and inferred {sampled * 1e3:.0f} ms, from the cache {cached * 1e3:.1f} ms")
        print(f"\nphoton sql without [sql]: first call (sampling) {first:.2f} s, second (cached) {second:.2f} s")


def test_an_explicit_schema_wins_over_inference_and_the_cache(spark, tmp_path, capsys):
    path = hand_written(tmp_path)
    run(load_config(path), capsys)                                 # caches both inferred schemas
    config = load_config(hand_written(tmp_path, '[sql]\nprimary_schema = "query_id STRING"\n'))
    [row], err, _ = run(config, capsys, "SELECT * FROM joined LIMIT 1")
    assert set(row["query"]) == {"query_id"}                     # the explicit one, not the cached one
    assert "cost_micros" in row and "as inferred earlier" in err and "clicks" in err
    _, err, _ = run(config, capsys, "SELECT 1 AS one", infer_schemas=True)
    assert "inferred clicks from 60 lines" in err and "queries from" not in err
