"""Storage kinds: one interface per kind of thing stored, the kind chosen from the URL's scheme here, once.

Every place that reads input logs or reads and writes output asks :func:`storage_kind` for the kind of a
location and calls its methods; nothing else in the code base tests a location by string. The kinds:

============  ======================================  ============================================
scheme        module                                  what it is
============  ======================================  ============================================
(a path),     :mod:`photon._kind_file`                a local folder: files appended in place,
``file://``                                           output published by renaming
``s3://``     :mod:`photon._kind_s3`                  S3 (boto3): objects written whole, output
                                                      staged locally and uploaded when it closes
``memory://`` :mod:`photon._kind_memory`              objects in this process's memory, for tests
============  ======================================  ============================================

A new kind is one module defining a :class:`StorageKind` subclass named ``KIND`` plus one line in
:data:`SCHEMES`; it is registered only once it passes the conformance suites (tests/core/
test_source_conformance.py, tests/core/test_output_conformance.py), which run against every scheme here.
See docs/storage.md.

The three protocols (structural: the kinds' classes do not inherit from them):

* :class:`Source`: one input stream (a set of named objects that only grow or appear). :meth:`Source.scan`
  lists incrementally (only what may have changed), :meth:`Source.read` reads a byte range of an object's
  current version; positions are byte offsets just past the last consumed ``\\n`` (see
  :mod:`photon._tail`, which turns a source into complete lines and checkpointable offsets).
* :class:`OutputSink`: the write side of the output contract (README "Output contract"), which is
  :class:`photon.RollingWriter` over a local folder (fsync, commit records, rolls) plus the kind's
  publisher, which makes closed files visible (a rename in place, an upload): :func:`open_output_sink`.
* :class:`OutputReader`: the read side: the exact snapshot of committed lines, published files read whole,
  and a tailer that returns committed lines as they appear (:func:`output_reader`).
"""
from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Mapping, Protocol, runtime_checkable
from urllib.parse import urlparse

SCHEMES: dict[str, str] = {
    "file": "photon._kind_file",
    "s3": "photon._kind_s3",
    "memory": "photon._kind_memory",
}
"""Scheme -> the module holding its :class:`StorageKind` as ``KIND``. A bare path is ``file``."""


@runtime_checkable
class Source(Protocol):
    """One input stream. Lifecycle: :meth:`check` once at start (raises :class:`photon.SourceError` for a
    misconfiguration that waiting will not heal), then :meth:`scan` and :meth:`read` as often as wanted.

    * ``scan(consumed)`` -> ``{name: ObjectInfo}``, sorted by name; ``consumed`` (name -> offset read up
      to) lets the kind skip looking at objects nobody has read to their end. Hidden names (``.x``,
      ``*.inprogress``) are never listed.
    * ``read(name, start, length)`` -> ``(bytes [start, start+length) of the current version, its size)``;
      :class:`photon.ObjectGone` once deleted, ``ObjectUnreadable`` for permissions,
      :class:`photon.SourceUnavailable` when transient errors outlast the retries.
    * ``whole_objects``: True when objects are written whole (an empty one is bad input, a grown one is a
      longer replacement); False when they are appended to in place.
    """
    url: str
    whole_objects: bool

    def check(self) -> None: ...

    def scan(self, consumed: Mapping[str, int] | None = None) -> dict: ...

    def read(self, name: str, start: int, length: int) -> tuple[bytes, int]: ...

    def statistics(self): ...


@runtime_checkable
class OutputSink(Protocol):
    """The write side of the output contract (:class:`photon.RollingWriter` is the one implementation):
    ``write_lines`` -> a ticket; ``sync(ticket)`` makes it durable and visible (fsync, then the commit
    record); ``maybe_roll`` / ``roll`` publish closed files (through the kind's publisher, if any);
    ``recover_orphans`` at start publishes what a dead predecessor left, up to its record. A last ``roll``
    publishes everything."""

    def write_lines(self, lines: list[bytes], stamp=None) -> int: ...

    def sync(self, ticket: int | None = None) -> None: ...

    def maybe_roll(self) -> None: ...

    def roll(self) -> None: ...

    def recover_orphans(self, set_aside=None): ...


@runtime_checkable
class OutputReader(Protocol):
    """The read side of one output folder (``joined``, ``unjoinable``) under the output contract.

    * ``folder``: the local folder holding the output when there is one (Spark reads its files in place),
      else None (read through ``snapshot()``: the kind's published objects plus the staging folder);
    * ``exists()``: the folder (or bucket) is there to read;
    * ``lines(include_inprogress=False)``: every committed line, each once, as one snapshot;
    * ``count()``: ``len(lines())`` without holding them;
    * ``published()`` / ``read(name)``: the files that are published (whole, never changing again) and
      their bytes (None once gone): what may be gone through once and remembered, e.g. token clearing;
    * ``tailer(offsets, read_bytes)``: committed lines as they appear (``poll``, ``offsets``,
      ``pending_bytes``, ``open_files``); offsets are per published name;
    * ``freshness()``: writer -> every line it wrote up to this time (µs) is readable (object kinds).
    """
    url: str
    folder: Path | None

    def snapshot(self): ...

    def exists(self) -> bool: ...

    def lines(self, include_inprogress: bool = False) -> list[bytes]: ...

    def count(self) -> int: ...

    def published(self) -> list[str]: ...

    def read(self, name: str) -> bytes | None: ...

    def tailer(self, offsets: dict | None = None, read_bytes: int = 4 << 20): ...

    def freshness(self) -> dict[str, int]: ...


