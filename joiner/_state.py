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

from itertools import compress, repeat
from operator import eq, is_not
from typing import Callable

from photon import Outcome, all_event_ids, is_event_id



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

    ``ids`` are Photon keys (photon.EventIds.key); ``ref_ok(ref_id)`` says whether a ref_id can name a
    primary event (default: a Photon id; with ``[join].primary_time_field``, any id the config allows).
    An event whose id or ref_id is not one is UNJOINABLE at once (counted in ``bad_ids``): it can
    never be found or committed, and one malformed id must not fail the registry call of the others.

    ``whole``: the request is the usual one (distinct, well-formed ids, checked over the batch in C); its
    steps then run over the batch rather than event by event. The outcomes and bytes are the same either way.
    """

    __slots__ = ("n", "adapter_errors", "bad_ids", "first_error", "whole", "_ids", "_ref_ids", "_raws", "_out",
                 "_first", "_dups", "_refs", "_commit_idx", "_commit_lines", "_written_idx", "_tails", "_write_tails")

    def __init__(self, ids: list[str], ref_ids: list[str], raws: list[bytes], ref_ok=is_event_id) -> None:
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
        self._first: list[int]
        self._dups: list[tuple[int, int]] = []
        self._refs: list[str] = []
        self._commit_idx: list[int] = []
        self._commit_lines: list[bytes] = []
        self._written_idx: list[int] = []
        self._tails: list[bytes | None] = []     # per line to commit: what follows its stamp (None: a whole line)
        self._write_tails: list[bytes | None] = []   # the same for the lines commit_resolved handed out
        # The usual request: distinct, well-formed ids; checked over the whole batch in C (no step per event)
        self.whole = (len(set(ids)) == n and all_event_ids(ids)
                      and (all_event_ids(ref_ids) if ref_ok is is_event_id else all(map(ref_ok, ref_ids))))
        if self.whole:
            self._first = range(n)
            return
        self._first = self._one_by_one(ids, ref_ids, ref_ok)

    def _one_by_one(self, ids: list[str], ref_ids: list[str], ref_ok) -> list[int]:
        """The first copies' positions; the copies and the malformed ids noted (the request's rare shape)."""
        seen: dict[str, int] = {}
        first: list[int] = []
        dups = self._dups
        out = self._out
        for i, event_id in enumerate(ids):
            j = seen.setdefault(event_id, i)
            if j != i:
                dups.append((i, j))
                continue
            first.append(i)
            if not is_event_id(event_id) or not ref_ok(ref_ids[i]):
                out[i] = _UNJOINABLE
                self.bad_ids += 1
                if self.first_error is None:
                    self.first_error = f"malformed event id or ref id: {event_id!r} -> {ref_ids[i]!r}"
        return first

    @property
    def duplicates(self) -> int:
        """Copies of an id already present earlier in this request."""
        return len(self._dups)

    def ref_ids_to_look_up(self) -> list[str]:
        """The distinct primary ids the first copies refer to, in first-seen order."""
        ref_ids, out = self._ref_ids, self._out
        if self.whole and out_all_pending(out):
            self._refs = list(dict.fromkeys(ref_ids))
        else:
            self._refs = list(dict.fromkeys([ref_ids[i] for i in self._first if out[i] == _PENDING]))
        return self._refs

    def primaries_found(self, primaries: list[bytes | None], build, served_by: list | None = None) -> None:
        """``primaries[k]`` answers ``ref_ids_to_look_up()[k]``. Missing primary: NOT_FOUND. Otherwise
        ``build`` makes the joined line; None or an exception from it: UNJOINABLE (that event only).
        With ``served_by`` (``served_by[k]`` names the store that answered ``primaries[k]``), ``build`` is a
        mapping from those names to builds, so the joined line can say who served its primary.

        A build with a ``heads(foreigns, primaries)`` attribute (the splice adapter's) makes the lines of
        all the events one store served at once, each cut before its stamp's digits (``build.tail`` follows
        them); an event it answers None for is built on its own."""
        if len(primaries) != len(self._refs):
            raise ValueError(f"{len(primaries)} lookup results for {len(self._refs)} primary ids")
        out, ref_ids = self._out, self._ref_ids
        if served_by is not None and len(set(served_by)) == 1:
            build, served_by = build[served_by[0]], None
        whole = self.whole and out_all_pending(out)
        if whole and len(self._refs) == self.n:     # every event its own primary: the answers in request order
            todo = range(self.n)
            prims = list(primaries)
        elif whole:
            todo = range(self.n)
            prims = list(map(dict(zip(self._refs, primaries)).__getitem__, ref_ids))
        else:
            found = dict(zip(self._refs, primaries))
            todo = [i for i in self._first if out[i] == _PENDING]
            prims = list(map(found.__getitem__, map(ref_ids.__getitem__, todo)))
        if None in prims:
            for i, p in zip(todo, prims):
                if p is None:
                    out[i] = _NOT_FOUND
            keep = list(map(is_not, prims, repeat(None)))
            todo, prims = list(compress(todo, keep)), list(compress(prims, keep))
        if served_by is None:
            self._build(build, todo, prims)
            return
        by_ref = dict(zip(self._refs, served_by))
        stores = list(map(by_ref.__getitem__, map(ref_ids.__getitem__, todo)))
        for store in dict.fromkeys(stores):
            mine = list(map(eq, stores, repeat(store)))
            self._build(build[store], list(compress(todo, mine)), list(compress(prims, mine)))
        idx = self._commit_idx      # back into request order (the stores' groups came one after the other)
        order = sorted(range(len(idx)), key=idx.__getitem__)
        self._commit_idx = list(map(idx.__getitem__, order))
        self._commit_lines = list(map(self._commit_lines.__getitem__, order))
        self._tails = list(map(self._tails.__getitem__, order))

    def _build(self, build, todo, primaries: list[bytes]) -> None:
        """The lines of events ``todo`` (their primaries found), made at once where the build can."""
        raws = self._raws
        foreigns = raws if type(todo) is range else list(map(raws.__getitem__, todo))
        heads = getattr(build, "heads", None)
        made = None
        if heads is not None and todo:
            try:
                made = heads(foreigns, primaries)
            except Exception:       # each event is then built on its own, and a failure counted there
                made = None
        idx, lines, tails = self._commit_idx, self._commit_lines, self._tails
        if made is not None and None not in made:
            idx.extend(todo)
            lines.extend(made)
            tails.extend([build.tail] * len(made))
            return
        out = self._out
        for k, i in enumerate(todo):
            if made is not None and made[k] is not None:
                idx.append(i)
                lines.append(made[k])
                tails.append(build.tail)
                continue
            try:
                line = build(foreigns[k], primaries[k])
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
                tails.append(None)

    def render(self, lines: list[bytes], built_us: int, stamp_us: int) -> bytes:
        """The bytes to write for ``lines`` (what :meth:`commit_resolved` returned; the build's stamp was
        ``built_us``): each line stamped ``stamp_us`` instead and ended by a newline. Lines made at once are
        the lines up to their stamp's digits: when all are, and one tail follows them all, this is a single
        join; whole lines have their stamp replaced one by one."""
        tails = self._write_tails
        if len(tails) != len(lines):
            raise ValueError(f"{len(lines)} lines to render, {len(tails)} handed out by commit_resolved")
        if not lines:
            return b""
        stamp = b"%d" % stamp_us
        first = tails[0]
        if first is not None and tails.count(first) == len(tails):
            end = stamp + first + b"\n"
            return end.join([*lines, b""])         # one copy of the request's bytes (join, then + end: two)
        old, new = b'"joined_at_us":%d' % built_us, b'"joined_at_us":' + stamp
        return b"".join([line + stamp + tail + b"\n" if tail is not None else line.replace(old, new, 1) + b"\n"
                         for line, tail in zip(lines, tails)])

    def ids_to_commit(self) -> list[str]:
        """The foreign ids whose joined line was built, to commit with this attempt's token."""
        ids, idx = self._ids, self._commit_idx
        return list(ids) if len(idx) == self.n else list(map(ids.__getitem__, idx))

    def commit_resolved(self, results: list[int]) -> list[bytes]:
        """``results[k]`` is the registry's CommitResult for ``ids_to_commit()[k]``. Returns the joined
        lines to write: exactly those whose commit was OK. ALREADY_EXISTS: ALREADY_REGISTERED; TOO_OLD:
        UNJOINABLE; anything else: THROTTLED. Write them as :meth:`render` makes them."""
        idx, lines, tails = self._commit_idx, self._commit_lines, self._tails
        if len(results) != len(idx):
            raise ValueError(f"{len(results)} commit results for {len(idx)} ids")
        out = self._out
        self._commit_idx, self._commit_lines, self._tails = [], [], []
        if not any(results):        # every commit OK (0): the usual request (truth in C; == 0 on an IntEnum is slower)
            if len(idx) == self.n:
                out[:] = bytes([_JOINED]) * self.n
            else:
                for i in idx:
                    out[i] = _JOINED
            self._written_idx, self._write_tails = idx, tails
            return lines
        write: list[bytes] = []
        written = self._written_idx = []
        wtails = self._write_tails = []
        for k, r in enumerate(results):
            o = COMMIT_OUTCOME.get(r, _THROTTLED)
            out[idx[k]] = o
            if o == _JOINED:
                write.append(lines[k])
                written.append(idx[k])
                wtails.append(tails[k])
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
        self._commit_idx, self._commit_lines, self._tails = [], [], []
        out = self._out
        if _PENDING not in out:
            return
        for i in self._first:
            if out[i] == _PENDING:
                out[i] = _THROTTLED

    def outcomes(self) -> bytearray:
        """One outcome number per event, in request order (see :data:`OUTCOMES`)."""
        out = self._out
        if _PENDING in out:
            for i in self._first:
                if out[i] == _PENDING:  # a step was skipped: never claim more than was done
                    out[i] = _THROTTLED
        for i, j in self._dups:
            o = out[j]
            out[i] = _ALREADY if o in (_JOINED, _LOST) else o
        return out


def out_all_pending(out: bytearray) -> bool:
    """Whether no event of the request is decided yet."""
    return out.count(_PENDING) == len(out)


def throttled(n: int) -> bytearray:
    """Outcomes of a request refused at the door: all THROTTLED."""
    return bytearray([_THROTTLED]) * n
