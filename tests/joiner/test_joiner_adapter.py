"""Adapters: the byte splice of the default joined format, its fallbacks, user adapters and their loading."""
from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from joiner import load_adapter
from joiner._adapter import SpliceAdapter, UserAdapter
from photon import ConfigError

from joiner_helpers import click_line, query_line
import sample_adapters

NOW = 1_763_712_345_678_901
PHOTON = {"region": "a", "joiner": "a-j0", "joined_at_us": NOW}


def splice() -> SpliceAdapter:
    return SpliceAdapter("a", "a-j0", "query")


def test_splice_is_exact_bytes_without_reserializing():
    foreign, primary = b'{"click_id":"c","query_id":"q","x":1.50}', b'{"query_id":"q", "q" : "shoes"}'
    line = splice().bind(NOW)(foreign, primary)
    assert line == (b'{"click_id":"c","query_id":"q","x":1.50,"query":{"query_id":"q", "q" : "shoes"},'
                    b'"_photon":{"region":"a","joiner":"a-j0","joined_at_us":1763712345678901}}')
    assert orjson.loads(line) == {"click_id": "c", "query_id": "q", "x": 1.5,
                                  "query": {"query_id": "q", "q": "shoes"}, "_photon": PHOTON}


def test_splice_of_generated_events_parses_to_the_design_format():
    line = splice().bind(NOW)(click_line(3), query_line(3))
    assert orjson.loads(line) == {**orjson.loads(click_line(3)), "query": orjson.loads(query_line(3)),
                                  "_photon": PHOTON}


@pytest.mark.parametrize("foreign", [
    b'{"click_id":"c","query":"old value"}',              # already has the nesting key: the primary wins
    b'{"click_id":"c","_photon":{"x":1}}',               # already has _photon
    b'{"click_id":"c","\\u0071uery":"escaped key"}',     # an escape could hide either key
    b'{"click_id":"c"} ',                                # does not end in }
    b'{"click_id":"c" }',                                # whitespace before the closing brace
    b'{}',                                               # empty object: no comma to add
])
def test_splice_falls_back_to_a_dict_merge(foreign):
    line = splice().bind(NOW)(foreign, b'{"query_id":"q"}')
    event = orjson.loads(line)
    assert event["query"] == {"query_id": "q"} and event["_photon"] == PHOTON
    assert line.count(b'"query":') == 1 and line.count(b'"_photon"') == 1
    assert {k: v for k, v in event.items() if k not in ("query", "_photon")} == {
        k: v for k, v in orjson.loads(foreign).items() if k not in ("query", "_photon")}


def test_splice_of_a_foreign_line_that_is_not_an_object_raises():
    with pytest.raises(ValueError):
        splice().bind(NOW)(b'["click"] ', b'{"query_id":"q"}')
    with pytest.raises(orjson.JSONDecodeError):
        splice().bind(NOW)(b'{"click_id": broken ', b'{"query_id":"q"}')


def test_nest_key_and_names_are_json_escaped():
    line = SpliceAdapter("a", "a-j0", 'qu"ery').bind(NOW)(b'{"c":1}', b'{"q":2}')
    assert orjson.loads(line) == {"c": 1, 'qu"ery': {"q": 2}, "_photon": PHOTON}


def test_user_adapter_gets_dicts_and_photon_is_added():
    build = UserAdapter(sample_adapters.flat, "a", "a-j0").bind(NOW)
    assert orjson.loads(build(b'{"click_id":"c"}', b'{"q":"shoes"}')) == {
        "click_id": "c", "query_text": "shoes", "_photon": PHOTON}
    assert build(b'{"click_id":"c","fraud":true}', b'{"q":"shoes"}') is None
    with pytest.raises(RuntimeError, match="adapter bug"):
        build(b'{"click_id":"c","explode":1}', b'{"q":"shoes"}')
    with pytest.raises(TypeError, match="not a dict"):
        UserAdapter(sample_adapters.not_a_dict, "a", "a-j0").bind(NOW)(b"{}", b"{}")


def test_load_adapter_default_and_user():
    assert isinstance(load_adapter("", "a", "a-j0", "query"), SpliceAdapter)
    adapter = load_adapter("sample_adapters:flat", "a", "a-j0", "query")
    assert isinstance(adapter, UserAdapter) and adapter.fn is sample_adapters.flat


@pytest.mark.parametrize("spec, problem", [
    ("sample_adapters", 'must be "module:callable"'),
    (":flat", 'must be "module:callable"'),
    ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
    ("sample_adapters:missing", "has no attribute 'missing'"),
    ("sample_adapters:NOT_CALLABLE", "not callable"),
])
def test_bad_adapter_spec_is_a_config_error_naming_the_key(spec, problem):
    with pytest.raises(ConfigError) as e:
        load_adapter(spec, "a", "a-j0", "query")
    assert str(e.value).startswith(f"[joiner].adapter = {spec!r}") and problem in str(e.value)


_KEYS = st.sampled_from(["click_id", "x", "query", "_photon", "q\\u", "k\"ey"])
_VALUES = st.one_of(st.text(alphabet=st.sampled_from('ab\\u"{}é\n 0'), max_size=8), st.integers(-10**6, 10**6), st.just({}))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.dictionaries(_KEYS, _VALUES, max_size=3), min_size=1, max_size=6),
       st.sampled_from(["", "cache"]))
def test_heads_over_a_request_are_the_lines_built_one_by_one(events, served):
    """The batch splice (one check over all the lines: the closing braces, the two keys, a backslash and
    then a \\u escape) makes each line as ``build`` does on its own, cut before its stamp's digits, and
    leaves to ``build`` exactly the lines it would not splice (e.g. JSON escapes with and without \\u)."""
    build = splice().bind(NOW, served or None)
    foreigns = [orjson.dumps(e) for e in events]
    primaries = [b'{"q":%d}' % k for k in range(len(foreigns))]
    heads = build.heads(foreigns, primaries)
    for f, p, head in zip(foreigns, primaries, heads):
        spliced = not (b"\\u" in f or b'"query"' in f or b'"_photon"' in f or f == b"{}")
        assert (head is not None) == spliced
        if head is not None:
            assert head + b"%d" % NOW + build.tail == build(f, p)
