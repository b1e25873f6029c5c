"""The stateless joiner: batches of foreign events (clicks) in, one :class:`Outcome` per event out.

Front door: :class:`Outcome`, :class:`JoinerClient` (``join``, ``join_future``, ``status``, ``close``),
:class:`JoinerUnavailable`, :func:`serve`, :class:`JoinerConfig`, :func:`load_adapter`,
:func:`read_status` (every joiner's latest statistics from a region's state folder), :func:`read_lost`
(every entry of a region's lost-ids ledgers: ids registered but not written), :func:`plan_processes`
(the region's joiner processes, for the launcher). :class:`Outcome` is the base's (:mod:`photon`).
Process: ``python -m joiner.main --config C --region R --name R-j0 --port P --eventstore HOST:PORT
--registry EP[,EP...]``. See docs/join-path.md.
"""
from photon import Outcome, lazy_exports

_WHERE = {
    "JoinerClient": "_client", "JoinerUnavailable": "_client",
    "JoinerStatistics": "_shell",
    "read_lost": "_lost",
    "plan_processes": "_plan",
    "JoinerServer": "_server", "serve": "_server",
    "read_status": "_status",
    "JoinerConfig": "config", "load_adapter": "config",
}
"""Where each exported name lives, imported on first use (PEP 562): the launcher plans joiner processes and a
dispatcher talks to joiners without importing the joiner's server, output writer and adapters."""


__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())


__all__ = ["JoinerClient", "JoinerConfig", "JoinerServer", "JoinerStatistics", "JoinerUnavailable", "Outcome",
           "load_adapter", "plan_processes", "read_lost", "read_status", "serve"]
