"""The verification job's lookup of lost ids reads only the foreign files that hold them (each id carries
the key of its file through the aggregation), and the report is the same as reading every file."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

import orjson
import pytest

import idregistry
from photon import IdGenerator, load_config, wait_until
from photon.app import read_recoverable, run_verify

GEN = IdGenerator("10.4.4.4", 4444)
FILES = 5


def click(cid: str, qid: str) -> bytes:
    return orjson.dumps({"click_id": cid, "query_id": qid, "ad": 1})


def write(path: Path, lines: list[bytes]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(x + b"\n" for x in lines))


def dead_token() -> str:
    p = subprocess.Popen(["true"])
    p.wait()
    return f"127.0.0.1:5000/{p.pid}/{time.time_ns() // 1000 - 10_000_000}/1"


def world(root: Path, lost_in: set[int]):
    """One region, :data:`FILES` click files of 20 clicks each, every click joined but two of each file in
    ``lost_in``, every click registered under a stopped joiner's token: those are lost and recoverable."""
    (root / "photon.toml").write_text('[[regions]]\nname = "a"\nlog_root = "logs"\noutput_root = "out"\n'
                                      'state_dir = "state"\n')
    (root / "out/unjoinable").mkdir(parents=True)
    q = GEN.next_id()
    files = [[GEN.next_id() for _ in range(20)] for _ in range(FILES)]
    lines = {}
    for k, ids in enumerate(files):
        write(root / f"logs/clicks/w0/c-{k}.jsonl", [click(i, q) for i in ids])
        lines.update((i, click(i, q).decode()) for i in ids)
    lost = [i for k in sorted(lost_in) for i in files[k][:2]]
    write(root / "out/joined/a-j0-1-000001.jsonl", [click(i, q) for ids in files for i in ids if i not in lost])
    reg = idregistry.InMemoryRegistry()
    reg.commit([i for ids in files for i in ids], dead_token())
    idregistry.export_registry(reg, root / "export")
    return load_config(root / "photon.toml"), lost, lines, files


def _text_files_read(spark, since: int) -> list[int]:
    """The "number of files read" of every text scan of the SQL executions after the first ``since`` but the
    counts' job (the one that writes: it reads every file, as text through the strict-shape scanner), that
    is the lookup's, once Spark's listener has recorded them."""
    store = spark._jsparkSession.sharedState().statusStore()

    def figures():
        executions = store.executionsList()
        out = []
        for i in range(since, executions.size()):
            execution = executions.apply(i)
            if execution.completionTime().isEmpty():
                return None
            values = store.executionMetrics(execution.executionId())
            nodes = store.planGraph(execution.executionId()).allNodes()
            names = [nodes.apply(j).name() for j in range(nodes.size())]
            if any(n == "WriteFiles" or n.startswith("Execute InsertIntoHadoopFsRelationCommand") for n in names):
                continue        # the counts' job
            for j in range(nodes.size()):
                node = nodes.apply(j)
                if node.name().startswith("Scan text"):
                    metrics = node.metrics()
                    for m in range(metrics.size()):
                        metric = metrics.apply(m)
                        value = values.get(metric.accumulatorId())
                        if metric.name() == "number of files read" and value.isDefined():
                            out.append(int(value.get().replace(",", "")))
        return out
    wait_until(lambda: figures() is not None, 30, message="Spark's listener recorded the run's executions")
    return figures()


@pytest.mark.parametrize("lost_in, files_read", [({3}, 1), ({1, 4}, 2), (set(range(FILES)), FILES)])
def test_the_lost_ids_lines_are_looked_up_only_in_the_files_that_hold_them(tmp_path, spark, lost_in, files_read):
    """Lost clicks in one file of five: the lookup reads that file alone; in two: those two; in every file:
    all of them (no filter). The report and the recoverable rows are the same either way."""
    config, lost, lines, _ = world(tmp_path, lost_in)
    since = spark._jsparkSession.sharedState().statusStore().executionsList().size()
    report = run_verify(config, spark, export_dir=tmp_path / "export")
    assert report.as_dict() == {"foreign_events": 100, "joined": 100 - len(lost), "duplicates": 0,
                                "lost": len(lost), "recoverable": len(lost), "pending": 0, "unjoinable": 0,
                                "wrongly_unjoinable": 0}
    rows = read_recoverable(report.recoverable_path)
    assert sorted((r["id"], r["raw"]) for r in rows) == sorted((i, lines[i]) for i in lost)
    assert _text_files_read(spark, since) == [files_read]


def test_an_id_its_files_key_does_not_find_again_is_looked_up_in_every_file(tmp_path, spark):
    """A lost click whose line in the file of its key is a JSON array of objects (Spark's JSON reader takes
    it as the click's line, the lookup's ``json_tuple`` does not) and which is logged plainly in another
    file: the lookup misses it in its key's file and finds it in a second scan of every file, so it is
    recoverable with its plain line, as when every file was read."""
    from pyspark.sql import functions as F
    config, lost, lines, _ = world(tmp_path, {2})
    paths = sorted(str(p) for p in (tmp_path / "logs/clicks/w0").iterdir())
    keys = {r.path: r.key for r in spark.read.text(paths).select(
        F.col("_metadata.file_path").alias("path"), F.xxhash64("_metadata.file_path").alias("key")).distinct()
        .collect()}
    by_key = sorted(paths, key=lambda p: next(k for path, k in keys.items() if path.endswith(Path(p).name)))
    home = str(tmp_path / "logs/clicks/w0/c-2.jsonl")         # where the other lost click stays
    first = by_key[0]                                          # the file of the smallest key
    other = next(p for p in reversed(by_key) if p not in (first, home))
    victim = lost[0]
    plain = lines[victim].encode()
    for path in (tmp_path / "logs/clicks/w0").iterdir():     # the victim's line only in those two, once each
        kept = [x for x in path.read_bytes().splitlines() if x != plain]
        if str(path) == first:
            kept.append(b"[" + plain + b"]")
        elif str(path) == other:
            kept.append(plain)
        write(path, kept)
    since = spark._jsparkSession.sharedState().statusStore().executionsList().size()
    report = run_verify(config, spark, export_dir=tmp_path / "export")
    assert report.as_dict()["lost"] == len(lost) and report.recoverable == len(lost)
    rows = {r["id"]: r["raw"] for r in read_recoverable(report.recoverable_path)}
    assert rows[victim] == lines[victim]
    assert _text_files_read(spark, since) == [len({first, home}), FILES]   # the keys' files, then every file
