"""The C heap of a worker process: glibc's trimming turned down.

By default glibc gives freed memory back to the kernel once more than 128 KiB is free at the top of a
heap, and the pages fault in again when it grows. A worker process allocates and frees buffers all the
time (an encoded value, a statement's parameters, an RPC's message) while keeping small objects alive
between them, and paid a page fault per kept object: ``orjson.dumps`` of a small value kept alive cost
1.5 µs of CPU where the same call whose result is dropped costs 0.15 µs (about 10,000 minor faults per
10,000 values kept, measured with ``getrusage``; none once the trim threshold is raised), and a record
goes through several such encodings. :func:`keep_heap` raises the trim threshold and pads each growth, so
freed memory stays in the process for reuse; the price is up to ``TRIM_THRESHOLD_BYTES`` of free heap
kept per arena.
"""
from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
TRIM_THRESHOLD_BYTES = 64 << 20
TOP_PAD_BYTES = 16 << 20


def keep_heap(trim_threshold: int = TRIM_THRESHOLD_BYTES, top_pad: int = TOP_PAD_BYTES) -> bool:
    """Set glibc's ``M_TRIM_THRESHOLD`` and ``M_TOP_PAD`` for this process; False (and nothing changed)
    where the C library has no ``mallopt`` or refuses (not Linux, not glibc)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_TRIM_THRESHOLD, trim_threshold)) and bool(mallopt(M_TOP_PAD, top_pad))
