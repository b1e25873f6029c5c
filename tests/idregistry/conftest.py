"""A real registry cluster on 127.0.0.1 free ports, stopped by pid on teardown even when a test fails."""
from __future__ import annotations

import pytest

from registry_helpers import start_cluster


@pytest.fixture(scope="session")
def cluster(tmp_path_factory, session_procs):
    """Three replicas of one shard, default timings; snapshots every 50 commands so that restarts load a
    snapshot plus a journal tail."""
    c = start_cluster(tmp_path_factory.mktemp("registry"), session_procs, snapshot_after_commands=50)
    try:
        yield c
    finally:
        c.client.close()


@pytest.fixture(scope="session")
def fast_cluster(tmp_path_factory, session_procs):
    """Three replicas of one shard with short horizons: ids are garbage collected after 3 s, the clock-skew
    bound is 1 s (so reshards can take effect 2 s ahead), and a leader lets at most 5,000 ids queue."""
    c = start_cluster(tmp_path_factory.mktemp("registry-fast"), session_procs, gc_after_s=3.0,
                       max_clock_skew_s=1.0, max_queued_ids=5000)
    try:
        yield c
    finally:
        c.client.close()
