"""One conformance suite for every kind of log source in the scheme map (photon._storage.SCHEMES): local
folders, S3 (a real moto_server through boto3) and in-memory objects. A kind that is not run here may not be
registered (the first test says so).

Each test runs once per kind and checks the contract of photon/_tail.py and photon/_storage.Source: complete
lines only, exact resume offsets, growth and longer replacements read on, late objects found, bad input
quarantined with its location and reason while every good line around it comes through.
"""
from __future__ import annotations

import uuid
from pathlib import Path

import orjson
import pytest

from photon import Quarantine, Source, open_source, storage_kind, wait_until
from photon import _kind_memory as memory
from photon._storage import SCHEMES
from photon._config import S3Config
from photon import LogTailer as SourceTailer

FAST = S3Config(list_interval_s=0.0, full_list_interval_s=0.2, retry_attempts=3, retry_max_s=0.2)


class LocalKind:
    name = "file"

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path / "stream"
        self.root.mkdir()

    @property
    def url(self) -> str:
        return f"file://{self.root}"

    def write(self, name: str, data: bytes) -> None:
        p = self.root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)

    def append(self, name: str, data: bytes) -> None:
        with open(self.root / name, "ab") as f:
            f.write(data)

    def delete(self, name: str) -> None:
        (self.root / name).unlink()

    def missing(self) -> None:
        self.root = self.root / "not-yet"

    def source(self):
        return open_source(self.url, FAST)


class S3Kind:
    name = "s3"

    def __init__(self, bucket) -> None:
        self.bucket = bucket
        self.prefix = "logs/clicks"

    @property
    def url(self) -> str:
        return self.bucket.url(self.prefix)

    def write(self, name: str, data: bytes) -> None:
        self.bucket.put(f"{self.prefix}/{name}", data)

    def append(self, name: str, data: bytes) -> None:
        """S3 objects do not grow in place: a writer replaces the object by a longer version of itself."""
        key = f"{self.prefix}/{name}"
        self.bucket.put(key, self.bucket.get(key) + data)

    def delete(self, name: str) -> None:
        self.bucket.delete(f"{self.prefix}/{name}")

    def missing(self) -> None:
        self.prefix = "nothing/here"

    def source(self):
        return open_source(self.url, FAST)


class MemoryKind:
    name = "memory"

    def __init__(self) -> None:
        self.bucket = f"b-{uuid.uuid4().hex[:8]}"
        self.prefix = "logs/clicks"

    @property
    def url(self) -> str:
        return f"memory://{self.bucket}/{self.prefix}"

    def write(self, name: str, data: bytes) -> None:
        memory.put(f"{self.url}/{name}", data)

    def append(self, name: str, data: bytes) -> None:
        """Objects are replaced whole, as on S3."""
        memory.put(f"{self.url}/{name}", memory.get(f"{self.url}/{name}") + data)

    def delete(self, name: str) -> None:
        memory.delete(f"{self.url}/{name}")

    def missing(self) -> None:
        self.prefix = "nothing/here"

    def source(self):
        return open_source(self.url, FAST)


KINDS = ["file", "s3", "memory"]


@pytest.fixture(params=KINDS)
def kind(request, tmp_path):
    if request.param == "file":
        yield LocalKind(tmp_path)
    elif request.param == "s3":
        yield S3Kind(request.getfixturevalue("s3"))
    else:
        k = MemoryKind()
        yield k
        memory.clear(k.bucket)


def test_every_registered_scheme_runs_this_suite():
    assert sorted(KINDS) == sorted(SCHEMES)


def test_the_source_is_of_the_kind_its_scheme_names_and_follows_the_protocol(kind):
    source = kind.source()
    assert isinstance(source, Source)
    assert storage_kind(kind.url).scheme == kind.name
    source.check()
    assert source.scan() == {}


@pytest.fixture
def quarantine(tmp_path):
    q = Quarantine(tmp_path / "quarantine", "test")
    yield q
    q.close()


def entries(q: Quarantine) -> list[dict]:
    q.close()
    if not q.path.exists():
        return []
    return [orjson.loads(x) for x in q.path.read_bytes().splitlines()]


def lines(n0: int, n1: int) -> bytes:
    return b"".join(b'{"n":%d}\n' % i for i in range(n0, n1))


