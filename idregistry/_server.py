"""Running one replica process: the Raft member, its gRPC server, and a clean stop on SIGTERM/SIGINT."""
from __future__ import annotations

import gc
import logging
import signal
import sys
import threading
from concurrent import futures

import grpc

from photon import METRICS_AFTER_S, MetricKinds, serve_metrics

from idregistry import registry_pb2_grpc as pb_grpc
from idregistry._shell import ReplicaServer, ReplicaSpec
from idregistry._servicer import RegistryServicer
from photon.rpc import add_health, server_credentials

log = logging.getLogger("idregistry")

METRIC_KINDS = MetricKinds(
    counters=frozenset({"commands", "ids_committed", "refused_overloaded", "fsyncs"}),
    gauges=frozenset({"shard", "replica", "pid", "is_leader", "term", "commit_index", "last_applied", "log_len",
                      "ids_held", "bytes_held", "tokens_dropped_ids", "bytes_saved_by_clearing", "gc_boundary_us",
                      "bucket_us", "queue_depth", "queued_ids", "in_flight", "commands_per_s", "ids_per_s",
                      "sharding_lease_until_us", "fsync_ms_mean", "uptime_s"}),
    skip=frozenset({"sharding", "first_election"}),
    size_histograms={"batch_ids_histogram": ("command_ids", "ids_committed")},
    latency_histograms={"fsync_latency_hist": "fsync_latency_seconds"})
"""How the replica's :meth:`~idregistry._shell.ReplicaServer.status` numbers are exposed: counters
(``photon_registry_<name>_total``), gauges, the ids per replicated command as a histogram, and the journal
fsync latency as a histogram in seconds."""

GRPC_OPTIONS = [("grpc.max_receive_message_length", 64 * 2**20), ("grpc.max_send_message_length", 64 * 2**20),
                ("grpc.so_reuseport", 0)]


def serve(spec: ReplicaSpec, stop: threading.Event | None = None, workers: int = 32) -> None:
    """Run one registry replica until ``stop`` is set (or SIGTERM/SIGINT when run in the main thread).

    Binds the replica's Raft and gRPC addresses from ``spec``; returns after both are shut down.
    """
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    replica = ReplicaServer(spec)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="registry-rpc"),
                         options=GRPC_OPTIONS)
    pb_grpc.add_RegistryServicer_to_server(RegistryServicer(replica), server)
    health = add_health(server, "photon.Registry", replica.serving_problem)
    creds = server_credentials()
    bound = server.add_secure_port(spec.grpc_address, creds) if creds else server.add_insecure_port(spec.grpc_address)
    if bound == 0:
        replica.close()
        raise OSError(f"registry shard {spec.shard} replica {spec.replica}: cannot bind {spec.grpc_address}")
    server.start()
    # Requests allocate many short-lived lists of strings; the state itself lives in typed arrays the
    # collector never scans. Fewer, later collections keep tail latency down.
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)
    # The Raft thread must get the GIL back quickly after each socket wakeup, or every commit waits for
    # whichever handler thread holds it (5 ms by default).
    sys.setswitchinterval(0.001)
    log.info("registry shard %d replica %d serving gRPC on %s, Raft on %s", spec.shard, spec.replica,
             spec.grpc_address, spec.raft_address)
    try:
        # metrics a moment after serving, as every service (photon.METRICS_AFTER_S): a group's first election
        # runs in that moment, and starting the metrics' HTTP server then took CPU from it on a busy host
        if not stop.wait(METRICS_AFTER_S):
            try:
                serve_metrics("registry", replica.status, kinds=METRIC_KINDS, region=spec.region,
                              process=f"registry-s{spec.shard}-r{spec.replica}", serving=lambda: health.serving)
            except OSError as e:
                log.warning("metrics not served: %s", e)
        while not stop.wait(0.5):
            pass
    finally:
        health.stopping()
        server.stop(grace=1.0).wait(2.0)
        replica.close()
        log.info("registry shard %d replica %d stopped", spec.shard, spec.replica)
