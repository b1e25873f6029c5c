"""The dispatcher's process for one region, as the launcher runs it."""
from __future__ import annotations

import sys

from photon import PhotonConfig, ProcessSpec, region_ports

ROLE = "dispatcher"


def plan_processes(config: PhotonConfig, region: str, *, joiners: list[str],
                   registry: list[str]) -> list[ProcessSpec]:
    """One dispatcher process for ``region`` feeding ``joiners`` (addresses) and looking ids up in the
    registry at ``registry`` (endpoints). It serves nothing, so its address is empty."""
    argv = [sys.executable, "-m", "dispatcher.main", "--config", config.path, "--region", region,
            "--joiners", ",".join(joiners), "--registry", ",".join(registry)]
    reg = config.region(region)
    host = reg.bind_host(config.joiner.host)
    (metrics,) = region_ports(reg, "dispatcher_metrics", host, 1)
    return [ProcessSpec(f"{region}-dispatcher", argv, ROLE, region, "", f"{host}:{metrics}")]
