"""The pure per-request core: dedup within a request, lookups, adapter outcomes, commit outcome mapping."""
from __future__ import annotations

import pytest

from joiner import Outcome
from joiner._state import COMMIT_OUTCOME, JoinBatch
from photon import OUTCOMES

from fake_registry import FakeCommitResult as R
from joiner_helpers import click_id, clicks, query_id, query_line

J, AJ, NF, T, U, L = (int(o) for o in Outcome)


def concat(foreign: bytes, primary: bytes) -> bytes:
    return foreign + b"|" + primary


def test_outcome_numbers_match_the_proto():
    from joiner import joiner_pb2 as pb
    assert [(o.name, int(o)) for o in Outcome] == [(n, pb.Outcome.Value(n)) for n in pb.Outcome.keys()]
    assert OUTCOMES[3] is Outcome.THROTTLED


def test_commit_results_are_the_registry_numbers():
    from idregistry import CommitResult
    assert {r.name: int(r) for r in CommitResult} == {r.name: int(r) for r in R}
    assert COMMIT_OUTCOME == {CommitResult.OK: J, CommitResult.ALREADY_EXISTS: AJ, CommitResult.TOO_OLD: U,
                              CommitResult.WRONG_SHARD: T}


def test_full_cycle_maps_every_commit_result():
    ids, refs, raws = clicks(range(5))
    b = JoinBatch(ids, refs, raws)
    assert b.ref_ids_to_look_up() == refs
    b.primaries_found([query_line(0), None, query_line(2), query_line(3), query_line(4)], concat)
    assert b.ids_to_commit() == [ids[0], ids[2], ids[3], ids[4]]
    lines = b.commit_resolved([R.OK, R.ALREADY_EXISTS, R.TOO_OLD, R.WRONG_SHARD])
    assert lines == [concat(raws[0], query_line(0))]
    assert list(b.outcomes()) == [J, NF, AJ, U, T]


def test_duplicate_id_in_a_request_is_committed_once_and_joined_once():
    ids, refs, raws = clicks([1, 2, 1, 1])
    b = JoinBatch(ids, refs, raws)
    assert b.duplicates == 2
    assert b.ref_ids_to_look_up() == [query_id(1), query_id(2)]
    b.primaries_found([query_line(1), query_line(2)], concat)
    assert b.ids_to_commit() == [click_id(1), click_id(2)]
    assert len(b.commit_resolved([R.OK, R.OK])) == 2
    assert list(b.outcomes()) == [J, J, AJ, AJ]


def test_a_failed_write_answers_lost_and_a_copy_of_the_id_already_registered():
    ids, refs, raws = clicks([1, 2, 1])
    b = JoinBatch(ids, refs, raws)
    b.ref_ids_to_look_up()
    b.primaries_found([query_line(1), query_line(2)], concat)
    assert len(b.commit_resolved([R.OK, R.ALREADY_EXISTS])) == 1
    assert b.write_failed() == [click_id(1)]
    assert list(b.outcomes()) == [L, AJ, AJ]


@pytest.mark.parametrize("first, copies", [(NF, NF), (U, U), (AJ, AJ)])
def test_duplicate_copies_follow_the_first_copy_when_it_was_not_joined(first, copies):
    ids, refs, raws = clicks([1, 1])
    b = JoinBatch(ids, refs, raws)
    b.ref_ids_to_look_up()
    if first == NF:
        b.primaries_found([None], concat)
    elif first == U:
        b.primaries_found([query_line(1)], lambda f, p: None)
    else:
        b.primaries_found([query_line(1)], concat)
        assert b.commit_resolved([R.ALREADY_EXISTS]) == []
    assert list(b.outcomes()) == [first, copies]


def test_clicks_on_one_query_look_it_up_once():
    ids, refs, raws = clicks([1, 2, 3], query={1: 9, 2: 9, 3: 8})
    b = JoinBatch(ids, refs, raws)
    assert b.ref_ids_to_look_up() == [query_id(9), query_id(8)]
    b.primaries_found([query_line(9), query_line(8)], concat)
    lines = b.commit_resolved([R.OK, R.OK, R.OK])
    assert lines == [concat(raws[0], query_line(9)), concat(raws[1], query_line(9)), concat(raws[2], query_line(8))]


