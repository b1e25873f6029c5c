"""MillWheel: keyed computations with per-key persistent state, timers, low watermarks and exactly-once
delivery (MillWheel paper §3-§7), with several worker threads per process and its state in PostgreSQL
(shared by every worker), SQLite (one process) or memory.

Write a :class:`Computation`, wire it into a :class:`Topology` with injectors, run it with
:class:`Runtime` (or :func:`serve`). See docs/millwheel.md.
"""
from millwheel._cache import CachedStore, CacheStatistics
from millwheel._config import MillWheelConfigError, RuntimeConfig
from millwheel._injectors import FileInjector, Injector, JoinedInjector, ListInjector, Poll
from millwheel._model import STRONG, WALL, WATERMARK, WEAK, Computation, Context, OutputFailed, Record, Timer
from millwheel._pgserver import EmbeddedPostgres, EmbeddedPostgresError
from millwheel._pgstore import PostgresStatistics, PostgresStore
from millwheel._runtime import ComputationStatistics, Runtime, RuntimeStatistics, serve
from millwheel._sinks import FileSink
from millwheel._store import MemoryStore, SetAsideRecord, SQLiteStore, StaleSequencer, Store, open_store
from millwheel._topology import Topology, TopologyError
from millwheel._transport import LocalTransport, Transport
from millwheel._watermarks import END_OF_TIME

__all__ = [
    "END_OF_TIME", "STRONG", "WALL", "WATERMARK", "WEAK", "CacheStatistics", "CachedStore", "Computation",
    "ComputationStatistics", "Context", "EmbeddedPostgres", "EmbeddedPostgresError", "FileInjector",
    "FileSink", "Injector", "JoinedInjector", "ListInjector", "LocalTransport", "MemoryStore",
    "MillWheelConfigError", "OutputFailed", "Poll", "PostgresStatistics", "PostgresStore", "Record", "Runtime",
    "RuntimeConfig", "RuntimeStatistics", "SetAsideRecord", "SQLiteStore", "StaleSequencer", "Store", "Timer", "Topology",
    "TopologyError", "Transport", "open_store", "serve",
]

# The replicated master (docs/millwheel.md, "The master"): placement core, replica and client.
from millwheel._master import MasterSpec, RunningMaster, master_specs, serve_master  # noqa: E402
from millwheel._master_client import Assignments, MasterClient, MasterUnavailable  # noqa: E402
from millwheel._master_state import Interval, IntervalLoad, PlacementPolicy, WorkerLoad  # noqa: E402

__all__ += ["Assignments", "Interval", "IntervalLoad", "MasterClient", "MasterSpec", "MasterUnavailable",
            "PlacementPolicy", "RunningMaster", "WorkerLoad", "master_specs", "serve_master"]

# Running as processes on one machine (docs/millwheel.md, "Workers as processes"): what `millwheel run
# --workers` does, in parts, for tools that start a cluster of their own (the benchmark).
from millwheel._cluster import (ClusterFile, Processes, cluster_path, known_workers, new_specs,  # noqa: E402
                                wait_cluster_idle, worker_argv, worker_status)

__all__ += ["ClusterFile", "Processes", "cluster_path", "known_workers", "new_specs", "wait_cluster_idle",
            "worker_argv", "worker_status"]
