"""The joiner's per-request decision logic as a plain object: no sockets, threads or clock reads.

A :class:`JoinBatch` is one Join request's life, driven by the shell in this order::

    batch = JoinBatch(ids, ref_ids, raws)          # later copies of an id are set aside (joined at most once)
    refs = batch.ref_ids_to_look_up()              # unique primary ids of the first copies
    batch.primaries_found(store.lookup(refs), build)   # NOT_FOUND / UNJOINABLE decided; joined lines built
    ids = batch.ids_to_commit()                    # events whose joined line exists
    lines = batch.commit_resolved(registry.commit(ids, token))   # OK -> JOINED + its line to write
    ... write lines (flushed) ...
    outcomes = batch.outcomes()                    # one per event, request order

On any failure of the event store or the registry the shell calls :meth:`JoinBatch.gave_up` instead of the
next step: every undecided event becomes THROTTLED and no line is ever handed out, so nothing is written
without an OK commit. Lines are handed out only by :meth:`commit_resolved`, only for OK results.
"""
from __future__ import annotations

from typing import Callable

from photon import Outcome, is_event_id



_JOINED, _ALREADY, _NOT_FOUND, _THROTTLED, _UNJOINABLE, _LOST = (int(o) for o in Outcome)
_PENDING = 255

# The registry's commit results (idregistry.CommitResult: OK=0, ALREADY_EXISTS=1, TOO_OLD=2, WRONG_SHARD=3)
# mapped to outcomes, by number so that clients of the joiner never import the registry. WRONG_SHARD
# never reaches callers (the registry client refreshes and retries); it and anything unknown are retryable.
COMMIT_OUTCOME = {0: _JOINED, 1: _ALREADY, 2: _UNJOINABLE, 3: _THROTTLED}

# An event id as both photon.parse_event_id and the registry accept it (``<ip>:<pid>:<16 digits>``, the ip
# not starting with ':'), checked with one regex match (~0.3 us) instead of a full parse (~1.3 us).

Build = Callable[[bytes, bytes], "bytes | None"]
"""``build(foreign_raw, primary_raw) -> joined line | None`` (None: unjoinable); see joiner._adapter."""


