"""The horizon router: one-turn reduction to CarbonRouter's proposal, hand-built scenarios where
it stays (the greedy proposal switches) and where it leaves a cache (the greedy proposal stays),
no reading of future intensities, and a survival model fitted only on training conversations."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from test_simulator import AMPLE, CONFIG, T0, make_table

from carbonrouter_lib import prepared, setting, simulator
from carbonrouter_lib.carbon import CarbonSignal
from carbonrouter_lib.policies import HorizonModel, HorizonRouter, fit_horizon_model, make_policy
from carbonrouter_lib.prepared import conversation_folds
from carbonrouter_lib.profiles import MODELS

DAY = 288  # 5-minute rows per day
DECISION_COLUMNS = ["session", "turn", "deployment", "dispatch_s", "completion_s",
                    "cached_tokens", "energy_kwh", "carbon_g", "switched"]


def signal_from(a: np.ndarray, b: np.ndarray) -> CarbonSignal:
    """Regions A, B on the 5-minute grid from the day before T0 (so yesterday exists)."""
    start = pd.Timestamp(T0 - 86_400, unit="s", tz="UTC")
    idx = pd.date_range(start, periods=len(a), freq="5min")
    return CarbonSignal(pd.DataFrame({"A": a, "B": b}, index=idx))


def certain_model(horizon: int = 16, gap_s: float = 300.0) -> HorizonModel:
    """Sessions surely continue, caches survive, the 70B stays feasible; later turns of 100 new
    and 5,000 output tokens, one grid step apart."""
    n_m = len(MODELS)
    return HorizonModel(folds=2, seed=0, horizon=horizon,
                        survival=np.ones((2, 40, horizon)), new_tokens=np.full((2, n_m), 100.0),
                        out_tokens=np.full((2, n_m), 5000.0), stay_feasible=np.ones((2, n_m)),
                        gap_s=np.full(2, gap_s), keep_prior=np.ones(2), beta_q=0.85)


def two_turns(think: float) -> pd.DataFrame:
    # turn 0: a long prompt (20,000 tokens, 5,000 out) makes a large cache; turn 1: 100 new
    return make_table([(0.0, [{"new": 20_000, "out": 5_000},
                              {"new": 100, "out": 5_000, "think": think}])])


def replay(table, policy, signal, config=CONFIG):
    return simulator.simulate(table, policy, config, signal=signal, backend=AMPLE).records


def test_a_zero_horizon_is_carbonrouters_proposal():
    cfg = prepared.WorkloadConfig(dataset="mooncake", max_conversations=150, seed=2)
    table = prepared.prepare_workload(prepared.with_copies(cfg, 6), use_cache=False)
    sim = setting.SimulationConfig(regions=("GB", "BE"))
    a = simulator.simulate(table, "carbonrouter-no-gate", sim).records
    b = simulator.simulate(table, HorizonRouter(horizon=0), sim).records
    pd.testing.assert_frame_equal(a[DECISION_COLUMNS], b[DECISION_COLUMNS])
    assert a["switched"].any()  # the workload exercises switches


def test_stays_where_the_greedy_proposal_switches():
    # B is cheaper only for the 5 minutes of turn 1, on both days (a daily pattern): A 100
    # all the time. Greedy: 50·E(miss) < 100·E(hit) → switch. The same-hour-yesterday forecast
    # sees B back at 300 for every later turn: stay on A, where the cache is.
    rows = 2 * DAY
    a = np.full(rows, 100.0)
    b = np.full(rows, 300.0)
    table = two_turns(3600.0)
    # where turn 1 is dispatched (turn 0 runs on A whatever B does later)
    first = replay(table, "carbonrouter-no-gate", signal_from(a, b))
    t1_row = int((first.loc[1, "dispatch_s"] - (T0 - 86_400)) // 300)
    b[[t1_row - DAY, t1_row]] = 50.0
    sig = signal_from(a, b)
    greedy = replay(table, "carbonrouter-no-gate", sig)
    assert greedy.loc[0, "region"] == "A" and greedy.loc[1, "region"] == "B"
    horizon = HorizonRouter(forecast="same-hour-yesterday", continuation=1.0,
                            model=certain_model())
    h = replay(table, horizon, sig)
    assert h.loc[1, "region"] == "A" and not h.loc[1, "switched"]
    # persistence believes B stays at 50: it switches like the greedy proposal
    p = replay(table, HorizonRouter(forecast="persistence", continuation=1.0,
                                    model=certain_model()), sig)
    assert p.loc[1, "region"] == "B"


def test_leaves_a_cache_when_the_grid_stays_dirty_for_hours():
    # A 300, B 250 all the time. Greedy: 250·E(miss) > 300·E(hit) → stay on A's cache. Over the
    # rest of the session the 50 gCO2e/kWh of every later turn outweighs one recomputation.
    rows = 2 * DAY
    table = two_turns(600.0)
    sig = signal_from(np.full(rows, 300.0), np.full(rows, 250.0))
    greedy = replay(table, "carbonrouter-no-gate", sig)
    assert list(greedy["region"]) == ["B", "B"]  # turn 0 goes to B: no cache anywhere yet
    # make A the cached place: turn 0 when A is cleaner, turn 1 when B is
    a = np.full(rows, 300.0)
    a[:DAY + 1] = 100.0  # A clean for turn 0 (T0), dirty from T0 + 5 min for hours
    sig = signal_from(a, np.full(rows, 250.0))
    greedy = replay(table, "carbonrouter-no-gate", sig)
    assert list(greedy["region"]) == ["A", "A"]  # the greedy proposal keeps the cache
    h = replay(table, HorizonRouter(forecast="persistence", continuation=1.0,
                                    model=certain_model()), sig)
    assert list(h["region"]) == ["A", "B"] and h.loc[1, "switched"]
    # …and one future turn is not enough to pay for the recomputation
    short = replay(table, HorizonRouter(horizon=1, forecast="persistence", continuation=1.0,
                                        model=certain_model()), sig)
    assert list(short["region"]) == ["A", "A"]


@pytest.mark.parametrize("forecast", ["persistence", "same-hour-yesterday", "blend"])
def test_decisions_do_not_depend_on_future_intensities(forecast):
    cfg = prepared.WorkloadConfig(dataset="sharegpt", max_conversations=120, seed=1)
    table = prepared.prepare_workload(prepared.with_copies(cfg, 4), use_cache=False)
    sim = setting.SimulationConfig(regions=("GB", "BE"))
    signal = sim.signal()
    cut = T0 + 3 * 86_400  # change every intensity from the fourth day on
    frame = signal.frame.copy()
    later = frame.index >= pd.Timestamp(cut, unit="s", tz="UTC")
    frame.loc[later] = np.random.default_rng(5).uniform(20, 600, size=frame.loc[later].shape)
    other = CarbonSignal(frame, end=signal.end)
    model = fit_horizon_model(table, horizon=16)
    a = simulator.simulate(table, HorizonRouter(forecast=forecast, model=model), sim,
                           signal=signal).records
    b = simulator.simulate(table, HorizonRouter(forecast=forecast, model=model), sim,
                           signal=other).records
    # every decision made before the cut is the same
    before = a["dispatch_s"] < cut
    assert before.sum() > 100 and (~before).sum() > 100
    pd.testing.assert_frame_equal(a.loc[before, DECISION_COLUMNS],
                                  b.loc[before, DECISION_COLUMNS])
    assert not a.loc[~before, "carbon_g"].equals(b.loc[~before, "carbon_g"])


def test_the_survival_model_learns_only_from_other_conversations():
    cfg = prepared.WorkloadConfig(dataset="sharegpt", max_conversations=200, seed=3)
    table = prepared.prepare_workload(prepared.with_copies(cfg, 3), use_cache=False)
    model = fit_horizon_model(table, horizon=8, folds=4, seed=7)
    conv = prepared.conversation_codes(table)
    fold = conversation_folds(conv, 4, 7)
    # fold 0's survival: the session lengths of the other folds' conversations, each once
    first = (table["turn"] == 0).to_numpy()
    once = pd.Series(table["session"].to_numpy()).groupby(conv).transform("min").to_numpy() \
        == table["session"].to_numpy()
    lengths = table.loc[first & once & (fold != 0), "n_turns"].to_numpy()
    k = 2
    expected = [(lengths > k + j).sum() / (lengths > k).sum() for j in range(1, 9)]
    np.testing.assert_allclose(model.survival[0, k], expected)
    # lengthening fold 0's own conversations does not change fold 0's model
    longer = table.copy()
    longer.loc[fold == 0, "n_turns"] += 50
    other = fit_horizon_model(longer, horizon=8, folds=4, seed=7)
    np.testing.assert_array_equal(other.survival[0, :20], model.survival[0, :20])
    assert not np.array_equal(other.survival[1, :20], model.survival[1, :20])


def test_parameters_are_validated_and_recorded():
    p = make_policy("carbonrouter-horizon", horizon=4, forecast="persistence")
    assert p.params()["horizon"] == 4 and p.needs_model
    for bad in ({"horizon": -1}, {"forecast": "oracle"}, {"continuation": 1.5},
                {"cache_survival": 1}, {"smoothing": 0}, {"slot_price": 1},
                {"slot_price": True, "horizon": 0}, {"slot_smoothing": 0},
                {"slot_smoothing": 1.5}, {"slot_residence": True, "slot_price": False},
                {"slot_residence": True, "horizon": 0},
                {"slot_price": True, "slot_residence": 1}):
        with pytest.raises(ValueError):
            HorizonRouter(**bad)
    assert not HorizonRouter(horizon=0).needs_model
    # the slot price is on by default where there is a horizon, and recorded on or off, so a
    # run's parameters rebuild its router whatever the default
    on, off = HorizonRouter(), HorizonRouter(slot_price=False)
    assert on.slot_price and on.params()["slot_price"] is True
    assert not HorizonRouter(horizon=0).slot_price
    assert off.params()["slot_price"] is False and "slot_smoothing" not in off.params()
    for router in (on, off, HorizonRouter(slot_smoothing=0.1, slot_residence=True)):
        assert HorizonRouter(**router.params()).params() == router.params()
    assert HorizonRouter(slot_smoothing=0.1).params()["slot_smoothing"] == 0.1


def _slot_table():
    cfg = prepared.WorkloadConfig(dataset="mooncake", max_conversations=150, seed=2)
    table = prepared.prepare_workload(prepared.with_copies(cfg, 6), use_cache=False)
    sim = setting.SimulationConfig(regions=("GB", "BE"))
    return table, sim, fit_horizon_model(table, horizon=16)


def test_the_slot_price_is_zero_until_a_first_turn_is_displaced():
    # With a slot for every session no first turn finds its best pool full: the slot-priced
    # router makes the plain router's every decision. With the paper's one slot per pool first
    # turns are displaced, the price of the displacing pools rises and decisions change;
    # replays are deterministic. (The Python loop, which keeps the state; test_kernel.py
    # checks the compiled loop against it.)
    import dataclasses

    table, sim, model = _slot_table()
    tight = setting.backend_config(table, sim)
    ample = dataclasses.replace(tight, slots_per_pool=10_000)
    priced = HorizonRouter(slot_price=True, model=model)
    a = simulator.simulate(table, HorizonRouter(slot_price=False, model=model), sim,
                           backend=ample).records
    b = simulator.simulate(table, priced, sim, backend=ample, engine="python").records
    pd.testing.assert_frame_equal(a[DECISION_COLUMNS], b[DECISION_COLUMNS])
    assert not priced._bound.displaced.any() and priced._bound.clock[0] > 0
    plain = simulator.simulate(table, HorizonRouter(slot_price=False, model=model), sim,
                               backend=tight).records
    priced = HorizonRouter(slot_price=True, model=model)
    c = simulator.simulate(table, priced, sim, backend=tight, engine="python").records
    st = priced._bound
    assert st.displaced.max() > 0 and st.gap.max() > 0
    assert not plain["deployment"].equals(c["deployment"])
    again = simulator.simulate(table, HorizonRouter(slot_price=True, model=model), sim,
                               backend=tight).records
    pd.testing.assert_frame_equal(c, again)


def test_the_residence_slot_price_is_the_slot_price_when_sessions_never_leave():
    # Σ_j S(j)·ρ^(j−1): with ρ = 1 the plain sum, so a router that assumes every later turn
    # stays (continuation 1) prices slots exactly as the plain slot price; with the online ρ
    # (< 1 once the router has switched) the price is smaller and decisions change.
    from carbonrouter_lib import kernel

    surv = np.array([0.9, 0.6, 0.3])
    assert kernel.residence_turns(surv, 1.0) == pytest.approx(surv.sum())
    assert kernel.residence_turns(surv, 0.5) == pytest.approx(0.9 + 0.6 * 0.5 + 0.3 * 0.25)
    table, sim, model = _slot_table()
    backend = setting.backend_config(table, sim)
    runs = {}
    for label, kw in {"plain, rho 1": {"continuation": 1.0},
                      "residence, rho 1": {"continuation": 1.0, "slot_residence": True},
                      "plain": {}, "residence": {"slot_residence": True}}.items():
        runs[label] = simulator.simulate(table, HorizonRouter(slot_price=True, model=model,
                                                              **kw), sim,
                                         backend=backend).records
    pd.testing.assert_frame_equal(runs["plain, rho 1"], runs["residence, rho 1"])
    assert not runs["plain"]["deployment"].equals(runs["residence"]["deployment"])
    assert HorizonRouter(slot_price=True, slot_residence=True).params()["slot_residence"]
    assert "slot_residence" not in HorizonRouter(slot_price=True).params()


def test_the_slot_price_learns_only_from_the_past():
    # Dropping the sessions that start after a cut changes no decision made before it: the
    # price reads only first turns already dispatched.
    table, sim, model = _slot_table()
    backend = setting.backend_config(table, sim)
    starts = table.groupby("session")["arrival_s"].transform("min")
    cut = float(np.quantile(table.loc[table["turn"] == 0, "arrival_s"], 0.6))
    early = table[starts < cut].reset_index(drop=True)
    a = simulator.simulate(table, HorizonRouter(slot_price=True, model=model), sim,
                           backend=backend).records
    b = simulator.simulate(early, HorizonRouter(slot_price=True, model=model), sim,
                           backend=backend).records
    before_a, before_b = a[a["dispatch_s"] < cut], b[b["dispatch_s"] < cut]
    assert len(before_a) > 100 and len(a) > len(b)
    pd.testing.assert_frame_equal(before_a[DECISION_COLUMNS].reset_index(drop=True),
                                  before_b[DECISION_COLUMNS].reset_index(drop=True))


def test_forecast_noise_is_seeded_mean_preserving_and_only_noise():
    from carbonrouter_lib.policies.horizon import forecast_error

    e1 = forecast_error(0.3, 0, 100, 2, (4, 16))
    assert np.array_equal(e1, forecast_error(0.3, 0, 100, 2, (4, 16)))  # deterministic
    assert not np.array_equal(e1, forecast_error(0.3, 1, 100, 2, (4, 16)))  # seeded
    assert not np.array_equal(e1, forecast_error(0.3, 0, 101, 2, (4, 16)))  # per row
    big = np.concatenate([forecast_error(0.3, 0, r, 0, (4, 16)).ravel() for r in range(500)])
    assert big.mean() == pytest.approx(1.0, abs=0.01)  # E[exp(σε − σ²/2)] = 1
    assert np.log(big).std() == pytest.approx(0.3, abs=0.01)
    with pytest.raises(ValueError, match="forecast_noise"):
        HorizonRouter(forecast_noise=-0.1)
    assert HorizonRouter(forecast_noise=0.2, noise_seed=4).params()["forecast_noise"] == 0.2
