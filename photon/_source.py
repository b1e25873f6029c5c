"""Where logs live: one interface over local folders and S3 prefixes.

A *location* is a bare path, a ``file://`` URL or ``s3://bucket/prefix``. A *source* is one stream at a
location: a set of named objects (files, or S3 objects under the prefix, any depth) that grow.
:func:`open_source` gives the right one; both have the same contract:

* :meth:`scan` returns the current view ``name -> ObjectInfo`` (``name`` relative to the location, ``/``
  separated, sorted like the keys). Files whose name ends in ``.inprogress`` or starts with ``.`` are
  not part of the stream (a writer still writing them publishes them by renaming).
* :meth:`read` returns bytes ``[start, start + length)`` of the object's *current* version and its
  current size. On S3 this is one ranged GET; an object replaced by a longer version of itself is read on
  from where it was left. :class:`ObjectGone` if it no longer exists, :class:`ObjectUnreadable` if it
  cannot be read (permissions), :class:`SourceUnavailable` when transient errors outlast the retries.
* :meth:`check` raises :class:`SourceError` naming the problem for a misconfiguration that will not heal
  by waiting (missing bucket, unreachable endpoint, no credentials); call it at start.

S3 listing is incremental: each scan lists only keys after the greatest key seen (``StartAfter``, every
page), plus one HEAD per *open* object (the newest object of each folder, which a writer may still replace
with a longer version) that the caller has read to its end. Every ``full_list_interval_s`` the prefix is
listed whole, which finds late objects sorting before the greatest key, replacements of older objects and
deletions. Listings happen at most every ``list_interval_s``; scans in between return the last view.
Transient errors (throttling, 5xx, timeouts, lost connections) are retried with exponential backoff
(tenacity); botocore's own retries are off so each request is retried in one place.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping
from urllib.parse import urlparse

from photon._config import ConfigError, S3Config
from photon._storage import SCHEMES, storage_kind

INPROGRESS = ".inprogress"
S3 = "s3"
LOCAL = "file"


class SourceError(ConfigError):
    """A misconfigured location (missing bucket, unreachable endpoint, no credentials, bad URL): a
    configuration error, found at start."""


class ObjectGone(OSError):
    """The object was deleted (or replaced by a shorter version) after it was listed."""


class ObjectUnreadable(OSError):
    """The object exists but cannot be read (permissions); reading it again will fail again."""


class SourceUnavailable(OSError):
    """Transient errors outlasted the retries; the next poll tries again."""


@dataclass(frozen=True)
class Location:
    """A parsed location: ``scheme`` is ``"file"`` (``path``) or an object kind's (``"s3"``, ``"memory"``:
    ``bucket``, ``prefix``: no leading or trailing ``/``, ``""`` for the whole bucket)."""
    scheme: str
    path: str = ""
    bucket: str = ""
    prefix: str = ""

    @property
    def is_s3(self) -> bool:
        return self.scheme == S3

    @property
    def is_local(self) -> bool:
        return self.scheme == LOCAL

    @property
    def url(self) -> str:
        if not self.is_local:
            base = f"{self.scheme}://{self.bucket}"
            return f"{base}/{self.prefix}" if self.prefix else base
        return self.path

    def child(self, *parts: str) -> "Location":
        """The location of ``parts`` below this one (``loc.child("clicks")``)."""
        rel = "/".join(p.strip("/") for p in parts if p.strip("/"))
        if not self.is_local:
            prefix = f"{self.prefix}/{rel}" if self.prefix and rel else (self.prefix or rel)
            return Location(self.scheme, bucket=self.bucket, prefix=prefix)
        return Location(LOCAL, path=str(Path(self.path, rel)) if rel else self.path)

    def key(self, name: str) -> str:
        """The S3 key of object ``name`` below this location."""
        return f"{self.prefix}/{name}" if self.prefix else name

    def __str__(self) -> str:
        return self.url


def parse_location(text: str | os.PathLike) -> Location:
    """``/a/b``, ``file:///a/b`` or ``<scheme>://bucket/prefix`` of an object kind (``s3``, ``memory``) ->
    :class:`Location`; :class:`SourceError` for a scheme not in :data:`photon._storage.SCHEMES` or an
    object URL without a bucket."""
    text = os.fspath(text)
    if "://" not in text:
        return Location(LOCAL, path=text)
    u = urlparse(text)
    if u.scheme == "file":
        if u.netloc not in ("", "localhost"):
            raise SourceError(f"{text!r}: file:// URLs name a local path (file:///path), not host {u.netloc!r}")
        return Location(LOCAL, path=u.path)
    if u.scheme in SCHEMES:
        if not u.netloc:
            raise SourceError(f"{text!r}: an object location needs a bucket ({u.scheme}://bucket/prefix)")
        return Location(u.scheme, bucket=u.netloc, prefix=u.path.strip("/"))
    known = ", ".join(f"{s}://" for s in SCHEMES)
    raise SourceError(f"{text!r}: unsupported scheme {u.scheme!r} (use a path, {known})")


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One object of a stream as last seen: ``name`` (relative), ``size`` in bytes, ``version`` (ETag on
    S3, mtime in ns locally: changes when the object is replaced)."""
    name: str
    size: int
    version: str = ""


