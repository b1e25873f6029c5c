"""The output contract during a real run: a plain Spark reader never sees a file being written, and
``photon sql`` counts a joined click while its file is still open (through the commit record), with counts
over two regions equal to the truth."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import orjson
import pytest

from photon import format_event_id, wait_until
from photon.app import GenOptions, generate, run_query


def count(config, spark, where: str = "") -> dict:
    sql = f"SELECT count(*) AS n, count(DISTINCT click_id) AS d FROM joined {where}"
    return orjson.loads(run_query(config, spark, sql, "json", show_progress=False))


@pytest.mark.slow
@pytest.mark.timeout(280)
def test_plain_readers_see_whole_files_and_photon_sql_sees_a_new_click_before_its_file_is_published(
        tmp_path, pipeline, truth, spark):
    generate(GenOptions(out=str(tmp_path), queries=6000, clicks_per_query=0.1, regions=("a", "b"), writers=2,
                        unjoinable_fraction=0.02, duplicate_fraction=0.02, bad_line_fraction=0.0,
                        unjoinable_after_s=3.0, seed=5))
    config_path = tmp_path / "photon.toml"
    with open(config_path, "a") as f:    # files stay open all run: only the commit records show their lines
        f.write("\n[joiner]\nroll_interval_s = 3600.0\nper_region = 1\n")
    p = pipeline(config_path).start()
    config = p.config
    joinable = truth(tmp_path, "joinable")
    plain_reads: list[tuple[list[str], list[str]]] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def plain_reader():             # what any Spark user does: read the folder, nothing Photon-specific
        try:
            while not stop.is_set():
                for region in config.regions:
                    if any(region.joined_dir.rglob("*.jsonl")):
                        df = spark.read.json(str(region.joined_dir))
                        plain_reads.append((df.inputFiles(), df.columns))
                        df.count()
                stop.wait(0.2)
        except BaseException as e:      # noqa: BLE001 - reported by the test thread
            errors.append(e)

    reader = threading.Thread(target=plain_reader)
    reader.start()
    try:
        wait_until(lambda: count(config, spark) == {"n": len(joinable), "d": len(joinable)}, 150, interval=0.5,
                   message="photon sql counting every joinable click once over both regions")
        # a new query and its click, written now: counted while the joiner's file is still open
        t = time.time_ns() // 1000
        qid, cid = format_event_id("10.1.0.9", 77, t), format_event_id("10.2.0.9", 78, t + 1)
        for region in config.regions:
            logs = Path(region.log_root)
            with open(logs / "queries" / "w0" / "late.jsonl", "ab") as f:
                f.write(orjson.dumps({"query_id": qid, "advertiser_id": "adv-late"}) + b"\n")
        wait_until(lambda: orjson.loads(run_query(config, spark, f"SELECT count(*) AS n FROM queries WHERE query_id = "
                                                         f"'{qid}'", "json", False))["n"] == 2, 60,
                   message="the new query in both regions' logs")   # and so, about now, in the event stores
        for region in config.regions:
            with open(Path(region.log_root) / "clicks" / "w0" / "late.jsonl", "ab") as f:
                f.write(orjson.dumps({"click_id": cid, "query_id": qid, "cost_micros": 5}) + b"\n")
        written = time.monotonic()
        wait_until(lambda: count(config, spark, f"WHERE click_id = '{cid}'")["n"] == 1, 60, interval=0.05,
                   message="the new click counted by photon sql")
        seen_after_s = time.monotonic() - written
        assert not [f for r in config.regions for f in r.joined_dir.rglob("*.jsonl") if f.stat().st_size], \
            "a file was published: the click must have been seen through the commit record"
        print(f"new click counted by photon sql {seen_after_s * 1000:.0f} ms after its line was written")
    finally:
        stop.set()
        reader.join(timeout=60)
    assert not errors, errors
    for files, columns in plain_reads:
        assert not [f for f in files if "/." in f or "/_" in f or f.endswith(".inprogress")], files
        assert "_corrupt_record" not in columns
    assert p.stop() == 0
    final = count(config, spark)
    assert final == {"n": len(joinable) + 1, "d": len(joinable) + 1}
    plain = [spark.read.json(str(r.joined_dir)) for r in config.regions if any(r.joined_dir.rglob("*.jsonl"))]
    assert sum(df.count() for df in plain) == len(joinable) + 1                   # all published at stop
    assert not [df for df in plain if "_corrupt_record" in df.columns]
