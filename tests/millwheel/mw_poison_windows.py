"""``examples.ad_windows`` with a windows computation that raises on one click, named by the environment
variable ``MW_POISON_CLICK`` (a click id): a module for ``millwheel run`` in the set-aside tests."""
from __future__ import annotations

import os

from millwheel import Topology
from millwheel.examples import ad_windows
from millwheel.examples.ad_windows import ClickWindows


class PoisonedWindows(ClickWindows):
    def process_record(self, ctx, record) -> None:
        super().process_record(ctx, record)      # changes the state first: a failed attempt must leave nothing
        if record.value["click_id"] == os.environ.get("MW_POISON_CLICK"):
            raise ValueError(f"poisoned click {record.value['click_id']}")


def build(input: str, out: str) -> Topology:
    return ad_windows.build(input, out, echo=False, windows=PoisonedWindows)
