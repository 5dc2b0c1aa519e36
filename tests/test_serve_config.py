"""serve.config: the YAML file is validated at start-up; bad entries fail naming the entry."""

from __future__ import annotations

import copy

import pytest
import yaml

from carbonrouter_lib.serve import config as sc
from carbonrouter_lib.serve.carbon_providers import ReplayProvider

BASE = {
    "deployments": [
        {"id": "gb-h100", "base_url": "http://127.0.0.1:9001/v1", "model": "Llama-3.1-70B",
         "gpu": "H100", "region": "GB", "zone": "GB", "slots": 4, "kv_tokens": 1e5},
        {"id": "be-a100", "base_url": "http://127.0.0.1:9002/v1", "model": "Mistral-7B-v0.2",
         "gpu": "A100", "region": "BE", "zone": "BE", "slots": 4, "kv_tokens": 1e5},
    ],
}


def _with(**changes) -> dict:
    raw = copy.deepcopy(BASE)
    for path, value in changes.items():
        i, field = path.split("__")
        raw["deployments"][int(i)][field] = value
    return raw


def test_embedded_default_is_valid_and_builds_the_grid():
    cfg = sc.load_config()
    grid, index = cfg.deployments_grid()
    assert cfg.region_order == ("GB", "BE", "US-CAL-CISO")
    assert len(index) == len(set(index)) == len(cfg.deployments) == 9
    # grid = used models × used GPUs × regions, in the spec's tie-break order
    assert grid.n == 3 * 3 * 3
    for a, d in zip(index, cfg.deployments, strict=True):
        assert grid.label(a) == f"{d.model}/{d.gpu}/{d.region}"
    assert cfg.backend_config().slots_per_pool == 64


def test_yaml_file_with_env_substitution(tmp_path, monkeypatch):
    raw = _with(**{"0__base_url": "${ENGINE_GB:-http://127.0.0.1:1/v1}"})
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert sc.load_config(path).deployments[0].base_url == "http://127.0.0.1:1/v1"
    monkeypatch.setenv("ENGINE_GB", "http://127.0.0.1:7/v1")
    assert sc.load_config(path).deployments[0].base_url == "http://127.0.0.1:7/v1"


@pytest.mark.parametrize(("raw", "needle"), [
    (_with(**{"1__id": "gb-h100"}), r"deployments\[1\] \(id 'gb-h100'\): duplicate id"),
    (_with(**{"1__gpu": "B200"}), r"deployments\[1\] \(id 'be-a100'\): no profile for model"),
    (_with(**{"1__slots": 0}), r"deployments\[1\] \(id 'be-a100'\): slots: "),
    (_with(**{"0__base_url": "127.0.0.1:9"}), r"deployments\[0\] \(id 'gb-h100'\): base_url"),
    (_with(**{"1__kv_tokens": 5.0}), r"deployments\[1\].*every \(region, GPU\) pool"),
    (_with(**{"1__zone": "FR", "1__region": "GB"}), r"deployments\[1\].*zone 'FR' differs"),
    ({**BASE, "regions": ["GB"]}, r"deployments\[1\] \(id 'be-a100'\): unknown region 'BE'"),
    ({**BASE, "router": {"policy": "nope"}}, r"router.policy: .*unknown policy 'nope'"),
    ({**BASE, "router": {"quality": {"GPT-9": 0.5}}}, r"router.quality names unknown models"),
    ({**BASE, "colour": "blue"}, r"colour: Extra inputs"),
    ({"deployments": []}, r"deployments: "),
])
def test_bad_entries_fail_naming_the_entry(raw, needle):
    with pytest.raises(sc.ConfigError, match=needle):
        sc.config_from_dict(raw, "x.yaml")


def test_unreadable_or_bad_yaml_names_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("deployments: [ {id: a,\n")
    with pytest.raises(sc.ConfigError, match=r"bad.yaml: not valid YAML"):
        sc.load_config(bad)
    with pytest.raises(sc.ConfigError, match=r"missing.yaml: cannot read"):
        sc.load_config(tmp_path / "missing.yaml")


def test_measured_profiles_file_relative_to_the_config(tmp_path):
    from carbonrouter_lib.profiles import analytical_profiles

    prof = analytical_profiles()
    prof.loc[prof["model"] == "Llama-3.1-70B", "e_in_kwh"] *= 2
    prof.to_csv(tmp_path / "measured.csv", index=False)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**BASE, "profiles": "measured.csv"}))
    cfg = sc.load_config(path)
    grid, index = cfg.deployments_grid()
    ref, _ = sc.config_from_dict(BASE).deployments_grid()
    assert grid.e_in[index[0]] == pytest.approx(2 * ref.e_in[index[0]])
    path.write_text(yaml.safe_dump({**BASE, "profiles": "absent.csv"}))
    with pytest.raises(sc.ConfigError, match=r"profiles 'absent.csv'"):
        sc.load_config(path)


def test_unknown_zone_fails_at_start_up_for_the_replay():
    with pytest.raises(ValueError, match=r"replay: .*'XX'"):
        ReplayProvider(["GB", "XX"])
