"""What a cold start imports: the launcher plans every process of a run without gRPC, pysyncobj or
prometheus-client (the rooms' front doors and the base import on first use), and the base's config does not
pull the metrics' HTTP stack. Each check runs in a fresh interpreter."""
import subprocess
import sys

import pytest

from photon.app import GenOptions, generate

HEAVY = ("grpc", "pysyncobj", "prometheus_client", "google.protobuf", "http.client", "importlib.metadata")


def _imported_after(code: str) -> set[str]:
    probe = f"import sys\n{code}\nprint(' '.join(sorted(sys.modules)))"
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    return set(r.stdout.split())


@pytest.mark.timeout(120)
def test_the_launcher_plans_a_run_without_the_services_heavy_imports(tmp_path):
    s = generate(GenOptions(out=str(tmp_path), queries=20, seed=1))
    modules = _imported_after(
        "from photon import load_config\n"
        "from photon.app import Launcher, RunOptions\n"
        "from photon.app.cli import build_parser\n"
        "build_parser()\n"
        f"launcher = Launcher(load_config({s.config!r}), RunOptions())\n"
        "specs = launcher.specs()\n"
        "assert {p.role for p in specs} == {'registry', 'eventstore', 'joiner', 'dispatcher'}, specs\n")
    assert [m for m in HEAVY if m in modules] == []
    assert (tmp_path / "state" / "a" / "ports.json").exists()     # written (once) before it returns


@pytest.mark.timeout(60)
def test_front_doors_import_on_first_use():
    modules = _imported_after("import photon, idregistry, eventstore, joiner, dispatcher\n"
                              "photon.load_config, joiner.plan_processes, dispatcher.read_status\n")
    assert [m for m in HEAVY if m in modules] == []
    assert "photon._output" not in modules and "joiner._server" not in modules and "dispatcher._shell" not in modules
    assert "dispatcher._state" not in modules       # (reading a status, as the launcher does, needs no core)
    modules = _imported_after("from joiner import JoinerClient\n")      # a dispatcher's view of the joiners
    assert "joiner._server" not in modules and "joiner._shell" not in modules


@pytest.mark.timeout(120)
def test_a_run_asks_for_its_registry_first_and_for_every_joiner_before_its_dispatcher(tmp_path):
    """The order in which a run's processes are asked of the fork server (all at once, forked in this order):
    the registry's replicas first (their first election comes before the first lookup and commit), then per
    region the cache servers, the logs stores, the joiners and last the dispatcher (what it sends to, and what
    they ask, already started before it)."""
    from photon import load_config
    from photon.app import Launcher, RunOptions
    s = generate(GenOptions(out=str(tmp_path), queries=20, seed=1, regions=("a", "b")))
    specs = Launcher(load_config(s.config), RunOptions()).specs()
    kinds = ["cache" if p.role == "eventstore" and "--logs" not in p.argv else
             "logs" if p.role == "eventstore" else p.role for p in specs]
    replicas = kinds.count("registry")
    assert replicas >= 3 and kinds[:replicas] == ["registry"] * replicas, kinds
    for region in ("a", "b"):
        mine = [k for k, p in zip(kinds, specs) if p.region == region and k != "registry"]
        order = ["cache", "logs", "joiner", "dispatcher"]
        assert sorted(mine, key=order.index) == mine and mine[0] == "cache" and mine[-1] == "dispatcher", mine
        assert mine.count("dispatcher") == 1 and "joiner" in mine and "logs" in mine, mine
    assert len(specs) == len({p.name for p in specs})
