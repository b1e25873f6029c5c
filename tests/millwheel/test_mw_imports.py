"""What each MillWheel process imports at start (millwheel/__init__.py imports on first use): a master replica
and the ``millwheel run --workers N`` parent need neither the runtime, nor the stores, nor PostgreSQL's driver;
every name the package exports is still there."""
from __future__ import annotations

import json
import subprocess
import sys

import millwheel

HEAVY = {"millwheel._runtime", "millwheel._process", "millwheel._pgstore", "millwheel._injectors", "psycopg"}

_CHILD = """
import json, sys
import millwheel.master, millwheel.cli
started = sorted(sys.modules)
from millwheel import *
print(json.dumps({"started": started, "names": dir()}))
"""


def test_a_master_replica_and_the_clusters_parent_import_no_runtime_store_or_postgres_driver():
    """One fresh interpreter: what the master's and the parent's modules import (a master replica runs
    ``python -m millwheel.master``, the parent ``millwheel.cli``), then every exported name by ``import *``."""
    r = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=120, check=True)
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    started = set(seen["started"])
    assert {"millwheel._master", "millwheel._cluster"} <= started
    assert not started & HEAVY, started & HEAVY
    assert set(millwheel.__all__) <= set(seen["names"])


def test_every_exported_name_is_there_and_from_the_module_it_names():
    for name in millwheel.__all__:
        value = getattr(millwheel, name)
        assert value is getattr(sys.modules[f"millwheel.{millwheel._WHERE[name]}"], name)
    assert set(millwheel.__all__) <= set(dir(millwheel))
