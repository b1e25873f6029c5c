"""The EventStore: primary events (queries) by id, as raw log-line bytes, for the joiners.

Two kinds of process per region (Photon paper §3.4): ``[eventstore].cache_servers`` CacheEventStores (a
byte-bounded LRU of recent events each, fed by a durable primary reader that also writes the log-file map;
ids routed by a consistent-hash ring) and ``[eventstore].logs_stores`` LogsEventStores (any older event,
found in the logs through the map). See docs/eventstore.md.

Front door: :class:`EventStoreClient` (one store: ``lookup(ids) -> [raw | None]``, ``status()``),
:class:`EventStoreChain` / :func:`connect` (the joiner's lookup chain: cache servers, then logs stores,
recording who served each id), :class:`InMemoryEventStore` (the in-process twin), :class:`EventStoreUnavailable`,
:func:`serve` (a cache server), :func:`serve_logs` (a logs store), :class:`EventStoreConfig`,
:func:`plan_processes` / :func:`split_planned` (the region's processes, for the launcher), :class:`HashRing`,
and for ``photon eventstore build-map``: :func:`map_dir`, :func:`plan_map_ranges`, :func:`scan_map_range`,
:func:`read_map`; :func:`index_lines` (the primary reader's split of a chunk of lines into events and
bad records, for benchmarks).
Process: ``python -m eventstore.main --config C --region R --port P [--shard N | --logs]``.
"""
from typing import TYPE_CHECKING

from photon import lazy_exports

_WHERE = {
    "SERVED_BY_CACHE": "_chain", "SERVED_BY_LOGS": "_chain", "ChainStatistics": "_chain",
    "EventStoreChain": "_chain", "connect": "_chain",
    "EventStoreClient": "_client", "EventStoreUnavailable": "_client",
    "LogsStoreStatistics": "_logstore",
    "MapEntry": "_map",
    "SPARK_PREFIX": "_mapfiles", "map_dir": "_mapfiles", "plan_map_ranges": "_mapfiles",
    "scan_map_range": "_mapfiles",
    "plan_processes": "_plan", "split_planned": "_plan",
    "HashRing": "_ring",
    "EventStoreServer": "_server", "serve": "_server", "serve_logs": "_server", "store_dir": "_server",
    "EventStoreStatistics": "_shell", "InMemoryEventStore": "_shell",
    "IndexedLines": "_state", "index_lines": "_state",
    "EventStoreConfig": "config",
}
"""Where each exported name lives, imported on first use (PEP 562): the launcher plans event store processes and a
joiner connects to them without importing the cache, the primary reader and the servers."""

if TYPE_CHECKING:
    from eventstore._map import MapEntry


__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())


def read_map(directory) -> "tuple[list[MapEntry], int]":
    """Every entry of a log-file map folder and the number of bad lines skipped."""
    from eventstore._mapfiles import MapFiles
    return MapFiles(directory).read_all()


__all__ = ["SERVED_BY_CACHE", "SERVED_BY_LOGS", "SPARK_PREFIX", "ChainStatistics", "EventStoreChain",
           "EventStoreClient", "EventStoreConfig", "EventStoreServer", "EventStoreStatistics",
           "EventStoreUnavailable", "HashRing", "InMemoryEventStore", "LogsStoreStatistics", "MapEntry", "connect",
           "IndexedLines", "index_lines",
           "map_dir", "plan_map_ranges", "plan_processes", "read_map", "scan_map_range", "serve", "serve_logs",
           "split_planned", "store_dir"]
