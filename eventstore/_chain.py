"""The lookup chain a joiner uses: the region's cache servers (routed by the ring), then its logs stores.

:class:`EventStoreChain` answers ``lookup(ids)`` like one store: each id goes to the cache server the
:class:`HashRing` gives it (all servers asked at once); the ids no cache server held go to a logs store
(chosen by the same kind of ring over the logs stores). After a lookup, on the calling thread,
:attr:`served_by` names for each id who answered (``"cache"``, ``"logs"`` or None) and
:attr:`read_through_us` is the earliest ``read_through_us`` among the stores asked (None if none reported
one), so a joiner defers NOT_FOUND while any store that could have held the id is catching up, and
:attr:`read_to_us` how far the cache servers have read each id key while one of them catches up (see
:meth:`EventStoreChain.lookup`). ``lookup([])`` asks every cache server for these positions alone.
A store that fails raises :class:`EventStoreUnavailable` for the whole lookup (the joiner answers THROTTLED).
"""
from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass

from eventstore._client import EventStoreClient, EventStoreUnavailable
from eventstore._ring import HashRing

SERVED_BY_CACHE = "cache"
SERVED_BY_LOGS = "logs"


@dataclass(frozen=True, slots=True)
class ChainStatistics:
    lookups: int
    ids: int
    served_by_cache: int
    served_by_logs: int
    not_found: int


def _started(asks: list[tuple[EventStoreClient, list[str]]]) -> list[tuple[EventStoreClient, object]]:
    """Each ``(client, ids)`` lookup started, as ``(client, wait)``: every one but the last as a future (all
    stores asked at once), the last (with one server, the only one) as a blocking call made here, once the
    others are on their way, so its answer needs no other thread to take it and wake this one. ``wait()``
    returns ``(raws, read_through_us)`` and sets the client's ``read_to_us`` on this thread, as
    :meth:`EventStoreClient.lookup_future`'s does; a failure raises from the call or from its ``wait``."""
    if not asks:
        return []
    out = [(client, client.lookup_future(ids)) for client, ids in asks[:-1]]
    client, ids = asks[-1]
    answer = client.lookup_now(ids)
    out.append((client, lambda: answer))
    return out


class EventStoreChain:
    """See module docstring. ``cache`` and ``logs`` are addresses (``host:port``); ``vnodes`` must be the
    servers' ``[eventstore].ring_vnodes``. Thread-safe."""

    def __init__(self, cache: list[str], logs: list[str] = (), vnodes: int = 64, timeout: float = 10.0) -> None:
        if not cache:
            raise ValueError("an event store chain needs at least one cache server")
        self.caches = [EventStoreClient(a, timeout) for a in cache]
        self.logs = [EventStoreClient(a, timeout) for a in logs]
        self._ring = HashRing(len(self.caches), vnodes)
        self._logs_ring = HashRing(len(self.logs), vnodes) if self.logs else None
        self._last = threading.local()
        self._lock = threading.Lock()
        self._c = dict(lookups=0, ids=0, served_by_cache=0, served_by_logs=0, not_found=0)

    @property
    def read_through_us(self) -> int | None:
        return getattr(self._last, "read_through_us", None)

    @property
    def read_to_us(self) -> dict[str, int] | None:
        """From this thread's latest :meth:`lookup`: while some cache server was catching up, per id key the
        position every cache server has read past (the least over them; a caught-up server counts as having
        read every key up to its ``read_through_us``); None when every cache server had caught up. A primary
        id of key K and time t > ``read_to_us.get(K, read_through_us)`` is not held by every cache server yet."""
        return getattr(self._last, "read_to_us", None)

    @property
    def served_by(self) -> list[str | None] | None:
        return getattr(self._last, "served_by", None)

    def lookup(self, ids: list[str]) -> list[bytes | None]:
        self._last.served_by = []
        self._last.read_through_us = None
        self._last.read_to_us = None
        if not ids:
            self._probe()
            return []
        out: list[bytes | None] = [None] * len(ids)
        served: list[str | None] = [None] * len(ids)
        throughs: list[int] = []
        positions: list = []
        self._ask(self.caches, self._ring, ids, list(range(len(ids))), out, served, SERVED_BY_CACHE, throughs,
                  positions)
        missed = [i for i, r in enumerate(out) if r is None]
        if missed and self.logs:
            self._ask(self.logs, self._logs_ring, [ids[i] for i in missed], missed, out, served, SERVED_BY_LOGS,
                      throughs)
        self._last.served_by = served
        self._last.read_through_us = min(throughs) if throughs else None
        self._last.read_to_us = _least_read_to(positions)
        from_cache = served.count(SERVED_BY_CACHE)
        from_logs = served.count(SERVED_BY_LOGS)
        with self._lock:
            c = self._c
            c["lookups"] += 1
            c["ids"] += len(ids)
            c["served_by_cache"] += from_cache
            c["served_by_logs"] += from_logs
            c["not_found"] += len(ids) - from_cache - from_logs
        return out

    def _probe(self) -> None:
        """Every cache server's read positions, with no ids looked up (a joiner's answer to a dispatcher's
        probe while it holds clicks back for the store)."""
        throughs, positions = [], []
        for client, wait in _started([(c, []) for c in self.caches]):
            _, through = wait()
            if through is not None:
                throughs.append(through)
            positions.append((client.read_to_us, through))
        self._last.read_through_us = min(throughs) if throughs else None
        self._last.read_to_us = _least_read_to(positions)

    @staticmethod
    def _ask(clients, ring, ids, positions, out, served, name, throughs, read_to=None) -> None:
        groups = [(idx, clients[server]) for server, idx in ring.split(ids).items()]
        asked = _started([(client, [ids[i] for i in idx]) for idx, client in groups])
        for (idx, _), (client, wait) in zip(groups, asked):
            raws, through = wait()
            if through is not None:
                throughs.append(through)
            if read_to is not None:
                read_to.append((client.read_to_us, through))
            for i, raw in zip(idx, raws):
                if raw is not None:
                    out[positions[i]] = raw
                    served[positions[i]] = name

    def statistics(self) -> ChainStatistics:
        with self._lock:
            return ChainStatistics(**self._c)

    def status(self) -> dict:
        """Every store's status: ``{"cache": [...], "logs": [...]}``."""
        return {"cache": [c.status() for c in self.caches], "logs": [c.status() for c in self.logs],
                "chain": dataclasses.asdict(self.statistics())}

    def close(self) -> None:
        for c in self.caches + self.logs:
            c.close()


def _least_read_to(positions: list) -> dict[str, int] | None:
    """Per id key, the least position over the cache servers asked (each ``(read_to_us | None,
    read_through_us | None)``); None when none of them is catching up. A server's position for a key is its
    ``read_to_us`` of the key or its ``read_through_us``, whichever is later (a key it has not met: its
    ``read_through_us``)."""
    if all(r is None for r, _ in positions):
        return None
    keys = set()
    for r, _ in positions:
        if r:
            keys.update(r)
    out = {}
    for key in keys:
        out[key] = min(max((r or {}).get(key, 0), t or 0) for r, t in positions)
    return out


def connect(cache: str | list[str], logs: str | list[str] = (), vnodes: int = 64) -> EventStoreChain:
    """A chain from addresses (lists, or comma-separated strings)."""
    split = lambda a: [x.strip() for x in a.split(",") if x.strip()] if isinstance(a, str) else list(a)
    return EventStoreChain(split(cache), split(logs), vnodes)


__all__ = ["EventStoreChain", "EventStoreUnavailable", "connect"]
