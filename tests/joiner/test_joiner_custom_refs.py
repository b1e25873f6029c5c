"""The joiner's core with custom primary ids: a ref that is not a Photon id is taken only when the config
says primary ids are custom (``[join].primary_time_field``); clicks arrive under their Photon keys."""
from __future__ import annotations

import pytest

from joiner._state import JoinBatch
from photon import JoinConfig, Outcome, custom_key

T0 = 1_763_712_000_000_000
JOIN = JoinConfig(primary_time_field="qt", primary_time_format="rfc3339")


@pytest.mark.timeout(10)
def test_the_joiner_takes_custom_refs_only_when_told_to():
    key = custom_key("c-1", T0)
    default = JoinBatch([key], ["q-1"], [b"{}"])
    assert default.bad_ids == 1 and default.outcomes()[0] == Outcome.UNJOINABLE
    custom = JoinBatch([key], ["q-1"], [b"{}"], ref_ok=lambda ref: JOIN.primary_ids.ref_problem(ref) is None)
    assert custom.bad_ids == 0 and custom.ref_ids_to_look_up() == ["q-1"]
