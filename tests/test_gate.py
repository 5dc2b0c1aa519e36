"""The learned gate (docs/model.md §7.5): opportunities, two-branch labels, training, δ, storage.

Hand-made workloads and signals come from test_simulator (two regions A, B; 5-minute grid).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from test_simulator import AMPLE, CONFIG, DEPS, ci_grid, conversation, make_signal, make_table, run

from carbonrouter_lib import gate as gate_mod
from carbonrouter_lib import prepared
from carbonrouter_lib.gate import (
    FEATURES,
    GateTrainingConfig,
    LearnedGate,
    TwoBranchLabeler,
    collect_opportunities,
    train_gate,
)
from carbonrouter_lib.policies import CarbonRouter
from carbonrouter_lib.prepared import conversation_folds
from carbonrouter_lib.setting import SimulationConfig, backend_config
from carbonrouter_lib.simulator import simulate

H100_A = DEPS.index("Llama-3.1-70B", "H100", "A")
H100_B = DEPS.index("Llama-3.1-70B", "H100", "B")
E_IN = float(DEPS.e_in[H100_A])  # kWh per uncached input token, 70B on H100
GAMMA, KAPPA = CONFIG.gamma, CONFIG.kappa


def _scenario(turns: int) -> pd.DataFrame:
    """Turn 0: 20,000 new + 500 output tokens (70B only), on A/H100 (A is cleaner for the first
    5 minutes); then turns of 50 new + 100 output tokens, 600 s apart, when B is at 5 gCO2e/kWh:
    at turn 1 the cache-aware proposal moves to B/H100 (a switch opportunity)."""
    rest = [{"new": 50, "out": 100, "think": 600.0}] * (turns - 1)
    return make_table([(60.0, [{"new": 20000, "out": 500}, *rest])])


VALUES = ci_grid(100, [200, 5.0])


def _labels(table, values=VALUES, backend=AMPLE, pricing=True):
    signal = make_signal(values)
    labeler = TwoBranchLabeler(table, CONFIG, pricing=pricing)
    res = simulate(table, CarbonRouter(delta=0.0, gate=labeler, pricing=pricing), CONFIG,
                   signal, backend)
    return labeler.frame(), res


def test_two_branch_label_equals_the_hand_computed_difference():
    # Turn 1 (history 20,500): switch to B: 5·(20,550 + κ·100) = 5·21,150;
    #                          stay on A: 100·(50 + γ·20,500 + κ·100) = 100·1,675.
    # Turn 2 (history 20,650), routed by the same proposal rule in each branch:
    #   after switching, B/H100 holds all 20,650: 5·(50 + γ·20,650 + 600) = 5·1,682.5
    #     (A/H100 would cost 100·(50 + 150 recomputed + γ·20,500 + 600));
    #   after staying, A/H100 holds 20,650 (100·1,682.5) but B/H100 recomputing all of it is
    #     cheaper: 5·(20,700 + 600) = 5·21,300.
    # (in units of E_IN, kWh per token; γ = 0.05, κ = 6)
    assert (GAMMA, KAPPA) == (0.05, 6.0)
    frame, res = _labels(_scenario(3))
    assert len(frame) == 1
    row = frame.iloc[0]
    assert (row["session"], row["turn"], row["g"], row["b"]) == (0, 1, H100_B, H100_A)
    switch = 5 * (50 + 20500 + KAPPA * 100) + 5 * (50 + GAMMA * 20650 + KAPPA * 100)
    stay = 100 * (50 + GAMMA * 20500 + KAPPA * 100) + 5 * (20650 + 50 + KAPPA * 100)
    assert row["carbon_switch_g"] == pytest.approx(switch * E_IN, rel=1e-9)
    assert row["carbon_stay_g"] == pytest.approx(stay * E_IN, rel=1e-9)
    assert row["label"] == pytest.approx((switch - stay) * E_IN, rel=1e-9)
    # The labeler never blocks: the replay is the proposal policy's, and the switch branch's
    # current turn is exactly what the replay realized.
    rec = res.records
    assert rec["deployment"].tolist() == [H100_A, H100_B, H100_B]
    assert rec.loc[1, "carbon_g"] == pytest.approx(5 * (20550 + KAPPA * 100) * E_IN, rel=1e-9)


def test_label_of_a_last_turn_has_no_next_turn_term():
    frame, _ = _labels(_scenario(2))
    assert len(frame) == 1
    switch = 5 * (50 + 20500 + KAPPA * 100)
    stay = 100 * (50 + GAMMA * 20500 + KAPPA * 100)
    assert frame.iloc[0]["label"] == pytest.approx((switch - stay) * E_IN, rel=1e-9)


def _workload():
    a = [100, 300] * 24
    b = [300, 100] * 24
    table = make_table([conversation(10.0 + 41 * i, 6, new=300 + 400 * i, out=80, think=300.0,
                                     quality=(0.5,) * 5) for i in range(8)])
    return table, ci_grid(a, b)


def test_gate_is_called_exactly_at_switch_opportunities():
    table, values = _workload()
    calls = []

    def spy(ctx, cand, g, b):
        calls.append((ctx.session, ctx.turn, g, b))
        assert g != b and ctx.turn > 0 and cand.mask[b] and ctx.cached[b] > 0
        return 0.0  # never above δ = 0

    res = run(table, CarbonRouter(delta=0.0, gate=spy), values)
    rec = res.records
    opp = rec[rec["switch_opportunity"]]
    assert len(calls) > 0
    assert [(s, k) for s, k, _, _ in calls] == list(zip(opp["session"], opp["turn"], strict=True))
    assert [g for *_, g, _ in calls] == opp["deployment"].tolist()  # not blocked: moved to g
    # The labeler meets the same opportunities and leaves the routing alone.
    frame, lab = _labels(table, values)
    assert list(zip(frame["session"], frame["turn"], strict=True)) == [(s, k) for s, k, *_ in
                                                                       calls]
    no_gate = run(table, "carbonrouter-no-gate", values).records
    cols = ["deployment", "carbon_g", "dispatch_s", "cached_tokens"]
    pd.testing.assert_frame_equal(lab.records[cols], no_gate[cols])


def _synthetic_opportunities(n_sessions=300, per=6, seed=1):
    rng = np.random.default_rng(seed)
    n = n_sessions * per
    x = rng.normal(size=(n, len(FEATURES)))
    frame = pd.DataFrame(x, columns=list(FEATURES))
    frame.insert(0, "session", np.repeat(np.arange(n_sessions), per))
    # Staying pays when the carbon difference is small against the cached fraction.
    frame["label"] = (0.8 * frame["cached_frac_b"] - frame["est_carbon_diff"]
                      + 0.1 * rng.normal(size=n))
    return frame


def test_training_is_session_held_out_and_learns_the_label():
    frame = _synthetic_opportunities()
    training = GateTrainingConfig(folds=5, seed=3, n_estimators=60)
    gate = train_gate(frame, training)
    fold = conversation_folds(frame["session"].to_numpy(), 5, 3)
    rep = gate.report.set_index("fold")
    for f in range(5):
        v = (f + 1) % 5
        assert rep.loc[f, "validation_fold"] == v
        assert rep.loc[f, "n_train"] == int(((fold != f) & (fold != v)).sum())
        assert rep.loc[f, "n_test"] == int((fold == f).sum())
        assert rep.loc[f, "n_validation"] == int((fold == v).sum())
        # The model of fold f has not seen fold f: its error there is an honest test error,
        # and the signal is learnable (far better than predicting the mean).
        assert rep.loc[f, "test_mae"] < 0.5 * rep.loc[f, "test_mae_mean"]
        assert rep.loc[f, "test_r2"] > 0.6
    # Each session is routed by its own fold's model.
    for s in (0, 7, 123):
        assert gate.fold_of(s) == fold[frame["session"].to_numpy() == s][0]
    # Retraining on the fold-f sessions' labels alone cannot change the fold-f model: its
    # predictions do not depend on them.
    f0 = frame.copy()
    f0.loc[fold == 0, "label"] += 1000.0
    other = train_gate(f0, training)
    x = frame[list(FEATURES)].to_numpy()
    np.testing.assert_array_equal(gate.boosters[0].inplace_predict(x),
                                  other.boosters[0].inplace_predict(x))


def test_delta_maximizes_the_realized_validation_saving_and_includes_infinity():
    pred = np.array([3.0, 2.0, 1.0, 0.5])
    label = np.array([1.0, 2.0, -5.0, 4.0])
    # δ = 1.5 blocks the first two (saving 3); δ = 0 all four (saving 2); δ = ∞ none (0).
    assert gate_mod._choose_delta(pred, label, (0.0, 1.5, math.inf)) == 1.5
    assert gate_mod._choose_delta(pred, -np.abs(label), (0.0, 1.5, math.inf)) == math.inf
    with pytest.raises(ValueError, match="inf"):
        GateTrainingConfig(deltas=(0.0, 1.0))


def test_gate_round_trips_through_its_file(tmp_path):
    frame = _synthetic_opportunities(n_sessions=100)
    gate = train_gate(frame, GateTrainingConfig(n_estimators=20), meta={"key": "test"})
    path = gate.save(tmp_path / "g.json")
    back = LearnedGate.load(path)
    x = frame[list(FEATURES)].to_numpy()
    for a, b in zip(gate.boosters, back.boosters, strict=True):
        np.testing.assert_array_equal(a.inplace_predict(x), b.inplace_predict(x))
    assert back.deltas == gate.deltas and back.training == gate.training
    pd.testing.assert_frame_equal(back.report, gate.report, check_dtype=False)
    # +∞ survives the file (a δ of +∞ means "never block")
    inf_gate = LearnedGate(gate.boosters, [math.inf] * 5, gate.training,
                           gate.report.assign(delta=math.inf), {})
    back = LearnedGate.load(inf_gate.save(tmp_path / "inf.json"))
    assert back.deltas == [math.inf] * 5 and (back.report["delta"] == math.inf).all()
    # Same data and seed: the same models, byte for byte.
    again = train_gate(frame, GateTrainingConfig(n_estimators=20), meta={"key": "test"})
    assert [bytes(b.save_raw("json")) for b in again.boosters] == [
        bytes(b.save_raw("json")) for b in gate.boosters]
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="bad.json"):
        LearnedGate.load(tmp_path / "bad.json")


def test_delta_infinity_reproduces_carbonrouter_without_gate_exactly():
    table, values = _workload()
    signal = make_signal(values)
    trained = gate_mod.ensure_gate(None, CONFIG, table=table, signal=signal, backend=AMPLE,
                                   training=GateTrainingConfig(folds=3, n_estimators=10))
    ref = run(table, "carbonrouter-no-gate", values).records
    for policy in (CarbonRouter(delta=math.inf, gate=trained),
                   CarbonRouter(delta=0.0, gate=LearnedGate(trained.boosters, [math.inf] * 3,
                                                            trained.training, trained.report,
                                                            {}))):
        rec = run(table, policy, values).records
        assert not rec["gate_blocked"].any()
        pd.testing.assert_frame_equal(rec.drop(columns="policy"), ref.drop(columns="policy"))


def test_learned_gate_blocks_only_at_opportunities():
    table, values = _workload()
    # A gate whose every model predicts +1 gCO2e with δ = 0.5: it blocks every opportunity.
    frame, _ = _labels(table, values)
    const = frame.assign(label=1.0)
    gate = train_gate(const, GateTrainingConfig(folds=3, n_estimators=5,
                                                deltas=(0.5, math.inf)))
    assert all(d == 0.5 for d in gate.deltas)
    rec = run(table, CarbonRouter(delta=0.0, gate=gate), values).records
    assert rec["gate_blocked"].any()
    assert not (rec["gate_blocked"] & ~rec["switch_opportunity"]).any()
    assert (rec.loc[rec["gate_blocked"], "switched"] == False).all()  # noqa: E712


def test_build_policy_trains_the_learned_gate_and_is_deterministic():
    table, values = _workload()
    a = run(table, "carbonrouter", values).records  # build_policy, then simulate
    b = run(table, "carbonrouter", values).records
    pd.testing.assert_frame_equal(a, b)
    assert (a["policy"] == "carbonrouter").all()


def test_simulate_refuses_a_policy_whose_gate_is_not_built():
    table, values = _workload()
    with pytest.raises(ValueError, match="not ready to route.*build_policy"):
        simulate(table, "carbonrouter", CONFIG, make_signal(values), AMPLE)


def test_ensure_gate_caches_by_setting(tmp_path, monkeypatch):
    from carbonrouter_lib import prepared

    table, values = _workload()
    signal = make_signal(values)

    class Wl:  # the part of a WorkloadConfig that ensure_gate uses
        def key(self):
            return "wl-test"

        def to_dict(self):
            return {"name": "test"}

    calls = []
    real = gate_mod.collect_opportunities

    def counting(*args, **kw):
        calls.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(gate_mod, "collect_opportunities", counting)
    monkeypatch.setattr(prepared, "prepare_workload", lambda cfg: table)
    training = GateTrainingConfig(folds=3, n_estimators=5)
    g1 = gate_mod.ensure_gate(Wl(), CONFIG, True, training, signal=signal, backend=AMPLE,
                              cache_dir=tmp_path)
    g2 = gate_mod.ensure_gate(Wl(), CONFIG, True, training, signal=signal, backend=AMPLE,
                              cache_dir=tmp_path)
    assert len(calls) == 1 and g1.meta["key"] == g2.meta["key"]
    assert gate_mod.gate_path(Wl(), CONFIG, True, training, tmp_path).is_file()
    # Another setting (no pricing) is another gate.
    assert gate_mod.gate_path(Wl(), CONFIG, False, training, tmp_path) != gate_mod.gate_path(
        Wl(), CONFIG, True, training, tmp_path)


def test_collect_opportunities_matches_the_labeler():
    table, values = _workload()
    frame = collect_opportunities(table, CONFIG, make_signal(values), AMPLE)
    ref, _ = _labels(table, values)
    pd.testing.assert_frame_equal(frame, ref)
    assert set(FEATURES) <= set(frame.columns) and frame[list(FEATURES)].notna().all().all()


def test_oracle_gate_stays_exactly_when_the_two_turn_label_says_so():
    # B is barely cleaner enough at turn 1 (7.5 vs 100 gCO2e/kWh) and dirty again at turn 2
    # (1,000): switching saves 100·1,675 − 7.5·21,150 = 8,875 now, but turn 2 then returns to A
    # with a stale cache (150 tokens recomputed: 100·1,825 instead of 100·1,682.5 = 14,250 more).
    values = ci_grid(100, [200, 200, 7.5, 7.5, 1000])
    table = _scenario(3)
    no_gate = run(table, "carbonrouter-no-gate", values).records
    assert no_gate["deployment"].tolist() == [H100_A, H100_B, H100_A]  # the proposal moves
    frame, _ = _labels(table, values)
    switch = 7.5 * (20550 + KAPPA * 100) + 100 * (50 + 150 + GAMMA * 20500 + KAPPA * 100)
    stay = 100 * (50 + GAMMA * 20500 + KAPPA * 100) + 100 * (50 + GAMMA * 20650 + KAPPA * 100)
    # (turn 2 of the no-gate replay is an opportunity too: back to A, leaving B's cache)
    assert frame["turn"].tolist() == [1, 2]
    assert frame["label"].iloc[0] == pytest.approx((switch - stay) * E_IN, rel=1e-9)
    assert switch > stay
    oracle = run(table, "carbonrouter-oracle-gate", values).records
    assert oracle["deployment"].tolist() == [H100_A, H100_A, H100_A]
    assert oracle["gate_blocked"].tolist() == [False, True, False]
    assert oracle["carbon_g"].sum() == pytest.approx(
        no_gate["carbon_g"].sum() - (switch - stay) * E_IN, rel=1e-9)
    # Where switching pays over both turns (B stays clean), the oracle lets it happen.
    rec = run(table, "carbonrouter-oracle-gate", VALUES).records
    assert not rec["gate_blocked"].any() and rec["deployment"].tolist()[1] == H100_B


def test_array_forest_predicts_exactly_as_xgboost():
    frame = _synthetic_opportunities(n_sessions=200)
    gate = train_gate(frame, GateTrainingConfig(n_estimators=80, max_depth=6))
    rng = np.random.default_rng(5)
    x = rng.normal(size=(500, len(FEATURES))) * 2
    x[rng.random(x.shape) < 0.1] = np.nan  # missing values take the default direction
    x[:50] = frame[list(FEATURES)].to_numpy()[:50]  # and values seen in training
    for f, booster in enumerate(gate.boosters):
        ref = booster.inplace_predict(x)
        ours = np.array([gate.predict(f, row) for row in x])
        np.testing.assert_array_equal(ours, ref.astype(np.float64))


def test_folds_are_by_conversation_so_no_model_sees_a_copy_of_what_it_routes():
    # A resampled replay: every conversation three times (copies in different sessions).
    frame = _synthetic_opportunities(n_sessions=240)
    frame.insert(1, "conversation", frame["session"] % 80)
    training = GateTrainingConfig(folds=5, seed=3, n_estimators=20)
    gate = train_gate(frame, training)
    fold = conversation_folds(frame["conversation"].to_numpy(), 5, 3)
    per_conv = pd.Series(fold).groupby(frame["conversation"].to_numpy()).nunique()
    assert (per_conv == 1).all()  # all copies of a conversation in one fold
    for c in (0, 17, 79):
        assert gate.fold_of(c) == fold[frame["conversation"].to_numpy() == c][0]
    # Changing the labels of one fold's conversations (every copy) cannot change its model.
    f0 = frame.copy()
    f0.loc[fold == 0, "label"] += 1000.0
    x = frame[list(FEATURES)].to_numpy()
    np.testing.assert_array_equal(gate.boosters[0].inplace_predict(x),
                                  train_gate(f0, training).boosters[0].inplace_predict(x))


def test_replay_at_scale_routes_each_copy_with_its_conversations_fold():
    cfg = prepared.WorkloadConfig(dataset="sharegpt", max_conversations=60, seed=4)
    table = prepared.prepare_workload(prepared.with_copies(cfg, 3), use_cache=False)
    sim = SimulationConfig(regions=("GB", "US-CAL-CISO"))
    opps = collect_opportunities(table, sim, sim.signal(), backend_config(table, sim))
    codes = prepared.conversation_codes(table)
    np.testing.assert_array_equal(opps["conversation"].to_numpy(), codes[opps["row"].to_numpy()])
    assert opps["conversation"].nunique() < opps["session"].nunique()
