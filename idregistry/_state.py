"""The replicated state of one registry shard, and the pure batch resolution that changes it.

Nothing here touches sockets, threads or clocks: the server hands in *operations* (already ordered by
Raft) and gets decisions back. Every replica applies the same operations in the same order, so every
replica holds the same state; that is the whole replication contract.

Operations (tuples, the first item names the kind; they travel pickled inside one Raft command):

* ``(OP_COMMIT, token, ids, now_us)``: insert each id iff absent. Result: ``bytes`` with one
  :class:`CommitResult` per id. Within one command, operations apply in order, so the first writer of
  an id wins; a later commit of the same id with the same token is ``OK`` (a retry), with another token
  ``ALREADY_EXISTS``. ``now_us`` is the proposing leader's clock: a token new to the shard is recorded as
  registered at that time (the same on every replica, since it travels in the command). A journal entry
  written before the time was carried (``(OP_COMMIT, token, ids)``) records time 0: unknown.
* ``(OP_COMMIT_RUNS, token, runs, now_us)``: the same as ``OP_COMMIT`` (what the leader proposes), with
  the ids packed by :func:`pack_ids`: a tuple of ``(prefix, timestamps)`` runs, each the consecutive ids of
  one process, its timestamps as raw int64 bytes. A command of thousands of ids pickles into a few
  strings and byte strings instead of one string object per id, and a run of increasing timestamps (the
  usual shape) is appended to the state in bulk.
* ``(OP_ADVANCE_GC, boundary_us)``: ids with a timestamp below the boundary are forgotten and answered
  ``TOO_OLD``. The boundary never goes back: an older boundary is ignored. Result: the boundary in force.
* ``(OP_CLEAR_TOKENS, ids)``: drop the tokens of ids known to be in the output (the ids stay).
  Result: how many tokens were cleared.
* ``(OP_DELETE, id, expected_token)``: remove the id only if its token still matches. Result: ``bool``.
* ``(OP_INIT_SHARDING, sharding)``: set the sharding config if none is set yet (shard 0 holds the
  authoritative copy). Result: ``None``.
* ``(OP_ADD_EPOCH, start_us, n_shards, endpoints, now_us, skew_us)``: from ``start_us`` on, ids map to
  ``n_shards`` shards. Refused (result: the reason, a string) unless ``start_us > now_us + skew_us`` and
  later than every existing epoch; ``now_us`` is the proposing leader's clock. Result: ``None`` if done.
* ``(OP_NOOP,)``: nothing; a read barrier (once applied, everything committed before it is applied too).
* ``(OP_SNAPSHOT,)``: a read barrier that also copies the shard's entries as they are between two commands
  (every replica copies; only the proposer's copy is used). Result: a :class:`ShardSnapshot`. This is what
  makes an export consistent per shard: it holds exactly the commands applied up to one log position.

Storage: ids are kept per time bucket (``bucket_us`` wide), inside a bucket per ``<server_ip>:<pid>``
prefix, as two parallel typed arrays sorted by timestamp offset (4 bytes) with a token number (4 bytes)
each. Ids of one process are strictly increasing, so inserts are appends almost always; garbage
collection drops whole buckets. That is about 8 bytes per held id plus a small per-(bucket, process) cost.

Tokens: each distinct token gets a number (``token_numbers`` / ``token_names``) and remembers the newest
bucket holding an id committed under it (``token_bucket``); when garbage collection drops buckets, every
token whose newest bucket is among them goes too, so the token table holds only tokens of held ids (plus,
until the next GC, tokens whose ids were all cleared or deleted). Numbers are handed out increasing and
never reused while anything refers to them; when the next number would not fit in 32 bits, the live tokens
are renumbered 1..k in order (the same on every replica: it is part of applying a command), so numbering
never wraps. A read in another thread that overlaps that renumbering (once per 2**32 join requests) may
see a wrong token name for an id; whether an id is held is never affected.

Registration time: ``token_time[number]`` is when the token was first committed (the leader's clock;
0 when unknown). Tokens name one join request, so the time is within that request's commit of each of
its ids' registration; it costs one dict entry per live token, not per id. Export reports it per id.

Clearing tokens (paper §3.3.3: a token is needed only until the id is known to be in the output) sets
them to :data:`NO_TOKEN`; once every id of a run is cleared, the run drops its token array, saving
4 bytes per id (:meth:`ShardState.token_bytes_saved` counts it).
"""
from __future__ import annotations

import enum
import re
import struct
import sys
from array import array
from bisect import bisect_left, bisect_right
from functools import lru_cache
from itertools import groupby, repeat
from operator import and_, eq, itemgetter, lt
from dataclasses import dataclass, field

import mmh3
import orjson

from photon import ID_REGEX, BadEventId, all_event_ids, id_timestamp_us, is_event_id, parse_event_id

OP_COMMIT = 0
OP_ADVANCE_GC = 1
OP_CLEAR_TOKENS = 2
OP_DELETE = 3
OP_INIT_SHARDING = 4
OP_ADD_EPOCH = 5
OP_NOOP = 6
OP_SNAPSHOT = 7
OP_COMMIT_RUNS = 8

NO_TOKEN = 0                   # token number of an id whose token was cleared
MAX_TOKEN_NUMBER = 2**32 - 1   # token numbers are stored as unsigned 32-bit integers
MAX_BUCKET_US = 3600 * 10**6   # offsets inside a bucket must fit in 32 bits
TIMESTAMP_SUFFIX = 17          # ":" + 16 digits


class CommitResult(enum.IntEnum):
    """One per committed id. ``WRONG_SHARD`` never reaches callers of the client: it refreshes and retries."""
    OK = 0
    ALREADY_EXISTS = 1
    TOO_OLD = 2
    WRONG_SHARD = 3


EXISTS_CODE = int(CommitResult.ALREADY_EXISTS)
TOO_OLD_CODE = int(CommitResult.TOO_OLD)


def split_id(event_id: str) -> tuple[str, int]:
    """``(prefix, timestamp_us)`` of an id; raises :class:`photon.BadEventId` naming it when malformed."""
    parse_event_id(event_id)
    return event_id[:-TIMESTAMP_SUFFIX], id_timestamp_us(event_id)


