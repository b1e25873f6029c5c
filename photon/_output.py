"""Reading Photon's output folders (joined/, unjoinable/) the way the output contract says (README "Output
contract"): published files, the committed prefix of open files, and compacted partitions, each line once.

A snapshot is taken in this order, which is what makes it exact while writers roll and compaction swaps:

1. every writer's commit record ``_committed/<writer>.json`` (open files and their committed bytes);
2. the listing of published ``*.jsonl`` files (folders and files starting with ``_`` or ``.`` skipped);
3. the compaction record ``_compaction.json`` (which partitions are served from Parquet, and which of
   their JSONL files the Parquet holds).

An open file that the listing already shows published is taken from the listing, whole; one still open is
taken up to its committed bytes (read from its hidden in-progress name, or from its published name if it
was published after the listing: the bytes are the same). A partition the record names is taken from its
Parquet, never from JSONL; any other listed file is taken as JSONL.

Compaction (:mod:`photon.app._compact`) moves a closed hour from the JSONL table ``<kind>/`` to the Parquet
table ``<kind>_parquet/`` beside it: Parquet written under ``<kind>/_compacted/g<N>/<partition>``, the
record replaced, then the JSONL hour folder renamed away to ``<kind>/_compacted/g<N>/jsonl/<partition>``
(kept ``[compact].keep_jsonl_s``), then the Parquet folder renamed to ``<kind>_parquet/<partition>``. The
record is read last because it is written before the JSONL leaves the listing: a partition missing from
the listing is in the record. A listed file that moved away before it is read is read from its kept name
(:meth:`OutputSnapshot.path`); a Parquet folder named by the record is found under its staging or its
table name (:func:`compacted_dir`), whichever holds it when read.

An output on S3 (``s3://bucket/prefix/<kind>``, see :mod:`photon._publish`) holds published objects only:
files appear when they close, whole. :func:`s3_output_snapshot` takes, in this order, the region's local
staging folder (``outbox``: closed files not uploaded yet and the committed prefix of open ones, read
now), the writers' freshness records ``_committed/<writer>.json`` and the listing of the objects; a file
both staged and listed is taken from S3 once. A file uploaded (and removed locally) while the snapshot is
taken is in the listing, which comes last. Without ``outbox`` (a reader that only sees the bucket) a
snapshot holds closed files only: each writer's lines up to its record's ``complete_us``, plus any closed
since. :func:`read_output_lines` and :class:`OutputTailer` take an ``s3://`` folder through the same calls.
The compaction record (same object name, same format) is honoured as for a folder: read after the listing,
a recorded partition is taken from its Parquet objects (table or staging) and its JSONL objects skipped.
Each kind's reader is reached through :func:`photon.output_reader` (:class:`FolderOutput`,
:class:`ObjectOutput`); see docs/storage.md.
"""
from __future__ import annotations

import calendar
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from photon._logs import COMMITS_DIR, LogChunk, inprogress_name, is_hidden, line_offsets, published_name
from photon._source import Location, ObjectGone
from photon._storage import storage_kind

COMPACTION_RECORD = "_compaction.json"
"""``{"partitions": {"date=D/hour=H": {"path": "_compacted/g<N>/date=D/hour=H", "kept":
"_compacted/g<N>/jsonl/date=D/hour=H", "files": [names], "at_us": t}}}``, replaced atomically by
``photon compact``: ``path`` is where the partition's Parquet was written (it then moves to
``<kind>_parquet/<partition>``), ``kept`` where its JSONL folder is moved when it leaves the JSONL table.
An entry without ``kept`` was written before the Parquet table existed (its JSONL stayed in place)."""
PARQUET_TABLE_SUFFIX = "_parquet"
"""The Parquet table of output folder ``<output_root>/<kind>`` is ``<output_root>/<kind>_parquet``."""
LINE_COLUMN = "_line"
"""Column of a compacted Parquet file holding each output line exactly as it was written."""


