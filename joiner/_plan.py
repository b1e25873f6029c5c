"""The joiners' processes for one region, as the launcher runs them."""
from __future__ import annotations

import sys

from photon import PhotonConfig, ProcessSpec, remembered_ports

ROLE = "joiner"


def plan_processes(config: PhotonConfig, region: str, *, eventstore: list[str],
                   registry: list[str], logstore: list[str] = ()) -> list[ProcessSpec]:
    """``[joiner].per_region`` joiner processes named ``<region>-j<i>``, each on a port remembered in the
    region's state dir, reaching the region's cache servers (``eventstore``, in ring order), its logs
    stores (``logstore``) and the registry at ``registry`` (endpoints)."""
    reg = config.region(region)
    host = config.joiner.host
    ports = remembered_ports(reg.state_dir, "joiners", host, config.joiner.per_region)
    specs = []
    for i, port in enumerate(ports):
        name = f"{region}-j{i}"
        argv = [sys.executable, "-m", "joiner.main", "--config", config.path, "--region", region, "--name", name,
                "--port", str(port), "--eventstore", ",".join(eventstore), "--registry", ",".join(registry)]
        if logstore:
            argv += ["--logstore", ",".join(logstore)]
        specs.append(ProcessSpec(name, argv, ROLE, region, f"{host}:{port}"))
    return specs
