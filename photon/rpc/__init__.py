"""gRPC plumbing every service room shares: channels and server credentials over mutual TLS when the
process was given ``[tls]`` files (see :mod:`photon._tls`), else in the clear, and the standard health
service. A layer of its own between the base (which imports no gRPC) and the service rooms."""
from __future__ import annotations

import grpc

from photon import tls_files


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


def add_health(server, service: str) -> None:
    """The standard gRPC health service (grpc.health.v1) on ``server``: SERVING for "" and ``service``."""
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc
    servicer = health.HealthServicer()
    for name in ("", service):
        servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)


__all__ = ["open_channel", "server_credentials", "add_health"]
