"""The event store room uses other rooms only through their front doors and exports what its docs promise."""
from __future__ import annotations

import ast
from pathlib import Path

import eventstore

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
    for file, module, names in foreign_imports("eventstore"):
        top, _, rest = module.partition(".")
        if top not in ROOMS or top == "eventstore":
            continue
        assert not rest, f"eventstore/{file} imports {module}: use the {top} front door"
        front = __import__(top)
        for name in names:
            assert name in front.__all__, f"eventstore/{file} imports {name} from {top}, which does not export it"


def test_front_door():
    assert set(eventstore.__all__) >= {"EventStoreClient", "InMemoryEventStore", "EventStoreUnavailable", "serve",
                                       "EventStoreConfig"}
