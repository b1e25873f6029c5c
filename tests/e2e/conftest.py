"""A whole local pipeline as a user runs it: ``photon gen`` output, ``photon run`` as a process, and an
invariant check of the output after every test."""
from __future__ import annotations

import json
import os
import signal
import subprocess
from collections import Counter
from pathlib import Path

import orjson
import pytest

from photon import load_config, local_folder, read_object_lines, read_output_lines, wait_until


class Pipeline:
    """``photon run`` for one config, started in its own session and stopped by pid."""

    def __init__(self, procs, config_path: Path) -> None:
        self.procs = procs
        self.config_path = Path(config_path)
        self.config = load_config(config_path)
        self.proc = None

    def start(self, *extra: str):
        self.log = open(self.config_path.parent / "launcher.log", "ab")
        self.proc = self.procs.python("-m", "photon.app.cli", "run", "--config", str(self.config_path), *extra,
                                      stdout=self.log, stderr=subprocess.STDOUT)
        return self

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout=timeout)
        self.log.close()
        return code

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        code = self.proc.wait(timeout=60)
        self.log.close()
        return code

    def processes(self) -> dict:
        path = Path(self.config.regions[0].state_dir) / "launcher.json"
        try:
            return json.loads(path.read_text())["processes"]
        except (OSError, ValueError):
            return {}

    def pid(self, name: str) -> int | None:
        return self.processes().get(name, {}).get("pid")

    def wait_for_process(self, name: str, timeout: float = 60) -> int:
        wait_until(lambda: self.pid(name), timeout, message=f"process {name} started")
        return self.pid(name)

    def dispatcher_status(self, region: str = "a") -> dict:
        from dispatcher import read_status
        return read_status(self.config.region(region).state_dir) or {}

    def joined(self, include_inprogress: bool = False) -> list[dict]:
        """Joined rows of every region. With ``include_inprogress``, files still being written count too;
        a file renamed while we read is read once, under whichever name it has."""
        rows = []
        for region in self.config.regions:
            if local_folder(region.output_url("joined")) is None:   # objects: published ones, plus staged if asked
                rows += [orjson.loads(x) for x in read_object_lines(region.output_url("joined"), self.config.s3)]
                if not include_inprogress:
                    continue
            rows += [orjson.loads(line) for line in read_output_lines(region.joined_dir, include_inprogress)]
        return rows

    def joined_ids(self, include_inprogress: bool = False) -> Counter:
        return Counter(r[self.config.join.foreign_id_field] for r in self.joined(include_inprogress))

    def exit_code_after_kills(self, loss_window) -> int:
        """The exit code a stopped run must have after kills: 5 when a killed joiner's lost-ids ledger (its
        restart sets aside the lines it wrote beyond its commit record) holds clicks no output has, which must
        all be in ``loss_window`` (clicks registered under a killed joiner's token); 0 otherwise."""
        import joiner
        ledger = {e["id"] for r in self.config.pipeline_regions for e in joiner.read_lost(r.state_dir)}
        lost = ledger - set(self.joined_ids())
        assert lost <= set(loss_window), f"ledger clicks outside the loss window: {sorted(lost - set(loss_window))[:5]}"
        return 5 if lost else 0

    def quarantined(self) -> list[dict]:
        out = []
        for region in self.config.regions:
            for p in region.quarantine_dir.glob("*.jsonl"):
                out += [orjson.loads(x) for x in p.read_bytes().splitlines() if x]
        return out

    def output_text(self) -> str:
        return (self.config_path.parent / "launcher.log").read_text(errors="replace")


def _truth(root: Path, name: str) -> set[str]:
    return set((root / "truth" / f"{name}.txt").read_text().split())


def assert_no_duplicates(pipeline: Pipeline) -> None:
    dups = {k: v for k, v in pipeline.joined_ids(include_inprogress=True).items() if v > 1}
    assert dups == {}, f"clicks joined more than once: {list(dups.items())[:10]}"


@pytest.fixture
def pipeline(procs):
    made: list[Pipeline] = []

    def make(config_path) -> Pipeline:
        p = Pipeline(procs, config_path)
        made.append(p)
        return p

    yield make
    for p in made:           # the invariant holds after every end-to-end test, whatever it did
        if p.proc is not None:
            p.stop()
        assert_no_duplicates(p)


@pytest.fixture
def truth():
    """``truth(root, "joinable" | "unjoinable")``: the click ids ``photon gen`` expects."""
    return _truth
