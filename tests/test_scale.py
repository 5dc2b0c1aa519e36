"""The scale study's tables: convergence, the default's rule, the claims (hand-built tables), and
the grid of runs."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from carbonrouter_lib import prepared, scale
from carbonrouter_lib.simulator import SimulationConfig

POLICIES = ["session-affinity", "carbon-affinity", "gar", "faircarbon", "carbonrouter-no-gate"]


def synthetic(values: dict[str, list[float]], peaks=(40, 70, 130, 250, 480),
              memory="paper", ttft=None) -> pd.DataFrame:
    """A scale table: CO2 rel. SA per policy and scale; savings derived from it; CI ± 1 pp."""
    rows = []
    for i, p in enumerate(peaks):
        target = values["carbonrouter-no-gate"][i]
        for pol in POLICIES:
            rel = 1.0 if pol == "session-affinity" else values[pol][i]
            saving = math.nan if pol == "carbonrouter-no-gate" else 100 * (1 - target / rel)
            rows.append({"dataset": "sharegpt", "region_set": "paper", "memory": memory,
                         "copies": float(2 ** i), "policy": pol, "peak_sessions": float(p),
                         "sessions_per_s": 0.0156 * 2 ** i, "co2_rel": rel,
                         "saving_pct": saving, "ci_low_pct": saving - 1, "ci_high_pct": saving + 1,
                         "p95_ttft_s": (ttft or {}).get(pol, 1.0), "kv_hit_rate_tokens": 0.5,
                         "share_in_cleanest_region": 0.5, "share_history_recomputed": 0.5})
    return pd.DataFrame(rows)


SETTLING = {  # every policy settles from the fourth scale on
    "carbon-affinity": [0.76, 0.80, 0.805, 0.806, 0.807],
    "gar": [1.04, 1.18, 1.22, 1.225, 1.228],
    "faircarbon": [0.84, 1.00, 1.052, 1.056, 1.06],
    "carbonrouter-no-gate": [0.74, 0.84, 0.88, 0.885, 0.888],
}


def test_convergence_finds_where_each_quantity_stops_moving():
    conv = scale.convergence(synthetic(SETTLING)).set_index(["policy", "quantity"])
    # CA: steps 4, 0.5, 0.1, 0.1 pp → below 1 pp from the second scale (P = 70)
    assert conv.loc[("carbon-affinity", "co2_rel"), "converged_from_peak"] == 70
    assert conv.loc[("carbon-affinity", "co2_rel"), "max_change_pp"] == pytest.approx(4.0)
    assert conv.loc[("faircarbon", "co2_rel"), "converged_from_peak"] == 130
    assert conv.loc[("session-affinity", "co2_rel"), "converged_from_peak"] == 40
    moving = dict(SETTLING, **{"carbon-affinity": [0.76, 0.80, 0.82, 0.84, 0.86]})
    conv = scale.convergence(synthetic(moving)).set_index(["policy", "quantity"])
    assert math.isnan(conv.loc[("carbon-affinity", "co2_rel"), "converged_from_peak"])
    assert conv.loc[("carbon-affinity", "co2_rel"), "last_step_pp"] == pytest.approx(2.0)


def test_default_is_the_smallest_scale_within_tolerance_of_the_largest():
    chosen = scale.choose_default(synthetic(SETTLING))
    # at P = 130: CO2 within 0.8 pp of the top, savings within 1 pp; at P = 70 FC is 6 pp off
    assert chosen["peak_sessions"] == 130 and chosen["default_peak"] == 130
    assert chosen["copies"] == 4.0 and chosen["rule"] == "converged"
    assert chosen["max_deviation_pp"] < 1.0
    # a lower start rate (the Mooncake trace's) takes over when smaller
    slow = scale.choose_default(synthetic(SETTLING), mooncake_rate_per_s=0.03)
    assert slow["rule"] == "mooncake rate" and slow["copies"] == pytest.approx(0.03 / 0.0156)
    with pytest.raises(ValueError, match="not converged"):
        scale.choose_default(synthetic(dict(SETTLING, gar=[1.0, 1.1, 1.2, 1.3, 1.4])))


def test_claims_mark_holds_fails_depends():
    # CR lowest at the first two scales only; CA below CR from the third scale on
    values = dict(SETTLING, **{"carbon-affinity": [0.76, 0.85, 0.86, 0.87, 0.87]})
    ttft = {"session-affinity": 0.1, "carbon-affinity": 0.2, "carbonrouter-no-gate": 0.5,
            "faircarbon": 0.9, "gar": 1.0}
    c = scale.claims(synthetic(values, ttft=ttft)).set_index("claim")
    assert c.loc["lowest CO2", "verdict"] == "depends"
    assert c.loc["lowest CO2", "settings_holding"] == "2/5"
    assert c.loc["lowest CO2", "peak_max_holding"] == 70
    assert c.loc["saves over session-affinity", "verdict"] == "holds"
    assert c.loc["saves over carbon-affinity", "verdict"] == "depends"
    assert c.loc["TTFT ordering", "verdict"] == "holds"
    worse = dict(SETTLING, **{"carbonrouter-no-gate": [2.0] * 5})
    c = scale.claims(synthetic(worse)).set_index("claim")
    assert c.loc["lowest CO2", "verdict"] == "fails"
    assert c.loc["saves over faircarbon", "verdict"] == "fails"


def test_scale_specs_cover_the_grid_at_the_asked_rates():
    wl = prepared.WorkloadConfig(dataset="sharegpt", max_conversations=30)
    grid = scale.scale_specs({"sharegpt": wl}, ["paper"], copies=(1, 4),
                             memory=["paper", "hardware"],
                             policies=["faircarbon", "session-affinity"])
    assert len(grid) == 2 * 2 * 2 and grid["key"].is_unique
    row = grid[(grid.copies == 4) & (grid.memory == "hardware")].iloc[0]
    spec = row["spec"]
    assert spec.output == "summary"
    assert spec.workload_config().sessions_per_s == pytest.approx(4 * 30 / wl.arrival.window_s)
    assert spec.simulation_config() == SimulationConfig(kv_memory="hardware")
    with pytest.raises(KeyError, match="unknown memory rule"):
        scale.memory_config(SimulationConfig(), "lots")
