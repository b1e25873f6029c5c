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
from eventstore._chain import SERVED_BY_CACHE, SERVED_BY_LOGS, ChainStatistics, EventStoreChain, connect
from eventstore._client import EventStoreClient, EventStoreUnavailable
from eventstore._logstore import LogsStoreStatistics
from eventstore._map import MapEntry
from eventstore._mapfiles import SPARK_PREFIX, map_dir, plan_map_ranges, scan_map_range
from eventstore._plan import plan_processes, split_planned
from eventstore._ring import HashRing
from eventstore._server import EventStoreServer, serve, serve_logs, store_dir
from eventstore._shell import EventStoreStatistics, InMemoryEventStore
from eventstore._state import IndexedLines, index_lines
from eventstore.config import EventStoreConfig


def read_map(directory) -> tuple[list[MapEntry], int]:
    """Every entry of a log-file map folder and the number of bad lines skipped."""
    from eventstore._mapfiles import MapFiles
    return MapFiles(directory).read_all()


__all__ = ["SERVED_BY_CACHE", "SERVED_BY_LOGS", "SPARK_PREFIX", "ChainStatistics", "EventStoreChain",
           "EventStoreClient", "EventStoreConfig", "EventStoreServer", "EventStoreStatistics",
           "EventStoreUnavailable", "HashRing", "InMemoryEventStore", "LogsStoreStatistics", "MapEntry", "connect",
           "IndexedLines", "index_lines",
           "map_dir", "plan_map_ranges", "plan_processes", "read_map", "scan_map_range", "serve", "serve_logs",
           "split_planned", "store_dir"]
