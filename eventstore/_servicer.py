"""gRPC adapter of the event store: proto in, store call, proto out. Nothing decides here."""
from __future__ import annotations

import dataclasses

import orjson

from eventstore import eventstore_pb2 as pb
from eventstore import eventstore_pb2_grpc as pb_grpc


class EventStoreServicer(pb_grpc.EventStoreServicer):
    """Serves a store with ``lookup(ids)``, ``read_through_us`` and ``statistics()`` (a dataclass)."""

    def __init__(self, store) -> None:
        self._store = store

    def Lookup(self, request, context):
        raws = self._store.lookup(list(request.ids)) if request.ids else []
        read_to = getattr(self._store, "read_to_us", None)
        return pb.LookupResponse(raws=[r if r is not None else b"" for r in raws],
                                 read_through_us=getattr(self._store, "read_through_us", None),
                                 read_to_us=read_to, catching_up=read_to is not None)

    def Status(self, request, context):
        return pb.StatusResponse(json=orjson.dumps(dataclasses.asdict(self._store.statistics())).decode())
