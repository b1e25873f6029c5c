"""Fixtures of the joiner tests: a real event store and a real joiner gRPC server in this process."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

import eventstore
import joiner
from photon import wait_until

from joiner_helpers import make_config


@dataclass
class Stack:
    root: Path
    config: object
    store: eventstore.EventStoreServer
    server: joiner.JoinerServer
    client: joiner.JoinerClient

    @property
    def joined_dir(self) -> Path:
        return self.root / "out" / "joined"

    def wait_queries(self, n: int) -> None:
        wait_until(lambda: self.store.statistics().events_indexed >= n, 10, message=f"{n} queries indexed")


@pytest.fixture
def stack(tmp_path):
    """``stack(registry, eventstore_address=None, **joiner_options) -> Stack``; all stopped at teardown."""
    started: list[Stack] = []

    def start(registry, eventstore_address: str | None = None, **joiner_options) -> Stack:
        config = make_config(tmp_path, joiner={"roll_interval_s": 0.2, **joiner_options})
        store = eventstore.serve(config, "a")
        try:
            server = joiner.serve(config, "a", "a-j0", eventstore=eventstore_address or store.address,
                                  registry=registry)
        except BaseException:
            store.stop()
            raise
        s = Stack(tmp_path, config, store, server, joiner.JoinerClient(server.address))
        started.append(s)
        return s

    try:
        yield start
    finally:
        for s in started:
            s.client.close()
            s.server.stop()
            s.store.stop()