@dataclass
class OutputSnapshot:
    """What a reader following the contract counts in one output folder at one moment.

    ``published``: relative paths of published JSONL files to read whole; ``open``: relative published
    path -> committed bytes of files still being written; ``compacted``: partition -> its Parquet folder
    (absolute, as found when the snapshot was taken; read it with :func:`compacted_lines`)."""
    root: Path
    published: list[str] = field(default_factory=list)
    open: dict[str, int] = field(default_factory=dict)
    compacted: dict[str, str] = field(default_factory=dict)

    def read_open(self, rel: str, start: int = 0) -> bytes:
        """The committed bytes of open file ``rel`` from ``start`` on (from its in-progress name, or its
        published name if it was published meanwhile); b"" if it is gone (compacted and removed)."""
        end = self.open[rel]
        path = self.root / rel
        for candidate in (path.with_name(inprogress_name(path.name)), path):
            try:
                with open(candidate, "rb") as f:
                    f.seek(start)
                    return f.read(max(0, end - start))
            except FileNotFoundError:
                continue
        return b""

    def path(self, rel: str) -> Path | None:
        """Where published file ``rel`` is now: its published name, or its kept name once compaction moved
        its partition out of the JSONL table (see the module docstring); None once it is gone for good."""
        return resolve_published(self.root, rel)


def read_json(path: Path) -> dict:
    try:
        return orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return {}
    except orjson.JSONDecodeError as e:      # never torn (atomic replace): a foreign file there
        raise ValueError(f"{path} is not a valid record: {e}") from None


def compaction_record(root: str | Path) -> dict:
    return read_json(Path(root) / COMPACTION_RECORD).get("partitions", {})


def partition_start_us(partition: str) -> int | None:
    """``date=YYYY-MM-DD/hour=HH`` -> its first microsecond (UTC), None for anything else."""
    try:
        d, h = partition.split("/")
        t = time.strptime(f"{d.removeprefix('date=')} {h.removeprefix('hour=')}", "%Y-%m-%d %H")
    except ValueError:
        return None
    return calendar.timegm(t) * 1_000_000


def parquet_table(root: str | Path) -> Path:
    """The Parquet table beside output folder ``root`` (``joined`` -> ``joined_parquet``)."""
    root = Path(root)
    return root.with_name(root.name + PARQUET_TABLE_SUFFIX)


def _has_parquet(folder: Path) -> bool:
    return folder.is_dir() and any(folder.glob("*.parquet"))


def compacted_dir(root: str | Path, part: str, entry: dict) -> Path | None:
    """The folder holding compacted partition ``part``'s Parquet now: ``<kind>_parquet/<part>`` once it
    is shown there, its staging folder ``entry["path"]`` before; None if neither holds it (deleted from
    the table by someone else). Looked up table, staging, table: the move between them is one rename."""
    root = Path(root)
    table = parquet_table(root) / part
    for folder in (table, root / entry["path"], table):
        if _has_parquet(folder):
            return folder
    return None


def resolve_published(root: str | Path, rel: str) -> Path | None:
    """Where published file ``rel`` of output folder ``root`` is now (see :meth:`OutputSnapshot.path`)."""
    root = Path(root)
    path = root / rel
    if path.exists():
        return path
    part, _, name = rel.rpartition("/")
    kept = compaction_record(root).get(part, {}).get("kept")
    for candidate in ((root / kept / name) if kept else None, path):
        if candidate is not None and candidate.exists():
            return candidate
    return None


def output_snapshot(root: str | Path) -> OutputSnapshot:
    """The snapshot of output folder ``root`` (see the module docstring for the order and its guarantee)."""
    root = Path(root)
    snap = OutputSnapshot(root)
    open_files: dict[str, int] = {}
    commits = root / COMMITS_DIR
    if commits.is_dir():
        for rec in sorted(commits.glob("*.json")):
            for rel, size in read_json(rec).get("open", {}).items():
                open_files[rel] = max(open_files.get(rel, 0), int(size))
    published: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not is_hidden(d))
        rel_dir = os.path.relpath(dirpath, root)
        for name in filenames:
            if name.endswith(".jsonl") and not is_hidden(name):
                published.append(name if rel_dir == "." else f"{rel_dir}/{name}")
    in_parquet: set[str] = set()
    for part, entry in compaction_record(root).items():      # after the listing: see the module docstring
        folder = compacted_dir(root, part, entry)
        if folder is None:
            continue
        snap.compacted[part] = str(folder)
        in_parquet.update(f"{part}/{name}" for name in entry.get("files", []))
    snap.published = sorted(rel for rel in published if rel not in in_parquet)
    listed = set(published)
    snap.open = {rel: size for rel, size in sorted(open_files.items())
                 if rel not in listed and rel not in in_parquet and size > 0}
    return snap


