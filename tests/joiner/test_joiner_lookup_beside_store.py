"""A request asking ``look_up`` (the dispatcher's ``[dispatcher].lookups_at_joiners``): the joiner looks its ids
up in the registry beside its event store lookup, and the held ids answer ALREADY_REGISTERED, never committed.
The request must end as it would have had the held ids been dropped before it came (the dispatcher's own
lookup), and a lookup that fails or is late must only leave the commit to decide."""
from __future__ import annotations

import threading

from hypothesis import given, settings
from hypothesis import strategies as st

import joiner._shell as shell
from joiner import Outcome
from joiner._adapter import SpliceAdapter
from joiner._state import JoinBatch
from photon import is_event_id, wait_until

from fake_registry import FakeCommitResult as R
from fake_registry import FakeRegistry
from joiner_helpers import click_id, clicks, joined_lines, query_id, query_line, write_queries

J, AJ, NF, T, U, L = (int(o) for o in Outcome)
BUILT, COMMITTED = 1_763_712_345_678_901, 1_763_712_345_999_999


def _run(ids, refs, raws, primaries, results, held=None):
    """One request through JoinBatch; with ``held`` (a set of ids), looked up beside the store as the shell does."""
    b = JoinBatch(ids, refs, raws)
    asked = b.ids_to_look_up() if held is not None else None
    looked = b.ref_ids_to_look_up()
    b.primaries_found([primaries[r] for r in looked], SpliceAdapter("a", "a-j0", "query").bind(BUILT))
    if held is not None:
        present = [i in held for i in asked]
        assert b.registered(present) == sum(present)
    committed = b.ids_to_commit()
    lines = b.commit_resolved([results.get(i, R.OK) for i in committed])
    return committed, (b.render(lines, BUILT, COMMITTED) if lines else b""), list(b.outcomes())


def _dropped_first(ids, refs, raws, primaries, results, held):
    """The simple form: the held ids dropped before the request (each answered ALREADY_REGISTERED), the rest
    joined as a request of their own. Only an id whose first copy can be looked up (id and ref well formed)
    is dropped, as the joiner looks up only those."""
    first: dict[str, int] = {}
    for k, i in enumerate(ids):
        first.setdefault(i, k)
    drop = [i in held and is_event_id(i) and is_event_id(refs[first[i]]) for i in ids]
    keep = [k for k, d in enumerate(drop) if not d]
    committed, data, outs = _run([ids[k] for k in keep], [refs[k] for k in keep], [raws[k] for k in keep],
                                 primaries, results)
    out = [AJ] * len(ids)
    for k, o in zip(keep, outs):
        out[k] = o
    return committed, data, out


@settings(max_examples=300, deadline=None)
@given(picks=st.lists(st.tuples(st.integers(0, 9), st.integers(0, 5)), min_size=0, max_size=14),
       missing=st.sets(st.integers(0, 5), max_size=3), refused=st.sets(st.integers(0, 9), max_size=2),
       held=st.sets(st.integers(0, 9), max_size=10), bad_id=st.booleans(), bad_ref=st.booleans())
def test_held_ids_end_as_if_dropped_before_the_request(picks, missing, refused, held, bad_id, bad_ref):
    """Copies, malformed ids and refs, missing primaries, commits answered ALREADY_EXISTS, any set of held ids:
    the outcomes, the ids committed and the bytes written equal those of the request with the held ids
    dropped before it (answered ALREADY_REGISTERED)."""
    ids = [click_id(c) for c, _ in picks]
    refs = [query_id(q) for _, q in picks]
    if bad_id and ids:
        ids[0] = "not-an-id"
    if bad_ref and refs:
        refs[-1] = "not-a-ref"
    raws = [b'{"click_id":"%s","x":1}' % i.encode() for i in ids]
    primaries = {query_id(q): None if q in missing else query_line(q) for q in range(6)}
    primaries["not-a-ref"] = None
    results = {click_id(c): R.ALREADY_EXISTS for c in refused}
    held_ids = {click_id(c) for c in held}
    assert _run(list(ids), list(refs), list(raws), primaries, results, held_ids) == \
        _dropped_first(ids, refs, raws, primaries, results, held_ids)


