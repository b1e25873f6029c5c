"""Spark jobs over S3 (a real moto_server, the session's one SparkSession): ``photon verify`` and the
``photon sql`` tables over ``s3://`` log and output roots give the counts they give over local folders;
and the S3 output's freshness records (build-map over S3: tests/eventstore/test_es_build_map_s3.py)."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import orjson
import pytest

import idregistry
from photon import IdGenerator, OutputTailer, RollingWriter, S3Config, S3Publisher, parse_config, read_output_lines
from photon._logs import COMMITS_DIR
from photon.app import VerifyInputError, read_recoverable, run_verify
from photon.app._sql import run_query

pytestmark = pytest.mark.timeout(300)
GEN = IdGenerator("10.4.4.4", 4444)
PART = "date=2025-03-04/hour=05"
OPEN_PART = "date=2025-03-04/hour=06"


def _lines(rows) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in rows)


def _config(tmp_path: Path, log_root: str, output_root: str, name: str = "photon.toml", **extra):
    sections = {"sql": {"foreign_schema": "click_id STRING, query_id STRING, cost BIGINT",
                        "primary_schema": "query_id STRING"}, **extra}
    return parse_config({"regions": [{"name": "a", "log_root": log_root, "output_root": output_root,
                                      "state_dir": str(tmp_path / "state" / "a")}], **sections},
                        str(tmp_path / name), tmp_path)


class World:
    """One region's input and output, written locally under ``local/`` and mirrored on S3: the same
    objects, with the output's not-yet-uploaded part in the S3 region's staging folder (its outbox)."""

    def __init__(self, tmp_path: Path, bucket) -> None:
        self.q = [GEN.next_id() for _ in range(8)]
        self.c = [GEN.next_id() for _ in range(8)]
        clicks = [{"click_id": self.c[i], "query_id": self.q[i], "cost": i} for i in range(8)]
        self.clicks = clicks
        joined = [{**clicks[i], "query": {"query_id": self.q[i]}} for i in range(8)]
        local = tmp_path / "local"
        files = {
            "logs/a/clicks/w0/c-1.jsonl": _lines(clicks[:5]) + b"not json\n",
            "logs/a/clicks/w1/c-1.jsonl": _lines(clicks[5:7]),
            "logs/a/clicks-recovery/recovered-1.jsonl": _lines(clicks[7:]),
            "logs/a/queries/w0/q-1.jsonl": _lines({"query_id": q} for q in self.q),
            f"out/a/joined/{PART}/a-j0-1-000001.jsonl": _lines(joined[:2]),
            f"out/a/unjoinable/{PART}/a-d-1-000001.jsonl": _lines(clicks[5:6]),
            "out/a/quarantine/a-dispatcher.jsonl": _lines([{"file": "w0/c-1.jsonl", "offset": 99,
                                                           "reason": "not valid JSON", "raw": "not json",
                                                           "at_us": 1}]),
        }
        for name, data in files.items():
            (local / name).parent.mkdir(parents=True, exist_ok=True)
            (local / name).write_bytes(data)
        for name, data in files.items():
            bucket.put(name, data)
        # not uploaded yet: a closed file (c2) and an open one with c3 committed, c4 written after its record
        self.local_config = _config(tmp_path, str(local / "logs/a"), str(local / "out/a"), "local.toml")
        self.s3_config = _config(tmp_path, bucket.url("logs/a"), bucket.url("out/a"), "s3.toml",
                                 s3={"list_interval_s": 0.0})
        for joined_dir in (local / "out/a/joined", self.s3_config.regions[0].joined_dir):
            (joined_dir / PART).mkdir(parents=True, exist_ok=True)
            (joined_dir / PART / "a-j0-1-000002.jsonl").write_bytes(_lines(joined[2:3]))
            open_file = joined_dir / OPEN_PART / ".a-j1-1-000001.jsonl.inprogress"    # as a writer leaves it
            open_file.parent.mkdir(parents=True, exist_ok=True)
            open_file.write_bytes(_lines(joined[3:5]))
            (joined_dir / COMMITS_DIR).mkdir()
            (joined_dir / COMMITS_DIR / "a-j1.json").write_bytes(orjson.dumps(
                {"writer": "a-j1", "at_us": 1, "open": {f"{OPEN_PART}/a-j1-1-000001.jsonl": len(_lines(joined[3:4]))}}))
        # registry: c0..c3 joined under a live token, c6 registered by a joiner that is gone (lost)
        reg = idregistry.InMemoryRegistry()
        now_us = time.time_ns() // 1000
        reg.commit(self.c[:4], f"127.0.0.1:5001/{os.getpid()}/{now_us}/1")
        gone = subprocess.Popen(["true"])
        gone.wait()
        reg.commit([self.c[6]], f"127.0.0.1:5000/{gone.pid}/{now_us - 10_000_000}/1")
        self.export = tmp_path / "export"
        idregistry.export_registry(reg, self.export)


EXPECTED = {"foreign_events": 8, "joined": 4, "duplicates": 0, "lost": 1, "recoverable": 1, "pending": 2,
            "unjoinable": 1, "wrongly_unjoinable": 1}


def test_verify_over_s3_roots_counts_what_it_counts_locally_and_names_bad_s3_input(tmp_path, s3, spark):
    w = World(tmp_path, s3)
    local = run_verify(w.local_config, spark, export_dir=w.export, out_dir=tmp_path / "v-local")
    report = run_verify(w.s3_config, spark, export_dir=w.export, out_dir=tmp_path / "v-s3")
    assert local.as_dict() == EXPECTED
    assert report.as_dict() == EXPECTED
    assert [r["id"] for r in read_recoverable(report.recoverable_path)] == [w.c[6]]

    dup = f"out/a/joined/{PART}/zz-planted-1-000001.jsonl"     # a planted duplicate object
    s3.put(dup, _lines([w.clicks[0]]))
    report = run_verify(w.s3_config, spark, export_dir=w.export, out_dir=tmp_path / "v-s3")
    assert report.duplicates == 1 and report.duplicate_ids == ((w.c[0], 2),)

    s3.put(dup, b'{"click_id": "10.4.4.4:4444:1", "x": 1}\n' + _lines([w.clicks[0]]))   # a corrupt output line
    with pytest.raises(VerifyInputError, match=rf"joined output line without a readable 'click_id' in "
                                               rf"s3://{s3.name}/{dup} at byte 0"):
        run_verify(w.s3_config, spark, export_dir=w.export, out_dir=tmp_path / "v-s3")
    s3.delete(dup)

    for key in s3.keys("logs/a/clicks/"):       # an empty foreign prefix is no input, never "nothing lost"
        s3.delete(key)
    with pytest.raises(VerifyInputError, match=rf"region a: input s3://{s3.name}/logs/a/clicks holds no objects"):
        run_verify(w.s3_config, spark, export_dir=w.export, out_dir=tmp_path / "v-s3")
    missing = _config(tmp_path, "s3://photon-no-such-bucket/logs/a", s3.url("out/a"), "missing.toml")
    with pytest.raises(VerifyInputError, match=r"region a: .*bucket 'photon-no-such-bucket' does not exist"):
        run_verify(missing, spark, export_dir=w.export, out_dir=tmp_path / "v-missing")


def _counts(config, spark) -> dict:
    q = ("SELECT 'joined' AS t, count(*) AS n, sum(cost) AS s FROM joined UNION ALL "
         "SELECT 'joined_part', count(*), sum(hour) FROM joined WHERE date = '2025-03-04' UNION ALL "
         "SELECT 'unjoinable', count(*), sum(cost) FROM unjoinable UNION ALL "
         "SELECT 'clicks', count(*), sum(cost) FROM clicks UNION ALL "
         "SELECT 'queries', count(*), 0 FROM queries UNION ALL "
         "SELECT 'quarantine', count(*), sum(offset) FROM quarantine")
    return {r["t"]: (r["n"], r["s"]) for r in map(orjson.loads, run_query(config, spark, q, "json").splitlines())}


def test_sql_tables_over_s3_roots_give_the_local_counts(tmp_path, s3, spark):
    w = World(tmp_path, s3)
    truth = {"joined": (4, 0 + 1 + 2 + 3), "joined_part": (4, 21), "unjoinable": (1, 5), "clicks": (7, 21),
             "queries": (8, 0), "quarantine": (1, 99)}
    assert _counts(w.local_config, spark) == truth
    assert _counts(w.s3_config, spark) == truth
    [row] = map(orjson.loads, run_query(w.s3_config, spark, "SELECT source, region FROM quarantine",
                                        "json").splitlines())
    assert row == {"source": "a-dispatcher", "region": "a"}


def test_s3_output_freshness_record_follows_the_objects_it_vouches_for(tmp_path, s3):
    from s3_helpers import answer_with
    url = s3.url("out/a/joined")
    pub = S3Publisher(url, S3Config(retry_attempts=1), records=True)
    w = RollingWriter(tmp_path / "outbox", "a-j0", commit_interval_s=0, publisher=pub)
    w.recover_orphans()
    w.write_lines([b'{"click_id": "1"}', b'{"click_id": "2"}'])
    first = w._path                             # noqa: SLF001
    w.roll()
    rec = orjson.loads(s3.get(f"out/a/joined/{COMMITS_DIR}/a-j0.json"))
    key = f"out/a/joined/{rec['last']}"
    assert rec["writer"] == "a-j0" and s3.get(key) == b'{"click_id": "1"}\n{"click_id": "2"}\n'
    assert rec["complete_us"] >= 0 and first.name.endswith(".inprogress") and not first.exists()
    tailer = OutputTailer(url, s3=S3Config(list_interval_s=0))
    assert [x for c in tailer.poll() for x in c.lines] == [b'{"click_id": "1"}', b'{"click_id": "2"}']
    assert tailer.freshness() == {"a-j0": rec["complete_us"]}

    w.write_lines([b'{"click_id": "3"}'])        # open: staged and committed locally, not on S3
    assert read_output_lines(url) == [b'{"click_id": "1"}', b'{"click_id": "2"}']
    assert read_output_lines(url, outbox=tmp_path / "outbox")[-1] == b'{"click_id": "3"}'
    answer_with(pub.client, "PutObject", 503, "ServiceUnavailable", times=1)
    w.roll()                                     # the upload fails: the file waits, the record stays
    assert pub.statistics().pending_files == 1
    assert orjson.loads(s3.get(f"out/a/joined/{COMMITS_DIR}/a-j0.json")) == rec
    assert tailer.poll() == []
    assert read_output_lines(url, outbox=tmp_path / "outbox")[-1] == b'{"click_id": "3"}'   # staged, closed
    assert pub.publish_pending() == 1
    newer = orjson.loads(s3.get(f"out/a/joined/{COMMITS_DIR}/a-j0.json"))
    assert newer["complete_us"] > rec["complete_us"] and newer["last"] != rec["last"]
    assert [x for c in tailer.poll() for x in c.lines] == [b'{"click_id": "3"}']
    w.close()
    shutil.rmtree(tmp_path / "outbox")
    assert read_output_lines(url, outbox=tmp_path / "outbox") == [b'{"click_id": "1"}', b'{"click_id": "2"}',
                                                                   b'{"click_id": "3"}']
