"""What only S3 sources do (a real moto_server through boto3): incremental listing and its request counts,
pagination, retries of transient errors, unreadable objects, and clear errors for misconfiguration.

Faults are injected into the real botocore client (a ``before-send`` hook answers one request with the HTTP
error S3 would send); everything else goes to the moto server.
"""
from __future__ import annotations

import orjson
import pytest

from photon import Quarantine, free_port
from photon._source import SourceError, S3Source, SourceUnavailable, parse_location, s3_client
from photon._config import S3Config
from photon import LogTailer as SourceTailer

from s3_helpers import answer_with


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def put_lines(s3, key: str, n: int = 1) -> None:
    s3.put(key, b"".join(b'{"n":%d}\n' % i for i in range(n)))


def test_parse_location():
    assert parse_location("s3://b/p/q/").bucket == "b" and parse_location("s3://b/p/q/").prefix == "p/q"
    assert parse_location("file:///x/y").path == "/x/y" and not parse_location("/x/y").is_s3
    assert parse_location("s3://b").child("clicks").url == "s3://b/clicks"
    assert parse_location("s3://b/logs").child("clicks").key("w0/a") == "logs/clicks/w0/a"
    for bad in ("s3://", "gs://b/x", "file://host/x"):
        with pytest.raises(SourceError):
            parse_location(bad)


def test_polls_list_only_past_the_last_key_and_head_only_the_open_objects(s3):
    for w in range(3):
        for k in range(20):
            put_lines(s3, f"logs/w{w}/f-{k:05d}.jsonl")
    clock = FakeClock()
    source = S3Source(s3.url("logs"), S3Config(list_interval_s=0.0, full_list_interval_s=60.0), clock=clock)
    source.page_size = 7
    tailer = SourceTailer(source)
    assert sum(len(c.lines) for c in tailer.poll()) == 60
    first = source.statistics()
    assert first.full_lists == 1 and first.list_requests == 9       # 60 keys, 7 per page
    clock.t += 1
    assert tailer.poll() == []
    quiet = source.statistics()
    # one incremental listing request, and one HEAD per writer folder's newest object (read to its end)
    assert quiet.last_scan_requests == 1 + 3 and quiet.full_lists == 1 and quiet.head_requests == 3
    put_lines(s3, "logs/w2/f-00020.jsonl", 2)      # sorts last: the next incremental listing finds it
    put_lines(s3, "logs/w0/f-00000a.jsonl", 3)     # late, sorts before the greatest key: the full one does
    clock.t += 1
    assert [c.file for c in tailer.poll()] == ["w2/f-00020.jsonl"]
    clock.t += 60
    assert [c.file for c in tailer.poll()] == ["w0/f-00000a.jsonl"]
    assert source.statistics().full_lists == 2


def test_scans_closer_than_the_list_interval_reuse_the_last_listing(s3):
    put_lines(s3, "a/x.jsonl")
    clock = FakeClock()
    source = S3Source(s3.url("a"), S3Config(list_interval_s=1.0), clock=clock)
    source.scan()
    put_lines(s3, "a/y.jsonl")
    clock.t += 0.5
    assert list(source.scan()) == ["x.jsonl"] and source.statistics().list_requests == 1
    clock.t += 0.6
    assert list(source.scan()) == ["x.jsonl", "y.jsonl"]


def test_transient_errors_are_retried_and_a_long_outage_never_raises(s3):
    put_lines(s3, "s/a.jsonl", 3)
    source = S3Source(s3.url("s"), S3Config(list_interval_s=0.0, retry_attempts=4, retry_max_s=0.05))
    answer_with(source.client, "ListObjectsV2", 503, "SlowDown", times=2)
    answer_with(source.client, "GetObject", 500, "InternalError", times=1)
    tailer = SourceTailer(source)
    assert sum(len(c.lines) for c in tailer.poll()) == 3
    assert source.statistics().retries == 3
    put_lines(s3, "s/b.jsonl", 2)
    left = answer_with(source.client, "ListObjectsV2", 503, "ServiceUnavailable", times=100)
    assert tailer.poll() == [] and not tailer.caught_up and tailer.statistics().unavailable_polls == 1
    left[0] = 0                                     # the outage ends
    assert sum(len(c.lines) for c in tailer.poll()) == 2


def test_an_unreadable_object_is_quarantined_and_the_others_come_through(s3, tmp_path):
    put_lines(s3, "s/a.jsonl", 2)
    put_lines(s3, "s/b.jsonl", 3)
    source = S3Source(s3.url("s"), S3Config(list_interval_s=0.0))
    answer_with(source.client, "GetObject", 403, "AccessDenied", times=1000, key="s/a.jsonl")
    q = Quarantine(tmp_path, "q")
    tailer = SourceTailer(source, quarantine=q)
    assert [c.file for c in tailer.poll()] == ["b.jsonl"]
    assert tailer.poll() == [] and q.count == 1 and tailer.pending_bytes() == 0
    q.close()
    [entry] = [orjson.loads(x) for x in q.path.read_bytes().splitlines()]
    assert entry["file"] == "a.jsonl" and "AccessDenied" in entry["reason"]


def test_a_missing_bucket_fails_at_start_naming_it(s3):
    with pytest.raises(SourceError, match="bucket 'no-such-bucket' does not exist"):
        S3Source("s3://no-such-bucket/logs").check()


def test_an_unreachable_endpoint_fails_at_start_naming_it(s3, monkeypatch):
    endpoint = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    with pytest.raises(SourceError, match=f"cannot reach the S3 endpoint {endpoint}"):
        S3Source(s3.url("logs"), S3Config(connect_timeout_s=1.0)).check()


def test_missing_credentials_fail_at_start_naming_them(s3, monkeypatch, tmp_path):
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(SourceError, match="no AWS credentials found"):
        S3Source(s3.url("logs")).check()


def test_the_endpoint_option_wins_over_the_environment(s3, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    client = s3_client(S3Config(endpoint_url=s3.endpoint))
    assert client.meta.endpoint_url == s3.endpoint
    S3Source(s3.url("x"), client=client).check()
    with pytest.raises(SourceUnavailable):
        S3Source(s3.url("x"), S3Config(retry_attempts=1, connect_timeout_s=0.5)).scan()
