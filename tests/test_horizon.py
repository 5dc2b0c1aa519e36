"""The horizon router: one-turn reduction to CarbonRouter's proposal, hand-built scenarios where
it stays (the greedy proposal switches) and where it leaves a cache (the greedy proposal stays),
no reading of future intensities, and a survival model fitted only on training conversations."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from test_simulator import AMPLE, CONFIG, T0, make_table

from carbonrouter_lib import horizon_eval as he
from carbonrouter_lib import kernel, prepared, setting, simulator
from carbonrouter_lib.build import build_policy
from carbonrouter_lib.carbon import CarbonSignal
from carbonrouter_lib.policies import HorizonModel, HorizonRouter, fit_horizon_model, make_policy
from carbonrouter_lib.policies.horizon import turn_starts
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
    # With J = 16 future turns priced. A 300, B 250 all the time. Greedy: 250·E(miss) >
    # 300·E(hit) → stay on A's cache. Over the rest of the session the 50 gCO2e/kWh of every
    # later turn outweighs one recomputation.
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
    h = replay(table, HorizonRouter(horizon=16, forecast="persistence", continuation=1.0,
                                    model=certain_model()), sig)
    assert list(h["region"]) == ["A", "B"] and h.loc[1, "switched"]
    # …and one future turn is not enough to pay for the recomputation: the default's J = 1
    # (since 2026-12-07) keeps the cache here, as the greedy proposal does
    short = replay(table, HorizonRouter(forecast="persistence", continuation=1.0,
                                        model=certain_model()), sig)
    assert short.equals(replay(table, HorizonRouter(horizon=1, forecast="persistence",
                                                    continuation=1.0, model=certain_model()),
                               sig))
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


def _fitted_on_folds(max_conversations: int, copies: int, horizon: int):
    """A ShareGPT table with ``copies`` of each conversation, its horizon model on 4 folds (seed
    7), the conversation codes and each row's fold."""
    cfg = prepared.WorkloadConfig(dataset="sharegpt", max_conversations=max_conversations, seed=3)
    table = prepared.prepare_workload(prepared.with_copies(cfg, copies), use_cache=False)
    model = fit_horizon_model(table, horizon=horizon, folds=4, seed=7)
    conv = prepared.conversation_codes(table)
    return table, model, conv, conversation_folds(conv, 4, 7)


def test_the_survival_model_learns_only_from_other_conversations():
    table, model, conv, fold = _fitted_on_folds(200, 3, 8)
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


def test_a_fit_for_some_models_is_the_catalog_fit_of_those_models():
    # the live router serves some of the catalog's models: the fit's model axes are theirs
    table, model, _, _ = _fitted_on_folds(120, 1, 4)

    some = (MODELS[1], MODELS[4])
    part = fit_horizon_model(table, horizon=4, folds=4, seed=7, models=some)
    cols = [MODELS.index(m) for m in some]
    for name in ("new_tokens", "out_tokens", "stay_feasible", "eligible"):
        np.testing.assert_array_equal(getattr(part, name), getattr(model, name)[:, cols])
    for name in ("survival", "gap_s", "keep_prior"):
        np.testing.assert_array_equal(getattr(part, name), getattr(model, name))
    # where a session goes when its model turns infeasible: a distribution over these models
    assert part.fallback.shape == (4, 2, 2)
    np.testing.assert_allclose(part.fallback.sum(axis=2), 1.0)
    for bad in ((MODELS[4], MODELS[1]), ("GPT-9",), ()):
        with pytest.raises(ValueError, match="catalog models"):
            fit_horizon_model(table, horizon=4, models=bad)
    # a model fitted for other models than the deployments' is refused at the first query
    sim = setting.SimulationConfig(regions=("GB", "BE"))
    router = HorizonRouter(horizon=4, slot_turns=None)  # the model's four turns
    router.set_model(part)
    with pytest.raises(ValueError, match="fitted for 2 models, the deployments have 5"):
        simulator.simulate(table, router, sim, engine="python")


def test_parameters_are_validated_and_recorded():
    p = make_policy("carbonrouter-horizon", horizon=4, forecast="persistence")
    assert p.params()["horizon"] == 4 and p.needs_model
    for bad in ({"horizon": -1}, {"forecast": "oracle"}, {"continuation": 1.5},
                {"cache_survival": 1}, {"smoothing": 0}, {"slot_price": 1},
                {"slot_price": True, "horizon": 0}, {"slot_smoothing": 0},
                {"slot_smoothing": 1.5}, {"slot_residence": True, "slot_price": False},
                {"slot_credit": False, "slot_price": False}, {"slot_credit": 0},
                {"slot_residence": True, "horizon": 0},
                {"slot_price": True, "slot_residence": 1},
                {"slot_turns": 0}, {"slot_turns": True}, {"slot_turns": 2.0}):
        with pytest.raises(ValueError):
            HorizonRouter(**bad)
    assert not HorizonRouter(horizon=0).needs_model
    # the slot price is on by default where there is a horizon, and recorded on or off, so a
    # run's parameters rebuild its router whatever the default
    on, off = HorizonRouter(), HorizonRouter(slot_price=False)
    assert on.slot_price and on.params()["slot_price"] is True
    assert not HorizonRouter(horizon=0).slot_price
    assert off.params()["slot_price"] is False and "slot_smoothing" not in off.params()
    assert "slot_credit" not in on.params()
    assert HorizonRouter(slot_credit=False).params()["slot_credit"] is False
    # the defaults since 2026-12-07: J = 1, the slot price over 16 turns; slot_turns is
    # recorded where it acts (the slot price on, no residence), and acts nowhere else
    assert on.horizon == 1 and on.slot_horizon == 16 == on.model_horizon
    assert on.params()["slot_turns"] == 16 and "slot_turns" not in off.params()
    assert HorizonRouter(horizon=4, slot_turns=None).params()["slot_turns"] is None
    assert HorizonRouter(horizon=4, slot_turns=None).model_horizon == 4
    assert HorizonRouter(horizon=4).model_horizon == 16
    assert HorizonRouter(horizon=24).model_horizon == 24
    assert off.slot_horizon == 1 == off.model_horizon
    residence = HorizonRouter(horizon=4, slot_residence=True)
    assert residence.slot_horizon == 4 and "slot_turns" not in residence.params()
    assert HorizonRouter(horizon=0).slot_horizon == 0 and not HorizonRouter(horizon=0).needs_model
    for router in (on, off, HorizonRouter(slot_smoothing=0.1, slot_residence=True),
                   HorizonRouter(slot_credit=False), HorizonRouter(horizon=16, slot_turns=None),
                   HorizonRouter(horizon=4, slot_turns=None)):
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
        # J = 16, so that the plain slot price and the residence sum over the same turns
        runs[label] = simulator.simulate(table, HorizonRouter(horizon=16, slot_price=True,
                                                              model=model, **kw), sim,
                                         backend=backend).records
    pd.testing.assert_frame_equal(runs["plain, rho 1"], runs["residence, rho 1"])
    assert not runs["plain"]["deployment"].equals(runs["residence"]["deployment"])
    assert HorizonRouter(slot_price=True, slot_residence=True).params()["slot_residence"]
    assert "slot_residence" not in HorizonRouter(slot_price=True).params()


