"""JSON lines on which msgspec (what :class:`photon.StringFields` reads lines with) and ``orjson.loads`` (the
outcome it must keep) can differ, for the property tests of the event store's and the dispatcher's bulk
readers: bytes that are not UTF-8 inside a string msgspec skips, numbers that overflow a double, nesting at
orjson's depth limit, repeated keys, escaped keys, lone surrogate escapes, ids that are not strings, lines
that are not one JSON object."""
from __future__ import annotations

import sys
from contextlib import contextmanager

import orjson
from hypothesis import strategies as st

NOT_UTF8 = [b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82", b"\xf5\x80\x80\x80", b"\x80",
            b"\xc3"]
"""Invalid UTF-8: a stray byte, an overlong form, an encoded surrogate, past U+10FFFF, a cut sequence."""
STILL_UTF8 = [b"\xc3\xa9", b"\xef\xbf\xbe", b"\xef\xbf\xbf", b"\xf4\x8f\xbf\xbf", b"\xed\x9f\xbf", b"\xee\x80\x80"]
"""Valid UTF-8 near the edges (noncharacters, the last code point, either side of the surrogates)."""
NUMBERS = [b"1e999", b"-1e999", b"1E+400", b"1e0309", b"1e-999", b"0e999", b"1.7976931348623157e308",
           b"1.7976931348623159e308", b"9" * 309, b"9" * 308, b"-" + b"9" * 400, b"9" * 210 + b"e99",
           b"9" * 209 + b"e99", b"9" * 210, b"1." + b"9" * 400, b"1e99", b"1e+99", b"18446744073709551616",
           b"-9223372036854775809", b"-0", b"0.5e-7", b"2E308", b"1e308", b"1.5e-07"]
"""Numbers around a double's range (orjson refuses the ones that overflow: "number is infinity")."""


def _nest(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def odd_values() -> list[bytes]:
    """JSON texts (some not valid) to put as the value of a field nobody reads."""
    return ([b'"x' + bad + b'"' for bad in NOT_UTF8] + [b'"' + ok + b'"' for ok in STILL_UTF8] + NUMBERS
            + [b"[1, " + n + b"]" for n in (b"1e999", b"1e9")] + [b'{"n": ' + n + b"}" for n in (b"1e999", b"7")]
            + [b'"\\ud800"', b'"\\udc00"', b'"\\ud800\\u0041"', b'"\\ud83d\\ude00"', b'"\\u0000"', b'"\\x"',
               b'"\x01"', b'"\x7f"', b"tru", b"NaN", b"Infinity", b"01", b"[1,]", _nest(1022), _nest(1023),
               _nest(1024)])


def odd_lines(field: str, good_id: str, other: str = "") -> list[bytes]:
    """Lines whose ``field`` is ``good_id`` (and ``other``'s, if named, is ``good_id`` too) with an odd value
    elsewhere, and lines whose own fields are odd."""
    f, g = field.encode(), orjson.dumps(good_id)
    head = b'{"' + f + b'":' + g + (b',"' + other.encode() + b'":' + g if other else b"")
    out = [head + b',"a":' + v + b"}" for v in odd_values()]
    out += [
        head + b"}",                                               # a good line, for comparison
        b'{"' + f + b'":"x' + NOT_UTF8[0] + b'"}',                  # a bad byte in the id itself
        b'{"' + f + b'":"\\ud800"}', b'{"' + f + b'":"\\ud800\\u0041"}',   # lone surrogate escapes in the id
        b'{"' + f + b'":1e999}', b'{"' + f + b'":7}', b'{"' + f + b'":null}', b'{"' + f + b'":["x"]}',
        head + b',"' + f + b'":"x"}', head + b',"' + f + b'":1}',   # a repeated key: the last counts
        b'{"' + f + b'":1,' + head[1:] + b"}",
        b'{"' + field.replace("_", "\\u005f").encode() + b'":' + g + b"}",   # an escaped key
        head + b"} " + head + b"}",                                  # two values on one line
        head + b",",                                                 # a value cut in two lines
        b'"a":1}', b"", b" ", b"\t", b"\r", head + b"}\r", b" " + head + b"} ", b"\xef\xbb\xbf" + head + b"}",
        b"[" + g + b"]", b"null", b"17", g, b"{}", b"{" + b'"x":1}',
        head + b',"a":' + _nest(1023).replace(b"[]", b"[1e999]") + b"}",
        head + b',\x0c"a":1}', head + b',"a":"\x00"}', head + b",\x00}",
    ]
    return out


@st.composite
def json_line(draw, field: str, good_id: str, other: str = "") -> bytes:
    """A line: mostly good ones with other fields, often one of :func:`odd_lines`, sometimes a good line with
    random bytes put into one of its strings or numbers."""
    kind = draw(st.integers(0, 9))
    f = field.encode()
    if kind <= 3:
        extra = {"n": draw(st.integers(-2**63, 2**64 - 1)), "t": draw(st.text(max_size=8)),
                 "x": draw(st.floats(allow_nan=False, allow_infinity=False))}
        fields = {field: good_id, **({other: good_id} if other else {}), **extra}
        return orjson.dumps(fields)
    if kind <= 7:
        return draw(st.sampled_from(odd_lines(field, good_id, other)))
    if kind == 8:                                 # random bytes inside a string nobody reads
        junk = draw(st.binary(max_size=6))
        return (b'{"' + f + b'":' + orjson.dumps(good_id)
                + (b',"' + other.encode() + b'":' + orjson.dumps(good_id) if other else b"")
                + b',"a":"' + junk.replace(b'"', b"").replace(b"\\", b"").replace(b"\n", b"") + b'"}')
    number = draw(st.from_regex(rb"\A-?(0|[1-9][0-9]{0,4})(\.[0-9]{1,3})?([eE][-+]?[0-9]{1,4})?\Z"))
    return (b'{"' + f + b'":' + orjson.dumps(good_id)
            + (b',"' + other.encode() + b'":' + orjson.dumps(good_id) if other else b"")
            + b',"a":' + number + b"}")


@contextmanager
def production_recursion_limit():
    """The interpreter's default recursion limit while reading: Hypothesis raises the limit while it runs a
    test, and above orjson's depth :class:`photon.StringFields` reads every line with orjson (so a property
    test run at the raised limit would never reach the msgspec path)."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    try:
        yield
    finally:
        sys.setrecursionlimit(limit)


def by_orjson(lines: list[bytes], names: tuple[str, ...]) -> list:
    """Each line's fields by ``orjson.loads`` alone: the field (a tuple for several) if every one is a string."""
    out = []
    for line in lines:
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            out.append(None)
            continue
        values = tuple(rec.get(n) for n in names) if type(rec) is dict else (None,)
        ok = all(type(v) is str for v in values)
        out.append((values[0] if len(names) == 1 else values) if ok else None)
    return out
