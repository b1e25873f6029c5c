"""Starting and stopping the event store's gRPC servers: a cache server (one shard) or a logs store."""
from __future__ import annotations

from concurrent import futures
from pathlib import Path

import grpc

from photon import ConfigError, MetricKinds, PhotonConfig, bind_port, output_publisher, stream_source

from eventstore import eventstore_pb2_grpc as pb_grpc
from eventstore._client import CHANNEL_OPTIONS
from eventstore._servicer import EventStoreServicer
from eventstore._logstore import LogsEventStore
from eventstore._mapfiles import map_dir
from eventstore._shell import CacheEventStore, EventStoreStatistics, ReaderOptions
from photon.rpc import Health, add_health, server_credentials

SERVER_THREADS = 16

_CACHE_COUNTERS = frozenset({"puts", "evictions", "too_large", "lookups", "lookup_ids", "hits", "misses"})
CACHE_METRIC_KINDS = MetricKinds(
    counters=_CACHE_COUNTERS | {"lines_read", "bytes_read", "events_indexed", "bad_records", "map_entries_written",
                                "checkpoints"},
    gauges=frozenset({"entries", "bytes", "max_bytes", "shard", "servers", "read_through_us", "files",
                      "pending_bytes", "reader_alive", "resumed", "warm_bytes", "warm_s"}))
"""How a cache server's :class:`EventStoreStatistics` is exposed."""
LOGS_METRIC_KINDS = MetricKinds(
    counters=frozenset({"lookups", "lookup_ids", "found", "not_found", "not_found_reasons", "bytes_read",
                        "bad_map_entries", "files_opened", "refreshes"}),
    gauges=frozenset({"map_entries", "map_keys", "open_files", "read_through_us"}),
    labels={"not_found_reasons": "reason"})
"""How a logs store's :class:`LogsStoreStatistics` is exposed (``not_found_reasons`` by ``reason``)."""


class EventStoreServer:
    """A running event store: :attr:`address` is ``host:port`` as bound. :meth:`stop` stops accepting
    requests, lets those in flight finish within ``grace`` seconds, then stops the primary reader."""

    def __init__(self, store: CacheEventStore, server: grpc.Server, host: str, port: int,
                 health: Health | None = None) -> None:
        self.store = store
        self.health = health
        self.metric_kinds = CACHE_METRIC_KINDS if isinstance(store, CacheEventStore) else LOGS_METRIC_KINDS
        self.host = host
        self.port = port
        self.address = f"{host}:{port}"
        self._server = server

    def statistics(self) -> EventStoreStatistics:
        return self.store.statistics()

    def stop(self, grace: float = 5.0) -> None:
        if self.health is not None:
            self.health.stopping()
        self._server.stop(grace).wait()
        self.store.close()

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        return self._server.wait_for_termination(timeout)


def store_dir(config: PhotonConfig, region: str) -> Path:
    """``<state_dir>/eventstore``: the cache servers' checkpoints and the log-file map (``map/``)."""
    return Path(config.region(region).state_dir) / "eventstore"


def serve(config: PhotonConfig, region: str, port: int = 0, host: str | None = None,
          shard: int = 0) -> EventStoreServer:
    """Start cache server ``shard`` of ``region`` (of ``[eventstore].cache_servers``, each holding
    ``cache_mb / cache_servers``): its primary reader over ``<log_root>/<join.primary_stream>`` (resuming
    from its checkpoint in :func:`store_dir`) and its gRPC server on ``host:port`` (default
    ``[eventstore].host``; port 0 picks a free port, see :attr:`EventStoreServer.port`)."""
    reg = config.region(region)
    es = config.eventstore
    if not 0 <= shard < es.cache_servers:
        raise ConfigError(f"{config.path}: cache server {shard} does not exist ([eventstore].cache_servers = "
                          f"{es.cache_servers})")
    options = ReaderOptions(state_dir=store_dir(config, region), map_dir=map_dir(reg.state_dir),
                            map_every_s=es.map_every_s, map_every_kb=es.map_every_kb, warm_tail_s=es.warm_tail_s,
                            checkpoint_interval_s=es.checkpoint_interval_s, shard=shard,
                            servers=es.cache_servers, vnodes=es.ring_vnodes, s3=config.s3,
                            max_line_bytes=config.input.max_line_bytes,
                            quarantine_publisher=output_publisher(config, reg, "quarantine") if shard == 0 else None)
    stream_source(config, reg, config.join.primary_stream)      # names a missing bucket, endpoint, credentials
    store = CacheEventStore(
        region=reg.name, primary_root=reg.stream_url(config.join.primary_stream),
        id_field=config.join.primary_ids, max_bytes=int(es.cache_mb * (1 << 20) / es.cache_servers),
        quarantine_dir=reg.quarantine_dir, options=options)
    return _start(store, host or es.host, port, f"eventstore {region}/{shard}")


def serve_logs(config: PhotonConfig, region: str, port: int = 0, host: str | None = None) -> EventStoreServer:
    """Start the LogsEventStore of ``region``: it answers from the log-file map in :func:`store_dir`
    (``map/``) and the primary logs, with the same gRPC service as a cache server."""
    reg = config.region(region)
    es = config.eventstore
    store = LogsEventStore(
        region=reg.name, primary_root=reg.stream_url(config.join.primary_stream),
        id_field=config.join.primary_id_field, map_dir=map_dir(reg.state_dir),
        reader_checkpoint=store_dir(config, region) / "cache-0.json", every_bytes=es.map_every_kb * 1024,
        max_open=es.logs_open_files, refresh_s=es.map_refresh_s, s3=config.s3,
        custom_ids=config.join.primary_ids.custom)
    return _start(store, host or es.host, port, f"logs store {region}")


def _start(store, host: str, port: int, what: str) -> EventStoreServer:
    server = grpc.server(futures.ThreadPoolExecutor(SERVER_THREADS, thread_name_prefix=what.replace(" ", "-")),
                         options=CHANNEL_OPTIONS)
    pb_grpc.add_EventStoreServicer_to_server(EventStoreServicer(store), server)
    bound = bind_port(server, host, port, what, server_credentials())
    store.start()
    health = add_health(server, "photon.EventStore", store.serving_problem)
    server.start()
    return EventStoreServer(store, server, host, bound, health)
