"""The joiner room exports what its docs promise (tests/core/test_rooms.py checks that rooms use only front doors)."""
from __future__ import annotations

import joiner


def test_front_door():
    assert set(joiner.__all__) >= {"Outcome", "JoinerClient", "JoinerUnavailable", "serve", "JoinerConfig"}
    assert [(o.name, int(o)) for o in joiner.Outcome] == [
        ("JOINED", 0), ("ALREADY_REGISTERED", 1), ("NOT_FOUND", 2), ("THROTTLED", 3), ("UNJOINABLE", 4), ("LOST", 5)]