def test_adapter_none_or_exception_is_unjoinable_for_that_event_only():
    ids, refs, raws = clicks(range(4))

    def picky(foreign: bytes, primary: bytes):
        if foreign == raws[1]:
            return None
        if foreign == raws[2]:
            raise KeyError("boom")
        return concat(foreign, primary)

    b = JoinBatch(ids, refs, raws)
    b.ref_ids_to_look_up()
    b.primaries_found([query_line(n) for n in range(4)], picky)
    assert b.adapter_errors == 1 and "KeyError" in b.first_error and click_id(2) in b.first_error
    assert b.ids_to_commit() == [ids[0], ids[3]]
    b.commit_resolved([R.OK, R.OK])
    assert list(b.outcomes()) == [J, U, U, J]


def test_giving_up_throttles_the_undecided_and_hands_out_no_line():
    ids, refs, raws = clicks(range(3))
    b = JoinBatch(ids, refs, raws)
    b.ref_ids_to_look_up()
    b.primaries_found([query_line(0), None, query_line(2)], concat)
    b.gave_up()  # e.g. the registry commit failed
    assert b.ids_to_commit() == []
    assert list(b.outcomes()) == [T, NF, T]


def test_event_store_failure_throttles_everything():
    b = JoinBatch(*clicks(range(3)))
    b.ref_ids_to_look_up()
    b.gave_up()
    assert list(b.outcomes()) == [T, T, T]


def test_malformed_ids_are_unjoinable_and_never_looked_up_or_committed():
    ids, refs, raws = clicks(range(3))
    ids[1] = "not-an-id"
    refs[2] = "10.0.0.1:x:1"
    b = JoinBatch(ids, refs, raws)
    assert b.bad_ids == 2 and "not-an-id" in b.first_error
    assert b.ref_ids_to_look_up() == [refs[0]]
    b.primaries_found([query_line(0)], concat)
    assert b.ids_to_commit() == [ids[0]]
    b.commit_resolved([R.OK])
    assert list(b.outcomes()) == [J, U, U]


@pytest.mark.parametrize("bad", ["::1:5:1763712000000000", "a:1:176371200000000", "a:1:17637120000000000", "a::1763712000000000",
                                 "a:1:1763712000000000\n", ""])
def test_ids_the_registry_would_refuse_never_reach_it(bad):
    ids, refs, raws = clicks(range(2))
    ids[0] = bad
    b = JoinBatch(ids, refs, raws)
    b.ref_ids_to_look_up()
    b.primaries_found([query_line(1)], concat)
    assert b.ids_to_commit() == [ids[1]]


def test_mismatched_answers_are_refused():
    with pytest.raises(ValueError, match="one ref_id and one raw"):
        JoinBatch(["a"], [], [])
    b = JoinBatch(*clicks(range(2)))
    b.ref_ids_to_look_up()
    with pytest.raises(ValueError, match="lookup results"):
        b.primaries_found([None], concat)
    b.primaries_found([query_line(0), query_line(1)], concat)
    with pytest.raises(ValueError, match="commit results"):
        b.commit_resolved([R.OK])


def test_empty_request():
    b = JoinBatch([], [], [])
    assert b.ref_ids_to_look_up() == []
    b.primaries_found([], concat)
    assert b.ids_to_commit() == [] and list(b.outcomes()) == []


def test_not_found_deferred_while_the_store_catches_up_and_copies_follow():
    ids, refs, raws = clicks([1, 2, 2, 3], query=None)
    b = JoinBatch(ids, refs, raws)
    assert b.ref_ids_to_look_up() == [query_id(1), query_id(2), query_id(3)]
    b.primaries_found([query_line(1), None, None], concat)
    assert b.defer_not_found() == 2                      # the copy of click 2 is not counted twice
    assert b.commit_resolved([R.OK]) == [concat(raws[0], query_line(1))]
    assert list(b.outcomes()) == [J, T, T, T]


def test_outcome_numbers_are_the_protos():
    """One vocabulary: joiner.proto's Outcome enum has exactly the base's Outcome names and numbers."""
    from joiner import joiner_pb2
    from photon import Outcome
    assert dict(joiner_pb2.Outcome.items()) == {o.name: int(o) for o in Outcome}
