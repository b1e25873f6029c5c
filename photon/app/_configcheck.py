"""``photon config --check FILE``: every error of a config file at once, then warnings about what would
stop a deployment of it on this machine: S3 buckets that cannot be reached, and fixed ports (this
machine's regions, from their ``port_base``) that something already listens on."""
from __future__ import annotations

import errno
import socket
from dataclasses import dataclass, field

from photon import PhotonConfig, check_config
from photon import SourceError, parse_location, storage_kind
from photon.app._deployment import control_address, planned_processes


@dataclass
class ConfigCheck:
    """What ``photon config --check`` found: ``errors`` (the file is not valid) and ``warnings``."""
    path: str
    errors: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    regions: list = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"path": self.path, "ok": not self.errors, "errors": self.errors, "warnings": self.warnings,
                "regions": self.regions}


def bucket_warnings(config: PhotonConfig) -> list[str]:
    """One warning per bucket (of an object kind: S3) named by a region's roots that cannot be used from
    here (no credentials, no such bucket, endpoint unreachable), with at most one request (no retries) per
    bucket (the kind's :meth:`~photon.StorageKind.check`)."""
    places: dict[str, tuple[str, list[str]]] = {}     # "<scheme>://<bucket>" -> (a location in it, where named)
    out = []
    for region in config.regions:
        for key in ("log_root", "output_root"):
            url = getattr(region, key)
            try:
                loc = parse_location(url)
            except SourceError as e:
                out.append(f"unusable location: {e}")
                continue
            if not loc.is_local:
                places.setdefault(f"{loc.scheme}://{loc.bucket}", (loc.url, []))[1].append(
                    f"[[regions]] {region.name!r} {key}")
    for place, (url, where) in places.items():
        try:
            storage_kind(url).check(url, config.s3)
        except SourceError as e:
            out.append(f"{place.partition(':')[0].upper()} unreachable: {', '.join(where)} ({place}): {e}")
    return out


def _in_use(host: str, port: int) -> str | None:
    """``"in use"`` when ``host:port`` cannot be bound because something holds it, ``None`` when it is free
    or ``host`` is not an address of this machine (the port is another machine's concern)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return None
        except OSError as e:
            return "in use" if e.errno == errno.EADDRINUSE else None


def port_warnings(config: PhotonConfig) -> list[str]:
    """One warning per fixed port of the config that is already taken on this machine (regions whose host
    is not an address of this machine are skipped)."""
    specs = planned_processes(config)
    if specs is None:
        return []
    wanted = []
    for spec in specs:
        for what, address in (("", spec.address), (" metrics", spec.metrics_address)):
            if address:
                wanted.append((f"{spec.name}{what}", address))
    for region in config.regions:
        if control_address(region):
            wanted.append((f"region {region.name}'s control endpoint", control_address(region)))
    out = []
    for what, address in wanted:
        host, port = address.rsplit(":", 1)
        if _in_use(host, int(port)):
            out.append(f"port {address} ({what}) is in use on this machine (by a running photon run of this "
                       f"config, or another program)")
    return out


def check_config_file(path: str, network: bool = True) -> ConfigCheck:
    """Every error of the file, then (when it is valid and ``network``) the buckets and ports warnings."""
    config, errors = check_config(path)
    check = ConfigCheck(path=str(path), errors=errors)
    if config is None:
        return check
    check.regions = [r.name for r in config.regions]
    if errors or not network:
        return check
    check.warnings = bucket_warnings(config) + port_warnings(config)
    return check
