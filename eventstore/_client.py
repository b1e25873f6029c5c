"""The typed client of the event store service."""
from __future__ import annotations

import threading

import grpc
import orjson

from eventstore import eventstore_pb2 as pb
from eventstore import eventstore_pb2_grpc as pb_grpc
from photon.rpc import open_channel

MAX_MESSAGE_BYTES = 64 << 20
CHANNEL_OPTIONS = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]


class EventStoreUnavailable(RuntimeError):
    """The event store could not answer (down, overloaded, timed out); the message names the address."""


class EventStoreClient:
    """Looks up primary events in a CacheEventStore at ``address`` (``host:port``).

    Thread-safe; one channel per client. Calls do not retry: a failure raises
    :class:`EventStoreUnavailable` at once, and the caller (the joiner) answers its events THROTTLED so the
    dispatcher retries them later with backoff.
    """

    def __init__(self, address: str, timeout: float = 10.0) -> None:
        self.address = address
        self.timeout = timeout
        self._channel = open_channel(address, CHANNEL_OPTIONS)
        self._stub = pb_grpc.EventStoreStub(self._channel)
        self._last = threading.local()

    @property
    def read_to_us(self) -> dict[str, int] | None:
        """From this thread's latest :meth:`lookup_future` wait: the store's read position per id key while it
        catches up (see ``LookupResponse.read_to_us``); None when it did not report one."""
        return getattr(self._last, "read_to_us", None)

    @property
    def read_through_us(self) -> int | None:
        """From this thread's latest lookup: the time up to which the store had read its logs when it
        answered (None: not reported, or no lookup yet)."""
        return getattr(self._last, "read_through_us", None)

    def lookup(self, ids: list[str]) -> list[bytes | None]:
        """One result per id, in order: the primary event's raw log line, or None when not held."""
        if not ids:
            return []
        try:
            resp = self._stub.Lookup(pb.LookupRequest(ids=ids), timeout=self.timeout)
        except grpc.RpcError as e:
            raise EventStoreUnavailable(f"event store {self.address}: {e.code().name}: {e.details()}") from None
        raws = list(resp.raws)
        self._last.read_through_us = resp.read_through_us if resp.HasField("read_through_us") else None
        if len(raws) != len(ids):
            raise EventStoreUnavailable(f"event store {self.address} answered {len(raws)} results "
                                        f"for {len(ids)} ids")
        return [r or None for r in raws]

    def lookup_future(self, ids: list[str]):
        """Start a lookup; returns a function that waits for it and returns ``(raws, read_through_us)``
        (raws as :meth:`lookup`; read_through_us None when not reported); afterwards, on the waiting thread,
        :attr:`read_to_us` is the store's per-key read position (None: not reported, i.e. caught up or not
        fed by logs). No ids: a probe of the store's positions alone. Raises like :meth:`lookup`."""
        try:
            fut = self._stub.Lookup.future(pb.LookupRequest(ids=ids), timeout=self.timeout)
        except grpc.RpcError as e:
            raise EventStoreUnavailable(f"event store {self.address}: {e.code().name}: {e.details()}") from None

        def wait():
            try:
                resp = fut.result()
            except grpc.RpcError as e:
                raise EventStoreUnavailable(f"event store {self.address}: {e.code().name}: {e.details()}") from None
            return self._answered(ids, resp)
        return wait

    def lookup_now(self, ids: list[str]):
        """:meth:`lookup_future` and its wait in one blocking call: the calling thread waits for the answer
        itself (gRPC's blocking call polls its own completion queue), so no other thread has to take the
        answer and wake it. Returns and raises as the wait does, and sets :attr:`read_to_us` the same way."""
        try:
            resp = self._stub.Lookup(pb.LookupRequest(ids=ids), timeout=self.timeout)
        except grpc.RpcError as e:
            raise EventStoreUnavailable(f"event store {self.address}: {e.code().name}: {e.details()}") from None
        return self._answered(ids, resp)

    def _answered(self, ids: list[str], resp):
        if len(resp.raws) != len(ids):
            raise EventStoreUnavailable(f"event store {self.address} answered {len(resp.raws)} results "
                                        f"for {len(ids)} ids")
        through = resp.read_through_us if resp.HasField("read_through_us") else None
        self._last.read_to_us = dict(resp.read_to_us) if resp.catching_up else None
        return [r or None for r in resp.raws], through

    def status(self) -> dict:
        try:
            resp = self._stub.Status(pb.StatusRequest(), timeout=self.timeout)
        except grpc.RpcError as e:
            raise EventStoreUnavailable(f"event store {self.address}: {e.code().name}: {e.details()}") from None
        return orjson.loads(resp.json)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> EventStoreClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