def shard_of(event_id: str, n_shards: int) -> int:
    """``mmh3(id) mod n``: the shard an id belongs to among ``n_shards``."""
    return 0 if n_shards == 1 else mmh3.hash(event_id, signed=False) % n_shards


def validate_ids(ids) -> None:
    """Raise :class:`photon.BadEventId` naming the first malformed id (the same rule every room uses)."""
    for event_id in ids:
        if type(event_id) is not str or not is_event_id(event_id):
            parse_event_id(event_id)      # raises with the precise reason


_PREFIX_RE = re.compile(ID_REGEX.rsplit(":", 1)[0] + r"\Z")      # "<server_ip>:<process_id>"
_TIMESTAMP_LIMIT = 10 ** 16                                         # 16 digits
_BIG_ENDIAN = sys.byteorder == "big"
_BELOW_0X20 = bytes(range(0x20))
TIMESTAMP_DIGITS = TIMESTAMP_SUFFIX - 1
_PREFIX_OF = itemgetter(slice(None, -TIMESTAMP_SUFFIX))      # "<server_ip>:<process_id>" of an id
_STAMP_OF = itemgetter(slice(-TIMESTAMP_DIGITS, None))       # the 16 digits


_ID_TAIL = itemgetter(slice(-TIMESTAMP_SUFFIX, None))      # ":" and the 16 digits of an id
_STAMP_FIRST_DIGITS = slice(1, None, TIMESTAMP_SUFFIX)       # in ids' tails joined: each timestamp's first digit


def stamps_of_tails(tails: str) -> list[int]:
    """The timestamps of well-formed ids whose tails (``:`` and 16 ASCII digits each) are joined in ``tails``,
    parsed in one pass in C instead of one ``int()`` per id: read as one JSON array of integers when no
    timestamp starts with ``0`` (a JSON number has no leading zero), else split and ``int()``-ed."""
    if "0" not in tails[_STAMP_FIRST_DIGITS]:
        return orjson.loads("[" + tails[1:].replace(":", ",") + "]")
    return list(map(int, tails[1:].split(":")))


def split_ids(ids) -> tuple[list[str], list[int]] | None:
    """``(prefixes, timestamps)`` of ``ids`` (``<server_ip>:<process_id>`` and the time in us of each, in
    order) when every one is well formed (``photon.is_event_id``), else None (then :func:`validate_ids` says
    why). The check of :func:`check_ids` and the parse of :func:`split_id` over the whole batch at once: the
    ids' tails are sliced and joined once for both, the timestamps parsed by :func:`stamps_of_tails`, the
    prefix pattern matched once per distinct prefix (one per process)."""
    n = len(ids)
    if not n:
        return [], []
    try:
        tails = "".join(map(_ID_TAIL, ids))
    except TypeError:                     # an id that is not a str
        return None
    digits = tails.replace(":", "")
    if (len(tails) != TIMESTAMP_SUFFIX * n or len(digits) != TIMESTAMP_DIGITS * n or not digits.isascii()
            or not digits.isdigit() or tails[::TIMESTAMP_SUFFIX] != ":" * n):
        return None
    prefixes = list(map(_PREFIX_OF, ids))
    first = prefixes[0]
    match = _PREFIX_RE.match
    if not all(match(prefix) is not None
               for prefix in ((first,) if prefixes.count(first) == n else set(prefixes))):
        return None
    return prefixes, stamps_of_tails(tails)


def split_checked(ids) -> tuple[list[str], list[int]]:
    """:func:`split_ids`, raising :class:`photon.BadEventId` naming the first malformed id instead of
    answering None."""
    split = split_ids(ids)
    if split is None:
        validate_ids(ids)                 # raises with the precise reason
        return list(map(_PREFIX_OF, ids)), list(map(int, map(_STAMP_OF, ids)))    # (never: the two agree)
    return split


def check_ids(ids) -> None:
    """:func:`validate_ids` over a whole batch without a Python step per id (about 4x faster for a batch of
    well-formed ids): an id is ``<prefix>:<16 digits>`` with a ``<server_ip>:<process_id>`` prefix, so the
    batch is well-formed iff the 17th character from the end of every id is ``:``, the last 16 characters
    of all ids joined are ASCII digits, and each distinct prefix (one per process, a few per batch) matches.
    A batch that fails is checked id by id for the precise reason."""
    if not all_event_ids(ids):
        validate_ids(ids)


def runs_to_wire(runs) -> list[tuple[str, bytes]]:
    """:func:`pack_ids` runs with their timestamps as little-endian int64 bytes (the ``IdRun`` of a
    ``CommitRequest``)."""
    if not _BIG_ENDIAN:
        return list(runs)
    out = []
    for prefix, raw in runs:
        stamps = array("q")
        stamps.frombytes(raw)
        stamps.byteswap()
        out.append((prefix, stamps.tobytes()))
    return out


def runs_from_wire(wire) -> tuple:
    """The runs of a ``CommitRequest`` (``(prefix, little-endian int64 bytes)`` pairs) as
    :func:`pack_ids` makes them, checked: each prefix must be ``<server_ip>:<process_id>`` and each
    timestamp fit 16 digits, or :class:`photon.BadEventId` names the first bad one."""
    runs = []
    for prefix, raw in wire:
        if type(prefix) is not str or not _PREFIX_RE.match(prefix):
            raise BadEventId(f"event id prefix {prefix!r} is not <server_ip>:<process_id>")
        if len(raw) % 8:
            raise BadEventId(f"timestamps of {prefix!r}: {len(raw)} bytes, not a whole number of int64s")
        raw = bytes(raw)
        # every timestamp below 2**53 (< 10**16, and not negative): the top byte of each little-endian int64
        # is 0 and the next below 0x20; checked over the bytes in C, without making an int per id
        if raw[7::8].count(0) * 8 != len(raw) or raw[6::8].translate(None, _BELOW_0X20):
            stamps = struct.unpack(f"<{len(raw) // 8}q", raw)
            bad = next((t for t in stamps if not 0 <= t < _TIMESTAMP_LIMIT), None)
            if bad is not None:
                raise BadEventId(f"event id {prefix}:{bad} has a timestamp that is not 16 digits")
        runs.append((prefix, array("q", struct.unpack(f"<{len(raw) // 8}q", raw)).tobytes() if _BIG_ENDIAN
                     else raw))
    return tuple(runs)


