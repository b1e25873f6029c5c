"""``photon.StringFields`` reads the string fields of JSON lines with msgspec, with exactly the outcome of
``orjson.loads`` per line: checked against orjson on random chunks mixing good lines with every kind of
line on which the two parsers differ (tests/json_lines.py), and on targeted examples."""
from __future__ import annotations

import sys

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from photon import StringFields, string_fields
from photon._bulk import CHECK_WINDOW, ORJSON_MAX_DEPTH, _bulk_safe
from tests.json_lines import NOT_UTF8, NUMBERS, by_orjson, json_line, odd_lines, production_recursion_limit

ID = "10.0.0.1:4242:1763712000000000"


def check(reader: StringFields, lines: list[bytes]) -> None:
    want = by_orjson(lines, reader.names)
    with production_recursion_limit():
        assert _bulk_safe(reader._decode) or reader._decode is None     # (the msgspec path is taken)
        values, missing = reader.read(lines)
    assert values == want
    assert missing == [k for k, v in enumerate(want) if v is None]


@pytest.mark.timeout(240)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), n=st.integers(1, 80), two=st.booleans(), repeat=st.sampled_from([1, 1, 40]))
def test_a_chunk_is_read_as_orjson_reads_each_line(data, n, two, repeat):
    names = ("click_id", "query_id") if two else ("query_id",)
    line = json_line(names[1], ID, names[0]) if two else json_line("query_id", ID)
    if two and data.draw(st.booleans()):
        line = json_line(names[0], ID, names[1])         # the odd values in the other field
    lines = data.draw(st.lists(line, min_size=n, max_size=n)) * repeat   # (repeat: past a check window)
    check(string_fields(*names), lines)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("names", [("query_id",), ("click_id", "query_id"), ("q", "q"), ("", "a\"b")])
def test_every_odd_line_alone_and_among_good_ones(names):
    reader = StringFields(*names)
    odd = odd_lines(names[0], ID, names[1] if len(names) > 1 and names[1] != names[0] else "")
    good = orjson.dumps({n: ID for n in names} | {"a": 1})
    for line in odd:
        check(reader, [line])
        check(reader, [good, line, good])
    check(reader, odd)
    check(reader, [good] * (CHECK_WINDOW + 5) + odd)                    # a flagged line in a later window


@pytest.mark.timeout(60)
def test_what_msgspec_would_let_pass_is_refused_as_orjson_refuses_it():
    with production_recursion_limit():
        _what_msgspec_would_let_pass()


def _what_msgspec_would_let_pass():
    reader = StringFields("query_id")
    head = b'{"query_id":"' + ID.encode() + b'","a":'
    for value in [b'"x' + bad + b'"' for bad in NOT_UTF8] + [b"1e999", b"-1E+400", b"9" * 309, b"9" * 210 + b"e99"]:
        with pytest.raises(orjson.JSONDecodeError):
            orjson.loads(head + value + b"}")
        assert reader.read([head + value + b"}"]) == ([None], [0])
    assert reader.read([head + b"1e-999}", head + b"9" * 209 + b"e99}"]) == ([ID, ID], [])
    deep = head + b"[" * (ORJSON_MAX_DEPTH - 1) + b"]" * (ORJSON_MAX_DEPTH - 1) + b"}"
    assert reader.read([deep, deep.replace(b"[[", b"[[[", 1).replace(b"]]", b"]]]", 1)]) == ([ID, None], [1])
    assert reader.read([b'{"query_id":1,"query_id":"x"}', b'{"query_id":"x","query_id":1}']) == (["x", None], [1])
    assert reader.read([b"", b'{"query_id":"a"} {"query_id":"b"}']) == ([None, None], [0, 1])
    for number in NUMBERS:                                   # each alone: kept exactly when orjson reads it
        check(reader, [head + number + b"}"])


@pytest.mark.timeout(60)
def test_many_flagged_lines_are_read_by_orjson_and_a_raised_recursion_limit_too():
    reader = StringFields("query_id")
    head = b'{"query_id":"' + ID.encode() + b'","a":'
    lines = [head + (b"1e999" if k % 3 == 0 else b"1e+500" if k % 3 == 1 else b"1") + b"}" for k in range(300)]
    check(reader, lines)
    deep = [head + b"[" * 1100 + b"]" * 1100 + b"}", head + b"1}", head + b"\"\xff\"}"]
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(5000)                 # msgspec could read deeper than orjson: orjson reads all
    try:
        assert reader.read(deep) == ([None, ID, None], [0, 2]) == (by_orjson(deep, ("query_id",)), [0, 2])
    finally:
        sys.setrecursionlimit(limit)
