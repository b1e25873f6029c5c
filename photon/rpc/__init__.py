"""gRPC plumbing every service room shares: channels and server credentials over mutual TLS when the
process was given ``[tls]`` files (see :mod:`photon._tls`), else in the clear, and the standard health
service, following each process's real state (:class:`Health`). A layer of its own between the base (which imports no gRPC) and the service rooms."""
from __future__ import annotations

import logging
import threading
from typing import Callable

import grpc

from photon import tls_files

log = logging.getLogger("photon.health")


def open_channel(address: str, options: list) -> grpc.Channel:
    """A channel to ``address``: with TLS on, it presents this process's certificate and accepts only a
    server whose certificate the CA signed for ``[tls].server_name``."""
    tls = tls_files()
    if tls is None:
        return grpc.insecure_channel(address, options=options)
    creds = grpc.ssl_channel_credentials(root_certificates=tls.ca, private_key=tls.key, certificate_chain=tls.cert)
    return grpc.secure_channel(address, creds, options=[*options, ("grpc.ssl_target_name_override", tls.server_name)])


def server_credentials() -> grpc.ServerCredentials | None:
    """With TLS on: credentials that require every client to present a certificate signed by the CA."""
    tls = tls_files()
    if tls is None:
        return None
    return grpc.ssl_server_credentials([(tls.key, tls.cert)], root_certificates=tls.ca, require_client_auth=True)


HEALTH_POLL_S = 0.25
"""How often a server's health probe runs (each probe only reads a few fields)."""


class Health:
    """The standard gRPC health service (grpc.health.v1) of one server, following what the process can do.

    The status of ``""`` and of the service name is SERVING while the probe reports no problem, and
    NOT_SERVING while it reports one (a short reason, logged once when the status changes), until
    :meth:`stopping`, after which it is NOT_SERVING for good. The probe runs every ``every_s`` in a thread
    of its own (:meth:`follow`), or whenever the owner calls :meth:`update` from a thread it already has.
    """

    def __init__(self, server, service: str) -> None:
        from grpc_health.v1 import health, health_pb2, health_pb2_grpc
        self._pb = health_pb2
        self.service = service
        self._servicer = health.HealthServicer()
        self._lock = threading.Lock()
        self.problem: str | None = None      # why NOT_SERVING (None: SERVING)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._set(health_pb2.HealthCheckResponse.SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(self._servicer, server)

    @property
    def serving(self) -> bool:
        return self.problem is None and not self._stopping.is_set()

    def _set(self, status) -> None:
        for name in ("", self.service):
            self._servicer.set(name, status)

    def update(self, problem: str | None) -> None:
        """SERVING when ``problem`` is None or empty, else NOT_SERVING saying why; a no-op once stopping."""
        problem = problem or None
        with self._lock:
            if self._stopping.is_set() or problem == self.problem:
                return
            was, self.problem = self.problem, problem
            self._set(self._pb.HealthCheckResponse.SERVING if problem is None
                      else self._pb.HealthCheckResponse.NOT_SERVING)
        if problem is None:
            log.info("%s: SERVING again (was not serving: %s)", self.service, was)
        elif was is None:
            log.warning("%s: NOT_SERVING: %s", self.service, problem)

    def follow(self, probe: Callable[[], str | None], every_s: float = HEALTH_POLL_S) -> "Health":
        """Run ``probe()`` (returns a problem or None) now and then every ``every_s`` in a daemon thread.
        A probe that raises counts as a problem."""
        def check() -> None:
            try:
                self.update(probe())
            except Exception as e:  # a probe that fails says the process cannot tell: not serving
                self.update(f"health probe failed: {type(e).__name__}: {e}")

        def loop() -> None:
            while not self._stopping.wait(every_s):
                check()

        check()
        self._thread = threading.Thread(target=loop, name=f"health-{self.service}", daemon=True)
        self._thread.start()
        return self

    def stopping(self) -> None:
        """NOT_SERVING for good (call first thing when the server starts to stop); watchers are told."""
        with self._lock:
            self._stopping.set()
            self.problem = self.problem or "stopping"
            self._servicer.enter_graceful_shutdown()


def add_health(server, service: str, probe: Callable[[], str | None] | None = None,
               every_s: float = HEALTH_POLL_S) -> Health:
    """The standard gRPC health service on ``server`` for ``""`` and ``service``; it follows ``probe``
    (see :class:`Health`) when given, else stays SERVING until :meth:`Health.stopping`."""
    health = Health(server, service)
    if probe is not None:
        health.follow(probe, every_s)
    return health


__all__ = ["HEALTH_POLL_S", "Health", "add_health", "open_channel", "server_credentials"]
