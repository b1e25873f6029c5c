"""Property tests: random interleavings of commits, retries, deletes and reshards, checked against a
simple model (a dict id -> token). No id may ever be accepted for two tokens, and every id must live in
exactly the shard the newest sharding config maps it to.

The first test drives the pure pieces a real cluster is made of (one ShardState per shard, shard 0's
replicated sharding config, each server's ShardingLease, each client's cached config, possibly stale),
so it can afford reshards at every step; the second replays commits, retries and deletes against a real
cluster."""
from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from photon import IdGenerator, wait_until
import idregistry
from idregistry import CommitResult
from idregistry._state import (OP_ADD_EPOCH, OP_COMMIT, OP_DELETE, OP_INIT_SHARDING, Sharding, ShardingLease,
                               ShardState)

OK, EXISTS, WRONG = CommitResult.OK, CommitResult.ALREADY_EXISTS, CommitResult.WRONG_SHARD
T0 = 1_763_712_000_000_000
SKEW = 1_000_000
GRID = 50_000          # ids sit on a 50 ms grid so that commits collide
IDS = [f"10.0.0.{p}:9:{T0 + k * GRID:016d}" for p in range(2) for k in range(240)]   # 12 s of ids


def near(now: int, picks: list[tuple[int, int]]) -> list[str]:
    """Ids on the grid around ``now``: ``(process, offset in grid steps)``, at most the skew bound ahead."""
    base = now - now % GRID
    return [f"10.0.0.{p}:9:{base + k * GRID:016d}" for p, k in picks if base + k * GRID >= T0]
TOKENS = ["joiner-a", "joiner-b", "joiner-c"]


class World:
    """Shards, servers' leases, clients' caches and a clock; the model is ``self.model``."""

    def __init__(self) -> None:
        self.now = T0
        self.shards: dict[int, ShardState] = {0: ShardState(0)}
        self.meta = self.shards[0]
        self.meta.apply([(OP_INIT_SHARDING, Sharding(epochs=[(0, 1)], endpoints={0: ["s0"]}, version=1))])
        self.leases: dict[int, ShardingLease] = {}
        self.caches = [self.meta.sharding, self.meta.sharding]
        self.model: dict[str, str] = {}
        self.history: list[tuple[int, str, list[str]]] = []

    def shard(self, k: int) -> ShardState:
        return self.shards.setdefault(k, ShardState(k))

    def judge(self, k: int, ids: list[str]) -> Sharding:
        lease = self.leases.get(k)
        if lease is None or not lease.covers(ids):
            lease = self.leases[k] = ShardingLease.fetched(self.meta.sharding, self.now, SKEW)
        assert lease.covers(ids)                     # ids are never more than the skew bound ahead
        return lease.sharding

    def routed(self, client: int, ids: list[str], call):
        """Send ``ids`` where client's cache says; re-send WRONG_SHARD ones after refreshing the cache."""
        pending = list(range(len(ids)))
        out = {}
        for _ in range(10):
            if not pending:
                return out
            groups: dict[int, list[int]] = {}
            for i in pending:
                groups.setdefault(self.caches[client].shard_for(ids[i]), []).append(i)
            moved = []
            for k, idx in groups.items():
                sub = [ids[i] for i in idx]
                wrong = set(self.judge(k, sub).wrong_shard(k, sub))
                mine = [i for n, i in enumerate(idx) if n not in wrong]
                moved += [i for n, i in enumerate(idx) if n in wrong]
                if mine:
                    out.update(zip(mine, call(self.shard(k), [ids[i] for i in mine])))
            if moved:
                self.caches[client] = self.meta.sharding
            pending = moved
        raise AssertionError("ids kept landing on the wrong shard")

    def usable(self, ids: list[str]) -> list[str]:
        return [i for i in ids if int(i[-16:]) < self.now + SKEW]

    def commit(self, client: int, token: str, ids: list[str]) -> None:
        ids = self.usable(ids)
        if not ids:
            return
        decided = self.routed(client, ids, lambda shard, sub: shard.apply([(OP_COMMIT, token, sub)])[0])
        self.history.append((client, token, ids))
        for n, event_id in enumerate(ids):
            result = CommitResult(decided[n])
            held = self.model.get(event_id)
            if held is None:
                assert result == OK, (event_id, result)
                self.model[event_id] = token
            else:
                assert result == (OK if held == token else EXISTS), (event_id, token, held, result)

    def delete(self, client: int, event_id: str, token: str) -> None:
        if not self.usable([event_id]):
            return
        done = self.routed(client, [event_id], lambda shard, sub: [shard.apply([(OP_DELETE, sub[0], token)])[0]])
        expected = self.model.get(event_id) == token
        assert done[0] == expected
        if expected:
            del self.model[event_id]

    def reshard(self, n: int, delay_us: int) -> None:
        start = self.now + SKEW + 1 + delay_us
        endpoints = {k: [f"s{k}"] for k in range(n)}
        later_than_last = start > self.meta.sharding.epochs[-1][0]
        error = self.meta.apply([(OP_ADD_EPOCH, start, n, endpoints, self.now, SKEW)])[0]
        assert (error is None) == later_than_last, error
        refused = self.meta.apply([(OP_ADD_EPOCH, self.now + SKEW, n, endpoints, self.now, SKEW)])[0]
        assert refused is not None                   # never at or before now + S

    def check(self) -> None:
        final = self.meta.sharding
        where: dict[str, list[int]] = {}
        for k, shard in self.shards.items():
            for event_id, token, _ in shard.entries():
                where.setdefault(event_id, []).append(k)
                assert self.model.get(event_id) == token, event_id
        assert set(where) == set(self.model)
        for event_id, shards in where.items():
            assert shards == [final.shard_for(event_id)], (event_id, shards)


