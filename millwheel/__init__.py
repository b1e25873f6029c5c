"""MillWheel: keyed computations with per-key persistent state, timers, low watermarks and exactly-once
delivery (MillWheel paper §3-§7), with several worker threads per process and its state in PostgreSQL
(shared by every worker), SQLite (one process) or memory.

Write a :class:`Computation`, wire it into a :class:`Topology` with injectors, run it with
:class:`Runtime` (or :func:`serve`). See docs/millwheel.md.
"""
from photon import lazy_exports

_WHERE = {
    "CachedStore": "_cache", "CacheStatistics": "_cache",
    "MillWheelConfigError": "_config", "RuntimeConfig": "_config",
    "FileInjector": "_injectors", "Injector": "_injectors", "JoinedInjector": "_injectors",
    "ListInjector": "_injectors", "Poll": "_injectors",
    "STRONG": "_model", "WALL": "_model", "WATERMARK": "_model", "WEAK": "_model", "Computation": "_model",
    "Context": "_model", "OutputFailed": "_model", "Record": "_model", "Timer": "_model",
    "EmbeddedPostgres": "_pgserver", "EmbeddedPostgresError": "_pgserver",
    "PostgresStatistics": "_pgstore", "PostgresStore": "_pgstore",
    "ComputationStatistics": "_runtime", "Runtime": "_runtime", "RuntimeStatistics": "_runtime", "serve": "_runtime",
    "FileSink": "_sinks",
    "MemoryStore": "_store", "SetAsideRecord": "_store", "SQLiteStore": "_store", "StaleSequencer": "_store",
    "Store": "_store", "open_store": "_store",
    "Topology": "_topology", "TopologyError": "_topology",
    "LocalTransport": "_transport", "Transport": "_transport",
    "END_OF_TIME": "_watermarks",
    # The replicated master (docs/millwheel.md, "The master"): placement core, replica and client.
    "MasterSpec": "_master", "RunningMaster": "_master", "master_specs": "_master", "serve_master": "_master",
    "Assignments": "_master_client", "MasterClient": "_master_client", "MasterUnavailable": "_master_client",
    "Interval": "_master_state", "IntervalLoad": "_master_state", "PlacementPolicy": "_master_state",
    "WorkerLoad": "_master_state",
    # Running as processes on one machine (docs/millwheel.md, "Workers as processes"): what `millwheel run
    # --workers` does, in parts, for tools that start a cluster of their own (the benchmark).
    "ClusterFile": "_cluster", "Processes": "_cluster", "cluster_path": "_cluster", "known_workers": "_cluster",
    "new_specs": "_cluster", "wait_cluster_idle": "_cluster", "worker_argv": "_cluster", "worker_status": "_cluster",
}
"""Where each exported name lives. Names are imported on first use (PEP 562): a master replica does not pay
at start for the runtime, the stores and PostgreSQL's driver, nor a topology's module for the master's Raft
(docs/history/performance.md, "Twenty-second pass: the test suite's processes start faster")."""

__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())

__all__ = sorted(_WHERE)
