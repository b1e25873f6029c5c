"""Starting and stopping a CacheEventStore gRPC server."""
from __future__ import annotations

from concurrent import futures
from pathlib import Path

import grpc

from photon import PhotonConfig, bind_port

from eventstore import eventstore_pb2_grpc as pb_grpc
from eventstore._client import CHANNEL_OPTIONS
from eventstore._servicer import EventStoreServicer
from eventstore._tls import add_health, server_credentials
from eventstore._shell import CacheEventStore, EventStoreStatistics

SERVER_THREADS = 16


class EventStoreServer:
    """A running event store: :attr:`address` is ``host:port`` as bound. :meth:`stop` stops accepting
    requests, lets those in flight finish within ``grace`` seconds, then stops the primary reader."""

    def __init__(self, store: CacheEventStore, server: grpc.Server, host: str, port: int) -> None:
        self.store = store
        self.host = host
        self.port = port
        self.address = f"{host}:{port}"
        self._server = server

    def statistics(self) -> EventStoreStatistics:
        return self.store.statistics()

    def stop(self, grace: float = 5.0) -> None:
        self._server.stop(grace).wait()
        self.store.close()

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        return self._server.wait_for_termination(timeout)


def serve(config: PhotonConfig, region: str, port: int = 0, host: str | None = None) -> EventStoreServer:
    """Start the CacheEventStore of ``region``: its primary reader (from the beginning of
    ``<log_root>/<join.primary_stream>``) and its gRPC server on ``host:port`` (default
    ``[eventstore].host``; port 0 picks a free port, see :attr:`EventStoreServer.port`)."""
    reg = config.region(region)
    store = CacheEventStore(
        region=reg.name, primary_root=Path(reg.log_root) / config.join.primary_stream,
        id_field=config.join.primary_id_field, max_bytes=int(config.eventstore.cache_mb * (1 << 20)),
        quarantine_dir=reg.quarantine_dir)
    host = host or config.eventstore.host
    server = grpc.server(futures.ThreadPoolExecutor(SERVER_THREADS, thread_name_prefix=f"eventstore-{region}"),
                         options=CHANNEL_OPTIONS)
    pb_grpc.add_EventStoreServicer_to_server(EventStoreServicer(store), server)
    add_health(server, "photon.EventStore")
    bound = bind_port(server, host, port, f"eventstore {region}", server_credentials())
    store.start()
    server.start()
    return EventStoreServer(store, server, host, bound)
