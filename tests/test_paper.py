"""The paper's numbers (carbonrouter_lib.paper): internally consistent as the paper states them,
the model's defaults equal to them, and typed nowhere else in the notebooks."""

from __future__ import annotations

import dataclasses
import inspect
import io
import json
import math
import tokenize
from decimal import Decimal

import numpy as np
import pandas as pd
import pytest

from carbonrouter_lib import (
    backend,
    carbon,
    cost,
    experiments,
    metrics,
    notebooks,
    paper,
    profiles,
    quality,
    setting,
)
from carbonrouter_lib.policies import POLICIES, ConstraintConfig
from carbonrouter_lib.setting import SimulationConfig

#: Half a unit in the last digit the paper prints: ratios to 3 decimals, percentages to 1.
RATIO_HALF_ULP = 0.0005
PCT_HALF_ULP = 0.05
EPS = 1e-9


def _saving_bounds(co2_target: float, co2_other: float) -> tuple[float, float]:
    """The range of 100·(1 − CO2_target / CO2_other) over the true values that round to the
    printed ratios."""
    lo = 100 * (1 - (co2_target + RATIO_HALF_ULP) / max(co2_other - RATIO_HALF_ULP, EPS))
    hi = 100 * (1 - (co2_target - RATIO_HALF_ULP) / (co2_other + RATIO_HALF_ULP))
    return lo, hi


def _change_bounds(value: float, reference: float, half_ulp: float) -> tuple[float, float]:
    """The range of 100·(value / reference − 1) over the true values that round as printed."""
    return (100 * ((value - half_ulp) / (reference + half_ulp) - 1),
            100 * ((value + half_ulp) / (reference - half_ulp) - 1))


# --- Table 1 ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dataset", ["ShareChat", "ShareGPT"])
def test_table1_savings_follow_from_the_co2_ratios(dataset):
    t = paper.TABLE1[paper.TABLE1["dataset"] == dataset].set_index("policy")
    assert list(t.index) == list(experiments.MAIN_POLICIES)
    assert t.loc["session-affinity", ["co2_rel", "quality_rel"]].tolist() == [1.0, 1.0]
    cr = t.loc["carbonrouter", "co2_rel"]
    assert t["co2_rel"].idxmin() == "carbonrouter"
    assert math.isnan(t.loc["carbonrouter", "saving_pct"])
    for policy, row in t.drop(index="carbonrouter").iterrows():
        lo, hi = _saving_bounds(cr, row["co2_rel"])
        assert lo - PCT_HALF_ULP <= row["saving_pct"] <= hi + PCT_HALF_ULP, (dataset, policy)


def test_table1_mean_saving_is_the_mean_of_the_datasets():
    by_ds = paper.TABLE1.pivot(index="policy", columns="dataset", values="saving_pct")
    mean = by_ds.mean(axis=1).reindex(paper.TABLE1_MEAN_SAVING.index)
    assert np.all(np.abs(mean - paper.TABLE1_MEAN_SAVING) <= PCT_HALF_ULP + EPS)


def test_table1_cache_oblivious_policies_are_slowest():
    # GAR† and FairCarbon recompute the most history: the longest P95 TTFTs of each dataset.
    for _, t in paper.TABLE1.groupby("dataset"):
        t = t.set_index("policy")["p95_ttft_s"]
        assert set(t.nlargest(2).index) == {"gar", "faircarbon"}


# --- Table 2 and Figure 5 -----------------------------------------------------------------------


def test_table2_carbonrouter_row_is_table1s():
    t1 = paper.TABLE1.set_index(["dataset", "policy"]).loc[("ShareChat", "carbonrouter")]
    t2 = paper.TABLE2.set_index("policy").loc["carbonrouter"]
    assert t2["co2_rel"] == t1["co2_rel"] and t2["p95_ttft_s"] == t1["p95_ttft_s"]


