"""Tests of carbonrouter_lib.replays: the results notebooks' settings and run grids are the ones
the notebooks built by hand (scale.setting and RunSpec.make in loops) before the helper existed."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from carbonrouter_lib import experiments, prepared, replays, scale, simulator, sweep
from carbonrouter_lib.arrivals import ArrivalConfig

WORKLOAD = {"n_sessions": None, "seed": 0, "max_conversations": 40}
DATASETS = ["sharegpt", "mooncake"]
REGION_SETS = ["paper", "em-only"]


def _keys(specs: dict) -> dict:
    return {k: s.key() for k, s in specs.items()}


@pytest.fixture(scope="module")
def grid():
    """Notebook 04's grid at a small scale: datasets × region sets, the once-over replay, and a
    season; what the notebook built by hand, and what the helper builds."""
    peak, memory = 4, None
    policies = [*experiments.MAIN_POLICIES, "carbonrouter-no-gate"]
    seasons_policies = ["session-affinity", "faircarbon", "carbonrouter"]
    by_hand = {}
    for ds in DATASETS:
        for rs in REGION_SETS:
            wcfg, scfg = scale.setting(ds, rs, peak, memory, **WORKLOAD)
            for p in policies:
                by_hand[(ds, rs, p)] = sweep.RunSpec.make(wcfg, scfg, p)
    unscaled = scale.setting(DATASETS[0], REGION_SETS[0], "unscaled", memory, **WORKLOAD)
    for p in policies:
        by_hand[("unscaled", p)] = sweep.RunSpec.make(*unscaled, p)
    arrival = ArrivalConfig(window_start="2022-07-04T00:00:00Z")
    wcfg, scfg = scale.setting(DATASETS[0], REGION_SETS[0], peak, memory, arrival=arrival,
                               **WORKLOAD)
    for p in seasons_policies:
        by_hand[("season", "2022-07-04", p)] = sweep.RunSpec.make(wcfg, scfg, p, output="summary")

    settings = replays.settings(DATASETS, REGION_SETS, peak, memory, **WORKLOAD)
    settings["unscaled"] = unscaled
    seasons = {("season", "2022-07-04"): replays.setting(DATASETS[0], REGION_SETS[0], peak, memory,
                                                          window_start="2022-07-04", **WORKLOAD)}
    helper = {**replays.specs(settings, policies),
              **replays.specs(seasons, seasons_policies, output="summary")}
    return by_hand, helper, settings


def test_specs_equal_the_notebooks_hand_built_grid(grid):
    by_hand, helper, _ = grid
    assert list(helper) == list(by_hand)  # same keys, same order
    assert _keys(helper) == _keys(by_hand)  # same runs
    assert helper[("season", "2022-07-04", "carbonrouter")].output == "summary"
    assert helper[("sharegpt", "paper", "carbonrouter")].output == "records"


def test_settings_are_dataset_major_and_setting_moves_the_window(grid):
    _, _, settings = grid
    assert list(settings)[:4] == [(ds, rs) for ds in DATASETS for rs in REGION_SETS]
    season = replays.setting("sharegpt", window_start="2022-10-03", peak="unscaled", **WORKLOAD)
    assert season[0].arrival.window_start.isoformat() == "2022-10-03T00:00:00+00:00"
    default = replays.setting("sharegpt", peak="unscaled", **WORKLOAD)
    assert default == scale.setting("sharegpt", peak="unscaled", **WORKLOAD)


def test_specs_key_a_non_tuple_setting_as_a_one_tuple():
    s = scale.setting("sharegpt", "paper", "unscaled", **WORKLOAD)
    specs = replays.specs({0.5: s, "unscaled": s}, ["faircarbon", "carbonrouter"])
    assert list(specs) == [(0.5, "faircarbon"), (0.5, "carbonrouter"),
                           ("unscaled", "faircarbon"), ("unscaled", "carbonrouter")]


def test_describe_one_row_per_setting(grid):
    _, _, settings = grid
    table = replays.describe({k: settings[k] for k in [("sharegpt", "paper"), "unscaled"]})
    assert list(table.index) == ["sharegpt / paper", "unscaled"]
    assert table.loc["sharegpt / paper", "peak_sessions"] >= table.loc["unscaled", "peak_sessions"]
    assert {"sessions_per_s", "copies", "queries", "slots_per_pool", "kv_memory"} <= set(table)


def test_a_window_in_another_year_replays_that_years_carbon():
    # the signal covers one calendar year: a window in 2021 replays 2021's intensities, and
    # the 2022 windows keep the default carbon year (their runs' keys do not move)
    w21, s21 = replays.setting("sharegpt", window_start="2021-04-05", peak="unscaled", **WORKLOAD)
    w22, s22 = replays.setting("sharegpt", window_start="2022-04-04", peak="unscaled", **WORKLOAD)
    base = scale.setting("sharegpt", peak="unscaled", **WORKLOAD)[1]
    assert s22 == base and s22.carbon_year == 2022
    assert s21 == dataclasses.replace(base, carbon_year=2021)
    signal = s21.signal()
    assert signal.row_interval(0)[0] == pd.Timestamp("2021-01-01", tz="UTC").value / 1e9
    # a 2021 replay runs on that signal: every query's carbon is its energy times 2021's
    # intensity of its region at its dispatch
    r = simulator.simulate(prepared.prepare_workload(w21), "session-affinity", s21,
                           signal).records
    start = pd.Timestamp("2021-04-05", tz="UTC").value / 1e9
    assert r["dispatch_s"].between(start, start + 8 * 86400).all()
    ci = np.array([signal.at(d)[signal.region_index(z)] for d, z in zip(r["dispatch_s"],
                                                                       r["region"], strict=True)])
    assert (r["carbon_g"] / r["energy_kwh"]).to_numpy() == pytest.approx(ci, rel=1e-12)
    with pytest.raises(ValueError, match="not both"):
        replays.setting("sharegpt", window_start="2021-04-05",
                        arrival=ArrivalConfig(window_start="2021-04-05T00:00:00Z"), **WORKLOAD)
