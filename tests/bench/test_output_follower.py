"""The benchmarks' output follower: ids read a chunk at a time are those read line by line, and with
``seen=False`` it reads only what the output contract publishes, in the order it became visible."""
from __future__ import annotations

import random

import orjson

from bench._output import OutputFollower
from photon import RollingWriter


def _random_line(rng: random.Random) -> bytes:
    cid = f"10.0.0.{rng.randrange(4)}:{rng.randrange(100)}:{rng.randrange(10**16):016d}"
    shapes = [
        b'{"click_id":"%s","query_id":"q","query":{"query_id":"q"},"_photon":{"region":"a"}}' % cid.encode(),
        b'{"x":1,"click_id":"%s"}' % cid.encode(),
        b'{"click_id":"%s","nested":{"click_id":"other"}}' % cid.encode(),   # the first occurrence counts
        b'{"click_id":"%s' % cid.encode(),                                     # no closing quote
        b'{"click_id": "%s"}' % cid.encode(),                                  # not the key's exact form: orjson
        b'{"other":"%s"}' % cid.encode(),                                      # no id at all
        b'{"click_id":5}',                                                     # not a string
        b'not json',
        b'',
        b'{"click_id":""}',
    ]
    return rng.choice(shapes[:3] * 6 + shapes[3:])


def test_ids_of_a_chunk_are_the_ids_of_its_lines_one_by_one():
    rng = random.Random(11)
    follower = OutputFollower("/nonexistent")
    for trial in range(300):
        lines = [_random_line(rng) for _ in range(rng.randrange(0, 40))]
        if trial % 3 == 0:     # the usual chunk: every line a joined line
            lines = [line for line in lines if line.startswith(b'{"click_id":"') and line.endswith(b"}")]
        expected = [cid for cid in map(follower._id_of, lines) if cid is not None]
        assert follower._ids_of(lines) == expected, lines


def test_published_only_follower_reads_the_committed_lines_in_order(tmp_path):
    out = tmp_path / "joined"
    writer = RollingWriter(out, "a-j0", roll_interval_s=3600.0)
    both, published_only = OutputFollower(out), OutputFollower(out, seen=False)
    ids = []
    for batch in range(5):
        lines = []
        for i in range(50):
            cid = f"10.0.0.1:7:{batch * 1000 + i:016d}"
            ids.append(cid)
            lines.append(orjson.dumps({"click_id": cid, "query_id": "q"}))
        writer.sync(writer.write_lines(lines))
        for follower in (both, published_only):
            follower.poll()
        assert published_only.published_order == ids
        assert list(published_only.published_us) == ids == list(both.published_us)
        assert published_only.seen_us == {} and set(both.seen_us) == set(ids)
    writer.close()