@pytest.mark.parametrize("policy", ["carbonrouter-no-gate", "carbonrouter-no-pricing"])
def test_table2_changes_follow_from_the_ratios_and_lie_in_their_cis(policy):
    t = paper.TABLE2.set_index("policy")
    row, ref = t.loc[policy], t.loc["carbonrouter"]
    for value, reference, change, half in (("co2_rel", "co2_rel", "dco2", RATIO_HALF_ULP),
                                           ("p95_ttft_s", "p95_ttft_s", "dttft", 0.005)):
        lo, hi = _change_bounds(row[value], ref[reference], half)
        assert lo - PCT_HALF_ULP <= row[f"{change}_pct"] <= hi + PCT_HALF_ULP, (policy, change)
        assert row[f"{change}_low_pct"] <= row[f"{change}_pct"] <= row[f"{change}_high_pct"]
    assert row["energy_rel"] > ref["energy_rel"]  # both ablations spend more energy


def test_figure5_overall_equals_table2():
    no_gate = paper.TABLE2.set_index("policy").loc["carbonrouter-no-gate", "dco2_pct"]
    f5 = paper.FIGURE5.set_index("group")
    assert f5.loc["all", "no_gate_dco2_pct"] == no_gate
    # the gate matters more, and blocks more, in long sessions
    assert f5.loc["> 30"].gt(f5.loc["all"]).all()


# --- Tables 3 and 4 ---------------------------------------------------------------------------


def test_tables3_and_4_default_cells_are_table1s_faircarbon_saving():
    d = paper.DEFAULTS
    t1 = paper.TABLE1.set_index(["dataset", "policy"]).loc[("ShareChat", "faircarbon"),
                                                          "saving_pct"]
    assert paper.TABLE3.loc[d["gamma"], d["kappa"]] == t1
    assert paper.TABLE4.loc[d["c"], d["beta_q"]] == t1


def test_table3_saving_falls_with_gamma_and_kappa():
    t = paper.TABLE3.to_numpy()
    assert (np.diff(t, axis=0) < 0).all() and (np.diff(t, axis=1) < 0).all()
    assert list(paper.TABLE3.index) == sorted(paper.TABLE3.index)
    assert list(paper.TABLE3.columns) == sorted(paper.TABLE3.columns)


def test_sensitivity_axes_are_the_papers_tables():
    assert set(paper.SENSITIVITY) == set(experiments.SENSITIVITY_AXES)
    for name, table in paper.SENSITIVITY.items():
        axes = experiments.SENSITIVITY_AXES[name]
        assert list(axes) == [table.index.name, table.columns.name]
        assert axes[table.index.name] == table.index.tolist()
        assert axes[table.columns.name] == table.columns.tolist()
        assert all(type(v) is float for values in axes.values() for v in values)
    assert experiments.SENSITIVITY_AXES == {
        "gamma_kappa": {"gamma": [0.025, 0.05, 0.1], "kappa": [5.0, 6.0, 8.0]},
        "c_beta": {"c": [0.5, 0.35, 0.25], "beta_q": [0.8, 0.85, 0.9]},
    }


# --- Figure 4 and the mechanisms ----------------------------------------------------------------


def test_figure4_saving_grows_with_session_length():
    saving = paper.figure4_values("saving_pct", "carbonrouter")
    assert len(saving) == len(paper.FIGURE4_GROUPS) and (np.diff(saving) > 0).all()
    fc = paper.figure4_values("switches_per_session", "faircarbon")
    assert fc[0] < fc[-1] and np.isnan(fc[1:3]).all()
    # > 30 turns: CarbonRouter switches less and keeps more cached than FairCarbon's range
    assert paper.figure4_values("switches_per_session", "carbonrouter")[-1] < fc[-1]
    ranges = paper.FIGURE4_RANGES.set_index(["policy", "metric"])
    assert (ranges["low"] <= ranges["high"]).all()
    fc_hit = ranges.loc[("faircarbon", "kv_hit_rate_tokens")]
    assert paper.figure4_values("kv_hit_rate_tokens", "carbonrouter")[-1] > fc_hit["high"]
    cr_energy = ranges.loc[("carbonrouter", "recompute_energy_per_query_mwh")]
    fc_energy = paper.figure4_values("recompute_energy_per_query_mwh", "faircarbon")
    assert cr_energy["high"] < fc_energy[0] < fc_energy[-1]
    groups = paper.FIGURE4.drop_duplicates("group").set_index("group")["more_than_turns"]
    assert [f"> {groups[g]}" for g in paper.FIGURE4_GROUPS] == list(paper.FIGURE4_GROUPS)
    with pytest.raises(KeyError):
        paper.figure4_values("kv_hit_rate_tokens", "gar")


