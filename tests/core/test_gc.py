"""photon.settle_gc: a serving process's start-up objects are frozen, young collections run less often, and
reference cycles made afterwards are still collected. Run in a child process: the test runner's collector is
left as it is."""
import subprocess
import sys

import pytest

CHILD = r"""
import gc, weakref
import photon
from photon._gc import GEN0_THRESHOLD
before = gc.get_threshold()
photon.settle_gc()
after = gc.get_threshold()
assert after == (GEN0_THRESHOLD, before[1], before[2]), (before, after)
assert gc.get_freeze_count() > 1000, gc.get_freeze_count()   # the imports' objects, not walked any more
assert gc.isenabled()

class Node:
    pass

a, b = Node(), Node()
a.other, b.other = b, a                     # a cycle made after start-up
gone = weakref.ref(a)
del a, b
gc.collect()
assert gone() is None, "a cycle made after settle_gc was not collected"
print("ok")
"""


@pytest.mark.timeout(60)
def test_settle_gc_freezes_start_up_and_still_collects_cycles():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=50, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


@pytest.mark.timeout(60)
def test_pipeline_mains_settle_the_collector_once_serving():
    """The dispatcher's, joiner's and event store's mains call it after their server is up (not before:
    then what start-up made would be walked again at every full collection)."""
    from pathlib import Path
    repo = Path(__file__).resolve().parents[2]
    for main in ("dispatcher/main.py", "joiner/main.py", "eventstore/main.py"):
        text = (repo / main).read_text()
        assert "settle_gc()" in text, main
        assert text.index("settle_gc()") > text.index("serve("), main
