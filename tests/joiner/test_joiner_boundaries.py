"""The joiner room uses other rooms only through their front doors and exports what its docs promise."""
from __future__ import annotations

import ast
from pathlib import Path

import joiner

ROOT = Path(__file__).resolve().parents[2]
ROOMS = {"photon", "idregistry", "eventstore", "dispatcher", "joiner", "millwheel"}


def foreign_imports(room: str):
    for path in sorted((ROOT / room).glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module:
                yield path.name, node.module, [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                for a in node.names:
                    yield path.name, a.name, []


def test_only_front_doors_of_other_rooms_are_imported():
    for file, module, names in foreign_imports("joiner"):
        top, _, rest = module.partition(".")
        if top not in ROOMS or top == "joiner":
            continue
        assert not rest, f"joiner/{file} imports {module}: use the {top} front door"
        front = __import__(top)
        for name in names:
            assert name in front.__all__, f"joiner/{file} imports {name} from {top}, which does not export it"


def test_front_door():
    assert set(joiner.__all__) >= {"Outcome", "JoinerClient", "JoinerUnavailable", "serve", "JoinerConfig"}
    assert [(o.name, int(o)) for o in joiner.Outcome] == [
        ("JOINED", 0), ("ALREADY_JOINED", 1), ("NOT_FOUND", 2), ("THROTTLED", 3), ("UNJOINABLE", 4)]