@dataclass(frozen=True)
class SourceStatistics:
    """Request counts since the source was made."""
    url: str
    objects: int
    list_requests: int
    full_lists: int
    head_requests: int
    get_requests: int
    bytes_read: int
    retries: int
    last_scan_requests: int


def visible(name: str) -> bool:
    """Whether object ``name`` is part of a stream (not in progress, not hidden)."""
    base = name.rsplit("/", 1)[-1]
    return bool(base) and not base.endswith(INPROGRESS) and not base.startswith(".")


@dataclass
class _Counters:
    list_requests: int = 0
    full_lists: int = 0
    head_requests: int = 0
    get_requests: int = 0
    bytes_read: int = 0
    retries: int = 0
    last_scan_requests: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def statistics(self, url: str, objects: int) -> SourceStatistics:
        return SourceStatistics(url, objects, self.list_requests, self.full_lists, self.head_requests,
                                self.get_requests, self.bytes_read, self.retries, self.last_scan_requests)


class LocalSource:
    """A folder of log files (any depth). See the module docstring for the contract.

    Polling cost does not grow with every file ever seen: a file fully consumed (``consumed[name]`` at its
    size) and unchanged for ``retire_after_s`` is *retired*: later scans reuse its last size instead of
    stating it, and a folder whose modification time has not changed is not listed again. Every
    ``full_scan_s`` one scan lists and states everything, so a retired file that grows after all (or a
    folder changed within the same mtime tick) is still noticed, within ``full_scan_s``.
    """

    whole_objects = False
    """Local files are appended to in place: an empty file is one not written yet, not a bad object."""

    def __init__(self, location: Location | str, retire_after_s: float = 300.0, full_scan_s: float = 30.0,
                 clock=time.monotonic) -> None:
        self.location = parse_location(location) if isinstance(location, str) else location
        self.root = Path(self.location.path)
        self.url = str(self.root)
        self.retire_after_s = retire_after_s
        self.full_scan_s = full_scan_s
        self._clock = clock
        self._n = _Counters()
        self._view: dict[str, ObjectInfo] = {}
        self._unchanged_since: dict[str, float] = {}   # name -> when it was last seen growing or changing
        self._retired: set[str] = set()
        self._listings: dict[str, tuple[int, list[tuple[str, str | None]]]] = {}   # folder -> (mtime_ns, entries)
        self._last_full = float("-inf")
        self.stats_last_scan = 0                        # files stated by the last scan

    def check(self) -> None:
        if self.root.exists() and not self.root.is_dir():
            raise SourceError(f"{self.root} is not a folder")

    def _entries(self, folder: str, cut: int, full: bool) -> list[tuple[str, str | None]]:
        """``[(path, name)]`` of ``folder``: a sub-folder's path with ``None``, a visible file's path with its
        object name (its path from the root's ``cut`` on); listed again only if its mtime changed (or ``full``)."""
        st = os.stat(folder)
        cached = self._listings.get(folder)
        if not full and cached is not None and cached[0] == st.st_mtime_ns:
            return cached[1]
        entries = []
        for e in os.scandir(folder):
            if e.is_dir(follow_symlinks=False):
                entries.append((e.path, None))
            elif e.is_file() and visible(name := e.path[cut:].replace(os.sep, "/")):
                entries.append((e.path, name))
        self._listings[folder] = (st.st_mtime_ns, entries)
        return entries

    def scan(self, consumed: Mapping[str, int] | None = None) -> dict[str, ObjectInfo]:
        consumed = consumed or {}
        now = self._clock()
        full = now - self._last_full >= self.full_scan_s
        if full:
            self._last_full = now
            self._listings.clear()
        view: dict[str, ObjectInfo] = {}
        stated = 0
        if self.root.is_dir():
            stack = [str(self.root)]
            cut = len(os.path.join(stack[0], ""))        # listed paths are the root's, joined: a slice names them
            while stack:
                d = stack.pop()
                try:
                    entries = self._entries(d, cut, full)
                except (FileNotFoundError, NotADirectoryError):
                    self._listings.pop(d, None)
                    continue
                for path, name in entries:
                    if name is None:
                        stack.append(path)
                        continue
                    if not full and name in self._retired and name in self._view:
                        view[name] = self._view[name]
                        continue
                    try:
                        st = os.stat(path)
                    except FileNotFoundError:
                        continue
                    stated += 1
                    view[name] = info = ObjectInfo(name, st.st_size, str(st.st_mtime_ns))
                    self._judge(name, info, consumed.get(name, 0), now)
        for gone in set(self._unchanged_since) - set(view):
            self._unchanged_since.pop(gone, None)
            self._retired.discard(gone)
        self._view = dict(sorted(view.items()))
        self.stats_last_scan = stated
        with self._n.lock:
            self._n.list_requests += 1
            self._n.last_scan_requests = 1
        return self._view

    def _judge(self, name: str, info: ObjectInfo, consumed: int, now: float) -> None:
        """Retire ``name`` once it is read to its end and unchanged for ``retire_after_s``; un-retire it
        when it changed."""
        before = self._view.get(name)
        if before is None or before.size != info.size or before.version != info.version or consumed < info.size:
            self._unchanged_since[name] = now
            self._retired.discard(name)
        elif now - self._unchanged_since.setdefault(name, now) >= self.retire_after_s:
            self._retired.add(name)

    @property
    def retired(self) -> int:
        """How many files the scans currently skip stating."""
        return len(self._retired)

    def read(self, name: str, start: int, length: int) -> tuple[bytes, int]:
        try:
            with open(self.root / name, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                f.seek(start)
                data = f.read(length)
        except FileNotFoundError:
            raise ObjectGone(f"{self.root / name} no longer exists") from None
        except PermissionError as e:
            raise ObjectUnreadable(f"{self.root / name} cannot be read: {e.strerror}") from None
        except IsADirectoryError:
            raise ObjectGone(f"{self.root / name} is now a folder") from None
        with self._n.lock:
            self._n.get_requests += 1
            self._n.bytes_read += len(data)
        return data, max(size, start + len(data))

    def statistics(self) -> SourceStatistics:
        return self._n.statistics(self.url, len(self._view))


# ---------------------------------------------------------------------------------------------- S3

_TRANSIENT_CODES = frozenset({
    "SlowDown", "Throttling", "ThrottlingException", "RequestThrottled", "RequestLimitExceeded",
    "TooManyRequestsException", "RequestTimeout", "RequestTimeoutException", "InternalError",
    "ServiceUnavailable", "InternalServerError", "500", "502", "503", "504"})


def is_transient(exc: BaseException) -> bool:
    """True for an S3 error worth retrying: throttling, 5xx, timeouts, lost or refused connections."""
    from botocore.exceptions import ClientError, ConnectionError, HTTPClientError, ResponseStreamingError
    if isinstance(exc, (HTTPClientError, ConnectionError, ResponseStreamingError)):
        return True
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return err.get("Code") in _TRANSIENT_CODES or status >= 500 or status == 429
    return False


def _error_code(exc: BaseException) -> str:
    from botocore.exceptions import ClientError
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return ""


def s3_endpoint(config: S3Config | None = None) -> str | None:
    """The S3 endpoint in use: ``[s3].endpoint_url``, else ``AWS_ENDPOINT_URL``, else None (AWS's)."""
    return (config.endpoint_url if config and config.endpoint_url else None) or \
        os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def s3_client(config: S3Config | None = None, session=None):
    """A boto3 S3 client from the standard credential chain, the endpoint of :func:`s3_endpoint`, the
    timeouts of ``config`` and botocore's retries off (callers retry with :func:`retrying`)."""
    import boto3
    from botocore.config import Config
    config = config or S3Config()
    session = session or boto3.session.Session()
    region = config.region_name or session.region_name or "us-east-1"
    return session.client(
        "s3", endpoint_url=s3_endpoint(config), region_name=region,
        config=Config(connect_timeout=config.connect_timeout_s, read_timeout=config.read_timeout_s,
                      retries={"total_max_attempts": 1}, s3={"addressing_style": "path"},
                      max_pool_connections=16))


def retrying(config: S3Config | None = None, on_retry=None):
    """A tenacity retry policy for S3 requests: transient errors only, exponential backoff up to
    ``retry_max_s``, at most ``retry_attempts`` attempts, then the last error is re-raised."""
    import tenacity
    config = config or S3Config()
    return tenacity.Retrying(
        retry=tenacity.retry_if_exception(is_transient),
        wait=tenacity.wait_exponential_jitter(multiplier=0.05, max=config.retry_max_s, jitter=0.05),
        stop=tenacity.stop_after_attempt(config.retry_attempts),
        before_sleep=on_retry, reraise=True)


def check_bucket(client, bucket: str, what: str = "") -> None:
    """Raise :class:`SourceError` naming the problem if ``bucket`` cannot be used through ``client``."""
    from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError
    where = what or f"s3://{bucket}"
    endpoint = client.meta.endpoint_url
    try:
        client.head_bucket(Bucket=bucket)
    except NoCredentialsError:
        raise SourceError(f"{where}: no AWS credentials found (set AWS_ACCESS_KEY_ID and "
                          f"AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or use an instance role)") from None
    except EndpointConnectionError as e:
        raise SourceError(f"{where}: cannot reach the S3 endpoint {endpoint} ({e})") from None
    except ClientError as e:
        code = _error_code(e)
        status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        if code in ("404", "NoSuchBucket") or status == 404:
            raise SourceError(f"{where}: bucket {bucket!r} does not exist at {endpoint}") from None
        if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch") or status == 403:
            raise SourceError(f"{where}: access to bucket {bucket!r} denied at {endpoint} ({code}): check "
                              f"the credentials") from None
        raise SourceError(f"{where}: bucket {bucket!r} at {endpoint}: {code or e}") from None
    except Exception as e:  # noqa: BLE001  (timeouts, TLS errors, bad endpoint URLs: all fatal at start)
        raise SourceError(f"{where}: cannot reach the S3 endpoint {endpoint} ({type(e).__name__}: {e})") \
            from None


class S3Source:
    """The objects under ``s3://bucket/prefix`` (any depth). See the module docstring for the contract."""

    whole_objects = True
    """An S3 object is written whole: an empty one is a bad object, not one still being written."""

    def __init__(self, location: Location | str, config: S3Config | None = None, client=None, *,
                 clock=time.monotonic) -> None:
        self.location = parse_location(location) if isinstance(location, str) else location
        if not self.location.is_s3:
            raise SourceError(f"{self.location}: not an s3:// location")
        self.config = config or S3Config()
        self.client = client or s3_client(self.config)
        self.url = self.location.url
        self._list_prefix = self.location.key("") if self.location.prefix else ""
        self._clock = clock
        self._n = _Counters()
        self._view: dict[str, ObjectInfo] = {}
        self._greatest = ""
        self._listed_at = None
        self._full_at = None
        self._retry = retrying(self.config, on_retry=self._count_retry)
        self.page_size = 1000
        """Keys per listing request (S3's most)."""

    def _count_retry(self, _state) -> None:
        with self._n.lock:
            self._n.retries += 1

    def _call(self, fn, **kw):
        try:
            return self._retry(fn, **kw)
        except Exception as e:
            if is_transient(e):
                raise SourceUnavailable(f"{self.url}: {type(e).__name__}: {e}") from e
            raise

    def check(self) -> None:
        check_bucket(self.client, self.location.bucket, self.url)

    # ---- listing

    def _list(self, start_after: str) -> tuple[list[ObjectInfo], int]:
        out, requests, token = [], 0, None
        while True:
            kw = {"Bucket": self.location.bucket, "Prefix": self._list_prefix, "MaxKeys": self.page_size}
            if token:
                kw["ContinuationToken"] = token
            elif start_after:
                kw["StartAfter"] = self._list_prefix + start_after
            page = self._call(self.client.list_objects_v2, **kw)
            requests += 1
            cut = len(self._list_prefix)
            for obj in page.get("Contents", ()):
                name = obj["Key"][cut:]
                if visible(name):
                    out.append(ObjectInfo(name, int(obj["Size"]), obj.get("ETag", "")))
            if not page.get("IsTruncated"):
                return out, requests
            token = page["NextContinuationToken"]

    def _head(self, name: str) -> ObjectInfo | None:
        from botocore.exceptions import ClientError
        try:
            r = self._call(self.client.head_object, Bucket=self.location.bucket, Key=self.location.key(name))
        except ClientError as e:
            if _error_code(e) in ("404", "NoSuchKey", "NotFound"):
                return None
            if _error_code(e) in ("403", "AccessDenied"):
                return self._view.get(name)   # the read reports it
            raise
        return ObjectInfo(name, int(r["ContentLength"]), r.get("ETag", ""))

    def _open_objects(self) -> list[str]:
        newest: dict[str, str] = {}
        for name in self._view:        # sorted: the last one per folder wins
            newest[name.rpartition("/")[0]] = name
        return list(newest.values())

    def scan(self, consumed: Mapping[str, int] | None = None) -> dict[str, ObjectInfo]:
        """The current view (see the module docstring). ``consumed`` (name -> offset read up to) limits
        the HEADs to open objects read to their end. Raises :class:`SourceUnavailable`."""
        now = self._clock()
        if self._listed_at is not None and now - self._listed_at < self.config.list_interval_s:
            return self._view
        full = self._full_at is None or now - self._full_at >= self.config.full_list_interval_s
        requests = heads = 0
        if full:
            objects, requests = self._list("")
            view = {o.name: o for o in objects}
            self._full_at = now
        else:
            objects, requests = self._list(self._greatest)
            view = dict(self._view)
            for o in objects:
                view[o.name] = o
            consumed = consumed or {}
            for name in self._open_objects():
                known = view.get(name)
                if known is None or consumed.get(name, 0) < known.size:
                    continue
                heads += 1
                info = self._head(name)
                if info is None:
                    view.pop(name, None)
                else:
                    view[name] = info
        if len(view) != len(self._view) or objects:
            view = dict(sorted(view.items()))
        self._view = view
        if view:
            self._greatest = max(self._greatest, next(reversed(view)))
        self._listed_at = self._clock()
        with self._n.lock:
            self._n.list_requests += requests
            self._n.full_lists += int(full)
            self._n.head_requests += heads
            self._n.last_scan_requests = requests + heads
        return view

    # ---- reading

    def read(self, name: str, start: int, length: int) -> tuple[bytes, int]:
        from botocore.exceptions import ClientError
        key = self.location.key(name)

        def get():
            r = self.client.get_object(Bucket=self.location.bucket, Key=key,
                                       Range=f"bytes={start}-{start + length - 1}")
            body = r["Body"]
            try:
                data = body.read()
            finally:
                body.close()
            total = int(r.get("ContentRange", "/0").rsplit("/", 1)[-1] or 0) if "ContentRange" in r \
                else start + len(data)
            return data, r.get("ETag", ""), total

        try:
            data, etag, total = self._call(get)
        except ClientError as e:
            code = _error_code(e)
            if code in ("NoSuchKey", "404"):
                raise ObjectGone(f"s3://{self.location.bucket}/{key} no longer exists") from None
            if code == "InvalidRange":       # shorter than ``start`` now: the next scan tells its size
                return b"", start
            if code in ("AccessDenied", "403", "InvalidObjectState", "AllAccessDisabled"):
                raise ObjectUnreadable(f"s3://{self.location.bucket}/{key} cannot be read: {code}") from None
            raise
        with self._n.lock:
            self._n.get_requests += 1
            self._n.bytes_read += len(data)
        known = self._view.get(name)
        if known is not None and total != known.size:   # a newer version: remember its size
            self._view = {**self._view, name: ObjectInfo(name, total, etag)}
        return data, total

    def statistics(self) -> SourceStatistics:
        return self._n.statistics(self.url, len(self._view))


def open_source(location: Location | str | os.PathLike, s3: S3Config | None = None, client=None,
                input_config=None):
    """The :class:`photon.Source` of ``location``, of the kind its scheme names (:func:`photon.storage_kind`):
    :class:`S3Source` for ``s3://``, :class:`LocalSource` for a path (with the retirement settings of
    ``input_config``, an :class:`photon.InputConfig`, if given), ..."""
    url = location.url if isinstance(location, Location) else os.fspath(location)
    return storage_kind(url).source(url, s3, input_config=input_config, client=client)


def stream_source(config, region, stream: str):
    """The checked source of ``stream`` (``config.join.primary_stream`` or ``foreign_stream``) of
    ``region`` (a :class:`photon.RegionConfig`): raises :class:`SourceError` naming a misconfiguration."""
    source = open_source(region.stream_url(stream), config.s3, input_config=config.input)
    source.check()
    return source
