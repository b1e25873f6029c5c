"""Rooms talk only through front doors: no private module of one room is imported by another, and the
shared core stays free of grpc and pysyncobj."""
import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOMS = ["photon", "idregistry", "eventstore", "dispatcher", "joiner", "millwheel"]


def _imports(path: Path):
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            for a in node.names:
                yield f"{node.module}.{a.name}"


def _sources(room: str):
    return [p for p in (REPO / room).rglob("*.py") if "_pb2" not in p.name]


def test_no_room_imports_another_rooms_private_modules():
    offences = []
    for room in ROOMS + ["bench"]:
        for path in _sources(room):
            for name in _imports(path):
                parts = name.split(".")
                if parts[0] in ROOMS and parts[0] != room and any(p.startswith("_") for p in parts[1:]):
                    offences.append(f"{path.relative_to(REPO)} imports {name}")
    assert offences == []


def test_names_taken_from_another_room_are_in_its_all():
    import importlib
    offences = []
    for room in ROOMS + ["bench"]:
        for path in _sources(room):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in ROOMS \
                        and node.module != room:
                    exported = set(importlib.import_module(node.module).__all__)
                    offences += [f"{path.relative_to(REPO)} takes {a.name} from {node.module}"
                                 for a in node.names if a.name not in exported]
    assert offences == []


def test_core_is_free_of_grpc_and_pysyncobj():
    offences = [f"{p.relative_to(REPO)} imports {n}" for p in _sources("photon") for n in _imports(p)
                if n.split(".")[0] in ("grpc", "pysyncobj")]
    assert offences == []


def test_every_room_has_a_front_door_with_all():
    for room in ROOMS:
        init = REPO / room / "__init__.py"
        assert init.exists(), room
        tree = ast.parse(init.read_text())
        names = [t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)]
        assert "__all__" in names, f"{room}/__init__.py has no __all__"


PURE_CORES = ["dispatcher/_state.py", "joiner/_state.py", "idregistry/_state.py", "millwheel/_runner.py",
              "millwheel/_watermarks.py"]


def test_deciding_cores_touch_no_clock_socket_or_thread():
    offences = [f"{core} imports {name}" for core in PURE_CORES for name in _imports(REPO / core)
                if name.split(".")[0] in ("time", "socket", "threading", "grpc", "pysyncobj", "subprocess")]
    assert offences == []
