"""Which pipeline region holds the registry's leader, for :meth:`RegionShare.follow_leader`.

A thin shell around the pure share: a daemon thread asks the registry client every ``interval_s`` which
replica leads each shard (:meth:`idregistry.RegistryClient.leaders`: the near replicas answer, no wide-area
round trip) and maps the leaders' addresses to their regions by the config's replica placement. When every
shard's leader is in one region it tells the share that region, else None (the hash picks). A failed ask
leaves the last answer in place; the share only ever affects which region joins first, never whether a
click is joined once.
"""
from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)

LEADER_POLL_S = 1.0
"""How often the leaders' region is asked (a leader change is followed within about this long)."""


def leaders_region(leaders: dict[int, str], regions_by_address: dict[str, str]) -> str | None:
    """The one region every shard's leader is in, or None (unknown, or several)."""
    found = {regions_by_address.get(address) for address in leaders.values()}
    return found.pop() if len(found) == 1 and None not in found else None


class LeaderFollower:
    """``LeaderFollower(share, registry, regions_by_address).start()``; ``stop()`` ends it."""

    def __init__(self, share, registry, regions_by_address: dict[str, str], name: str,
                 interval_s: float = LEADER_POLL_S) -> None:
        self._share, self._registry, self._regions = share, registry, dict(regions_by_address)
        self._interval_s = interval_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{name}-leaders", daemon=True)

    def start(self) -> "LeaderFollower":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                self._share.follow_leader(leaders_region(self._registry.leaders(), self._regions))
            except Exception as e:  # noqa: BLE001  (registry unreachable: keep the last answer)
                log.debug("asking the registry for its leaders failed: %s", e)
            self._stopped.wait(self._interval_s)      # the polling period, not a wait for a condition


def follow_leaders(config, share, registry, region: str) -> LeaderFollower | None:
    """A started :class:`LeaderFollower` for ``region``'s dispatcher, or None when there is no share, no
    registry client or no replica placement to read (then the hash picks every owner)."""
    if share is None or registry is None or not hasattr(registry, "leaders"):
        return None
    try:
        from idregistry import replica_places
        by_address = {p.grpc_address: p.region for p in replica_places(config)}
    except Exception as e:  # noqa: BLE001  (no layout readable here: the hash picks)
        log.info("dispatcher %s: registry replica placement unknown (%s); owners by hash only", region, e)
        return None
    return LeaderFollower(share, registry, by_address, f"dispatcher-{region}").start()
