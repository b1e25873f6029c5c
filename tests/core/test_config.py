import pytest

from photon import ConfigError, load_config, parse_config

MINIMAL = {"regions": [{"name": "a", "log_root": "logs/a", "output_root": "out/a", "state_dir": "state/a"}]}


def test_defaults_and_relative_paths(tmp_path):
    cfg_file = tmp_path / "photon.toml"
    cfg_file.write_text('[[regions]]\nname = "a"\nlog_root = "logs/a"\noutput_root = "out/a"\nstate_dir = "st"\n')
    cfg = load_config(cfg_file)
    assert cfg.join.primary_stream == "queries" and cfg.join.unjoinable_after_s == 60.0
    assert cfg.regions[0].log_root == str(tmp_path / "logs" / "a")
    assert cfg.regions[0].joined_dir == tmp_path / "out" / "a" / "joined"
    assert cfg.registry.replicas == 3
    assert cfg.registry_data_dir == tmp_path / "st" / "registry"


@pytest.mark.parametrize("data, names", [
    ({"join": {"unjoinable_after_s": -1}}, "[join].unjoinable_after_s"),
    ({"join": {"primary_streem": "q"}}, "'primary_streem'"),
    ({"join": {"primary_stream": 5}}, "[join].primary_stream must be str"),
    ({"joiner": {"per_region": 0}}, "[joiner].per_region"),
    ({"registry": {"fsync": "sometimes"}}, "[registry].fsync must be one of"),
    ({"registry": {"replica_regions": ["zz", "a", "a"]}}, "unknown region 'zz'"),
    ({"dispatcher": {"batch_size": True}}, "[dispatcher].batch_size must be int"),
    ({"nonsense": {}}, "unknown section [nonsense]"),
])
def test_bad_values_name_the_key(data, names):
    with pytest.raises(ConfigError) as e:
        parse_config({**MINIMAL, **data}, "photon.toml")
    assert names in str(e.value)
    assert "photon.toml" in str(e.value)


def test_regions_required_and_complete():
    with pytest.raises(ConfigError, match="at least one"):
        parse_config({}, "c.toml")
    with pytest.raises(ConfigError, match="missing required key 'state_dir'"):
        parse_config({"regions": [{"name": "a", "log_root": "l", "output_root": "o"}]}, "c.toml")
    with pytest.raises(ConfigError, match="unique"):
        parse_config({"regions": MINIMAL["regions"] * 2}, "c.toml")


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[join\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)


def test_ints_are_accepted_for_floats():
    cfg = parse_config({**MINIMAL, "join": {"unjoinable_after_s": 5}})
    assert cfg.join.unjoinable_after_s == 5.0 and isinstance(cfg.join.unjoinable_after_s, float)
