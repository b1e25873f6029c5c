"""``photon run``'s periodic jobs: a ``photon`` subcommand started as a child process every ``every_s``
seconds, never two at once (``photon compact`` with ``--compact``; ``photon registry clear-tokens`` every
``[registry].clear_tokens_every_s``). The launcher calls :meth:`PeriodicChild.poll` from its loop and
:meth:`PeriodicChild.stop` at the end. A child's output goes to its log file (no pipe to fill); a job that
cannot start (a full state disk, say) is tried again at its next turn and never stops the run."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path


class PeriodicChild:
    """``python -m photon.app.cli <args>`` every ``every_s`` seconds. :meth:`finished` sees each run's
    exit status and what it printed (by default a failure is echoed, naming the log). At :meth:`stop` a
    running child is given ``stop_patience_s`` to finish, then SIGTERM, then SIGKILL."""

    def __init__(self, name: str, args: list[str], every_s: float, env: dict, log_path: Path, echo,
                 stop_patience_s: float = 0.0) -> None:
        self.name, self.args, self.every_s, self.env, self.echo = name, list(args), every_s, env, echo
        self.log_path = Path(log_path)
        self.stop_patience_s = stop_patience_s
        self.next_at = time.monotonic() + every_s
        self.proc: subprocess.Popen | None = None
        self.runs = 0
        self._log_from = 0

    def poll(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            self._reap()
        if self.proc is None and time.monotonic() >= self.next_at:
            self.next_at = time.monotonic() + self.every_s
            try:
                self.log_path.parent.mkdir(parents=True, exist_ok=True)
                with open(self.log_path, "ab") as log:
                    self._log_from = log.tell()
                    self.proc = subprocess.Popen([sys.executable, "-m", "photon.app.cli", *self.args],
                                                 stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                                 start_new_session=True)
            except OSError as e:
                self.echo(f"{self.name} could not start: {e}; trying again in {self.every_s:g} s")
                return
            self.runs += 1

    def finished(self, code: int, output: str) -> None:
        if code != 0:
            last = output.strip().splitlines()[-1] if output.strip() else "no output"
            self.echo(f"{self.name} exited {code}: {last} (see {self.log_path})")

    def _reap(self) -> None:
        code, self.proc = self.proc.returncode, None
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_from)
                output = log.read().decode(errors="replace")
        except OSError:
            output = ""
        self.finished(code, output)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.stop_patience_s:
            try:
                self.proc.wait(timeout=self.stop_patience_s)
            except subprocess.TimeoutExpired:
                pass
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._reap()
