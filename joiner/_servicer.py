"""gRPC adapter of the joiner: proto in, :meth:`Joiner.join`, proto out. Nothing decides here."""
from __future__ import annotations

import dataclasses

import grpc
import orjson

from joiner import joiner_pb2 as pb
from joiner import joiner_pb2_grpc as pb_grpc


class JoinerServicer(pb_grpc.JoinerServicer):
    def __init__(self, joiner) -> None:
        self._joiner = joiner

    def Join(self, request, context):
        try:
            outcomes = self._joiner.join(list(request.ids), list(request.ref_ids), list(request.raws))
        except ValueError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        position = self._joiner.store_position
        if position is None:
            return pb.JoinResponse(outcomes=outcomes, store_behind=self._joiner.store_behind)
        return pb.JoinResponse(outcomes=outcomes, store_behind=True, store_read_to_us=position[0],
                               store_read_through_us=position[1])

    def Status(self, request, context):
        return pb.StatusResponse(json=orjson.dumps(dataclasses.asdict(self._joiner.statistics())).decode())
