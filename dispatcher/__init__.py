"""The dispatcher: tails a region's foreign logs, keeps offsets and the retry queue, feeds the joiners.

Front door: :func:`serve` starts one region's dispatcher in this process (``python -m dispatcher.main``
runs it as its own process), :func:`read_status` reads what a running one reports, :func:`plan_processes` names its process for the
launcher, and
:class:`DispatcherState` is the pure deciding core (facts in, commands out) for tests and tools, with the
facts and commands tools feed it and read from it (:class:`LinesRead` of :class:`ChunkRead`,
:class:`LookupAnswered`, :class:`JoinAnswered`, :class:`TimePassed`; :class:`Lookup`, :class:`SendBatch`,
:class:`Checkpoint`) and :func:`encode_delta` (a checkpoint's delta as the journal holds it), and
:class:`RegionShare` says which region joins a click first (for tools that show the share).
"""
from photon import DispatcherConfig, lazy_exports

_WHERE = {
    "DispatcherLocked": "_files", "read_status": "_files", "encode_delta": "_files",
    "plan_processes": "_plan",
    "Dispatcher": "_shell", "serve": "_shell",
    "RegionShare": "_share",
    "DispatcherState": "_state", "DispatcherStatistics": "_state",
    "Checkpoint": "_messages", "ChunkRead": "_messages", "JoinAnswered": "_messages", "LinesRead": "_messages",
    "Lookup": "_messages", "LookupAnswered": "_messages", "SendBatch": "_messages", "TimePassed": "_messages",
}
"""Where each exported name lives, imported on first use (PEP 562): the launcher plans the dispatcher's process and
reads its status without importing the dispatcher itself."""


__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())


__all__ = ["Checkpoint", "ChunkRead", "Dispatcher", "DispatcherConfig", "DispatcherLocked", "DispatcherState",
           "DispatcherStatistics", "JoinAnswered", "LinesRead", "Lookup", "LookupAnswered", "RegionShare", "SendBatch",
           "TimePassed", "encode_delta", "plan_processes", "read_status", "serve"]
