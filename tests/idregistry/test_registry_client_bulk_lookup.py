"""The registry client's lookup takes a reply's answers in bulk (one list of them, put in place by a slice or a
C ``map``), not an index into the reply per id. Held to the form before (a step per id, kept below) and to
what was committed, on real replicas (one shard of three; two shards of one replica each, so ids are split
between shards and answered by two replies), random ids asked in random order, repeated, sorted, held or not."""
from __future__ import annotations

import random
import time

import pytest

from photon import wait_until
import idregistry

from registry_helpers import start_cluster

pytestmark = pytest.mark.timeout(240)


def _lookup_per_id(client, ids: list[str]) -> list[bool]:
    """``RegistryClient.lookup`` as it was: each id's answer taken from the reply alone."""
    client._check(ids)
    out = [False] * len(ids)
    pending = list(range(len(ids)))
    for _ in range(10):
        if not pending:
            break
        sub = [ids[i] for i in pending]
        groups = client._group(sub)
        moved: list[int] = []

        def one(shard, idx, sub=sub):
            reply = client._with_retries(lambda: client._lookup_once(shard, [sub[i] for i in idx]))
            wrong = set(reply.wrong_shard)
            for k, i in enumerate(idx):
                if k in wrong:
                    moved.append(pending[i])
                else:
                    out[pending[i]] = reply.present[k]

        client._map_shards(one, groups)
        if moved:
            client.sharding(refresh=True)
        pending = sorted(moved)
    return out


def _ids(rng: random.Random, t0: int, n: int) -> list[str]:
    return [f"10.0.{rng.randrange(3)}.{rng.randrange(1, 4)}:{rng.randrange(1, 5)}:{t0 + rng.randrange(50_000):016d}"
            for _ in range(n)]


@pytest.fixture(scope="module")
def two_shards(tmp_path_factory, session_procs):
    c = start_cluster(tmp_path_factory.mktemp("registry-2"), session_procs, replicas=1, shards=2)
    c.wait_leader(1)
    try:
        yield c
    finally:
        c.client.close()


@pytest.mark.parametrize("which", ["cluster", "two_shards"])
def test_a_lookup_in_bulk_answers_as_each_id_taken_alone_and_as_committed(which, request):
    cluster = request.getfixturevalue(which)
    client = idregistry.RegistryClient(cluster.endpoints(), retry_timeout_s=30.0)
    try:
        rng = random.Random(which)
        t0 = time.time_ns() // 1000 - 60_000_000
        held = sorted(set(_ids(rng, t0, 3000)))
        for k in range(0, len(held), 500):
            client.commit(held[k:k + 500], f"bulk-lookup-{which}")
        # every replica answers for all of them (reads go to any replica, round robin)
        wait_until(lambda: all(all(client.lookup(held)) for _ in range(6)), 30, message="the commits read back")
        if which == "two_shards":
            groups = client._group(held)
            assert len(groups) == 2 and all(len(g) > 100 for g in groups.values())
        held_set = set(held)
        for round_ in range(60):
            n = rng.choice([0, 1, 2, 7, 100, 1500, 4000])
            asked = [rng.choice(held) if rng.random() < 0.4 else i for i in _ids(rng, t0, n)]
            if round_ % 3 == 0:
                asked.sort()                       # as the dispatcher sends them
            expected = [i in held_set for i in asked]
            assert client.lookup(asked) == _lookup_per_id(client, asked) == expected, (which, round_, n)
    finally:
        client.close()
