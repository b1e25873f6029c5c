"""``photon certs --out DIR``: a test CA and one certificate for every Photon process, plus a Raft secret.

Writes ``ca.pem`` (the CA certificate), ``ca.key`` (keep it away from the processes), ``photon.pem`` /
``photon.key`` (the certificate every server presents and every client presents back, signed by the CA,
for the name ``server_name`` and the given hosts) and ``raft.secret``. Made with the ``cryptography``
package; for tests and trials, not a production PKI (no revocation, 1-year validity).
"""
from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write(path: Path, data: bytes, private: bool = False) -> None:
    path.write_bytes(data)
    if private:
        os.chmod(path, 0o600)


def make_certs(out: str | Path, server_name: str = "photon", hosts=("127.0.0.1", "localhost"),
               days: int = 365) -> dict:
    """Write a CA, a CA-signed certificate and key for ``server_name`` and ``hosts``, and a Raft secret
    into ``out``; returns the paths (keys ``ca``, ``cert``, ``key``, ``raft_secret_file``, ``ca_key``)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Photon test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=days))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    names: list = [x509.DNSName(server_name)]
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, server_name)]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = {"ca": out / "ca.pem", "ca_key": out / "ca.key", "cert": out / "photon.pem", "key": out / "photon.key",
             "raft_secret_file": out / "raft.secret"}
    _write(paths["ca"], ca.public_bytes(serialization.Encoding.PEM))
    _write(paths["ca_key"], _key_pem(ca_key), private=True)
    _write(paths["cert"], cert.public_bytes(serialization.Encoding.PEM))
    _write(paths["key"], _key_pem(key), private=True)
    _write(paths["raft_secret_file"], secrets.token_urlsafe(32).encode() + b"\n", private=True)
    return {k: str(v) for k, v in paths.items()}
