"""Commits sent packed (``IdRun``: one prefix, int64 timestamps): checked as strictly as id strings, decided
with the same results in the ids' order, and sent only when the ids form runs. And the client's back-off:
short while the registry is unavailable (as at start), longer when a leader is overloaded."""
from __future__ import annotations

import struct

import grpc
import pytest

from photon import BadEventId, IdGenerator
from idregistry import CommitResult
from idregistry import registry_pb2 as pb
from idregistry import registry_pb2_grpc as pb_grpc
from idregistry._client import _commit_request
from idregistry._state import (check_ids, pack_ids, run_ids, runs_from_wire, runs_newest, runs_to_wire,
                               validate_ids)
from photon.rpc import open_channel

OK, EXISTS = CommitResult.OK, CommitResult.ALREADY_EXISTS


def ids_of(prefix: str, n: int, gen_pid: int = 4343) -> list[str]:
    gen = IdGenerator(prefix, gen_pid)
    return [gen.next_id() for _ in range(n)]


def le(*stamps: int) -> bytes:
    return struct.pack(f"<{len(stamps)}q", *stamps)


def test_runs_cross_the_wire_unchanged_and_give_back_the_ids():
    ids = ids_of("10.1.1.1", 5) + ids_of("10.1.1.2", 3) + ids_of("10.1.1.1", 2, gen_pid=9)
    wire = runs_to_wire(pack_ids(ids))
    assert run_ids(runs_from_wire(wire)) == ids


@pytest.mark.parametrize("prefix, raw, reason", [
    ("10.0.0.1", le(1), "prefix"),                          # no process id
    (":7:", le(1), "prefix"),
    ("10.0.0.1:x", le(1), "prefix"),
    ("10.0.0.1\n:7", le(1), "prefix"),
    ("10.0.0.1:7", b"1234567", "whole number"),             # not 8 bytes per timestamp
    ("10.0.0.1:7", le(5, -1), "16 digits"),
    ("10.0.0.1:7", le(10**16), "16 digits"),
    ("10.0.0.1:7", le(5, 2**63 - 1, 7), "16 digits"),
    ("10.0.0.1:7", le(*range(100), -2**63), "16 digits"),
])
def test_a_malformed_run_is_refused_naming_it(prefix, raw, reason):
    with pytest.raises(BadEventId, match=reason):
        runs_from_wire([(prefix, raw)])


@pytest.mark.parametrize("stamps", [(0,), (2**53 - 1, 0), (2**53, 3), (10**16 - 1,), (1763712000000001,) * 3])
def test_every_16_digit_timestamp_crosses_the_wire(stamps):
    """Timestamps below 2**53 pass a check over the bytes; those from 2**53 to 10**16 - 1 (16 digits too)
    are checked one by one and pass as well; the newest is read off the runs exactly."""
    runs = runs_from_wire([("10.0.0.1:7", le(*stamps))])
    assert run_ids(runs) == [f"10.0.0.1:7:{t:016d}" for t in stamps]
    assert runs_newest(runs) == max(stamps)


@pytest.mark.parametrize("bad", ["not-an-id", "10.0.0.1:1:12", "10.0.0.1:1:00000000000000012\n", 7,
                                 ":1:0000000000000012"])
def test_the_whole_batch_check_refuses_what_the_id_by_id_check_refuses(bad):
    good = ids_of("10.2.2.2", 3)
    for batch in ([bad], good + [bad], [bad] + good):
        with pytest.raises(BadEventId) as by_batch:
            check_ids(batch)
        with pytest.raises(BadEventId) as one_by_one:
            validate_ids(batch)
        assert str(by_batch.value) == str(one_by_one.value)
    check_ids(good)


def test_a_request_goes_packed_only_when_its_ids_form_runs():
    runs = ids_of("10.3.3.3", 40)
    packed = _commit_request(runs, "t")
    assert not packed.ids and len(packed.runs) == 1 and len(packed.runs[0].timestamps_le) == 8 * 40
    scattered = [i for pair in zip(ids_of("10.3.3.4", 20), ids_of("10.3.3.5", 20)) for i in pair]
    assert list(_commit_request(scattered, "t").ids) == scattered


def test_packed_and_string_commits_decide_alike_in_order(cluster):
    ids = ids_of("10.4.4.4", 30) + ids_of("10.4.4.5", 30)
    first = ids[::2]                                        # committed as strings below, the rest is new
    assert cluster.client.commit([first[0], first[1]], "joiner-a") == [OK, OK]
    stub = pb_grpc.RegistryStub(open_channel(cluster.leader()["address"], []))
    as_strings = stub.Commit(pb.CommitRequest(ids=first, token="joiner-a"), timeout=10)
    assert list(as_strings.results) == [OK] * len(first)
    packed = _commit_request(ids, "joiner-b")
    assert packed.runs
    reply = stub.Commit(packed, timeout=10)
    assert list(reply.results) == [EXISTS if n % 2 == 0 else OK for n in range(len(ids))]
    assert cluster.client.commit(ids, "joiner-b") == [EXISTS if n % 2 == 0 else OK for n in range(len(ids))]


def test_a_malformed_packed_commit_is_invalid_argument(cluster):
    stub = pb_grpc.RegistryStub(open_channel(cluster.leader()["address"], []))
    bad = pb.CommitRequest(token="t", runs=[pb.IdRun(prefix="10.0.0.9:1", timestamps_le=le(-5))])
    with pytest.raises(grpc.RpcError) as e:
        stub.Commit(bad, timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_client_backs_off_at_most_a_quarter_second_while_unavailable_and_further_when_overloaded():
    from tenacity import RetryCallState, Retrying

    from idregistry._client import OVERLOADED_MAX_WAIT_S, UNAVAILABLE_MAX_WAIT_S, _Retry, retry_wait

    def waits(error):
        state = RetryCallState(Retrying(), fn=None, args=(), kwargs={})
        out = []
        for attempt in range(1, 12):
            state.attempt_number = attempt
            state.set_exception((type(error), error, None))
            out.append(retry_wait(state))
        return out

    unavailable = waits(_Retry("no leader"))
    overloaded = waits(_Retry("busy", overloaded=True))
    assert 0.02 <= unavailable[0] <= 0.07 and max(unavailable) <= UNAVAILABLE_MAX_WAIT_S
    assert max(overloaded) == OVERLOADED_MAX_WAIT_S > UNAVAILABLE_MAX_WAIT_S


def test_a_reply_without_a_result_per_id_is_refused_not_taken_for_decided(cluster, monkeypatch):
    """A replica older than packed runs reads a packed request as one without ids and answers no results;
    the client raises (the click is retried) instead of returning ids it has no result for."""
    from idregistry import RegistryUnavailable
    ids = ids_of("10.4.4.6", 12)
    real = cluster.client._leader_call

    def old_replica(shard, method, request):
        if method != "Commit":
            return real(shard, method, request)
        return real(shard, method, pb.CommitRequest(ids=[], token=request.token))   # the runs not read

    monkeypatch.setattr(cluster.client, "_leader_call", old_replica)
    with pytest.raises(RegistryUnavailable, match="12 ids"):
        cluster.client.commit(ids, "joiner-c")
    monkeypatch.undo()
    assert cluster.client.commit(ids, "joiner-c") == [OK] * len(ids)
