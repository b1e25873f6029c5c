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


class SmallDisk:
    """A real tmpfs of a few hundred KB mounted on a folder: writes beyond it fail with ENOSPC."""

    def __init__(self, path) -> None:
        self.path = path
        self.mounted = False

    def mount(self, size: str) -> None:
        os.makedirs(self.path, exist_ok=True)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(self.path)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"this machine refuses to mount a tmpfs ({r.stderr.strip() or r.returncode}): "
                        "the disk-full test needs one")
        self.mounted = True

    def resize(self, size: str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(self.path)], check=True, capture_output=True)

    def fill(self, name: str = ".filler") -> int:
        """Write zeros into ``name`` until the disk is full (ENOSPC); returns the bytes written."""
        n = 0
        with open(os.path.join(self.path, name), "ab", buffering=0) as f:
            try:
                while True:
                    n += f.write(bytes(4096))
            except OSError as e:
                if e.errno != 28:
                    raise
        return n

    def unmount(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True)
            self.mounted = False


@pytest.fixture
def small_disk():
    """``small_disk(path, size="300k") -> SmallDisk``: mounts a tmpfs there (skips, saying why, where the
    machine refuses); every disk mounted is unmounted at teardown, also on failure."""
    disks: list[SmallDisk] = []

    def make(path, size: str = "300k") -> SmallDisk:
        d = SmallDisk(path)
        disks.append(d)
        d.mount(size)
        return d

    try:
        yield make
    finally:
        for d in reversed(disks):
            d.unmount()

# S3: the session's moto_server process and a fresh bucket per test (tests/s3_helpers.py)
from s3_helpers import moto_server, s3  # noqa: E402,F401