def test_mechanisms_are_in_the_metrics_units():
    m = paper.MECHANISMS.set_index(["dataset", "policy", "metric"])["paper"]
    for (_, _, metric), v in m.items():
        if metric.startswith("share"):
            assert 0 <= v <= 1
    for ds in ("ShareChat", "ShareGPT"):
        assert (m[(ds, "carbonrouter", "share_history_recomputed")]
                < m[(ds, "faircarbon", "share_history_recomputed")])
    assert (m[("ShareChat", "carbonrouter", "switches_per_session")]
            < m[("ShareChat", "faircarbon", "switches_per_session")])
    assert (m[("ShareChat", "carbonrouter", "share_best_effort")]
            < m[("ShareChat", "faircarbon", "share_best_effort")])


def test_names_are_the_librarys():
    tables = (paper.TABLE1, paper.TABLE2, paper.MECHANISMS, paper.FIGURE4, paper.FIGURE4_RANGES)
    for t in tables:
        assert set(t["policy"]) <= set(POLICIES)
    assert set(paper.TABLE1_MEAN_SAVING.index) <= set(POLICIES)
    known = set(metrics.SUMMARY_METRICS) | {"saving_pct"}
    for t in (paper.MECHANISMS, paper.FIGURE4, paper.FIGURE4_RANGES):
        assert set(t["metric"]) <= known
    assert set(paper.TABLE1["dataset"]) == set(paper.MECHANISMS["dataset"]) == {"ShareChat",
                                                                                 "ShareGPT"}


# --- Section 2 --------------------------------------------------------------------------------


def test_section2_carbon_numbers_are_consistent():
    s = paper.SECTION2_CARBON
    (_, high), (_, low) = s["annual_max"], s["annual_min"]
    # 705 / 35 = 20.1: the printed 20.4× is within the rounding of the two printed extremes
    assert (high - 0.5) / (low + 0.5) <= s["annual_span_ratio"] <= (high + 0.5) / (low - 0.5)
    assert 1 < s["range_ratio_low"] < s["range_ratio_high"]
    # four regions, each cleanest between low and high of the time: the shares can sum to 1
    n = len(paper.REGIONS)
    lo, hi = s["cleanest_share_low"], s["cleanest_share_high"]
    assert (n - 1) * lo + hi <= 1 <= (n - 1) * hi + lo


def test_section2_history_and_miss_penalty():
    h = paper.SECTION2_HISTORY
    assert list(h.index) == [4096, 8192] and 1 > h[4096] > h[8192] > 0
    pen = paper.SECTION2_MISS_PENALTY
    assert (np.diff(pen["extra_co2_pct_median"]) > 0).all()
    assert (pen["history_low_tokens"].iloc[1:].to_numpy()
            == pen["history_high_tokens"].iloc[:-1].to_numpy()).all()
    assert paper.SECTION2_MISS_SETTING["model"] in profiles.MODELS
    assert paper.SECTION2_MISS_SETTING["gpu"] in profiles.GPUS


# --- The model's defaults are the paper's -----------------------------------------------------


def test_appendix_a_is_the_analytical_models_input():
    gpus = paper.APPENDIX_A_GPUS.set_index("gpu")
    assert tuple(gpus.index) == profiles.GPUS
    for name, spec in profiles.GPU_SPECS.items():
        assert dataclasses.asdict(spec) == {"name": name, **gpus.loc[name].to_dict()}
    models = paper.MODELS.set_index("model")
    assert tuple(models.index) == profiles.MODELS
    for name, spec in profiles.MODEL_SPECS.items():
        row = models.loc[name]
        assert (spec.params_b, spec.context_window) == (row["params_b"], row["context_window"])
        assert [spec.n_gpus(g) for g in profiles.GPUS] == [row[f"gpus_{g}"] for g in profiles.GPUS]
    assert carbon.REGION_SETS["paper"] == paper.REGIONS


