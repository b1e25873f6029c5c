"""The consistent-hash ring: deterministic, balanced, and a resize moves about 1/N of the keys."""
from __future__ import annotations

import pytest

from eventstore import HashRing

from es_helpers import query_id


IDS = [query_id(n) for n in range(20_000)]


def test_every_id_has_one_server_and_the_load_is_balanced():
    ring = HashRing(4, 64)
    owners = [ring.server_for(i) for i in IDS]
    assert owners == [HashRing(4, 64).server_for(i) for i in IDS]     # the same ring everywhere
    counts = [owners.count(s) for s in range(4)]
    assert all(0.15 * len(IDS) < c < 0.35 * len(IDS) for c in counts), counts
    split = ring.split(IDS[:100])
    assert sorted(i for idx in split.values() for i in idx) == list(range(100))
    assert all(owners[i] == s for s, idx in split.items() for i in idx)


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_adding_a_server_moves_about_one_nth_of_the_keys_and_only_to_it(n):
    before, after = HashRing(n, 128), HashRing(n + 1, 128)
    moved = [(before.server_for(i), after.server_for(i)) for i in IDS]
    changed = [(a, b) for a, b in moved if a != b]
    assert all(b == n for _, b in changed)            # nothing moves between the old servers
    share = len(changed) / len(IDS)
    assert 0.5 / (n + 1) < share < 1.6 / (n + 1), share


def test_removing_a_server_moves_only_its_keys():
    before, after = HashRing(4, 128), HashRing(3, 128)
    for i in IDS:
        if before.server_for(i) != 3:
            assert after.server_for(i) == before.server_for(i)


def test_a_ring_needs_servers():
    with pytest.raises(ValueError):
        HashRing(0)
