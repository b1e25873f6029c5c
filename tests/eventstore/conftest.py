"""Fixtures of the event store tests: a region config on temporary folders."""
from __future__ import annotations

from pathlib import Path

import pytest

from photon import parse_config


@pytest.fixture
def region_config(tmp_path):
    def make(**sections):
        data = {**sections, "regions": [{"name": "a", "log_root": str(tmp_path / "logs"),
                                         "output_root": str(tmp_path / "out"),
                                         "state_dir": str(tmp_path / "state")}]}
        return parse_config(data, "test.toml", tmp_path)
    return make


@pytest.fixture
def queries_dir(tmp_path) -> Path:
    d = tmp_path / "logs" / "queries"
    d.mkdir(parents=True)
    return d

