"""``photon run``'s periodic token clearing: ``photon registry clear-tokens`` as a child process every
``[registry].clear_tokens_every_s`` seconds (0: never), for the regions this launcher runs.

Clearing is safe at any moment: only ids found in *published* joined output lose their token (such an id is
never lost, so recovery never needs to delete it), and each output file is gone through once (see
:func:`idregistry.clear_output_tokens`). Never two runs at once; each run's summary line (tokens cleared,
bytes the registry saved) is echoed as progress, and the launcher's stop echoes the totals.
"""
from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

from photon import PhotonConfig

STOP_PATIENCE_S = 10.0
SUMMARY = re.compile(r"^cleared (\d+) tokens .*?(\d+) bytes saved$")


class PeriodicTokenClearing:
    """:meth:`poll` from the launcher's loop; :meth:`stop` at the end. ``regions``: the launcher's
    pipeline regions (None: all)."""

    def __init__(self, config: PhotonConfig, env: dict, log_dir: Path, echo, regions=None) -> None:
        self.config, self.env, self.echo = config, env, echo
        self.every_s = config.registry.clear_tokens_every_s
        self.regions = regions
        self.log_path = Path(log_dir) / "clear-tokens.log"
        self.next_at = time.monotonic() + self.every_s
        self.proc: subprocess.Popen | None = None
        self._log_from = 0
        self.runs = 0
        self.cleared = 0
        self.bytes_saved = 0

    def poll(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            self._finished()
        if self.proc is None and time.monotonic() >= self.next_at:
            argv = [sys.executable, "-m", "photon.app.cli", "registry", "clear-tokens", "--config", self.config.path]
            if self.regions:
                argv += ["--regions", ",".join(self.regions)]
            self.next_at = time.monotonic() + self.every_s
            try:
                self.log_path.parent.mkdir(parents=True, exist_ok=True)
                with open(self.log_path, "ab") as log:
                    self._log_from = log.tell()
                    self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                                 start_new_session=True)
            except OSError as e:                # e.g. the state disk is full: try again next time
                self.echo(f"clear-tokens could not start: {e}")
                return
            self.runs += 1

    def _finished(self) -> None:
        code = self.proc.returncode
        self.proc = None
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_from)
                out = log.read().decode(errors="replace")
        except OSError:
            out = ""
        last = out.strip().splitlines()[-1] if out.strip() else ""
        m = SUMMARY.match(last)
        if m:                                   # printed once the clearing is done, whatever came after
            self.cleared += int(m.group(1))
            self.bytes_saved = int(m.group(2))
            self.echo(f"clear-tokens: {last}")
        elif code != 0:
            self.echo(f"clear-tokens exited {code}: {last or 'no output'} (see {self.log_path})")

    def stop(self) -> None:
        if self.proc is not None:
            try:
                self.proc.wait(timeout=STOP_PATIENCE_S)   # a clearing pass is short: let it finish
            except subprocess.TimeoutExpired:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=10)
            self._finished()
        if self.runs:
            self.echo(f"clear-tokens ran {self.runs} time(s): {self.cleared} tokens cleared; the registry saves "
                      f"{self.bytes_saved} bytes")
