"""Regions in the config: addresses, fixed ports, replica placement, registry-only regions, and what a
launcher of one region plans (never a registry of its own)."""
from __future__ import annotations

import pytest

import idregistry
from photon import REGION_PORTS, ConfigError, parse_config
from photon.app import Launcher, RunOptions


def _regions(tmp_path, *names, **extra):
    out = []
    for i, n in enumerate(names):
        r = {"name": n, "log_root": str(tmp_path / "logs" / n), "output_root": str(tmp_path / "out" / n),
             "state_dir": str(tmp_path / "state" / n)}
        r.update(extra.get(n, {}))
        out.append(r)
    return out


def test_without_addresses_everything_stays_on_one_host_in_the_first_region(tmp_path):
    cfg = parse_config({"regions": _regions(tmp_path, "a", "b")})
    assert cfg.registry.replicas == 3 and cfg.registry.replica_regions == []
    procs = idregistry.registry_processes(cfg)
    assert [p.region for p in procs] == ["a", "a", "a"]
    assert all(p.address.startswith("127.0.0.1:") for p in procs)
    assert all(str(tmp_path / "state" / "a" / "registry") in " ".join(p.argv) for p in procs)


def test_three_regions_spread_five_replicas_two_two_one(tmp_path):
    regions = _regions(tmp_path, "a", "b") + [{"name": "c", "state_dir": str(tmp_path / "state" / "c"),
                                              "registry_only": True}]
    cfg = parse_config({"regions": regions})
    assert cfg.registry.replicas == 5
    assert cfg.registry.replica_regions == ["a", "b", "c", "a", "b"]
    assert [r.name for r in cfg.pipeline_regions] == ["a", "b"]
    explicit = parse_config({"regions": regions, "registry": {"replicas": 3}})
    assert explicit.registry.replica_regions == ["a", "b", "c"]


def test_fixed_ports_follow_from_the_port_base(tmp_path):
    regions = _regions(tmp_path, "a", "b", a={"host": "127.0.0.1", "port_base": 31000},
                       b={"host": "127.0.0.2", "port_base": 32000})
    cfg = parse_config({"regions": regions, "registry": {"replica_regions": ["a", "b", "b"]}})
    addrs = [p.address for p in idregistry.registry_processes(cfg)]
    base = REGION_PORTS["registry"]
    assert addrs == [f"127.0.0.1:{31000 + base + 1}", f"127.0.0.2:{32000 + base + 4}",
                     f"127.0.0.2:{32000 + base + 7}"]
    # the data dir of each replica is in its own region's state dir
    argv = [" ".join(p.argv) for p in idregistry.registry_processes(cfg)]
    assert str(tmp_path / "state" / "a") in argv[0] and str(tmp_path / "state" / "b") in argv[1]


def test_overlapping_port_ranges_and_unknown_keys_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="port_base values are less than"):
        parse_config({"regions": _regions(tmp_path, "a", "b", a={"port_base": 31000}, b={"port_base": 31500})})
    with pytest.raises(ConfigError, match="port_base must be"):
        parse_config({"regions": _regions(tmp_path, "a", a={"port_base": -1})})
    with pytest.raises(ConfigError, match="missing required key 'log_root'"):
        parse_config({"regions": _regions(tmp_path, "a") + [{"name": "c", "state_dir": "s"}]})
    with pytest.raises(ConfigError, match="at least one must run the pipeline"):
        parse_config({"regions": [{"name": "c", "state_dir": "s", "registry_only": True}]})


def test_one_region_launcher_needs_fixed_registry_addresses(tmp_path):
    cfg = parse_config({"regions": _regions(tmp_path, "a", "b")})
    with pytest.raises(ConfigError, match=r"set port_base in \[\[regions\]\] 'a'"):
        Launcher(cfg, RunOptions(regions=["b"])).specs()


def test_one_region_launcher_plans_only_its_own_processes_and_replicas(tmp_path):
    regions = _regions(tmp_path, "a", "b", a={"port_base": 31000}, b={"port_base": 33000})
    regions.append({"name": "c", "state_dir": str(tmp_path / "state" / "c"), "registry_only": True,
                    "port_base": 35000})
    cfg = parse_config({"regions": regions})
    plans = {name: Launcher(cfg, RunOptions(regions=[name])).specs() for name in ("c", "b")}
    assert not (tmp_path / "state" / "a").exists()     # planning regions b and c never touches a's state dir
    plans["a"] = Launcher(cfg, RunOptions(regions=["a"])).specs()
    assert sorted(p.name for p in plans["c"]) == ["registry-s0-r2"]
    assert sorted(p.name for p in plans["b"] if p.role == "registry") == ["registry-s0-r1", "registry-s0-r4"]
    assert {p.region for p in plans["b"]} == {"b"}
    everything = [p.name for plan in plans.values() for p in plan]
    assert len(everything) == len(set(everything))          # each process planned by exactly one launcher
    assert sum(p.role == "registry" for plan in plans.values() for p in plan) == 5
    joiner_b = next(p for p in plans["b"] if p.role == "joiner")
    reg_arg = joiner_b.argv[joiner_b.argv.index("--registry") + 1].split(",")
    assert reg_arg[0].endswith(f":{33000 + REGION_PORTS['registry'] + 4}")      # its own region's replica first
    assert len(reg_arg) == 5
