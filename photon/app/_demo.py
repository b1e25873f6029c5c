"""``photon demo``'s regional outage drill, run beside the launcher in its process.

1. Once region ``b`` has read its first clicks, it is taken down hard: every process of it, its two
   registry replicas included, SIGKILLed at once (what ``photon region down b --hard`` does). Joins that
   ``b``'s joiners had committed but not yet written are in the loss window (registered, not written).
2. Once every other region caught up alone, ``b`` comes back and catches up (its dispatcher skips, through
   the registry lookup, what the others joined).
3. ``photon verify`` (Spark, in this process) finds the clicks lost in the window and ``photon recover``
   deletes them from the registry (token still matching, joiner dead) and re-injects them; the pipeline
   joins them again.
4. Once every region has caught up again, the drill stops the run.
"""
from __future__ import annotations

import json
import signal
import threading
import time

import dispatcher
from photon import PhotonConfig, wait_until
from photon.app._launcher import CatchUpWatch, launcher_state_file
from photon.app._recover import run_recover
from photon.app._regions import region_down, region_up
from photon.app._spark import spark_session
from photon.app._verify import run_verify

DEMO_REGISTRY_REGION = """
[[regions]]
name = "c"                  # hosts IdRegistry replicas only: with three regions each shard has 5 replicas
state_dir = "state/c"       # placed 2/2/1 over a, b, c, so any one region can be lost
registry_only = true
"""


class OutageDrill(threading.Thread):
    """The drill of the module docstring. What happened is in :attr:`events` (``(seconds, text)``) and
    :attr:`figures`; a step that does not happen within ``step_s`` ends the drill (and the run) with the
    reason in :attr:`events`."""

    def __init__(self, config: PhotonConfig, victim: str, echo, step_s: float = 300.0) -> None:
        super().__init__(name="outage-drill", daemon=True)
        self.config, self.victim, self.echo, self.step_s = config, victim, echo, step_s
        self.events: list[tuple[float, str]] = []
        self.figures: dict = {}
        self._t0 = time.monotonic()
        self._opts = None

    def start_with(self, run_options) -> None:
        """Start, stopping the run through ``run_options.stop_requested`` when done."""
        self._opts = run_options
        self.start()

    def _say(self, text: str) -> None:
        self.events.append((time.monotonic() - self._t0, text))
        self.echo(f"outage drill: {text}")

    def _status(self, region: str) -> dict:
        return dispatcher.read_status(self.config.region(region).state_dir) or {}

    def _pid(self, name: str):
        """The pid the launcher runs process ``name`` under now (from its ``launcher.json``)."""
        try:
            return json.loads(launcher_state_file(self.config).read_text())["processes"][name]["pid"]
        except (OSError, ValueError, KeyError):
            return None

    def _wait_caught_up(self, regions, what: str) -> None:
        """Until every region's running dispatcher has caught up (twice, from scans started from now on)."""
        watch = CatchUpWatch(self.config, regions)
        wait_until(lambda: watch.caught_up(self._pid), self.step_s, interval=0.1, message=what)

    def run(self) -> None:
        regions = [r.name for r in self.config.pipeline_regions]
        others = [r for r in regions if r != self.victim]
        try:
            wait_until(lambda: self._status(self.victim).get("events_read", 0) > 0, self.step_s,
                       interval=0.05, message=f"region {self.victim} reading its clicks")
            region_down(self.config, self.victim, hard=True)
            self._say(f"region {self.victim} is down (every process SIGKILLed, its 2 registry replicas too); "
                      f"{', '.join(others)} go on alone")
            self._wait_caught_up(others, f"{', '.join(others)} catching up alone")
            self._say(f"{', '.join(others)} caught up alone; bringing region {self.victim} back")
            region_up(self.config, self.victim)
            self._wait_caught_up(regions, f"region {self.victim} catching up")
            self._say(f"region {self.victim} is back and caught up; running photon verify")
            self._verify_and_recover(regions)
        except Exception as e:            # the drill never leaves the run hanging
            self._say(f"stopped: {type(e).__name__}: {e}")
        finally:
            if self._opts is not None:
                self._opts.stop_requested.append(signal.SIGTERM)

    def _verify_and_recover(self, regions) -> None:
        spark = spark_session(self.config, "photon-demo")
        report = run_verify(self.config, spark)
        self.figures["verify_before"] = report.as_dict()
        self._say(f"verify: {report.lost} lost in the loss window (registered by a killed joiner, not "
                  f"written), {report.recoverable} recoverable, {report.duplicates} duplicates")
        if report.recoverable:
            done = run_recover(self.config, report.recoverable_path)
            self._say(f"recover: {done.deleted} deleted from the registry (token unchanged, joiner dead) and "
                      f"re-injected into every region's recovery stream")
            self._wait_caught_up(regions, "the recovered clicks being joined")
        report = run_verify(self.config, spark)
        self.figures["verify_after"] = report.as_dict()
        self._say(f"verify again: {report.lost} lost, {report.duplicates} duplicates, "
                  f"{report.joined} joined of {report.foreign_events} clicks")
