"""The joiner's lookup chain over real servers: two cache servers (ring), then the logs store. A click whose
query left the cache long ago is joined through the logs store, and the joined event says who served it."""
from __future__ import annotations

import idregistry
import joiner
import eventstore
from joiner import JoinerClient, Outcome
from photon import wait_until

from joiner_helpers import clicks, fresh_click_pid, joined_lines, make_config, write_queries

J = Outcome.JOINED


def test_old_queries_come_from_the_logs_store_recent_ones_from_the_cache(tmp_path):
    config = make_config(tmp_path, joiner={"roll_interval_s": 0.2},
                         eventstore={"cache_mb": 0.05, "cache_servers": 2, "map_every_kb": 4,
                                     "checkpoint_interval_s": 0.05, "map_refresh_s": 0.05})
    write_queries(tmp_path, range(3000))
    caches = [eventstore.serve(config, "a", shard=s) for s in range(2)]
    logs = eventstore.serve_logs(config, "a")
    server = client = None
    try:
        wait_until(lambda: all(c.statistics().lines_read == 3000 for c in caches), 20, message="queries read")
        held = [c.statistics().entries for c in caches]
        assert sum(held) < 600 and all(held)                # 50 KB over two servers: the newest few hundred
        server = joiner.serve(config, "a", "a-j0", eventstore=",".join(c.address for c in caches),
                              logstore=[logs.address], registry=idregistry.connect("memory://"))
        client = JoinerClient(server.address)
        pid = fresh_click_pid()
        ids, refs, raws = clicks(list(range(0, 3000, 50)) + [2999, 2998], pid=pid)
        wait_until(lambda: client.join(ids[:1], refs[:1], raws[:1]) == [J], 20, message="first old query found")
        assert client.join(ids[1:], refs[1:], raws[1:]) == [J] * (len(ids) - 1)
        wait_until(lambda: len(joined_lines(tmp_path / "out" / "joined")) == len(ids), 10, message="output published")
        served = {e["click_id"]: e["_photon"]["served_by"] for e in joined_lines(tmp_path / "out" / "joined")}
        assert served[ids[0]] == served[ids[1]] == "logs"
        assert served[ids[-1]] == served[ids[-2]] == "cache"
        st = server.statistics()
        assert st.served_by_logs >= len(ids) - 5 and st.served_by_cache >= 2
        assert logs.statistics().found >= st.served_by_logs
    finally:
        if client is not None:
            client.close()
        if server is not None:
            server.stop()
        logs.stop()
        for c in caches:
            c.stop()