def read_all(tailer: SourceTailer, timeout: float = 10, want: int | None = None) -> list[tuple[str, int, bytes]]:
    """Poll until ``want`` lines came (or, with None, until a poll is caught up and finds nothing)."""
    got: list[tuple[str, int, bytes]] = []

    def step():
        chunks = tailer.poll()
        for c in chunks:
            assert c.lines and len(c.lines) == len(c.offsets)
            got.extend((c.file, off, line) for off, line in zip(c.offsets, c.lines))
        if want is None:
            return not chunks and tailer.caught_up
        return len(got) >= want

    wait_until(step, timeout, interval=0.01, message="lines read")
    return got


def test_reads_every_complete_line_of_every_object_at_any_depth(kind):
    kind.write("w0/a-00001.jsonl", lines(0, 3))
    kind.write("w1/deep/b-00001.jsonl", lines(3, 5))
    kind.write("w1/.hidden.jsonl", lines(100, 101))
    kind.write("w1/c.jsonl.inprogress", lines(200, 201))
    got = read_all(SourceTailer(kind.source()), want=5)
    assert sorted(line for _, _, line in got) == sorted(lines(0, 5).splitlines())
    assert {f for f, _, _ in got} == {"w0/a-00001.jsonl", "w1/deep/b-00001.jsonl"}
    assert [off for f, off, _ in got if f == "w0/a-00001.jsonl"] == [0, 8, 16]


def test_offsets_resume_exactly_where_lines_were_consumed(kind):
    kind.write("w0/a.jsonl", lines(0, 10))
    first = SourceTailer(kind.source(), read_bytes=30)
    got = read_all(first, want=1)
    resume = dict(first.offsets)
    assert 0 < resume["w0/a.jsonl"] < len(lines(0, 10))
    kind.append("w0/a.jsonl", lines(10, 12))
    second = SourceTailer(kind.source(), offsets=resume)
    rest = read_all(second, want=12 - len(got))
    assert [line for _, _, line in got + rest] == lines(0, 12).splitlines()


def test_a_last_line_without_newline_waits_until_complete(kind):
    kind.write("a.jsonl", lines(0, 2) + b'{"n":2')
    tailer = SourceTailer(kind.source())
    got = read_all(tailer)
    assert [line for _, _, line in got] == lines(0, 2).splitlines()
    assert tailer.offsets["a.jsonl"] == len(lines(0, 2))
    kind.append("a.jsonl", b"}\n")
    more = read_all(tailer, want=1)
    assert [(off, line) for _, off, line in more] == [(len(lines(0, 2)), b'{"n":2}')]


def test_a_grown_or_replaced_longer_object_is_read_on_from_where_it_was_left(kind):
    kind.write("w0/a.jsonl", lines(0, 3))
    tailer = SourceTailer(kind.source())
    read_all(tailer, want=3)
    for k in range(3):          # the newest object of its folder, replaced by longer versions
        kind.append("w0/a.jsonl", lines(3 + 2 * k, 5 + 2 * k))
        got = read_all(tailer, want=2)
        assert [line for _, _, line in got] == lines(3 + 2 * k, 5 + 2 * k).splitlines()


def test_new_objects_are_found_also_when_they_sort_before_the_last_one(kind):
    kind.write("w1/b-00001.jsonl", lines(0, 2))
    tailer = SourceTailer(kind.source())
    read_all(tailer, want=2)
    kind.write("w1/b-00002.jsonl", lines(2, 4))      # sorts last: the incremental listing finds it
    kind.write("w0/a-00001.jsonl", lines(4, 6))      # a late object sorting before: the full listing does
    got = read_all(tailer, want=4)
    assert sorted(line for _, _, line in got) == sorted(lines(2, 6).splitlines())


def test_an_object_that_shrank_is_quarantined_and_read_on_from_its_new_end(kind, quarantine):
    kind.write("a.jsonl", lines(0, 4))
    tailer = SourceTailer(kind.source(), quarantine=quarantine)
    read_all(tailer, want=4)
    kind.write("a.jsonl", lines(0, 1))
    wait_until(lambda: tailer.poll() == [] and tailer.shrunk, 10, message="the shrink noticed")
    kind.append("a.jsonl", lines(50, 51))
    got = read_all(tailer, want=1)
    assert [line for _, _, line in got] == lines(50, 51).splitlines()
    [entry] = entries(quarantine)
    assert entry["file"] == "a.jsonl" and entry["offset"] == len(lines(0, 4)) and "shrank" in entry["reason"]


