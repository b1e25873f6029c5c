"""Steps over a whole chunk of lines or ids in C (``map``, ``list.index``, one regular-expression pass), with
a Python step only per exception: the dispatcher's click lines and the event store's query lines share them."""
from __future__ import annotations

import re
import sys
from bisect import bisect_right
from functools import lru_cache, partial
from itertools import accumulate
from operator import attrgetter, itemgetter

import orjson

from photon._ids import ID_KEY, ID_REGEX, TIMESTAMP_DIGITS, is_event_id

_LAZY_ID = ID_REGEX.replace(r"[^\n]*:", r"[^\n]*?:", 1)    # the same ids, found with less backtracking
ID_LINES = re.compile(r"(?:%s\n)*%s" % (_LAZY_ID, _LAZY_ID))
"""Ids joined by newlines, each one well-formed (``photon.is_event_id``): ``ID_LINES.fullmatch(joined)``."""
_GOOD_IDS = re.compile(rf"(?:{_LAZY_ID}\n)*")
"""A run of well-formed ids, each followed by a newline."""
_KEY_RE = re.compile(ID_REGEX.rsplit(":", 1)[0] + r"\Z")      # "<server_ip>:<process_id>"
_ID_TAIL = itemgetter(slice(-TIMESTAMP_DIGITS - 1, None))     # ":" and the 16 digits


def all_event_ids(ids) -> bool:
    """Whether :func:`photon.is_event_id` holds for every one of ``ids``, checked in C over the batch (one
    regular expression per distinct key ``<server_ip>:<process_id>``, not per id); False also when one is
    not a str (then check them one by one for the reason). Exact: an id is well formed iff its last 17
    characters are ``:`` and 16 ASCII digits and its key is well formed."""
    n = len(ids)
    if not n:
        return True
    try:
        tails = "".join(map(_ID_TAIL, ids))
    except TypeError:
        return False
    digits = tails.replace(":", "")
    if (len(tails) != (TIMESTAMP_DIGITS + 1) * n or len(digits) != TIMESTAMP_DIGITS * n or not digits.isascii()
            or not digits.isdigit() or tails[::TIMESTAMP_DIGITS + 1] != ":" * n):
        return False
    match = _KEY_RE.match
    return all(match(key) is not None for key in set(map(ID_KEY, ids)))


def map_marking(fn, items, errors) -> tuple[list, list[int]]:
    """``fn`` over ``items`` in C (``map``): the results where it returned, the indices where it raised one
    of ``errors``."""
    out: list = []
    failed: list[int] = []
    rest = iter(items)
    while True:
        try:
            out.extend(map(fn, rest))         # on an error, what came before stays in ``out``
            return out, failed
        except errors:
            failed.append(len(out) + len(failed))


def drop_at(items, at: list[int]) -> list:
    """``items`` without those at the (increasing) positions ``at``: slices between them, not a step per item."""
    out: list = []
    prev = 0
    for j in at:
        out.extend(items[prev:j])
        prev = j + 1
    out.extend(items[prev:])
    return out


def positions(items: list, value) -> list[int]:
    """The positions of ``value`` in ``items``, by ``list.index`` (in C): few steps when it is rare."""
    out: list[int] = []
    try:
        at = items.index(value)
        while True:
            out.append(at)
            at = items.index(value, at + 1)
    except ValueError:
        return out


def bad_id_positions(joined: str) -> list[int]:
    """The line numbers of ``joined`` (ids joined by newlines, none holding one) that are not well-formed ids:
    one regular-expression pass over the runs of good ones, stopping only at the bad ones."""
    bad: list[int] = []
    pos = line = 0
    while True:
        stop = _GOOD_IDS.match(joined, pos).end()   # (matches at least the empty string)
        line += joined.count("\n", pos, stop)
        nl = joined.find("\n", stop)
        if nl < 0:                              # the last line (no newline after it)
            if not is_event_id(joined[stop:]):
                bad.append(line)
            return bad
        bad.append(line)                        # a good line would have been taken by the run
        line += 1
        pos = nl + 1


