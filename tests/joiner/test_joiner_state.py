"""The pure per-request core: dedup within a request, lookups, adapter outcomes, commit outcome mapping."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from joiner import Outcome
from joiner._adapter import SpliceAdapter
from joiner._state import COMMIT_OUTCOME, JoinBatch, all_event_ids
from photon import OUTCOMES, is_event_id

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


# ------------------------------------------------- the whole request at once agrees with one event at a time

BUILT, COMMITTED = 1_763_712_345_678_901, 1_763_712_345_999_999

_FOREIGN_ENDS = [b'"x":1}', b'"x":"}"}', b'"x":1 }', b'"x":1}\n', b'"x":"\\u00e9"}', b'"query":1}', b'"_photon":1}',
                 b'"x":[1,{}]}', b'"x":"a\nb"}', b'"x":"a\\"b"}', b'"x":"\\\\"}', b'"x":"\\\\u"}']
# (the last three: a backslash with no \u escape, which splices; an escaped backslash before a "u", which is
# merged like any line holding the bytes \u)


def _one_at_a_time(build):
    """The same build without its ``heads``: JoinBatch then builds every line on its own."""
    return lambda foreign, primary: build(foreign, primary)


def _run(batch_args, primaries, build, served=None, results=None):
    b = JoinBatch(*batch_args)
    refs = b.ref_ids_to_look_up()
    b.primaries_found([primaries[r] for r in refs], build, None if served is None else [served[r] for r in refs])
    ids = b.ids_to_commit()
    lines = b.commit_resolved([(results or {}).get(i, R.OK) for i in ids])
    data = b.render(lines, BUILT, COMMITTED) if lines else b""
    return ids, data, bytes(b.outcomes()), b.duplicates, b.bad_ids, b.write_failed_ids()


@settings(max_examples=200, deadline=None)
@given(picks=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 4), st.sampled_from(_FOREIGN_ENDS)),
                      min_size=0, max_size=12),
       missing=st.sets(st.integers(0, 4), max_size=2), refused=st.sets(st.integers(0, 7), max_size=2),
       stores=st.lists(st.sampled_from(["cache", "logs"]), min_size=5, max_size=5), by_store=st.booleans(),
       bad=st.booleans())
def test_whole_request_bytes_and_outcomes_equal_one_at_a_time(picks, missing, refused, stores, by_store, bad):
    """Copies, bad ids, missing primaries, lines that must be merged, one or two serving stores, refused
    commits: the outcomes, the ids committed and the bytes written (the stamp moved to the commit's time)
    are the same whether the request is spliced at once or one event at a time."""
    ids = [click_id(c) for c, _, _ in picks]
    if bad and ids:
        ids[-1] = "not-an-id"
    refs = [query_id(q) for _, q, _ in picks]
    raws = [b'{"click_id":"%s",' % i.encode() + end for i, (_, _, end) in zip(ids, picks)]
    primaries = {query_id(q): None if q in missing else query_line(q) for q in range(5)}
    results = {click_id(c): R.ALREADY_EXISTS for c in refused}
    adapter = SpliceAdapter("a", "a-j0", "query")
    if by_store:
        served = {query_id(q): stores[q] for q in range(5)}
        builds = {s: adapter.bind(BUILT, s) for s in ("cache", "logs")}
        plain = {s: _one_at_a_time(b) for s, b in builds.items()}
    else:
        served, builds, plain = None, adapter.bind(BUILT), _one_at_a_time(adapter.bind(BUILT))
    fast = _run((ids, refs, raws), primaries, builds, served, results)
    slow = _run((list(ids), list(refs), list(raws)), primaries, plain, served, results)
    assert fast == slow


def test_whole_request_of_clean_clicks_is_spliced_at_once():
    """The usual request takes the batch path: its lines are their heads, stamped by one join at the write,
    byte for byte what the build makes one at a time with the commit's stamp."""
    ids, refs, raws = clicks(range(4))
    adapter = SpliceAdapter("a", "a-j0", "query")
    build = adapter.bind(BUILT, "cache")
    b = JoinBatch(ids, refs, raws)
    assert b.whole and b.ref_ids_to_look_up() == refs
    b.primaries_found([query_line(n) for n in range(4)], {"cache": build}, ["cache"] * 4)
    lines = b.commit_resolved([R.OK, R.ALREADY_EXISTS, R.OK, R.OK])
    assert bytes(b.outcomes()) == bytes([J, AJ, J, J])
    at_commit = adapter.bind(COMMITTED, "cache")
    assert b.render(lines, BUILT, COMMITTED) == b"".join(at_commit(raws[n], query_line(n)) + b"\n" for n in (0, 2, 3))
    assert len(lines) == 3 and all(line.endswith(b'"joined_at_us":') for line in lines)


def test_the_events_that_splice_are_made_at_once_beside_those_that_do_not():
    """A missing primary, a copy, a line that must be merged and two serving stores in one request: the
    others still come as heads (one join at the write), and the bytes are the build's, in request order."""
    ids, refs, raws = clicks(range(6))
    ids[5] = ids[4]                                     # a copy
    raws[1] = raws[1][:-1] + b',"t":"\\u00e9"}'          # merged, not spliced
    adapter = SpliceAdapter("a", "a-j0", "query")
    builds = {s: adapter.bind(BUILT, s) for s in ("cache", "logs")}
    b = JoinBatch(ids, refs, raws)
    assert not b.whole
    assert b.ref_ids_to_look_up() == refs[:5]
    served = ["cache", "logs", "cache", "logs", "cache"]
    b.primaries_found([query_line(0), query_line(1), None, query_line(3), query_line(4)], builds, served)
    lines = b.commit_resolved([R.OK] * 4)
    assert bytes(b.outcomes()) == bytes([J, J, NF, J, J, AJ])
    heads = [line for line in lines if line.endswith(b'"joined_at_us":')]
    assert len(heads) == 3
    at_commit = {s: adapter.bind(COMMITTED, s) for s in builds}
    assert b.render(lines, BUILT, COMMITTED) == b"".join(
        at_commit[served[n]](raws[n], query_line(n)) + b"\n" for n in (0, 1, 3, 4))


def test_a_stamp_inside_the_foreign_line_is_left_alone():
    """Only each line's own ``_photon`` stamp moves, also when the foreign line carries the same text."""
    ids, refs, _ = clicks(range(1))
    raws = [b'{"click_id":"c","note":{"joined_at_us":%d}}' % BUILT]
    b = JoinBatch(ids, refs, raws)
    b.ref_ids_to_look_up()
    b.primaries_found([b'{"q":1}'], SpliceAdapter("a", "a-j0", "query").bind(BUILT))
    data = b.render(b.commit_resolved([R.OK]), BUILT, COMMITTED)
    assert data == (raws[0][:-1] + b',"query":{"q":1},"_photon":{"region":"a","joiner":"a-j0","joined_at_us":%d}}\n'
                    % COMMITTED)


_ID_PARTS = st.sampled_from(["10.0.0.1", "1", "::1", ":x", "a\nb", "", "1.2.3.4:5", "é", "٣"])
_TAIL_PARTS = st.sampled_from(["1763712000000000", "176371200000000", "17637120000000000", "176371200000000x",
                               "17637120000000٣0", "1763712000000000\n", ":1763712000000000", ""])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_ID_PARTS, st.sampled_from(["42", "", "x", "4:2", "٣"]), _TAIL_PARTS), max_size=6))
def test_all_event_ids_agrees_with_checking_each_id(parts):
    """The batch check of the id format accepts a batch exactly when every id passes photon.is_event_id."""
    ids = [f"{ip}:{pid}:{tail}" for ip, pid, tail in parts]
    assert all_event_ids(ids) == all(is_event_id(i) is not None for i in ids)
