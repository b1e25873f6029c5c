"""Output on S3: closed files uploaded whole, so readers never see a partial object.

Writers keep writing local files exactly as for a local ``output_root`` (``*.inprogress``, renamed when
closed), in a staging folder (``<state_dir>/outbox/<kind>``). With an ``s3://`` output root, each closed
file is then uploaded by an :class:`S3Publisher` to ``<output_root>/<kind>/<name>`` (one PUT, or a
multipart upload above ``[s3].multipart_mb``: S3 shows an object only once its upload completed) and the
local copy is removed. A file whose upload failed (an outage outlasting the retries) stays in the staging
folder and is uploaded by the next :meth:`S3Publisher.publish_pending`; a restarted writer does that first,
so a crash between closing and uploading loses nothing. Uploading the same file twice writes the same
object twice (same name, same bytes): readers never count it twice.

Freshness record (joined and unjoinable output): after each upload of a file a :class:`photon.RollingWriter`
closed (named ``<writer>-<start_us>-<seq>.jsonl``), the publisher puts ``<location>/_committed/<writer>.json``
= ``{"writer": w, "complete_us": t, "last": "<partition>/<name>", "at_us": now}``, but only once no earlier
file of that writer waits for a retry. ``complete_us`` is the newest modification time of the writer's
uploaded files: every line the writer wrote at or before ``complete_us`` is in an object that is visible
when the record is (the record is put after those objects, and S3 lists and reads an object after its
upload completed). Lines written later sit in the writer's open file and appear when it closes (within
the writer's roll interval). A failed record PUT is retried with the next upload; a record may lag, never
lead. Readers skip ``_committed/`` (folders starting with ``_`` are not output).
"""
from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

from photon._source import (INPROGRESS, Location, ObjectInfo, SourceUnavailable, check_bucket, is_transient,
                            parse_location, retrying, s3_client)
from photon._config import S3Config
from photon._logs import COMMITS_DIR, is_hidden

log = logging.getLogger("photon.output")


@dataclass(frozen=True)
class PublisherStatistics:
    url: str
    uploaded_files: int
    uploaded_bytes: int
    multipart_uploads: int
    failed_uploads: int
    pending_files: int
    records_put: int = 0


_WRITER_FILE = re.compile(r"^(?P<writer>.+)-[0-9]+-[0-9]+\.jsonl$")
"""A file a :class:`photon.RollingWriter` closed: ``<writer>-<start_us>-<seq>.jsonl``."""


def record_name(writer: str) -> str:
    """The object name (below an output location) of ``writer``'s freshness record."""
    return f"{COMMITS_DIR}/{writer}.json"


