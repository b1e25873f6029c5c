"""The dispatcher's core with custom ids (``[join].foreign_time_field`` / ``primary_time_field``): clicks go
on under their Photon keys, a bad id, time or reference is quarantined with a reason naming the field and
never stops the good clicks, and the oldest unresolved time is the time field's."""
from __future__ import annotations

import orjson
import pytest

from dispatcher import DispatcherConfig, DispatcherState
from dispatcher._state import ChunkRead, LinesRead, QuarantineRecords, SendBatch
from photon import FakeClock, JoinConfig, custom_key, is_event_id

T0 = 1_763_712_000_000_000
JOIN = JoinConfig(unjoinable_after_s=60.0, foreign_time_field="ts", foreign_time_format="epoch_ms",
                  primary_time_field="qt", primary_time_format="rfc3339")


def click(n: int, **over) -> bytes:
    return orjson.dumps({"click_id": f"c-{n}", "ts": T0 // 1000 + n, "query_id": f"q-{n}", **over})


def chunk(lines: list[bytes]) -> ChunkRead:
    offsets, pos = [], 0
    for ln in lines:
        offsets.append(pos)
        pos += len(ln) + 1
    return ChunkRead("w0/clicks-1.jsonl", offsets, lines, pos)


@pytest.mark.timeout(10)
def test_custom_clicks_go_on_under_their_keys_and_bad_ones_are_quarantined_naming_the_field():
    st = DispatcherState(JOIN, DispatcherConfig(batch_size=100, max_in_flight=4), lookups=False)
    lines = [click(5), orjson.dumps({"click_id": "c-x", "query_id": "q-1"}), click(6, ts="later"),
             click(7, click_id=""), click(8, query_id="a\nb"), click(3)]
    cmds = st.handle(LinesRead([chunk(lines)], FakeClock().now_us()))
    [q] = [c for c in cmds if type(c) is QuarantineRecords]
    reasons = [r for _, _, r, _ in q.records]
    assert reasons == ["no 'ts' field (the time field, epoch_ms)", "time field 'ts': 'later' is not a number (epoch_ms)",
                       "'click_id' must be 1 to 256 characters, got 0: ''", "'query_id' holds a line break"]
    [send] = [c for c in cmds if type(c) is SendBatch]
    assert send.ids == sorted([custom_key("c-5", T0 + 5000), custom_key("c-3", T0 + 3000)])   # a batch goes in id order
    assert all(is_event_id(i) for i in send.ids) and send.ref_ids == ["q-3", "q-5"]
    assert send.raws == [lines[5], lines[0]]                            # the raw lines, unchanged
    assert st.oldest_unresolved_us() == T0 + 3000


@pytest.mark.timeout(10)
def test_a_copy_with_the_same_time_is_a_duplicate_and_photon_ids_are_still_refused_as_before():
    st = DispatcherState(JOIN, DispatcherConfig(batch_size=100, max_in_flight=4), lookups=False)
    cmds = st.handle(LinesRead([chunk([click(1), click(1)])], FakeClock().now_us()))
    [send] = [c for c in cmds if type(c) is SendBatch]
    assert send.ids == [custom_key("c-1", T0 + 1000)]
    plain = DispatcherState(JoinConfig(), DispatcherConfig(batch_size=100, max_in_flight=4), lookups=False)
    cmds = plain.handle(LinesRead([chunk([click(1)])], FakeClock().now_us()))
    [q] = [c for c in cmds if type(c) is QuarantineRecords]
    assert "c-1" in q.records[0][2] and not [c for c in cmds if type(c) is SendBatch]
