"""The event store's processes for one region, as the launcher runs them."""
from __future__ import annotations

import sys

from photon import PhotonConfig, ProcessSpec, remembered_ports

ROLE = "eventstore"


def plan_processes(config: PhotonConfig, region: str) -> list[ProcessSpec]:
    """``[eventstore].cache_servers`` cache servers (``<region>-eventstore``, then ``<region>-eventstore-<n>``)
    and ``[eventstore].logs_stores`` LogsEventStores (``<region>-logstore[-<n>]``), each on a port remembered
    in the region's state dir. All have role ``eventstore``; the logs stores' specs come last. A joiner is
    given the cache servers' addresses in order (the ring depends on it) and the logs stores'."""
    reg = config.region(region)
    es = config.eventstore
    host = es.host
    base = [sys.executable, "-m", "eventstore.main", "--config", config.path, "--region", region]
    specs = []
    for shard, port in enumerate(remembered_ports(reg.state_dir, ROLE, host, es.cache_servers)):
        name = f"{region}-eventstore" + (f"-{shard}" if shard else "")
        specs.append(ProcessSpec(name, base + ["--port", str(port), "--shard", str(shard)], ROLE, region,
                                 f"{host}:{port}"))
    if es.logs_stores:
        for n, port in enumerate(remembered_ports(reg.state_dir, "logstore", host, es.logs_stores)):
            name = f"{region}-logstore" + (f"-{n}" if n else "")
            specs.append(ProcessSpec(name, base + ["--port", str(port), "--logs"], ROLE, region, f"{host}:{port}"))
    return specs


def split_planned(specs: list[ProcessSpec]) -> tuple[list[str], list[str]]:
    """The cache servers' and the logs stores' addresses among :func:`plan_processes`' specs."""
    cache = [s.address for s in specs if "-logstore" not in s.name]
    logs = [s.address for s in specs if "-logstore" in s.name]
    return cache, logs
