"""``photon verify`` and ``photon recover`` on hand-made inputs: two regions counted together, bad input named
(never "0 lost"), and recovery's refusals (a live joiner's token, a changed token) against a real registry."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import orjson
import pytest

import idregistry
from photon import IdGenerator, load_config
from photon.app import VerifyInputError, read_recoverable, run_recover, run_verify

GEN = IdGenerator("10.3.3.3", 4343)


def click(cid: str, qid: str) -> bytes:
    return orjson.dumps({"click_id": cid, "query_id": qid, "ad": 1})


def write(path: Path, lines: list[bytes]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(x + b"\n" for x in lines))


def make_world(root: Path, regions=("a", "b"), registry_lines: str = "") -> object:
    text = registry_lines + "".join(
        f'[[regions]]\nname = "{r}"\nlog_root = "logs/{r}"\noutput_root = "out/{r}"\nstate_dir = "state/{r}"\n'
        for r in regions)
    (root / "photon.toml").write_text(text)
    for r in regions:
        (root / "out" / r).mkdir(parents=True, exist_ok=True)
    return load_config(root / "photon.toml")


def dead_token(seq: int = 1) -> str:
    p = subprocess.Popen(["true"])
    p.wait()
    return f"127.0.0.1:5000/{p.pid}/{time.time_ns() // 1000 - 10_000_000}/{seq}"


def live_token(seq: int = 1) -> str:
    return f"127.0.0.1:5001/{os.getpid()}/{time.time_ns() // 1000}/{seq}"


@pytest.mark.parametrize("lookup", ["on_driver", "joins_in_spark"])
def test_two_regions_are_counted_together_and_a_cross_region_duplicate_is_named(tmp_path, spark, lookup,
                                                                                monkeypatch):
    if lookup == "joins_in_spark":     # more ids needing more than the driver takes: the same by joins
        monkeypatch.setattr("photon.app._verify.LOOKUP_ON_DRIVER", 0)
    config = make_world(tmp_path)
    q = [GEN.next_id() for _ in range(6)]
    c = [GEN.next_id() for _ in range(6)]
    clicks = [click(c[i], q[i]) for i in range(6)]
    for r in ("a", "b"):                              # each region logs every click (one twice)
        write(tmp_path / f"logs/{r}/clicks/w0/f.jsonl", clicks + [clicks[0], b"not json"])
        write(tmp_path / f"logs/{r}/queries/w0/f.jsonl", [orjson.dumps({"query_id": x}) for x in q])
    # and a click whose id has no timestamp: counted nowhere, also in a run given a time window
    write(tmp_path / "logs/a/clicks/w0/g.jsonl", [click("x:1:12", q[0])])
    write(tmp_path / "out/a/joined/a-j0-1-000001.jsonl", [clicks[0], clicks[1]])
    write(tmp_path / "out/b/joined/b-j0-1-000001.jsonl", [clicks[2], clicks[1]])    # c1 in both regions
    write(tmp_path / "out/a/unjoinable/x.jsonl", [clicks[5], clicks[4]])
    write(tmp_path / "out/b/unjoinable/x.jsonl", [clicks[5]])                       # c5: everywhere
    reg = idregistry.InMemoryRegistry()
    reg.commit([c[0], c[1], c[2]], live_token())
    reg.commit([c[3]], dead_token())
    idregistry.export_registry(reg, tmp_path / "export")
    store = spark.sparkContext._jsc.sc().statusStore()
    settings = ("spark.sql.adaptive.enabled", "spark.sql.execution.bypassPartialAggregation")
    jobs_before, before = store.jobsList(None).size(), [spark.conf.get(k, None) for k in settings]
    report = run_verify(config, spark, export_dir=tmp_path / "export")
    assert report.as_dict() == {"foreign_events": 6, "joined": 3, "duplicates": 1, "lost": 1, "recoverable": 1,
                                "pending": 0, "unjoinable": 2, "wrongly_unjoinable": 1}
    assert [spark.conf.get(k, None) for k in settings] == before      # the shared session's settings back
    if lookup == "on_driver":      # the counts (writing the ids needing more), the lookup, the primaries
        jobs = [store.jobsList(None).apply(i) for i in range(store.jobsList(None).size() - jobs_before)]
        # once with the strict-shape scanner too: the driver's sample of the inputs finds their "not json"
        # lines, so those files go to the JSON reader in the counts' only run (photon.app._verify._Scan)
        assert len(jobs) == 3, [j.name() for j in jobs]
    assert report.duplicate_ids == ((c[1], 2),)
    rows = read_recoverable(report.recoverable_path)
    assert [(r["id"], r["raw"]) for r in rows] == [(c[3], clicks[3].decode())]
    window = run_verify(config, spark, export_dir=tmp_path / "export", since_us=int(c[2][-16:]),
                        until_us=int(c[4][-16:]))
    assert (window.foreign_events, window.joined, window.lost, window.duplicates) == (2, 1, 1, 0)


@pytest.mark.parametrize("breakage, message", [
    ("missing_region", "region b: folder .*logs/b/clicks does not exist"),
    ("corrupt_joined", r"region a: joined output line without a readable 'click_id' in .*a-j0-1-000001.jsonl "
                       r"at byte 46"),
    ("truncated_export", "shard-0.parquet: shard 0's export file is not readable Parquet"),
])
def test_bad_input_is_named_never_counted_as_nothing_lost(tmp_path, spark, breakage, message):
    config = make_world(tmp_path)
    a, b = GEN.next_id(), GEN.next_id()
    for r in ("a", "b"):
        write(tmp_path / f"logs/{r}/clicks/f.jsonl", [click(a, a), click(b, b)])
    write(tmp_path / "out/a/joined/a-j0-1-000001.jsonl", [orjson.dumps({"click_id": a})])
    reg = idregistry.InMemoryRegistry()
    reg.commit([a, b], dead_token())
    idregistry.export_registry(reg, tmp_path / "export")
    if breakage == "missing_region":
        (tmp_path / "logs/b/clicks/f.jsonl").unlink()
        (tmp_path / "logs/b/clicks").rmdir()
    elif breakage == "corrupt_joined":
        with open(tmp_path / "out/a/joined/a-j0-1-000001.jsonl", "ab") as f:
            f.write(b'{"click_id": "torn\n')
    else:
        path = tmp_path / "export/shard-0.parquet"
        path.write_bytes(path.read_bytes()[:-30])
    with pytest.raises(VerifyInputError, match=message):
        run_verify(config, spark, export_dir=tmp_path / "export")


def test_recover_never_deletes_a_live_joiners_id_nor_one_whose_token_changed(tmp_path, spark, procs):
    from tests.idregistry.registry_helpers import Cluster
    config = make_world(tmp_path, regions=("a",), registry_lines='[registry]\nreplicas = 3\n')
    cluster = Cluster(config, procs)
    cluster.start_missing()
    client = cluster.client = idregistry.RegistryClient(cluster.endpoints(), retry_timeout_s=30)
    try:
        cluster.wait_leader()
        live, changed, dead = GEN.next_id(), GEN.next_id(), GEN.next_id()
        write(tmp_path / "logs/a/clicks/f.jsonl", [click(i, i) for i in (live, changed, dead)])
        live_t, dead_t = live_token(), dead_token()
        client.commit([live], live_t)
        client.commit([changed, dead], dead_t)
        report = run_verify(config, spark)            # takes its own export from the running registry
        assert (report.lost, report.recoverable) == (3, 2)
        assert client.delete(changed, dead_t) and client.commit([changed], "another/1/2/3") == [0]
        done = run_recover(config, report.recoverable_path, dry_run=True)
        assert (done.candidates, done.deleted) == (2, 0) and client.lookup([dead]) == [True]
        done = run_recover(config, report.recoverable_path)
        assert (done.candidates, done.deleted, done.token_changed, done.reinjected) == (2, 1, 1, 1)
        exported = {i: t for i, t, _ in client.export(0)}
        assert exported == {live: live_t, changed: "another/1/2/3"}
        recovered = list((tmp_path / "logs/a/clicks-recovery").glob("*.jsonl"))
        assert [f.read_bytes() for f in recovered] == [click(dead, dead) + b"\n"]
        # the live joiner's id is never recoverable, whatever verify saw: recover re-judges it
        forged = tmp_path / "forged"
        import pyarrow as pa
        import pyarrow.parquet as pq
        forged.mkdir()
        pq.write_table(pa.table({"id": [live], "token": [live_t], "raw": [click(live, live).decode()],
                                 "ref": [live], "reason": ["its joiner is no longer running"]}),
                       forged / "part-0.parquet")
        done = run_recover(config, forged)
        assert (done.joiner_alive, done.deleted) == (1, 0) and client.lookup([live]) == [True]
    finally:
        client.close()


def test_liveness_verdicts_alive_stopped_unseen():
    from photon.app._liveness import ALIVE, STOPPED, UNSEEN, Observation, judge
    now = 1_763_712_000_000_000
    seen = Observation(now, frozenset({"127.0.0.1"}), {100: (now - 5_000_000, False), 101: (now, False),
                                                       102: (now - 9_000_000, True)},
                       {("10.8.0.1:7000", 7): now - 1_000_000, ("10.8.0.1:7000", 8): now - 400_000_000})
    grace = 300_000_000
    assert judge(f"127.0.0.1:5000/100/{now - 5_000_000}", seen, grace) == ALIVE
    assert judge(f"127.0.0.1:5000/101/{now - 60_000_000}", seen, grace) == STOPPED    # pid reused later
    assert judge(f"127.0.0.1:5000/102/{now - 9_000_000}", seen, grace) == STOPPED     # a zombie
    assert judge(f"127.0.0.1:5000/103/{now}", seen, grace) == STOPPED                 # gone
    assert judge("10.8.0.1:7000/7/1", seen, grace) == ALIVE                          # fresh status file
    assert judge("10.8.0.1:7000/8/1", seen, grace) == STOPPED                        # stale status file
    assert judge("10.8.0.1:7000/9/1", seen, grace) == UNSEEN                         # no status file
    assert judge("not-a-token", seen, grace) == UNSEEN


def test_lost_clicks_of_unseen_joiners_are_recoverable_only_after_lost_after_s(tmp_path, spark):
    """Registration time from the export decides for joiners this host cannot see; a joiner seen running
    (fresh status file) keeps its clicks however old; recover judges the same way and deletes only those."""
    from photon import FakeClock, write_atomic
    config = make_world(tmp_path, regions=("a",), registry_lines="[verify]\nlost_after_s = 600\n")
    now = time.time_ns() // 1000
    clock = FakeClock(now - 3600 * 10**6)
    reg = idregistry.InMemoryRegistry(clock=clock)
    old_unseen, old_seen, new_unseen = GEN.next_id(), GEN.next_id(), GEN.next_id()
    write(tmp_path / "logs/a/clicks/f.jsonl", [click(i, i) for i in (old_unseen, old_seen, new_unseen)])
    reg.commit([old_unseen], "10.77.0.1:7000/41/1/1")          # an hour ago, by joiners on another host
    reg.commit([old_seen], "10.77.0.2:7000/42/1/1")
    clock.set(now)
    reg.commit([new_unseen], "10.77.0.1:7000/41/1/2")          # just now
    status = tmp_path / "state/a/joiners/a-j9.json"            # the second joiner writes its status file
    status.parent.mkdir(parents=True)
    write_atomic(status, orjson.dumps({"address": "10.77.0.2:7000", "pid": 42, "written_at_us": now}))
    idregistry.export_registry(reg, tmp_path / "export")
    report = run_verify(config, spark, export_dir=tmp_path / "export")
    assert (report.lost, report.recoverable) == (3, 1)
    rows = read_recoverable(report.recoverable_path)
    assert [(r["id"], r["reason"]) for r in rows] == [
        (old_unseen, "registered over [verify].lost_after_s ago by a joiner that cannot be seen")]
    assert now - 3601 * 10**6 <= rows[0]["registered_us"] <= now - 3599 * 10**6
    done = run_recover(config, report.recoverable_path, client=reg)
    assert (done.candidates, done.deleted, done.reinjected) == (1, 1, 1)
    assert reg.lookup([old_unseen, old_seen, new_unseen]) == [False, True, True]
    forged = [dict(rows[0], id=new_unseen, token="10.77.0.1:7000/41/1/2", registered_us=now)]
    import pyarrow as pa
    import pyarrow.parquet as pq
    (tmp_path / "forged").mkdir()
    pq.write_table(pa.Table.from_pylist(forged), tmp_path / "forged" / "part-0.parquet")
    done = run_recover(config, tmp_path / "forged", client=reg)     # recover re-judges: too recent
    assert (done.joiner_alive, done.deleted) == (1, 0) and reg.lookup([new_unseen]) == [True]


def test_compacted_partitions_are_read_by_spark_from_parquet_never_through_the_driver(tmp_path, spark, monkeypatch):
    from photon import output_snapshot, parse_config
    from photon.app import compact
    import photon.app._verify as verify
    root = tmp_path
    config = parse_config({"regions": [{"name": "a", "log_root": str(root / "a" / "logs"),
                                        "output_root": str(root / "a" / "out"), "state_dir": str(root / "a" / "state")}],
                           "sql": {"foreign_schema": "click_id STRING, query_id STRING, ad BIGINT",
                                   "primary_schema": "query_id STRING"},
                           "compact": {"close_after_s": 0, "keep_jsonl_s": 0}}, str(root / "photon.toml"), root)
    region = config.regions[0]
    q = [GEN.next_id() for _ in range(40)]
    c = [GEN.next_id() for _ in range(40)]
    clicks = [click(c[i], q[i]) for i in range(40)]
    write(root / "a/logs/clicks/w0/f.jsonl", clicks)
    write(root / "a/logs/queries/w0/f.jsonl", [orjson.dumps({"query_id": x}) for x in q])
    for h in range(2):                                 # 30 joined in two closed hours, one of them twice
        write(region.joined_dir / f"date=2024-05-01/hour={h:02d}/a-j0-1-{h:06d}.jsonl",
              clicks[15 * h:15 * h + 15] + ([clicks[0]] if h else []))
    compact(config, spark=spark)
    assert len(output_snapshot(region.joined_dir).compacted) == 2
    monkeypatch.setattr(verify, "compacted_lines", lambda *a: pytest.fail("compacted lines read on the driver"))
    reg = idregistry.InMemoryRegistry()
    reg.commit(c[:30], live_token())
    idregistry.export_registry(reg, root / "export")
    report = run_verify(config, spark, export_dir=root / "export")
    assert (report.foreign_events, report.joined, report.duplicates, report.lost, report.pending) == (40, 30, 1, 0, 10)
    assert report.duplicate_ids == ((c[0], 2),)


def test_beyond_the_bit_mask_regions_are_counted_as_sets_with_the_same_report(tmp_path, spark, monkeypatch):
    """Up to MASK_REGIONS regions an id's regions are a bit mask; beyond, a set of region indexes: the same
    two-region world (a cross-region duplicate, a click unjoinable everywhere) gives the same report."""
    import photon.app._verify as verify
    monkeypatch.setattr(verify, "MASK_REGIONS", 0)
    test_two_regions_are_counted_together_and_a_cross_region_duplicate_is_named(tmp_path, spark, "on_driver",
                                                                                monkeypatch)


def test_ids_are_read_as_the_pipeline_reads_them_whatever_the_line_looks_like(tmp_path, spark):
    """The aggregation reads ids with Spark's JSON reader and the lost ids' lines are found through a
    pattern for the usual line shape; lines of other shapes are still read as JSON: an id that is not the
    first field, an escaped id, a field given twice (the last counts), a line that is not valid JSON after a
    good start (quarantined: counts nowhere) and a field named in another case (not the id field)."""
    config = make_world(tmp_path, regions=("a",))
    c = [GEN.next_id() for _ in range(6)]
    q = GEN.next_id()
    escaped = c[2].replace(":", "\\u003a")
    lines = [click(c[0], q),
             b'{"ad":1,"click_id":"%s","query_id":"%s"}' % (c[1].encode(), q.encode()),
             b'{"click_id":"%s","query_id":"%s"}' % (escaped.encode(), q.encode()),
             b'{"click_id":"%s","query_id":"%s","click_id":"%s"}' % (c[0].encode(), q.encode(), c[3].encode()),
             b'{"click_id":"%s","query_id":"%s",}' % (c[4].encode(), q.encode()),
             b'{"CLICK_ID":"%s","query_id":"%s"}' % (c[5].encode(), q.encode())]
    write(tmp_path / "logs/a/clicks/f.jsonl", lines)
    reg = idregistry.InMemoryRegistry()
    reg.commit(c, dead_token())
    idregistry.export_registry(reg, tmp_path / "export")
    report = run_verify(config, spark, export_dir=tmp_path / "export")
    assert report.as_dict() == {"foreign_events": 4, "joined": 0, "duplicates": 0, "lost": 6, "recoverable": 4,
                                "pending": 0, "unjoinable": 0, "wrongly_unjoinable": 0}
    rows = sorted((r["id"], r["raw"], r["ref"]) for r in read_recoverable(report.recoverable_path))
    assert rows == sorted((c[i], lines[i].decode(), q) for i in range(4))


def _random_world(root: Path, seed: int):
    """Two regions of random clicks, as the pipeline could leave them, and the report the module docstring's
    rules give for them, computed here line by line in Python: corrupt lines (not JSON, a good start and a
    torn end), lines without the id field or with a malformed id, clicks logged twice, in both regions or
    only in a torn line, joined once, twice or in both regions, unjoinable in some or every region of their
    input, registered under a stopped or a running joiner's token, lost, or registered and never logged."""
    import random
    rnd = random.Random(seed)
    config = make_world(root)
    regions = ("a", "b")
    q = [GEN.next_id() for _ in range(40)]
    c = [GEN.next_id() for _ in range(120)]
    ref = {cid: rnd.choice(q) for cid in c}
    logged = {r: [] for r in regions}                 # (id, line) the pipeline reads; id None when it cannot
    for cid in c:
        for r in rnd.sample(regions, rnd.choice((0, 1, 1, 1, 2))):
            for _ in range(rnd.choice((1, 1, 1, 2))):
                logged[r].append((cid, click(cid, ref[cid])))
        if rnd.random() < 0.1:                        # a torn line: a good start, no id for the pipeline
            logged[rnd.choice(regions)].append((None, b'{"click_id":"%s","query_id":"%s",' % (
                cid.encode(), ref[cid].encode())))
    for r in regions:
        logged[r] += [(None, b"not json"), (None, orjson.dumps({"query_id": q[0], "ad": 2})),
                      (None, orjson.dumps({"click_id": "no-id", "query_id": q[0]}))]
        rnd.shuffle(logged[r])
        write(root / f"logs/{r}/clicks/w0/f.jsonl", [line for _, line in logged[r]])
    held = {r: {cid for cid, _ in logged[r] if cid is not None} for r in regions}
    joined = {r: [] for r in regions}
    unjoinable = {r: set() for r in regions}
    for cid in c:
        where = [r for r in regions if cid in held[r]] or [rnd.choice(regions)]
        fate = rnd.random()
        if fate < 0.5:
            joined[where[0]] += [cid] * (2 if rnd.random() < 0.05 else 1)
            if len(where) > 1 and rnd.random() < 0.1:
                joined[where[1]].append(cid)
        elif fate < 0.65 and any(cid in held[r] for r in where):
            for r in where:
                if cid in held[r] and rnd.random() < 0.7:
                    unjoinable[r].add(cid)
    for r in regions:
        write(root / f"out/{r}/joined/{r}-j0-1-000001.jsonl", [click(x, ref[x]) for x in joined[r]])
        write(root / f"out/{r}/unjoinable/x.jsonl", [click(x, ref[x]) for x in sorted(unjoinable[r])])
        write(root / f"logs/{r}/queries/w0/f.jsonl", [orjson.dumps({"query_id": x}) for x in q[:25]])
    dead, live = dead_token(), live_token()
    registered = {cid: rnd.choice((dead, live)) for cid in c if rnd.random() < 0.6}
    reg = idregistry.InMemoryRegistry()
    for token in (dead, live):
        ids = [cid for cid, t in registered.items() if t == token]
        if ids:
            reg.commit(ids, token)
    idregistry.export_registry(reg, root / "export")

    in_input = set().union(*held.values())
    n_out = {}
    for r in regions:
        for x in joined[r]:
            n_out[x] = n_out.get(x, 0) + 1
    unjoinable_any = set().union(*unjoinable.values())
    lost = {x for x in registered if x not in n_out}
    everywhere = {x for x in unjoinable_any - set(n_out) - set(registered) if x in in_input
                  and all(x in unjoinable[r] for r in regions if x in held[r])}
    expected = {"foreign_events": len(in_input), "joined": len(n_out),
                "duplicates": sum(1 for v in n_out.values() if v > 1), "lost": len(lost),
                "recoverable": len({x for x in lost if registered[x] == dead and x in in_input}),
                "pending": len({x for x in in_input if x not in registered and x not in n_out
                                and x not in unjoinable_any}),
                "unjoinable": len(unjoinable_any - set(n_out) - set(registered)),
                "wrongly_unjoinable": len({x for x in everywhere if ref[x] in q[:25]})}
    lines = {x: {line.decode() for r in regions for cid, line in logged[r] if cid == x} for x in lost}
    dups = tuple(sorted((x, v) for x, v in n_out.items() if v > 1))[:20]
    return config, expected, lines, dups, dead