PINS_DIR = "_pinned"
"""Folder (under an output folder) of the hard links :func:`pinned_paths` makes for Photon's Spark reads."""
_pin_folder: dict[Path, Path] = {}


def _pin_folder_of(root: Path) -> Path:
    import atexit
    import uuid

    if root not in _pin_folder:
        folder = root / PINS_DIR / f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        _pin_folder[root] = folder
        atexit.register(shutil.rmtree, folder, True)
    return _pin_folder[root]


def pinned_paths(snap: OutputSnapshot, now_us: int) -> dict[str, Path]:
    """Relative name -> a path that stays readable for this process's life, for every published file of
    ``snap`` (for Spark, which lists when a DataFrame is made and opens files later). A file of an hour
    that has ended (one compaction may move out of the JSONL table meanwhile) is hard-linked under
    ``<root>/_pinned/<pid>-<id>/`` (removed at exit; ``photon compact`` removes those older than
    ``keep_jsonl_s``); other files, and every file when linking is refused (read-only output), are given by
    their current path."""
    out: dict[str, Path] = {}
    for rel in snap.published:
        path = snap.path(rel)
        if path is None:
            continue
        out[rel] = path
        start = partition_start_us(rel.rpartition("/")[0])
        if start is None or start + 3_600_000_000 > now_us:
            continue
        pin = _pin_folder_of(snap.root) / rel
        try:
            if not pin.exists():
                pin.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(path, pin)
                except FileNotFoundError:        # moved to its kept name meanwhile
                    moved = snap.path(rel)
                    if moved is None:
                        del out[rel]
                        continue
                    os.link(moved, pin)
            out[rel] = pin
        except OSError:
            pass
    return out


def pinned_compacted(snap: OutputSnapshot) -> dict[str, Path]:
    """Partition -> a Parquet folder that stays readable for this process's life, for every compacted
    partition of ``snap``: its folder in the Parquet table, or (a swap under way) hard links to its staged
    files under ``<root>/_pinned/<pid>-<id>/_parquet/`` (the staging folder moves into the table)."""
    table = parquet_table(snap.root)
    out: dict[str, Path] = {}
    for part, folder in snap.compacted.items():
        folder = Path(folder)
        for _ in range(3):
            if folder.parent.parent == table:
                break
            pin = _pin_folder_of(snap.root) / "_parquet" / part
            try:
                files = sorted(folder.glob("*.parquet"))
                if not files:
                    raise FileNotFoundError(folder)
                for f in files:
                    pin.mkdir(parents=True, exist_ok=True)
                    if not (pin / f.name).exists():
                        os.link(f, pin / f.name)
                folder = pin
                break
            except FileNotFoundError:          # shown in the table meanwhile
                shutil.rmtree(pin, ignore_errors=True)
                folder = compacted_dir(snap.root, part, compaction_record(snap.root)[part]) or folder
        out[part] = folder
    return out


@dataclass
class S3OutputSnapshot:
    """What a reader following the contract counts in one output folder on S3 at one moment (see the module
    docstring): ``objects`` (published objects, relative names, sorted), ``local`` (relative name ->
    complete lines still staged in the region's outbox, not listed on S3) and ``freshness`` (writer ->
    ``complete_us`` of its record), ``compacted`` (partition -> its compaction record entry, for the
    partitions served from Parquet: their JSONL objects are left out of ``objects``)."""
    url: str
    objects: list = field(default_factory=list)
    local: dict[str, bytes] = field(default_factory=dict)
    freshness: dict[str, int] = field(default_factory=dict)
    publisher: object = None
    compacted: dict[str, dict] = field(default_factory=dict)

    def read(self, rel: str) -> bytes:
        """The bytes of ``rel`` (an object, or staged lines)."""
        if rel in self.local:
            return self.local[rel]
        return self.publisher.read(rel)

    def names(self) -> list[str]:
        return sorted([o.name for o in self.objects] + list(self.local))

    def compacted_lines(self, part: str) -> list[bytes]:
        """The original lines of compacted partition ``part``, from its Parquet."""
        return object_compacted_lines(self.publisher, part, self.compacted[part])


