"""Running one replica process: the Raft member, its gRPC server, and a clean stop on SIGTERM/SIGINT."""
from __future__ import annotations

import gc
import logging
import signal
import sys
import threading
from concurrent import futures

import grpc

from photon import serve_metrics

from idregistry import registry_pb2_grpc as pb_grpc
from idregistry._shell import ReplicaServer, ReplicaSpec
from idregistry._servicer import RegistryServicer
from photon.rpc import add_health, server_credentials

log = logging.getLogger("idregistry")

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
    add_health(server, "photon.Registry")
    try:
        serve_metrics("registry", replica.status, process=f"registry-s{spec.shard}-r{spec.replica}")
    except OSError as e:
        log.warning("metrics not served: %s", e)
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
        while not stop.wait(0.5):
            pass
    finally:
        server.stop(grace=1.0).wait(2.0)
        replica.close()
        log.info("registry shard %d replica %d stopped", spec.shard, spec.replica)
