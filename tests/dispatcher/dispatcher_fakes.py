"""FAKES of other rooms' front doors, for dispatcher tests only.

``FakeJoinService`` stands in for the joiners plus the registry's commit: it joins a click iff its query is
known and its id has not been joined before (first JOINED, later ALREADY_REGISTERED), and records every id it
ever answered JOINED, so a test can check that no click was joined twice. ``FakeJoinerClient`` has the
interface of ``joiner.JoinerClient``; ``FakeRegistry`` the interface of an ``idregistry.connect`` client.
"""
from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor

from photon import Outcome

OUT_JOINED, OUT_ALREADY, OUT_NOT_FOUND, OUT_THROTTLED, OUT_UNJOINABLE = (
    Outcome.JOINED, Outcome.ALREADY_REGISTERED, Outcome.NOT_FOUND, Outcome.THROTTLED, Outcome.UNJOINABLE)


class FakeJoinerUnavailable(Exception):
    """FAKE of ``joiner.JoinerUnavailable``."""


class FakeJoinService:
    """FAKE: the joiner side of the pipeline, shared by every FakeJoinerClient of a test."""

    def __init__(self, queries=(), *, workers: int = 4) -> None:
        self.queries = set(queries)
        self.joined: Counter = Counter()     # id -> times answered JOINED (must never exceed 1)
        self.requests = 0
        self.request_sizes: list[int] = []
        self.max_concurrent = 0
        self.unavailable = False             # every request fails while set
        self.throttle_next = 0               # the next n requests are answered all THROTTLED
        self.hold = threading.Event()        # cleared: requests wait (to observe in-flight state)
        self.hold.set()
        self._concurrent = 0
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fake-joiner")

    def add_queries(self, ids) -> None:
        with self._lock:
            self.queries.update(ids)

    def is_joined(self, cid: str) -> bool:
        with self._lock:
            return cid in self.joined

    def join(self, ids, ref_ids, raws) -> list[int]:
        with self._lock:
            self.requests += 1
            self.request_sizes.append(len(ids))
            self._concurrent += 1
            self.max_concurrent = max(self.max_concurrent, self._concurrent)
        try:
            self.hold.wait(30)
            with self._lock:
                if self.unavailable:
                    raise FakeJoinerUnavailable("fake joiner is down")
                if self.throttle_next > 0:
                    self.throttle_next -= 1
                    return [OUT_THROTTLED] * len(ids)
                out = []
                for cid, ref in zip(ids, ref_ids):
                    if cid in self.joined:
                        out.append(OUT_ALREADY)
                    elif ref in self.queries:
                        self.joined[cid] += 1
                        out.append(OUT_JOINED)
                    else:
                        out.append(OUT_NOT_FOUND)
                return out
        finally:
            with self._lock:
                self._concurrent -= 1

    def close(self) -> None:
        self.hold.set()
        self._pool.shutdown(wait=True)


class FakeJoinerClient:
    """FAKE of ``joiner.JoinerClient(address)``: same methods, answered by a FakeJoinService."""

    def __init__(self, address: str, service: FakeJoinService) -> None:
        self.address = address
        self.service = service
        self.closed = False

    def join(self, ids, ref_ids, raws, timeout: float = 30.0):
        return self.service.join(ids, ref_ids, raws)

    def join_future(self, ids, ref_ids, raws, timeout: float = 30.0) -> Future:
        return self.service._pool.submit(self.service.join, list(ids), list(ref_ids), list(raws))

    def close(self) -> None:
        self.closed = True


class FakeRegistry:
    """FAKE of an ``idregistry.connect(...)`` client: ``lookup`` answers from the join service's record."""

    def __init__(self, service: FakeJoinService) -> None:
        self.service = service
        self.lookups = 0
        self.failing = False
        self.answering = threading.Event()   # cleared: lookups hang until it is set again
        self.answering.set()

    def lookup(self, ids):
        self.lookups += 1
        self.answering.wait(30)
        if self.failing:
            raise ConnectionError("fake registry unavailable")
        return [self.service.is_joined(i) for i in ids]

    def close(self) -> None:
        self.answering.set()
