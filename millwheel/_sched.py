"""The threads of a worker process scheduled as batch threads (Linux's ``SCHED_BATCH``).

A worker process hands every record and every transaction from one thread to another (the worker thread
wakes the commit thread, a landing wakes a peer sender, gRPC's threads wake the handler and the sender),
and each hand-off wakes the other thread while the waking thread holds the GIL. Under the default policy
the kernel may run a woken thread at once on the waker's core, preempting the waker: the woken thread
then finds the GIL held by the thread it preempted and waits for it, and the process waits for both. A
py-spy profile of the GIL holder put these wake-ups (``Condition.notify``, ``SimpleQueue.put`` in
``_Committer.submit``) at the top of the worker processes' own frames: 14% and 7% of the GIL's samples at
1,000 records/s (docs/millwheel.md, eighteenth pass). A batch thread does not preempt the running thread
when it is woken: it runs when a core is free or at the next scheduler tick, by its fair share as
before (no priority changes and no privilege needed; ``nice`` still applies).

The policy is set for the calling thread; threads inherit their creator's, so :func:`batch_threads` is
called before a worker process starts any thread. It changes when threads run, never what they do.
"""
from __future__ import annotations

import os

BATCH = getattr(os, "SCHED_BATCH", None)
"""``os.SCHED_BATCH`` where the platform has it (Linux), else ``None``."""


def batch_threads() -> bool:
    """Make the calling thread (and every thread it starts from now on) a ``SCHED_BATCH`` thread; False
    (and nothing changed) where the platform has no such policy or refuses it."""
    if BATCH is None:
        return False
    try:
        os.sched_setscheduler(0, BATCH, os.sched_param(0))
    except OSError:
        return False
    return True


def thread_policy() -> int | None:
    """The scheduling policy of the calling thread (``os.SCHED_*``), ``None`` where it cannot be read."""
    try:
        return os.sched_getscheduler(0)
    except (AttributeError, OSError):
        return None
