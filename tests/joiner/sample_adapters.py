"""User adapters for the joiner tests, loaded by ``[joiner].adapter = "sample_adapters:<name>"``."""
from __future__ import annotations


def flat(foreign: dict, primary: dict) -> dict | None:
    """Copies the query text to the top level; refuses clicks flagged as fraud."""
    if foreign.get("fraud"):
        return None
    if foreign.get("explode"):
        raise RuntimeError("adapter bug")
    return {**foreign, "query_text": primary["q"]}


def not_a_dict(foreign: dict, primary: dict):
    return [foreign, primary]


NOT_CALLABLE = 42
