"""A worker process's C heap keeps freed memory (``millwheel/_malloc.py``): a small encoding kept alive
no longer costs a page fault."""
from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")]

PROBE = """
import resource, sys
import orjson
from millwheel._malloc import keep_heap
ok = keep_heap() if sys.argv[1] == "keep" else None
values = [{"n": i} for i in range(10000)]
faults = []
for _ in range(3):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    kept = [orjson.dumps(v) for v in values]
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    del kept
print(ok, min(faults))
"""


def probe(mode: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=50,
                         check=True).stdout.split()
    return out[0], int(out[1])


def test_kept_encodings_stop_faulting_once_the_heap_is_kept():
    ok, faults = probe("keep")
    assert ok == "True"
    assert faults < 100          # 10,000 values kept: the heap grew once and stays
    _, default_faults = probe("default")
    assert default_faults > faults