# ---- the string fields of JSON lines, read in bulk -------------------------------------------------------

ORJSON_MAX_DEPTH = 1024
"""The deepest nesting ``orjson.loads`` reads; a line nested deeper is not valid JSON to it."""
_NUMBER_CLASSES = bytes(ord("0") if 48 <= b <= 57 else ord("e") if b in b"eE+" else ord(" ") for b in range(256))
_BIG_EXPONENT = re.compile(rb"e000")
"""In bytes mapped by :data:`_NUMBER_CLASSES` (digits to ``0``; ``e``, ``E`` and ``+`` to ``e``; the rest to a
space): an exponent of three digits or more (``e400``, ``E+400``; ``e-400`` cannot overflow)."""
_LONG_DIGITS = b"0" * 210
"""A number can overflow a double (which ``orjson.loads`` refuses: "number is infinity") only if its exponent
has three digits or more, or it has at least 210 digits before its point (``10**209 * 10**99 < 1.79e308``)."""
CHECK_WINDOW = 2048
"""Lines checked together by :func:`_flagged`: their bytes joined (and mapped) stay in the CPU's cache."""
_UTF8 = partial(str, encoding="utf-8")
_deep_refused: bool | None = None


class StringFields:
    """The string fields ``names`` of JSON lines, read a chunk at a time, with exactly the outcome of
    ``orjson.loads`` per line: for each line, the field (``(field, ...)`` for several names) when the line is
    a JSON object (to orjson) whose fields ``names`` are all strings, else None.

    A line is decoded by msgspec into a struct of those fields alone (no dict, no objects for the other
    fields: a quarter to a half of ``orjson.loads``' time on a 110-byte line), one C ``map`` over the chunk. msgspec
    validates less than orjson in what it skips: it does not check UTF-8 in the strings it skips, nor that a
    number it skips fits in a double, and it reads as deep as the interpreter's recursion limit allows. So the
    lines it reads are checked in bulk, over the chunk's bytes joined once (an ``isascii`` scan, a UTF-8
    decode only if some byte is not ASCII, one ``translate`` and two searches for a long exponent or a long
    run of digits), and the lines that fail a check (rarely any: a check may also flag a good line, never
    miss a bad one) or that msgspec refuses (a missing or non-string field, a non-object, bad JSON, a field
    repeated with a non-string first) are read by ``orjson.loads`` one by one. A chunk with many flagged lines,
    or any chunk when msgspec could read deeper than orjson, is read by orjson line by line throughout.
    """

    def __init__(self, *names: str) -> None:
        import msgspec
        if not names:
            raise ValueError("StringFields needs at least one field name")
        self.names = names
        unique = list(dict.fromkeys(names))
        attrs = {name: f"f{i}" for i, name in enumerate(unique)}
        try:
            struct = msgspec.defstruct("Fields", [(attrs[n], str) for n in unique],
                                       rename={attrs[n]: n for n in unique}, gc=False)
        except ValueError:                  # a name msgspec cannot match (a quote, a backslash, a control
            self._decode = None             # character in it): orjson reads every line
        else:
            self._decode = msgspec.json.Decoder(struct).decode
        self._get = attrgetter(*(attrs[n] for n in names))
        self._refused = (ValueError, RecursionError)    # (msgspec.DecodeError and UnicodeDecodeError are ValueErrors)

    def read(self, lines: list[bytes], utf8: bool = False) -> tuple[list, list[int]]:
        """``(values, missing)``: per line its field(s) or None, and the (increasing) positions of the Nones.
        ``utf8``: the caller has checked already that every line is valid UTF-8 (a tailer's chunk that kept
        its buffer, :attr:`photon.LogChunk.data`): then the UTF-8 check is not made again."""
        if not lines:
            return [], []
        if self._decode is None or not _bulk_safe(self._decode):
            return self._by_orjson(lines)
        get, decode = self._get, self._decode
        values: list = []
        refused: list[int] = []
        rest = iter(lines)
        while True:
            try:
                values.extend(map(get, map(decode, rest)))   # on an error, what came before stays
                break
            except self._refused:
                refused.append(len(values))
                values.append(None)
        flagged = _flagged(lines, utf8)
        if flagged is None:                              # many lines flagged: orjson throughout
            return self._by_orjson(lines)
        if flagged:
            refused = sorted(set(refused).union(flagged))
        if not refused:
            return values, refused
        missing = []
        for k in refused:
            value = self._one(lines[k])
            values[k] = value
            if value is None:
                missing.append(k)
        return values, missing

    def _one(self, line: bytes):
        """One line's field(s) by ``orjson.loads``, or None."""
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            return None
        if type(rec) is not dict:
            return None
        names = self.names
        if len(names) == 1:
            value = rec.get(names[0])
            return value if type(value) is str else None
        values = tuple(map(rec.get, names))
        return values if all(type(v) is str for v in values) else None

    def _by_orjson(self, lines) -> tuple[list, list[int]]:
        values = list(map(self._one, lines))
        return values, positions(values, None)


