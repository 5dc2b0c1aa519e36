"""The compiled replay loop (carbonrouter_lib.kernel) against the Python loop, the reference.

The property: for every policy the compiled loop knows, on any workload, capacity and carbon
signal, ``simulate(..., engine="compiled")`` and ``simulate(..., engine="python")`` give identical
records (every column, bit for bit), identical backend counters and the same per-session state
of the policy. The workloads are built to reach every branch of the backend and the feasibility
step: tight KV memory (eviction and overflow), short TTLs (expiry), one slot per pool
(unavailable deployments and rejections), a tight TTFT bound (best-effort), exact ties of times
and of costs; the tests assert that those branches were reached.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from test_simulator import CONFIG, make_signal, make_table, workloads

from carbonrouter_lib import kernel
from carbonrouter_lib.backend import BackendConfig
from carbonrouter_lib.build import build_policy
from carbonrouter_lib.carbon import CarbonSignal
from carbonrouter_lib.gate import (
    FEATURES,
    GateTrainingConfig,
    LearnedGate,
    OracleGate,
    collect_opportunities,
)
from carbonrouter_lib.policies import CarbonRouter, HorizonRouter, make_policy
from carbonrouter_lib.profiles import MODELS
from carbonrouter_lib.setting import SimulationConfig
from carbonrouter_lib.simulator import simulate

COMPILED = ("session-affinity", "carbon-affinity", "gar", "faircarbon", "carbonrouter-no-gate")
T0 = pd.Timestamp("2022-01-03 00:00", tz="UTC").timestamp()
REGIONS3 = ("A", "B", "C")


def random_gate(folds: int = 3, seed: int = 0, inf_fold: int | None = 1) -> LearnedGate:
    """A learned gate of random small XGBoost models (its values need not mean anything: the
    property is that both loops call it on the same features and act alike)."""
    import xgboost as xgb

    rng = np.random.default_rng(seed)
    boosters = []
    for f in range(folds):
        x = rng.normal(size=(400, len(FEATURES))) * 50
        y = x[:, 2] * 0.01 + rng.normal(size=400) * 0.05 + 0.02 * f
        x[rng.random(x.shape) < 0.05] = np.nan  # missing values: the default directions
        boosters.append(xgb.train({"max_depth": 4, "eta": 0.3, "nthread": 1, "seed": f},
                                  xgb.DMatrix(x, y), num_boost_round=15))
    deltas = [0.0 if f != inf_fold else math.inf for f in range(folds)]
    return LearnedGate(boosters, deltas, GateTrainingConfig(folds=folds), pd.DataFrame(), {})


def policies(gate: LearnedGate, table: pd.DataFrame, config: SimulationConfig):
    for name in COMPILED:
        yield name, make_policy(name)
    yield "gar-seed7", make_policy("gar", seed=7)
    yield "carbonrouter (learned gate)", CarbonRouter(gate=gate)
    yield "carbonrouter-no-pricing (learned gate)", CarbonRouter(gate=gate, pricing=False)
    yield "carbonrouter (learned gate, delta -0.05)", CarbonRouter(delta=-0.05, gate=gate)
    yield "carbonrouter (oracle gate)", CarbonRouter(gate=OracleGate(table, config))
    yield "carbonrouter-no-pricing (oracle gate)", CarbonRouter(
        gate=OracleGate(table, config, pricing=False), pricing=False)
    # the horizon router and its ablations / variants (its model is fitted on the workload)
    yield "horizon", HorizonRouter()
    yield "horizon w/o slot price", HorizonRouter(slot_price=False)
    yield "horizon J=0", HorizonRouter(horizon=0)
    yield "horizon forecast noise 0.5", HorizonRouter(forecast_noise=0.5, noise_seed=3)
    yield "horizon release", HorizonRouter(release=True)
    yield "horizon slot price", HorizonRouter(slot_price=True, slot_smoothing=0.2)
    yield "horizon slot price, residence", HorizonRouter(slot_price=True, slot_smoothing=0.2,
                                                         slot_residence=True)
    yield "horizon slot price, no credit", HorizonRouter(slot_credit=False, slot_smoothing=0.2)
    yield "horizon J=1, slot price over 16 turns", HorizonRouter(horizon=1, slot_turns=16,
                                                                 slot_smoothing=0.2)
    yield "horizon TTFT SLO", HorizonRouter(ttft_slo_s=0.4, ttft_share=0.1, ttft_step=0.3)
    yield "horizon persistence, no survival", HorizonRouter(forecast="persistence",
                                                            cache_survival=False)
    yield "horizon same-hour, no stickiness, rho 0.8", HorizonRouter(
        forecast="same-hour-yesterday", model_stickiness=False, continuation=0.8, horizon=5)
    # the former router: the cheapest other model as the exit, no option to move (closed form)
    yield "horizon former (cheapest exit, no option)", HorizonRouter(exit="cheapest",
                                                                      option=False)
    yield "horizon fallback exit, no option", HorizonRouter(option=False)
    yield "horizon option, cheapest exit, no survival", HorizonRouter(
        exit="cheapest", cache_survival=False, smoothing=0.3)
    yield "horizon return exit", HorizonRouter(exit="return", smoothing=0.3)
    # the default has the KV price within the TTL (the pair); every loss, and the router before it
    yield "horizon KV price (every loss)", HorizonRouter(kv_price=True, kv_loss="all")
    yield "horizon before the pair (no KV price)", HorizonRouter(kv_price=False)
    yield "horizon KV price, return exit, TTFT SLO", HorizonRouter(
        kv_price=True, exit="return", ttft_slo_s=0.4, ttft_share=0.1, ttft_step=0.3)
    yield "horizon return exit, no option, no survival", HorizonRouter(
        exit="return", option=False, cache_survival=False)
    # references told the future (docs/evidence/told.py)
    yield "horizon told the intensities and the session length", HorizonRouter(
        forecast="clairvoyant", session_length="told")
    yield "horizon told the session length, slot residence", HorizonRouter(
        session_length="told", slot_residence=True, slot_smoothing=0.2)
    yield "horizon told all three", HorizonRouter(forecast="clairvoyant", session_length="told",
                                                  future_models="told")
    yield "horizon told the models, cheapest exit, no option", HorizonRouter(
        future_models="told", exit="cheapest", option=False)


def assert_engines_agree(table, config, signal, backend, gate) -> dict:
    """Both loops on every compiled policy; returns the summed counters and flags (to check
    that a test reached the branches it is about)."""
    seen = {"best_effort": 0, "rejected": 0, "gate_blocked": 0, "opportunities": 0,
            "released_caches": 0}
    totals: dict[str, int] = {}
    for label, _ in policies(gate, table, config):
        if label.startswith("horizon") and table["session"].nunique() < 20:
            continue  # too few conversations to fit the horizon model on held-out folds
        out = {}
        for engine in ("python", "compiled"):
            policy = build_policy(dict(policies(gate, table, config))[label], table, config,
                                  signal=signal, backend=backend)
            out[engine] = (simulate(table, policy, config, signal, backend, engine=engine),
                           dict(getattr(policy, "opportunities", {})),
                           dict(getattr(policy, "blocked", {})))
        (py, py_opp, py_blk), (cc, cc_opp, cc_blk) = out["python"], out["compiled"]
        pd.testing.assert_frame_equal(cc.records, py.records, check_exact=True, obj=label)
        assert cc.counters == py.counters, label
        assert (cc_opp, cc_blk) == (py_opp, py_blk), label
        rec = py.records
        seen["best_effort"] += int(rec["best_effort"].sum())
        seen["rejected"] += int(rec["rejected"].sum())
        seen["gate_blocked"] += int(rec["gate_blocked"].sum())
        seen["opportunities"] += int(rec["switch_opportunity"].sum())
        for k, v in py.counters.items():
            totals[k] = totals.get(k, 0) + v
    # the gate's training labels: the same opportunities, features and two-branch carbons
    seen["labels"] = 0
    for pricing in (True, False):
        py, cc = (collect_opportunities(table, config, signal, backend, pricing=pricing,
                                        engine=engine) for engine in ("python", "compiled"))
        pd.testing.assert_frame_equal(cc, py, check_exact=True, obj=f"labels, pricing {pricing}")
        seen["labels"] += len(py)
    return seen | totals


def random_workload(seed: int, n_sessions: int, span_s: float) -> pd.DataFrame:
    """Sessions of 1–8 turns with long and short contexts, think times on a 30-s grid (exact
    ties of completion and dispatch times), arrivals on a 60-s grid, quality per model."""
    rng = np.random.default_rng(seed)
    factor = rng.uniform(0.8, 1.25, len(MODELS))
    specs = []
    for _ in range(n_sessions):
        turns = []
        for _ in range(int(rng.integers(1, 9))):
            size = rng.choice([rng.integers(0, 3000), rng.integers(10000, 40000)], p=[0.8, 0.2])
            turns.append({"new": np.rint(size * factor),
                          "out": np.rint(rng.integers(0, 1500) * factor),
                          "est": np.rint(rng.integers(0, 1500) * factor),
                          "quality": rng.uniform(0.6, 1.0, len(MODELS)),
                          "think": float(30 * rng.integers(0, 20))})
        specs.append((float(60 * rng.integers(0, int(span_s // 60))), turns))
    return make_table(specs)


def random_signal(seed: int, regions: tuple[str, ...], rows: int) -> CarbonSignal:
    rng = np.random.default_rng(seed)
    levels = rng.uniform(20, 600, size=(rows, len(regions)))
    levels[rng.random(levels.shape) < 0.3] = 300.0  # exact ties between regions
    index = pd.date_range(pd.Timestamp(T0, unit="s", tz="UTC"), periods=rows, freq="5min")
    return CarbonSignal(pd.DataFrame(levels, index=index, columns=list(regions)))


@pytest.mark.parametrize("kv", ["shared", "per-deployment"])
def test_engines_agree_under_pressure(kv):
    """Three regions, 250 sessions in 3 hours on 2 slots per pool, KV memory a few contexts,
    a 10-minute TTL and a 1.5-s TTFT bound: every branch of the backend is taken."""
    table = random_workload(1, 250, 3 * 3600)
    config = SimulationConfig(regions=REGIONS3, d_ttft_s=1.5)
    signal = random_signal(2, REGIONS3, 12 * 24)
    n = config.deployments().n
    if kv == "shared":
        backend = BackendConfig(slots_per_pool=2, kv_tokens_per_pool=60000.0, ttl_s=600.0)
    else:
        per_dep = tuple(np.random.default_rng(3).uniform(5000, 80000, n).tolist())
        backend = BackendConfig(slots_per_pool=2, kv_tokens_per_pool=None, ttl_s=600.0,
                                kv_tokens_per_deployment=per_dep)
    seen = assert_engines_agree(table, config, signal, backend, random_gate())
    for what in ("best_effort", "rejected", "gate_blocked", "opportunities", "evicted_caches",
                 "expired_caches", "kv_overflow_events", "released_caches", "labels"):
        assert seen[what] > 0, f"the workload did not reach {what}"


@settings(max_examples=25, deadline=None)
@given(workloads())
def test_engines_agree_on_random_small_workloads(case):
    table, values, backend, _ = case
    assert_engines_agree(table, CONFIG, make_signal(values), backend, random_gate(seed=4))


def test_engine_choice_and_errors():
    table = random_workload(5, 5, 600)
    signal = random_signal(6, REGIONS3, 48)
    config = SimulationConfig(regions=REGIONS3)
    with pytest.raises(ValueError, match="engine must be"):
        simulate(table, "faircarbon", config, signal, engine="numba")
    gated = CarbonRouter(delta=0.0, gate=lambda *_: 1.0)  # a gate of one's own: Python only
    with pytest.raises(ValueError, match="cannot replay"):
        simulate(table, gated, config, signal, engine="compiled")
    assert len(simulate(table, gated, config, signal).records) == len(table)  # auto: Python
    # timing the decisions changes nothing else; every query gets one time, in ns
    plain = simulate(table, "faircarbon", config, signal, engine="compiled")
    timed = simulate(table, "faircarbon", config, signal, engine="compiled", time_decisions=True)
    pd.testing.assert_frame_equal(timed.records, plain.records, check_exact=True)
    assert plain.decision_ns is None and timed.decision_ns.shape == (len(table),)
    assert (timed.decision_ns >= 0).all() and (timed.decision_ns < 10**9).all()
    # a signal that ends before the replay does: the signal's own error, from both loops
    short = random_signal(6, REGIONS3, 2)
    late = table.copy()
    late.loc[late["turn"] == 0, "arrival_s"] += 3600.0
    for engine in ("python", "compiled"):
        with pytest.raises(ValueError, match="carbon signal queried at"):
            simulate(late, "faircarbon", config, short, engine=engine)


def test_labeler_keeps_the_order_of_its_replays():
    """A labeler replayed twice (the Python loop, then the compiled one) holds both replays'
    opportunities in that order, each the same as a labeler of its own gives."""
    from carbonrouter_lib.gate import TwoBranchLabeler

    table = random_workload(7, 80, 3600)
    signal = random_signal(8, REGIONS3, 48)
    config = SimulationConfig(regions=REGIONS3)
    backend = BackendConfig(slots_per_pool=3, kv_tokens_per_pool=50000.0, ttl_s=900.0)
    both = TwoBranchLabeler(table, config)
    alone = {}
    for engine in ("python", "compiled"):
        simulate(table, CarbonRouter(gate=both), config, signal, backend, engine=engine)
        alone[engine] = collect_opportunities(table, config, signal, backend, engine=engine)
    assert len(alone["python"]) > 0
    pd.testing.assert_frame_equal(both.frame(), pd.concat([alone["python"], alone["compiled"]],
                                                          ignore_index=True), check_exact=True)


def test_the_return_exit_changes_decisions_the_engines_agree_on():
    # a workload like test_engines_agree_under_pressure's with KV memory for a few contexts more
    # and an hour's TTL (so that caches left behind survive to be returned to), where both loops
    # give the return exit's records to the bit and it routes otherwise than the fallback exit
    # (so that the agreement covers its branch, the caches left and p_left's observations)
    table = random_workload(7, 250, 3 * 3600)
    config = SimulationConfig(regions=REGIONS3, d_ttft_s=1.5)
    signal = random_signal(8, REGIONS3, 12 * 24)
    backend = BackendConfig(slots_per_pool=4, kv_tokens_per_pool=3e5, ttl_s=3600.0)
    records = {}
    for exit_, engine in (("fallback", "compiled"), ("return", "compiled"), ("return", "python")):
        policy = build_policy(HorizonRouter(exit=exit_, smoothing=0.3), table, config,
                              signal=signal, backend=backend)
        records[exit_, engine] = simulate(table, policy, config, signal, backend,
                                          engine=engine).records
    pd.testing.assert_frame_equal(records["return", "compiled"], records["return", "python"],
                                  check_exact=True)
    moved = records["fallback", "compiled"]["deployment"] != records["return", "compiled"][
        "deployment"]
    assert moved.sum() > 10


class _Forbid(HorizonRouter):
    """The router with an extra price that rules out every deployment but the last candidate
    (a test of HorizonRouter.extra_prices)."""

    def compiled(self, info):
        return None

    chosen = 0
    missed = 0

    def extra_prices(self, ctx, cand, st):
        price = np.full(len(cand.mask), np.inf)
        self.last = int(np.flatnonzero(cand.mask)[-1])
        price[self.last] = 0.0
        return price

    def on_served(self, ctx, a):
        super().on_served(ctx, a)
        self.chosen += 1
        self.missed += a != self.last


def test_a_subclass_prices_more_through_extra_prices():
    # HorizonRouter.extra_prices is added to the objective before the choice: a price that rules
    # out every candidate but the last leaves only that one
    table = random_workload(7, 120, 2 * 3600)
    config = SimulationConfig(regions=REGIONS3, d_ttft_s=1.5)
    signal = random_signal(8, REGIONS3, 12 * 24)
    tight = BackendConfig(slots_per_pool=4, kv_tokens_per_pool=1e5, ttl_s=600.0)
    forbid = build_policy(_Forbid(), table, config, signal=signal, backend=tight)
    simulate(table, forbid, config, signal, tight, engine="python")
    assert forbid.chosen > 500 and forbid.missed == 0


def test_kv_prices_by_hand():
    # two KV pools (deployments 0, 1 in pool 0; 2 in pool 1), two models; the session lost 300
    # of its 500 history tokens on deployment 1 (e_in − e_cache = 2e-6 kWh per token, 400 g/kWh)
    price, evict = np.full(3, 9.0), np.full(3, 9.0)
    loss, evicted = np.array([0.1, 0.0]), np.array([1000.0, 0.0])
    lam = np.array([0.1 / 1000.0, 0.0])  # the caller's λ_p, consistent with loss and evicted
    cached = np.array([0.0, 200.0, 0.0])
    post, model, pools = np.array([900.0, 2500.0]), np.array([0, 1, 1]), np.array([0, 0, 1])
    cap, used = np.array([1000, 5000], np.int64), np.array([600, 5000], np.int64)
    every = np.ones(3, bool)
    kernel.kv_prices(price, evict, loss, evicted, lam, 1, 500.0, cached,
                     np.array([3e-6, 3e-6, 4e-6]), np.array([1e-6, 1e-6, 1e-6]),
                     np.array([100.0, 400.0, 50.0]), post, model, cap, used, pools, every)
    lost = 0.1 + 300 * 2e-6 * 400
    assert loss == pytest.approx([lost, 0.0])
    assert lam == pytest.approx([lost / 1000, 0.0])  # renewed with the loss
    # pool 0 has 400 tokens free: deployment 0 adds 900, deployment 1 2500 − 200; pool 1 is full
    assert evict == pytest.approx([500.0, 1900.0, 2500.0])
    # λ_0 = lost / 1000 tokens; nothing evicted yet in pool 1, so λ_1 = 0
    assert price == pytest.approx([lost / 1000 * 500.0, lost / 1000 * 1900.0, 0.0])
    # nothing to observe (a first turn): the loss stays; a non-candidate keeps what it had
    price[:], evict[:] = 9.0, 9.0
    kernel.kv_prices(price, evict, loss, evicted, lam, -1, 0.0, cached, np.ones(3), np.zeros(3),
                     np.ones(3), post, model, cap, used, pools, np.array([True, False, True]))
    assert loss == pytest.approx([lost, 0.0])
    assert price[1] == evict[1] == 9.0
    assert price[0] == pytest.approx(lost / 1000 * 500.0) and price[2] == 0.0
    # deployment 2 is served and evicts 2500 tokens of pool 1, which has lost nothing yet: λ_1
    # stays 0; 500 more tokens evicted in pool 0 bring λ_0 to lost / 1500
    kernel.kv_evicted(evicted, lam, loss, 1, 2500.0)
    kernel.kv_evicted(evicted, lam, loss, 0, 500.0)
    assert evicted == pytest.approx([1500.0, 2500.0])
    assert lam == pytest.approx([lost / 1500, 0.0])
    assert lam[0] == loss[0] / evicted[0]  # the same division as before: the same bits


def test_the_kv_price_is_the_router_where_no_pool_fills_and_prices_where_they_do():
    # with memory for every context no turn evicts, the price is 0 and the records are the
    # router's to the bit; with tight memory it changes decisions (both engines agree on it in
    # the tests above)
    table = random_workload(7, 120, 2 * 3600)
    config = SimulationConfig(regions=REGIONS3, d_ttft_s=1.5)
    signal = random_signal(8, REGIONS3, 12 * 24)
    records = {}
    for memory, kv in (("ample", 1e12), ("tight", 1e5)):
        backend = BackendConfig(slots_per_pool=4, kv_tokens_per_pool=kv, ttl_s=600.0)
        for name, router in (("router", HorizonRouter(kv_price=False)),
                             ("kv", HorizonRouter(kv_price=True, kv_loss="all"))):
            policy = build_policy(router, table, config, signal=signal, backend=backend)
            records[memory, name] = simulate(table, policy, config, signal, backend).records
    pd.testing.assert_frame_equal(records["ample", "kv"], records["ample", "router"],
                                  check_exact=True)
    moved = records["tight", "kv"]["deployment"] != records["tight", "router"]["deployment"]
    assert moved.sum() > 10
    assert HorizonRouter(kv_price=True).params()["kv_price"] is True
    assert HorizonRouter(kv_price=False).params()["kv_price"] is False  # recorded on or off
    with pytest.raises(ValueError, match="kv_price needs horizon"):
        HorizonRouter(horizon=0, kv_price=True)


def test_the_kv_price_within_the_ttl_counts_only_what_no_expiry_took():
    # kv_loss="within_ttl": with no TTL (inf) every loss is within it and the rule is the KV
    # price's to the bit; with a short TTL it drops the expired caches' losses and routes
    # otherwise (both engines agree on it in the tests above)
    table = random_workload(7, 120, 2 * 3600)
    config = SimulationConfig(regions=REGIONS3, d_ttft_s=1.5)
    signal = random_signal(8, REGIONS3, 12 * 24)
    records = {}
    for ttl in (math.inf, 300.0):
        backend = BackendConfig(slots_per_pool=4, kv_tokens_per_pool=1e5, ttl_s=ttl)
        for rule in ("all", "within_ttl"):
            policy = build_policy(HorizonRouter(kv_price=True, kv_loss=rule), table, config,
                                  signal=signal, backend=backend)
            records[ttl, rule] = simulate(table, policy, config, signal, backend).records
    pd.testing.assert_frame_equal(records[math.inf, "within_ttl"], records[math.inf, "all"],
                                  check_exact=True)
    moved = records[300.0, "within_ttl"]["deployment"] != records[300.0, "all"]["deployment"]
    assert moved.sum() > 10
    assert HorizonRouter(kv_price=True, kv_loss="all").params()["kv_loss"] == "all"
    assert HorizonRouter(kv_price=True).params()["kv_loss"] == "within_ttl"  # the default
    assert "kv_loss" not in HorizonRouter(kv_price=False).params()
    with pytest.raises(ValueError, match="kv_loss needs kv_price"):
        HorizonRouter(kv_price=False, kv_loss="within_ttl")
    with pytest.raises(ValueError, match="kv_loss must be one of"):
        HorizonRouter(kv_price=True, kv_loss="evictions")


def test_pick_is_the_least_total_over_the_candidates_first_on_ties():
    rng = np.random.default_rng(5)
    for _ in range(300):
        n = int(rng.integers(1, 12))
        # Ĉ, the future, the slot, TTFT and KV prices, a subclass's extra: few values, so ties
        carbon, future, slot, ttft, kv, extra = rng.choice([0.0, 0.5, 1.0, 2.0], size=(6, n))
        mask = rng.random(n) < 0.6
        on = [bool(x) for x in rng.random(4) < 0.5]
        total = carbon + future
        for price, used in zip((slot, ttft, kv, extra), on, strict=True):
            if used:
                total = total + price
        want = int(np.flatnonzero(mask)[np.argmin(total[mask])]) if mask.any() else -1
        assert kernel.pick(carbon, future, slot, ttft, kv, extra, mask, *on) == want
    # no total below +inf: the first candidate
    inf = np.full(3, np.inf)
    assert kernel.pick(inf, np.zeros(3), inf, inf, inf, inf, np.array([False, True, True]),
                       False, False, False, False) == 1
