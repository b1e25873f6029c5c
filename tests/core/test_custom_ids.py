"""Events as users have them: any id plus a time field (``[join].*_time_field`` in one of four formats).
Each format parsed exactly; a bad value is a BadEventId naming the field (the pipeline quarantines it);
the Photon key ``<id>:0:<time_us>`` is a valid event id that maps back to the id and time."""
from __future__ import annotations

import pytest

from photon import (BadEventId, ConfigError, EventIds, JoinConfig, custom_key, id_timestamp_us, is_event_id,
                    key_id, parse_config, parse_event_id, parse_event_time)

US = 1_763_712_000_123_456          # 2025-11-21T08:00:00.123456Z


@pytest.mark.timeout(10)
@pytest.mark.parametrize("value, fmt, expected", [
    (US, "epoch_us", US),
    (str(US), "epoch_us", US),
    (1_763_712_000_123, "epoch_ms", 1_763_712_000_123_000),
    ("1763712000123.456", "epoch_ms", US),
    (1_763_712_000, "epoch_s", 1_763_712_000_000_000),
    (1763712000.123456, "epoch_s", US),
    ("1763712000.123456", "epoch_s", US),
    (0, "epoch_s", 0),
    ("2025-11-21T08:00:00.123456Z", "rfc3339", US),
    ("2025-11-21t08:00:00.123456z", "rfc3339", US),
    ("2025-11-21 09:00:00.123456+01:00", "rfc3339", US),
    ("2025-11-21T08:00:00.123456789Z", "rfc3339", US),        # past µs: truncated
    ("2025-11-21T08:00:00Z", "rfc3339", 1_763_712_000_000_000),
    ("1970-01-01T00:00:00Z", "rfc3339", 0),
])
def test_each_time_format_is_parsed_to_exact_microseconds(value, fmt, expected):
    assert parse_event_time(value, fmt) == expected


@pytest.mark.timeout(10)
@pytest.mark.parametrize("value, fmt, says", [
    (True, "epoch_us", "not a number"),
    (None, "epoch_s", "not a number"),
    ("soon", "epoch_ms", "not a number"),
    ("NaN", "epoch_s", "not a number"),
    (float("inf"), "epoch_s", "not a number"),
    ([1], "epoch_us", "not a number"),
    (-1, "epoch_us", "out of range"),
    (10**16, "epoch_us", "out of range"),
    (10**13, "epoch_s", "out of range"),
    ("2025-11-21T08:00:00", "rfc3339", "no time zone"),
    ("2025-11-21", "rfc3339", "not an RFC 3339"),
    ("21/11/2025 08:00", "rfc3339", "not an RFC 3339"),
    (1763712000, "rfc3339", "not an RFC 3339 string"),
    ("1969-12-31T23:59:59Z", "rfc3339", "out of range"),
])
def test_a_bad_time_value_says_what_is_wrong(value, fmt, says):
    with pytest.raises(ValueError, match=says):
        parse_event_time(value, fmt)


@pytest.mark.timeout(10)
def test_a_custom_key_is_an_event_id_that_maps_back_to_its_id_and_time():
    ids = EventIds("click_id", "ts", "rfc3339")
    for user_id in ("6018366c-f658-47a7-9ed3-4fe53a096533", "a:b:c", "7", "x" * 256, "ünïcode id", "10.0.0.1:7"):
        key = ids.key({"click_id": user_id, "ts": "2025-11-21T08:00:00.123456Z"})
        assert key == custom_key(user_id, US) and is_event_id(key) and parse_event_id(key).timestamp_us == US
        assert key_id(key) == user_id and id_timestamp_us(key) == US
        assert key.rsplit(":", 2) == [user_id, "0", f"{US:016d}"]
    assert ids.time_us({"click_id": "a", "ts": "2025-11-21T08:00:00.123456Z"}) == US


@pytest.mark.timeout(10)
@pytest.mark.parametrize("event, says", [
    ({"ts": US}, "no 'click_id' field"),
    ({"click_id": "", "ts": US}, "'click_id' must be 1 to 256 characters"),
    ({"click_id": "x" * 257, "ts": US}, "'click_id' must be 1 to 256 characters"),
    ({"click_id": "a\nb", "ts": US}, "'click_id' holds a line break"),
    ({"click_id": ":a", "ts": US}, "'click_id' starts with ':'"),
    ({"click_id": 42, "ts": US}, "'click_id' is not a string but int"),
    ({"click_id": "a"}, "no 'ts' field"),
    ({"click_id": "a", "ts": "yesterday"}, "time field 'ts': 'yesterday' is not a number"),
    ({"click_id": "a", "ts": -5}, "time field 'ts': -5 is out of range"),
])
def test_a_bad_event_is_refused_with_a_reason_naming_the_field(event, says):
    with pytest.raises(BadEventId, match=says):
        EventIds("click_id", "ts", "epoch_us").key(event)


@pytest.mark.timeout(10)
def test_without_a_time_field_ids_are_photon_ids_as_before():
    ids = JoinConfig().foreign_ids
    assert not ids.custom
    good = "10.0.0.1:7:1763712000123456"
    assert ids.key({"click_id": good}) == good and ids.time_us({"click_id": good}) == US
    for bad in ("6018366c-f658-47a7-9ed3-4fe53a096533", "10.0.0.1:7:123"):
        with pytest.raises(BadEventId):
            ids.key({"click_id": bad})
    assert ids.ref_problem(good) is None and ids.ref_problem("uuid-1")
    assert EventIds("q", "t").ref_problem("uuid-1") is None and EventIds("q", "t").ref_problem("")


@pytest.mark.timeout(10)
def test_key_of_line_is_none_for_what_the_pipeline_quarantines():
    ids = EventIds("click_id", "t", "epoch_ms")
    assert ids.key_of_line(b'{"click_id": "c1", "t": 1763712000123}') == "c1:0:1763712000123000"
    for line in (b"not json", b"[1]", b'{"click_id": "c1"}', b'{"click_id": "c1", "t": "x"}'):
        assert ids.key_of_line(line) is None


def _config(join: dict):
    return parse_config({"join": join, "regions": [{"name": "a", "log_root": "/l", "output_root": "/o",
                                                    "state_dir": "/s"}]})


@pytest.mark.timeout(10)
def test_the_time_options_are_validated_naming_the_option():
    c = _config({"foreign_time_field": "click_time", "foreign_time_format": "rfc3339"}).join
    assert c.foreign_ids == EventIds("click_id", "click_time", "rfc3339") and not c.primary_ids.custom
    assert _config({}).join.foreign_ids == EventIds("click_id", "", "epoch_us")
    with pytest.raises(ConfigError, match=r"\[join\]\.primary_time_format must be one of"):
        _config({"primary_time_field": "t", "primary_time_format": "iso"})
    with pytest.raises(ConfigError, match=r"\[join\]\.foreign_time_field must be a field name"):
        _config({"foreign_time_field": " t"})
    with pytest.raises(ConfigError, match=r"\[join\]\.foreign_time_field must differ from foreign_id_field"):
        _config({"foreign_time_field": "click_id"})
