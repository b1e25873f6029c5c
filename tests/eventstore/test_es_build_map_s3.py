"""``photon eventstore build-map`` over an ``s3://`` primary stream (a real moto_server, the session's one
SparkSession): the map equals the one built from the same files locally, and the logs store's ranged GETs
find every query through it."""
from __future__ import annotations

from pathlib import Path

import pytest

import eventstore
from eventstore._logstore import LogsEventStore
from photon import load_config
from photon.app import GenOptions, build_map, generate

from es_helpers import query_lines_by_id

pytestmark = pytest.mark.timeout(300)


def test_build_map_over_s3_equals_the_local_map_and_the_logs_store_finds_every_query(tmp_path, s3, spark):
    generate(GenOptions(out=str(tmp_path), queries=3000, rotate_lines=800, writers=2, clicks_per_query=0.01, seed=4))
    cfg = tmp_path / "photon.toml"
    cfg.write_text(cfg.read_text() + "\n[eventstore]\nmap_every_s = 20.0\nmap_every_kb = 8\n")
    local = load_config(cfg)
    root = Path(local.region("a").log_root) / "queries"
    s3.upload_tree(root, "logs/a/queries")
    text = cfg.read_text().replace('log_root = "logs/a"', f'log_root = "{s3.url("logs/a")}"') \
        .replace('state_dir = "state/a"', 'state_dir = "state-s3/a"')
    (tmp_path / "s3.toml").write_text(text)
    remote = load_config(tmp_path / "s3.toml")
    assert remote.region("a").log_root.startswith("s3://")

    def entries(config):
        build_map(config, "a", range_mb=0.03, session=spark)      # many ranges per object
        out = []
        for d in eventstore.map_dir(config.region("a").state_dir).glob("spark-*"):
            out += eventstore.read_map(d)[0]
        return sorted(out)

    on_s3 = entries(remote)
    assert on_s3 and on_s3 == entries(local)
    reg = remote.region("a")
    store = LogsEventStore("a", remote.region("a").stream_url("queries"), "query_id",
                           eventstore.map_dir(reg.state_dir), None, 8192, s3=remote.s3)
    try:
        store.refresh()
        lines = query_lines_by_id(root)
        ids = list(lines)
        assert len(ids) == 3000 and store.lookup(ids) == [lines[i] for i in ids]
    finally:
        store.close()
