"""Adapters: how a foreign event and its primary event become one joined output line.

An adapter is bound once per request to the join time (``bind(now_us)``) and returns a
``build(foreign_raw, primary_raw) -> bytes | None`` used for every event of the request.

* :class:`SpliceAdapter` (the default) writes DESIGN's joined format without re-serializing anything: the
  foreign line minus its closing ``}``, then ``,"<nest>":<primary line>,"_photon":{...}}``. It falls back
  to a dict merge through orjson when splicing could produce a duplicate key or invalid JSON (the foreign
  line mentions ``"<nest>"`` or ``"_photon"`` or has a ``\\u`` escape, is ``{}``, or does not end in
  ``}``).
* :class:`UserAdapter` calls ``fn(foreign: dict, primary: dict) -> dict | None`` from
  ``[joiner].adapter = "module:callable"``; the joiner adds ``_photon``; None means unjoinable.
"""
from __future__ import annotations

import importlib
from itertools import repeat
from operator import itemgetter
from typing import Callable

import orjson

from photon import ConfigError

PHOTON_KEY = "_photon"

# Bytes that, just before the closing brace, make the splice unsafe: an empty object, or whitespace the
# cheap check cannot see through.
_NO_SPLICE_BEFORE_BRACE = frozenset(b"{ \t\r\n")
_NO_SPLICE_BYTES = bytes(sorted(_NO_SPLICE_BEFORE_BRACE))
_ALL_BUT_LAST = itemgetter(slice(None, -1))
_LAST_TWO = itemgetter(slice(-2, None))


class SpliceAdapter:
    """The default adapter (see module docstring)."""

    def __init__(self, region: str, joiner: str, nest_as: str) -> None:
        self.region, self.joiner, self.nest_as = region, joiner, nest_as
        self._nest_quoted = orjson.dumps(nest_as)
        self._nest_prefix = b"," + self._nest_quoted + b":"
        self._photon_prefix = (b',"_photon":{"region":' + orjson.dumps(region) + b',"joiner":'
                               + orjson.dumps(joiner) + b',"joined_at_us":')

    def photon_fields(self, now_us: int, served_by: str | None = None) -> dict:
        fields = {"region": self.region, "joiner": self.joiner, "joined_at_us": now_us}
        if served_by:
            fields["served_by"] = served_by
        return fields

    def bind(self, now_us: int, served_by: str | None = None) -> Callable[[bytes, bytes], bytes]:
        """The build for one request; ``served_by`` (the store that served the primaries) goes into
        ``_photon`` when given."""
        nest_prefix = self._nest_prefix
        served = b',"served_by":' + orjson.dumps(served_by) if served_by else b""
        head_end = self._photon_prefix      # ends in '"joined_at_us":'
        suffix = head_end + str(now_us).encode() + served + b"}}"
        nest_quoted = self._nest_quoted
        photon_quoted = b'"_photon"'
        no_splice, no_splice_bytes = _NO_SPLICE_BEFORE_BRACE, _NO_SPLICE_BYTES
        join = b"".join
        merge = self._merge

        def splices(foreign: bytes) -> bool:
            return not (foreign[-1:] != b"}" or len(foreign) < 2 or foreign[-2] in no_splice
                        or nest_quoted in foreign or photon_quoted in foreign or b"\\u" in foreign)

        def build(foreign: bytes, primary: bytes) -> bytes:
            if (foreign[-1:] != b"}" or len(foreign) < 2 or foreign[-2] in no_splice
                    or nest_quoted in foreign or photon_quoted in foreign or b"\\u" in foreign):
                return merge(foreign, primary, now_us, served_by)
            return join((foreign[:-1], nest_prefix, primary, suffix))

        def heads(foreigns: list[bytes], primaries: list[bytes]) -> list[bytes | None]:
            """The lines ``build`` makes for ``zip(foreigns, primaries)``, each cut just before its stamp's
            digits (``build(f, p) == head + b"%d" % now_us + build.tail``); None for a line that does not
            splice (build it on its own). Checked over all the lines at once, one by one only when that
            finds one that does not."""
            n = len(foreigns)
            ends = b"".join(map(_LAST_TWO, foreigns))      # 2 bytes a line unless a line is shorter
            text = b"\n".join(foreigns)      # no needle holds a newline: a match lies inside one line
            if (len(ends) != 2 * n or ends[1::2].count(b"}") != n
                    or len(ends[0::2].translate(None, no_splice_bytes)) != n
                    or nest_quoted in text or photon_quoted in text
                    or (text.find(b"\\") >= 0 and b"\\u" in text)):    # one byte first: memchr, ~50x faster
                return [join((f[:-1], nest_prefix, p, head_end)) if splices(f) else None
                        for f, p in zip(foreigns, primaries)]
            return list(map(join, zip(map(_ALL_BUT_LAST, foreigns), repeat(nest_prefix), primaries, repeat(head_end))))

        build.heads = heads
        build.tail = served + b"}}"
        return build

    def _merge(self, foreign: bytes, primary: bytes, now_us: int, served_by: str | None = None) -> bytes:
        event = orjson.loads(foreign)
        if not isinstance(event, dict):
            raise ValueError(f"foreign event is a JSON {type(event).__name__}, not an object")
        event[self.nest_as] = orjson.loads(primary)
        event[PHOTON_KEY] = self.photon_fields(now_us, served_by)
        return orjson.dumps(event)


class UserAdapter:
    """Wraps a user's ``fn(foreign: dict, primary: dict) -> dict | None``; adds ``_photon`` to its result."""

    def __init__(self, fn: Callable[[dict, dict], dict | None], region: str, joiner: str) -> None:
        self.fn, self.region, self.joiner = fn, region, joiner

    def bind(self, now_us: int, served_by: str | None = None) -> Callable[[bytes, bytes], bytes | None]:
        fn, loads, dumps = self.fn, orjson.loads, orjson.dumps
        photon = {"region": self.region, "joiner": self.joiner, "joined_at_us": now_us}
        if served_by:
            photon["served_by"] = served_by

        def build(foreign: bytes, primary: bytes) -> bytes | None:
            joined = fn(loads(foreign), loads(primary))
            if joined is None:
                return None
            if not isinstance(joined, dict):
                raise TypeError(f"adapter returned {type(joined).__name__}, not a dict or None")
            joined[PHOTON_KEY] = dict(photon)
            return dumps(joined)

        return build


def load_adapter(spec: str, region: str, joiner: str, nest_as: str) -> SpliceAdapter | UserAdapter:
    """The adapter named by ``[joiner].adapter``: empty for the default, else ``"module:callable"``.
    A spec that cannot be loaded raises :class:`~photon.ConfigError` naming the key."""
    if not spec:
        return SpliceAdapter(region, joiner, nest_as)
    where = f"[joiner].adapter = {spec!r}"
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{where} must be \"module:callable\"")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:
        raise ConfigError(f"{where}: cannot import module {module_name!r}: {type(e).__name__}: {e}") from None
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"{where}: module {module_name!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise ConfigError(f"{where}: {attr!r} is a {type(obj).__name__}, not callable")
    return UserAdapter(obj, region, joiner)
