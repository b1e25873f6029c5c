"""The event store's processes for one region, as the launcher runs them."""
from __future__ import annotations

import sys

from photon import PhotonConfig, ProcessSpec, remembered_ports

ROLE = "eventstore"


def plan_processes(config: PhotonConfig, region: str) -> list[ProcessSpec]:
    """One CacheEventStore process for ``region``, on a port remembered in the region's state dir; its
    :attr:`ProcessSpec.address` is what the region's joiners are given."""
    reg = config.region(region)
    host = config.eventstore.host
    (port,) = remembered_ports(reg.state_dir, ROLE, host, 1)
    argv = [sys.executable, "-m", "eventstore.main", "--config", config.path, "--region", region, "--port", str(port)]
    return [ProcessSpec(f"{region}-eventstore", argv, ROLE, region, f"{host}:{port}")]
