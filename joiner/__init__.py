"""The stateless joiner: batches of foreign events (clicks) in, one :class:`Outcome` per event out.

Front door: :class:`Outcome`, :class:`JoinerClient` (``join``, ``join_future``, ``status``, ``close``),
:class:`JoinerUnavailable`, :func:`serve`, :class:`JoinerConfig`, :func:`load_adapter`,
:func:`read_status` (every joiner's latest statistics from a region's state folder), :func:`read_lost`
(every entry of a region's lost-ids ledgers: ids registered but not written), :func:`plan_processes`
(the region's joiner processes, for the launcher). :class:`Outcome` is the base's (:mod:`photon`).
Process: ``python -m joiner.main --config C --region R --name R-j0 --port P --eventstore HOST:PORT
--registry EP[,EP...]``. See docs/join-path.md.
"""
from photon import Outcome

from joiner._client import JoinerClient, JoinerUnavailable
from joiner._shell import JoinerStatistics
from joiner._lost import read_lost
from joiner._plan import plan_processes
from joiner._server import JoinerServer, serve
from joiner._status import read_status
from joiner.config import JoinerConfig, load_adapter

__all__ = ["JoinerClient", "JoinerConfig", "JoinerServer", "JoinerStatistics", "JoinerUnavailable", "Outcome",
           "load_adapter", "plan_processes", "read_lost", "read_status", "serve"]
