"""Where every process of a deployment is, from the config alone (any machine holding it can say).

When every region has a ``port_base``, every address follows from the config: the rooms plan their
processes exactly as ``photon run`` does, but against a throw-away copy of the state dirs (planning
remembers nothing there when ports are fixed, and a machine must never write into another region's state
dir). Without a ``port_base`` a region's ports were picked free by its launcher and are known only on its
machine (its ``launcher.json``)."""
from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import idregistry
from photon import REGION_PORTS, PhotonConfig, ProcessSpec, RegionConfig
from photon.app._launcher import plan_region

DEFAULT_HOST = "127.0.0.1"


def addresses_from_config(config: PhotonConfig) -> bool:
    """True when every process's address follows from the config (every region has a ``port_base``)."""
    return all(r.port_base for r in config.regions)


def planned_processes(config: PhotonConfig) -> list[ProcessSpec] | None:
    """Every process ``photon run`` would start for ``config`` (registry replicas of the configured shards
    first, then each pipeline region's event stores, joiners and dispatcher), with the addresses they serve
    and their metrics addresses; None when the config does not fix them (see :func:`addresses_from_config`).
    Touches no state dir."""
    if not addresses_from_config(config):
        return None
    with tempfile.TemporaryDirectory(prefix="photon-plan-") as tmp:
        regions = [dataclasses.replace(r, state_dir=str(Path(tmp) / "regions" / r.name)) for r in config.regions]
        registry = dataclasses.replace(config.registry, data_dir=str(Path(tmp) / "registry"))
        shadow = dataclasses.replace(config, regions=regions, registry=registry)
        specs = list(idregistry.registry_processes(shadow))
        endpoints = idregistry.registry_endpoints(shadow)
        for region in shadow.pipeline_regions:
            near = idregistry.registry_endpoints(shadow, near=region.name)
            specs += plan_region(shadow, region.name, near or endpoints)
    return specs


def control_address(region: RegionConfig) -> str | None:
    """``host:port`` of the control endpoint of ``region``'s launcher (None without a ``port_base``)."""
    if not region.port_base:
        return None
    return f"{region.bind_host(DEFAULT_HOST)}:{region.port_base + REGION_PORTS['control']}"