def test_code_defaults_are_the_papers():
    d = paper.DEFAULTS
    assert dataclasses.asdict(profiles.ProfileConstants()) == {
        k: d[k] for k in ("f", "eta_ref", "alpha", "kappa", "gamma")}
    sim = SimulationConfig()
    for k in ("alpha", "kappa", "gamma", "beta_q", "d_ttft_s", "c", "ttl_s"):
        assert getattr(sim, k) == d[k], k
    assert sim.regions == paper.REGIONS
    assert ConstraintConfig() == ConstraintConfig(beta_q=d["beta_q"], d_ttft_s=d["d_ttft_s"])
    assert backend.BackendConfig(1, 1.0).ttl_s == d["ttl_s"]
    params = inspect.signature(setting.capacity_from_trace).parameters
    assert (params["c"].default, params["ttl_s"].default) == (d["c"], d["ttl_s"])
    assert inspect.signature(quality.feasible_models).parameters["beta"].default == d["beta_q"]
    for fn in (cost.break_even_ratio, cost.break_even_history, cost.cache_miss_penalty):
        params = inspect.signature(fn).parameters
        assert (params["gamma"].default, params["kappa"].default) == (d["gamma"], d["kappa"]), fn


# --- No notebook types the paper's results ----------------------------------------------------


def _significant_digits(x: float) -> int:
    return len(Decimal(repr(x)).normalize().as_tuple().digits)


def _paper_results() -> set[float]:
    """The paper's reported results with at least three significant digits (fewer would also
    catch plotting constants), other than the default parameters."""
    values: list[float] = []
    for t in (paper.TABLE1, paper.TABLE2, paper.FIGURE5, paper.MECHANISMS, paper.FIGURE4,
              paper.FIGURE4_RANGES):
        values += t.select_dtypes("number").drop(columns="more_than_turns", errors="ignore"
                                                 ).to_numpy().ravel().tolist()
    values += paper.TABLE3.to_numpy().ravel().tolist() + paper.TABLE4.to_numpy().ravel().tolist()
    values += paper.TABLE1_MEAN_SAVING.tolist() + paper.SECTION2_HISTORY.tolist()
    values += paper.SECTION2_MISS_PENALTY["extra_co2_pct_median"].tolist()
    for v in paper.SECTION2_CARBON.values():
        values.append(v[1] if isinstance(v, tuple) else v)
    found = {float(v) for v in values if isinstance(v, int | float) and math.isfinite(v)}
    return {v for v in found if _significant_digits(v) >= 3} - set(paper.DEFAULTS.values())


def test_no_notebook_types_a_paper_result():
    results = _paper_results()
    assert {0.403, 15.3, 0.463, 632.0, 2.25, 18.8} <= results  # the check sees them
    typed = []
    for path in notebooks.list_notebooks():
        nb = json.loads(path.read_text())
        for i, cell in enumerate(nb["cells"]):
            if cell["cell_type"] != "code" or "parameters" in cell["metadata"].get("tags", []):
                continue
            source = "".join(cell["source"])
            for tok in tokenize.generate_tokens(io.StringIO(source).readline):
                if tok.type == tokenize.NUMBER and float(tok.string.replace("_", "")) in results:
                    typed.append(f"{path.name} cell {i}: {tok.line.strip()}")
    listing = "\n".join(typed)
    assert not typed, f"paper numbers typed in notebooks (use carbonrouter_lib.paper):\n{listing}"


def test_tables_are_tidy_frames():
    for t in (paper.TABLE1, paper.TABLE2, paper.FIGURE5, paper.MECHANISMS, paper.FIGURE4,
              paper.SECTION2_MISS_PENALTY, paper.APPENDIX_A_GPUS, paper.MODELS):
        assert isinstance(t, pd.DataFrame) and t.index.equals(pd.RangeIndex(len(t)))
        assert not t.duplicated().any()
