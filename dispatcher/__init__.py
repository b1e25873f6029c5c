"""The dispatcher: tails a region's foreign logs, keeps offsets and the retry queue, feeds the joiners.

Front door: :func:`serve` starts one region's dispatcher in this process (``python -m dispatcher.main``
runs it as its own process), :func:`read_status` reads what a running one reports, :func:`plan_processes` names its process for the
launcher, and
:class:`DispatcherState` is the pure deciding core (facts in, commands out) for tests and tools, and
:class:`RegionShare` says which region joins a click first (for tools that show the share).
"""
import importlib

from photon import DispatcherConfig

_WHERE = {
    "DispatcherLocked": "_files", "read_status": "_files",
    "plan_processes": "_plan",
    "Dispatcher": "_shell", "serve": "_shell",
    "RegionShare": "_share",
    "DispatcherState": "_state", "DispatcherStatistics": "_state",
}
"""Where each exported name lives, imported on first use (PEP 562): the launcher plans the dispatcher's process and
reads its status without importing the dispatcher itself."""


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'dispatcher' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"dispatcher.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_WHERE))


__all__ = ["Dispatcher", "DispatcherConfig", "DispatcherLocked", "DispatcherState", "DispatcherStatistics",
           "RegionShare", "plan_processes", "read_status", "serve"]