def test_an_object_deleted_with_bytes_unread_is_quarantined(kind, quarantine):
    kind.write("a.jsonl", lines(0, 2) + b'{"n":2')
    kind.write("b.jsonl", lines(10, 11))
    tailer = SourceTailer(kind.source(), quarantine=quarantine)
    read_all(tailer, want=3)
    kind.delete("a.jsonl")
    kind.write("c.jsonl", lines(20, 21))
    got = read_all(tailer, want=1)
    assert [line for _, _, line in got] == [b'{"n":20}']
    wait_until(lambda: not tailer.poll() and quarantine.count == 1, 10, message="the deletion noticed")
    [entry] = entries(quarantine)
    assert entry["file"] == "a.jsonl" and entry["offset"] == len(lines(0, 2)) and "deleted" in entry["reason"]


def test_invalid_utf8_lines_are_quarantined_and_their_neighbours_come_through(kind, quarantine):
    kind.write("a.jsonl", lines(0, 1) + b'{"n":"\xff\xfe"}\n' + lines(2, 3))
    tailer = SourceTailer(kind.source(), quarantine=quarantine)
    got = read_all(tailer, want=2)
    assert [(off, line) for _, off, line in got] == [(0, b'{"n":0}'), (len(lines(0, 1)) + 11, b'{"n":2}')]
    [entry] = entries(quarantine)
    assert entry["offset"] == len(lines(0, 1)) and "UTF-8" in entry["reason"] and entry["file"] == "a.jsonl"


def test_lines_longer_than_the_limit_are_quarantined_not_held(kind, quarantine):
    long = b'{"pad":"' + b"x" * 5000 + b'"}\n'
    kind.write("a.jsonl", lines(0, 1) + long + lines(2, 3))
    kind.write("b.jsonl", lines(10, 11) + b'{"pad":"' + b"y" * 3000)   # over the limit, not even finished
    tailer = SourceTailer(kind.source(), quarantine=quarantine, max_line_bytes=1000, read_bytes=700)
    got = read_all(tailer, want=3)
    assert sorted(line for _, _, line in got) == sorted([b'{"n":0}', b'{"n":2}', b'{"n":10}'])
    kind.append("b.jsonl", b"y" * 3000 + b'"}\n' + lines(11, 12))       # its end comes, then a good line
    got = read_all(tailer, want=1)
    assert [line for _, _, line in got] == [b'{"n":11}']
    found = {(e["file"], e["offset"]) for e in entries(quarantine)}
    assert found == {("a.jsonl", 8), ("b.jsonl", 9)}
    assert all("max_line_bytes" in e["reason"] and len(e["raw"]) <= 1024 for e in entries(quarantine))


def test_a_line_longer_than_the_read_size_but_within_the_limit_is_read_whole(kind):
    line = b'{"pad":"' + b"z" * 3000 + b'"}'
    kind.write("a.jsonl", line + b"\n" + lines(1, 2))
    got = read_all(SourceTailer(kind.source(), read_bytes=256), want=2)
    assert [x for _, _, x in got] == [line, b'{"n":1}']


def test_empty_objects(kind, quarantine):
    kind.write("a.jsonl", b"")
    kind.write("b.jsonl", lines(0, 1))
    tailer = SourceTailer(kind.source(), quarantine=quarantine)
    read_all(tailer, want=1)
    read_all(tailer)
    found = entries(quarantine)
    if kind.source().whole_objects:    # written whole: an empty object is bad input, reported once
        assert [(e["file"], e["reason"].endswith("is an empty object")) for e in found] == [("a.jsonl", True)]
    else:                      # a local file is appended to in place: empty means not written yet
        assert found == []
    kind.append("a.jsonl", lines(5, 6))
    assert [line for _, _, line in read_all(tailer, want=1)] == [b'{"n":5}']


def test_pending_bytes_and_caught_up(kind):
    kind.write("a.jsonl", lines(0, 100))
    tailer = SourceTailer(kind.source())
    chunks = tailer.poll(max_bytes=50)
    assert chunks and not tailer.caught_up
    assert tailer.pending_bytes() == len(lines(0, 100)) - chunks[0].end
    read_all(tailer)
    assert tailer.caught_up and tailer.pending_bytes() == 0


def test_a_missing_stream_location_reads_nothing_and_waits(kind):
    kind.missing()
    tailer = SourceTailer(kind.source())
    assert tailer.poll() == [] and tailer.caught_up
    kind.write("a.jsonl", lines(0, 1))
    assert [line for _, _, line in read_all(tailer, want=1)] == [b'{"n":0}']