pick_st = st.tuples(st.integers(0, 1), st.integers(-60, SKEW // GRID - 1))
op_st = st.one_of(
    st.tuples(st.just("commit"), st.integers(0, 1), st.sampled_from(TOKENS), st.lists(pick_st, min_size=1, max_size=12)),
    st.tuples(st.just("commit"), st.integers(0, 1), st.sampled_from(TOKENS), st.lists(pick_st, min_size=1, max_size=12)),
    st.tuples(st.just("retry"), st.integers(0, 50)),
    st.tuples(st.just("delete"), st.integers(0, 1), pick_st, st.sampled_from(TOKENS)),
    st.tuples(st.just("reshard"), st.integers(1, 5), st.integers(0, 300_000)),
    st.tuples(st.just("tick"), st.integers(0, 700_000)),
    st.tuples(st.just("refresh_client"), st.integers(0, 1)),
)


def replay(ops) -> World:
    world = World()
    for op in ops:
        kind = op[0]
        if kind == "commit":
            world.commit(op[1], op[2], near(world.now, op[3]))
        elif kind == "retry" and world.history:
            client, token, ids = world.history[op[1] % len(world.history)]
            world.commit(client, token, ids)
        elif kind == "delete" and near(world.now, [op[2]]):
            world.delete(op[1], near(world.now, [op[2]])[0], op[3])
        elif kind == "reshard":
            world.reshard(op[1], op[2])
        elif kind == "tick":
            world.now += op[1]
        elif kind == "refresh_client":
            world.caches[op[1]] = world.meta.sharding
    return world


@settings(max_examples=1000, deadline=None)
@given(st.lists(op_st, min_size=5, max_size=80))
def test_random_interleavings_with_reshards_accept_no_id_twice(ops):
    replay(ops).check()


_runs = itertools.count()

real_op_st = st.one_of(
    st.tuples(st.just("commit"), st.integers(0, 1), st.sampled_from(TOKENS),
              st.lists(st.integers(0, 15), min_size=1, max_size=6)),
    st.tuples(st.just("retry"), st.integers(0, 20)),
    st.tuples(st.just("delete"), st.integers(0, 1), st.integers(0, 15), st.sampled_from(TOKENS)),
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(real_op_st, min_size=1, max_size=15))
def test_random_interleavings_on_a_real_cluster_match_the_model(cluster, ops):
    gen = IdGenerator("10.2.2.2", 20_000 + next(_runs))
    pool = [gen.next_id() for _ in range(16)]
    clients = [idregistry.RegistryClient(cluster.endpoints()) for _ in range(2)]
    model: dict[str, str] = {}
    history = []
    try:
        for op in ops:
            if op[0] == "retry":
                if not history:
                    continue
                op = history[op[1] % len(history)]
            if op[0] == "commit":
                _, c, token, picks = op
                ids = [pool[p] for p in picks]
                results = clients[c].commit(ids, token)
                history.append(op)
                for event_id, result in zip(ids, results):
                    held = model.get(event_id)
                    if held is None:
                        assert result == OK
                        model[event_id] = token
                    else:
                        assert result == (OK if held == token else EXISTS)
            else:
                _, c, p, token = op
                expected = model.get(pool[p]) == token
                assert clients[c].delete(pool[p], token) is expected
                if expected:
                    del model[pool[p]]
        expected_present = [event_id in model for event_id in pool]
        wait_until(lambda: clients[0].lookup(pool) == expected_present, 10, message="lookups to match the model")
    finally:
        for client in clients:
            client.close()


def test_a_server_with_a_stale_config_never_judges_ids_past_its_lease():
    """The interleaving the lease exists for: a server fetched the config, then a reshard was committed,
    then time passed; a client with the old config sends it ids from the new epoch."""
    world = World()
    world.commit(0, "joiner-a", [IDS[0]])                  # shard 0's server fetches its lease now
    world.reshard(3, 0)                                   # 1 -> 3 shards from now + S
    world.now += 3 * SKEW
    late = [i for i in IDS if world.meta.sharding.epochs[-1][0] < int(i[-16:]) < world.now + SKEW]
    assert late
    world.commit(0, "joiner-a", late)                     # client 0 still routes everything to shard 0
    world.commit(1, "joiner-b", late)
    world.check()
