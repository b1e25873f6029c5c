"""Reconciling the registry with the output at the end of ``photon run --until-caught-up``.

The dispatcher knows only that the registry holds an id (``already_registered``), never that the click is
in some output: an id can be registered and written nowhere (its joiner died between commit and write, its
write failed, a commit whose outcome stayed unknown took it, or a stopping joiner could record it nowhere).
So once a run has caught up, the launcher takes the registry export while the registry still runs
(:func:`take_export`, the same export as ``photon registry export``), stops the pipeline (every joiner
publishes its output), and :func:`reconcile` compares:

* the ids the export says were registered during this run (``registered_us`` at or after the run's start)
  under the token of one of this run's joiners (the token's ``host:port`` is a joiner address the launcher
  planned), with
* the ids of every pipeline region's joined output, read under the output contract
  (:meth:`photon.OutputReader.lines`: published files, committed prefixes, compacted partitions, S3
  objects plus the staging folder).

A registered id in no output is **lost**; every lost id is written, one a line, to
``<state_dir>/reconcile/lost-ids.txt`` of the launcher's first region. Ids registered by other launchers'
joiners (``photon run --region`` elsewhere) are not judged here: they may still be on their way to their
output. The comparison is columnar (pyarrow: ids are extracted from the output lines by its JSON reader
and matched with ``is_in``), a few seconds for a million ids; each step reports its progress.
"""
from __future__ import annotations

import io
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson

import idregistry
from photon import PhotonConfig

RECONCILE_DIR = "reconcile"
LOST_FILE = "lost-ids.txt"
SAMPLE = 10
JSON_BLOCK_BYTES = 16 << 20       # pyarrow's JSON reader needs every line inside one block


@dataclass(frozen=True)
class Reconciliation:
    """What :func:`reconcile` found. ``registered``: ids registered at or after ``since_us`` by this run's
    joiners; ``lost``: those in no region's joined output (``lost_by_region`` by the region of the joiner
    whose token holds them; ``lost_sample`` up to ten of them; all in ``lost_file``); ``output_ids``:
    distinct ids in the outputs read; ``error``: why it could not be done ("" when done; then the other
    figures are 0)."""
    since_us: int
    registered: int = 0
    lost: int = 0
    lost_by_region: dict = field(default_factory=dict)
    lost_sample: tuple = ()
    lost_file: str = ""
    output_ids: int = 0
    regions_read: tuple = ()
    seconds: float = 0.0
    error: str = ""

    def as_dict(self) -> dict:
        d = asdict(self)
        d["lost_sample"] = list(self.lost_sample)
        d["regions_read"] = list(self.regions_read)
        return d


def reconcile_dir(config: PhotonConfig, regions=None) -> Path:
    """``<state_dir>/reconcile`` of the first region a launcher of ``regions`` runs."""
    first = config.region(regions[0]) if regions else config.regions[0]
    return Path(first.state_dir) / RECONCILE_DIR


def take_export(config: PhotonConfig, out: Path) -> dict:
    """Export every registry shard into ``out`` (replacing an earlier export there); returns its manifest.
    Raises what the registry client raises when the registry cannot be reached."""
    shutil.rmtree(out, ignore_errors=True)
    client = idregistry.connect(idregistry.registry_endpoints(config))
    try:
        return idregistry.export_registry(client, out)
    finally:
        client.close()


