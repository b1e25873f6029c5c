"""A key extractor that raises on a computation's production (not an injector's record): the production is set
aside for that consumer, with its key, the error and the computation that produced it, as a record user code
kept failing on is, and the rest goes on: the installed ``millwheel run`` command as a process (one process and
``--workers 2``), each run's windows equal to the batch answer without the bad advertiser's, each window once,
and a second start that neither raises nor counts them again; and a production stored before a stop (as the
code before left every such production) replayed at the next start, in one process on SQLite: set aside once,
not counted again when the store already had it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from millwheel import Runtime, RuntimeConfig
from millwheel._routing import interval_of
from millwheel._store import SetAsideRecord, StoredProduction, Write, open_store

from mw_cluster import check_windows, stop_run
from mw_helpers import batch_windows, read_windows, write_joined

MILLWHEEL = str(Path(sys.executable).parent / "millwheel")
BAD = "adv-2"

MODULE = '''
import os
from pathlib import Path
from millwheel import FileSink, JoinedInjector, Topology
from millwheel.examples.ad_windows import ClickWindows, SpikeDetector, advertiser


def sink_key(record):
    """The window sink's key extractor, which cannot take the windows of one advertiser."""
    if record.value["advertiser_id"] == os.environ["NO_SINK_FOR"]:
        raise ValueError("no sink for " + record.value["advertiser_id"])
    return FileSink.key(record)


def build(input, out):
    out_dir = Path(out)
    t = Topology()
    t.add_injector("joined", lambda: JoinedInjector(input, quarantine_dir=out_dir / ".quarantine"), produces="clicks")
    t.add_computation("windows", ClickWindows, consumes={"clicks": advertiser}, produces=["window_counts"])
    t.add_computation("window-sink", lambda: FileSink(out_dir / "windows.jsonl", echo=False),
                      consumes={"window_counts": sink_key})
    t.add_computation("spikes", SpikeDetector, consumes={"window_counts": lambda r: r.value["advertiser_id"]},
                      produces=["anomalies"])
    t.add_computation("anomaly-sink", lambda: FileSink(out_dir / "anomalies.jsonl", echo=False),
                      consumes={"anomalies": FileSink.key})
    return t
'''


def _run(tmp: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    (tmp / "no_sink.py").write_text(MODULE)
    proc = subprocess.Popen([MILLWHEEL, "run", "no_sink", "--input", str(tmp / "in"), "--out", str(tmp / "out"),
                             "--until-idle", "--option", "injector_batch=100", *args], cwd=tmp,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "NO_SINK_FOR": BAD})
    try:
        text, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_run(proc)
        raise AssertionError(f"millwheel run still running after {timeout} s") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, text)


@pytest.mark.timeout(500)
@pytest.mark.parametrize("workers", [None, 2], ids=["one-process", "workers"])
def test_a_production_the_next_key_extractor_raises_on_is_set_aside_and_the_run_ends(reachable_tmp, workers):
    """Before: the run stopped with the extractor's traceback (exit 1; with ``--workers`` the worker exited, was
    started again and replayed the same stored production), and every start raised again on it."""
    events = write_joined(reachable_tmp / "in", 1500, 4)
    bad_windows = sum(1 for adv, _ in batch_windows(events) if adv == BAD)
    assert bad_windows >= 5
    extra = ["--workers", str(workers)] if workers else []
    first = _run(reachable_tmp, *extra)
    text = first.stdout
    assert first.returncode == 0, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert (f"millwheel: {bad_windows} record(s) set aside in this run, {bad_windows} in the store: "
            in text), text[-3000:]
    assert (f"  set aside: window-sink key {BAD!r} record windows:" in text
            and " after 1 attempts: the key extractor of window-sink for stream window_counts raised on a "
                f"production of windows: ValueError: no sink for {BAD}" in text), text[-3000:]
    if not workers:
        assert f", {bad_windows} set aside;" in text, text[-3000:]
    check_windows(read_windows(reachable_tmp / "out" / "windows.jsonl"),
                  [e for e in events if e["query"]["advertiser_id"] != BAD])
    again = _run(reachable_tmp, *extra)        # the next start: nothing raises, nothing counted again
    assert again.returncode == 0, again.stdout[-3000:]
    assert "Traceback" not in again.stdout, again.stdout[-3000:]
    assert f"millwheel: 0 record(s) set aside in this run, {bad_windows} in the store" in again.stdout, \
        again.stdout[-3000:]
    check_windows(read_windows(reachable_tmp / "out" / "windows.jsonl"),
                  [e for e in events if e["query"]["advertiser_id"] != BAD])


@pytest.mark.timeout(120)
def test_a_stored_production_the_key_extractor_raises_on_is_set_aside_at_replay_once(reachable_tmp, monkeypatch):
    """Productions of ``windows`` committed and not yet acked when the last run stopped (the code before left
    each one a key extractor raised on so, and raised on it again at every start): the replay sets the bad one
    aside and delivers the good one; one already set aside (a stop between the set-aside write and the
    production's ack) is not counted again; a third start finds nothing to replay."""
    monkeypatch.setenv("NO_SINK_FOR", BAD)
    sys.path.insert(0, str(reachable_tmp))
    (reachable_tmp / "no_sink.py").write_text(MODULE)
    (reachable_tmp / "in").mkdir()
    try:
        import no_sink
        topology = no_sink.build(str(reachable_tmp / "in"), str(reachable_tmp / "out"))
    finally:
        sys.path.remove(str(reachable_tmp))
        sys.modules.pop("no_sink", None)
    url = f"sqlite:///{reachable_tmp / 'state.db'}"
    config = RuntimeConfig(store=url, threads=2, intervals=4)
    store = open_store(url)
    try:
        def window(adv: str, n: int) -> StoredProduction:
            return StoredProduction(f"windows:{adv}-{n}", "window_counts", adv,
                                    orjson.dumps({"advertiser_id": adv, "window_start_us": n * 60_000_000,
                                                  "clicks": n}), n * 60_000_000 + 59_999_999, 1000 + n)
        bad, known, good = window(BAD, 1), window(BAD, 2), window("adv-5", 3)
        for p in (bad, known, good):
            i = interval_of(p.key, 4)
            store.commit([Write("windows", i, store.claim("windows", i), productions=[p])])
        i = interval_of(known.key, 4)
        store.commit([Write("windows", i, store.claim("windows", i), set_aside=[SetAsideRecord(
            "window-sink", known.id, known.key, "set aside before", 1, known.value, known.timestamp_us, "windows",
            known.produced_at_us)])])
    finally:
        store.close()

    rt = Runtime(topology, config).start()
    try:
        rt.run_until_idle(60)
        assert rt.statistics().computations["window-sink"].records_set_aside == 1
        assert rt.statistics().computations["window-sink"].records_processed == 1
        aside = {r.id: r for r in rt.store.set_aside_records("window-sink")}
        assert set(aside) == {bad.id, known.id}
        assert aside[bad.id].error == ("the key extractor of window-sink for stream window_counts raised on a "
                                       f"production of windows: ValueError: no sink for {BAD}")
        assert (aside[bad.id].key, aside[bad.id].sender, aside[bad.id].value) == (BAD, "windows", bad.value)
        assert not any(rt.store.pending_productions("windows", i) for i in range(4))
    finally:
        rt.stop()
    assert read_windows(reachable_tmp / "out" / "windows.jsonl") == [orjson.loads(good.value)]
    rt = Runtime(topology, config).start()
    try:
        rt.run_until_idle(60)
        assert rt.statistics().computations["window-sink"].records_set_aside == 0
    finally:
        rt.stop()
