"""Rooms talk only through front doors, and only downwards: no private module of one room is imported by
another, each layer imports only layers below it (also inside functions and through ``__import__`` or
``importlib``), and the base stays free of grpc and pysyncobj."""
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


# Layers, bottom up. A module may import its own layer's room and any room of a lower layer. ``photon``
# is the base (every module of the photon package but the launcher layer, ``photon/app``, and the gRPC
# plumbing the service rooms share, ``photon/rpc``).
LAYERS = [["photon"], ["photon.rpc", "photon.raft"], ["idregistry", "eventstore"], ["joiner"], ["dispatcher"],
          ["photon.app"]]
SUB_UNITS = ("app", "rpc", "raft")          # photon's sub-packages that are layers of their own
SIDE_ROOMS = {"millwheel": ["photon", "photon.rpc", "photon.raft"]}   # millwheel: the base, its gRPC and Raft plumbing
SERVICE_ROOMS = ["idregistry", "eventstore", "joiner", "dispatcher", "millwheel"]


def _unit_of(path: Path) -> str:
    rel = path.relative_to(REPO).parts
    return f"photon.{rel[1]}" if rel[0] == "photon" and rel[1] in SUB_UNITS else rel[0]


def _unit_of_module(name: str) -> str | None:
    parts = name.split(".")
    if parts[0] == "photon" and len(parts) > 1 and parts[1] in SUB_UNITS:
        return f"photon.{parts[1]}"
    return parts[0] if parts[0] in ROOMS else None


def _allowed(unit: str) -> set[str]:
    if unit in SIDE_ROOMS:
        return {unit, *SIDE_ROOMS[unit]}
    for i, layer in enumerate(LAYERS):
        if unit in layer:
            return {u for lower in LAYERS[:i] for u in lower} | set(layer)
    return {u for layer in LAYERS for u in layer}      # bench and tests may use anything


def _dynamic_imports(path: Path):
    """Room names passed as string literals to ``__import__``, ``importlib.import_module`` or
    ``import_module`` (a room imported behind the layering test's back)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func
        name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
        if name not in ("__import__", "import_module"):
            continue
        for arg in node.args[:1]:
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                yield arg.value


def layering_offences(paths, unit_of=_unit_of) -> list[str]:
    offences = []
    for path in paths:
        unit = unit_of(path)
        allowed = _allowed(unit)
        for name in _imports(path):
            target = _unit_of_module(name)
            if target is not None and target not in allowed:
                offences.append(f"{path.name} ({unit}) imports {name} ({target}, a higher layer)")
        for name in _dynamic_imports(path):
            target = _unit_of_module(name)
            if target is not None and target != unit:
                offences.append(f"{path.name} imports room {name!r} dynamically; import it at the "
                                f"top of the module (if its layer allows it)")
    return offences


def test_each_layer_imports_only_layers_below_it():
    paths = [p for room in ROOMS for p in _sources(room)]
    assert layering_offences(paths) == []


def test_the_layering_check_catches_upward_and_dynamic_imports(tmp_path):
    """The check itself can fail: an upward import inside a function and a room named in ``__import__``
    are both reported."""
    probe = tmp_path / "_probe.py"
    probe.write_text("def f():\n    import dispatcher\n    return __import__('joiner')\n")
    found = layering_offences([probe], unit_of=lambda _: "photon")
    assert any("imports dispatcher" in o for o in found)
    assert any("'joiner' dynamically" in o for o in found)


def test_base_imports_no_service_room():
    base = [p for p in _sources("photon") if _unit_of(p) == "photon"]
    offences = [f"{p.relative_to(REPO)} imports {n}" for p in base for n in _imports(p)
                if n.split(".")[0] in SERVICE_ROOMS or n.startswith("photon.app")]
    assert offences == []


def test_one_process_spec_type():
    """Every room plans its processes with the base's ProcessSpec; nobody defines another."""
    offences = [f"{p.relative_to(REPO)} defines ProcessSpec" for room in ROOMS for p in _sources(room)
                if p.name != "_process.py" and "class ProcessSpec" in p.read_text()]
    assert offences == []


def test_no_room_imports_another_rooms_private_modules():
    offences = []
    for room in ROOMS + ["bench"]:
        for path in _sources(room):
            for name in _imports(path):
                parts = name.split(".")
                if parts[0] in ROOMS and parts[0] != room and any(p.startswith("_") for p in parts[1:]):
                    offences.append(f"{path.relative_to(REPO)} imports {name}")
    assert offences == []


TEST_HOMES = {"core": "photon", "app": "photon", "idregistry": "idregistry", "eventstore": "eventstore", "joiner": "joiner",
              "dispatcher": "dispatcher", "millwheel": "millwheel"}


def test_tests_import_private_modules_of_their_own_room_only():
    """A room's own tests may reach into its private modules; every other test uses front doors (or a
    room's public ``testing`` module)."""
    offences = []
    for path in (REPO / "tests").rglob("*.py"):
        home = TEST_HOMES.get(path.relative_to(REPO / "tests").parts[0])
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] in ROOMS and parts[0] != home and any(p.startswith("_") for p in parts[1:]):
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
    offences = [f"{p.relative_to(REPO)} imports {n}" for p in _sources("photon") if _unit_of(p) == "photon"
                for n in _imports(p)
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
              "millwheel/_watermarks.py", "eventstore/_ring.py", "eventstore/_map.py", "photon/_histogram.py"]


def test_deciding_cores_touch_no_clock_socket_or_thread():
    offences = [f"{core} imports {name}" for core in PURE_CORES for name in _imports(REPO / core)
                if name.split(".")[0] in ("time", "socket", "threading", "grpc", "pysyncobj", "subprocess")]
    assert offences == []


# The storage modules of the base: the scheme map, the kinds, and the implementations they wrap. Everyone
# else asks ``photon.storage_kind(url)`` (or a reader, a source, a publisher) and never tests a kind by string.
STORAGE_MODULES = {"photon/_storage.py", "photon/_source.py", "photon/_publish.py", "photon/_kind_file.py",
                   "photon/_kind_s3.py", "photon/_kind_memory.py"}
KIND_TESTS = [r"\bis_remote\b", r"\boutput_on_s3\b", r"""startswith\(\s*["']s3://""", r"""["']s3://["']\s+in\b""",
              r"\.is_s3\b", r"""scheme\s*==\s*["'](s3|file|memory)["']""", r"""==\s*["']s3["']"""]


def kind_tests_by_string(paths) -> list[str]:
    import re
    pattern = re.compile("|".join(KIND_TESTS))
    offences = []
    for path in paths:
        for n, line in enumerate(Path(path).read_text().splitlines(), 1):
            if pattern.search(line):
                offences.append(f"{path}:{n}: {line.strip()}")
    return offences


def test_no_room_outside_the_storage_modules_tests_a_storage_kind_by_string():
    paths = [p for room in ROOMS + ["bench"] for p in (REPO / room).rglob("*.py")
             if p.relative_to(REPO).as_posix() not in STORAGE_MODULES and "_pb2" not in p.name]
    assert kind_tests_by_string(paths) == []


def test_the_storage_check_catches_kind_tests(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('if url.startswith("s3://"):\n    pass\nif region.output_on_s3 or is_remote(x):\n    pass\n'
                     'ok = storage_kind(url).in_place\n')
    assert len(kind_tests_by_string([probe])) == 2
