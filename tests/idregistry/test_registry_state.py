"""The pure core: batch resolution, garbage collection, tokens, storage. No cluster needed."""
from __future__ import annotations

import pickle

import pytest

from photon import BadEventId
from idregistry._state import (OP_ADVANCE_GC, OP_CLEAR_TOKENS, OP_COMMIT, OP_COMMIT_RUNS, OP_DELETE, CommitResult,
                               Sharding, ShardState, bucket_width_us, pack_ids, shard_of, validate_ids)

OK, EXISTS, TOO_OLD = CommitResult.OK, CommitResult.ALREADY_EXISTS, CommitResult.TOO_OLD
T0 = 1_763_712_000_000_000


def eid(n: int, proc: int = 1, ip: str = "10.0.0.1") -> str:
    return f"{ip}:{proc}:{T0 + n:016d}"


def commit(state, token, ids):
    return [CommitResult(c) for c in state.apply([(OP_COMMIT, token, ids)])[0]]


def test_first_writer_in_a_batch_wins_and_same_token_is_ok():
    s = ShardState()
    a, b = eid(1), eid(2)
    results = s.apply([(OP_COMMIT, "A", [a, b]), (OP_COMMIT, "B", [a]), (OP_COMMIT, "A", [b, a]),
                       (OP_COMMIT, "B", [eid(3), b])])
    assert [list(map(CommitResult, r)) for r in results] == [[OK, OK], [EXISTS], [OK, OK], [OK, EXISTS]]
    assert s.ids_held == 3
    assert s.lookup([a, b, eid(3), eid(4)]) == [True, True, True, False]


def test_duplicate_ids_in_one_request_and_out_of_order_inserts():
    s = ShardState(bucket_us=1_000_000)
    assert commit(s, "A", [eid(50), eid(50), eid(10), eid(30), eid(10)]) == [OK] * 5
    assert commit(s, "B", [eid(10), eid(30), eid(50), eid(20)]) == [EXISTS, EXISTS, EXISTS, OK]
    assert s.ids_held == 4
    assert [e[0] for e in s.entries()] == [eid(10), eid(20), eid(30), eid(50)]


def test_ids_of_different_processes_do_not_collide():
    s = ShardState()
    same_time = [eid(7, proc=1), eid(7, proc=2), eid(7, ip="10.0.0.2")]
    assert commit(s, "A", same_time) == [OK, OK, OK]
    assert s.ids_held == 3


def test_gc_boundary_is_monotonic_and_old_ids_are_too_old():
    s = ShardState(bucket_us=bucket_width_us(8.0))   # 1 s buckets
    old, new = eid(0), eid(5_000_000)
    assert commit(s, "A", [old, new]) == [OK, OK]
    assert s.apply([(OP_ADVANCE_GC, T0 + 3_000_000)]) == [T0 + 3_000_000]
    assert s.apply([(OP_ADVANCE_GC, T0 + 1_000_000)]) == [T0 + 3_000_000]   # never goes back
    assert s.gc_boundary_us == T0 + 3_000_000
    assert commit(s, "A", [old, eid(2_999_999), new]) == [TOO_OLD, TOO_OLD, OK]
    assert s.lookup([old, new]) == [False, True]
    assert s.ids_held == 1                      # the whole bucket of `old` was dropped
    assert [e[0] for e in s.entries()] == [new]


def test_a_batch_lookup_agrees_with_contains_across_buckets_processes_and_the_gc_boundary():
    s = ShardState(bucket_us=bucket_width_us(8.0))   # 1 s buckets
    held = [eid(n, proc=p, ip=ip) for n in (0, 10, 1_500_000, 2_000_001) for p in (1, 22)
            for ip in ("10.0.0.1", "fe80::1")]
    commit(s, "A", held)
    s.apply([(OP_ADVANCE_GC, T0 + 5)])              # eid(0) falls below the boundary, its bucket stays
    asked = held + [eid(11), eid(10, proc=3), eid(1_500_000, ip="10.0.0.9"), eid(7_000_000), eid(0)]
    expected = [s.contains(i) for i in asked]
    assert expected.count(True) == len(held) - 4     # the four eid(0) ids are too old
    assert s.lookup(asked) == expected
    assert s.lookup([]) == []
    with pytest.raises(BadEventId, match="not-an-id"):
        s.lookup([eid(1), "not-an-id"])


