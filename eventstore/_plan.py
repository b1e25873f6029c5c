"""The event store's processes for one region, as the launcher runs them."""
from __future__ import annotations

import sys

from photon import PhotonConfig, ProcessSpec, region_ports

ROLE = "eventstore"


def plan_processes(config: PhotonConfig, region: str) -> list[ProcessSpec]:
    """One CacheEventStore process for ``region``, at the region's host (or ``[eventstore].host``) on a port fixed by the region's ``port_base`` or remembered in its state dir; its
    :attr:`ProcessSpec.address` is what the region's joiners are given."""
    reg = config.region(region)
    host = reg.bind_host(config.eventstore.host)
    (port,) = region_ports(reg, ROLE, host, 1)
    argv = [sys.executable, "-m", "eventstore.main", "--config", config.path, "--region", region, "--port", str(port),
            "--host", host]
    (metrics,) = region_ports(reg, "eventstore_metrics", host, 1)
    return [ProcessSpec(f"{region}-eventstore", argv, ROLE, region, f"{host}:{port}", f"{host}:{metrics}")]
