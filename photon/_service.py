"""The process shell every Photon service shares: start, say where it serves, run until signalled, stop."""
from __future__ import annotations

import logging
import os
import random
import signal
import socket
import sys
import threading
from typing import Callable

from photon._config import ConfigError

METRICS_AFTER_S = 1.0
"""A service starts its Prometheus metrics server this long after it serves (never, when it is stopped
sooner). Importing prometheus-client and starting its HTTP server costs about 30 ms of CPU; at a
cold start every process of a pipeline starts at once on a few cores, and that CPU goes first to answering
(no part of the pipeline reads metrics; ``photon status`` says "metrics not answering" in that second)."""


def run_service(name: str, start: Callable[[], object], region: str | None = None) -> int:
    """Start a service and keep it running until SIGTERM or SIGINT.

    ``start()`` returns a server with ``.address``, ``.stop()`` and ``.statistics()`` (and optionally
    ``.metric_kinds``, a :class:`photon.MetricKinds`, and ``.health``, whose ``.serving`` its metrics
    report); its metrics carry ``region`` (default: ``PHOTON_REGION``). Once it is up,
    ``<name> serving on <address>`` is printed (callers wait for that line); its metrics are served
    :data:`METRICS_AFTER_S` later. A configuration error or a
    port in use makes the process exit 2 with a message naming the cause; a clean stop exits 0. A signal
    that arrives during startup stops the service right after it has started.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        server = start()
    except (ConfigError, OSError) as e:
        print(f"{name}: {e}", file=sys.stderr)
        return 2
    print(f"{name} serving on {server.address}", flush=True)
    if not stop.wait(METRICS_AFTER_S):
        health = getattr(server, "health", None)
        serve_metrics_of(name, server.statistics, kinds=getattr(server, "metric_kinds", None), region=region,
                         serving=(lambda: health.serving) if health is not None else None)
    while not stop.wait(1.0):
        pass
    server.stop()
    logging.getLogger("photon").info("%s stopped: %s", name, server.statistics())
    return 0


def serve_metrics_of(name: str, statistics, kinds=None, region: str | None = None, serving=None) -> None:
    """Serve the Prometheus metrics of service ``name`` (see :func:`photon.serve_metrics`; the process name
    from ``PHOTON_PROCESS``, else ``name``); a failure to serve them is logged, never raised."""
    from photon._metrics import serve_metrics
    try:
        serve_metrics(name.split()[0], statistics, kinds=kinds, region=region,
                      process=os.environ.get("PHOTON_PROCESS") or name, serving=serving)
    except OSError as e:
        logging.getLogger("photon").warning("%s: metrics not served: %s", name, e)


def bind_port(server, host: str, port: int, what: str, credentials=None) -> int:
    """Bind a gRPC server (anything with ``add_insecure_port``) to ``host:port`` (0: a free port) and
    return the port (over TLS with ``credentials``, gRPC server credentials); ``OSError`` naming ``what`` and the address when it is taken or invalid."""
    try:
        bound = server.add_secure_port(f"{host}:{port}", credentials) if credentials is not None \
            else server.add_insecure_port(f"{host}:{port}")
    except RuntimeError as e:
        raise OSError(f"{what}: cannot bind {host}:{port}: {e}") from None
    if bound == 0:
        raise OSError(f"{what}: cannot bind {host}:{port}")
    return bound


FREE_PORTS = range(10000, 20000)
"""Where :func:`free_port` picks ports: below Linux's ephemeral range (32768-60999 by default), from which
the kernel takes the local port of every outgoing connection, so a port chosen here is not taken by some
connection in the moment between choosing it and binding it (a port the OS hands out for port 0 comes
from the ephemeral range and can be). Below the ports the tests' and examples' fixed ``port_base`` spans
use (20000 and up)."""

_given: set[int] = set()
_given_lock = threading.Lock()


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing is bound to right now, for a server that binds it soon after: a random one of
    :data:`FREE_PORTS` that binds, not handed out before by this process (the OS's choice for port 0 when
    the ephemeral range reaches down into them, or when none of 200 tries binds)."""
    if _ephemeral_low() > FREE_PORTS[-1]:
        rng = random.SystemRandom()
        for _ in range(200):
            port = rng.choice(FREE_PORTS)
            with _given_lock:
                if port in _given:
                    continue
            with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
            with _given_lock:
                _given.add(port)
            return port
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
