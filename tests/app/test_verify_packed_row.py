"""The per-id aggregation's packed rows (an id and one long: the row's kind, its region and its file's key) hold
the same result as the rows of one column per kind, on random inputs of one to five regions: every row of
``_per_id`` (regions, joined lines, unjoinable regions, registered, lost, everywhere, bad, file key), with
region bit masks and with sets of region indexes, with and without a time window."""
from __future__ import annotations

import random

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from photon import IdGenerator, load_config
from photon.app import _verify as verify

GEN = IdGenerator("10.5.5.5", 5151)


def write(path, lines: list[bytes]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(x + b"\n" for x in lines))


def make_world(root, regions):
    (root / "photon.toml").write_text("".join(
        f'[[regions]]\nname = "{r}"\nlog_root = "logs/{r}"\noutput_root = "out/{r}"\nstate_dir = "state/{r}"\n'
        for r in regions))
    return load_config(root / "photon.toml")


def _line(cid: str) -> bytes:
    return orjson.dumps({"click_id": cid, "query_id": "q", "ad": 1})


def _world(root, spark, rnd: random.Random):
    """A random world: ``(config, outputs, foreign, export files, ids)``. Foreign lines in one to three files
    per region and in a DataFrame of lines (no file: the packed row's kind without a file key), clicks in
    several regions and files, logged twice, joined zero to three times, unjoinable in some regions, lines
    without the id or with a malformed one (in the input and in the output), registered with a token, with
    none, or registered and never logged."""
    names = [f"r{i}" for i in range(rnd.choice((1, 2, 3, 5)))]
    config = make_world(root, regions=names)
    ids = [GEN.next_id() for _ in range(150)] + ["no-colons", "a:0:0000000000000001", "x:1:12"]
    foreign, outputs = [], []
    for index, r in enumerate(names):
        files = [[] for _ in range(rnd.randint(1, 3))]
        frame = []
        for cid in ids:
            if rnd.random() < 0.45:
                for _ in range(rnd.choice((1, 1, 2))):
                    rnd.choice(files + [frame]).append(_line(cid))
        for f in files + [frame]:
            f += [b"not json", orjson.dumps({"query_id": "q"})] if rnd.random() < 0.5 else []
            rnd.shuffle(f)
        paths = []
        for k, lines in enumerate(files):
            path = root / f"logs/{r}/clicks/w0/f{k}.jsonl"
            write(path, lines)
            paths.append(str(path))
        lines_df = spark.createDataFrame([(x.decode(),) for x in frame], "value string")
        foreign.append((index, verify._Lines(files=paths, frames=[lines_df])))
        for kind in ("joined", "unjoinable"):
            out = [_line(cid) for cid in ids for _ in range(rnd.choice((0, 0, 0, 1, 1, 2)))]
            if rnd.random() < 0.3:
                out.append(orjson.dumps({"query_id": "q"}))        # no id: bad
            path = root / f"out/{r}/{kind}/o.jsonl"
            write(path, out)
            outputs.append((index, r, kind, verify._Lines(files=[str(path)])))
    registered = [cid for cid in ids + [GEN.next_id() for _ in range(10)] if rnd.random() < 0.5]
    tokens = [rnd.choice(("h:1/2/3/4", "h:1/2/3/5", None)) for _ in registered]
    export = root / "export.parquet"
    pq.write_table(pa.table({"id": registered, "token": tokens,
                             "registered_us": [rnd.randint(1, 10**15) for _ in registered]}), export)
    return config, outputs, foreign, [str(export)], ids


def _rows(spark, config, outputs, foreign, export_files, window) -> list:
    rows = verify._per_id(spark, config, export_files, *window, outputs, foreign).collect()
    return sorted((tuple(r) for r in rows), key=lambda r: (r[0] is None, r[0] or "", repr(r)))


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_packed_rows_give_every_per_id_row_of_the_unpacked_ones(tmp_path, spark, monkeypatch, seed):
    rnd = random.Random(seed)
    config, outputs, foreign, export_files, ids = _world(tmp_path, spark, rnd)
    times = sorted(int(i[-16:]) for i in ids if i.count(":") == 2 and i[-16:].isdigit())
    windows = [(None, None), (times[len(times) // 3], times[2 * len(times) // 3])]
    packed_regions = verify.PACKED_REGIONS
    for mask_regions in (verify.MASK_REGIONS, 0):
        monkeypatch.setattr(verify, "MASK_REGIONS", mask_regions)
        for window in windows:
            monkeypatch.setattr(verify, "PACKED_REGIONS", packed_regions)
            packed = _rows(spark, config, outputs, foreign, export_files, window)
            monkeypatch.setattr(verify, "PACKED_REGIONS", 0)        # the rows of one column per kind
            unpacked = _rows(spark, config, outputs, foreign, export_files, window)
            assert packed == unpacked, (mask_regions, window)
            # the inputs reached every kind of row: the comparison is not over empty columns
            assert any(r[1] for r in packed) and any(r[2] for r in packed) and any(r[3] for r in packed)
            assert any(r[4] for r in packed) and any(r[5] for r in packed) and any(r[8] is not None for r in packed)
            if window == (None, None):
                assert any(r[7] for r in packed)
                # an id only in the lines of no file is in its regions, with no file key
                assert any(r[1] and r[8] is None for r in packed)


def test_the_packed_file_key_is_the_lookups_key_of_a_file_holding_the_id(tmp_path, spark):
    """Each id's ``file`` (from the packed row's upper bits) is the key :func:`_file_key` gives one of the
    local foreign files holding the id (the smallest), as the lookup filters on it."""
    config, outputs, foreign, export_files, ids = _world(tmp_path, spark, random.Random(7))
    rows = verify._per_id(spark, config, export_files, None, None, outputs, foreign).collect()
    holding = {}
    for _, lines in foreign:
        for r in spark.read.text(lines.files).select("value", verify._file_key().alias("key")).collect():
            try:
                cid = orjson.loads(r.value).get("click_id")
            except orjson.JSONDecodeError:
                continue
            if cid is not None:
                holding.setdefault(cid, set()).add(r.key)
    assert holding
    for r in rows:
        if r.id in holding:
            assert r.file == min(holding[r.id]), r
        else:
            assert r.file is None, r
    keys = [k for v in holding.values() for k in v]
    assert all(-(1 << 47) <= k < (1 << 47) for k in keys)     # 48 bits: above the kind and region in a long
