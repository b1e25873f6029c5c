"""The event store room exports what its docs promise (tests/core/test_rooms.py checks that rooms use only front doors)."""
from __future__ import annotations

import eventstore


def test_front_door():
    assert set(eventstore.__all__) >= {"EventStoreClient", "InMemoryEventStore", "EventStoreUnavailable", "serve",
                                       "EventStoreConfig"}