def test_a_whole_request_with_no_id_held_is_joined_as_without_the_lookup():
    ids, refs, raws = clicks(range(5))
    primaries = {query_id(n): query_line(n) for n in range(5)}
    assert _run(ids, refs, raws, primaries, {}, set()) == _run(ids, refs, raws, primaries, {})


def test_a_lookup_answer_of_the_wrong_length_is_refused():
    b = JoinBatch(*clicks(range(3)))
    b.ids_to_look_up()
    try:
        b.registered([True, False])
    except ValueError:
        return
    raise AssertionError("a short lookup answer was taken")


# ------------------------------------------------------------------ the shell: the lookup beside the store


class LookupRegistry(FakeRegistry):
    """A FakeRegistry whose lookups can fail, hang, or answer short, and are counted."""

    def __init__(self) -> None:
        super().__init__()
        self.lookups: list[list[str]] = []
        self.lookup_fails: Exception | None = None
        self.lookup_gate: threading.Event | None = None
        self.short = False

    def lookup(self, ids):
        self.lookups.append(list(ids))
        if self.lookup_gate is not None:
            self.lookup_gate.wait(30)
        if self.lookup_fails is not None:
            raise self.lookup_fails
        present = super().lookup(ids)
        return present[:-1] if self.short else present


def _held_before(reg: LookupRegistry, ns) -> None:
    assert all(r == R.OK for r in reg.commit([click_id(n) for n in ns], "another-joiner/1/1/1"))


def test_held_ids_answer_already_registered_and_are_neither_committed_nor_written(stack):
    reg = LookupRegistry()
    s = stack(reg)
    write_queries(s.root, range(8))
    s.wait_queries(8)
    _held_before(reg, [1, 3, 9])            # 9: its query never comes; held all the same
    out = s.client.join(*clicks(range(10)), look_up=True)
    assert out == [J, AJ, J, AJ, J, J, J, J, NF, AJ]
    assert reg.lookups == [[click_id(n) for n in range(10)]]
    assert reg.commits[-1][0] == [click_id(n) for n in (0, 2, 4, 5, 6, 7)]
    st = s.server.statistics()
    assert (st.looked_up_ids, st.lookup_held_ids, st.lookup_errors) == (10, 3, 0)
    # without look_up the registry is not asked, and a held id is decided by its commit
    assert s.client.join(*clicks([1, 11])) == [AJ, NF]
    assert len(reg.lookups) == 1
    s.server.stop()
    assert sorted(r["click_id"] for r in joined_lines(s.joined_dir)) == [click_id(n) for n in (0, 2, 4, 5, 6, 7)]


def test_a_failed_or_short_lookup_leaves_the_commit_to_decide(stack):
    reg = LookupRegistry()
    s = stack(reg)
    write_queries(s.root, range(6))
    s.wait_queries(6)
    _held_before(reg, [0])
    reg.lookup_fails = RuntimeError("replica down")
    assert s.client.join(*clicks(range(3)), look_up=True) == [AJ, J, J]      # 0 by its commit
    reg.lookup_fails, reg.short = None, True
    assert s.client.join(*clicks(range(3, 6)), look_up=True) == [J, J, J]
    assert s.server.statistics().lookup_errors == 2
    s.server.stop()
    assert sorted(r["click_id"] for r in joined_lines(s.joined_dir)) == [click_id(n) for n in range(1, 6)]


def test_a_lookup_slower_than_its_wait_is_left_behind(stack, monkeypatch):
    monkeypatch.setattr(shell, "LOOKUP_WAIT_S", 0.2)
    reg = LookupRegistry()
    reg.lookup_gate = threading.Event()
    s = stack(reg)
    write_queries(s.root, range(3))
    s.wait_queries(3)
    _held_before(reg, [2])
    try:
        assert s.client.join(*clicks(range(3)), look_up=True, timeout=20) == [J, J, AJ]
        assert s.server.statistics().lookup_errors == 1
    finally:
        reg.lookup_gate.set()
    wait_until(lambda: len(reg.lookups) == 1, 5, message="the late lookup ended")
