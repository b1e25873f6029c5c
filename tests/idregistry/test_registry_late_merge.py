"""Late ids (a writer's clicks committed after newer ones of the same writer) merged into a run in bulk
(``_Run.merge_sorted``) decide and store exactly as inserting them one by one would, never change arrays a
snapshot still reads, never make a lookup overlapping the merge answer from ids moved under it, and leave lookups, tokens and GC as the plain model says. No cluster needed."""
from __future__ import annotations

import pickle
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idregistry._state import (EXISTS_CODE, NO_TOKEN, OP_ADVANCE_GC, OP_COMMIT_RUNS, CommitResult, ShardState,
                               _Run, pack_ids)

pytestmark = pytest.mark.timeout(120)

T0 = 1_763_712_000_000_000
TOP = 2**32 - 1                     # the largest offset a run can hold

# offsets from a few narrow ranges (so that batches collide with held ids), one of them at the top of 32 bits
OFFSETS = st.one_of(st.integers(0, 40), st.integers(TOP - 40, TOP), st.integers(1000, 1010))
TOKENS = st.sampled_from([1, 2, 3, 2**32 - 1])


def _run_of(model: dict[int, int], tokens_dropped: bool) -> _Run:
    run = _Run()
    run.offsets = array("I", sorted(model))
    run.tokens = None if tokens_dropped else array("I", (model[o] for o in sorted(model)))
    return run


def _one_by_one(model: dict[int, int], offs: list[int], token: int) -> tuple[bytes, int]:
    """The plain rule, offset by offset: absent -> inserted (OK); held -> OK under the same token, else
    EXISTS."""
    results, added = bytearray(), 0
    for off in offs:
        held = model.get(off)
        if held is None:
            model[off] = token
            added += 1
            results.append(0)
        else:
            results.append(0 if held == token else EXISTS_CODE)
    return bytes(results), added


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(OFFSETS, st.sampled_from([NO_TOKEN, 1, 2, 3])), max_size=40), st.booleans(),
       st.lists(st.tuples(st.sets(OFFSETS, max_size=30), TOKENS, st.sampled_from(["none", "freeze", "release"])),
                min_size=1, max_size=8))
def test_merge_sorted_decides_and_stores_as_inserting_one_by_one(held, tokens_dropped, batches):
    """Random runs (offsets at 0 and near 2**32, tokens cleared or not, the token array dropped), merged with
    batches holding offsets absent, held under the same token and held under another; a snapshot may be
    taken before any batch (the run is shared until released) and must keep reading what it read."""
    model = dict(held)
    if tokens_dropped:
        model = {o: NO_TOKEN for o in model}
    run = _run_of(model, tokens_dropped)
    frozen = []                       # (offsets array, tokens array or None, length, contents then)
    for offs, token, snapshot in batches:
        if snapshot == "freeze":
            run.shared = True
            frozen.append((run.offsets, run.tokens, len(run.offsets), run.offsets.tolist(),
                           None if run.tokens is None else run.tokens.tolist()))
        elif snapshot == "release":       # written: the run may change in place again
            run.shared = False
            frozen.clear()
        offs = sorted(offs)
        want = _one_by_one(model, offs, token)
        results, added = run.merge_sorted(array("I", offs), token)
        assert (bytes(results), added) == want
        assert run.offsets.tolist() == sorted(model)
        assert run.token_array().tolist() == [model[o] for o in sorted(model)]
        assert all(run.find(o) == i for i, o in enumerate(sorted(model)))
        for offsets, tokens, n, then_offsets, then_tokens in frozen:      # what each snapshot reads
            assert offsets[:n].tolist() == then_offsets
            assert tokens is None or tokens[:n].tolist() == then_tokens


def test_a_late_batch_is_merged_in_place_unless_a_snapshot_reads_the_run():
    run = _run_of({o: 1 for o in range(0, 100, 2)}, False)
    offsets, tokens = run.offsets, run.tokens
    assert run.merge_sorted(array("I", [51, 53, 200]), 2) == (bytearray(3), 3)
    assert run.offsets is offsets and run.tokens is tokens            # no snapshot: the arrays stay
    assert run.offsets[25:28].tolist() == [50, 51, 52] and run.tokens[25:28].tolist() == [1, 2, 1]
    run.shared = True
    assert run.merge_sorted(array("I", [1, 3]), 3) == (bytearray(2), 2)
    assert run.offsets is not offsets and run.tokens is not tokens and not run.shared
    assert offsets.tolist()[:3] == [0, 2, 4] and run.offsets.tolist()[:5] == [0, 1, 2, 3, 4]
    # held ones (same token: OK, another: EXISTS) among absent ones
    assert run.merge_sorted(array("I", [2, 3, 5]), 3) == (bytearray([EXISTS_CODE, 0, 0]), 1)