def registered_since(export_dir: Path, since_us: int, joiners: dict[str, str]):
    """A pyarrow table ``(id, address)`` of the export's ids registered at or after ``since_us`` under the
    token of a joiner whose address is a key of ``joiners`` (address -> region)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    manifest = idregistry.check_export(export_dir)
    wanted = pa.array(sorted(joiners), pa.string())
    parts = []
    for entry in manifest["shards"].values():
        table = pq.read_table(export_dir / entry["file"], columns=["id", "token", "registered_us"])
        if "registered_us" not in table.column_names or table.num_rows == 0:
            continue
        table = table.filter(pc.greater_equal(table["registered_us"], since_us))
        address = pc.struct_field(pc.extract_regex(table["token"], r"^(?P<a>[^/]*)/"), [0])
        table = table.append_column("address", address).filter(pc.is_in(address, value_set=wanted))
        parts.append(table.select(["id", "address"]))
    if not parts:
        return pa.table({"id": pa.array([], pa.string()), "address": pa.array([], pa.string())})
    return pa.concat_tables(parts)


def ids_of_lines(lines: list[bytes], id_field: str):
    """The ``id_field`` values of JSON lines as a pyarrow string array (lines without it left out): by
    pyarrow's JSON reader, or line by line with orjson when a line is not valid JSON."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj
    if not lines:
        return pa.array([], pa.string())
    data = b"\n".join(lines) + b"\n"
    try:
        table = pj.read_json(io.BytesIO(data), read_options=pj.ReadOptions(block_size=JSON_BLOCK_BYTES),
                             parse_options=pj.ParseOptions(explicit_schema=pa.schema([(id_field, pa.string())]),
                                                           unexpected_field_behavior="ignore"))
        ids = table.column(id_field).combine_chunks()
        return pc.drop_null(ids)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        out = []
        for line in lines:
            try:
                value = orjson.loads(line).get(id_field)
            except (orjson.JSONDecodeError, AttributeError):
                continue
            if isinstance(value, str):
                out.append(value)
        return pa.array(out, pa.string())


def output_ids(config: PhotonConfig, echo=lambda msg: None):
    """Every pipeline region's joined-output ids (a pyarrow array, with repeats) and the regions read.
    A region whose local output folder does not exist here (run on another machine) is skipped."""
    import pyarrow as pa
    arrays, read = [], []
    for region in config.pipeline_regions:
        t0 = time.monotonic()
        reader = region.output_reader("joined", config.s3)
        if not reader.exists():
            echo(f"reconciling: region {region.name}: no output folder {region.joined_dir} here; not read")
            continue
        lines = reader.lines()
        foreign = config.join.foreign_ids
        if foreign.custom:          # the registry holds Photon keys (photon.EventIds): the key of each line
            ids = pa.array([k for k in map(foreign.key_of_line, lines) if k is not None], pa.string())
        else:
            ids = ids_of_lines(lines, config.join.foreign_id_field)
        del lines
        arrays.append(ids)
        read.append(region.name)
        echo(f"reconciling: region {region.name}: {len(ids)} joined ids read in {time.monotonic() - t0:.1f} s")
    return (pa.chunked_array(arrays, pa.string()) if arrays else pa.chunked_array([], pa.string())), read


def reconcile(config: PhotonConfig, export_dir: Path, since_us: int, joiners: dict[str, str],
              echo=lambda msg: None) -> Reconciliation:
    """Compare the export in ``export_dir`` with the output (see the module docstring); writes the lost ids
    into ``export_dir``'s parent, ``lost-ids.txt``. ``joiners``: address -> region of this run's joiners."""
    import pyarrow.compute as pc
    t0 = time.monotonic()
    registered = registered_since(export_dir, since_us, joiners)
    echo(f"reconciling: {registered.num_rows} id(s) registered by this run's joiners in the registry export "
         f"({time.monotonic() - t0:.1f} s)")
    outputs, read = output_ids(config, echo)
    output_set = pc.unique(outputs)
    lost = registered.filter(pc.invert(pc.is_in(registered["id"], value_set=output_set)))
    lost_ids = sorted(lost["id"].to_pylist())
    by_region: dict[str, int] = {}
    for address in lost["address"].to_pylist():
        by_region[joiners[address]] = by_region.get(joiners[address], 0) + 1
    lost_file = ""
    path = export_dir.parent / LOST_FILE
    path.unlink(missing_ok=True)          # an earlier run's list
    if lost_ids:
        path.write_text("".join(f"{i}\n" for i in lost_ids))
        lost_file = str(path)
    return Reconciliation(since_us=since_us, registered=registered.num_rows, lost=len(lost_ids),
                          lost_by_region=by_region, lost_sample=tuple(lost_ids[:SAMPLE]), lost_file=lost_file,
                          output_ids=len(output_set), regions_read=tuple(read),
                          seconds=round(time.monotonic() - t0, 2))
