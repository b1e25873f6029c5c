"""TLS between Photon's processes, as files named by the config and handed to every process.

``[tls]`` names a CA certificate, this deployment's certificate and key (PEM), and optionally a file
whose contents are the secret of the registry's Raft traffic. The launcher hands them to every process it
starts through the environment (:func:`tls_env`); each service reads them with :func:`tls_files` /
:func:`raft_password` and builds its gRPC credentials (the rooms do that: the base imports no grpc).
With TLS on, every gRPC server requires a client certificate signed by the CA (mutual TLS), and every
client checks the server's certificate against the CA for the name ``server_name``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

ENV_CA, ENV_CERT, ENV_KEY = "PHOTON_TLS_CA", "PHOTON_TLS_CERT", "PHOTON_TLS_KEY"
ENV_SERVER_NAME, ENV_RAFT_SECRET = "PHOTON_TLS_SERVER_NAME", "PHOTON_RAFT_SECRET_FILE"


@dataclass(frozen=True)
class TlsFiles:
    """PEM bytes of the CA, this process's certificate and key, and the name servers' certificates carry."""
    ca: bytes
    cert: bytes
    key: bytes
    server_name: str


def tls_env(config) -> dict:
    """Environment variables that turn TLS on in a child process (empty when ``[tls]`` is off)."""
    tls = config.tls
    env = {}
    if tls.ca:
        env.update({ENV_CA: tls.ca, ENV_CERT: tls.cert, ENV_KEY: tls.key, ENV_SERVER_NAME: tls.server_name})
    if tls.raft_secret_file:
        env[ENV_RAFT_SECRET] = tls.raft_secret_file
    return env


def use_tls(config) -> None:
    """Turn this process's TLS on (or leave it off) as ``config`` says: for commands that connect to a
    running deployment themselves (``photon status``, ``photon registry ...``)."""
    os.environ.update(tls_env(config))


def tls_files() -> TlsFiles | None:
    """The TLS files this process was given (None: TLS off). A missing or unreadable file is an
    ``OSError`` naming it."""
    ca = os.environ.get(ENV_CA)
    if not ca:
        return None
    parts = []
    for var in (ENV_CA, ENV_CERT, ENV_KEY):
        path = os.environ.get(var, "")
        try:
            parts.append(Path(path).read_bytes())
        except OSError as e:
            raise OSError(f"TLS file {path!r} ({var}) cannot be read: {e}") from None
    return TlsFiles(*parts, server_name=os.environ.get(ENV_SERVER_NAME) or "photon")


def raft_password() -> str | None:
    """The secret that authenticates and encrypts Raft traffic between registry replicas (None: off)."""
    path = os.environ.get(ENV_RAFT_SECRET)
    if not path:
        return None
    try:
        secret = Path(path).read_text().strip()
    except OSError as e:
        raise OSError(f"Raft secret file {path!r} cannot be read: {e}") from None
    if not secret:
        raise OSError(f"Raft secret file {path!r} is empty")
    return secret
