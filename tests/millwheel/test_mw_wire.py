"""The records' wire format between worker processes: packed as one JSON array per ``Exchange`` call, and
the one-message-per-record form that earlier senders used, both taken by a receiver; acks likewise."""
from __future__ import annotations

import orjson
import pytest

from millwheel import worker_pb2 as pb
from millwheel._model import Delivery, Record
from millwheel._peer import pack_records, request_acks, request_records, to_wire

pytestmark = pytest.mark.timeout(30)


def deliveries() -> list[Delivery]:
    return [Delivery("sort", 7, Record("b-1", {"n": 1, "nested": [1.5, "é", None]}, 1_763_712_000_123_456,
                                       "bucket:ab", "buckets", "bucket", 1_763_712_000_000_001)),
            Delivery("sort", 0, Record("", "a string value", -1, "x/1/2", "s", "x", 0))]


def test_packed_records_come_back_as_they_were_sent():
    req = pb.ExchangeRequest.FromString(pb.ExchangeRequest(reply_to="w:1", packed_records=pack_records(deliveries()))
                                        .SerializeToString())
    assert request_records(req) == deliveries()


def test_a_receiver_takes_records_sent_one_message_each():
    req = pb.ExchangeRequest(reply_to="w:1", records=[to_wire(d) for d in deliveries()])
    assert request_records(req) == deliveries()
    assert request_records(pb.ExchangeRequest(reply_to="w:1")) == []


def test_packed_acks_and_acks_sent_one_message_each_are_both_taken():
    pairs = [("sort", "bucket:ab"), ("bucket", "numbers/3/17"), ("sort", "é/1")]
    req = pb.ExchangeRequest.FromString(pb.ExchangeRequest(reply_to="w:1", packed_acks=orjson.dumps(pairs))
                                        .SerializeToString())
    assert request_acks(req) == pairs
    old = pb.ExchangeRequest(reply_to="w:1", acks=[pb.WireAck(consumer=c, id=i) for c, i in pairs])
    assert request_acks(old) == pairs
    both = pb.ExchangeRequest(packed_acks=orjson.dumps(pairs[:1]), acks=[pb.WireAck(consumer="s", id="x")])
    assert request_acks(both) == [pairs[0], ("s", "x")]
    assert request_acks(pb.ExchangeRequest(reply_to="w:1")) == []
