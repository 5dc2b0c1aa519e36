"""Tables 1–2 and the ablations by session length, on a small hand-made replay (values recomputed
here from the records with plain pandas)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from test_simulator import ci_grid, conversation, make_table, run

from carbonrouter_lib import experiments, metrics
from carbonrouter_lib.policies import CarbonRouter


def _records():
    a, b = [100, 300] * 24, [300, 100] * 24
    values = ci_grid(a, b)
    table = make_table([conversation(10.0 + 41 * i, 3 + 4 * (i % 3), new=300 + 400 * i, out=80,
                                     think=300.0, quality=(0.5,) * 5) for i in range(9)])
    blocker = CarbonRouter(delta=0.0, gate=lambda ctx, cand, g, b: float(ctx.turn % 2))
    recs = {"session-affinity": run(table, "session-affinity", values).records,
            "carbonrouter": run(table, blocker, values).records,
            "carbonrouter-no-gate": run(table, "carbonrouter-no-gate", values).records,
            "carbonrouter-no-pricing": run(table, CarbonRouter(pricing=False, gate=None),
                                           values).records}
    return recs


def test_table2_values_follow_from_the_records():
    recs = _records()
    assert recs["carbonrouter"]["gate_blocked"].any()  # the scenario exercises the gate
    t = experiments.table2(recs, n_boot=200).set_index("policy")
    assert list(t.index) == list(experiments.ABLATIONS)
    co2 = {p: r["carbon_g"].sum() for p, r in recs.items()}
    sessions = recs["carbonrouter"]["session"].nunique()
    for p in experiments.ABLATIONS:
        r = recs[p]
        assert t.loc[p, "co2_rel"] == pytest.approx(co2[p] / co2["session-affinity"], rel=1e-12)
        assert t.loc[p, "p95_ttft_s"] == np.percentile(r["ttft_s"].dropna(), 95,
                                                       method="inverted_cdf")
        assert t.loc[p, "gate_blocked_per_session"] == r["gate_blocked"].sum() / sessions
    for p in experiments.ABLATIONS[1:]:
        assert t.loc[p, "dco2_pct"] == pytest.approx(100 * (co2[p] / co2["carbonrouter"] - 1),
                                                     rel=1e-9)
        assert t.loc[p, "dco2_low_pct"] <= t.loc[p, "dco2_pct"] <= t.loc[p, "dco2_high_pct"]
    assert np.isnan(t.loc["carbonrouter", "dco2_pct"])
    with pytest.raises(KeyError, match="session-affinity"):
        experiments.table2({p: recs[p] for p in experiments.ABLATIONS})


def test_ablations_by_session_length_use_each_group_own_sessions():
    recs = _records()
    f = experiments.ablation_by_session_length(recs, thresholds=(3, 6), n_boot=100)
    n_turns = recs["carbonrouter"].groupby("session")["n_turns"].first()
    for group, t in (("all", 0), ("> 3", 3), ("> 6", 6)):
        rows = f[f["group"] == group].set_index("policy")
        ids = n_turns.index[n_turns > t]
        assert (rows["n_sessions"] == len(ids)).all()
        sub = {p: recs[p][recs[p]["session"].isin(ids)] for p in experiments.ABLATIONS}
        want = 100 * (sub["carbonrouter-no-gate"]["carbon_g"].sum()
                      / sub["carbonrouter"]["carbon_g"].sum() - 1)
        assert rows.loc["carbonrouter-no-gate", "dco2_pct"] == pytest.approx(want, rel=1e-9)
        assert rows.loc["carbonrouter", "gate_blocked_per_session"] == pytest.approx(
            sub["carbonrouter"]["gate_blocked"].sum() / len(ids))


def test_table1_from_run_summaries_equals_table1_from_records():
    recs = _records()
    summ = {p: metrics.RunSummary.from_records(r) for p, r in recs.items()}
    assert list(metrics.summarize(recs["carbonrouter"]).index) == list(metrics.SUMMARY_METRICS)
    a = experiments.table1(recs, n_boot=300, seed=4).set_index("policy")
    b = experiments.table1(summ, n_boot=300, seed=4).set_index("policy")
    pd.testing.assert_frame_equal(a, b, rtol=1e-12, check_dtype=False)
    m1, m2 = experiments.mechanisms(recs), experiments.mechanisms(summ)
    pd.testing.assert_frame_equal(m1, m2, check_dtype=False)


# ---------------------------------------------------------------------------------------------
# One's own data end to end: a made-up region pair and a small trace (tests/data/byo)


BYO = __import__("pathlib").Path(__file__).parent / "data" / "byo"


@pytest.fixture(scope="module")
def byo():
    from carbonrouter_lib import prepared
    from carbonrouter_lib.carbon import CarbonSignal

    signal = CarbonSignal.from_csv({"Solaria": BYO / "solaria_hourly.csv",
                                    "Ventosa": BYO / "ventosa_15min.csv"})
    return signal, prepared.from_turns(BYO / "chat_trace.jsonl")


def test_made_up_regions_and_trace_through_run_policies_and_table1(byo):
    from carbonrouter_lib.setting import SimulationConfig
    from carbonrouter_lib.simulator import simulate

    signal, table = byo
    recs = experiments.run_policies(table, signal=signal)
    assert list(recs) == list(experiments.MAIN_POLICIES)
    for r in recs.values():
        assert len(r) == len(table) and set(r["region"]) <= {"Solaria", "Ventosa"}
        assert not r["rejected"].any() and r["carbon_g"].gt(0).all()
    # the same as one replay per policy with the signal's regions
    cfg = SimulationConfig(regions=("Solaria", "Ventosa"))
    direct = simulate(table, "faircarbon", cfg, signal)
    pd.testing.assert_frame_equal(recs["faircarbon"], direct.records)
    t1 = experiments.table1(recs, n_boot=200).set_index("policy")
    assert t1.loc["session-affinity", "co2_rel"] == 1.0
    co2 = {p: r["carbon_g"].sum() for p, r in recs.items()}
    for p in recs:
        assert t1.loc[p, "co2_rel"] == pytest.approx(co2[p] / co2["session-affinity"])
    # carbon-aware routing between the two made-up grids saves carbon on this trace
    assert t1.loc["faircarbon", "co2_rel"] < 0.9


def test_run_policies_with_measured_profiles_and_a_policy_by_import_name(byo, monkeypatch):
    from carbonrouter_lib.setting import SimulationConfig
    from carbonrouter_lib.simulator import simulate

    monkeypatch.syspath_prepend(str(BYO))
    signal, table = byo
    profiles = BYO / "profiles_l4_h200.csv"
    names = ["session-affinity", "my_policies:LowestEnergy", "carbonrouter"]
    recs = experiments.run_policies(table, policies=names, signal=signal, profiles=profiles)
    for r in recs.values():
        assert set(r["gpu"]) <= {"L4", "H200"}
    assert (recs["my_policies:LowestEnergy"]["policy"] == "lowest-energy").all()
    cfg = SimulationConfig(regions=signal.regions, profiles=str(profiles))
    direct = simulate(table, "my_policies:LowestEnergy", cfg, signal)
    pd.testing.assert_frame_equal(recs["my_policies:LowestEnergy"], direct.records)
    t1 = experiments.table1(recs, n_boot=100).set_index("policy")
    assert set(t1.index) == set(names)
    # the analytical profiles give other energies on the same replay
    analytical = experiments.run_policies(table, policies=["session-affinity"], signal=signal)
    assert (analytical["session-affinity"]["energy_kwh"].sum()
            != recs["session-affinity"]["energy_kwh"].sum())


def test_readme_own_data_example_runs_as_written():
    """The README's "Your own data" example: at most 10 lines, and it runs from the repository
    root as written (a made-up region pair and trace through run_policies to Table 1)."""
    import re
    import subprocess
    import sys

    root = BYO.parent.parent.parent
    text = (root / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Your own data"):]
    section = section[:section.index("\n## ", 3)]
    example = re.findall(r"```python\n(.*?)```", section, re.S)[0]
    assert len([ln for ln in example.splitlines() if ln.strip()]) <= 10
    assert "run_policies" in example and "table1" in example
    done = subprocess.run([sys.executable, "-c", example], cwd=root, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "faircarbon" in done.stdout and "carbonrouter" in done.stdout
