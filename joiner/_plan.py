"""The joiners' processes for one region, as the launcher runs them."""
from __future__ import annotations

import sys

from photon import PhotonConfig, ProcessSpec, region_ports

ROLE = "joiner"


def plan_processes(config: PhotonConfig, region: str, *, eventstore: list[str],
                   registry: list[str], logstore: list[str] = ()) -> list[ProcessSpec]:
    """``[joiner].per_region`` joiner processes named ``<region>-j<i>``, each at the region's host on a port
    fixed by its ``port_base`` or remembered in its state dir, reaching the region's cache servers
    (``eventstore``, in ring order), its logs stores (``logstore``) and the registry at ``registry``."""
    reg = config.region(region)
    host = reg.bind_host(config.joiner.host)
    ports = region_ports(reg, "joiners", host, config.joiner.per_region)
    metrics = region_ports(reg, "joiner_metrics", host, config.joiner.per_region)
    specs = []
    for i, port in enumerate(ports):
        name = f"{region}-j{i}"
        argv = [sys.executable, "-m", "joiner.main", "--config", config.path, "--region", region, "--name", name,
                "--port", str(port), "--host", host, "--eventstore", ",".join(eventstore),
                "--registry", ",".join(registry)]
        if logstore:
            argv += ["--logstore", ",".join(logstore)]
        specs.append(ProcessSpec(name, argv, ROLE, region, f"{host}:{port}", f"{host}:{metrics[i]}"))
    return specs
