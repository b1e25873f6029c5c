"""``photon sql`` tables and ``photon compact`` against a real local SparkSession, over output written by
Photon's own writer (published files, open files with a commit record, compacted partitions)."""
from __future__ import annotations

import io
import threading
from collections import Counter
from pathlib import Path

import orjson
import pytest

from photon import RollingWriter, parse_config, read_output_lines
from photon._logs import partition_of
from photon.app import compact, joined_dataframe
from photon.app._sql import format_rows, interactive, run_query

SQL = {"foreign_schema": "click_id STRING, query_id STRING, cost_micros BIGINT",
       "primary_schema": "query_id STRING, advertiser_id STRING"}


def make_config(root: Path, regions=("a", "b"), **sections):
    return parse_config({"regions": [{"name": n, "log_root": str(root / n / "logs"), "output_root": str(root / n / "out"),
                                      "state_dir": str(root / n / "state")} for n in regions],
                         "sql": SQL, **sections}, str(root / "photon.toml"), root)


def joined_line(region: str, n: int, adv: str | None = None, cost: int | str = 100) -> bytes:
    return orjson.dumps({"click_id": f"10.2.0.1:1:{n:016d}", "query_id": f"q{n}", "cost_micros": cost,
                         "query": {"query_id": f"q{n}", "advertiser_id": adv or f"adv-{n % 3}"},
                         "_photon": {"region": region, "joiner": f"{region}-j0", "joined_at_us": n}})


def write_history(joined_dir: Path, partition: str, name: str, lines: list[bytes]) -> None:
    """A published file of a past hour, as a writer left it."""
    (joined_dir / partition).mkdir(parents=True, exist_ok=True)
    (joined_dir / partition / name).write_bytes(b"".join(x + b"\n" for x in lines))


def query(config, spark, sql: str) -> list[dict]:
    return [orjson.loads(x) for x in run_query(config, spark, sql, "json", show_progress=False).splitlines()]


def test_counts_over_two_regions_equal_the_truth_and_bad_lines_fail_nothing(spark, tmp_path):
    config = make_config(tmp_path)
    truth: Counter = Counter()
    writers = []
    for k, region in enumerate(config.regions):
        write_history(region.joined_dir, "date=2024-05-01/hour=07", "x-j0-1-000001.jsonl",
                      [joined_line(region.name, n) for n in range(20 + k)])
        w = RollingWriter(region.joined_dir, f"{region.name}-j0", commit_interval_s=0)
        w.write_lines([joined_line(region.name, 100 + n, "adv-7") for n in range(5)])   # open, committed
        w.write_lines([b'{"click_id": "10.2.0.1:1:0000000000000999", "broken',          # not JSON
                       b'{"no_id": 1}',                                                   # no id
                       joined_line(region.name, 500, "adv-7", cost="lots")])              # wrong type
        writers.append(w)
        for n in list(range(20 + k)):
            truth[(region.name, f"adv-{n % 3}")] += 1
        truth[(region.name, "adv-7")] += 6
    rows = query(config, spark, "SELECT region, query.advertiser_id AS adv, count(*) AS n, count(cost_micros) AS "
                                "costed FROM joined GROUP BY region, query.advertiser_id ORDER BY region, adv")
    assert {(r["region"], r["adv"]): r["n"] for r in rows} == dict(truth)
    assert all(r["costed"] == r["n"] - (r["adv"] == "adv-7") for r in rows)   # "lots" reads as NULL
    [hist] = query(config, spark, "SELECT count(*) AS n FROM joined WHERE date = '2024-05-01' AND hour = 7")
    assert hist["n"] == 41
    assert joined_dataframe(config, regions=["b"], spark=spark).count() == 21 + 6
    for w in writers:
        w.close()


def test_tables_for_input_streams_unjoinable_and_quarantine(spark, tmp_path):
    config = make_config(tmp_path, regions=("a",))
    region = config.regions[0]
    clicks = Path(region.log_root) / "clicks" / "w0"
    clicks.mkdir(parents=True)
    (clicks / "c-1.jsonl").write_bytes(b'{"click_id":"c1","query_id":"q1","cost_micros":5}\n{oops\n'
                                       b'{"click_id":"c2","query_id":"q9"}\n{"click_id":"c3","qu')   # torn tail
    w = RollingWriter(region.unjoinable_dir, "dispatcher-a", commit_interval_s=0)
    w.write_lines([b'{"click_id":"c2","query_id":"q9"}'])
    w.close()
    region.quarantine_dir.mkdir(parents=True)
    (region.quarantine_dir / "dispatcher-a.jsonl").write_bytes(
        orjson.dumps({"file": "w0/c-1.jsonl", "offset": 51, "reason": "not valid JSON", "raw": "{oops", "at_us": 1})
        + b"\n")
    assert query(config, spark, "SELECT click_id, region FROM clicks ORDER BY click_id") == [
        {"click_id": "c1", "region": "a"}, {"click_id": "c2", "region": "a"}]
    assert query(config, spark, "SELECT count(*) AS n FROM queries") == [{"n": 0}]
    assert query(config, spark, "SELECT click_id FROM unjoinable") == [{"click_id": "c2"}]
    assert query(config, spark, "SELECT source, offset, raw FROM quarantine") == [
        {"source": "dispatcher-a", "offset": 51, "raw": "{oops"}]