class ObjectPublisher:
    """Publishes closed local files to an object store at ``location`` (what an :class:`S3Publisher` does for
    S3; a kind with objects subclasses it and supplies :meth:`_put_file`, :meth:`_put`, :meth:`_list`,
    :meth:`_get` and :meth:`check`).

    ``publish(path, name)`` uploads ``path`` as ``<location>/<name>`` (default ``path.name``; a name may hold
    ``/``, e.g. ``date=.../hour=.../<file>``) and deletes it; ``upload(path)`` keeps
    the local file (for files that go on growing locally, like a quarantine log, re-uploaded whole).
    Neither raises on an outage: the file is kept and :meth:`publish_pending` tries again. With
    ``records``, each published writer file is followed by its writer's freshness record (module docstring).
    """

    def __init__(self, location: Location | str, *, records: bool = False) -> None:
        self.location = parse_location(location) if isinstance(location, str) else location
        self.url = self.location.url
        self._part = 1 << 62                               # a multipart upload from this size on
        self._pending: dict[Path, tuple[bool, str]] = {}   # local file -> (delete after upload, object name)
        self._uploaded = self._bytes = self._multipart = self._failed = 0
        self._records = records
        self._complete: dict[str, tuple[int, str]] = {}   # writer -> (newest mtime_us uploaded, its name)
        self._record_due: set[str] = set()
        self._records_put = 0

    # ---- what a kind supplies

    def check(self) -> None:
        """Raise :class:`photon.SourceError` naming a misconfiguration (missing bucket, no credentials)."""

    def _put_file(self, path: Path, name: str) -> None:
        """Store the bytes of ``path`` as object ``name``, whole (an object appears complete or not at all)."""
        raise NotImplementedError

    def _put(self, name: str, body: bytes) -> None:
        raise NotImplementedError

    def _list(self) -> list[ObjectInfo]:
        """Every object below the location (relative names, any depth)."""
        raise NotImplementedError

    def _get(self, name: str) -> bytes:
        """The bytes of object ``name``; FileNotFoundError when there is none."""
        raise NotImplementedError

    def _delete(self, name: str) -> None:
        raise NotImplementedError

    def at(self, location: Location | str) -> "ObjectPublisher":
        """A publisher (without records) of another location of the same kind, sharing this one's client."""
        raise NotImplementedError

    def child(self, name: str) -> "ObjectPublisher":
        """A publisher (without records) of the location ``<location>/<name>``."""
        return self.at(self.location.child(name))

    # ---- the contract

    def publish(self, path: str | Path, name: str | None = None) -> bool:
        """Upload ``path`` as ``name`` and delete it; False (kept for :meth:`publish_pending`) on an outage."""
        return self._upload(Path(path), True, name or Path(path).name)

    def upload(self, path: str | Path, name: str | None = None) -> bool:
        """Upload ``path`` (replacing the object) and keep it."""
        return self._upload(Path(path), False, name or Path(path).name)

    def publish_pending(self, folder: str | Path | None = None, prefix: str = "") -> int:
        """Upload what failed before, and every closed file (``<prefix>*``, not in progress, not hidden)
        in ``folder`` or its partition folders (named by their path below ``folder``): what a crashed writer
        left. Returns how many uploads succeeded."""
        if folder is not None and Path(folder).is_dir():
            root = Path(folder)
            for p in sorted(root.rglob(f"{prefix}*")):
                rel = p.relative_to(root)
                if p.is_file() and not p.name.endswith(INPROGRESS) \
                        and not is_hidden(rel.as_posix()):
                    self._pending.setdefault(p, (True, rel.as_posix()))
        done = 0
        for p, (delete, name) in list(self._pending.items()):
            if not p.exists():
                self._pending.pop(p, None)
            elif self._upload(p, delete, name):
                done += 1
        return done

    def _upload(self, path: Path, delete: bool, name: str) -> bool:
        try:
            st = path.stat()
            size = st.st_size
            self._put_file(path, name)
        except FileNotFoundError:
            self._pending.pop(path, None)
            return False
        except Exception as e:  # noqa: BLE001  (boto3's transfer wraps errors; keep the file, try later)
            self._failed += 1
            self._pending[path] = (delete, name)
            log.warning("upload of %s to %s/%s failed, will retry: %s", path, self.url, name, e)
            return False
        self._pending.pop(path, None)
        self._uploaded += 1
        self._bytes += size
        self._multipart += int(size >= self._part)
        if delete:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        m = _WRITER_FILE.match(path.name) if self._records and delete else None
        if m is not None:
            w, mtime_us = m.group("writer"), st.st_mtime_ns // 1000
            if mtime_us >= self._complete.get(w, (-1, ""))[0]:
                self._complete[w] = (mtime_us, name)
            self._record_due.add(w)
        self._put_records()
        return True

    def _put_records(self) -> None:
        """Put the due freshness records of writers none of whose files waits for a retry."""
        if not self._record_due:
            return
        waiting = {m.group("writer") for m in (_WRITER_FILE.match(p.name) for p in self._pending) if m}
        for w in sorted(self._record_due - waiting):
            complete_us, last = self._complete[w]
            body = orjson.dumps({"writer": w, "complete_us": complete_us, "last": last,
                                 "at_us": time.time_ns() // 1000})
            try:
                self._put(record_name(w), body)
            except Exception as e:  # noqa: BLE001  (a record may lag, never lead: retried with the next upload)
                log.warning("freshness record %s/%s not put, will retry: %s", self.url, record_name(w), e)
                continue
            self._record_due.discard(w)
            self._records_put += 1

    def objects(self) -> list[ObjectInfo]:
        """The objects published so far (names relative to the location, partition folders included),
        sorted by name."""
        return sorted(self._list(), key=lambda o: o.name)

    def read(self, name: str) -> bytes:
        """The bytes of object ``name``; FileNotFoundError once it is gone."""
        return self._get(name)

    def put(self, name: str, body: bytes) -> None:
        """Store ``body`` as object ``name`` now, whole (raises when it could not be stored)."""
        self._put(name, body)

    def delete(self, name: str) -> None:
        """Delete object ``name`` (nothing if there is none)."""
        self._delete(name)

    def statistics(self) -> PublisherStatistics:
        return PublisherStatistics(self.url, self._uploaded, self._bytes, self._multipart, self._failed,
                                   len(self._pending), self._records_put)


class S3Publisher(ObjectPublisher):
    """Uploads closed local files to ``location`` (an ``s3://`` URL or :class:`Location`): one PUT, or a
    multipart upload above ``[s3].multipart_mb``. See :class:`ObjectPublisher` for the contract."""

    def __init__(self, location: Location | str, config: S3Config | None = None, client=None, *,
                 records: bool = False) -> None:
        super().__init__(location, records=records)
        self.config = config or S3Config()
        self.client = client or s3_client(self.config)
        self._retry = retrying(self.config)
        part = max(5 << 20, int(self.config.multipart_mb * (1 << 20)))
        from boto3.s3.transfer import TransferConfig
        self._transfer = TransferConfig(multipart_threshold=part, multipart_chunksize=part, use_threads=False)
        self._part = part

    def check(self) -> None:
        check_bucket(self.client, self.location.bucket, self.url)

    def at(self, location: Location | str) -> "S3Publisher":
        return S3Publisher(location, self.config, self.client)

    def _put_file(self, path: Path, name: str) -> None:
        self._retry(self.client.upload_file, str(path), self.location.bucket, self.location.key(name),
                    Config=self._transfer)

    def _put(self, name: str, body: bytes) -> None:
        self._retry(self.client.put_object, Bucket=self.location.bucket, Key=self.location.key(name), Body=body,
                    ContentType="application/json" if name.endswith(".json") else "application/octet-stream")

    def _delete(self, name: str) -> None:
        self._retry(self.client.delete_object, Bucket=self.location.bucket, Key=self.location.key(name))

    def _list(self) -> list[ObjectInfo]:
        out: list[ObjectInfo] = []
        prefix = self.location.key("") if self.location.prefix else ""
        for page in self._retry(lambda: list(self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.location.bucket, Prefix=prefix))):
            for o in page.get("Contents", ()):
                name = o["Key"][len(prefix):]
                if name:
                    out.append(ObjectInfo(name, int(o["Size"]), str(int(o["LastModified"].timestamp() * 1e6))))
        return out

    def _get(self, name: str) -> bytes:
        from botocore.exceptions import ClientError
        try:
            r = self._retry(self.client.get_object, Bucket=self.location.bucket, Key=self.location.key(name))
            return r["Body"].read()
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise FileNotFoundError(f"{self.url}/{name} does not exist") from None
            if is_transient(e):
                raise SourceUnavailable(f"{self.url}/{name}: {e}") from e
            raise
        except Exception as e:
            if is_transient(e):
                raise SourceUnavailable(f"{self.url}/{name}: {e}") from e
            raise


def read_object_lines(url: str, s3: S3Config | None = None, client=None) -> list[bytes]:
    """Every line of every object directly below ``url`` (an object kind's output folder such as
    ``s3://bucket/out/joined``), in name order; published objects are whole, so every line is complete."""
    from photon._storage import storage_kind
    pub = storage_kind(url).publisher(url, s3, client=client)
    lines: list[bytes] = []
    for o in pub.objects():
        if is_hidden(o.name) or o.name.endswith(INPROGRESS):
            continue
        data = pub.read(o.name)
        lines += [x for x in data[: data.rfind(b"\n") + 1].split(b"\n") if x]
    return lines


def output_publisher(config, region, kind: str) -> ObjectPublisher | None:
    """The checked publisher of ``region``'s ``kind`` output (``joined``, ``unjoinable``, ``quarantine``)
    when its output root's kind stages output locally (``s3://``, ``memory://``), else None (a local folder
    is published in place by renaming). Raises :class:`photon.SourceError` naming a misconfiguration."""
    from photon._storage import checked_publisher
    return checked_publisher(region.output_url(kind), config.s3, records=kind in ("joined", "unjoinable"))
