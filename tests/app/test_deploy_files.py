"""What ships for deployments is checked here: the systemd unit (``systemd-analyze verify`` where the tool is
installed), the Dockerfile (statically: no Docker engine here), the deployment guide's links, and the
pictures (drawn from the README's figures, up to date, valid SVG, shown in the README)."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from photon.app.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "deploy" / "systemd" / "photon-region@.service"
DOCKERFILE = REPO / "deploy" / "Dockerfile"


def _parse_photon(argv: list[str], config: str = "/etc/photon/photon.toml"):
    """``argv`` (after ``photon``) parsed by the real command line, with PHOTON_CONFIG set as the unit and
    the image set it."""
    old = os.environ.get("PHOTON_CONFIG")
    os.environ["PHOTON_CONFIG"] = config
    try:
        return build_parser().parse_args(argv)
    finally:
        if old is None:
            os.environ.pop("PHOTON_CONFIG")
        else:
            os.environ["PHOTON_CONFIG"] = old


def _unit_values(key: str) -> list[str]:
    return [line.split("=", 1)[1] for line in UNIT.read_text().splitlines() if line.startswith(f"{key}=")]


@pytest.mark.timeout(60)
def test_the_systemd_unit_runs_one_region_launcher():
    (start,) = _unit_values("ExecStart")
    argv = shlex.split(start.replace("%i", "b"))
    assert argv[0].endswith("/photon")
    args = _parse_photon(argv[1:])
    assert args.command == "run" and args.region == ["b"] and args.config == "/etc/photon/photon.toml"
    (pre,) = _unit_values("ExecStartPre")
    args = _parse_photon(shlex.split(pre)[1:])
    assert args.command == "config" and args.check == "" and args.offline
    assert _unit_values("Environment") == ["PHOTON_CONFIG=/etc/photon/photon.toml"]
    assert _unit_values("RestartPreventExitStatus") == ["2 4"]      # bad config, region already run


@pytest.mark.timeout(60)
@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_systemd_analyze_verifies_the_unit(tmp_path):
    # verify wants the binary to exist: point ExecStart at a stand-in, the rest of the unit unchanged
    stand_in = tmp_path / "photon"
    stand_in.write_text("#!/bin/sh\nexit 0\n")
    stand_in.chmod(0o755)
    text = UNIT.read_text().replace("/opt/photon/venv/bin/photon", str(stand_in))
    (tmp_path / UNIT.name).write_text(text)
    r = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "photon-region@a.service")],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stderr.strip() == "", r.stderr
    # and it does fail on a broken unit (the check can fail)
    (tmp_path / "broken@.service").write_text(text.replace(str(stand_in), str(tmp_path / "missing")))
    r = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "broken@a.service")],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "not executable" in r.stderr


def _instructions(path: Path) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` of a Dockerfile, continuation lines joined, comments dropped."""
    out, pending = [], ""
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("#") and not pending:
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        line = pending + line
        pending = ""
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    assert not pending, "a continuation line runs off the end of the file"
    return out


def _exec_form(rest: str) -> list[str]:
    import json
    value = json.loads(rest)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), rest
    return value


@pytest.mark.timeout(60)
def test_the_dockerfile_copies_what_exists_and_runs_a_real_photon_command():
    steps = _instructions(DOCKERFILE)
    kinds = [k for k, _ in steps]
    assert kinds[0] == "FROM" and set(kinds) <= {"FROM", "ENV", "RUN", "WORKDIR", "COPY", "USER", "VOLUME",
                                                  "STOPSIGNAL", "HEALTHCHECK", "ENTRYPOINT", "CMD", "ARG", "EXPOSE"}
    copies = [rest.split() for k, rest in steps if k == "COPY"]
    assert copies
    for args in copies:
        for source in args[:-1]:
            assert (REPO / source).exists(), f"COPY {source}: no such file in the build context"
    copied = {s.split("/")[0] for args in copies for s in args[:-1]}
    packages = re.findall(r'"(\w+)\*"', (REPO / "pyproject.toml").read_text().split("packages.find]")[1].split("\n")[1])
    assert set(packages) <= copied, f"pyproject installs {packages}, the image copies only {sorted(copied)}"
    env = " ".join(rest for k, rest in steps if k == "ENV")
    assert "PHOTON_CONFIG=/etc/photon/photon.toml" in env
    (entry,) = [_exec_form(rest) for k, rest in steps if k == "ENTRYPOINT"]
    (cmd,) = [_exec_form(rest) for k, rest in steps if k == "CMD"]
    argv = entry + cmd
    assert argv[0] == "photon"
    args = _parse_photon(argv[1:])
    assert args.command == "run" and args.region == ["a"]
    (health,) = [rest for k, rest in steps if k == "HEALTHCHECK"]
    probe = shlex.split(health.split(" CMD ", 1)[1].replace("$PHOTON_HEALTH_REGION", "a"))
    assert probe[0] == "photon" and _parse_photon(probe[1:]).command == "status"
    assert ("STOPSIGNAL", "SIGTERM") in steps


@pytest.mark.timeout(60)
def test_the_deployment_guide_covers_the_operators_questions_and_its_links_resolve():
    guide = (REPO / "docs" / "deploy.md").read_text()
    for topic in ("What to install", "Ports to open", "port_base + 999", "photon certs", "systemd",
                  "Logs and state", "Upgrades, one region at a time", "Backup of the registry",
                  "After a machine is lost", "photon verify", "photon recover", "Dockerfile"):
        assert topic in guide, topic
    for link in re.findall(r"\]\(([^)#]+)\)", guide):
        assert (REPO / "docs" / link).exists(), link
    for path in re.findall(r"`(deploy/[\w/@.-]+)`", guide):
        assert (REPO / path).exists(), path


@pytest.mark.timeout(60)
def test_the_pictures_are_up_to_date_valid_svg_and_shown():
    r = subprocess.run([sys.executable, str(REPO / "docs" / "pictures.py"), "--check"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    readme = (REPO / "README.md").read_text()
    for name in ("architecture.svg", "latency-vs-rtt.svg", "throughput.svg"):
        root = ET.parse(REPO / "docs" / "img" / name).getroot()
        assert root.tag == "{http://www.w3.org/2000/svg}svg"
        assert f"](docs/img/{name})" in readme, name
    # the plotted figures are the README's
    sys.path.insert(0, str(REPO / "docs"))
    try:
        import pictures
    finally:
        sys.path.pop(0)
    for value in pictures.LATENCY_MS["p50"] + pictures.LATENCY_MS["p99"]:
        assert f"{value:g}" in readme, value
    for _, value, _ in pictures.THROUGHPUT[1:4]:
        assert f"{value:,}" in readme, value