def test_clear_tokens_keeps_ids_and_delete_needs_the_matching_token():
    s = ShardState()
    a, b = eid(1), eid(2)
    commit(s, "A", [a, b])
    assert s.apply([(OP_DELETE, a, "B")]) == [False]
    assert s.apply([(OP_CLEAR_TOKENS, [a, eid(99)])]) == [1]
    assert s.token_of(a) == "" and s.token_of(b) == "A"
    assert s.apply([(OP_DELETE, a, "A")]) == [False]      # its token is gone: recovery must not delete it
    assert s.apply([(OP_DELETE, b, "A")]) == [True]
    assert s.lookup([a, b]) == [True, False]
    assert commit(s, "C", [b]) == [OK]                   # a deleted id can be committed again
    assert s.ids_held == 2


def test_state_survives_pickling_with_compact_arrays():
    s = ShardState(shard=2, bucket_us=1_000_000)
    commit(s, "A", [eid(n) for n in range(0, 5_000_000, 1000)])
    copy = pickle.loads(pickle.dumps(s))
    assert list(copy.entries()) == list(s.entries())
    assert copy.shard == 2 and copy.ids_held == 5000
    assert commit(copy, "B", [eid(0)]) == [EXISTS]


def test_bad_ids_are_rejected_with_their_text():
    validate_ids([eid(1)])
    for bad in ["nope", "10.0.0.1:x:0000000000000001", ":1:0000000000000001", "10.0.0.1:1:123"]:
        with pytest.raises(BadEventId, match="event id"):
            validate_ids([bad])


def test_sharding_maps_each_id_to_one_shard_forever():
    sharding = Sharding(epochs=[(0, 2), (T0 + 1000, 5)])
    early, late = eid(10), eid(2000)
    assert sharding.shard_for(early) == shard_of(early, 2)
    assert sharding.shard_for(late) == shard_of(late, 5)
    ids = [eid(n) for n in range(0, 4000, 7)]
    for shard in range(5):
        wrong = set(sharding.wrong_shard(shard, ids))
        assert all((sharding.shard_for(ids[i]) != shard) == (i in wrong) for i in range(len(ids)))


# ---- the token table is bounded: tokens go with the ids GC drops ------------------------------------

W = 1_000_000   # bucket width of these tests (1 s); T0 is a multiple of it


def test_tokens_of_ids_dropped_by_gc_are_freed_and_numbers_are_not_reused():
    s = ShardState(0, W)
    for r in range(50):                                    # a join request per 10 ids, as the pipeline does
        assert commit(s, f"j0/{r}", [eid(r * 10 + k) for k in range(10)]) == [OK] * 10   # all in bucket 0
    assert commit(s, "late", [eid(5 * W + 1)]) == [OK]        # bucket 5
    assert commit(s, "spans", [eid(2), eid(3 * W + 7)]) == [EXISTS, OK]   # newest id in bucket 3
    assert len(s.token_names) == 1 + 52
    late_number = s.token_numbers["late"]
    s.apply([(OP_ADVANCE_GC, T0 + 2 * W)])                   # drops bucket 0 and 1
    assert set(s.token_numbers) == {"late", "spans"} and s.tokens_freed == 50
    assert len(s.token_names) == 3 and s.ids_held == 2
    assert s.token_of(eid(3 * W + 7)) == "spans" and s.token_of(eid(5 * W + 1)) == "late"
    assert commit(s, "late", [eid(5 * W + 1)]) == [OK]        # a retry with the same token is still OK
    assert commit(s, "other", [eid(5 * W + 1)]) == [EXISTS]
    assert "other" not in s.token_numbers                     # a token no held id uses is not kept
    assert commit(s, "new", [eid(6 * W)]) == [OK]
    assert s.token_numbers["new"] > late_number               # numbers are not handed out again
    s.apply([(OP_ADVANCE_GC, T0 + 4 * W)])
    assert set(s.token_numbers) == {"late", "new"}
    s.apply([(OP_ADVANCE_GC, T0 + 7 * W)])
    assert s.token_numbers == {} and s.token_names == {0: ""} and s.ids_held == 0


def test_token_table_stays_bounded_over_many_gc_rounds():
    s = ShardState(0, W)
    sizes = []
    for second in range(40):
        for r in range(20):
            commit(s, f"j/{second}/{r}", [eid(second * W + r * 100 + k) for k in range(100)])
        s.apply([(OP_ADVANCE_GC, T0 + max(0, second - 4) * W)])   # keep about five seconds of ids
        sizes.append(len(s.token_names))
    assert max(sizes[10:]) <= 1 + 6 * 20 and s.tokens_freed >= 30 * 20


