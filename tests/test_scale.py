"""The scale study's tables: convergence, the default's rule, the claims (hand-built tables), and
the grid of runs."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd
import pytest

from carbonrouter_lib import prepared, scale
from carbonrouter_lib.paper import TABLE1
from carbonrouter_lib.setting import SimulationConfig

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


def test_convergence_steps_along_the_ladder_only():
    # a point past the ladder (136 copies) is in the table but not a doubling step: a tiny
    # change there must not make a still-moving quantity look converged
    moving = dict(SETTLING, **{"carbon-affinity": [0.76, 0.80, 0.82, 0.84, 0.86]})
    t = synthetic(moving)
    beyond = t[t.copies == 16].assign(copies=float(scale.BEYOND[0]), peak_sessions=500.0)
    conv = scale.convergence(pd.concat([t, beyond], ignore_index=True))
    ca = conv.set_index(["policy", "quantity"]).loc[("carbon-affinity", "co2_rel")]
    assert math.isnan(ca["converged_from_peak"]) and ca["max_peak"] == 480


def test_run_grid_runs_the_largest_runs_one_at_a_time(monkeypatch):
    wl = prepared.WorkloadConfig(dataset="sharegpt", max_conversations=30)
    grid = scale.scale_specs({"sharegpt": wl}, ["paper"], copies=(1, 64), memory=["paper"],
                             policies=["faircarbon"])
    calls = []

    def fake_sweep(specs, client=None, n_workers=None, serial=False):
        calls.append(([s.key() for s in specs], serial))
        out = scale.sweep.SweepResults({s.key(): s.key() for s in specs})
        out.specs, out.n_computed = {s.key(): s for s in specs}, len(specs)
        return out

    monkeypatch.setattr(scale.sweep, "run_sweep", fake_sweep)
    monkeypatch.setattr(scale.prepared, "prepare_workload", lambda w: range(100_000))
    # 100K queries per copy × 1 kB: 0.09 GiB at 1 copy, 6 GiB at 64; 8 GiB on 2 workers
    assert scale.BYTES_PER_QUERY == 1_000
    res = scale.run_grid(grid, {"sharegpt": wl}, n_workers=2, memory_gib=8)
    small, big = grid[grid.copies == 1]["key"].tolist(), grid[grid.copies == 64]["key"].tolist()
    assert calls == [(small, False), (big, True)]
    assert set(res) == set(grid["key"]) and res.n_computed == 2


def _both(values_sg, values_mc, peaks_mc=(10, 18, 30, 52, 90)):
    sg = synthetic(values_sg)
    mc = synthetic(values_mc, peaks=peaks_mc).assign(dataset="mooncake")
    return pd.concat([sg, mc], ignore_index=True)


def test_default_is_where_the_conclusions_stop_changing():
    # ShareGPT: FC's rank changes between the second and third scale (above SA: 1.00 vs 1.052),
    # then the ranking and the significant signs stay → stable from P = 130.
    sg = dict(SETTLING, faircarbon=[0.84, 0.99, 1.052, 1.056, 1.06])
    chosen = scale.choose_default(_both(sg, SETTLING)).set_index("dataset")
    assert chosen.loc["sharegpt", "stable_peak"] == 130
    assert chosen.loc["sharegpt", "stable_copies"] == 4.0
    # every quantity within 1 pp of the top from the third scale on (strict rule)
    assert chosen.loc["sharegpt", "strict_peak"] == 130
    # Mooncake: CR below CA at the first two scales only → stable from its third (P = 30)
    assert chosen.loc["mooncake", "stable_peak"] == 30
    assert chosen.loc["default", "default_peak"] == 130
    assert chosen.loc["default", "rule"] == "stable conclusions"
    slow = scale.choose_default(_both(sg, SETTLING), mooncake_peak=87).set_index("dataset")
    assert slow.loc["default", "default_peak"] == 90
    assert slow.loc["default", "rule"] == "Mooncake start rate"
    # still moving at the top: strict is NaN (not converged), stable is still defined
    moving = dict(sg, gar=[1.0, 1.1, 1.2, 1.3, 1.4])
    out = scale.choose_default(_both(moving, SETTLING)).set_index("dataset")
    assert math.isnan(out.loc["sharegpt", "strict_peak"])
    assert out.loc["sharegpt", "max_change_last_doubling_pp"] == pytest.approx(10.0)


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


def test_claims_at_one_setting_follow_from_the_records():
    from test_simulator import ci_grid, conversation, make_table, run

    values = ci_grid([100, 300] * 24, [300, 100] * 24)
    table = make_table([conversation(10.0 + 41 * i, 3 + 4 * (i % 3), new=300 + 400 * i, out=80,
                                     think=300.0, quality=(0.5,) * 5) for i in range(9)])
    runs = {p: run(table, p, values).records
            for p in ["session-affinity", "carbon-affinity", "gar", "faircarbon",
                      "carbonrouter-no-gate"]}
    # a gated CarbonRouter: the oracle gate (no training needed on a hand-built workload)
    runs["carbonrouter"] = run(table, "carbonrouter-oracle-gate", values).records
    out = scale.claims_at(runs, thresholds=(3, 6), n_boot=200).set_index("claim")
    co2 = {p: r["carbon_g"].sum() for p, r in runs.items() if p != "carbonrouter-no-gate"}
    lowest = min(co2, key=co2.get)
    assert out.loc["CarbonRouter has the lowest CO2", "verdict"] == (
        "holds" if lowest == "carbonrouter" else "fails")
    fc = 100 * (1 - co2["carbonrouter"] / co2["faircarbon"])
    assert out.loc["saving over faircarbon (%)", "ours"].startswith(f"{fc:.1f} [")
    assert out.loc["P95 TTFT: SA ≤ CA ≤ CR ≤ FC ≤ GAR†", "verdict"] in ("holds", "fails")
    assert set(out["verdict"]) <= {"holds", "fails"} and len(out) == 8


EVIDENCE = Path(__file__).resolve().parents[1] / "docs" / "evidence"


def test_the_library_default_follows_from_the_committed_study():
    # The full study (notebook 04b, grid="full") is hours of replay; its table is committed, and
    # the default must be what choose_default makes of it, by the rule stated there.
    table = pd.read_csv(EVIDENCE / "scale_full.csv")
    recorded = pd.read_csv(EVIDENCE / "scale_full_default.csv").set_index("dataset")
    stable = {ds: recorded.loc[ds, "stable_peak"] for ds in ("sharegpt", "mooncake")}
    # the Mooncake trace at its own start rate: P of that replay (a 2M-query table), recorded
    mooncake_peak = float(recorded.loc["default", "mooncake_peak"])
    assert mooncake_peak != recorded.loc["default", "default_peak"]  # the input, not the answer
    chosen = scale.choose_default(table, mooncake_peak=mooncake_peak).set_index("dataset")
    assert {ds: chosen.loc[ds, "stable_peak"] for ds in stable} == stable
    assert chosen.loc["default", "default_peak"] == scale.DEFAULT_PEAK
    assert chosen.loc["default", "rule"] == "Mooncake start rate"
    # …because ShareGPT's conclusions settle only from P = 1,481 under the paper's rule, above the
    # Mooncake trace's own rate
    assert chosen.loc["sharegpt", "stable_peak"] > mooncake_peak
    assert chosen.loc["sharegpt", "largest_peak"] >= 3000  # the ladder reaches past P = 3,000
    # …for both workloads in both region sets, under every memory rule
    reach = table.groupby(["dataset", "region_set", "memory"])["peak_sessions"].max()
    assert len(reach) == 12 and (reach >= 3000).all(), reach[reach < 3000]
    # the study is the grid it says it is: every run of GRIDS["full"], every policy
    runs = table.groupby(["dataset", "region_set", "memory"])["copies"].agg(set)
    for ds, region_sets, copies, memories in scale.GRIDS["full"]:
        for rs in region_sets:
            for mem in memories:
                assert set(copies) <= runs[(ds, rs, mem)], (ds, rs, mem)
    assert table.groupby(["dataset", "region_set", "memory", "copies"])["policy"].nunique().eq(
        len(scale.SCALE_POLICIES)).all()


def _numbers(cell: str) -> list[float]:
    return [float(x.replace("−", "-")) for x in re.findall(r"[+−-]?\d+\.\d+", cell)]


def test_the_readme_scale_table_is_the_committed_study():
    # The README types the study's numbers; they must be what the study computed (ShareGPT,
    # paper regions), and the paper's row what paper.TABLE1 holds.
    t = pd.read_csv(EVIDENCE / "scale_full.csv")
    t = t[(t.dataset == "sharegpt") & (t.region_set == "paper")].set_index(
        ["memory", "peak_sessions", "policy"])
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    rows = [line.split("|")[1:-1] for line in readme.splitlines()
            if re.match(r"^\| (\d[\d,]*|paper) \|", line)]
    assert [r[0].strip() for r in rows] == ["40", "126", "407", "771", "1,481", "2,880", "3,066",
                                            "paper"]
    order = ["carbon-affinity", "gar", "faircarbon", "carbonrouter-no-gate"]
    for cells in rows[:-1]:
        p = float(cells[0].replace(",", ""))
        for memory, ratios, saving in (("paper", 1, 2), ("paper x10", 3, 4), ("hardware", None, 5)):
            if ratios is not None:
                expected = [round(t.loc[(memory, p, q), "co2_rel"], 3) for q in order]
                assert _numbers(cells[ratios]) == pytest.approx(expected, abs=1e-9), (p, memory)
            if (memory, p, "carbon-affinity") not in t.index:
                assert cells[saving].strip() == "—"
                continue
            r = t.loc[(memory, p, "carbon-affinity")]
            expected = [round(r[c], 1) for c in ("saving_pct", "ci_low_pct", "ci_high_pct")]
            assert _numbers(cells[saving]) == pytest.approx(expected, abs=1e-9), (p, memory)
    sg = TABLE1[TABLE1["dataset"] == "ShareGPT"].set_index("policy")
    assert _numbers(rows[-1][1]) == [sg.loc[q, "co2_rel"] for q in
                                     ["carbon-affinity", "gar", "faircarbon", "carbonrouter"]]
    assert _numbers(rows[-1][2]) == [sg.loc["carbon-affinity", "saving_pct"]]
