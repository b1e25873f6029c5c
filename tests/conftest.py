"""Shared fixtures: free ports, processes stopped by pid on teardown (also on failure), conditions with
deadlines instead of sleeps."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Procs:
    """Starts child processes and guarantees they are stopped (SIGTERM, then SIGKILL) by pid."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, argv: list[str], **kw) -> subprocess.Popen:
        kw.setdefault("cwd", REPO)
        p = subprocess.Popen(argv, start_new_session=True, **kw)
        self.procs.append(p)
        return p

    def python(self, *args: str, **kw) -> subprocess.Popen:
        return self.start([sys.executable, *args], **kw)

    def stop_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(timeout=10)
        for p in self.procs:
            for stream in (p.stdout, p.stderr, p.stdin):
                if stream is not None:
                    stream.close()


@pytest.fixture
def procs():
    p = Procs()
    try:
        yield p
    finally:
        p.stop_all()


@pytest.fixture
def pipes(procs):
    """``procs`` under the name tests that read their processes' pipes use (pipes are closed at teardown)."""
    return procs


@pytest.fixture(scope="session")
def session_procs():
    p = Procs()
    try:
        yield p
    finally:
        p.stop_all()


@pytest.fixture(scope="session")
def spark():
    """One real local SparkSession for the whole test session (it takes seconds to start), built the way
    Photon's jobs build it (quiet log, UI off), with two local cores."""
    from photon import parse_config
    from photon.app import spark_session
    cfg = parse_config({"regions": [{"name": "t", "log_root": "/nonexistent", "output_root": "/nonexistent",
                                     "state_dir": "/nonexistent"}],
                        "spark": {"master": "local[2]", "shuffle_partitions": 4, "driver_memory": "1g"}})
    session = spark_session(cfg, "photon-tests")
    try:
        yield session
    finally:
        session.stop()
