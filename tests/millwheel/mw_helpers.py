"""Helpers for MillWheel tests: Photon-shaped joined output and the batch answer to compare with."""
from __future__ import annotations

import random
import threading
from collections import Counter
from pathlib import Path

import orjson

from millwheel._model import Delivery, Record
from millwheel._store import SQLiteStore, StoredProduction
from millwheel._transport import Transport
from photon import format_event_id, id_timestamp_us

WINDOW_US = 60_000_000
BASE_US = 1_763_712_000_000_000


def joined_event(click_ts: int, advertiser: str, n: int) -> dict:
    qid = format_event_id("10.0.0.5", 12, click_ts - 1_000_000)
    cid = format_event_id("10.0.0.7", 31 + n % 3, click_ts)
    return {"click_id": cid, "query_id": qid, "ad_id": f"ad-{n % 11}",
            "query": {"query_id": qid, "advertiser_id": advertiser, "text": f"query {n}"},
            "_photon": {"region": "a", "joiner": "a-j0", "joined_at_us": click_ts + 200_000}}


def write_joined(root: Path, n_clicks: int, n_files: int, advertisers: int = 20, minutes: int = 10,
                 seed: int = 7, bad_every: int = 0, names: list[str] | None = None) -> list[dict]:
    """Write ``n_clicks`` joined clicks over ``minutes`` minutes into ``n_files`` whole files under
    ``root/joined/<day>/``; clicks are in time order within a file, files overlap in time. Returns the
    events written (bad lines excluded). The advertiser of each click is drawn from ``names`` (uniformly,
    so a name listed twice gets twice the clicks) when given, else ``adv-<n>`` skewed over ``advertisers``."""
    rng = random.Random(seed)
    events = []
    for n in range(n_clicks):
        ts = BASE_US + rng.randrange(minutes * WINDOW_US)
        adv = rng.choice(names) if names else f"adv-{min(int(rng.expovariate(0.3)), advertisers - 1)}"
        events.append(joined_event(ts, adv, n))
    per_file: list[list[dict]] = [[] for _ in range(n_files)]
    for i, e in enumerate(events):
        per_file[i % n_files].append(e)
    out = root / "joined" / "2025-11-21"
    out.mkdir(parents=True, exist_ok=True)
    line_no = 0
    for f, evs in enumerate(per_file):
        evs.sort(key=lambda e: e["click_id"][-16:])
        lines = []
        for e in evs:
            line_no += 1
            if bad_every and line_no % bad_every == 0:
                lines.append(b"{not json")
            lines.append(orjson.dumps(e))
        (out / f"joined-a-j{f % 3}-{f:04d}.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    return events


def batch_windows(events: list[dict]) -> dict[tuple[str, int], int]:
    """What the windows must say: clicks per (advertiser, minute window by click id timestamp)."""
    c: Counter = Counter()
    for e in events:
        ts = id_timestamp_us(e["click_id"])
        c[(e["query"]["advertiser_id"], ts - ts % WINDOW_US)] += 1
    return dict(c)


def read_windows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line]


class SentTransport(Transport):
    """A transport that keeps what it is asked to send (and may lose it: nothing is delivered)."""
    may_lose = True

    def __init__(self) -> None:
        self.sent: list[Delivery] = []

    def send(self, deliveries):
        self.sent.extend(deliveries)


def production(n: int, consumers=("c",)):
    """A stored production ``p<n>`` of source ``src`` and its deliveries to ``consumers``, as the tracker
    registers them."""
    p = StoredProduction(f"p{n}", "s", f"k{n}", b"{}", 1000 + n, 1000 + n)
    return (p, 0, True, [Delivery(c, 0, Record(p.key, {}, p.timestamp_us, p.id, "s", "src", 1000 + n))
                         for c in consumers])


class GatedCommits(SQLiteStore):
    """Holds the first commit that writes key ``key`` of ``computation`` until ``release`` is set (``entered``
    says it is held)."""

    def __init__(self, path, computation: str, key: str):
        super().__init__(path)
        self.computation, self.key = computation, key
        self.entered, self.release = threading.Event(), threading.Event()

    def commit(self, writes):
        if not self.entered.is_set() and any(w.computation == self.computation and w.key == self.key
                                             for w in writes):
            self.entered.set()
            self.release.wait(30)
        return super().commit(writes)

