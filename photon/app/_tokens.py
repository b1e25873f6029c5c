"""``photon run``'s periodic token clearing: ``photon registry clear-tokens`` as a child process every
``[registry].clear_tokens_every_s`` seconds (0: never), for the regions this launcher runs.

Clearing is safe at any moment: only ids found in *published* joined output lose their token (such an id is
never lost, so recovery never needs to delete it), and each output file is gone through once (see
:func:`idregistry.clear_output_tokens`). Never two runs at once; each run's summary line (tokens cleared,
bytes the registry saved) is echoed as progress, and the launcher's stop echoes the totals.
"""
from __future__ import annotations

import re
from pathlib import Path

from photon import PhotonConfig
from photon.app._periodic import PeriodicChild

STOP_PATIENCE_S = 10.0
SUMMARY = re.compile(r"^cleared (\d+) tokens .*?(\d+) bytes saved$")


class PeriodicTokenClearing(PeriodicChild):
    """``regions``: the launcher's pipeline regions (None: all)."""

    def __init__(self, config: PhotonConfig, env: dict, log_dir: Path, echo, regions=None) -> None:
        args = ["registry", "clear-tokens", "--config", config.path]
        if regions:
            args += ["--regions", ",".join(regions)]
        super().__init__("clear-tokens", args, config.registry.clear_tokens_every_s, env,
                         Path(log_dir) / "clear-tokens.log", echo, stop_patience_s=STOP_PATIENCE_S)
        self.cleared = 0
        self.bytes_saved = 0

    def finished(self, code: int, output: str) -> None:
        last = output.strip().splitlines()[-1] if output.strip() else ""
        m = SUMMARY.match(last)
        if m:                                   # printed once the clearing is done, whatever came after
            self.cleared += int(m.group(1))
            self.bytes_saved = int(m.group(2))
            self.echo(f"clear-tokens: {last}")
        else:
            super().finished(code, output)

    def stop(self) -> None:
        super().stop()
        if self.runs:
            self.echo(f"clear-tokens ran {self.runs} time(s): {self.cleared} tokens cleared; the registry saves "
                      f"{self.bytes_saved} bytes")
