"""Output uploaded to S3 (a real moto_server): closed files uploaded whole, multipart above the threshold,
a failed upload kept and published later, leftovers of a crashed writer published on restart."""
from __future__ import annotations

from photon._publish import S3Publisher, read_object_lines
from photon._config import S3Config

from s3_helpers import answer_with


def test_closed_files_are_uploaded_whole_and_removed_locally(s3, tmp_path):
    pub = S3Publisher(s3.url("out/joined"), S3Config(multipart_mb=5))
    pub.check()
    small = tmp_path / "j-1-000001.jsonl"
    small.write_bytes(b'{"a":1}\n{"a":2}\n')
    big = tmp_path / "j-1-000002.jsonl"
    line = b'{"pad":"' + b"x" * 1000 + b'"}\n'
    big.write_bytes(line * 6000)                       # about 6 MB: a multipart upload
    assert pub.publish(small) and pub.publish(big)
    assert not small.exists() and not big.exists()
    assert s3.keys("out/") == ["out/joined/j-1-000001.jsonl", "out/joined/j-1-000002.jsonl"]
    assert s3.get("out/joined/j-1-000002.jsonl") == line * 6000
    stats = pub.statistics()
    assert stats.uploaded_files == 2 and stats.multipart_uploads == 1 and stats.pending_files == 0
    assert read_object_lines(s3.url("out/joined")) == [b'{"a":1}', b'{"a":2}'] + [line[:-1]] * 6000


def test_a_failed_upload_is_kept_and_published_later(s3, tmp_path):
    pub = S3Publisher(s3.url("out/u"), S3Config(retry_attempts=2, retry_max_s=0.01))
    f = tmp_path / "u-1.jsonl"
    f.write_bytes(b"x\n")
    left = answer_with(pub.client, "PutObject", 503, "SlowDown", times=100)
    assert not pub.publish(f) and f.exists() and s3.keys("out/") == []
    assert pub.statistics().pending_files == 1
    left[0] = 0
    assert pub.publish_pending() == 1 and not f.exists() and s3.keys("out/") == ["out/u/u-1.jsonl"]


def test_a_restarted_writer_publishes_what_a_crashed_one_left(s3, tmp_path):
    (tmp_path / "j-1-000001.jsonl").write_bytes(b"a\n")              # closed, not uploaded
    (tmp_path / "j-1-000002.jsonl.inprogress").write_bytes(b"b\n")   # still being written: not published
    (tmp_path / "k-1-000001.jsonl").write_bytes(b"c\n")              # another writer's
    pub = S3Publisher(s3.url("out/joined"))
    assert pub.publish_pending(tmp_path, prefix="j-") == 1
    assert s3.keys("out/") == ["out/joined/j-1-000001.jsonl"]