class JoinBatch:
    """One Join request: ``ids[i]``, ``ref_ids[i]``, ``raws[i]`` describe the i-th foreign event.

    Duplicates within the request: only the first copy of an id is looked up and committed. A later copy
    answers ALREADY_REGISTERED when the first copy was JOINED or ALREADY_REGISTERED, and otherwise the first copy's
    own outcome (NOT_FOUND, THROTTLED, UNJOINABLE), so no copy is ever dropped as joined when it was not.
    Committing two copies with one token would be OK twice (same token is idempotent) and write the
    click twice: that is why copies never reach the registry.

    An event whose id or ref_id is not an event id is UNJOINABLE at once (counted in ``bad_ids``): it can
    never be found or committed, and one malformed id must not fail the registry call of the others.
    """

    __slots__ = ("n", "adapter_errors", "bad_ids", "first_error", "_ids", "_ref_ids", "_raws", "_out", "_first",
                 "_dups", "_refs", "_commit_idx", "_commit_lines", "_written_idx")

    def __init__(self, ids: list[str], ref_ids: list[str], raws: list[bytes]) -> None:
        n = len(ids)
        if len(ref_ids) != n or len(raws) != n:
            raise ValueError(f"a join batch needs one ref_id and one raw line per id: got {n} ids, "
                             f"{len(ref_ids)} ref_ids, {len(raws)} raws")
        self.n = n
        self.adapter_errors = 0
        self.bad_ids = 0
        self.first_error: str | None = None
        self._ids, self._ref_ids, self._raws = ids, ref_ids, raws
        self._out = bytearray(b"\xff") * n
        seen: dict[str, int] = {}
        first: list[int] = []
        dups: list[tuple[int, int]] = []
        out = self._out
        for i, event_id in enumerate(ids):
            j = seen.setdefault(event_id, i)
            if j != i:
                dups.append((i, j))
                continue
            first.append(i)
            if is_event_id(event_id) is None or is_event_id(ref_ids[i]) is None:
                out[i] = _UNJOINABLE
                self.bad_ids += 1
                if self.first_error is None:
                    self.first_error = f"malformed event id or ref id: {event_id!r} -> {ref_ids[i]!r}"
        self._first = first
        self._dups = dups
        self._refs: list[str] = []
        self._commit_idx: list[int] = []
        self._commit_lines: list[bytes] = []
        self._written_idx: list[int] = []

    @property
    def duplicates(self) -> int:
        """Copies of an id already present earlier in this request."""
        return len(self._dups)

    def ref_ids_to_look_up(self) -> list[str]:
        """The distinct primary ids the first copies refer to, in first-seen order."""
        ref_ids, out = self._ref_ids, self._out
        self._refs = list(dict.fromkeys([ref_ids[i] for i in self._first if out[i] == _PENDING]))
        return self._refs

    def primaries_found(self, primaries: list[bytes | None], build, served_by: list | None = None) -> None:
        """``primaries[k]`` answers ``ref_ids_to_look_up()[k]``. Missing primary: NOT_FOUND. Otherwise
        ``build`` makes the joined line; None or an exception from it: UNJOINABLE (that event only).
        With ``served_by`` (``served_by[k]`` names the store that answered ``primaries[k]``), ``build`` is a
        mapping from those names to builds, so the joined line can say who served its primary."""
        if len(primaries) != len(self._refs):
            raise ValueError(f"{len(primaries)} lookup results for {len(self._refs)} primary ids")
        if served_by is not None:
            by_ref = dict(zip(self._refs, served_by))
            builds = build
            build = lambda foreign, primary, ref: builds[by_ref[ref]](foreign, primary)  # noqa: E731
        else:
            plain = build
            build = lambda foreign, primary, ref: plain(foreign, primary)  # noqa: E731
        found = dict(zip(self._refs, primaries))
        out, ref_ids, raws = self._out, self._ref_ids, self._raws
        idx, lines = self._commit_idx, self._commit_lines
        for i in self._first:
            if out[i] != _PENDING:
                continue
            primary = found[ref_ids[i]]
            if primary is None:
                out[i] = _NOT_FOUND
                continue
            try:
                line = build(raws[i], primary, ref_ids[i])
            except Exception as e:  # a user adapter's bug must not fail the other events of the batch
                self.adapter_errors += 1
                if self.first_error is None:
                    self.first_error = f"{self._ids[i]}: {type(e).__name__}: {e}"
                line = None
            if line is None:
                out[i] = _UNJOINABLE
            else:
                idx.append(i)
                lines.append(line)

    def ids_to_commit(self) -> list[str]:
        """The foreign ids whose joined line was built, to commit with this attempt's token."""
        ids = self._ids
        return [ids[i] for i in self._commit_idx]

    def commit_resolved(self, results: list[int]) -> list[bytes]:
        """``results[k]`` is the registry's CommitResult for ``ids_to_commit()[k]``. Returns the joined
        lines to write: exactly those whose commit was OK. ALREADY_EXISTS: ALREADY_REGISTERED; TOO_OLD:
        UNJOINABLE; anything else: THROTTLED."""
        idx, lines = self._commit_idx, self._commit_lines
        if len(results) != len(idx):
            raise ValueError(f"{len(results)} commit results for {len(idx)} ids")
        out = self._out
        write: list[bytes] = []
        written = self._written_idx = []
        for k, r in enumerate(results):
            o = COMMIT_OUTCOME.get(r, _THROTTLED)
            out[idx[k]] = o
            if o == _JOINED:
                write.append(lines[k])
                written.append(idx[k])
        self._commit_idx, self._commit_lines = [], []
        return write

    def write_failed_ids(self) -> list[str]:
        """The ids of the lines :meth:`commit_resolved` handed out (what a failed write leaves unwritten)."""
        ids = self._ids
        return [ids[i] for i in self._written_idx]

    def write_failed(self) -> list[str]:
        """The lines :meth:`commit_resolved` handed out could not be written: their events are registered
        (this attempt's token holds them) and not in the output. Returns their ids, for the lost-ids
        ledger; once they are in it the events answer LOST (the registry holds them, the recovery job
        writes them), never JOINED, and never THROTTLED (a retry would only meet ALREADY_EXISTS and be
        counted as already registered, hiding the loss)."""
        ids, out = self._ids, self._out
        lost = [ids[i] for i in self._written_idx]
        for i in self._written_idx:
            out[i] = _LOST
        self._written_idx = []
        return lost

    def write_unrecorded(self) -> None:
        """Neither the output nor the lost-ids ledger took the lines (the joiner is stopping): the events
        answer THROTTLED, the only outcome that claims nothing."""
        out = self._out
        for i in self._written_idx:
            out[i] = _THROTTLED
        self._written_idx = []

    def defer_not_found(self) -> int:
        """The event store was catching up: a primary it did not hold may still come. Every NOT_FOUND
        becomes THROTTLED (retried, and never counted towards giving up). Returns how many."""
        out, n = self._out, 0
        for i in self._first:
            if out[i] == _NOT_FOUND:
                out[i] = _THROTTLED
                n += 1
        return n

    def gave_up(self) -> None:
        """The event store or registry failed: every undecided event becomes THROTTLED (retryable) and
        the built lines are dropped unwritten."""
        self._commit_idx, self._commit_lines = [], []
        out = self._out
        for i in self._first:
            if out[i] == _PENDING:
                out[i] = _THROTTLED

    def outcomes(self) -> bytearray:
        """One outcome number per event, in request order (see :data:`OUTCOMES`)."""
        out = self._out
        for i in self._first:
            if out[i] == _PENDING:  # a step was skipped: never claim more than was done
                out[i] = _THROTTLED
        for i, j in self._dups:
            o = out[j]
            out[i] = _ALREADY if o in (_JOINED, _LOST) else o
        return out


def throttled(n: int) -> bytearray:
    """Outcomes of a request refused at the door: all THROTTLED."""
    return bytearray([_THROTTLED]) * n
