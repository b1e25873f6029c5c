"""TLS between Photon's processes, as files named by the config and handed to every process.

``[tls]`` names a CA certificate, this deployment's certificate and key (PEM), and optionally a file
whose contents are the secret of the registry's Raft traffic (without it, and with TLS on, the secret is
derived from the key: :func:`raft_secret`). The launcher hands them to every process it
starts through the environment (:func:`tls_env`); each service reads them with :func:`tls_files` /
:func:`raft_password` and builds its gRPC credentials (the rooms do that: the base imports no grpc).
With TLS on, every gRPC server requires a client certificate signed by the CA (mutual TLS), and every
client checks the server's certificate against the CA for the name ``server_name``; the metrics endpoints
are served over TLS the same way (:func:`tls_paths`), and Raft is always encrypted.
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


def tls_paths() -> tuple[str, str, str] | None:
    """``(ca, cert, key)`` file paths this process was given (None: TLS off), for libraries that take
    paths (the metrics server)."""
    if not os.environ.get(ENV_CA):
        return None
    return os.environ[ENV_CA], os.environ.get(ENV_CERT, ""), os.environ.get(ENV_KEY, "")


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


RAFT_SECRET_DERIVED, RAFT_SECRET_FILE, RAFT_IN_THE_CLEAR = "derived from the [tls] key", "the Raft secret file", ""


def raft_secret() -> tuple[str | None, str]:
    """``(secret, where it came from)`` for the registry's Raft traffic (pysyncobj's password: every
    message is encrypted and authenticated with a key derived from it).

    * ``[tls].raft_secret_file`` set: that file's contents.
    * else, with TLS on: derived from this deployment's private key (``[tls].key``) by HKDF-SHA256, so that
      turning ``[tls]`` on is enough to authenticate and encrypt Raft. Safe because only holders of the
      private key can compute it, and a holder of that key can already act as any Photon process over
      mutual TLS; HKDF is one-way, so the secret (or a replica's traffic) tells nothing about the key.
      Every replica must then hold the same key (one certificate for the deployment, as ``photon certs``
      makes); give processes different keys, or rotate the key replica by replica, only with
      ``raft_secret_file`` set.
    * else (TLS off): ``(None, "")``, Raft in the clear.

    With TLS on a secret is always returned or an ``OSError`` raised: Raft never falls back to the clear.
    """
    path = os.environ.get(ENV_RAFT_SECRET)
    if path:
        try:
            secret = Path(path).read_text().strip()
        except OSError as e:
            raise OSError(f"Raft secret file {path!r} cannot be read: {e}") from None
        if not secret:
            raise OSError(f"Raft secret file {path!r} is empty")
        return secret, RAFT_SECRET_FILE
    tls = tls_files()
    if tls is None:
        return None, RAFT_IN_THE_CLEAR
    return _derive_raft_secret(tls.key), RAFT_SECRET_DERIVED


def _derive_raft_secret(key_pem: bytes) -> str:
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as e:
        raise OSError(f"TLS key ({os.environ.get(ENV_KEY)!r}) is not a readable unencrypted PEM private key, "
                      f"so no Raft secret can be derived from it ({e}); with [tls] on, Raft is never run "
                      f"in the clear") from None
    der = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=b"photon raft secret v1",
                info=b"pysyncobj password").derive(der).hex()


def raft_password() -> str | None:
    """The secret that authenticates and encrypts Raft traffic between registry replicas (None: TLS off
    and no secret file); see :func:`raft_secret`."""
    return raft_secret()[0]


def secret_fingerprint(secret: str) -> str:
    """A short, one-way tag of a secret for logs: replicas whose tags differ cannot talk to each other."""
    import hashlib
    return hashlib.sha256(b"photon fingerprint:" + secret.encode()).hexdigest()[:12]
