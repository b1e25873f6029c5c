"""A fake of the IdRegistry front door (``idregistry.connect(...)`` clients: ``lookup``, ``commit``,
``close``) for the joiner's unit tests, with fault injection the real twin does not offer: failing,
blocking until released, and recording every call. Results use the registry's CommitResult numbers."""
from __future__ import annotations

import enum
import threading

from photon import id_timestamp_us

from idregistry import CommitResult


FakeCommitResult = enum.IntEnum("FakeCommitResult", {r.name: int(r) for r in CommitResult})
"""The registry's own numbering, taken from ``idregistry.CommitResult`` so the fake cannot drift."""


class FakeRegistryDown(Exception):
    """What a failing fake raises (any exception must be handled like RegistryUnavailable)."""


class FakeRegistry:
    """Insert iff absent; present with the same token: OK; ids older than ``gc_boundary_us``: TOO_OLD."""

    def __init__(self, gc_boundary_us: int = 0) -> None:
        self.tokens: dict[str, str] = {}
        self.commits: list[tuple[list[str], str]] = []
        self.gc_boundary_us = gc_boundary_us
        self.fail_with: Exception | None = None
        self.gate: threading.Event | None = None  # when set to an unset Event, commit blocks until it is set
        self.waiting = 0
        self._lock = threading.Lock()

    def lookup(self, ids: list[str]) -> list[bool]:
        with self._lock:
            return [i in self.tokens for i in ids]

    def commit(self, ids: list[str], token: str) -> list[FakeCommitResult]:
        if self.gate is not None:
            with self._lock:
                self.waiting += 1
            self.gate.wait(30)
            with self._lock:
                self.waiting -= 1
        if self.fail_with is not None:
            raise self.fail_with
        out = []
        with self._lock:
            self.commits.append((list(ids), token))
            for i in ids:
                if id_timestamp_us(i) < self.gc_boundary_us:
                    out.append(FakeCommitResult.TOO_OLD)
                elif self.tokens.setdefault(i, token) == token:
                    out.append(FakeCommitResult.OK)
                else:
                    out.append(FakeCommitResult.ALREADY_EXISTS)
        return out

    def close(self) -> None:
        pass
