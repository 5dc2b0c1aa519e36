"""Notebook 09's grid and verdicts (carbonrouter_lib.horizon_eval) on synthetic tables."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from carbonrouter_lib import horizon_eval as he


def test_grid_runs_every_online_policy_and_the_variants_only_where_asked():
    tuned = dict(he.TUNED)
    other = dict(tuned, season="summer")
    runs = he.grid([tuned, other], [tuned], max_conversations=30)
    per = runs.groupby("season")["policy"].agg(list)
    assert per["summer"] == [*he.ONLINE, he.TARGET]
    assert set(per["winter"]) == {*he.ONLINE, he.TARGET, *he.VARIANTS,
                                  *(he.noise_label(s) for s in he.NOISE)}
    assert runs["key"].is_unique
    spec = runs[(runs.season == "winter") & (runs.policy == "w/o cache survival")]["spec"].iloc[0]
    assert spec.policy == he.TARGET and spec.policy_params["cache_survival"] is False
    assert spec.output == "summary"
    # the seasons are the windows of replays.SEASONS
    assert spec.workload_config().arrival.window_start == pd.Timestamp("2022-01-03", tz="UTC")
    with pytest.raises(ValueError, match="unknown season"):
        he.grid([dict(tuned, season="monsoon")])
    with pytest.raises(KeyError, match="unknown grid"):
        he.grid_settings("huge")


def _table(co2: dict[str, float], ci: dict[str, tuple[float, float]], season="winter"):
    rows = []
    for p, c in co2.items():
        lo, hi = ci.get(p, (math.nan, math.nan))
        rows.append({**he.TUNED, "season": season, "policy": p, "co2_rel": c,
                     "saving_pct": (lo + hi) / 2, "ci_low_pct": lo, "ci_high_pct": hi,
                     "p95_ttft_s": 0.5, "quality_rel": 1.0,
                     "held_out": season != he.TUNED["season"]})
    return pd.DataFrame(rows)


def test_verdicts_compare_with_the_best_other_online_policy():
    co2 = {"session-affinity": 1.0, "carbon-affinity": 0.80, "gar": 1.1, "faircarbon": 0.9,
           "carbonrouter-no-gate": 0.85, "carbonrouter": 0.84, he.TARGET: 0.75}
    ci = {p: (1.0, 3.0) for p in co2}
    v = he.verdicts(_table(co2, ci)).iloc[0]
    assert v["best_other"] == "carbon-affinity" and v["lowest_co2"] == "holds"
    ci["carbon-affinity"] = (-1.0, 2.0)
    assert he.verdicts(_table(co2, ci)).iloc[0]["lowest_co2"] == "tie"
    ci["carbon-affinity"] = (-4.0, -1.0)
    v = he.verdicts(_table(co2, ci, season="summer")).iloc[0]
    assert v["lowest_co2"] == "fails" and v["held_out"]