def test_token_numbers_never_wrap_they_are_renumbered():
    from idregistry._state import MAX_TOKEN_NUMBER
    s = ShardState(0, W)
    assert commit(s, "a", [eid(1), eid(2)]) == [OK, OK]
    assert commit(s, "b", [eid(3)]) == [OK]
    s.apply([(OP_CLEAR_TOKENS, [eid(2)])])
    s.next_token = MAX_TOKEN_NUMBER                           # as after 2**32 - 1 join requests
    assert commit(s, "c", [eid(4)]) == [OK]
    assert s.token_numbers["c"] == MAX_TOKEN_NUMBER
    assert commit(s, "d", [eid(5)]) == [OK]                   # would not fit in 32 bits: renumbered first
    assert s.token_numbers == {"a": 1, "b": 2, "c": 3, "d": 4} and s.next_token == 5
    assert [s.token_of(eid(n)) for n in range(1, 6)] == ["a", "", "b", "c", "d"]
    assert commit(s, "c", [eid(4)]) == [OK] and commit(s, "x", [eid(4)]) == [EXISTS]
    restored = pickle.loads(pickle.dumps(s))
    assert [restored.token_of(eid(n)) for n in range(1, 6)] == ["a", "", "b", "c", "d"]


def test_a_snapshot_with_the_old_token_list_is_upgraded():
    s = ShardState(0, W)
    commit(s, "a", [eid(1)])
    commit(s, "b", [eid(2 * W)])
    old = dict(s.__dict__)
    old["token_names"] = ["", "a", "b", "gone"]               # the list the state kept before (never freed)
    old["token_numbers"] = {"a": 1, "b": 2, "gone": 3}
    for key in ("token_bucket", "next_token", "tokens_freed"):
        del old[key]
    restored = ShardState.__new__(ShardState)
    restored.__setstate__(old)
    assert restored.token_numbers == {"a": 1, "b": 2} and restored.token_bucket == {1: T0 // W, 2: T0 // W + 2}
    assert restored.next_token == 4 and restored.token_of(eid(2 * W)) == "b"
    restored.apply([(OP_ADVANCE_GC, T0 + W)])
    assert restored.token_numbers == {"b": 2}


def test_lookups_read_the_callers_own_region_first_round_robin_then_the_others():
    from idregistry._client import read_order
    replicas = ["10.0.0.1:1", "10.0.0.2:2", "10.0.0.1:3", "10.0.0.3:4", "10.0.0.2:5"]
    assert read_order(replicas, 0, "10.0.0.2") == ["10.0.0.2:2", "10.0.0.2:5", "10.0.0.1:1", "10.0.0.1:3",
                                                   "10.0.0.3:4"]
    assert read_order(replicas, 1, "10.0.0.2")[:2] == ["10.0.0.2:5", "10.0.0.2:2"]
    # no replica near (or no region host): plain round robin over all, each tried once
    assert read_order(replicas, 2, None) == replicas[2:] + replicas[:2]
    assert sorted(read_order(replicas, 7, "10.9.9.9")) == sorted(replicas)
    assert [read_order(replicas, t, None)[0] for t in range(5)] == replicas


def test_replicas_of_a_registry_only_region_stand_for_election_later(tmp_path):
    """Leaders land in regions that run a pipeline (their commits then pay one wide-area round trip)."""
    from idregistry._layout import REGISTRY_ONLY_ELECTION_SCALE, replica_specs
    from photon import parse_config
    regions = [{"name": n, "log_root": str(tmp_path / "logs" / n), "output_root": str(tmp_path / "out" / n),
                "state_dir": str(tmp_path / "state" / n)} for n in ("a", "b")]
    regions.append({"name": "c", "state_dir": str(tmp_path / "state" / "c"), "registry_only": True})
    specs = replica_specs(parse_config({"regions": regions}, str(tmp_path / "photon.toml"), tmp_path))
    by_replica = {s.replica: s for s in specs}
    assert [by_replica[r].election_timeout_scale for r in range(5)] == [1.0, 1.0, REGISTRY_ONLY_ELECTION_SCALE,
                                                                        1.0, 1.0]
    near, far = by_replica[0].raft_settings(), by_replica[2].raft_settings()
    assert far.raft_min_timeout_s >= near.raft_max_timeout_s   # c times out only after a and b would have


def test_packed_commits_keep_the_order_and_the_rule_of_one_winner_per_id():
    """What the leader proposes (``OP_COMMIT_RUNS``, ids packed per process) decides exactly as the model
    (first token wins, the same token again is OK, below the GC boundary TOO_OLD), whichever shape a
    request has: bulk-appendable runs, duplicates, out-of-order ids, runs spanning buckets, interleaved
    processes, runs in time order among ids already held."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    width = 10                                    # tiny buckets: runs often span several

    @settings(max_examples=150, deadline=None)
    @given(st.lists(st.tuples(st.sampled_from("AB"), st.lists(st.tuples(st.integers(1, 3), st.integers(0, 45)),
                                                              max_size=25), st.booleans()), max_size=12),
           st.integers(0, 20), st.sampled_from([width, 1000]))
    def check(requests, boundary, bucket_us):
        s = ShardState(bucket_us=bucket_us)
        s.apply([(OP_ADVANCE_GC, T0 + boundary)])
        model: dict[str, str] = {}
        for token, picks, in_order in requests:
            if in_order:      # one process's ids in time order, often among ids it already holds (merged)
                picks = sorted(set(picks))
            ids = [eid(n, proc=p) for p, n in picks]
            want = []
            for i in ids:
                if int(i[-16:]) < T0 + boundary:
                    want.append(TOO_OLD)
                elif model.setdefault(i, token) == token:
                    want.append(OK)
                else:
                    want.append(EXISTS)
            got = s.apply([(OP_COMMIT_RUNS, token, pack_ids(ids), T0)])[0]
            assert [CommitResult(c) for c in got] == want
        held = {i for i in model}
        assert s.ids_held == len(held)
        assert all(s.token_of(i) == t for i, t in model.items())
        assert s.lookup(sorted(held)) == [True] * len(held)

    check()


def test_a_packed_command_is_a_few_strings_not_one_object_per_id():
    ids = [eid(n, proc=1 + n // 500) for n in range(1000)]
    runs = pack_ids(ids)
    assert [(p, len(raw) // 8) for p, raw in runs] == [("10.0.0.1:1", 500), ("10.0.0.1:2", 500)]
    packed = len(pickle.dumps((OP_COMMIT_RUNS, "t", runs, T0)))
    assert packed < len(pickle.dumps((OP_COMMIT, "t", ids, T0))) / 3
    s = ShardState()
    assert s.apply([(OP_COMMIT_RUNS, "t", runs, T0)])[0] == bytes(1000)
    assert s.lookup(ids) == [True] * 1000


def test_runs_are_judged_and_offset_whole_as_id_by_id():
    """stamps_increase / stamp_offsets (one big-integer step per run) agree with a comparison and a
    subtraction per timestamp, for increasing runs and runs that repeat or go back; a run holding values far
    out of range (negative, near 2**63) after a first timestamp in range is never judged increasing unless
    it is."""
    import random
    from array import array
    from operator import lt
    from idregistry._state import stamp_offsets, stamps_increase
    rng = random.Random(7)
    base = (T0 // 3_600_000_000) * 3_600_000_000
    wild = [-1, -2**40, -2**63, 2**62, 2**63 - 1, 2**56, 2**55 - 1, 0, 1]
    for trial in range(3000):
        n = rng.choice([1, 2, 3, 7, 64, 500])
        first = base + rng.randrange(0, 10**6)
        stamps = [first]
        for _ in range(n - 1):
            stamps.append(stamps[-1] + rng.choice([1, 1, 2, 1000]))
        kind = trial % 4
        if kind == 1 and n > 1:                       # a repeat or a step back somewhere
            i = rng.randrange(1, n)
            stamps[i] = stamps[i - 1] - rng.choice([0, 1, 5])
        elif kind == 2 and n > 1:                     # a wild value somewhere after the first
            stamps[rng.randrange(1, n)] = rng.choice(wild)
        raw = array("q", stamps).tobytes()
        increasing = all(map(lt, stamps, stamps[1:]))
        if all(0 <= t < 2**54 for t in stamps):
            assert stamps_increase(raw, n) == increasing, stamps
        else:                                         # out of range: never taken for increasing
            assert increasing or not stamps_increase(raw, n), stamps
        if increasing and stamps[-1] < base + 2**32:
            assert stamp_offsets(raw, n, base) == array("I", [t - base for t in stamps])