def test_formats_errors_and_the_prompt(spark, tmp_path, capsys):
    config = make_config(tmp_path, regions=("a",))
    w = RollingWriter(config.regions[0].joined_dir, "a-j0", commit_interval_s=0)
    w.write_lines([joined_line("a", n) for n in range(3)])
    table = run_query(config, spark, "SELECT click_id, query FROM joined ORDER BY click_id", "table", False)
    assert table.splitlines()[1].split("|")[1].strip() == "click_id" and table.rstrip().endswith("(3 rows)")
    assert '{"query_id":"q0","advertiser_id":"adv-0"}' in table
    w.close()
    csv_text = run_query(config, spark, "SELECT click_id, cost_micros FROM joined ORDER BY 1", "csv", False)
    assert csv_text.splitlines() == ["click_id,cost_micros"] + [f"10.2.0.1:1:{n:016d},100" for n in range(3)]
    assert format_rows(["a", "b"], [(None, 1)], "csv") == "a,b\n,1\n"     # NULL is an empty field
    stdin = io.StringIO("SELECT count(*) AS n\nFROM joined;\nSELECT nope FROM joined;\nSELECT 1 AS one\n")
    assert interactive(config, spark, "json", None, False, stdin=stdin) == 1
    out, err = capsys.readouterr()
    assert out.splitlines() == ['{"n":3}', '{"one":1}']
    [line] = err.splitlines()
    assert line.startswith("photon sql: ") and "nope" in line and "\tat " not in line


def test_compaction_swaps_closed_partitions_while_counts_never_change(spark, tmp_path, request):
    config = make_config(tmp_path, regions=("a",), compact={"close_after_s": 0, "keep_jsonl_s": 3600})
    region = config.regions[0]
    lines = []
    for h in range(3):
        for f in range(2):
            part = [joined_line("a", 1000 * h + 100 * f + n) for n in range(50)]
            write_history(region.joined_dir, f"date=2024-05-01/hour={h:02d}", f"a-j0-1-{h}{f:05d}.jsonl", part)
            lines += part
    w = RollingWriter(region.joined_dir, "a-j0", commit_interval_s=0)
    request.addfinalizer(w.close)                                     # its file closed also on failure
    w.write_lines([joined_line("a", 9000 + n) for n in range(7)])     # this hour: open, never compacted
    lines += [joined_line("a", 9000 + n) for n in range(7)]
    expected = len(lines)
    counts: list[int] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def count_loop():
        try:
            while not stop.is_set():
                counts.append(joined_dataframe(config, spark=spark).count())
        except BaseException as e:       # noqa: BLE001 - reported by the test thread
            errors.append(e)

    t = threading.Thread(target=count_loop)
    t.start()
    try:
        first = compact(config, spark=spark)          # swaps in 3 partitions, keeps their JSONL for readers
    finally:
        while len(counts) < 3 and not errors and t.is_alive():
            stop.wait(0.05)
        stop.set()
        t.join(timeout=120)
    assert not errors, [str(e)[:600] for e in errors]
    assert first.partitions_compacted == 3 and first.lines_compacted == 300 and first.jsonl_files_swapped == 6
    assert counts and set(counts) == {expected}, Counter(counts)
    assert not list(region.joined_dir.glob("date=2024-05-01/hour=*/*.jsonl"))        # out of the JSONL table
    assert len(list(region.joined_dir.glob("_compacted/g*/jsonl/date=2024-05-01/hour=*/*.jsonl"))) == 6  # kept
    assert len(list((tmp_path / "a/out/joined_parquet").glob("date=2024-05-01/hour=*/*.parquet"))) == 3
    assert joined_dataframe(config, spark=spark).count() == expected
    later = make_config(tmp_path, regions=("a",), compact={"close_after_s": 0, "keep_jsonl_s": 0})
    assert compact(later, spark=spark).jsonl_files_deleted == 6          # their time is up: deleted
    assert not list(region.joined_dir.rglob("*.jsonl")) and not (region.joined_dir / "_compacted").exists()
    assert sorted(read_output_lines(region.joined_dir)) == sorted(lines)            # every byte still there
    assert joined_dataframe(config, spark=spark).count() == expected
    [row] = query(config, spark, "SELECT count(*) AS n, count(DISTINCT click_id) AS d, "
                                 "sum(CASE WHEN date = '2024-05-01' AND hour = 1 THEN 1 ELSE 0 END) AS h1 "
                                 "FROM joined")      # the open file is in this hour, which may be hour 1
    assert row == {"n": expected, "d": expected, "h1": 100}
    assert compact(config, spark=spark).partitions_compacted == 0             # nothing closed is left
    w.close()
    assert partition_of(0) == "date=1970-01-01/hour=00"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_photon_run_compact_runs_photon_compact_as_a_child_process(tmp_path):
    import os
    from photon import load_config, wait_until
    from photon.app._compact import PeriodicCompaction
    (tmp_path / "photon.toml").write_text(
        '[compact]\nclose_after_s = 0.0\nevery_s = 0.1\n[spark]\nmaster = "local[1]"\ndriver_memory = "512m"\n'
        '[[regions]]\nname = "a"\nlog_root = "logs"\noutput_root = "out"\nstate_dir = "state"\n')
    config = load_config(tmp_path / "photon.toml")
    write_history(config.regions[0].joined_dir, "date=2024-05-01/hour=03", "a-j0-1-000001.jsonl",
                  [joined_line("a", n) for n in range(10)])
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    log = tmp_path / "state" / "logs" / "compact.log"
    periodic = PeriodicCompaction(config, env, log.parent, echo=print)
    try:
        wait_until(lambda: periodic.poll() or (log.exists() and "photon compact:" in log.read_text()), 200,
                   interval=0.2, message="one compaction run finished")
    finally:
        periodic.stop()
    assert "photon compact: 1 partition(s), 10 lines as Parquet" in log.read_text()
    assert sorted(read_output_lines(config.regions[0].joined_dir)) == sorted(joined_line("a", n) for n in range(10))
