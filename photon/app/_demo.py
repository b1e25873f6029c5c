"""``photon demo``'s regional outage drill: a region taken down (SIGKILL, all its processes and its registry
replicas) while the run is under way, and brought back once the other region has caught up alone."""
from __future__ import annotations

import threading
import time

import dispatcher
from photon import PhotonConfig, wait_until
from photon.app._regions import region_down, region_up

DEMO_REGISTRY_REGION = """
[[regions]]
name = "c"                  # hosts IdRegistry replicas only: with three regions each shard has 5 replicas
state_dir = "state/c"       # placed 2/2/1 over a, b, c, so any one region can be lost
registry_only = true
"""


class OutageDrill(threading.Thread):
    """Once ``victim``'s dispatcher has read its first clicks, take ``victim`` down hard; once every
    other pipeline region's dispatcher has caught up alone, bring it back. What happened is in
    :attr:`events` (``(seconds since start, text)``); a step that cannot happen within ``step_s`` is
    reported there and the drill ends (the run itself is never disturbed by the drill failing)."""

    def __init__(self, config: PhotonConfig, victim: str, echo, step_s: float = 300.0) -> None:
        super().__init__(name="outage-drill", daemon=True)
        self.config, self.victim, self.echo, self.step_s = config, victim, echo, step_s
        self.events: list[tuple[float, str]] = []
        self._t0 = time.monotonic()

    def _say(self, text: str) -> None:
        self.events.append((time.monotonic() - self._t0, text))
        self.echo(f"outage drill: {text}")

    def _status(self, region: str) -> dict:
        return dispatcher.read_status(self.config.region(region).state_dir) or {}

    def run(self) -> None:
        others = [r.name for r in self.config.pipeline_regions if r.name != self.victim]
        try:
            wait_until(lambda: self._status(self.victim).get("events_read", 0) > 0, self.step_s,
                       interval=0.05, message=f"region {self.victim} reading its clicks")
            region_down(self.config, self.victim, hard=True)
            self._say(f"region {self.victim} is down (every process SIGKILLed, its 2 registry replicas too); "
                      f"{', '.join(others)} go on alone")
            wait_until(lambda: all(self._status(r).get("caught_up") and not self._status(r).get("retry_queue")
                                   for r in others), self.step_s, interval=0.1,
                       message=f"{', '.join(others)} catching up alone")
            self._say(f"{', '.join(others)} caught up alone; bringing region {self.victim} back")
            region_up(self.config, self.victim)
            self._say(f"region {self.victim} is back and catches up (its dispatcher skips what the others "
                      f"joined through the registry lookup)")
        except Exception as e:            # the drill is a show: it never stops the run
            self._say(f"stopped: {e}")
