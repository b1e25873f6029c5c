"""The in-process twin of :class:`~idregistry.RegistryClient`: same methods, same answers, one
:class:`~idregistry._state.ShardState` behind a lock and no network. For other rooms' unit tests."""
from __future__ import annotations

import os
import threading

from photon import BadEventId, SystemClock
from idregistry._state import (OP_ADVANCE_GC, OP_CLEAR_TOKENS, OP_COMMIT_RUNS, OP_DELETE, CommitResult, ShardState,
                               pack_ids, validate_ids)


class InMemoryRegistry:
    """A single-shard registry held in this process. ``advance_gc(boundary_us)`` stands in for the
    leader's garbage collection."""

    def __init__(self, clock=None) -> None:
        self._clock = clock or SystemClock()      # the registration time of new tokens
        self._state = ShardState()
        self._lock = threading.Lock()

    def _apply(self, op):
        with self._lock:
            return self._state.apply([op])[0]

    @staticmethod
    def _check(ids) -> None:
        try:
            validate_ids(ids)
        except BadEventId as e:
            raise ValueError(str(e)) from None

    def lookup(self, ids: list[str]) -> list[bool]:
        self._check(ids)
        with self._lock:
            return self._state.lookup(ids)

    def commit(self, ids: list[str], token: str) -> list[CommitResult]:
        self._check(ids)
        return [CommitResult(c) for c in self._apply((OP_COMMIT_RUNS, token, pack_ids(ids), self._clock.now_us()))]

    def clear_tokens(self, ids: list[str]) -> int:
        self._check(ids)
        return self._apply((OP_CLEAR_TOKENS, list(ids)))

    def delete(self, event_id: str, expected_token: str) -> bool:
        self._check([event_id])
        return self._apply((OP_DELETE, event_id, expected_token))

    def export(self, shard: int = 0):
        return (row[:3] for row in self.export_rows(shard))

    def export_rows(self, shard: int = 0):
        if shard != 0:
            raise ValueError(f"InMemoryRegistry has one shard (0), not {shard}")
        with self._lock:
            snapshot = self._state.snapshot()
        return snapshot.rows()

    def shards(self) -> list[int]:
        return [0]

    def advance_gc(self, boundary_us: int) -> int:
        return self._apply((OP_ADVANCE_GC, boundary_us))

    def status(self) -> list[dict]:
        with self._lock:
            s = self._state
            return [{"shard": 0, "replica": 0, "address": "memory://", "pid": os.getpid(), "is_leader": True,
                     "term": 0, "commit_index": 0, "ids_held": s.ids_held, "gc_boundary_us": s.gc_boundary_us,
                     "bytes_held": s.approx_bytes(), "tokens_dropped_ids": s.token_bytes_saved()[0],
                     "bytes_saved_by_clearing": s.token_bytes_saved()[1]}]

    def statistics(self):
        from idregistry._client import ClientStatistics, RegistryStatistics, ShardStatistics
        with self._lock:
            s = self._state
            saved = s.token_bytes_saved()
            shard = ShardStatistics(shard=0, leader="memory://", replicas_up=1, ids_held=s.ids_held,
                                    bytes_held=s.approx_bytes(), gc_boundary_us=s.gc_boundary_us,
                                    tokens_dropped_ids=saved[0], bytes_saved_by_clearing=saved[1])
        return RegistryStatistics(shards=(shard,), client=ClientStatistics(0, 0, 0, 0, 0, 0, 0, 1))

    def close(self) -> None:
        """Does not drop the ids: ``connect("memory://")`` hands every caller the same registry."""

    def __enter__(self) -> "InMemoryRegistry":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_shared: InMemoryRegistry | None = None
_shared_lock = threading.Lock()


def shared_memory_registry() -> InMemoryRegistry:
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = InMemoryRegistry()
        return _shared
