"""Steps over a whole chunk of lines or ids in C (``map``, ``list.index``, one regular-expression pass), with
a Python step only per exception: the dispatcher's click lines and the event store's query lines share them."""
from __future__ import annotations

import re
from operator import itemgetter

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