def parquet_publisher(publisher):
    """A publisher of the Parquet table beside an object output folder (``.../joined`` ->
    ``.../joined_parquet``)."""
    loc = publisher.location
    return publisher.at(Location(loc.scheme, bucket=loc.bucket, prefix=loc.prefix + PARQUET_TABLE_SUFFIX))


def object_compaction_record(publisher) -> dict:
    """The compaction record of an object output folder (``{}`` when there is none); same format as a local
    folder's (:data:`COMPACTION_RECORD`)."""
    try:
        data = publisher.read(COMPACTION_RECORD)
    except FileNotFoundError:
        return {}
    try:
        return orjson.loads(data).get("partitions", {})
    except orjson.JSONDecodeError as e:      # put whole: a foreign object there
        raise ValueError(f"{publisher.url}/{COMPACTION_RECORD} is not a valid record: {e}") from None


def object_compacted_folder(publisher, part: str, entry: dict):
    """A publisher of the location holding compacted partition ``part``'s Parquet now: the Parquet table's
    ``<part>`` once shown there, its staging location ``entry["path"]`` before; None if neither holds it.
    Looked up table, staging, table: the show copies to the table before it deletes the staging objects."""
    table = parquet_publisher(publisher).child(part)
    for folder in (table, publisher.child(entry["path"]), table):
        if any(o.name.endswith(".parquet") for o in folder.objects()):
            return folder
    return None


