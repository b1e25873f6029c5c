"""The pure core: batch resolution, garbage collection, tokens, storage. No cluster needed."""
from __future__ import annotations

import pickle

import pytest

from photon import BadEventId
from idregistry._state import (OP_ADVANCE_GC, OP_CLEAR_TOKENS, OP_COMMIT, OP_DELETE, CommitResult, Sharding,
                               ShardState, bucket_width_us, shard_of, validate_ids)

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
