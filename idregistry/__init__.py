"""The IdRegistry: which event ids have been joined, replicated by Raft (pysyncobj), one group per shard.

Front door for other rooms and the launcher:

* :class:`RegistryClient` / :func:`connect` to look ids up and commit them (``memory://`` gives the
  in-process :class:`InMemoryRegistry` twin for unit tests);
* :func:`registry_processes` (its replicas, as :class:`photon.ProcessSpec`) / :func:`registry_endpoints`
  for the launcher;
* :func:`export_registry` / :func:`check_export` (every shard as Parquet) and :func:`clear_output_tokens`;
* :func:`replica_places` (where each replica runs and keeps its data) and ``registry_processes(config,
  job=...)`` for a job that brings the registry up itself when none runs (its replicas refuse pipeline
  traffic); :data:`DATA_LOCK_FILE`, the lock a replica holds on its data dir for its life;
* :func:`serve` to run one replica in this process; :func:`registry_command` for ``photon registry``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from photon import lazy_exports

from idregistry._state import CommitResult
from idregistry.config import RegistryConfig

_WHERE = {
    "registry_command": "_cli",
    "ClientStatistics": "_client", "RegistryClient": "_client", "RegistryStatistics": "_client",
    "RegistryUnavailable": "_client", "ShardStatistics": "_client",
    "ExportError": "_export", "check_export": "_export", "clear_output_tokens": "_export",
    "export_registry": "_export",
    "ReplicaPlace": "_layout", "registry_endpoints": "_layout", "registry_processes": "_layout",
    "replica_places": "_layout",
    "InMemoryRegistry": "_memory", "shared_memory_registry": "_memory",
    "measure_state_memory": "_probe",
    "DATA_LOCK_FILE": "_replica", "DataDirInUse": "_replica",
    "serve": "_server",
    "ReplicaSpec": "_spec",
    "client_recorder": "_trace", "cpu_pressure_us": "_trace", "thread_sched": "_trace",
}
"""Where each exported name lives, imported on first use (PEP 562): a replica process (``idregistry.main``)
does not import the client, the export or the command line, which it never uses."""

if TYPE_CHECKING:
    from idregistry._client import RegistryClient
    from idregistry._memory import InMemoryRegistry


__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())


MEMORY_URL = "memory://"


def connect(endpoints: list[str] | str, near_host: str | None = None) -> RegistryClient | InMemoryRegistry:
    """A registry client for ``["host:port", ...]`` (or one ``"host:port"``, or a comma-separated list);
    ``"memory://"`` returns the process-wide :class:`InMemoryRegistry`. Lookups go first to replicas on
    ``near_host`` (the caller's region's host), see :func:`read_order`."""
    if isinstance(endpoints, str):
        if endpoints.startswith(MEMORY_URL):
            return __getattr__("shared_memory_registry")()
        endpoints = [e.strip() for e in endpoints.split(",") if e.strip()]
    return __getattr__("RegistryClient")(list(endpoints), near_host=near_host)


__all__ = ["ClientStatistics", "CommitResult", "DATA_LOCK_FILE", "DataDirInUse", "ExportError", "ReplicaPlace",
           "replica_places", "check_export", "clear_output_tokens",
           "export_registry", "InMemoryRegistry", "RegistryClient", "RegistryConfig",
           "RegistryStatistics", "RegistryUnavailable", "ReplicaSpec", "ShardStatistics", "connect",
           "measure_state_memory", "registry_command", "client_recorder", "cpu_pressure_us", "thread_sched",
           "registry_endpoints", "registry_processes", "serve"]