def object_compacted_lines(publisher, part: str, entry: dict) -> list[bytes]:
    """The original lines held by compacted partition ``part`` of an object output folder."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for _ in range(3):          # the staging objects deleted while read: look again (the table has them)
        folder = object_compacted_folder(publisher, part, entry)
        if folder is None:
            return []
        try:
            blobs = [folder.read(o.name) for o in folder.objects() if o.name.endswith(".parquet")]
        except FileNotFoundError:
            continue
        lines: list[bytes] = []
        for blob in blobs:
            table = pq.read_table(pa.BufferReader(blob), columns=[LINE_COLUMN])
            lines += [v.encode() if isinstance(v, str) else v for v in table.column(LINE_COLUMN).to_pylist()]
        return lines
    return []


def _snapshot_files(snap: OutputSnapshot) -> dict[str, bytes]:
    """Relative name -> bytes of every JSONL file ``snap`` counts (published whole, open up to its commit
    record), read now; published files gone meanwhile (uploaded, or removed by compaction's clean-up) are
    left out."""
    out: dict[str, bytes] = {}
    for rel in snap.published:
        path = snap.path(rel)
        try:
            out[rel] = path.read_bytes() if path is not None else None
        except FileNotFoundError:       # moved to its kept name between the two looks: look once more
            path = snap.path(rel)
            out[rel] = path.read_bytes() if path is not None else None
        if out[rel] is None:
            del out[rel]
    for rel in snap.open:
        out[rel] = snap.read_open(rel)
    return out


def staged_lines(outbox: str | Path) -> dict[str, bytes]:
    """Relative name -> complete lines of every file a local output folder's snapshot counts (published
    whole, open up to its commit record), read now; files gone meanwhile are left out (a file uploaded and
    removed meanwhile is in the later listing)."""
    out = {rel: data[: data.rfind(b"\n") + 1] for rel, data in _snapshot_files(output_snapshot(outbox)).items()}
    return {rel: data for rel, data in out.items() if data}


def object_output_snapshot(publisher, outbox: str | Path | None = None) -> S3OutputSnapshot:
    """The snapshot of the object output folder ``publisher`` publishes to (and of the region's staging
    folder ``outbox``, if given, e.g. ``region.joined_dir``); see the module docstring for the order and its
    guarantee. Raises :class:`photon.SourceError` for a missing bucket or unreachable endpoint."""
    publisher.check()
    local = staged_lines(outbox) if outbox is not None and Path(outbox).is_dir() else {}
    freshness: dict[str, int] = {}
    records = publisher.child(COMMITS_DIR)
    for o in records.objects():
        if not o.name.endswith(".json") or "/" in o.name:
            continue
        try:
            rec = orjson.loads(records.read(o.name))
            freshness[str(rec["writer"])] = int(rec["complete_us"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{records.url}/{o.name} is not a valid freshness record: {e}") from None
        except Exception as e:  # noqa: BLE001  (deleted between listing and reading: no record)
            if "NoSuchKey" not in str(e) and not isinstance(e, FileNotFoundError):
                raise
    listed = publisher.objects()            # after the records: every object they name is listed
    compacted: dict[str, dict] = {}
    in_parquet: set[str] = set()
    for part, entry in object_compaction_record(publisher).items():   # after the listing, as for a folder
        if object_compacted_folder(publisher, part, entry) is None:
            continue
        compacted[part] = entry
        in_parquet.update(f"{part}/{name}" for name in entry.get("files", []))
    objects = [o for o in listed if o.name.endswith(".jsonl") and not is_hidden(o.name) and o.name not in in_parquet]
    on_s3 = {o.name for o in objects} | in_parquet
    return S3OutputSnapshot(publisher.url, objects, {r: d for r, d in local.items() if r not in on_s3}, freshness,
                            publisher, compacted)


def s3_output_snapshot(url: str, outbox: str | Path | None = None, s3=None, client=None) -> S3OutputSnapshot:
    """:func:`object_output_snapshot` of the object output folder ``url`` (``s3://``, ``memory://``)."""
    return object_output_snapshot(storage_kind(url).publisher(url, s3, client=client), outbox)


def _parquet_files(folder: str | Path) -> list[Path]:
    """The Parquet files of a compacted partition's folder (as :attr:`OutputSnapshot.compacted` names it);
    a staging folder shown in the table since is looked up there."""
    folder = Path(folder)
    files = sorted(folder.rglob("*.parquet"))
    if not files and folder.parent.parent.parent.name == "_compacted":     # <root>/_compacted/g<N>/<part>
        part = f"{folder.parent.name}/{folder.name}"
        files = sorted((parquet_table(folder.parents[3]) / part).rglob("*.parquet"))
    return files


def compacted_lines(root: Path, rel_dir: str) -> list[bytes]:
    """The original lines held by a compacted partition's Parquet files (``rel_dir``: relative to ``root``,
    or absolute as :attr:`OutputSnapshot.compacted` gives it)."""
    import pyarrow.parquet as pq       # only when there is compacted output

    lines: list[bytes] = []
    for path in _parquet_files(Path(root) / rel_dir):
        table = pq.read_table(path, columns=[LINE_COLUMN])
        lines += [v.encode() if isinstance(v, str) else v for v in table.column(LINE_COLUMN).to_pylist()]
    return lines


def count_output_lines(directory: str | Path) -> int:
    """How many lines :func:`read_output_lines` would return, without holding them."""
    return storage_kind(directory).output_reader(os.fspath(directory)).count()


def _count_folder_lines(directory: Path) -> int:
    snap = output_snapshot(directory)
    total = 0
    if snap.compacted:
        import pyarrow.parquet as pq
        for folder in snap.compacted.values():
            total += sum(pq.ParquetFile(p).metadata.num_rows for p in _parquet_files(folder))
    for rel in snap.published:
        path = snap.path(rel)
        try:
            with open(path, "rb") if path is not None else open(os.devnull, "rb") as f:
                total += sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
        except FileNotFoundError:       # moved to its kept name meanwhile
            path = snap.path(rel)
            total += path.read_bytes().count(b"\n") if path is not None else 0
    for rel in snap.open:
        total += snap.read_open(rel).count(b"\n")
    return total


def _whole_lines(data: bytes) -> list[bytes]:
    return [line for line in data[: data.rfind(b"\n") + 1].split(b"\n") if line]


def read_output_lines(directory: str | Path, include_inprogress: bool = False, *, outbox: str | Path | None = None,
                      s3=None) -> list[bytes]:
    """Every committed line of the output folder ``directory`` (joined/ or unjoinable/): published files,
    the committed prefix of open files and compacted partitions, each line once (see the module docstring).
    With ``include_inprogress``, also the whole lines of open files written after their last commit record
    (for tests that look at what a writer has flushed, not what it has committed). An ``s3://`` folder gives
    the lines of its published objects and of ``outbox`` (the region's staging folder), if given."""
    reader = storage_kind(directory).output_reader(os.fspath(directory), s3, outbox=outbox)
    return reader.lines(include_inprogress)


def _read_folder_lines(directory: Path, include_inprogress: bool) -> list[bytes]:
    snap = output_snapshot(directory)
    lines: list[bytes] = []
    for part, rel_dir in sorted(snap.compacted.items()):
        lines += compacted_lines(snap.root, rel_dir)
    files = _snapshot_files(snap)
    if include_inprogress:
        for p in Path(directory).rglob(inprogress_name("*.jsonl")):
            rel = os.path.relpath(p.with_name(published_name(p.name)), directory)
            if rel not in files or rel in snap.open:
                try:
                    files[rel] = p.read_bytes()
                except FileNotFoundError:
                    continue
    for rel in sorted(files):
        lines += _whole_lines(files[rel])
    return lines


class OutputTailer:
    """Reads new committed lines of an output folder incrementally, as :class:`photon.LogTailer` reads
    input logs (same ``poll``/``pending_bytes``/``offsets`` face), honouring the commit records: a line is
    returned once its writer has committed it, well before its file is published.

    Offsets are keyed by the published relative path (an open file and its published self are one file).
    Compacted partitions are read from their JSONL files while those are kept; a compacted partition this
    tailer never started and whose JSONL is gone is read from its Parquet once (offset key
    ``<partition>/_compacted``).

    Over the folder of an object kind (``s3://``) it reads the published objects as they appear (listed
    incrementally through the kind's :class:`photon.Source`: a new object whose name sorts before the last
    one listed, or a deletion, is found by the next whole listing, within ``[s3].full_list_interval_s``);
    compacted partitions as above (kept JSONL objects under ``_compacted/``, else the Parquet once);
    ``freshness()`` gives each writer's ``complete_us`` from its record."""

    def __init__(self, root: str | Path, offsets: dict | None = None, read_bytes: int = 4 << 20, s3=None,
                 *, source=None, publisher=None) -> None:
        kind = storage_kind(root)
        self._source = source if source is not None or kind.in_place else kind.source(os.fspath(root), s3)
        self.root = kind.local_folder(os.fspath(root)) if self._source is None else os.fspath(root)
        self._publisher = publisher if publisher is not None or self._source is None else kind.publisher(
            os.fspath(root), getattr(self._source, "config", None), client=getattr(self._source, "client", None))
        self.offsets: dict[str, int] = dict(offsets or {})
        self.read_bytes = read_bytes
        self.open_files: set[str] = set()
        self._pending = 0

    def freshness(self) -> dict[str, int]:
        """Writer -> ``complete_us`` of its freshness record (S3 output; {} for a local folder)."""
        if self._source is None:
            return {}
        return object_output_snapshot(self._publisher).freshness

    def _object_targets(self, view: dict, chunks: list[LogChunk]) -> dict[str, tuple[str, int]]:
        """Published name -> (object to read it from, its size) for the objects of ``view``, honouring the
        compaction record (read after the listing): a compacted partition this tailer began is read on from
        its JSONL objects (listed or kept); one it never began is read from its Parquet once (appended to
        ``chunks``) and its JSONL skipped."""
        targets = {rel: (rel, info.size) for rel, info in view.items()
                   if rel.endswith(".jsonl") and not is_hidden(rel)}
        for part, entry in object_compaction_record(self._publisher).items():
            files = [f"{part}/{name}" for name in entry.get("files", [])]
            for rel in files:
                targets.pop(rel, None)
            if any(k.startswith(part + "/") and not k.endswith("/_compacted") for k in self.offsets):
                for rel in files:
                    kept = f"{entry.get('kept', '')}/{rel.rpartition('/')[2]}"
                    for name in (rel, kept):
                        if name in view:
                            targets[rel] = (name, view[name].size)
                            break
                continue
            key = f"{part}/_compacted"
            if key not in self.offsets and object_compacted_folder(self._publisher, part, entry) is not None:
                lines = object_compacted_lines(self._publisher, part, entry)
                self.offsets[key] = 1
                if lines:
                    chunks.append(LogChunk(key, [0] * len(lines), lines, 1))
        return targets

    def _poll_objects(self, max_bytes: int) -> list[LogChunk]:
        view = self._source.scan(self.offsets)
        chunks: list[LogChunk] = []
        budget, pending = max_bytes, 0
        for rel, (name, size) in sorted(self._object_targets(view, chunks).items()):
            start = self.offsets.get(rel, 0)
            if size <= start:
                continue
            if budget <= 0:
                pending += size - start
                continue
            try:
                data, _ = self._source.read(name, start, min(size - start, budget, self.read_bytes))
            except ObjectGone:
                continue
            chunk = self._chunk(rel, start, data)
            pending += size - start - (chunk.end - start if chunk else 0)
            if chunk is not None:
                budget -= chunk.end - start
                chunks.append(chunk)
        self._pending = pending
        return chunks

    def _chunk(self, rel: str, start: int, data: bytes) -> LogChunk | None:
        """The complete lines of ``data`` (read from ``rel`` at ``start``); moves the offset past them."""
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            return None
        lines = data[: cut - 1].split(b"\n")
        self.offsets[rel] = start + cut
        return LogChunk(rel, line_offsets(start, lines), lines, start + cut)

    def poll(self, max_bytes: int = 16 << 20) -> list[LogChunk]:
        if self._source is not None:
            return self._poll_objects(max_bytes)
        snap = output_snapshot(self.root)
        self.open_files = set(snap.open)
        chunks: list[LogChunk] = []
        budget, pending = max_bytes, 0
        ends = {rel: None for rel in snap.published}
        ends.update(snap.open)
        for part, rel_dir in sorted(snap.compacted.items()):
            chunk = self._compacted(part, rel_dir, snap)
            if chunk is not None:
                chunks.append(chunk)
        for part, entry in compaction_record(self.root).items():   # kept JSONL of a partition begun here
            if any(k.startswith(part + "/") and not k.endswith("/_compacted") for k in self.offsets):
                for name in entry.get("files", []):
                    ends.setdefault(f"{part}/{name}", None)
        paths: dict[str, Path] = {}
        for rel in sorted(ends):
            start = self.offsets.get(rel, 0)
            end = ends[rel]
            if end is None:
                path = resolve_published(self.root, rel)
                try:
                    end = os.path.getsize(path) if path is not None else None
                except FileNotFoundError:      # moved to its kept name meanwhile
                    path = resolve_published(self.root, rel)
                    end = os.path.getsize(path) if path is not None else None
                if end is None:
                    continue
                paths[rel] = path
            if end <= start:
                continue
            if budget <= 0:
                pending += end - start
                continue
            limit = min(end - start, budget, self.read_bytes)
            if rel in snap.open:
                data = snap.read_open(rel, start)[:limit]
            else:
                data = self._read_published(rel, paths[rel], start, limit)
            chunk = self._chunk(rel, start, data)
            cut = chunk.end - start if chunk is not None else 0
            pending += end - start - cut
            if chunk is None:
                continue
            budget -= cut
            chunks.append(chunk)
        self._pending = pending
        return chunks

    def _read_published(self, rel: str, path: Path, start: int, limit: int) -> bytes:
        for _ in range(2):      # moved to its kept name between the two looks: the rename is atomic
            try:
                with open(path, "rb") as f:
                    f.seek(start)
                    return f.read(limit)
            except FileNotFoundError:
                path = resolve_published(self.root, rel)
                if path is None:
                    break
        return b""

    def _compacted(self, part: str, rel_dir: str, snap: OutputSnapshot) -> LogChunk | None:
        key = f"{part}/_compacted"
        if key in self.offsets or any(k.startswith(part + "/") for k in self.offsets):
            return None
        lines = compacted_lines(self.root, rel_dir)
        self.offsets[key] = 1
        return LogChunk(key, [0] * len(lines), lines, 1) if lines else None

    def pending_bytes(self) -> int:
        """Committed bytes not yet returned, as of the last :meth:`poll`."""
        return self._pending


class FolderOutput:
    """The :class:`photon.OutputReader` of a local output folder (the file kind): published files, the
    committed prefix of open files and compacted partitions (see the module docstring)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.url = str(self.root)

    @property
    def folder(self) -> Path:
        """The local folder that holds the output (readers such as Spark may read its files in place)."""
        return self.root

    def snapshot(self) -> OutputSnapshot:
        return output_snapshot(self.root)

    def exists(self) -> bool:
        return self.root.is_dir()

    def lines(self, include_inprogress: bool = False) -> list[bytes]:
        return _read_folder_lines(self.root, include_inprogress)

    def count(self) -> int:
        return _count_folder_lines(self.root)

    def published(self) -> list[str]:
        """Every published JSONL file (relative names, sorted), those of compacted partitions included
        (:meth:`read` finds them at their kept name until ``[compact].keep_jsonl_s`` removes them)."""
        if not self.root.is_dir():
            return []
        snap = output_snapshot(self.root)
        record = compaction_record(self.root)
        compacted = [f"{part}/{name}" for part in snap.compacted for name in record.get(part, {}).get("files", [])]
        return sorted({*snap.published, *compacted})

    def read(self, name: str) -> bytes | None:
        for _ in range(2):      # moved to its kept name between the two looks
            path = resolve_published(self.root, name)
            if path is None:
                return None
            try:
                return path.read_bytes()
            except FileNotFoundError:
                continue
        return None

    def tailer(self, offsets: dict | None = None, read_bytes: int = 4 << 20) -> OutputTailer:
        return OutputTailer(self.root, offsets, read_bytes)

    def freshness(self) -> dict[str, int]:
        return {}


class ObjectOutput:
    """The :class:`photon.OutputReader` of an object kind's output folder (``s3://``, ``memory://``):
    published objects, plus what the region's staging folder ``outbox`` still holds when given (see the
    module docstring). ``publisher`` lists and reads the objects; ``source()`` makes the
    :class:`photon.Source` its tailers list incrementally."""

    def __init__(self, url: str, publisher, source, outbox: str | Path | None = None) -> None:
        self.url = url
        self.publisher = publisher
        self._source = source
        self.outbox = outbox

    folder = None
    """Not a local folder: objects are read through the kind (:meth:`snapshot`, :meth:`read`)."""

    def snapshot(self) -> S3OutputSnapshot:
        return object_output_snapshot(self.publisher, self.outbox)

    def exists(self) -> bool:
        self.publisher.check()
        return True

    def lines(self, include_inprogress: bool = False) -> list[bytes]:
        snap = self.snapshot()
        lines = [line for part in sorted(snap.compacted) for line in snap.compacted_lines(part)]
        for rel in snap.names():
            try:
                lines += _whole_lines(snap.read(rel))
            except FileNotFoundError:      # compacted since it was listed: its partition is in the record
                return self.lines(include_inprogress)
        return lines

    def count(self) -> int:
        return len(self.lines())

    def published(self) -> list[str]:
        """Every published JSONL object (relative names, sorted), those of compacted partitions included
        (:meth:`read` finds them at their kept name until ``[compact].keep_jsonl_s`` removes them)."""
        listed = {o.name for o in self.publisher.objects() if o.name.endswith(".jsonl") and not is_hidden(o.name)}
        for part, entry in object_compaction_record(self.publisher).items():
            listed.update(f"{part}/{name}" for name in entry.get("files", []))
        return sorted(listed)

    def read(self, name: str) -> bytes | None:
        part, _, base = name.rpartition("/")
        for _ in range(2):      # hidden by compaction between the two looks: the record names its kept name
            kept = object_compaction_record(self.publisher).get(part, {}).get("kept")
            for candidate in (name, f"{kept}/{base}" if kept else None):
                if candidate is None:
                    continue
                try:
                    return self.publisher.read(candidate)
                except FileNotFoundError:
                    continue
        return None

    def tailer(self, offsets: dict | None = None, read_bytes: int = 4 << 20) -> OutputTailer:
        return OutputTailer(self.url, offsets, read_bytes, source=self._source(), publisher=self.publisher)

    def freshness(self) -> dict[str, int]:
        return self.snapshot().freshness
