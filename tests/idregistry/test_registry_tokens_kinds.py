"""Token clearing reads the joined output through the output kind's reader: output published to S3 (a
real moto_server) is gone through like a local folder, each published object once, and only published
objects count (lines still staged locally, or never committed, keep their tokens)."""
from __future__ import annotations

import orjson
import pytest

import idregistry
from photon import IdGenerator, open_output_sink, parse_config

pytestmark = pytest.mark.timeout(120)


def test_clear_tokens_of_ids_in_output_published_to_s3(cluster, s3, tmp_path):
    client = cluster.client
    gen = IdGenerator("10.7.7.8", 7272)
    ids = [gen.next_id() for _ in range(30)]
    client.commit(ids, "joiner-s3")
    config = parse_config({"regions": [{"name": "a", "log_root": "logs", "output_root": s3.url("out"),
                                        "state_dir": "st"}],
                           "registry": {"data_dir": str(tmp_path / "reg")}}, base=tmp_path)
    region = config.regions[0]
    w = open_output_sink(region.output_url("joined"), "a-j0", staging=region.joined_dir, s3=config.s3,
                         roll_interval_s=3600, commit_interval_s=3600)
    w.sync(w.write_lines([orjson.dumps({"click_id": i}) for i in ids[:20]]))
    w.roll()                                         # published: uploaded to S3, removed locally
    w.sync(w.write_lines([orjson.dumps({"click_id": i}) for i in ids[20:25]]))   # committed, still staged
    assert len(s3.keys("out/joined/date=")) == 1
    assert idregistry.clear_output_tokens(config, client) == {"files": 1, "ids": 20, "cleared": 20}
    assert idregistry.clear_output_tokens(config, client) == {"files": 0, "ids": 0, "cleared": 0}
    exported = {i: t for shard in range(len(client.statistics().shards)) for i, t, _ in client.export(shard)}
    assert all(exported[i] == "" for i in ids[:20])
    assert all(exported[i] == "joiner-s3" for i in ids[20:])
    w.roll()
    assert idregistry.clear_output_tokens(config, client) == {"files": 1, "ids": 5, "cleared": 5}