def run_ids(runs) -> list[str]:
    """The ids of :func:`pack_ids` runs, in order."""
    out = []
    for prefix, raw in runs:
        stamps = array("q")
        stamps.frombytes(raw)
        out.extend(f"{prefix}:{ts:016d}" for ts in stamps)
    return out


def runs_newest(runs) -> int:
    """The newest timestamp in :func:`pack_ids` runs (0 when empty)."""
    return max((max(struct.unpack(f"={len(raw) // 8}q", raw)) for _, raw in runs if raw), default=0)


def runs_count(runs) -> int:
    return sum(len(raw) // 8 for _, raw in runs)


def pack_ids(ids) -> tuple:
    """Well-formed ids as the runs of an :data:`OP_COMMIT_RUNS`: consecutive ids of one process (one
    ``<server_ip>:<process_id>`` prefix) become one ``(prefix, timestamps)`` pair, the timestamps as raw
    native int64s; the runs keep the ids' order, so the results (one per id) do too. Slicing and parsing
    run in C over the whole batch (``map``), not as a Python step per id."""
    if not ids:
        return ()
    return runs_of(list(map(_PREFIX_OF, ids)), stamps_of_tails("".join(map(_ID_TAIL, ids))))


def runs_of(prefixes: list[str], stamps: list[int]) -> tuple:
    """:func:`pack_ids` of ids given split (:func:`split_ids`)."""
    if not prefixes:
        return ()
    stamps = array("q", stamps)
    first = prefixes[0]
    if prefixes.count(first) == len(prefixes):      # the usual batch: one process's ids
        return ((first, stamps.tobytes()),)
    runs = []
    start = 0
    for prefix, group in groupby(prefixes):
        end = start + len(list(group))
        runs.append((prefix, stamps[start:end].tobytes()))
        start = end
    return tuple(runs)


# Whole runs as one big integer (little-endian hosts; int64 lanes, timestamps of 16 digits: 0 <= t < 2**54):
# one subtraction over the run instead of a Python step per id.
_LANES = sys.byteorder == "little" and array("q").itemsize == 8 and array("I").itemsize == 4
_STAMP_BOUND = 1 << 54      # above every 16-digit timestamp


_ONES_CACHED = 2048         # lanes: the cache below holds at most 256 x 16 KB; longer ones are made each time


def _ones(n: int) -> int:
    """1 in each of ``n`` 64-bit lanes."""
    return _ones_cached(n) if n <= _ONES_CACHED else int.from_bytes(b"\x01\0\0\0\0\0\0\0" * n, "little")


@lru_cache(maxsize=256)
def _ones_cached(n: int) -> int:
    return int.from_bytes(b"\x01\0\0\0\0\0\0\0" * n, "little")


def stamps_increase(raw: bytes, n: int) -> bool:
    """Whether the ``n`` timestamps in ``raw`` (native int64s, each in [0, 2**54)) strictly increase.

    Lane i of (the run shifted down one lane) - (the run without its last lane) - (1 per lane) is
    t[i+1] - t[i] - 1: at least 0 and below 2**54 (top byte 0) for every i when they increase; the first
    lane where t[i+1] <= t[i] goes negative, borrows and leaves its top byte 0xFF (or, the top lane, makes the
    whole difference negative). So the run increases iff the difference is not negative and every lane's top
    byte is 0."""
    if n < 2:
        return True
    if not _LANES:
        stamps = array("q")
        stamps.frombytes(raw)
        return all(map(lt, stamps, stamps[1:]))
    m = n - 1
    x = int.from_bytes(raw, "little")
    z = (x >> 64) - (x & ((1 << (64 * m)) - 1)) - _ones(m)
    return z >= 0 and z.to_bytes(8 * m, "little")[7::8].count(0) == m


def stamp_offsets(raw: bytes, n: int, base: int) -> array:
    """``t - base`` of each of the ``n`` timestamps in ``raw`` (native int64s, each in [base, base + 2**32)),
    as uint32s: one subtraction of ``base`` from every lane of the run, then the low half of each lane."""
    if not _LANES:
        stamps = array("q")
        stamps.frombytes(raw)
        return array("I", map(base.__rsub__, stamps))
    lanes = (int.from_bytes(raw, "little") - base * _ones(n)).to_bytes(8 * n, "little")
    out = array("I")
    out.frombytes(memoryview(lanes).cast("I")[::2].tobytes())
    return out


_SET_SPAN = 8       # _Run.holds: a set of the run's stretch when it holds at most this many ids per asked one


def bucket_width_us(gc_after_s: float) -> int:
    """Bucket width for a GC horizon: about an eighth of it, between 1 ms and an hour."""
    return int(min(MAX_BUCKET_US, max(1000, gc_after_s * 1e6 / 8)))


class _Run:
    """The ids of one process inside one bucket: sorted offsets and their token numbers.

    ``shared``: a snapshot being written (:meth:`ShardState.freeze`) still reads the first ids of these
    arrays; appending leaves those alone, but anything that changes or moves a held id first gives the run
    its own copies (:meth:`unshare`).

    ``moves``: how many times held ids were moved in place (an insertion or removal inside the arrays),
    counted up once before and once after each move (odd while one is under way). A lookup in another
    thread (:meth:`holds`) reads the arrays over several C calls; when ``moves`` changed meanwhile it reads
    again from a copy, so it never answers from ids moved under it (a held id read as absent)."""
    __slots__ = ("offsets", "tokens", "shared", "moves")

    def __init__(self) -> None:
        self.offsets = array("I")
        self.tokens: array | None = array("I")   # None: every token of this run is cleared
        self.shared = False
        self.moves = 0

    def unshare(self) -> None:
        """Before changing held ids in place: copy the arrays if a snapshot still reads them."""
        if self.shared:
            self.offsets = array("I", self.offsets)
            if self.tokens is not None:
                self.tokens = array("I", self.tokens)
            self.shared = False

    def token_array(self) -> array:
        """The token numbers, made again (all :data:`NO_TOKEN`) if the run had dropped them."""
        if self.tokens is None:
            self.tokens = array("I", bytes(4 * len(self.offsets)))
        return self.tokens

    def drop_tokens_if_cleared(self) -> bool:
        """Drop the token array when every token is cleared; True if dropped now."""
        tokens = self.tokens
        if tokens is not None and tokens.count(NO_TOKEN) == len(tokens):
            self.tokens = None
            return True
        return False

    def find(self, offset: int) -> int:
        """Index of ``offset`` or -1."""
        offsets = self.offsets
        if offsets and offsets[-1] == offset:
            return len(offsets) - 1
        i = bisect_left(offsets, offset)
        return i if i < len(offsets) and offsets[i] == offset else -1

    def holds(self, offs: list[int]) -> list[bool]:
        """Whether each of ``offs`` (any order, repeats allowed) is held, in C-level passes rather than a
        Python step per offset. Only the run's stretch between the smallest and the largest asked offset
        matters: when it is short against the batch (a writer's recent ids, the usual lookup) it becomes a
        set and each offset one hash probe; when it is long (a few ids spread over the run) each offset is
        one ``bisect_right`` inside that stretch, its left neighbour compared.

        Safe beside :meth:`ShardState.apply` in another thread: if held ids were moved in place while they
        were read (``moves`` changed, or was odd), the answer is made again from a copy of the arrays (one C
        call, so the run as it was before that move or after it). Appends move nothing."""
        moves = self.moves
        found = self._holds(self.offsets, offs)
        if moves & 1 or self.moves != moves:
            found = self._holds(self.offsets[:], offs)
        return found

    @staticmethod
    def _holds(offsets: array, offs: list[int]) -> list[bool]:
        m = len(offs)
        if not offsets or not m:
            return [False] * m
        lo = bisect_left(offsets, min(offs))
        hi = bisect_right(offsets, max(offs), lo)
        if hi - lo <= _SET_SPAN * m:
            return list(map(set(offsets[lo:hi]).__contains__, offs))
        # offsets[i - 1] for i = bisect_right(...) in [lo, hi]: equal iff held (i == 0 reads offsets[-1], the
        # largest, which an offset below offsets[0] never equals)
        after = map(bisect_right, repeat(offsets, m), offs, repeat(lo, m), repeat(hi, m))
        return list(map(eq, map(offsets.__getitem__, map((-1).__add__, after)), offs))

    def insert(self, offset: int, token: int) -> None:
        offsets, tokens = self.offsets, self.token_array()
        if not offsets or offsets[-1] < offset:
            offsets.append(offset)
            tokens.append(token)
        else:
            self.insert_at(bisect_left(offsets, offset), offset, token)

    def insert_at(self, i: int, offset: int, token: int) -> None:
        """Insert ``offset`` (with ``token``) at index ``i`` inside the arrays: a move (see ``moves``)."""
        self.unshare()
        tokens = self.token_array()
        self.moves += 1
        self.offsets.insert(i, offset)
        tokens.insert(i, token)
        self.moves += 1

    def merge_sorted(self, offs: array, token: int) -> tuple[bytearray, int]:
        """Insert each of the strictly increasing ``offs`` iff absent, under ``token``; returns one result
        per offset (0: inserted now or held under ``token``; EXISTS_CODE: held under another) and how many
        were inserted.

        The usual call (late ids: a writer's held or retried clicks, committed after newer ones of the same
        writer, none of them held yet) is done in bulk, without a Python step per id: only the run's ids
        from the first to the last incoming offset interleave with them; those and the incoming offsets are
        packed as 64-bit ``offset << 32 | token`` values and sorted together (two sorted runs: one merge in
        C), the merged offsets checked strictly increasing (no incoming offset already held) in one pass
        over 64-bit lanes (:func:`stamps_increase`), and that stretch of the run replaced by one slice
        assignment per array (a move: a lookup in another thread that overlaps it reads again, see
        :meth:`holds`). When some incoming offset is already held, or the host cannot use the lanes,
        :meth:`_merge_each` decides offset by offset.

        (Making new arrays instead, so that a lookup could never overlap a move, was measured in the pipeline:
        the runs are tens of thousands of ids, and a fresh copy of each per merge, in newly mapped pages,
        cost the registry more CPU than all its lookups' parsing.)"""
        m = len(offs)
        offsets = self.offsets
        if not m:
            return bytearray(), 0
        if not _LANES:
            return self._merge_each(offs, token)
        p = bisect_left(offsets, offs[0])
        q = bisect_right(offsets, offs[-1], p)      # offsets[p:q]: the run's ids among the incoming ones
        tokens = self.token_array()
        t = q - p
        n = t + m
        packed = bytearray(8 * n)                   # native uint64s: low half token, high half offset
        words = memoryview(packed).cast("I")
        words[0:2 * t:2] = tokens[p:q]
        words[1:2 * t:2] = offsets[p:q]
        words[2 * t::2] = array("I", (token,)) * m
        words[2 * t + 1::2] = offs
        lanes = array("Q")
        lanes.frombytes(packed)
        merged = array("Q", sorted(lanes))
        halves = memoryview(merged).cast("B").cast("I")
        check = bytearray(8 * n)                    # the merged offsets as int64s, for stamps_increase
        memoryview(check).cast("I")[0::2] = halves[1::2]
        if not stamps_increase(check, n):
            return self._merge_each(offs, token)    # some incoming offset is held already
        new_offsets = array("I", bytes(4 * n))
        new_tokens = array("I", bytes(4 * n))
        memoryview(new_offsets)[:] = halves[1::2]
        memoryview(new_tokens)[:] = halves[0::2]
        if self.shared:                             # a snapshot reads the old arrays: leave them alone
            self.offsets = offsets[:p] + new_offsets + offsets[q:]
            self.tokens = tokens[:p] + new_tokens + tokens[q:]
            self.shared = False
        else:                                       # one C-level slice assignment per array: a move
            self.moves += 1
            offsets[p:q] = new_offsets
            tokens[p:q] = new_tokens
            self.moves += 1
        return bytearray(m), m

    def _merge_each(self, offs: array, token: int) -> tuple[bytearray, int]:
        """:meth:`merge_sorted` offset by offset (one bisect each), the arrays rebuilt once from slices."""
        offsets, tokens = self.offsets, self.token_array()
        results = bytearray(len(offs))
        cuts: list[tuple[int, int]] = []          # (position in the old run, offset) of each insertion
        n, lo = len(offsets), 0
        for k, off in enumerate(offs):
            i = bisect_left(offsets, off, lo)
            if i < n and offsets[i] == off:
                if tokens[i] != token:
                    results[k] = EXISTS_CODE
            else:
                cuts.append((i, off))
            lo = i
        if cuts:
            new_offsets, new_tokens = array("I"), array("I")
            prev = 0
            for i, off in cuts:
                new_offsets.extend(offsets[prev:i])
                new_tokens.extend(tokens[prev:i])
                new_offsets.append(off)
                new_tokens.append(token)
                prev = i
            new_offsets.extend(offsets[prev:])
            new_tokens.extend(tokens[prev:])
            self.offsets, self.tokens = new_offsets, new_tokens     # new arrays: a snapshot keeps the old
            self.shared = False
        return results, len(cuts)

    def token_at(self, i: int) -> int:
        return NO_TOKEN if self.tokens is None else self.tokens[i]

    def remove(self, i: int) -> None:
        self.unshare()
        self.moves += 1
        del self.offsets[i]
        if self.tokens is not None:
            del self.tokens[i]
        self.moves += 1

    def __getstate__(self):
        return (self.offsets.tobytes(), None if self.tokens is None else self.tokens.tobytes())

    def __setstate__(self, state) -> None:
        self.shared = False
        self.moves = 0
        self.offsets = array("I")
        self.offsets.frombytes(state[0])
        if state[1] is None:
            self.tokens = None
        else:
            self.tokens = array("I")
            self.tokens.frombytes(state[1])


@dataclass
class Sharding:
    """The timestamp-based sharding config: ``epochs`` is ``[(start_us, n_shards), ...]`` by start time;
    an epoch lasts until the next one starts. ``endpoints[shard]`` lists the gRPC addresses of its replicas.
    ``version`` grows with every change."""
    epochs: list = field(default_factory=lambda: [(0, 1)])
    endpoints: dict = field(default_factory=dict)
    version: int = 0

    def shards_at(self, timestamp_us: int) -> int:
        n = self.epochs[0][1]
        for start, count in self.epochs:
            if start > timestamp_us:
                break
            n = count
        return n

    def max_shards(self) -> int:
        return max(n for _, n in self.epochs)

    def shard_for(self, event_id: str) -> int:
        """The shard holding ``event_id`` under this config (forever: epochs only ever start later)."""
        return shard_of(event_id, self.shards_at(int(event_id[-16:])))

    @property
    def one_shard(self) -> bool:
        """Every id, of any time, belongs to shard 0."""
        return len(self.epochs) == 1 and self.epochs[0][1] == 1

    def wrong_shard(self, shard: int, ids) -> list[int]:
        """Indexes of the ids that do not belong to ``shard``."""
        if len(self.epochs) == 1 and self.epochs[0][1] == 1:
            return [] if shard == 0 else list(range(len(ids)))
        return [i for i, event_id in enumerate(ids) if self.shard_for(event_id) != shard]

    @classmethod
    def from_dict(cls, d: dict) -> "Sharding":
        return cls(epochs=[(int(a), int(b)) for a, b in d["epochs"]], version=int(d["version"]),
                   endpoints={int(k): list(v) for k, v in d.get("endpoints", {}).items()})

    def as_dict(self) -> dict:
        return {"epochs": [list(e) for e in self.epochs], "version": self.version,
                "endpoints": {str(k): list(v) for k, v in self.endpoints.items()}}


@dataclass(frozen=True)
class ShardingLease:
    """A copy of the sharding config and the ids it may judge.

    Fetched (from shard 0's leader, after a read barrier) at local time ``asked_at_us``: every change
    committed after that starts later than its proposer's now + S (S = the clock-skew bound), so the copy
    maps every id timestamped below ``asked_at_us + S`` exactly as the newest config does, as long as the
    two clocks agree; ``horizon_us`` is S less what the servers' clocks may disagree by."""
    sharding: Sharding
    valid_below_us: int

    @classmethod
    def fetched(cls, sharding: Sharding, asked_at_us: int, horizon_us: int) -> "ShardingLease":
        return cls(sharding, asked_at_us + horizon_us)

    @staticmethod
    def newest(ids) -> int:
        return max(int(i[-16:]) for i in ids) if ids else 0

    def covers(self, ids) -> bool:
        return self.newest(ids) < self.valid_below_us


class _FrozenRun:
    """The first ``n`` ids of a run's arrays as :meth:`ShardState.freeze` found them; pickles as that
    :class:`_Run` (slices are taken under the GIL, so an append racing in another thread is never half seen)."""
    __slots__ = ("offsets", "tokens", "n")

    def __init__(self, offsets: array, tokens: array | None, n: int) -> None:
        self.offsets, self.tokens, self.n = offsets, tokens, n

    def __reduce__(self):
        n = self.n
        return (_thawed_run, (self.offsets[:n].tobytes(), None if self.tokens is None else self.tokens[:n].tobytes()))


class FrozenShardState:
    """A :class:`ShardState` as :meth:`ShardState.freeze` found it: pickles into what unpickles as that
    state (a ``ShardState`` with its ``_Run``s, rebuilt by :func:`_thawed_state` and :func:`_thawed_run`), so
    a snapshot reads back as one written from the state itself."""

    def __init__(self, fields: dict, runs: list) -> None:
        self._fields = fields
        self._runs = runs

    @property
    def ids_held(self) -> int:
        return self._fields["ids_held"]

    def __reduce__(self):
        return (_thawed_state, (self._fields,))

    def release(self) -> None:
        """Written: the runs may change their held ids in place again."""
        for run in self._runs:
            run.shared = False
        self._runs = []


def _thawed_run(offsets: bytes, tokens: bytes | None) -> _Run:
    run = _Run.__new__(_Run)
    run.__setstate__((offsets, tokens))
    return run


def _thawed_state(fields: dict) -> "ShardState":
    state = ShardState.__new__(ShardState)
    state.__setstate__(fields)
    return state


@dataclass(frozen=True)
class ShardSnapshot:
    """A shard's entries as they were between two applied commands (see :data:`OP_SNAPSHOT`)."""
    shard: int
    runs: list                 # (prefix, bucket base us, offsets, tokens or None), bucket and process order
    token_names: list
    gc_boundary_us: int
    ids_held: int
    token_times: dict = field(default_factory=dict)   # token number -> registered at (us; absent: unknown)

    def entries(self):
        """Every held ``(id, token, timestamp_us)``; a cleared token is ``""``."""
        return (row[:3] for row in self.rows())

    def rows(self):
        """Every held ``(id, token, timestamp_us, registered_us)``: :meth:`entries` with the time the id's
        token was first committed; 0 for a cleared token or one registered before times were recorded."""
        names, boundary, times = self.token_names, self.gc_boundary_us, self.token_times
        for prefix, base, offsets, tokens in self.runs:
            toks = tokens if tokens is not None else (NO_TOKEN for _ in offsets)
            for off, tok in zip(offsets, toks):
                ts = base + off
                if ts >= boundary:
                    yield f"{prefix}:{ts:016d}", names[tok], ts, times.get(tok, 0)


class ShardState:
    """The ids one shard holds. Change it only through :meth:`apply`; read it with :meth:`lookup`.

    Reads may run in other threads while :meth:`apply` runs (a read can miss an id being inserted at that
    moment; it never sees a half-made entry), because every mutation is a single append/insert on an array
    or a dict assignment.
    """

    def __init__(self, shard: int = 0, bucket_us: int = MAX_BUCKET_US) -> None:
        if not 0 < bucket_us <= MAX_BUCKET_US:
            raise ValueError(f"bucket_us must be in (0, {MAX_BUCKET_US}], got {bucket_us}")
        self.shard = shard
        self.bucket_us = bucket_us
        self.buckets: dict[int, dict[str, _Run]] = {}
        self.token_names: dict[int, str] = {NO_TOKEN: ""}
        self.token_numbers: dict[str, int] = {}
        self.token_bucket: dict[int, int] = {}   # token number -> newest bucket holding one of its ids
        self.token_time: dict[int, int] = {}     # token number -> registered at (leader's clock, us)
        self.next_token = NO_TOKEN + 1
        self.tokens_freed = 0
        self.gc_boundary_us = 0
        self.ids_held = 0
        self.sharding = Sharding()
        self.sharding_set = False

    def __setstate__(self, state: dict) -> None:
        """Unpickle; a snapshot written before tokens were freed with GC (a list of names) is upgraded."""
        self.__dict__.update(state)
        if "token_time" not in state:         # written before registration times were recorded: unknown
            self.token_time = {}
        if isinstance(self.token_names, list):
            names = self.token_names
            self.token_names = dict(enumerate(names))
            self.token_bucket = {}
            for b, bucket in self.buckets.items():
                for run in bucket.values():
                    for t in set(run.tokens):
                        if t != NO_TOKEN and self.token_bucket.get(t, -1) < b:
                            self.token_bucket[t] = b
            self.next_token = len(names)
            self.tokens_freed = 0
            for number in [n for n in self.token_names if n != NO_TOKEN and n not in self.token_bucket]:
                self._forget_token(number)

    # ---- reads -------------------------------------------------------------------------------------

    def _locate(self, event_id: str) -> tuple[_Run | None, int, int]:
        """``(run, index or -1, timestamp)``; run is None when the bucket or process is unknown."""
        prefix, ts = split_id(event_id)
        bucket = self.buckets.get(ts // self.bucket_us)
        run = bucket.get(prefix) if bucket is not None else None
        if run is None:
            return None, -1, ts
        return run, run.find(ts % self.bucket_us), ts

    def contains(self, event_id: str) -> bool:
        run, i, ts = self._locate(event_id)
        return i >= 0 and ts >= self.gc_boundary_us

    def lookup(self, ids) -> list[bool]:
        """Whether each id is held (ids below the GC boundary are reported absent); raises
        :class:`photon.BadEventId` naming the first malformed id."""
        return self.lookup_split(*split_checked(ids))

    def lookup_split(self, prefixes: list[str], stamps: list[int]) -> list[bool]:
        """:meth:`lookup` of ids given as their prefixes and timestamps (:func:`split_ids`), without a
        Python step per id: the ids are taken in groups of consecutive ids of one process in one bucket (a
        request's ids come sorted, so a writer's ids are one group; a group within one bucket needs no
        division per id), the offsets computed in C over each group (``map``), and each group decided by
        :meth:`_Run.holds`. Ids below the GC boundary are reported absent; a group whose bucket or process
        is unknown is absent."""
        n = len(prefixes)
        if not n:
            return []
        width, boundary = self.bucket_us, self.gc_boundary_us
        if prefixes.count(prefixes[0]) == n:            # one process's ids: one group per bucket
            runs = ((prefixes[0], n),)
        else:
            runs = [(prefix, len(list(group))) for prefix, group in groupby(prefixes)]
        buckets = self.buckets
        held = [False] * n
        start = 0
        for prefix, count in runs:
            end = start + count
            part = stamps[start:end]
            b = min(part) // width
            if max(part) // width == b:                 # one bucket (the usual case): no division per id
                groups = ((b, count),)
            else:
                groups = [(b, len(list(group))) for b, group in groupby(map(width.__rfloordiv__, part))]
            for b, size in groups:
                stop = start + size
                bucket = buckets.get(b)
                run = bucket.get(prefix) if bucket is not None else None
                if run is not None:
                    part = stamps[start:stop]
                    found = run.holds(list(map((b * width).__rsub__, part)))
                    if min(part) < boundary:            # some ids are below the GC boundary
                        found = list(map(and_, found, map(boundary.__le__, part)))
                    held[start:stop] = found
                start = stop
        return held

    def token_of(self, event_id: str) -> str | None:
        """The token of a held id ("" once cleared), or None when absent."""
        run, i, ts = self._locate(event_id)
        if i < 0 or ts < self.gc_boundary_us:
            return None
        return self.token_names[run.token_at(i)]

    def entries(self):
        """Every held ``(id, token, timestamp_us)`` in bucket and process order (a snapshot per bucket,
        not of the whole shard: use :data:`OP_SNAPSHOT` for that)."""
        return self.snapshot().entries()

    def snapshot(self) -> "ShardSnapshot":
        """A copy of the held entries (consistent only if no command applies meanwhile: call it from
        :meth:`apply`, i.e. through :data:`OP_SNAPSHOT`, when other threads may apply)."""
        runs = []
        for b in sorted(self.buckets):
            for prefix, run in list(self.buckets.get(b, {}).items()):
                tokens = run.tokens
                runs.append((prefix, b * self.bucket_us, array("I", run.offsets),
                             None if tokens is None else array("I", tokens)))
        return ShardSnapshot(self.shard, runs, dict(self.token_names), self.gc_boundary_us, self.ids_held,
                             dict(self.token_time))

    def freeze(self) -> "FrozenShardState":
        """The state as it is now, for writing a snapshot in another thread while commands go on applying
        here. Made in time proportional to the (bucket, process) runs and tokens, not to the ids: the view
        keeps each run's arrays and how many ids they held; appends leave those ids alone, and anything that
        would change or move a held id copies the run's arrays first (:meth:`_Run.unshare`). Pickles as this
        ``ShardState`` did at the call. Call it where :meth:`apply` runs (between two commands), and
        :meth:`FrozenShardState.release` once written."""
        buckets, runs = {}, []
        for b, bucket in self.buckets.items():
            frozen = {}
            for prefix, run in bucket.items():
                run.shared = True
                runs.append(run)
                frozen[prefix] = _FrozenRun(run.offsets, run.tokens, len(run.offsets))
            buckets[b] = frozen
        fields = {k: dict(v) if type(v) is dict else v for k, v in self.__dict__.items()}
        fields["buckets"] = buckets
        return FrozenShardState(fields, runs)

    def token_bytes_saved(self) -> tuple[int, int]:
        """``(ids whose run dropped its token array, bytes those arrays would hold)``."""
        ids = sum(len(run.offsets) for bucket in list(self.buckets.values()) for run in list(bucket.values())
                  if run.tokens is None)
        return ids, 4 * ids

    def approx_bytes(self) -> int:
        """Bytes of the objects holding the ids (dicts, prefix strings, runs and their arrays, as
        ``sys.getsizeof`` counts them, including spare capacity), tokens table included."""
        total = (sys.getsizeof(self.buckets) + sys.getsizeof(self.token_names) + sys.getsizeof(self.token_numbers)
                 + sys.getsizeof(self.token_bucket) + sys.getsizeof(self.token_time))
        total += sum(sys.getsizeof(name) + sys.getsizeof(number) for number, name in self.token_names.items())
        total += sum(sys.getsizeof(b) for b in self.token_bucket.values())
        total += sum(sys.getsizeof(t) for t in self.token_time.values())
        for bucket in list(self.buckets.values()):
            total += sys.getsizeof(bucket)
            for prefix, run in list(bucket.items()):
                total += (sys.getsizeof(prefix) + sys.getsizeof(run) + sys.getsizeof(run.offsets)
                          + (sys.getsizeof(run.tokens) if run.tokens is not None else 0))
        return total

    # ---- the one way to change it ------------------------------------------------------------------

    def apply(self, ops) -> list:
        """Apply one replicated command (a sequence of operations) in order; one result per operation."""
        out = []
        for op in ops:
            kind = op[0]
            if kind == OP_COMMIT_RUNS:
                out.append(self._commit_runs(op[1], op[2], op[3]))
            elif kind == OP_COMMIT:
                out.append(self._commit(op[1], op[2], op[3] if len(op) > 3 else 0))
            elif kind == OP_ADVANCE_GC:
                out.append(self._advance_gc(op[1]))
            elif kind == OP_CLEAR_TOKENS:
                out.append(self._clear_tokens(op[1]))
            elif kind == OP_DELETE:
                out.append(self._delete(op[1], op[2]))
            elif kind == OP_INIT_SHARDING:
                out.append(self._init_sharding(op[1]))
            elif kind == OP_ADD_EPOCH:
                out.append(self._add_epoch(*op[1:]))
            elif kind == OP_NOOP:
                out.append(None)
            elif kind == OP_SNAPSHOT:
                out.append(self.snapshot())
            else:
                raise ValueError(f"unknown registry operation {kind!r}")
        return out

    def _token_number(self, token: str, now_us: int = 0) -> tuple[int, bool]:
        """``(number, new?)`` of a token, interning it under the next number (registered at ``now_us``;
        0: unknown, not recorded) if it is new."""
        n = self.token_numbers.get(token)
        if n is not None:
            return n, False
        if self.next_token > MAX_TOKEN_NUMBER:
            self._renumber_tokens()
        n = self.next_token
        self.next_token = n + 1
        self.token_numbers[token] = n
        self.token_names[n] = token
        if now_us:
            self.token_time[n] = now_us
        return n, True

    def _renumber_tokens(self) -> None:
        """Number the live tokens 1..k in their order and rewrite every id's token number to match."""
        live = sorted(self.token_bucket)
        mapping = {NO_TOKEN: NO_TOKEN, **{old: new for new, old in enumerate(live, NO_TOKEN + 1)}}
        for bucket in self.buckets.values():
            for run in bucket.values():
                run.tokens = array("I", [mapping.get(t, NO_TOKEN) for t in run.tokens])
        names = {NO_TOKEN: ""}
        for old in live:
            names[mapping[old]] = self.token_names[old]
        self.token_names = names
        self.token_numbers = {name: number for number, name in names.items() if number != NO_TOKEN}
        self.token_bucket = {mapping[old]: b for old, b in self.token_bucket.items()}
        self.token_time = {mapping[old]: t for old, t in self.token_time.items() if old in mapping}
        self.next_token = len(live) + 1

    def _forget_token(self, number: int) -> None:
        self.token_bucket.pop(number, None)
        self.token_time.pop(number, None)
        name = self.token_names.pop(number)
        del self.token_numbers[name]
        self.tokens_freed += 1

    def _commit(self, token: str, ids, now_us: int = 0) -> bytes:
        """A commit carried as id strings (journal entries written before :data:`OP_COMMIT_RUNS`)."""
        return self._commit_runs(token, pack_ids(ids), now_us)

    def _commit_runs(self, token: str, runs, now_us: int = 0) -> bytes:
        # The hot path of the registry (it runs on every replica for every id). A run of one process's
        # strictly increasing timestamps inside one bucket, all after what that process already holds there
        # (the usual shape), is appended in bulk; one among what it holds (retried clicks) is merged in one
        # pass; anything else goes id by id.
        number, new_token = self._token_number(token, now_us)
        boundary, width = self.gc_boundary_us, self.bucket_us
        results = bytearray()                  # zero == CommitResult.OK
        added = 0
        newest = -1                            # the newest bucket holding an id under this token
        for prefix, raw in runs:
            stamps = array("q")
            stamps.frombytes(raw)
            count = len(stamps)
            if not count:
                continue
            first, last = stamps[0], stamps[-1]
            b = first // width
            if first >= boundary and last // width == b and first < _STAMP_BOUND and stamps_increase(raw, count):
                base = b * width
                run = self._run_of(b, prefix)
                offsets = run.offsets
                if b > newest:
                    newest = b
                if not offsets or offsets[-1] < first - base:
                    offsets.extend(stamp_offsets(raw, count, base))
                    run.token_array().extend(array("I", (number,)) * count)
                    results.extend(bytes(count))
                    added += count
                    continue
                run_results, run_added = run.merge_sorted(stamp_offsets(raw, count, base), number)
                results.extend(run_results)
                added += run_added
                continue
            run_added, run_newest = self._commit_one_by_one(number, prefix, stamps, results)
            added += run_added
            if run_newest > newest:
                newest = run_newest
        self.ids_held += added
        if added:
            if self.token_bucket.get(number, -1) < newest:
                self.token_bucket[number] = newest
        elif new_token:
            self._forget_token(number)         # no id refers to it (all refused or already held)
        return bytes(results)

    def _run_of(self, b: int, prefix: str) -> "_Run":
        """The run of one process's ids (``prefix``) in bucket ``b``, made empty when there is none yet."""
        bucket = self.buckets.get(b)
        if bucket is None:
            bucket = self.buckets[b] = {}
        run = bucket.get(prefix)
        if run is None:
            run = bucket[prefix] = _Run()
        return run

    def _commit_one_by_one(self, number: int, prefix: str, stamps, results: bytearray) -> tuple[int, int]:
        """Insert each of one process's ``stamps`` iff absent, appending one result per id to ``results``;
        returns ``(ids added, newest bucket touched or -1)``."""
        boundary, width = self.gc_boundary_us, self.bucket_us
        last_b = None
        run = None
        added = 0
        newest = -1
        for ts in stamps:
            if ts < boundary:
                results.append(TOO_OLD_CODE)
                continue
            b = ts // width
            if b != last_b:
                run = self._run_of(b, prefix)
                if run.tokens is None:
                    run.token_array()
                last_b = b
                if b > newest:
                    newest = b
            off = ts - b * width
            offsets = run.offsets
            if not offsets or offsets[-1] < off:          # the usual case: a process's next id
                offsets.append(off)
                run.tokens.append(number)
                added += 1
                results.append(0)
                continue
            i = bisect_left(offsets, off)
            if i < len(offsets) and offsets[i] == off:
                results.append(0 if run.tokens[i] == number else EXISTS_CODE)
            else:
                run.insert_at(i, off, number)
                added += 1
                results.append(0)
        return added, newest

    def _advance_gc(self, boundary_us: int) -> int:
        if boundary_us > self.gc_boundary_us:
            self.gc_boundary_us = boundary_us
            last_dropped = boundary_us // self.bucket_us   # buckets wholly below the boundary
            dropped = [b for b in self.buckets if b < last_dropped]
            for b in dropped:
                bucket = self.buckets.pop(b)
                self.ids_held -= sum(len(run.offsets) for run in bucket.values())
            if dropped:
                for number in [n for n, b in self.token_bucket.items() if b < last_dropped]:
                    self._forget_token(number)
        return self.gc_boundary_us

    def _clear_tokens(self, ids) -> int:
        cleared = 0
        touched = {}
        for event_id in ids:
            run, i, ts = self._locate(event_id)
            if i >= 0 and run.token_at(i) != NO_TOKEN:
                run.unshare()
                run.tokens[i] = NO_TOKEN
                cleared += 1
                touched[id(run)] = run
        for run in touched.values():
            run.drop_tokens_if_cleared()
        return cleared

    def _delete(self, event_id: str, expected_token: str) -> bool:
        run, i, ts = self._locate(event_id)
        if i < 0 or ts < self.gc_boundary_us or self.token_names[run.token_at(i)] != expected_token:
            return False
        run.remove(i)
        self.ids_held -= 1
        return True

    def _init_sharding(self, sharding: Sharding) -> None:
        if not self.sharding_set:
            self.sharding = sharding
            self.sharding_set = True

    def _add_epoch(self, start_us: int, n_shards: int, endpoints: dict, now_us: int, skew_us: int) -> str | None:
        current = self.sharding
        if not self.sharding_set:
            return "the sharding config is not initialised yet"
        if n_shards < 1:
            return f"a shard count must be >= 1, got {n_shards}"
        if start_us <= now_us + skew_us:
            return (f"the change must start later than now + the clock-skew bound "
                    f"({start_us} <= {now_us} + {skew_us} us)")
        if start_us <= current.epochs[-1][0]:
            return f"the change must start after the last epoch (which starts at {current.epochs[-1][0]} us)"
        merged = dict(current.endpoints)
        merged.update({int(k): list(v) for k, v in endpoints.items()})
        missing = [k for k in range(n_shards) if not merged.get(k)]
        if missing:
            return f"no replica addresses for shards {missing}"
        self.sharding = Sharding(epochs=[*current.epochs, (start_us, n_shards)], endpoints=merged,
                                 version=current.version + 1)
        return None