def test_the_slot_credit_is_the_held_pools_price_on_every_switch():
    # kernel.slot_prices by hand: three pools with prices π = (m_p·Λ capped at ḡ_p / D̄), one
    # deployment each, a later turn (prev ≥ 0) held in pool 0. With the credit a switch to pool p
    # pays (π_p − π_0)·T, without it π_p·T; staying in the held pool is free either way.
    from carbonrouter_lib import kernel

    displaced, gap = np.array([2.0, 1.0, 0.5]), np.array([100.0, 100.0, 1.0])
    clock = np.array([0.5, 0.0])  # Λ = 0.5 / s
    sessions_s, remaining_s = 10.0, 30.0
    pi_expected = np.minimum(displaced * 0.5, gap / sessions_s)  # (1.0, 0.5, 0.1)
    mask, pool = np.ones(3, bool), np.arange(3)
    prices = {}
    for credit in (True, False):
        price, pi = np.zeros(3), np.zeros(3)
        kernel.slot_prices(price, pi, displaced.copy(), gap.copy(), clock.copy(), np.zeros(3),
                           np.ones(3, bool), 3, np.ones(3, bool), mask, pool, 0, 100.0, 0.01,
                           sessions_s, remaining_s, credit)
        np.testing.assert_allclose(pi, pi_expected)
        prices[credit] = price
    np.testing.assert_allclose(prices[True], [0.0, (0.5 - 1.0) * 30, (0.1 - 1.0) * 30])
    np.testing.assert_allclose(prices[False], [0.0, 0.5 * 30, 0.1 * 30])
    # a first turn holds nothing: both price every pool at π_p·T
    for credit in (True, False):
        price = np.zeros(3)
        kernel.slot_prices(price, np.zeros(3), displaced.copy(), gap.copy(), clock.copy(),
                           np.zeros(3), np.ones(3, bool), 3, np.ones(3, bool), mask, pool, -1,
                           100.0, 1e-9, sessions_s, remaining_s, credit)
        np.testing.assert_allclose(price, pi_expected * 30, rtol=1e-6)


def test_the_slot_credit_changes_decisions_only_where_first_turns_are_displaced():
    # With a slot for every session no pool has a price, so the credit changes nothing; with
    # the paper's one slot per pool the held pools have prices and the decisions differ.
    import dataclasses

    table, sim, model = _slot_table()
    tight = setting.backend_config(table, sim)
    ample = dataclasses.replace(tight, slots_per_pool=10_000)
    for backend, same in ((ample, True), (tight, False)):
        a, b = (simulator.simulate(table, HorizonRouter(model=model, slot_credit=credit), sim,
                                   backend=backend).records for credit in (True, False))
        assert a["deployment"].equals(b["deployment"]) is same


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


def _reference_future(surv, rho, fc, post_m, new_m, out_m, stay_m, e_in, e_cache, e_out,
                      region, model, kv_pool, keep, cache_survival, stickiness, fallback,
                      eligible, phi, use_fallback, option, told=None, returns=None):
    """The future term of policies/horizon.py written out turn by turn in numpy (the former
    router, neither part on: its exit is the deployment of least *total* recomputation).
    ``told``: (stay_j, exit_j), the models of the future turns told (turn j's q_m and exit);
    ``returns``: (ret_dep, ret_len, ret_keep), the return exit's caches per model and p_left
    per KV pool."""
    n_m = len(new_m)
    total = np.zeros(len(e_in))
    legacy = not (use_fallback or option or told is not None)
    stay_sum, miss_sum = np.zeros(len(e_in)), np.zeros(len(e_in))
    for j in range(len(surv)):
        c = fc[region, j]
        h = post_m[model] + j * (new_m[model] + out_m[model])
        base = c * (e_in * new_m[model] + e_out * out_m[model])
        miss = base + c * e_in * h
        v = (miss - keep[kv_pool] * c * (e_in - e_cache) * h) if cache_survival else (
            base + c * e_cache * h)
        if legacy:
            stay_sum += surv[j] * rho ** j * v
            miss_sum += surv[j] * rho ** j * miss
            continue
        if stickiness:
            best = np.array([miss[model == k].min() for k in range(n_m)])
            if use_fallback:
                w = fallback * (1 - np.eye(n_m))
                to = np.repeat(best[None, :], n_m, axis=0)  # [m, m′]: a fall from m to m′
                if returns is not None:
                    ret_keep = returns[2]
                    for m2, (h, length) in enumerate(zip(*returns[:2], strict=True)):
                        if h < 0:
                            continue
                        back = miss[h] - c[h] * (e_in[h] - e_cache[h]) * length
                        p = ret_keep[kv_pool[h]] if cache_survival else 1.0
                        to[:, m2] = best[m2] - p ** (j + 1) * max(best[m2] - back, 0.0)
                ex = (w * to).sum(axis=1) / w.sum(axis=1)
            else:
                ex = np.array([np.delete(best, k).min() for k in range(n_m)])
            if told is None:
                v = stay_m[model] * v + (1 - stay_m[model]) * ex[model]
            else:
                q, x = told[0][model, j], told[1][j]
                ex = np.array([best[x] if x >= 0 and x != k and best[x] < np.inf else ex[k]
                               for k in range(n_m)])
                v = np.where(q < 1, q * v + (1 - q) * ex[model], v)
        if option:
            d = int(np.argmin(np.where(eligible[model], miss, np.inf)))
            v = np.where(miss[d] < v, v - (1 - phi[kv_pool[d]]) * (v - miss[d]), v)
        total += surv[j] * rho ** j * v
    if legacy:
        total = stay_sum
        if stickiness:
            best = np.array([miss_sum[model == k].min() for k in range(n_m)])
            ex = np.array([np.delete(best, k).min() for k in range(n_m)])
            total = stay_m[model] * stay_sum + (1 - stay_m[model]) * ex[model]
    return total