class _MovedWhileRead(array):
    """A run's offsets that, the first time a lookup slices them (after bisecting them for its stretch), first
    let ``hook`` run: what another thread applying a command between the lookup's C calls would do."""

    hook = None

    def __getitem__(self, key):
        if isinstance(key, slice) and self.hook is not None:
            hook, self.hook = self.hook, None
            hook()
        return array.__getitem__(self, key)


@pytest.mark.parametrize("move", ["merge", "insert", "remove"])
def test_a_lookup_that_overlaps_ids_moved_in_place_reads_them_again(move):
    """The lookup bisects the run for the stretch of its offsets (50..60: indexes 25..30), then a late batch is
    merged in place below it (or one id inserted, or one removed), then the lookup slices that stretch: without
    reading again it would see ids shifted by the move and answer some held ids absent."""
    run = _run_of({o: 1 for o in range(0, 100, 2)}, False)
    offsets = _MovedWhileRead("I", run.offsets)
    run.offsets = offsets
    offsets.hook = {"merge": lambda: run.merge_sorted(array("I", [1, 3, 5]), 2),
                    "insert": lambda: run.insert(7, 2),
                    "remove": lambda: run.remove(0)}[move]
    asked = [50, 52, 54, 56, 58, 60, 51]
    assert run.holds(asked) == [True] * 6 + [False]
    assert run.offsets is offsets and offsets.hook is None             # moved in place, while read
    assert run.moves == 2
    assert run.holds(asked) == [True] * 6 + [False]


def _contents(state: ShardState):
    return (sorted(state.entries()), state.ids_held, dict(state.token_names), dict(state.token_bucket),
            state.gc_boundary_us, state.next_token)


WIDTH = 1000


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["commit", "commit", "commit", "freeze", "gc"]),
                          st.sampled_from("ABC"), st.sampled_from([1, 2]),
                          st.sets(st.integers(0, 2 * WIDTH - 1), max_size=25)), max_size=14))
def test_late_commits_through_the_state_keep_lookups_tokens_gc_and_snapshots(steps):
    """Commits of one process's ids in time order, often among newer ids it holds (merged), interleaved with
    snapshots taken between commits and GC: every decision, lookup, token and count is the model's, and each
    snapshot reads back as the state was when it was taken."""
    s = ShardState(bucket_us=WIDTH)
    model: dict[str, str] = {}
    boundary = T0
    views = []
    for kind, token, proc, picks in steps:
        if kind == "freeze":
            views.append((s.freeze(), _contents(s)))
            continue
        if kind == "gc":
            boundary += 300
            s.apply([(OP_ADVANCE_GC, boundary)])
            model = {i: t for i, t in model.items() if int(i[-16:]) // WIDTH >= boundary // WIDTH}
            continue
        ids = [f"10.0.0.1:{proc}:{T0 + n:016d}" for n in sorted(picks)]
        want = []
        for i in ids:
            if int(i[-16:]) < boundary:
                want.append(CommitResult.TOO_OLD)
            elif model.setdefault(i, token) == token:
                want.append(CommitResult.OK)
            else:
                want.append(CommitResult.ALREADY_EXISTS)
        got = s.apply([(OP_COMMIT_RUNS, token, pack_ids(ids), T0)])[0]
        assert [CommitResult(c) for c in got] == want
    assert s.ids_held == len(model)
    every = [f"10.0.0.1:{p}:{T0 + n:016d}" for p in (1, 2) for n in range(2 * WIDTH)]
    assert s.lookup(every) == [i in model and int(i[-16:]) >= boundary for i in every]
    assert all(s.token_of(i) == (t if int(i[-16:]) >= boundary else None) for i, t in model.items())
    for view, then in views:
        restored = pickle.loads(pickle.dumps(view, pickle.HIGHEST_PROTOCOL))
        view.release()
        assert _contents(restored) == then


def test_a_late_batch_longer_than_the_cached_lanes_is_merged_and_a_held_id_deep_inside_is_found():
    """Batches and runs of thousands of ids (past the 2,048 lanes whose constants are cached), interleaved;
    one held offset in the middle of such a batch sends it offset by offset, with the same decisions."""
    model = {o: 1 + o % 3 for o in range(0, 12_000, 2)}
    run = _run_of(model, False)
    batch = list(range(3001, 9001, 2))                         # 3,000 absent, among 3,000 held
    assert run.merge_sorted(array("I", batch), 7) == _one_by_one(model, batch, 7)
    assert run.offsets.tolist() == sorted(model) and run.tokens.tolist() == [model[o] for o in sorted(model)]
    batch = list(range(9001, 11_001, 2)) + [11_002] + list(range(11_003, 16_001, 2))   # 11,002 held under 2
    results, added = run.merge_sorted(array("I", batch), 7)
    assert (bytes(results), added) == _one_by_one(model, batch, 7)
    assert results[1000] == EXISTS_CODE and added == len(batch) - 1
    assert run.offsets.tolist() == sorted(model) and run.tokens.tolist() == [model[o] for o in sorted(model)]
