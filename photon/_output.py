"""Reading Photon's output folders (joined/, unjoinable/) the way the output contract says (README "Output
contract"): published files, the committed prefix of open files, and compacted partitions, each line once.

A snapshot is taken in this order, which is what makes it exact while writers roll and compaction swaps:

1. the compaction record ``_compaction.json`` (which partitions are served from Parquet, and which of
   their JSONL files the Parquet holds);
2. every writer's commit record ``_committed/<writer>.json`` (open files and their committed bytes);
3. the listing of published ``*.jsonl`` files (folders and files starting with ``_`` or ``.`` skipped).

An open file that the listing already shows published is taken from the listing, whole; one still open is
taken up to its committed bytes (read from its hidden in-progress name, or from its published name if it
was published after the listing: the bytes are the same). A compacted partition's JSONL files named in
the record are taken from the Parquet, never from the JSONL (kept a while for readers that listed before
the swap); any other file there is taken as JSONL.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from photon._logs import COMMITS_DIR, LogChunk, inprogress_name

COMPACTION_RECORD = "_compaction.json"
"""``{"partitions": {"date=D/hour=H": {"path": "_compacted/g<N>/date=D/hour=H", "files": [names],
"at_us": t}}}``, replaced atomically by ``photon compact``."""
LINE_COLUMN = "_line"
"""Column of a compacted Parquet file holding each output line exactly as it was written."""


@dataclass
class OutputSnapshot:
    """What a reader following the contract counts in one output folder at one moment.

    ``published``: relative paths of published JSONL files to read whole; ``open``: relative published
    path -> committed bytes of files still being written; ``compacted``: partition -> relative Parquet
    folder."""
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


def read_json(path: Path) -> dict:
    try:
        return orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return {}
    except orjson.JSONDecodeError as e:      # never torn (atomic replace): a foreign file there
        raise ValueError(f"{path} is not a valid record: {e}") from None


def compaction_record(root: str | Path) -> dict:
    return read_json(Path(root) / COMPACTION_RECORD).get("partitions", {})


def output_snapshot(root: str | Path) -> OutputSnapshot:
    """The snapshot of output folder ``root`` (see the module docstring for the order and its guarantee)."""
    root = Path(root)
    snap = OutputSnapshot(root)
    compacted = compaction_record(root)
    in_parquet: set[str] = set()
    for part, entry in compacted.items():
        snap.compacted[part] = entry["path"]
        in_parquet.update(f"{part}/{name}" for name in entry.get("files", []))
    open_files: dict[str, int] = {}
    commits = root / COMMITS_DIR
    if commits.is_dir():
        for rec in sorted(commits.glob("*.json")):
            for rel, size in read_json(rec).get("open", {}).items():
                open_files[rel] = max(open_files.get(rel, 0), int(size))
    published: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(("_", ".")))
        rel_dir = os.path.relpath(dirpath, root)
        for name in filenames:
            if name.endswith(".jsonl") and not name.startswith(("_", ".")):
                rel = name if rel_dir == "." else f"{rel_dir}/{name}"
                if rel not in in_parquet:
                    published.append(rel)
    snap.published = sorted(published)
    listed = set(published)
    snap.open = {rel: size for rel, size in sorted(open_files.items())
                 if rel not in listed and rel not in in_parquet and size > 0}
    return snap


def compacted_lines(root: Path, rel_dir: str) -> list[bytes]:
    """The original lines held by a compacted partition's Parquet files."""
    import pyarrow.parquet as pq       # only when there is compacted output

    lines: list[bytes] = []
    for path in sorted((root / rel_dir).rglob("*.parquet")):
        table = pq.read_table(path, columns=[LINE_COLUMN])
        lines += [v.encode() if isinstance(v, str) else v for v in table.column(LINE_COLUMN).to_pylist()]
    return lines


def count_output_lines(directory: str | Path) -> int:
    """How many lines :func:`read_output_lines` would return, without holding them."""
    snap = output_snapshot(directory)
    total = 0
    if snap.compacted:
        import pyarrow.parquet as pq
        for rel_dir in snap.compacted.values():
            total += sum(pq.ParquetFile(p).metadata.num_rows for p in (snap.root / rel_dir).rglob("*.parquet"))
    for rel in snap.published:
        try:
            with open(snap.root / rel, "rb") as f:
                total += sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
        except FileNotFoundError:
            continue
    for rel in snap.open:
        total += snap.read_open(rel).count(b"\n")
    return total


def _whole_lines(data: bytes) -> list[bytes]:
    return [line for line in data[: data.rfind(b"\n") + 1].split(b"\n") if line]


def read_output_lines(directory: str | Path, include_inprogress: bool = False) -> list[bytes]:
    """Every committed line of the output folder ``directory`` (joined/ or unjoinable/): published files,
    the committed prefix of open files and compacted partitions, each line once (see the module docstring).
    With ``include_inprogress``, also the whole lines of open files written after their last commit record
    (for tests that look at what a writer has flushed, not what it has committed)."""
    snap = output_snapshot(directory)
    lines: list[bytes] = []
    for part, rel_dir in sorted(snap.compacted.items()):
        lines += compacted_lines(snap.root, rel_dir)
    files: dict[str, bytes] = {}
    for rel in snap.published:
        try:
            files[rel] = (snap.root / rel).read_bytes()
        except FileNotFoundError:       # removed by compaction's clean-up after the listing
            continue
    for rel in snap.open:
        files[rel] = snap.read_open(rel)
    if include_inprogress:
        for p in Path(directory).rglob(inprogress_name("*.jsonl")):
            rel = os.path.relpath(p.with_name(p.name[1: -len(".inprogress")]), directory)
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
    ``<partition>/_compacted``)."""

    def __init__(self, root: str | Path, offsets: dict | None = None, read_bytes: int = 4 << 20) -> None:
        self.root = Path(root)
        self.offsets: dict[str, int] = dict(offsets or {})
        self.read_bytes = read_bytes
        self.open_files: set[str] = set()
        self._pending = 0

    def poll(self, max_bytes: int = 16 << 20) -> list[LogChunk]:
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
                    if (self.root / part / name).exists():
                        ends.setdefault(f"{part}/{name}", None)
        for rel in sorted(ends):
            start = self.offsets.get(rel, 0)
            end = ends[rel]
            if end is None:
                try:
                    end = os.path.getsize(self.root / rel)
                except FileNotFoundError:
                    continue
            if end <= start:
                continue
            if budget <= 0:
                pending += end - start
                continue
            limit = min(end - start, budget, self.read_bytes)
            if rel in snap.open:
                data = snap.read_open(rel, start)[:limit]
            else:
                with open(self.root / rel, "rb") as f:
                    f.seek(start)
                    data = f.read(limit)
            cut = data.rfind(b"\n") + 1
            pending += end - start - cut
            if cut == 0:
                continue
            lines = data[: cut - 1].split(b"\n")
            offsets, pos = [], start
            for line in lines:
                offsets.append(pos)
                pos += len(line) + 1
            self.offsets[rel] = start + cut
            budget -= cut
            chunks.append(LogChunk(rel, offsets, lines, start + cut))
        self._pending = pending
        return chunks

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
