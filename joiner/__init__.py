"""The stateless joiner: batches of foreign events (clicks) in, one :class:`Outcome` per event out.

Front door: :class:`Outcome`, :class:`JoinerClient` (``join``, ``join_future``, ``status``, ``close``),
:class:`JoinerUnavailable`, :func:`serve`, :class:`JoinerConfig`, :func:`load_adapter`,
:func:`read_status` (every joiner's latest statistics from a region's state folder).
Process: ``python -m joiner.main --config C --region R --name R-j0 --port P --eventstore HOST:PORT
--registry EP[,EP...]``. See docs/join-path.md.
"""
from joiner._client import JoinerClient, JoinerUnavailable
from joiner._joiner import JoinerStats
from joiner._server import JoinerServer, serve
from joiner._state import Outcome
from joiner._status import read_status
from joiner.config import JoinerConfig, load_adapter

__all__ = ["JoinerClient", "JoinerConfig", "JoinerServer", "JoinerStats", "JoinerUnavailable", "Outcome",
           "load_adapter", "read_status", "serve"]