class StorageKind:
    """What differs between kinds, as methods (the base gives the behaviour of object kinds' URLs,
    ``<scheme>://<bucket>/<prefix>``). Subclasses set :attr:`scheme` and implement what they support."""

    scheme = ""
    in_place = False
    """True when output is published where it is written (a local folder, by renaming); False when writers
    write a local staging folder (``<state_dir>/outbox/<kind>``) and the kind's publisher copies each
    closed file out (:meth:`publisher`)."""

    # ---- locations

    def join(self, root: str, *parts: str) -> str:
        """The location ``parts`` below ``root``."""
        rel = "/".join(p.strip("/") for p in parts if p.strip("/"))
        return f"{str(root).rstrip('/')}/{rel}" if rel else str(root)

    def local_folder(self, url: str) -> Path | None:
        """The local folder ``url`` names, None when it is not one (objects are read through the kind)."""
        return None

    def output_folder(self, output_root: str, kind: str, state_dir: str) -> Path:
        """The local folder writers of ``kind`` output write to: the output itself (:attr:`in_place`), or
        its staging folder under ``state_dir``."""
        if self.in_place:
            return Path(output_root) / kind
        return Path(state_dir) / "outbox" / kind

    # ---- input

    def source(self, url: str, s3=None, *, input_config=None, client=None) -> Source:
        raise NotImplementedError

    def task_access(self, url: str, s3=None):
        """What Spark tasks need to open :meth:`source` there (picklable), None when nothing."""
        return None

    def task_source(self, url: str, access) -> Source:
        """The source of ``url`` inside a Spark task, given :meth:`task_access`'s answer on the driver."""
        return self.source(url)

    # ---- output

    def publisher(self, url: str, s3=None, *, records: bool = False, client=None):
        """The publisher copying closed files to ``url`` (an :class:`photon.ObjectPublisher`), None when
        :attr:`in_place`."""
        return None

    def output_reader(self, url: str, s3=None, *, outbox: str | Path | None = None) -> OutputReader:
        """The reader of the output folder ``url``; ``outbox``: the region's staging folder for it, whose
        closed-but-not-uploaded files and committed open lines count too (ignored when :attr:`in_place`)."""
        from photon._output import ObjectOutput
        publisher = self.publisher(url, s3)
        return ObjectOutput(url, publisher, lambda: self.source(url, s3, client=getattr(publisher, "client", None)),
                            outbox)

    def check(self, url: str, s3=None) -> None:
        """Raise :class:`photon.SourceError` naming why ``url`` cannot be used (missing bucket, no
        credentials, not a folder); silent when it can (a folder that does not exist yet can)."""

    def exists(self, url: str, s3=None) -> bool:
        """Whether ``url`` is there to be read: a local folder that exists; a prefix of an object kind always
        is (objects may come later; :meth:`check` names a missing bucket)."""
        return True


_kinds: dict[str, StorageKind] = {}


def scheme_of(url: str | os.PathLike) -> str:
    text = os.fspath(url)
    return urlparse(text).scheme if "://" in text else "file"


def storage_kind(url: str | os.PathLike) -> StorageKind:
    """The kind of ``url`` (a bare path is a local folder); :class:`photon.SourceError` for a scheme not in
    :data:`SCHEMES`."""
    scheme = scheme_of(url)
    kind = _kinds.get(scheme)
    if kind is None:
        module = SCHEMES.get(scheme)
        if module is None:
            from photon._source import SourceError
            known = ", ".join(f"{s}://" for s in SCHEMES)
            raise SourceError(f"{os.fspath(url)!r}: unsupported scheme {scheme!r} (use a path, {known})")
        kind = _kinds[scheme] = importlib.import_module(module).KIND
    return kind


def open_output_sink(url: str, prefix: str, *, staging: str | Path | None = None, s3=None, records: bool = True,
                     **writer_options):
    """An :class:`OutputSink` writing ``prefix``'s files to the output folder ``url``: a
    :class:`photon.RollingWriter` over ``url`` itself when the kind is :attr:`~StorageKind.in_place`, else
    over ``staging`` (required then) with the kind's checked publisher (publishing freshness records unless
    ``records`` is false). ``writer_options``: the writer's."""
    from photon._writer import RollingWriter
    publisher = checked_publisher(url, s3, records=records)
    if publisher is None:
        return RollingWriter(storage_kind(url).local_folder(url), prefix, **writer_options)
    if staging is None:
        raise ValueError(f"{url}: output of this kind is written in a local staging folder; name one")
    return RollingWriter(staging, prefix, publisher=publisher, **writer_options)


def checked_publisher(url: str, s3=None, *, records: bool = True):
    """The publisher of output folder ``url``, checked (a missing bucket, endpoint or credentials raise
    :class:`photon.SourceError` naming it), or None when its kind publishes in place (a local folder)."""
    publisher = storage_kind(url).publisher(url, s3, records=records)
    if publisher is not None:
        publisher.check()
    return publisher


def output_reader(url: str | os.PathLike, s3=None, *, outbox: str | Path | None = None) -> OutputReader:
    """The :class:`OutputReader` of output folder ``url`` (see :meth:`StorageKind.output_reader`)."""
    return storage_kind(url).output_reader(os.fspath(url), s3, outbox=outbox)


def local_folder(url: str | os.PathLike) -> Path | None:
    """The local folder ``url`` names, None when its kind keeps objects elsewhere."""
    return storage_kind(url).local_folder(os.fspath(url))


def join_location(root: str | os.PathLike, *parts: str) -> str:
    """The location ``parts`` below ``root``, in ``root``'s kind."""
    return storage_kind(root).join(os.fspath(root), *parts)
