"""The event store's processes for one region, as the launcher runs them."""
from __future__ import annotations

import sys

from photon import PhotonConfig, ProcessSpec, region_ports

ROLE = "eventstore"


def plan_processes(config: PhotonConfig, region: str) -> list[ProcessSpec]:
    """``[eventstore].cache_servers`` cache servers (``<region>-eventstore``, then ``<region>-eventstore-<n>``)
    and ``[eventstore].logs_stores`` LogsEventStores (``<region>-logstore[-<n>]``), at the region's host (or
    ``[eventstore].host``) on ports fixed by the region's ``port_base`` or remembered in its state dir. All
    have role ``eventstore``; the logs stores' specs come last. A joiner is given the cache servers'
    addresses in order (the ring depends on it) and the logs stores'."""
    reg = config.region(region)
    es = config.eventstore
    host = reg.bind_host(es.host)
    base = [sys.executable, "-m", "eventstore.main", "--config", config.path, "--region", region, "--host", host]
    specs = []
    ports = region_ports(reg, "eventstore", host, es.cache_servers)
    metrics = region_ports(reg, "eventstore_metrics", host, es.cache_servers)
    for shard, port in enumerate(ports):
        name = f"{region}-eventstore" + (f"-{shard}" if shard else "")
        specs.append(ProcessSpec(name, base + ["--port", str(port), "--shard", str(shard)], ROLE, region,
                                 f"{host}:{port}", f"{host}:{metrics[shard]}"))
    if es.logs_stores:
        ports = region_ports(reg, "logstore", host, es.logs_stores)
        metrics = region_ports(reg, "logstore_metrics", host, es.logs_stores)
        for n, port in enumerate(ports):
            name = f"{region}-logstore" + (f"-{n}" if n else "")
            specs.append(ProcessSpec(name, base + ["--port", str(port), "--logs"], ROLE, region, f"{host}:{port}",
                                     f"{host}:{metrics[n]}"))
    return specs


def split_planned(specs: list[ProcessSpec]) -> tuple[list[str], list[str]]:
    """The cache servers' and the logs stores' addresses among :func:`plan_processes`' specs."""
    cache = [s.address for s in specs if "-logstore" not in s.name]
    logs = [s.address for s in specs if "-logstore" in s.name]
    return cache, logs
