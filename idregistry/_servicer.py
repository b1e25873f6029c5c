"""The gRPC adapter: proto in, :class:`~idregistry._shell.ReplicaServer` call, proto out. Nothing decides
here; errors map to status codes (malformed ids: INVALID_ARGUMENT, Raft queue full: RESOURCE_EXHAUSTED,
no quorum or not applied in time, a replica catching up after its start, or one run for a job refusing pipeline
traffic: UNAVAILABLE)."""
from __future__ import annotations

import json
from contextlib import contextmanager

import grpc

from photon import BadEventId
from idregistry import registry_pb2 as pb
from idregistry import registry_pb2_grpc as pb_grpc
from idregistry._batcher import Rejected
from idregistry._state import runs_from_wire
from idregistry._shell import CatchingUp, FutureId, JobOnly, NotLeader, ReplicaServer, ShardingUnknown

EXPORT_CHUNK = 5000


@contextmanager
def _errors(context):
    try:
        yield
    except (BadEventId, FutureId) as e:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
    except Rejected as e:
        code = grpc.StatusCode.RESOURCE_EXHAUSTED if e.overloaded else grpc.StatusCode.UNAVAILABLE
        context.abort(code, str(e))
    except (TimeoutError, ShardingUnknown, JobOnly, CatchingUp) as e:
        context.abort(grpc.StatusCode.UNAVAILABLE, str(e))


class RegistryServicer(pb_grpc.RegistryServicer):
    def __init__(self, server: ReplicaServer) -> None:
        self.server = server

    def _version(self) -> int:
        return self.server.sharding().version

    def Lookup(self, request, context):
        with _errors(context):
            present, wrong = self.server.lookup(list(request.ids))
            return pb.LookupReply(present=present, wrong_shard=wrong, sharding_version=self._version())

    def Commit(self, request, context):
        with _errors(context):
            try:
                if request.runs:
                    runs = runs_from_wire((r.prefix, r.timestamps_le) for r in request.runs)
                    results = self.server.commit_runs(request.token, runs)
                else:
                    results = self.server.commit(request.token, list(request.ids))
            except NotLeader as e:
                return pb.CommitReply(redirect=e.leader or "?")
            return pb.CommitReply(results=results, sharding_version=self._version())

    def ClearTokens(self, request, context):
        with _errors(context):
            try:
                cleared, wrong = self.server.clear_tokens(list(request.ids))
            except NotLeader as e:
                return pb.ClearTokensReply(redirect=e.leader or "?")
            return pb.ClearTokensReply(cleared=cleared, wrong_shard=wrong)

    def Delete(self, request, context):
        with _errors(context):
            try:
                deleted = self.server.delete(request.id, request.expected_token)
            except NotLeader as e:
                return pb.DeleteReply(redirect=e.leader or "?")
            return pb.DeleteReply(deleted=bool(deleted), wrong_shard=deleted is None)

    def Export(self, request, context):
        with _errors(context):
            try:
                entries = self.server.export()
            except NotLeader as e:
                context.abort(grpc.StatusCode.UNAVAILABLE, f"export: {e}")
        ids, tokens, stamps, registered = [], [], [], []
        for event_id, token, ts, reg in entries:
            ids.append(event_id)
            tokens.append(token)
            stamps.append(ts)
            registered.append(reg)
            if len(ids) >= EXPORT_CHUNK:
                yield pb.ExportChunk(ids=ids, tokens=tokens, timestamps_us=stamps, registered_us=registered)
                ids, tokens, stamps, registered = [], [], [], []
        if ids:
            yield pb.ExportChunk(ids=ids, tokens=tokens, timestamps_us=stamps, registered_us=registered)

    def GetSharding(self, request, context):
        with _errors(context):
            if not request.authoritative:
                return pb.ShardingReply(sharding_json=json.dumps(self.server.sharding().as_dict()))
            try:
                sharding = self.server.authoritative_sharding()
            except NotLeader as e:
                return pb.ShardingReply(redirect=e.leader or "?")
            return pb.ShardingReply(sharding_json=json.dumps(sharding.as_dict()))

    def Reshard(self, request, context):
        with _errors(context):
            try:
                error = self.server.reshard(request.start_us, request.shards, json.loads(request.endpoints_json))
            except NotLeader as e:
                return pb.ReshardReply(redirect=e.leader or "?")
            return pb.ReshardReply(error=error or "", sharding_json=json.dumps(self.server.sharding().as_dict()))

    def Status(self, request, context):
        return pb.StatusReply(status_json=json.dumps(self.server.status()))