@pytest.mark.parametrize("lookup", ["on_driver", "joins_in_spark"])
@pytest.mark.parametrize("seed", [1, 2])
def test_the_report_is_what_the_rules_give_line_by_line_on_random_worlds(tmp_path, spark, monkeypatch, seed, lookup):
    """The whole report (every count, the duplicated ids, the recoverable rows with their lines and tokens)
    against the module docstring's rules applied in Python to the same random lines, both ways of looking
    the lost ids up."""
    if lookup == "joins_in_spark":
        monkeypatch.setattr("photon.app._verify.LOOKUP_ON_DRIVER", 0)
    config, expected, lines, dups, dead = _random_world(tmp_path, seed)
    report = run_verify(config, spark, export_dir=tmp_path / "export")
    assert report.as_dict() == expected
    assert report.duplicate_ids == dups
    rows = read_recoverable(report.recoverable_path)
    assert len(rows) == expected["recoverable"]
    for r in rows:
        assert r["token"] == dead and r["raw"] in lines[r["id"]], r
        assert r["ref"] == orjson.loads(r["raw"])["query_id"]


def test_a_world_with_no_lines_at_all_counts_zeros_and_leaves_no_staging(tmp_path, spark):
    """Nothing logged, joined or registered: the counts (an observation on the aggregation's output) are
    still reported, all zero, and the folder of the ids that need more is gone after the run."""
    config = make_world(tmp_path, regions=("a",))
    (tmp_path / "logs/a/clicks").mkdir(parents=True)
    idregistry.export_registry(idregistry.InMemoryRegistry(), tmp_path / "export")
    report = run_verify(config, spark, export_dir=tmp_path / "export", out_dir=tmp_path / "verify")
    assert report.as_dict() == dict.fromkeys(report.as_dict(), 0)
    assert sorted(p.name for p in (tmp_path / "verify").iterdir()) == ["recoverable"]
