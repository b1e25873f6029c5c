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

from idregistry._cli import registry_command
from idregistry._client import (ClientStatistics, RegistryClient, RegistryStatistics, RegistryUnavailable,
                                ShardStatistics)
from idregistry._export import ExportError, check_export, clear_output_tokens, export_registry
from idregistry._layout import ReplicaPlace, registry_endpoints, registry_processes, replica_places
from idregistry._memory import InMemoryRegistry, shared_memory_registry
from idregistry._probe import measure_state_memory
from idregistry._replica import DATA_LOCK_FILE, DataDirInUse
from idregistry._server import serve
from idregistry._shell import ReplicaSpec
from idregistry._state import CommitResult
from idregistry.config import RegistryConfig

MEMORY_URL = "memory://"


def connect(endpoints: list[str] | str, near_host: str | None = None) -> RegistryClient | InMemoryRegistry:
    """A registry client for ``["host:port", ...]`` (or one ``"host:port"``, or a comma-separated list);
    ``"memory://"`` returns the process-wide :class:`InMemoryRegistry`. Lookups go first to replicas on
    ``near_host`` (the caller's region's host), see :func:`read_order`."""
    if isinstance(endpoints, str):
        if endpoints.startswith(MEMORY_URL):
            return shared_memory_registry()
        endpoints = [e.strip() for e in endpoints.split(",") if e.strip()]
    return RegistryClient(list(endpoints), near_host=near_host)


__all__ = ["ClientStatistics", "CommitResult", "DATA_LOCK_FILE", "DataDirInUse", "ExportError", "ReplicaPlace",
           "replica_places", "check_export", "clear_output_tokens",
           "export_registry", "InMemoryRegistry", "RegistryClient", "RegistryConfig",
           "RegistryStatistics", "RegistryUnavailable", "ReplicaSpec", "ShardStatistics", "connect",
           "measure_state_memory", "registry_command", "registry_endpoints", "registry_processes", "serve"]
