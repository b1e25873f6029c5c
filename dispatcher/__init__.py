"""The dispatcher: tails a region's foreign logs, keeps offsets and the retry queue, feeds the joiners.

Front door: :func:`serve` starts one region's dispatcher in this process (``python -m dispatcher.main``
runs it as its own process), :func:`read_status` reads what a running one reports, :func:`plan_processes` names its process for the
launcher, and
:class:`DispatcherState` is the pure deciding core (facts in, commands out) for tests and tools, and
:class:`RegionShare` says which region joins a click first (for tools that show the share).
"""
from photon import DispatcherConfig

from dispatcher._files import DispatcherLocked, read_status
from dispatcher._plan import plan_processes
from dispatcher._shell import Dispatcher, serve
from dispatcher._share import RegionShare
from dispatcher._state import DispatcherState, DispatcherStatistics

__all__ = ["Dispatcher", "DispatcherConfig", "DispatcherLocked", "DispatcherState", "DispatcherStatistics",
           "RegionShare", "plan_processes", "read_status", "serve"]
