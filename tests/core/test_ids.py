import threading

import pytest
from hypothesis import given, strategies as st

from photon import (BadEventId, FakeClock, IdGenerator, format_event_id, id_timestamp_us, is_event_id,
                    parse_event_id)


def test_format_is_zero_padded_to_16_digits():
    assert format_event_id("10.1.2.3", 4242, 1763712000123456) == "10.1.2.3:4242:1763712000123456"
    assert format_event_id("10.1.2.3", 7, 42) == "10.1.2.3:7:0000000000000042"


@given(st.ip_addresses(v=4).map(str), st.integers(0, 2**22), st.integers(0, 10**16 - 1))
def test_parse_inverts_format(ip, pid, ts):
    eid = parse_event_id(format_event_id(ip, pid, ts))
    assert (eid.server_ip, eid.process_id, eid.timestamp_us) == (ip, pid, ts)
    assert id_timestamp_us(str(eid)) == ts


@pytest.mark.parametrize("bad", ["", "abc", "1.2.3.4:12", "1.2.3.4:x:1763712000123456", "a\nb:1:1763712000123456",
                                 "1.2.3.4:12:17637120001234", ":12:1763712000123456", "1.2.3.4:12:17637120001234567"])
def test_bad_ids_are_rejected_naming_the_text(bad):
    with pytest.raises(BadEventId) as e:
        parse_event_id(bad)
    assert repr(bad) in str(e.value)


def test_non_string_id_is_rejected():
    with pytest.raises(BadEventId):
        parse_event_id(12345)


def test_generator_strictly_increases_when_clock_stalls():
    clock = FakeClock()
    gen = IdGenerator("10.0.0.1", 9, clock)
    ids = [gen.next_id() for _ in range(100)]
    assert ids == sorted(ids) and len(set(ids)) == 100
    clock.advance(1_000_000)
    nxt = gen.next_id()
    assert id_timestamp_us(nxt) == clock.now_us()


def test_generator_is_unique_across_threads():
    gen = IdGenerator("10.0.0.1", 9)
    out: list[str] = []
    lock = threading.Lock()

    def work():
        mine = [gen.next_id() for _ in range(2000)]
        with lock:
            out.extend(mine)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(out)) == 8000


def test_fake_clock_refuses_to_go_back():
    clock = FakeClock(100)
    with pytest.raises(ValueError):
        clock.set(99)
    with pytest.raises(ValueError):
        clock.advance(-1)


_parts = st.text(alphabet="0123456789.:ab\n٣", max_size=6)
_digits = st.text(alphabet="0123456789٣", min_size=14, max_size=17)


@given(st.one_of(st.text(alphabet="0123456789.:ab\n٣", max_size=40),
                 st.tuples(_parts, _parts, _digits).map(":".join)))
def test_fast_check_agrees_with_the_parser(text):
    try:
        parse_event_id(text)
        parsed = True
    except BadEventId:
        parsed = False
    assert bool(is_event_id(text)) == parsed


def test_fast_check_on_real_ids():
    assert is_event_id("10.1.2.3:4242:1763712000123456")
    assert not is_event_id("10.1.2.3:4242:176371200012345")
    assert not is_event_id(":4242:1763712000123456")
    assert not is_event_id("::1:4242:1763712000123456")      # IPv6 server addresses go in brackets
    assert is_event_id("[::1]:4242:1763712000123456")


def test_key_and_time_is_the_slicing_of_a_well_formed_id():
    from photon import ID_KEY, ID_TIME_DIGITS, format_event_id, is_event_id, key_and_time, parse_event_id
    for ip, pid, ts in [("10.0.0.1", 7, 1), ("host:with:colons", 0, 1_795_671_042_404_616), ("h", 123456, 10**16 - 1)]:
        event_id = format_event_id(ip, pid, ts)
        assert is_event_id(event_id)
        parsed = parse_event_id(event_id)
        assert key_and_time(event_id) == (f"{parsed.server_ip}:{parsed.process_id}", parsed.timestamp_us)
        assert (ID_KEY(event_id), int(ID_TIME_DIGITS(event_id))) == key_and_time(event_id)
        assert ID_TIME_DIGITS(event_id) == f"{ts:016d}"
