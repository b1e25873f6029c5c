"""The CacheEventStore: recent primary events (queries) by id, served over gRPC as raw log-line bytes.

Front door: :class:`EventStoreClient` (``lookup(ids) -> [raw | None]``, ``status()``, ``close()``),
:class:`InMemoryEventStore` (its in-process twin, filled with ``put``), :class:`EventStoreUnavailable`,
:func:`serve` (starts the primary reader and the gRPC server of one region), :class:`EventStoreConfig`,
:func:`plan_processes` (the region's event store process, for the launcher).
Process: ``python -m eventstore.main --config C --region R --port P``.
"""
from eventstore._client import EventStoreClient, EventStoreUnavailable
from eventstore._plan import plan_processes
from eventstore._server import EventStoreServer, serve
from eventstore._shell import EventStoreStatistics, InMemoryEventStore
from eventstore.config import EventStoreConfig

__all__ = ["EventStoreClient", "EventStoreConfig", "EventStoreServer", "EventStoreStatistics", "EventStoreUnavailable",
           "InMemoryEventStore", "plan_processes", "serve"]
