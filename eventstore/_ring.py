"""The consistent-hash ring that routes event ids to a region's cache servers (pure, no I/O).

Each of ``n`` servers owns ``vnodes`` points on a 32-bit ring at ``mmh3("<server>#<v>")``; an id belongs to
the first point at or after ``mmh3(id)`` (wrapping around). Growing the ring from ``n`` to ``n + 1`` servers
moves only the ids that the new server's points take over, about ``1/(n + 1)`` of them, and none between
old servers. Cache servers and clients build the same ring from ``[eventstore].cache_servers`` and
``ring_vnodes``, so a server holds exactly the ids its clients send it.
"""
from __future__ import annotations

import bisect

import mmh3


class HashRing:
    def __init__(self, servers: int, vnodes: int = 64) -> None:
        if servers <= 0 or vnodes <= 0:
            raise ValueError(f"a ring needs servers > 0 and vnodes > 0, got {servers}, {vnodes}")
        self.servers = servers
        self.vnodes = vnodes
        points = sorted((mmh3.hash(f"cache-{s}#{v}", signed=False), s)
                        for s in range(servers) for v in range(vnodes))
        self._points = [p for p, _ in points]
        self._owner = [s for _, s in points]

    def server_for(self, event_id: str) -> int:
        if self.servers == 1:
            return 0
        i = bisect.bisect_left(self._points, mmh3.hash(event_id, signed=False))
        return self._owner[i if i < len(self._points) else 0]

    def split(self, ids: list[str]) -> dict[int, list[int]]:
        """Positions of ``ids`` grouped by the server that owns them."""
        out: dict[int, list[int]] = {}
        if self.servers == 1:
            return {0: list(range(len(ids)))} if ids else {}
        for i, event_id in enumerate(ids):
            out.setdefault(self.server_for(event_id), []).append(i)
        return out