def _flagged(lines: list[bytes], utf8: bool = False) -> list[int] | None:
    """The positions of lines that may hold what msgspec lets pass and orjson refuses (invalid UTF-8, a number
    that overflows a double), increasing; None when more than one in sixteen are (then orjson reads them all).
    :data:`CHECK_WINDOW` lines at a time: their bytes joined by newlines, one ``isascii`` (a UTF-8 decode of
    them only if some byte is not; neither when ``utf8``: the lines are known valid UTF-8), one ``translate``
    to :data:`_NUMBER_CLASSES` and two searches."""
    flagged: list[int] = []
    limit = len(lines) // 16 + 1
    for lo in range(0, len(lines), CHECK_WINDOW):
        part = lines[lo:lo + CHECK_WINDOW]
        blob = b"\n".join(part)
        if not utf8 and not blob.isascii():
            try:
                _UTF8(blob)
            except UnicodeDecodeError:
                flagged += [lo + k for k in map_marking(_UTF8, part, UnicodeDecodeError)[1]]
        classes = blob.translate(_NUMBER_CLASSES)
        if _BIG_EXPONENT.search(classes) is not None or _LONG_DIGITS in classes:
            flagged = sorted(set(flagged).union(lo + k for k in _numbers_flagged(part, classes)))
        if len(flagged) > limit:
            return None
    return flagged


def _numbers_flagged(lines: list[bytes], classes: bytes) -> list[int]:
    """The positions of ``lines`` (whose bytes joined by newlines mapped are ``classes``) holding a long
    exponent or a long run of digits."""
    starts = list(accumulate(map(len, lines), lambda at, n: at + n + 1, initial=0))
    found = {bisect_right(starts, m.start()) - 1 for m in _BIG_EXPONENT.finditer(classes)}
    at = classes.find(_LONG_DIGITS)
    while at >= 0:
        k = bisect_right(starts, at) - 1
        found.add(k)
        at = classes.find(_LONG_DIGITS, starts[k + 1])
    return sorted(found)


def _bulk_safe(decode) -> bool:
    """Whether msgspec refuses, as orjson does, a line nested deeper than :data:`ORJSON_MAX_DEPTH`: true while
    the recursion limit is at most that depth (Python 3.11 counts msgspec's nesting against it), and when a
    probe of one level deeper is refused (once per process: later versions count C nesting apart)."""
    global _deep_refused
    if sys.getrecursionlimit() > ORJSON_MAX_DEPTH:
        return False
    if _deep_refused is None:
        deep = b"[" * ORJSON_MAX_DEPTH + b"]" * ORJSON_MAX_DEPTH
        try:
            decode(b'{"-":' + deep + b"}")             # (one level deeper than orjson reads)
        except RecursionError:
            _deep_refused = True
        except ValueError:                      # (got past the nesting: a missing field)
            _deep_refused = False
    return _deep_refused


@lru_cache(maxsize=64)
def string_fields(*names: str) -> StringFields:
    """The :class:`StringFields` of ``names``, made once per process (a struct type is made for each)."""
    return StringFields(*names)
