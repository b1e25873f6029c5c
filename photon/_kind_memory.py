"""The memory kind: ``memory://<bucket>/<prefix>``, objects held in this process's memory, for tests of
other rooms (no disk, no S3 server). It behaves like an object store: objects are written whole and
replaced whole (:func:`put`), listings are sorted by name, and output is staged locally and published when
each file closes, exactly like S3. It is in-process only: Spark tasks and child processes do not see it.

:func:`put`, :func:`get`, :func:`delete` and :func:`clear` are the test's hands on the store.
"""
from __future__ import annotations

import itertools
import threading
from pathlib import Path
from typing import Mapping

from photon._publish import ObjectPublisher
from photon._source import ObjectGone, ObjectInfo, SourceStatistics, parse_location, visible
from photon._storage import StorageKind

_lock = threading.Lock()
_buckets: dict[str, dict[str, tuple[bytes, str]]] = {}    # bucket -> key -> (bytes, version)
_versions = itertools.count(1)


def _split(url: str) -> tuple[str, str]:
    loc = parse_location(url)
    return loc.bucket, loc.prefix


def put(url: str, data: bytes) -> None:
    """Store ``data`` as the object ``url`` (``memory://bucket/key``), replacing it whole."""
    bucket, key = _split(url)
    with _lock:
        _buckets.setdefault(bucket, {})[key] = (bytes(data), str(next(_versions)))


def get(url: str) -> bytes:
    bucket, key = _split(url)
    with _lock:
        try:
            return _buckets[bucket][key][0]
        except KeyError:
            raise FileNotFoundError(url) from None


def delete(url: str) -> None:
    bucket, key = _split(url)
    with _lock:
        _buckets.get(bucket, {}).pop(key, None)


def clear(bucket: str | None = None) -> None:
    """Forget ``bucket`` (every bucket when None)."""
    with _lock:
        if bucket is None:
            _buckets.clear()
        else:
            _buckets.pop(bucket, None)


def _objects(bucket: str, prefix: str) -> dict[str, tuple[bytes, str]]:
    """Relative name -> (bytes, version) of every object below ``prefix``."""
    start = f"{prefix}/" if prefix else ""
    with _lock:
        items = list(_buckets.get(bucket, {}).items())
    return {k[len(start):]: v for k, v in sorted(items) if k.startswith(start) and len(k) > len(start)}


class MemorySource:
    """A stream of in-memory objects; the :class:`photon.Source` contract (objects written whole)."""

    whole_objects = True

    def __init__(self, url: str) -> None:
        self.bucket, self.prefix = _split(url)
        self.url = url
        self._lists = self._gets = self._bytes = 0
        self._view: dict = {}

    def check(self) -> None:
        pass

    def scan(self, consumed: Mapping[str, int] | None = None) -> dict:
        self._lists += 1
        self._view = {n: ObjectInfo(n, len(d), v) for n, (d, v) in _objects(self.bucket, self.prefix).items()
                      if visible(n)}
        return self._view

    def read(self, name: str, start: int, length: int) -> tuple[bytes, int]:
        try:
            data = get(f"memory://{self.bucket}/{self.prefix}/{name}" if self.prefix else
                       f"memory://{self.bucket}/{name}")
        except FileNotFoundError:
            raise ObjectGone(f"{self.url}/{name} no longer exists") from None
        self._gets += 1
        out = data[start:start + length]
        self._bytes += len(out)
        return out, len(data)

    def statistics(self):
        return SourceStatistics(self.url, len(self._view), self._lists, self._lists, 0, self._gets, self._bytes,
                                0, 1)


class MemoryPublisher(ObjectPublisher):
    """Publishes closed local files as in-memory objects (see :class:`photon.ObjectPublisher`)."""

    def _name(self, name: str) -> str:
        return f"{self.url}/{name}"

    def at(self, location) -> "MemoryPublisher":
        return MemoryPublisher(location)

    def _delete(self, name: str) -> None:
        delete(self._name(name))

    def _put_file(self, path: Path, name: str) -> None:
        put(self._name(name), Path(path).read_bytes())

    def _put(self, name: str, body: bytes) -> None:
        put(self._name(name), body)

    def _list(self) -> list[ObjectInfo]:
        loc = self.location
        return [ObjectInfo(n, len(d), v) for n, (d, v) in _objects(loc.bucket, loc.prefix).items()]

    def _get(self, name: str) -> bytes:
        return get(self._name(name))


class MemoryKind(StorageKind):
    scheme = "memory"
    in_place = False

    def source(self, url: str, s3=None, *, input_config=None, client=None):
        return MemorySource(url)

    def publisher(self, url: str, s3=None, *, records: bool = False, client=None):
        return MemoryPublisher(url, records=records)


KIND = MemoryKind()
