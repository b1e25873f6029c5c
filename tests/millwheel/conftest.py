"""MillWheel fixtures: one embedded PostgreSQL server for the session (a real server on a free port of
127.0.0.1, stopped after the last test, also on failure) and a fresh schema in it per test.

Under root the server runs as another user, which must be able to reach its data directory. pytest
resets its own temporary root to mode 0700 whenever a session starts (other sessions on the same machine
included), so data directories live in folders of their own under the system's temporary directory."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from millwheel import EmbeddedPostgres


def _reachable_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="millwheel-test-"))


@pytest.fixture
def reachable_tmp():
    """A temporary folder outside pytest's own (see the module docstring), removed at teardown."""
    d = _reachable_dir()
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_server():
    d = _reachable_dir()
    server = EmbeddedPostgres(d / "pg")
    try:
        yield server.start()
    finally:
        server.stop()
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def pg_url(pg_server):
    """A store URL on the session's server whose tables live in a schema of their own."""
    return f"{pg_server.url}?schema=t_{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def pg_template():
    """A data directory made by ``initdb`` once for the session (its server started once and stopped
    cleanly): each server of a test's own starts from a copy of it (``cp -a``: the same files, owners and
    modes) instead of its own ``initdb`` (3-8 s each on a loaded 2-core host, the copy 0.5 s)."""
    d = _reachable_dir()
    try:
        EmbeddedPostgres(d / "pg").start().stop()
        yield d / "pg"
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def own_pg(reachable_tmp, pg_template):
    """A server of the test's own, free to stop, crash and start again (the session's server is shared),
    on a copy of the session's freshly made data directory."""
    subprocess.run(["cp", "-a", str(pg_template), str(reachable_tmp / "pg")], check=True, timeout=120)
    server = EmbeddedPostgres(reachable_tmp / "pg")
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture
def cluster_runs():
    """The ``millwheel run`` children a test starts (append each): closed at teardown, also on failure, and
    every process each started (workers, masters) must be gone."""
    runs: list = []
    try:
        yield runs
    finally:
        for r in runs:
            r.close()
        for r in runs:
            assert r.proc.poll() is not None


@pytest.fixture
def stopped():
    """Pids a test SIGSTOPs (append each): resumed at teardown, also on failure."""
    pids: list[int] = []
    try:
        yield pids
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
