"""Ending a MillWheel process (a worker, a master replica) within a bound once its own stop is done.

The interpreter's normal exit waits, without limit, for every thread that is not a daemon: gRPC's handler
threads (a server's ``ThreadPoolExecutor``) among them. A handler left waiting on a call that nobody will
finish (its peer gone, the server already stopped under it) would keep a stopped process alive until
``millwheel run`` kills it 20 s after its SIGTERM. :func:`exit_bounded` gives those threads a short time to
end and otherwise ends the process itself, with the same status and its output flushed.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time

EXIT_WAIT_S = 2.0
"""How long a stopped process waits for its other non-daemon threads before it exits without them."""


def _waited_on() -> list[threading.Thread]:
    me = threading.current_thread()
    return [t for t in threading.enumerate() if t is not me and not t.daemon and t.is_alive()]


def exit_bounded(code: int, name: str, wait_s: float = EXIT_WAIT_S) -> int:
    """``code``, once every other non-daemon thread has ended within ``wait_s`` (the interpreter's normal
    exit, with its exit handlers, follows when the caller returns it). When some are still running then, the
    process ends at once with ``code`` (``os._exit``), after naming them on stderr and flushing its output:
    what the process had to do on stop was done before this is called."""
    deadline = time.monotonic() + wait_s
    for t in _waited_on():
        t.join(max(0.0, deadline - time.monotonic()))
    left = _waited_on()
    if not left:
        return code
    print(f"{name}: exiting without {len(left)} thread(s) still running {wait_s:.0f} s after the stop: "
          f"{', '.join(sorted(t.name for t in left))}", file=sys.stderr, flush=True)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