def _random_future(rng, n_j: int, dominant: bool, n_r: int = 3, n_m: int = 5,
                   n_kv: int = 4) -> tuple:
    """A random instance of kernel.horizon_future's arguments, J = ``n_j`` turns: (args, fallback,
    eligible, phi, mask, dom, fc_lo, fc_arg, future, miss, work); ``args`` are (surv, rho, fc,
    post_m, new_m, out_m, stay_m, e_in, e_cache, e_out, region, model, kv_pool, keep), and
    _reference_future's first arguments. ``dominant``: e_out ∝ e_in, so that one GPU is least in
    every energy (without it, one may be by chance: ``dom`` says)."""
    from carbonrouter_lib import kernel

    region = np.repeat(np.arange(n_r), 2 * n_m)
    model = np.tile(np.arange(n_m), 2 * n_r)
    n = len(model)
    kv_pool = rng.integers(0, n_kv, n)
    e_in = np.tile(rng.uniform(0.5, 2.0, 2 * n_m), n_r)  # a (GPU, model) block per region
    e_cache, e_out = 0.05 * e_in, 6 * e_in
    if not dominant:  # no GPU least in both e_in and e_out: every turn searches the blocks
        e_out = np.tile(rng.uniform(3.0, 12.0, 2 * n_m), n_r)
    fallback = rng.uniform(0, 1, (n_m, n_m)) * (1 - np.eye(n_m))
    fallback /= fallback.sum(axis=1, keepdims=True)
    args = (rng.uniform(0.1, 1, n_j), 0.8, rng.uniform(50, 400, (n_r, n_j)),
            rng.uniform(100, 5000, n_m), rng.uniform(10, 200, n_m), rng.uniform(50, 500, n_m),
            rng.uniform(0, 1, n_m), e_in, e_cache, e_out, region, model, kv_pool,
            rng.uniform(0.3, 1, n_kv))
    eligible = np.array([False] + [True] * (n_m - 1))
    phi = rng.uniform(0, 1, n_kv)
    mask = rng.uniform(0, 1, n) < 0.6  # the candidates: the others need no value
    dom = kernel.dominant_blocks(e_in, e_out, model, n_m, n // n_r)
    fc = args[2]
    fc_lo, fc_arg = np.empty(n_j), np.empty(n_j, np.int64)
    kernel.forecast_minima(fc, fc_lo, fc_arg)
    np.testing.assert_array_equal(fc_lo, fc.min(axis=0))  # no ties in a uniform draw
    np.testing.assert_array_equal(fc_arg, fc.argmin(axis=0))
    work = np.empty(kernel.horizon_work_size(n_r, n_m, n, n_j))
    return (args, fallback, eligible, phi, mask, dom, fc_lo, fc_arg, np.zeros(n), np.zeros(n),
            work)


@pytest.mark.parametrize("use_fallback, option", [(False, False), (True, False), (False, True),
                                                  (True, True)])
@pytest.mark.parametrize("survival, stickiness, dominant", [
    (True, True, True), (False, True, True), (True, False, True), (True, True, False)])
def test_the_future_term_is_its_formula(use_fallback, option, survival, stickiness, dominant):
    # kernel.horizon_future (the closed form of the former router where it applies, turn by
    # turn otherwise) against the sum written out in numpy, on random deployments
    from carbonrouter_lib import kernel

    rng = np.random.default_rng(11)
    n_m, n_j = 5, 6
    (args, fallback, eligible, phi, mask, dom, fc_lo, fc_arg, future, miss,
     work) = _random_future(rng, n_j, dominant)
    fc, model, region, n, n_kv = args[2], args[11], args[10], len(mask), len(args[13])
    assert (dom >= 0).all() == dominant  # e_out ∝ e_in: one GPU is least in every energy
    stay_j, exit_j = np.ones((n_m, n_j)), np.full(n_j, -1, np.int64)
    kernel.horizon_future(future, miss, work, *args[:3], fc_lo, fc_arg, *args[3:], n_m, survival,
                          stickiness, fallback, eligible, phi, use_fallback, option, mask, dom)
    expected = _reference_future(*args, survival, stickiness, fallback, eligible, phi,
                                 use_fallback, option)
    priced = mask if (use_fallback or option) else np.ones(n, dtype=bool)
    np.testing.assert_allclose(future[priced], expected[priced], rtol=1e-12)
    if not stickiness:
        return
    if use_fallback:
        # the return exit: with no cache of any model the fallback exit to the bit; with caches
        # (one model's clean and long enough to pay, one's not), each fall to a cached model
        # the cheaper of recomputing and returning, the return weighted by p_left^(j+1) (the
        # left caches' survival, not p's)
        learned = future.copy()
        ret_dep, ret_len = np.full(n_m, -1, np.int64), np.zeros(n_m)
        ret_keep = rng.uniform(0.2, 0.9, n_kv)
        kernel.horizon_future(future, miss, work, *args[:3], fc_lo, fc_arg, *args[3:], n_m,
                              survival, stickiness, fallback, eligible, phi, use_fallback,
                              option, mask, dom, None, None, ret_dep, ret_len, ret_keep)
        np.testing.assert_array_equal(future, learned)
        ret_dep[[1, 3]] = [int(np.flatnonzero(model == 1)[np.argmin(fc[region[model == 1], 0])]),
                           int(np.flatnonzero(model == 3)[-1])]
        ret_len[[1, 3]] = [args[3][1], 0.2 * args[3][3]]
        kernel.horizon_future(future, miss, work, *args[:3], fc_lo, fc_arg, *args[3:], n_m,
                              survival, stickiness, fallback, eligible, phi, use_fallback,
                              option, mask, dom, None, None, ret_dep, ret_len, ret_keep)
        expected = _reference_future(*args, survival, stickiness, fallback, eligible, phi,
                                     use_fallback, option, returns=(ret_dep, ret_len, ret_keep))
        np.testing.assert_allclose(future[mask], expected[mask], rtol=1e-12)
        assert (future[mask] <= learned[mask] + 1e-9).all()  # a return can only be cheaper
        assert (future[mask] < learned[mask] - 1e-6).any()
        future[:] = learned
    # told the models of the future turns: told exactly the learned values, the same future
    # (the turn-by-turn sum); told other values, turn j's q_m and exit as told
    learned = future.copy()
    stay_j[:] = args[6][:, None]
    kernel.horizon_future(future, miss, work, *args[:3], fc_lo, fc_arg, *args[3:], n_m, survival,
                          stickiness, fallback, eligible, phi, use_fallback, option, mask, dom,
                          stay_j, exit_j)
    if use_fallback or option:
        np.testing.assert_allclose(future[mask], learned[mask], rtol=1e-12)
    stay_j = (rng.uniform(0, 1, (n_m, n_j)) < 0.5).astype(np.float64)
    exit_j = np.array([int(np.argmax(stay_j[:, j])) if stay_j[:, j].any() else -1
                       for j in range(n_j)])
    stay_j[:, n_j - 1] = args[6]  # a last turn past the session's end: the learned values
    exit_j[n_j - 1] = -1
    kernel.horizon_future(future, miss, work, *args[:3], fc_lo, fc_arg, *args[3:], n_m, survival,
                          stickiness, fallback, eligible, phi, use_fallback, option, mask, dom,
                          stay_j, exit_j)
    expected = _reference_future(*args, survival, stickiness, fallback, eligible, phi,
                                 use_fallback, option, told=(stay_j, exit_j))
    np.testing.assert_allclose(future[mask], expected[mask], rtol=1e-12)
    assert not np.allclose(future[mask], learned[mask])


@pytest.mark.parametrize("use_fallback, option", [(False, False), (True, False), (False, True),
                                                  (True, True)])
@pytest.mark.parametrize("survival, stickiness, dominant", [
    (True, True, True), (False, True, True), (True, False, True), (True, True, False)])
def test_one_future_turn_is_the_turn_by_turn_sum_to_the_bit(use_fallback, option, survival,
                                                             stickiness, dominant):
    # J = 1 (the default) has a path of its own in kernel.horizon_future (without the setup
    # for J turns): its values are the numpy sum's and, to the bit, the turn-by-turn sum's over
    # J = 2 with no chance of a second turn (the same first turn, then 0 added)
    from carbonrouter_lib import kernel

    drawn = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        (args, fallback, eligible, phi, mask, dom, fc_lo, fc_arg, future, miss,
         work) = _random_future(rng, 2, dominant)
        if (dom >= 0).all() != dominant:
            continue  # a GPU least in both energies by chance
        drawn += 1
        n_m = len(args[4])
        rest = (n_m, survival, stickiness, fallback, eligible, phi, use_fallback, option, mask,
                dom)
        surv2 = args[0].copy()
        surv2[1] = 0.0
        kernel.horizon_future(future, miss, work, surv2, *args[1:3], fc_lo, fc_arg, *args[3:],
                              *rest)
        two = future.copy()
        one = (args[0][:1], args[1], np.ascontiguousarray(args[2][:, :1]))
        lo1, arg1 = fc_lo[:1].copy(), fc_arg[:1].copy()
        future[:] = np.nan
        kernel.horizon_future(future, miss, work, *one, lo1, arg1, *args[3:], *rest)
        priced = mask if (use_fallback or option) else np.ones(len(mask), dtype=bool)
        np.testing.assert_allclose(future[priced], _reference_future(
            *one, *args[3:], survival, stickiness, fallback, eligible, phi, use_fallback,
            option)[priced], rtol=1e-12)
        if use_fallback or option:  # the turn-by-turn sum: J = 2 runs it too
            np.testing.assert_array_equal(future[priced], two[priced])
            assert (future[~mask] == 0).all()
    assert drawn >= 10


def test_the_fallback_is_learned_from_other_conversations():
    table, model, conv, fold = _fitted_on_folds(300, 2, 4)
    q = prepared.model_matrix(table, "quality")
    feasible = q >= model.beta_q * q.max(axis=1, keepdims=True)
    session = table["session"].to_numpy()
    once = pd.Series(session).groupby(conv).transform("min").to_numpy() == session
    # fold 0: consecutive turns of the other folds' conversations (each once) where a model
    # turns infeasible, and the smallest model feasible then
    pair = (session[1:] == session[:-1]) & once[:-1] & (fold[:-1] != 0)
    for m in range(len(MODELS)):
        lost = pair & feasible[:-1, m] & ~feasible[1:, m]
        if lost.sum() < 5:
            continue
        dest = np.argmax(feasible[1:][lost], axis=1)
        np.testing.assert_allclose(model.fallback[0, m],
                                   np.bincount(dest, minlength=len(MODELS)) / lost.sum())
    assert np.allclose(model.fallback.sum(axis=2), 1) and not np.diagonal(
        model.fallback, axis1=1, axis2=2).any()
    later = (table["turn"] > 0).to_numpy() & once & (fold != 0)
    np.testing.assert_array_equal(model.eligible[0], feasible[later].any(axis=0))
    # making fold 0's own conversations need the 70B only changes the others' fallback alone
    other = table.copy()
    small = [prepared.column("quality", m) for m in MODELS[:-1]]
    other.loc[fold == 0, small] = 0.0
    refit = fit_horizon_model(other, horizon=4, folds=4, seed=7)
    np.testing.assert_array_equal(refit.fallback[0], model.fallback[0])
    np.testing.assert_array_equal(refit.eligible[0], model.eligible[0])
    assert not np.array_equal(refit.fallback[1], model.fallback[1])


def test_keeps_the_big_models_cache_where_a_small_model_fits_one_turn():
    # Turn 0 needs the 70B and leaves a cache of 20,500 tokens; turn 1 also fits Llama-3.2-3B
    # and has a long answer, turn 2 needs the 70B again. Greedy: the 3B recomputes the history
    # but its answer is far cheaper, so it switches. The router knows the 3B rarely stays
    # feasible and that the session then falls back to the 70B, recomputing everything there:
    # it stays. The former exit (the cheapest recomputing deployment of any other model, here
    # Gemma-3-1B, never feasible) made that fall-back cheap, and it switched too.
    both = (0.1, 0.9, 0.1, 0.1, 0.9)
    table = make_table([(0.0, [{"new": 20_000, "out": 500}, {"new": 100, "out": 3_000,
                                                              "think": 60.0, "quality": both},
                               {"new": 100, "out": 500, "think": 60.0}])])
    rows = 2 * DAY
    sig = signal_from(np.full(rows, 200.0), np.full(rows, 200.0))
    greedy = replay(table, "carbonrouter-no-gate", sig)
    assert greedy.loc[1, "model"] == "Llama-3.2-3B"
    n_m = len(MODELS)
    stay = np.ones((2, n_m))
    stay[:, MODELS.index("Llama-3.2-3B")] = 0.0
    eligible = np.zeros((2, n_m), dtype=bool)
    eligible[:, -1] = True
    hand = HorizonModel(folds=2, seed=0, horizon=1, survival=np.ones((2, 4, 1)),
                        new_tokens=np.full((2, n_m), 100.0), out_tokens=np.full((2, n_m), 500.0),
                        stay_feasible=stay, gap_s=np.full(2, 60.0), keep_prior=np.ones(2),
                        beta_q=0.85, eligible=eligible)
    h = replay(table, HorizonRouter(horizon=1, forecast="persistence", continuation=1.0,
                                    slot_price=False, model=hand), sig)
    assert list(h["model"]) == ["Llama-3.1-70B"] * 3 and not h["switched"].any()
    former = replay(table, HorizonRouter(horizon=1, forecast="persistence", continuation=1.0,
                                         slot_price=False, exit="cheapest", model=hand), sig)
    assert former.loc[1, "model"] == "Llama-3.2-3B"


def test_the_option_to_move_follows_the_room_in_the_kv_pools():
    # φ, the chance a new cache evicts another, is learned per KV pool from the pools' free
    # memory. Where no context ever fits (a one-token pool) φ stays 1 and the option to move is
    # worth nothing: every decision is the router's without it. With ample memory φ falls to 0,
    # the option prices the future and decisions change.
    import dataclasses

    table, sim, model = _slot_table()
    tight = setting.backend_config(table, sim)
    full = dataclasses.replace(tight, kv_tokens_per_pool=1)
    ample = dataclasses.replace(tight, kv_tokens_per_pool=1e12)
    runs = {}
    for label, backend in (("full", full), ("ample", ample)):
        for option in (True, False):
            router = HorizonRouter(option=option, model=model)
            runs[label, option] = simulator.simulate(table, router, sim, backend=backend,
                                                     engine="python").records
            if option:
                phi = router._bound.phi
                assert (phi == 1.0).all() if label == "full" else phi.max() < 0.01
    pd.testing.assert_frame_equal(runs["full", True][DECISION_COLUMNS],
                                  runs["full", False][DECISION_COLUMNS])
    assert not runs["ample", True]["deployment"].equals(runs["ample", False]["deployment"])


def test_the_running_averages_never_hold_subnormal_numbers():
    # An average of zeros at the default smoothing stops decaying at a subnormal number (0.95·x
    # rounds back to x), where x86 computes in microcode; the router sets it to 0 instead
    # (kernel.TINY), and that changes no value it compares: a subnormal is absorbed exactly by
    # 1 − φ, by the next update towards 1, and by any normal price it is added to.
    s = 0.05
    x = y = 1.0
    for _ in range(20_000):
        x = x + s * (0.0 - x)
        y = kernel.running_mean(y, 0.0, s)
    assert 0 < x < kernel.TINY and y == 0.0
    assert kernel.running_mean(0.3, 1.0, s) == 0.3 + s * (1.0 - 0.3)
    assert kernel._normal(kernel.TINY) == kernel.TINY and kernel._normal(0.3) == 0.3
    for sub in (x, 5e-324, kernel.TINY / 2, kernel.TINY * (1 - 2**-52)):
        assert kernel._normal(sub) == 0.0
        assert 1.0 - sub == 1.0 - 0.0
        assert sub + s * (1.0 - sub) == 0.0 + s * (1.0 - 0.0)
        assert 1e-12 + sub * 1e4 == 1e-12  # a price or carbon of 10⁻¹² g absorbs it


def test_the_forecasts_minima_take_the_first_region_on_ties():
    fc = np.array([[3.0, 1.0, 2.0, 5.0], [1.0, 1.0, 4.0, 5.0], [2.0, 0.5, 2.0, 5.0]])
    lo, arg = np.empty(4), np.empty(4, np.int64)
    kernel.forecast_minima(fc, lo, arg)
    np.testing.assert_array_equal(lo, [1.0, 0.5, 2.0, 5.0])
    np.testing.assert_array_equal(arg, [1, 2, 0, 0])


def test_a_replay_leaves_no_subnormal_average():
    # with ample memory φ is an average of zeros; at smoothing 0.4 its plain update stops at the
    # least subnormal (0.4·x rounds to 0) within this replay's 1,716 decisions. Both loops
    # update it through kernel.running_mean, so it ends at 0, and they still agree.
    import dataclasses

    table, sim, model = _slot_table()
    ample = dataclasses.replace(setting.backend_config(table, sim), kv_tokens_per_pool=1e12)
    x = 1.0
    for _ in range(len(table)):
        x = x + 0.4 * (0.0 - x)
    assert 0 < x < kernel.TINY  # what the plain update would hold
    router = HorizonRouter(model=model, smoothing=0.4)
    python = simulator.simulate(table, router, sim, backend=ample, engine="python").records
    phi = router._bound.phi
    assert (phi == 0).any() and ((phi == 0) | (phi >= kernel.TINY)).all()
    compiled = simulator.simulate(table, HorizonRouter(model=model, smoothing=0.4), sim,
                                  backend=ample, engine="compiled").records
    pd.testing.assert_frame_equal(python[DECISION_COLUMNS], compiled[DECISION_COLUMNS])


def test_the_ttft_price_by_hand():
    # kernel.ttft_prices: ν·(least Ĉ among the candidates) on the candidates whose Eq. 6 TTFT
    # exceeds the SLO, 0 on the others; kernel.ttft_dual: dual ascent on P(TTFT > SLO) ≤ share.
    model = np.array([0, 0, 1, 1])
    v_pre = np.array([1000.0, 2000.0, 1000.0, 4000.0])
    new_m, hist_m = np.array([100.0, 200.0]), np.array([900.0, 1800.0])
    cached = np.array([900.0, 0.0, 0.0, 0.0])  # TTFT: 0.1, 0.5, 2.0, 0.5 s
    carbon = np.array([3.0, 2.0, 1.0, 5.0])
    mask = np.array([True, True, False, True])  # the least candidate Ĉ is 2.0 (not 1.0)
    ttft = np.empty(4)  # Candidates.ttft, as the compiled loop computes it (no hit but a's)
    kernel._ttfts(ttft, 4, 0, new_m, hist_m, model, cached, v_pre)
    np.testing.assert_allclose(ttft, [0.1, 0.5, 2.0, 0.5])
    only = np.full(4, -1.0)  # the candidates only: the others untouched
    kernel._ttfts(only, 4, 0, new_m, hist_m, model, cached, v_pre, mask)
    np.testing.assert_array_equal(only, np.where(mask, ttft, -1.0))
    price = np.full(4, -7.0)
    kernel.ttft_prices(price, 0.4, 1.5, carbon, mask, ttft)
    np.testing.assert_array_equal(price, [0.0, 3.0, -7.0, 3.0])  # non-candidates untouched
    kernel.ttft_prices(price, 0.5, 1.5, carbon, mask, ttft)
    np.testing.assert_array_equal(price, [0.0, 0.0, -7.0, 0.0])  # not above the SLO
    kernel.ttft_prices(price, 0.4, 0.0, carbon, mask, ttft)
    np.testing.assert_array_equal(price, [0.0, 0.0, -7.0, 0.0])  # ν = 0: no price
    assert kernel.ttft_dual(1.0, 0.6, 0.5, 0.05, 0.1) == pytest.approx(1.0 + 0.1 * 0.95)
    assert kernel.ttft_dual(1.0, 0.5, 0.5, 0.05, 0.1) == pytest.approx(1.0 - 0.1 * 0.05)
    assert kernel.ttft_dual(0.001, 0.1, 0.5, 0.05, 0.1) == 0.0


def _ttft_over(records: pd.DataFrame, slo: float) -> float:
    served = records["ttft_s"].dropna()
    return float((served > slo).mean())


def test_the_ttft_price_holds_the_share_of_queries_over_the_slo():
    # ShareGPT with ten times the KV memory, where a query's TTFT depends mostly on whether the
    # router recomputes its history. An SLO every query meets leaves ν at 0 and every decision
    # the router's without the price; an SLO the router misses in 10% of its queries is then
    # missed in little more than the 5% share, alike in both loops. (With the Mooncake trace's
    # long prompts most misses are on every candidate: the price cannot move them.)
    import dataclasses

    cfg = prepared.WorkloadConfig(dataset="sharegpt", max_conversations=150, seed=2)
    table = prepared.prepare_workload(prepared.with_copies(cfg, 6), use_cache=False)
    sim = setting.SimulationConfig(regions=("GB", "BE"))
    model = fit_horizon_model(table, horizon=16)
    tight = setting.backend_config(table, sim)
    backend = dataclasses.replace(tight, kv_tokens_per_pool=tight.kv_tokens_per_pool * 10)
    plain = simulator.simulate(table, HorizonRouter(model=model), sim, backend=backend).records
    ttft = plain["ttft_s"].dropna()
    slack = simulator.simulate(table, HorizonRouter(model=model, ttft_slo_s=float(ttft.max())),
                               sim, backend=backend).records
    pd.testing.assert_frame_equal(plain, slack)
    slo = float(ttft.quantile(0.9))
    assert _ttft_over(plain, slo) > 0.099
    router = HorizonRouter(model=model, ttft_slo_s=slo)
    python = simulator.simulate(table, router, sim, backend=backend, engine="python").records
    compiled = simulator.simulate(table, HorizonRouter(model=model, ttft_slo_s=slo), sim,
                                  backend=backend, engine="compiled").records
    pd.testing.assert_frame_equal(python, compiled, check_exact=True)
    assert _ttft_over(python, slo) < 0.065
    assert router._bound.nu > 0


def test_the_ttft_price_is_validated_and_recorded():
    for bad in ({"ttft_slo_s": 0.0}, {"ttft_slo_s": -1.0}, {"ttft_slo_s": True},
                {"ttft_slo_s": float("inf")}, {"ttft_slo_s": 1.0, "horizon": 0},
                {"ttft_slo_s": 1.0, "ttft_share": 0.0}, {"ttft_slo_s": 1.0, "ttft_share": 1.0},
                {"ttft_slo_s": 1.0, "ttft_step": 0}):
        with pytest.raises(ValueError):
            HorizonRouter(**bad)
    assert "ttft_slo_s" not in HorizonRouter().params()
    r = HorizonRouter(ttft_slo_s=0.25, ttft_share=0.04)
    assert r.params()["ttft_slo_s"] == 0.25 and r.params()["ttft_share"] == 0.04
    assert HorizonRouter(**r.params()).params() == r.params()


def test_the_told_survival_is_the_session_length_by_hand():
    from carbonrouter_lib.policies.horizon import survival_rows, survival_table

    model = certain_model(horizon=3)
    assert survival_table(model) is not None and survival_table(model).shape == (2, 40, 3)
    model.turns = np.array([1, 3, 2])  # conversations 0, 1, 2
    told = survival_table(model, told=True)
    assert told.shape == (2 + 4, 40, 3)
    np.testing.assert_array_equal(told[:2], model.survival)
    # K = 3 turns (rows 2 + 3): from turn 0 turns 1 and 2 remain, from turn 1 turn 2, then none
    np.testing.assert_array_equal(told[5, :4], [[1, 1, 0], [1, 0, 0], [0, 0, 0], [0, 0, 0]])
    np.testing.assert_array_equal(told[3, :2], [[0, 0, 0], [0, 0, 0]])  # K = 1: no later turn
    conversations, folds = np.array([0, 1, 2]), np.array([1, 1, 1])
    assert survival_rows(model, conversations, folds, told=True).tolist() == [3, 5, 4]
    assert survival_rows(model, conversations, folds).tolist() == [1, 1, 1]


def _told_workload() -> tuple[pd.DataFrame, setting.SimulationConfig]:
    """A small ShareGPT replay (two copies of 400 conversations) and two regions, for the
    references told the future."""
    cfg = prepared.WorkloadConfig(dataset="sharegpt", max_conversations=400, seed=2)
    table = prepared.prepare_workload(prepared.with_copies(cfg, 2), use_cache=False)
    return table, setting.SimulationConfig(regions=("GB", "BE"))


def _both_loops(table: pd.DataFrame, model: HorizonModel, sim: setting.SimulationConfig,
                **params) -> pd.DataFrame:
    """The records of ``HorizonRouter(model=model, **params)`` in the Python loop, asserting that
    the compiled loop gives the same, bit for bit."""
    rec = {engine: simulator.simulate(table, HorizonRouter(model=model, **params), sim,
                                      engine=engine).records
           for engine in ("python", "compiled")}
    pd.testing.assert_frame_equal(rec["python"], rec["compiled"], check_exact=True)
    return rec["python"]



def test_a_router_that_has_routed_can_be_copied_and_pickled():
    # the per-run state holds a compiled struct (kernel.HorizonState) that neither copy nor
    # pickle can carry: both carry the arrays, and the copy binds a new run state when it
    # routes, deciding as the original did
    import copy
    import pickle

    table, sim = _told_workload()
    router = build_policy(HorizonRouter(), table, sim)
    first = simulator.simulate(table, router, sim, engine="python").records
    assert router._bound is not None and router._bound.hs is not None
    for clone in (pickle.loads(pickle.dumps(router)), copy.deepcopy(router)):
        assert clone._bound.hs is None
        again = simulator.simulate(table, clone, sim, engine="python").records
        pd.testing.assert_frame_equal(again, first, check_exact=True)

def test_told_the_session_length_where_every_session_has_the_same_length():
    # where every conversation has K turns the learned survival *is* 1{k + j < K}: the router
    # told the session length decides exactly as the router; elsewhere it decides differently,
    # and both loops agree on it
    table, sim = _told_workload()
    same = table[table["n_turns"] == 3].reset_index(drop=True)
    assert same["session"].nunique() > 30
    model = fit_horizon_model(same, horizon=16, tell_turns=True)
    a = simulator.simulate(same, HorizonRouter(model=model), sim).records
    b = simulator.simulate(same, HorizonRouter(model=model, session_length="told"), sim).records
    pd.testing.assert_frame_equal(a, b)
    model = fit_horizon_model(table, horizon=16, tell_turns=True)
    plain = simulator.simulate(table, HorizonRouter(model=model), sim).records
    told = _both_loops(table, model, sim, session_length="told")
    assert not plain["deployment"].equals(told["deployment"])


def test_the_told_models_are_the_future_turns_feasible_models_by_hand():
    from carbonrouter_lib import kernel

    # two conversations: 3 turns and 1 turn; models 0..2
    feasible = np.array([[0, 1, 1], [1, 1, 1], [0, 0, 1], [0, 1, 1]], np.bool_)
    start = np.array([0, 3, 4], np.int64)
    stay_m = np.array([0.2, 0.3, 0.9])
    stay_j, exit_j = np.empty((3, 4)), np.empty(4, np.int64)
    kernel.told_models(stay_j, exit_j, feasible, start, 0, 0, stay_m)
    # turns 1 and 2 exist, turns 3 and 4 do not: the learned q_m and exit there
    np.testing.assert_array_equal(stay_j, [[1, 0, .2, .2], [1, 0, .3, .3], [1, 1, .9, .9]])
    np.testing.assert_array_equal(exit_j, [0, 2, -1, -1])
    kernel.told_models(stay_j, exit_j, feasible, start, 0, 1, stay_m)
    np.testing.assert_array_equal(stay_j[:, 0], [0, 0, 1])
    np.testing.assert_array_equal(exit_j, [2, -1, -1, -1])
    kernel.told_models(stay_j, exit_j, feasible, start, 1, 0, stay_m)
    np.testing.assert_array_equal(stay_j, np.repeat(stay_m[:, None], 4, axis=1))
    np.testing.assert_array_equal(exit_j, [-1] * 4)


def test_told_the_models_both_loops_agree_and_it_reads_the_conversation():
    table, sim = _told_workload()
    model = fit_horizon_model(table, horizon=16, tell_models=True)
    conv = prepared.conversation_codes(table)
    # the stored feasibility is each conversation's turns in order, at the model's β_Q
    q = prepared.model_matrix(table, "quality")
    feasible = q >= model.beta_q * q.max(axis=1, keepdims=True)
    start = turn_starts(model.turns)
    rows = start[conv] + table["turn"].to_numpy()
    np.testing.assert_array_equal(model.feasible_turns[rows], feasible)
    np.testing.assert_array_equal(np.diff(start)[conv], table["n_turns"].to_numpy())
    assert len(model.feasible_turns) == start[-1]
    plain = simulator.simulate(table, HorizonRouter(model=model), sim).records
    told = _both_loops(table, model, sim, future_models="told")
    assert not plain["deployment"].equals(told["deployment"])
    # (the same model tells the session length too: it carries every conversation's turns)
    _both_loops(table, model, sim, **he.TOLD["told all three"])


def test_the_told_references_are_validated_and_recorded():
    for bad in ({"session_length": "oracle"}, {"session_length": "told", "horizon": 0},
                {"forecast": "oracle"}, {"future_models": "oracle"},
                {"future_models": "told", "horizon": 0},
                {"future_models": "told", "model_stickiness": False}):
        with pytest.raises(ValueError):
            HorizonRouter(**bad)
    assert "session_length" not in HorizonRouter().params()
    assert "future_models" not in HorizonRouter().params()
    told = HorizonRouter(future_models="told")
    assert HorizonRouter(**told.params()).params() == told.params()
    with pytest.raises(ValueError, match="tell_models"):
        told.set_model(certain_model())
    r = HorizonRouter(session_length="told", forecast="clairvoyant")
    assert r.params()["session_length"] == "told" and r.params()["forecast"] == "clairvoyant"
    assert HorizonRouter(**r.params()).params() == r.params()
    with pytest.raises(ValueError, match="tell_turns"):
        r.set_model(certain_model())
    cfg = prepared.WorkloadConfig(dataset="sharegpt", max_conversations=60, seed=2)
    table = prepared.prepare_workload(prepared.with_copies(cfg, 3), use_cache=False)
    assert fit_horizon_model(table, horizon=4).turns is None
    turns = fit_horizon_model(table, horizon=4, tell_turns=True).turns
    conv = prepared.conversation_codes(table)
    np.testing.assert_array_equal(turns[conv], table["n_turns"].to_numpy())


def test_return_targets_are_each_models_longest_cache():
    # kernel.return_targets: per model the deployment of the session's longest cache (the
    # first on ties), −1 and 0 where it has none; it overwrites what a previous query left
    from carbonrouter_lib import kernel

    model = np.array([0, 1, 2, 0, 1, 2, 0, 1, 2])
    cached = np.array([0.0, 50.0, 0.0, 80.0, 50.0, 0.0, 30.0, 20.0, 0.0])
    ret_dep, ret_len = np.array([7, 7, 7]), np.array([9.0, 9.0, 9.0])
    kernel.return_targets(ret_dep, ret_len, cached, model)
    assert ret_dep.tolist() == [3, 1, -1] and ret_len.tolist() == [80.0, 50.0, 0.0]
    with pytest.raises(ValueError, match="exit='return'"):
        HorizonRouter(exit="return", future_models="told")
    assert HorizonRouter(exit="return").params()["exit"] == "return"


def test_the_left_caches_survival_is_what_sessions_find_of_the_caches_they_left():
    # kernel.leave records, after a served turn, per model the longest cache the session leaves
    # behind (none where that cache is the deployment served); kernel.observe_left, at its next
    # turn, moves p_left of each left cache's KV pool toward the share of it still there
    from carbonrouter_lib import kernel

    kv_pool = np.array([0, 0, 0, 1, 1, 1])  # six deployments (models 0, 1, 2 twice)
    ret_dep, ret_len = np.array([3, 1, -1]), np.array([80.0, 50.0, 0.0])
    left_dep, left_len = np.array([9, 9, 9]), np.array([9.0, 9.0, 9.0])
    kernel.leave(left_dep, left_len, ret_dep, ret_len, 1)  # served on 1: model 1's cache is used
    assert left_dep.tolist() == [3, -1, -1] and left_len.tolist() == [80.0, 0.0, 0.0]
    keep_left = np.array([0.5, 0.5])
    cached = np.array([0.0, 60.0, 0.0, 20.0, 0.0, 0.0])  # a quarter of the left cache is there
    kernel.observe_left(keep_left, left_dep, left_len, cached, kv_pool, 0.1)
    assert keep_left.tolist() == [0.5, pytest.approx(0.9 * 0.5 + 0.1 * 0.25)]
    kernel.leave(left_dep, left_len, ret_dep, ret_len, 5)  # served elsewhere: both are left
    assert left_dep.tolist() == [3, 1, -1] and left_len.tolist() == [80.0, 50.0, 0.0]
    cached = np.zeros(6)  # both evicted
    before = keep_left.copy()
    kernel.observe_left(keep_left, left_dep, left_len, cached, kv_pool, 0.1)
    np.testing.assert_allclose(keep_left, 0.9 * before)
    kernel.leave(left_dep, left_len, np.full(3, -1), np.zeros(3), 0)  # no cache: nothing left
    kernel.observe_left(keep_left, left_dep, left_len, cached, kv_pool, 0.1)
    np.testing.assert_allclose(keep_left, 0.9 * before)


def test_the_default_router_is_the_pair():
    # since 2026-12-06 the default router has the KV price counting the losses within the TTL
    # (docs/model.md §11.4a, the decision); with J = 0 neither price can run, so it is off, and
    # kv_price=False is the router before the pair, its loss rule unused ("all")
    from carbonrouter_lib.policies import HorizonRouter

    r = HorizonRouter()
    assert (r.kv_price, r.kv_loss, r.ttft_slo_s) == (True, "within_ttl", None)
    assert r.params() == HorizonRouter(kv_price=True, kv_loss="within_ttl").params()
    assert r.params()["kv_price"] is True and r.params()["kv_loss"] == "within_ttl"
    assert HorizonRouter(kv_price=True).kv_loss == "within_ttl"
    j0 = HorizonRouter(horizon=0)
    assert (j0.kv_price, j0.kv_loss) == (False, "all")
    before = HorizonRouter(kv_price=False)
    assert (before.kv_loss, before.params()["kv_price"]) == ("all", False)
    assert "kv_loss" not in before.params()
    with pytest.raises(ValueError, match="kv_loss needs kv_price"):
        HorizonRouter(kv_price=False, kv_loss="within_ttl")
    with pytest.raises(ValueError, match="kv_price needs horizon"):
        HorizonRouter(horizon=0, kv_price=True)


def test_the_slot_prices_turns_apart_from_the_horizon():
    # slot_turns = J is slot_turns None to the last digit; slot_turns sums the slot price's
    # remaining time over its own turns (the horizon model fitted for the larger of the two),
    # so J = 1 with the slot price over 16 turns (the default) decides unlike J = 1 and unlike
    # J = 16; without the slot price slot_turns changes nothing; a model fitted for fewer turns
    # than slot_turns is refused.
    table, sim, model = _slot_table()
    backend = setting.backend_config(table, sim)

    def run(**kw):
        return simulator.simulate(table, HorizonRouter(model=model, **kw), sim,
                                  backend=backend).records

    j16 = run(horizon=16, slot_turns=None)
    pd.testing.assert_frame_equal(j16, run(horizon=16, slot_turns=16))
    pd.testing.assert_frame_equal(run(horizon=4, slot_turns=None), run(horizon=4, slot_turns=4))
    one, apart = run(horizon=1, slot_turns=None), run()
    pd.testing.assert_frame_equal(apart, run(horizon=1, slot_turns=16))
    assert not one["deployment"].equals(apart["deployment"])
    assert not apart["deployment"].equals(j16["deployment"])
    pd.testing.assert_frame_equal(run(horizon=1, slot_price=False, slot_turns=None),
                                  run(horizon=1, slot_price=False))
    with pytest.raises(ValueError, match="prices 4 future turns"):
        HorizonRouter(horizon=1, slot_turns=16).set_model(
            fit_horizon_model(table, horizon=4))
