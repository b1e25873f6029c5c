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
    modules = _imported_after("from joiner import JoinerClient\n")      # a dispatcher's view of the joiners
    assert "joiner._server" not in modules and "joiner._shell" not in modules
