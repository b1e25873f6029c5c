"""Spark jobs reading streams through the source layer: local folders and S3 (moto), with the test
session's one SparkSession. S3 objects are fetched with boto3 inside Spark tasks."""
from __future__ import annotations

import pytest

from photon import ObjectInfo, read_stream_json, stream_lines, stream_objects
from photon._source import ObjectUnreadable
from photon._spark_io import stream_text

pytestmark = pytest.mark.timeout(300)


def _write(kind, tmp_path, s3_fixture):
    files = {"w0/a-1.jsonl": b'{"n":1,"s":"x"}\n{"n":2,"s":"y"}\n', "w1/b-1.jsonl": b'{"n":3,"s":"z"}\n{"n":4',
             "w1/c.jsonl.inprogress": b'{"n":99}\n', "w1/empty.jsonl": b""}
    if kind == "local":
        for name, data in files.items():
            p = tmp_path / "logs" / name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
        return str(tmp_path / "logs")
    for name, data in files.items():
        s3_fixture.put(f"r/logs/{name}", data)
    return s3_fixture.url("r/logs")


@pytest.fixture(params=["local", "s3"])
def stream(request, tmp_path):
    s3_fixture = request.getfixturevalue("s3") if request.param == "s3" else None
    return _write(request.param, tmp_path, s3_fixture)


def test_stream_objects_lists_what_a_dispatcher_reads(stream):
    assert [(o.name, o.size) for o in stream_objects(stream)] == [
        ("w0/a-1.jsonl", 32), ("w1/b-1.jsonl", 22), ("w1/empty.jsonl", 0)]


def test_read_json_reads_complete_lines_of_every_object(spark, stream, tmp_path):
    df = read_stream_json(spark, stream, schema="n long, s string", staging_dir=tmp_path / "staging")
    assert sorted(r.n for r in df.collect()) == [1, 2, 3]


def test_object_lines_give_each_line_with_its_object_and_offset(spark, stream):
    rows = sorted(stream_lines(spark, stream).collect())
    assert rows == [("w0/a-1.jsonl", 0, b'{"n":1,"s":"x"}'), ("w0/a-1.jsonl", 16, b'{"n":2,"s":"y"}'),
                    ("w1/b-1.jsonl", 0, b'{"n":3,"s":"z"}')]


def test_stream_text_gives_each_complete_line_with_its_objects_location(spark, stream):
    rows = sorted((r.value, r.file) for r in stream_text(spark, stream).collect())
    assert rows == [('{"n":1,"s":"x"}', f"{stream}/w0/a-1.jsonl"), ('{"n":2,"s":"y"}', f"{stream}/w0/a-1.jsonl"),
                    ('{"n":3,"s":"z"}', f"{stream}/w1/b-1.jsonl")]


def test_an_object_a_task_cannot_read_is_named_on_the_driver(spark, s3):
    s3.put("r/logs/w0/a.jsonl", b'{"n":1}\n')
    objects = stream_objects(s3.url("r/logs")) + [ObjectInfo("w0/gone.jsonl", 8)]   # deleted since listed
    with pytest.raises(ObjectUnreadable, match=rf"s3://{s3.name}/r/logs/w0/gone.jsonl could not be read: "
                                               r"ObjectGone"):
        stream_text(spark, s3.url("r/logs"), objects=objects).collect()
