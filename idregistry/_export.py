"""Exporting the registry as Parquet (``photon registry export``) and clearing the tokens of ids found in the
output (``photon registry clear-tokens``).

Export layout, one folder per export::

    DIR/shard-<s>.parquet     columns id (string), token (string, "" once cleared), timestamp_us (int64),
                              registered_us (int64)
    DIR/_export.json          {"format": 2, "shards": {"<s>": {"rows": n, "file": "shard-<s>.parquet"}},
                               "started_at_us", "finished_at_us"}

Each shard's file is one consistent copy of that shard (every id committed before its export began, as of
one position of its Raft log; see :meth:`RegistryClient.export`); shards are exported one after the other,
so two shards' copies are from slightly different moments. A shard file is written under a dot-name and
renamed when complete, and the manifest is written last: a folder without ``_export.json``, or whose
files do not hold the row counts it states, is not a complete export (:func:`check_export` says so).
``timestamp_us`` is the id's own time. ``registered_us`` is when the id was registered: the time the
shard's leader first committed the id's token (a token names one join request, so this is that request's
commit; the registry keeps one time per live token, not per id, see :mod:`idregistry._state`). It is 0
when unknown: a cleared token (the id is in the output), or a commit made before times were recorded.
Format 1 exports (no ``registered_us``) are still readable. The pipeline keeps running while an export
streams.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path


from photon import PhotonConfig, fsync_path, write_atomic

MANIFEST = "_export.json"
EXPORT_FORMAT = 2
READABLE_FORMATS = (1, 2)        # format 1: no registered_us column
ROWS_PER_GROUP = 100_000
CLEARED_STATE = "tokens-cleared.json"
CLEAR_BATCH = 5000


class ExportError(Exception):
    """An export folder that is missing, incomplete or unreadable; the message names the file."""


def _schema():
    import pyarrow as pa
    return pa.schema([("id", pa.string()), ("token", pa.string()), ("timestamp_us", pa.int64()),
                      ("registered_us", pa.int64())])


def export_shard(client, shard: int, path: Path) -> int:
    """Stream one shard's entries into ``path`` (Parquet, written as ``.<name>.tmp`` then renamed);
    returns the row count."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    tmp = path.with_name(f".{path.name}.tmp")
    rows = 0
    schema = _schema()
    with pq.ParquetWriter(tmp, schema) as writer:
        ids, tokens, stamps, registered = [], [], [], []

        def flush():
            writer.write_table(pa.table([ids, tokens, stamps, registered], schema=schema))
            ids.clear(), tokens.clear(), stamps.clear(), registered.clear()

        for event_id, token, ts, reg in client.export_rows(shard):
            ids.append(event_id)
            tokens.append(token)
            stamps.append(ts)
            registered.append(reg)
            if len(ids) >= ROWS_PER_GROUP:
                rows += len(ids)
                flush()
        rows += len(ids)
        if ids or rows == 0:
            flush()
    fsync_path(tmp)
    os.replace(tmp, path)
    fsync_path(path.parent)              # the rename too: a power loss never brings back an older export
    return rows


def export_registry(client, out: str | Path, on_shard=None) -> dict:
    """Export every shard of the registry ``client`` talks to into ``out`` (created if needed); returns
    the manifest. ``on_shard(shard, rows)`` is called after each shard."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).unlink(missing_ok=True)
    started = time.time_ns() // 1000
    shards = {}
    for shard in client.shards():
        name = f"shard-{shard}.parquet"
        rows = export_shard(client, shard, out / name)
        shards[str(shard)] = {"rows": rows, "file": name}
        if on_shard is not None:
            on_shard(shard, rows)
    manifest = {"format": EXPORT_FORMAT, "shards": shards, "started_at_us": started,
                "finished_at_us": time.time_ns() // 1000}
    write_atomic(out / MANIFEST, json.dumps(manifest, indent=1).encode(), durable=True)
    return manifest


def check_export(out: str | Path) -> dict:
    """The manifest of a complete export folder, after checking every shard file is a readable Parquet
    file holding the rows the manifest states; raises :class:`ExportError` naming what is wrong."""
    import pyarrow.parquet as pq
    out = Path(out)
    try:
        manifest = json.loads((out / MANIFEST).read_text())
    except FileNotFoundError:
        raise ExportError(f"{out}: not a complete registry export (no {MANIFEST})") from None
    except (OSError, ValueError) as e:
        raise ExportError(f"{out / MANIFEST}: unreadable export manifest: {e}") from None
    if manifest.get("format") not in READABLE_FORMATS or not isinstance(manifest.get("shards"), dict):
        raise ExportError(f"{out / MANIFEST}: not an export manifest of format {' or '.join(map(str, READABLE_FORMATS))}")
    for shard, entry in manifest["shards"].items():
        path = out / entry["file"]
        try:
            rows = pq.ParquetFile(path).metadata.num_rows
        except FileNotFoundError:
            raise ExportError(f"{path}: shard {shard}'s export file is missing") from None
        except Exception as e:       # pyarrow raises ArrowInvalid / OSError for a truncated or foreign file
            raise ExportError(f"{path}: shard {shard}'s export file is not readable Parquet: {e}") from None
        if rows != entry["rows"]:
            raise ExportError(f"{path}: holds {rows} rows, the manifest says {entry['rows']}")
    return manifest


def output_ids(data: bytes, ids) -> list[str]:
    """The registry's keys of the clicks in one published output file (``ids``: the foreign stream's
    photon.EventIds: the id itself for Photon ids, ``<id>:0:<time_us>`` for custom ones); lines that do not
    parse are skipped."""
    return [k for k in map(ids.key_of_line, data.splitlines()) if k is not None]


def clear_output_tokens(config: PhotonConfig, client, regions=None) -> dict:
    """Clear the registry tokens of every id in the published joined output files of every region (or of
    the regions named in ``regions``) that an earlier run has not gone through yet (remembered in ``<registry data dir>/tokens-cleared.json``).
    Returns ``{"files", "ids", "cleared"}``. A cleared id stays held (never joined again) but can no
    longer be deleted by recovery: only ids already in the output are cleared."""
    state_path = config.registry_data_dir / CLEARED_STATE
    try:
        done = set(json.loads(state_path.read_text()))
    except FileNotFoundError:
        done = set()
    files = ids_seen = cleared = 0
    for region in config.regions:
        if regions is not None and region.name not in regions:
            continue
        output = region.output_reader("joined", config.s3)
        if not output.exists():
            continue
        for name in output.published():
            path = f"{output.url}/{name}"
            if path in done:
                continue
            data = output.read(name)
            if data is None:        # gone since it was listed
                continue
            ids = output_ids(data, config.join.foreign_ids)
            for k in range(0, len(ids), CLEAR_BATCH):
                cleared += client.clear_tokens(ids[k:k + CLEAR_BATCH])
            ids_seen += len(ids)
            files += 1
            done.add(str(path))
    state_path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(state_path, json.dumps(sorted(done)).encode(), durable=True)
    return {"files": files, "ids": ids_seen, "cleared": cleared}
