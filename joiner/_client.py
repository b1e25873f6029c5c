"""The typed client of the joiner service."""
from __future__ import annotations

import concurrent.futures

import grpc
import orjson

from joiner import joiner_pb2 as pb
from joiner import joiner_pb2_grpc as pb_grpc
from photon.rpc import open_channel
from photon import OUTCOMES

MAX_MESSAGE_BYTES = 64 << 20
CHANNEL_OPTIONS = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]


class JoinerUnavailable(RuntimeError):
    """The joiner could not answer (down, timed out, refused the request); the message names the address
    and the gRPC status. The events' fate is unknown: retry them (a retry never duplicates output)."""


class Outcomes(list):
    """A join's outcomes (a list of :class:`Outcome`, one per event) and ``store_behind``: the joiner's event
    store was still reading its logs, so a retry before it catches up is likely to be THROTTLED again. With
    it, when the store reported them, ``store_read_to_us`` (per id key, how far it has read) and
    ``store_read_through_us`` (see joiner.proto's ``JoinResponse``); None and 0 otherwise."""
    store_behind: bool = False
    store_read_to_us: dict | None = None
    store_read_through_us: int = 0


class JoinerClient:
    """Sends batches of foreign events to the joiner at ``address`` (``host:port``). Thread-safe.

    ``ids[i]``, ``ref_ids[i]`` and ``raws[i]`` (the raw log line, no newline) describe the i-th event; the
    answer is one :class:`Outcome` per event, in order. No retries inside: the dispatcher owns retrying.
    """

    def __init__(self, address: str) -> None:
        self.address = address
        self._channel = open_channel(address, CHANNEL_OPTIONS)
        self._stub = pb_grpc.JoinerStub(self._channel)

    def join(self, ids: list[str], ref_ids: list[str], raws: list[bytes], timeout: float = 30.0) -> Outcomes:
        try:
            resp = self._stub.Join(pb.JoinRequest(ids=ids, ref_ids=ref_ids, raws=raws), timeout=timeout)
        except grpc.RpcError as e:
            raise self._unavailable(e) from None
        return self._outcomes(resp, len(ids))

    def join_future(self, ids: list[str], ref_ids: list[str], raws: list[bytes],
                    timeout: float = 30.0) -> concurrent.futures.Future:
        """Like :meth:`join` without blocking: the future resolves to the outcomes or raises
        :class:`JoinerUnavailable`."""
        result: concurrent.futures.Future = concurrent.futures.Future()
        n = len(ids)
        call = self._stub.Join.future(pb.JoinRequest(ids=ids, ref_ids=ref_ids, raws=raws), timeout=timeout)

        def done(call) -> None:
            if call.cancelled():
                result.set_exception(JoinerUnavailable(f"joiner {self.address}: call cancelled"))
            elif call.exception() is not None:
                result.set_exception(self._unavailable(call.exception()))
            else:
                try:
                    result.set_result(self._outcomes(call.result(), n))
                except JoinerUnavailable as e:
                    result.set_exception(e)

        call.add_done_callback(done)
        return result

    def status(self) -> dict:
        try:
            resp = self._stub.Status(pb.StatusRequest(), timeout=10.0)
        except grpc.RpcError as e:
            raise self._unavailable(e) from None
        return orjson.loads(resp.json)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> JoinerClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _outcomes(self, resp, n: int) -> Outcomes:
        raw = resp.outcomes
        if len(raw) != n:
            raise JoinerUnavailable(f"joiner {self.address} answered {len(raw)} outcomes for {n} events")
        out = Outcomes(OUTCOMES[o] for o in raw)
        out.store_behind = resp.store_behind
        if resp.store_behind and resp.HasField("store_read_through_us"):
            out.store_read_to_us = dict(resp.store_read_to_us)
            out.store_read_through_us = resp.store_read_through_us
        return out

    def _unavailable(self, e: grpc.RpcError) -> JoinerUnavailable:
        return JoinerUnavailable(f"joiner {self.address}: {e.code().name}: {e.details()}")
