"""The clairvoyant bound: the DP against brute force, the bound against every policy's realized
carbon on random small traces, and tightness where the optimum is obvious."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_simulator import (
    AMPLE,
    BIG,
    CONFIG,
    DEPS,
    POLICY_NAMES,
    REGIONS,
    ci_grid,
    conversation,
    make_signal,
    make_table,
    run,
    workloads,
)

from carbonrouter_lib import cost, prepared
from carbonrouter_lib.bound import (
    _bound_inputs,
    _holding_matrix,
    bound_candidates,
    bound_comparison,
    capacity_priced_bound,
    capacity_rejected_sessions,
    clairvoyant_bound,
    session_bound_dp,
)
from carbonrouter_lib.policies import CarbonRouter, Policy


def brute_force(c_none, c_rev, c_full, feasible, flags) -> float:
    """Every path, its relaxed cost with an explicit set of served flags."""
    k_turns, n = feasible.shape
    choices = [np.flatnonzero(feasible[k]).tolist() or [-1] for k in range(k_turns)]
    best = math.inf
    for path in itertools.product(*choices):
        total, seen, prev = 0.0, set(), -1
        for k, j in enumerate(path):
            if j < 0:
                continue
            mine = {b for b in range(16) if flags[j] >> b & 1}
            if j == prev:
                total += c_full[k, j]
            elif mine <= seen:
                total += c_rev[k, j]
            else:
                total += c_none[k, j]
            seen |= mine
            prev = j
        best = min(best, total)
    return 0.0 if best == math.inf else best


@st.composite
def instances(draw):
    k_turns, n = draw(st.integers(1, 5)), draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    full = rng.uniform(0, 10, (k_turns, n))
    rev = full + rng.uniform(0, 10, (k_turns, n))
    none = rev + rng.uniform(0, 10, (k_turns, n))
    feasible = rng.random((k_turns, n)) < draw(st.floats(0.3, 1.0))
    mode = draw(st.sampled_from(["exact", "region", "region+model"]))
    if mode == "exact":
        flags = 1 << np.arange(n)
    else:  # deployments on 2 regions × 2 models: one region bit (and one model bit)
        region, model = rng.integers(0, 2, n), rng.integers(0, 2, n)
        flags = (1 << region) | ((1 << (2 + model)) if mode == "region+model" else 0)
    return none, rev, full, feasible, flags


@settings(max_examples=150, deadline=None)
@given(instances())
def test_dp_equals_brute_force(case):
    none, rev, full, feasible, flags = case
    total, path, kind = session_bound_dp(none, rev, full, feasible, flags)
    assert total == pytest.approx(brute_force(none, rev, full, feasible, flags), abs=1e-9)
    # The returned path is feasible and its cost is the total.
    cost = [(none, rev, full)[kd][k, j] for k, (j, kd) in enumerate(zip(path, kind,
                                                                         strict=True)) if j >= 0]
    assert sum(cost) == pytest.approx(total, abs=1e-9)
    assert all(feasible[k, j] for k, j in enumerate(path) if j >= 0)
    assert all((j < 0) == (not feasible[k].any()) for k, j in enumerate(path))


def test_coarser_tracking_gives_a_lower_bound():
    table = make_table([conversation(0.0, 4, new=2000, out=300, think=400.0,
                                     quality=(0.5,) * 5)])
    signal = make_signal(ci_grid([100, 40, 200, 80], [90, 150, 30, 300]))
    exact = clairvoyant_bound(table, CONFIG, signal, max_tracked=64)
    coarse = clairvoyant_bound(table, CONFIG, signal, max_tracked=0)
    assert set(exact["tracking"]) == {"deployment"} and set(coarse["tracking"]) == {
        "region+model"}
    assert coarse["carbon_g"].sum() <= exact["carbon_g"].sum() * (1 + 1e-12)


def test_candidates_are_the_dominant_gpu_of_each_region_and_model():
    cand = bound_candidates(DEPS)
    assert len(cand) == len(DEPS.regions) * len(DEPS.models)
    assert {DEPS.gpus[DEPS.gpu[a]] for a in cand} == {"H100"}  # analytical profiles


class RandomPolicy(Policy):
    """Uniform among the candidates (seeded): any online policy must stay above the bound."""

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def choose(self, ctx, cand):
        return int(self.rng.choice(np.flatnonzero(cand.mask)))


@settings(max_examples=40, deadline=None)
@given(workloads(), st.integers(0, 3), st.sampled_from([8, 0]))
def test_bound_is_below_every_policy_on_random_traces(case, seed, max_tracked):
    table, values, backend, _ = case
    signal = make_signal(values)
    bound = clairvoyant_bound(table, CONFIG, signal, max_tracked=max_tracked)
    per_session = bound.groupby("session")["carbon_g"].sum()
    policies = [*POLICY_NAMES, "carbonrouter", "carbonrouter-oracle-gate",
                CarbonRouter(delta=0.5, gate=lambda *_: 1.0), RandomPolicy(seed)]
    for policy in policies:
        rec = run(table, policy, values, backend).records
        skip = set(capacity_rejected_sessions(rec, bound).tolist())
        realized = rec.groupby("session")["carbon_g"].sum()
        for s, b in per_session.items():
            if s in skip:
                continue
            assert b <= realized[s] * (1 + 1e-9) + 1e-15, (getattr(policy, "name", policy), s)



class ReleasingRandom(RandomPolicy):
    """A random routing that drops the cache a session leaves behind on every switch."""

    name = "random-releasing"
    releases_caches = True

    def released(self, ctx, a):
        return (ctx.prev,) if ctx.prev >= 0 and ctx.prev != a else ()


class ReleasingGreedy(ReleasingRandom):
    """CarbonRouter's one-turn proposal (least estimated carbon, caches priced) that drops the
    cache a session leaves behind."""

    name = "greedy-releasing"

    def choose(self, ctx, cand):
        c = np.where(cand.mask, cand.carbon, np.inf)
        return int(np.argmin(c))


@settings(max_examples=30, deadline=None)
@given(workloads(), st.integers(0, 3))
def test_the_bound_without_returns_is_below_every_routing_that_drops_the_caches_it_leaves(
        case, seed):
    # returns=False: a deployment the session left holds nothing. Above the plain bound, session
    # by session, and below every replay whose policy drops the cache it leaves (a random one
    # and the one-turn proposal), capacity rejections aside.
    table, values, backend, _ = case
    signal = make_signal(values)
    plain = clairvoyant_bound(table, CONFIG, signal).groupby("session")["carbon_g"].sum()
    paths = clairvoyant_bound(table, CONFIG, signal, returns=False)
    no_return = paths.groupby("session")["carbon_g"].sum()
    assert (plain <= no_return * (1 + 1e-12) + 1e-15).all()
    for policy in (ReleasingRandom(seed), ReleasingGreedy(seed)):
        rec = run(table, policy, values, backend).records
        skip = set(capacity_rejected_sessions(rec, paths).tolist())
        realized = rec.groupby("session")["carbon_g"].sum()
        for s, b in no_return.items():
            if s not in skip:
                assert b <= realized[s] * (1 + 1e-9) + 1e-15, (policy.name, s)


def test_the_bound_without_returns_charges_the_returns_of_the_plain_bounds_path():
    # A small replay of the tuned setting: the plain bound's path returns to deployments it left
    # (relaxation 5 charges them as cached); without returns such a row would pay a
    # recomputation, and the bound rises.
    from carbonrouter_lib import horizon_eval as he
    from carbonrouter_lib.bound import ensure_bound

    wcfg, scfg = he.setting(dict(he.TUNED), "unscaled", max_conversations=40)
    plain = ensure_bound(wcfg, scfg)
    without = ensure_bound(wcfg, scfg, returns=False)
    assert (he.turn_kinds(plain) == "return").sum() > 0
    assert without["carbon_g"].sum() > plain["carbon_g"].sum() * 1.01


def test_bound_is_attained_when_staying_on_the_cleanest_region_is_optimal():
    # Region B is always 3x cleaner; ample capacity: the best routing serves every turn on B's
    # H100 and keeps the cache. CarbonRouter without gate does exactly that.
    values = ci_grid(300, 100)
    table = make_table([conversation(0.0, 5, new=900, out=200, think=240.0),
                        conversation(30.0, 3, new=4000, out=100, think=500.0)])
    bound = clairvoyant_bound(table, CONFIG, make_signal(values))
    rec = run(table, "carbonrouter-no-gate", values, AMPLE).records
    h100_b = DEPS.index("Llama-3.1-70B", "H100", "B")
    assert (bound["deployment"] == h100_b).all() and (bound["tracking"] == "deployment").all()
    np.testing.assert_allclose(bound.groupby("session")["carbon_g"].sum(),
                               rec.groupby("session")["carbon_g"].sum(), rtol=1e-12)
    assert (rec["deployment"] == h100_b).all()


def test_a_return_may_reuse_more_than_the_previous_turns_history():
    # Turn 1 keeps 1,000 of turn 0's 6,000-token context (a Mooncake turn may) and needs
    # another model; turn 2 continues turn 1 (history 9,010) on the 70B again. The replay's
    # cache on the 70B holds turn 0's 6,000 tokens and turn 2 reuses min(6,000, 9,010): more
    # than turn 1's history, which relaxation 5 once took for the most a return can reuse (the
    # bound was then above this replay). B is always cleaner: the bound is attained.
    values = ci_grid(300, 100)
    table = _return_session()
    assert prepared.model_matrix(table, "history_tokens")[:, BIG].tolist() == [0, 1000, 9010]
    bound = clairvoyant_bound(table, CONFIG, make_signal(values))
    rec = run(table, "carbonrouter-no-gate", values, AMPLE).records
    assert rec["cached_tokens"].tolist() == [0, 0, 6000]
    assert (DEPS.region[rec["deployment"]] == REGIONS.index("B")).all()
    assert rec["deployment"].iloc[0] == rec["deployment"].iloc[2]
    np.testing.assert_allclose(bound["carbon_g"].to_numpy(), rec["carbon_g"].to_numpy(),
                               rtol=1e-12)


def _return_session():
    return make_table([(0.0, [{"new": 5000, "out": 1000},
                              {"hist": 1000, "new": 8000, "out": 10, "think": 60.0,
                               "quality": (0.1, 0.1, 0.1, 0.9, 0.1)},
                              {"new": 50, "out": 10, "think": 60.0}])])


def test_following_the_bounds_path_attains_it_where_the_replay_can_carry_it_out():
    # The session above: its bound path hops to another model and returns to the 70B's cache;
    # with ample capacity the replay carries the path out and emits exactly the bound.
    from carbonrouter_lib.horizon_eval import FollowPath

    values = ci_grid(300, 100)
    table = _return_session()
    bound = clairvoyant_bound(table, CONFIG, make_signal(values))
    policy = FollowPath(bound)
    rec = run(table, policy, values, AMPLE).records
    assert (policy.followed, policy.same_region_model, policy.other) == (3, 0, 0)
    assert rec["deployment"].tolist() == bound["deployment"].tolist()
    np.testing.assert_allclose(rec["carbon_g"], bound["carbon_g"], rtol=1e-12)


def test_following_the_bounds_path_takes_another_gpu_where_its_pool_is_full():
    # Two overlapping sessions planned on B's 70B H100, one slot per pool: the second session
    # holds no slot there and takes the least-carbon other GPU of the same (region, model).
    from carbonrouter_lib.backend import BackendConfig
    from carbonrouter_lib.horizon_eval import FollowPath

    values = ci_grid(300, 100)
    table = make_table([conversation(0.0, 3, new=900, out=200, think=240.0),
                        conversation(30.0, 2, new=900, out=200, think=240.0)])
    bound = clairvoyant_bound(table, CONFIG, make_signal(values))
    h100_b = DEPS.index("Llama-3.1-70B", "H100", "B")
    assert (bound["deployment"] == h100_b).all()
    policy = FollowPath(bound)
    one_slot = BackendConfig(slots_per_pool=1, kv_tokens_per_pool=1e12, ttl_s=math.inf)
    rec = run(table, policy, values, one_slot).records
    assert (policy.followed, policy.same_region_model, policy.other) == (3, 2, 0)
    second = rec[rec["session"] == 1]["deployment"].to_numpy()
    assert (DEPS.region[second] == REGIONS.index("B")).all()
    assert (DEPS.model[second] == BIG).all() and (second != h100_b).all()
    assert rec["carbon_g"].sum() > bound["carbon_g"].sum()
    with pytest.raises(ValueError, match="FollowPath"):
        FollowPath(bound.iloc[::-1])


def test_bound_uses_the_cleanest_intensity_a_dispatch_can_see():
    # A is cleaner only in the first 5 minutes. Turn 1 arrives after a 250 s think time plus
    # its service (about 1.5 s): a policy dispatches it after 300 s (A dirty) — but no earlier
    # than 250 s, so the bound may use A's clean value (valid, and the window is reported).
    values = ci_grid([10, 500], 100)
    table = make_table([(0.0, [{"new": 400, "out": 100},
                               {"new": 400, "out": 100, "think": 299.5}])])
    bound = clairvoyant_bound(table, CONFIG, make_signal(values))
    assert bound["ci_min"].tolist() == [10.0, 10.0]
    rec = run(table, "carbonrouter-no-gate", values, AMPLE).records
    assert rec["carbon_g"].sum() >= bound["carbon_g"].sum()


def test_comparison_excludes_capacity_rejections_and_measures_the_share():
    from carbonrouter_lib.backend import BackendConfig

    values = ci_grid([100, 300] * 24, [300, 100] * 24)  # the cleaner region alternates
    big, small = {"new": 20000, "out": 200}, {"new": 100, "out": 100, "think": 300.0}
    table = make_table([(0.0, [big, small, small]), (1.0, [big, small])])
    bound = clairvoyant_bound(table, CONFIG, make_signal(values))
    recs = {p: run(table, p, values, AMPLE).records for p in ("session-affinity", "faircarbon")}
    cmp = bound_comparison(recs, bound, thresholds=(2,)).set_index(["group", "policy"])
    sa, fc = (recs[p]["carbon_g"].sum() for p in ("session-affinity", "faircarbon"))
    lo = bound["carbon_g"].sum()
    assert lo < fc <= sa
    assert cmp.loc[("all", "faircarbon"), "share_of_possible_saving"] == pytest.approx(
        (sa - fc) / (sa - lo))
    assert cmp.loc[("all", "faircarbon"), "gap_to_bound_pct"] == pytest.approx(100 * (fc / lo - 1))
    assert cmp.loc[("all", "faircarbon"), "n_sessions"] == 2
    assert cmp.loc[("> 2", "faircarbon"), "n_sessions"] == 1  # only the 3-turn session
    # Seven overlapping sessions, one slot in each of the six pools: the seventh is rejected
    # for lack of capacity, which the bound relaxes — its session leaves the comparison.
    crowd = make_table([conversation(float(i), 2, new=900, out=2000, think=60.0)
                        for i in range(7)])
    bound = clairvoyant_bound(crowd, CONFIG, make_signal(values))
    tight = BackendConfig(slots_per_pool=1, kv_tokens_per_pool=1e9, ttl_s=1e9)
    rec = run(crowd, "faircarbon", values, tight).records
    rejected = set(rec.loc[rec["rejected"], "session"])
    assert rejected and set(capacity_rejected_sessions(rec, bound).tolist()) == rejected
    cmp = bound_comparison({"session-affinity": run(crowd, "session-affinity", values,
                                                    AMPLE).records, "faircarbon": rec}, bound)
    assert (cmp["n_sessions_excluded"] == len(rejected)).all()
    assert (cmp["n_sessions"] == 7 - len(rejected)).all()


# The DP as first written with numpy (whole arrays per candidate), kept as the oracle of the
# compiled one: both must find the same minimum, path and costs, ties included.
def _reference_dp(
    c_none: np.ndarray, c_rev: np.ndarray, c_full: np.ndarray, feasible: np.ndarray,
    flags: np.ndarray,
) -> tuple[float, np.ndarray, np.ndarray]:
    """The numpy DP the compiled one replaced (the oracle)."""
    k_turns, n = feasible.shape
    flags = np.asarray(flags, dtype=np.int64)
    n_bits = int(flags.max()).bit_length() if n else 0
    n_sets = 1 << n_bits
    none = n  # "no previous deployment"
    dp = np.full((n + 1, n_sets), np.inf)
    dp[none, 0] = 0.0
    sets = np.arange(n_sets)
    back_p = np.zeros((k_turns, n + 1, n_sets), dtype=np.int32)
    back_s = np.zeros((k_turns, n + 1, n_sets), dtype=np.int32)
    served = np.zeros(k_turns, dtype=bool)
    for k in range(k_turns):
        cand = np.flatnonzero(feasible[k])
        if cand.size == 0:
            continue
        served[k] = True
        new = np.full_like(dp, np.inf)
        for j in cand:
            bit = int(flags[j])
            in_set = (sets & bit) == bit  # (n_sets,)
            cost = np.where(in_set, c_rev[k, j], c_none[k, j])[None, :].repeat(n + 1, axis=0)
            cost[j, :] = c_full[k, j]
            total = dp + cost
            p_best = np.argmin(total, axis=0)  # first minimum: lowest previous index
            v_best = total[p_best, sets]
            target = sets | bit
            # Per target set, the smallest value (ties: the smallest source set).
            order = np.lexsort((sets, v_best, target))
            first = np.ones(order.size, dtype=bool)
            first[1:] = target[order][1:] != target[order][:-1]
            src = order[first]
            tgt = target[src]
            better = v_best[src] < new[j, tgt]
            new[j, tgt[better]] = v_best[src][better]
            back_p[k, j, tgt[better]] = p_best[src][better]
            back_s[k, j, tgt[better]] = src[better]
        dp = new
    if not served.any():
        return 0.0, np.full(k_turns, -1), np.full(k_turns, -1)
    flat = int(np.argmin(dp))
    p, s = divmod(flat, n_sets)
    total = float(dp[p, s])
    path = np.full(k_turns, -1)
    kind = np.full(k_turns, -1)
    for k in range(k_turns - 1, -1, -1):
        if not served[k]:
            continue
        path[k] = p
        p, s = int(back_p[k, p, s]), int(back_s[k, p, s])
    # Which cost applied at each turn of the path (the DP stores totals only).
    seen = 0
    prev = -1
    for k in range(k_turns):
        j = int(path[k])
        if j < 0:
            continue
        bit = int(flags[j])
        kind[k] = 2 if j == prev else (1 if seen & bit == bit else 0)
        seen |= bit
        prev = j
    return total, path, kind



@pytest.mark.parametrize("seed", range(40))
def test_compiled_dp_equals_the_numpy_dp(seed):
    rng = np.random.default_rng(seed)
    k, n = int(rng.integers(1, 9)), int(rng.integers(1, 7))
    # small integer costs: many exact ties, which both must break the same way
    c_full = rng.integers(0, 4, (k, n)).astype(float)
    c_rev = c_full + rng.integers(0, 3, (k, n))
    c_none = c_rev + rng.integers(0, 3, (k, n))
    feasible = rng.random((k, n)) < 0.7
    feasible[rng.integers(0, k)] = False  # a turn every policy rejects
    if seed % 2:
        flags = 1 << np.arange(n)
    else:  # region+model bits: several candidates share a bit
        flags = (1 << rng.integers(0, 2, n)) | (1 << (2 + rng.integers(0, 2, n)))
    got = session_bound_dp(c_none, c_rev, c_full, feasible, flags)
    want = _reference_dp(c_none, c_rev, c_full, feasible, flags)
    assert got[0] == want[0]
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[2], want[2])


def _reference_bound(table: pd.DataFrame, config, signal, max_tracked: int) -> pd.DataFrame:
    """The bound's session loop as it was before it was compiled (numpy per session, the DP of
    session_bound_dp), on the same inputs: the oracle of the compiled loop."""
    deps = config.deployments()
    x = _bound_inputs(table, config, signal)
    new, hist, out, feasible_all = x["new"], x["hist"], x["out"], x["feasible"]
    think, max_service = x["think"], x["max_service"]
    arrival = table["arrival_s"].to_numpy(np.float64)
    starts, ends, grid, end_s = x["starts"], x["ends"], x["grid"], x["end_s"]
    turn = table["turn"].to_numpy(np.int64)
    cand = bound_candidates(deps)
    region_c, model_c = deps.region[cand], deps.model[cand]
    e_in, e_cache, e_out = deps.e_in[cand], deps.e_cache[cand], deps.e_out[cand]
    rows = []
    for i0, i1 in zip(starts.tolist(), ends.tolist(), strict=True):
        k_turns = i1 - i0
        lo = arrival[i0] + np.concatenate([[0.0], np.cumsum(think[i0 + 1:i1])])
        hi = lo + np.concatenate([[0.0], np.cumsum(max_service[i0:i1 - 1])])
        r_lo = np.array([signal.row_index(t) for t in lo])
        r_hi = np.array([signal.row_index(t) if t < end_s else len(grid) - 1 for t in hi])
        ci_min = np.stack([grid[a:b + 1].min(axis=0) for a, b in zip(r_lo, r_hi, strict=True)])
        feas_s = feasible_all[i0:i1][:, cand]
        used = np.flatnonzero(feas_s.any(axis=0))
        if used.size == 0:
            rows.append(pd.DataFrame({"deployment": -1, "carbon_g": 0.0, "energy_kwh": 0.0,
                                      "ci_min": np.nan, "tracking": "deployment"},
                                     index=range(k_turns)))
            continue
        feas = feas_s[:, used]
        m, r = model_c[used], region_c[used]
        n_new, n_hist, n_out = new[i0:i1][:, m], hist[i0:i1][:, m], out[i0:i1][:, m]
        # a return reuses at most min(the longest context after turns 0 … k − 2, N_hist)
        ctx = n_hist + n_new + n_out
        older = np.vstack([np.zeros((2, used.size)), np.maximum.accumulate(ctx, axis=0)[:-2]])
        h_prev = np.minimum(older[:k_turns], n_hist)
        ei, ec, eo = e_in[used], e_cache[used], e_out[used]
        e_none = cost.energy_kwh(ei, ec, eo, n_new, n_hist, 0.0, n_out)
        e_rev = cost.energy_kwh(ei, ec, eo, n_new, n_hist, h_prev, n_out)
        e_full = cost.energy_base_kwh(ei, ec, eo, n_new, n_hist, n_out)
        ci = ci_min[:, r]
        if used.size <= max_tracked:
            flags, tracking = 1 << np.arange(used.size), "deployment"
        else:
            _, r_bit = np.unique(r, return_inverse=True)
            _, m_bit = np.unique(m, return_inverse=True)
            flags = (1 << r_bit) | (1 << (r_bit.max() + 1 + m_bit))
            tracking = "region+model"
        _, path, kind = session_bound_dp(ci * e_none, ci * e_rev, ci * e_full, feas, flags)
        served = path >= 0
        ks, js = np.arange(k_turns), np.maximum(path, 0)
        energy = np.where(served, np.choose(np.maximum(kind, 0), [e_none[ks, js], e_rev[ks, js],
                                                                  e_full[ks, js]]), 0.0)
        ci_used = np.where(served, ci[ks, js], np.nan)
        rows.append(pd.DataFrame({"deployment": np.where(served, cand[used][js], -1),
                                  "carbon_g": np.where(served, ci_used * energy, 0.0),
                                  "energy_kwh": energy, "ci_min": ci_used, "tracking": tracking}))
    ref = pd.concat(rows, ignore_index=True)
    ref.insert(0, "n_turns", table["n_turns"].to_numpy(np.int64))
    ref.insert(0, "turn", turn)
    ref.insert(0, "session", table["session"].to_numpy(np.int64))
    ref["deployment"] = ref["deployment"].astype(np.int64)
    ref["tracking"] = pd.DataFrame({"t": ref["tracking"].to_numpy(object)})["t"]
    return ref


@settings(max_examples=30, deadline=None)
@given(workloads(), st.sampled_from([8, 2, 0]))
def test_compiled_bound_equals_the_per_session_reference(case, max_tracked):
    table, values, _, _ = case
    signal = make_signal(values)
    got = clairvoyant_bound(table, CONFIG, signal, max_tracked=max_tracked)
    want = _reference_bound(table, CONFIG, signal, max_tracked)
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    # no turn is charged a negative recomputation (a return reuses at most its own history)
    assert (got["energy_kwh"] >= 0).all()



@settings(max_examples=30, deadline=None)
@given(workloads(), st.integers(1, 12), st.booleans())
def test_the_bound_in_parts_of_sessions_is_the_whole_tables(case, part_rows, returns):
    # clairvoyant_bound builds its inputs and runs per part of whole sessions (part_rows; a
    # longer session a part of its own): every session's bound is its own, so every row is the
    # same to the bit as in one part; a third of the table, or one row, a part
    table, values, _, _ = case
    signal = make_signal(values)
    whole = clairvoyant_bound(table, CONFIG, signal, returns=returns, part_rows=len(table))
    for rows in (part_rows, max(1, len(table) // 3), 1):
        pd.testing.assert_frame_equal(
            clairvoyant_bound(table, CONFIG, signal, returns=returns, part_rows=rows), whole,
            check_exact=True)
    with pytest.raises(ValueError, match="part_rows"):
        clairvoyant_bound(table, CONFIG, signal, part_rows=0)

def test_share_of_possible_saving():
    from carbonrouter_lib.bound import share_of_possible_saving

    assert share_of_possible_saving(10.0, 7.0, 4.0) == 0.5
    assert share_of_possible_saving(10.0, 4.0, 4.0) == 1.0
    assert share_of_possible_saving(10.0, 12.0, 4.0) == -1 / 3
    assert math.isnan(share_of_possible_saving(4.0, 3.0, 4.0))


# --- the bound with capacity priced ------------------------------------------------------------


def _windows(table, values):
    x = _bound_inputs(table, CONFIG, make_signal(values), shortest=True)
    return x["lo"], x["hi"], x["gap"]


def _overlap(t0, t1, origin, width, n_b):
    """(rows, buckets): |[t0, t1) ∩ b|, s, computed directly."""
    edges = origin + width * np.arange(n_b + 1)
    return np.clip(np.minimum(t1[:, None], edges[None, 1:])
                   - np.maximum(t0[:, None], edges[None, :-1]), 0.0, None)


def test_the_holding_weights_by_hand():
    # Two rows, a gap of 300 s: the holding is [d, d + 300) or longer. Row 0, d ∈ [0, 500]: in
    # one 1,000-s bucket it lasts at least 300 s, though the part common to every holding,
    # [hi_k, lo_{k+1}) = [500, 300), is empty (the former charge: 0); in 200-s buckets every
    # bucket can be missed (d = 0 misses [400, 800), d = 500 misses [0, 400)). Row 1,
    # d ∈ [0, 100]: [0, 200) holds at least 100 s (d = 100), [200, 400) at least 100 s (d = 0).
    lo, hi, gap = np.array([0.0, 0.0]), np.array([500.0, 100.0]), np.array([300.0, 300.0])
    one = _holding_matrix(lo, hi, gap, 0.0, 1000.0, 1).toarray()
    np.testing.assert_allclose(one, [[300.0], [300.0]])
    fine = _holding_matrix(lo, hi, gap, 0.0, 200.0, 4).toarray()
    np.testing.assert_allclose(fine, [[0, 0, 0, 0], [100, 100, 0, 0]])
    # a session's last turn (gap 0) holds nothing after it
    assert _holding_matrix(lo, hi, np.zeros(2), 0.0, 200.0, 4).nnz == 0


@settings(max_examples=30, deadline=None)
@given(workloads(), st.sampled_from([7.0, 60.0, 1800.0]))
def test_every_policy_holds_the_slot_at_least_the_charged_time(case, width):
    # In every replay and every bucket of time, the session holds turn k's slot from its dispatch
    # to turn k + 1's at least as long as the priced bound charges (W[k, b]), and the charge is
    # at least the former one, the part common to every holding, [hi_k, lo_{k+1}).
    table, values, backend, _ = case
    lo, hi, gap = _windows(table, values)
    last = table["turn"].to_numpy() == table["n_turns"].to_numpy() - 1
    assert (gap[last] == 0).all() and (gap >= 0).all()
    origin = float(lo.min())
    n_b = max(1, math.ceil((float((hi + gap).max()) - origin) / width))
    w = _holding_matrix(lo, hi, gap, origin, width, n_b).toarray()
    lo_next = np.r_[lo[1:], 0.0]
    former = np.where(last[:, None], 0.0,
                      _overlap(hi, np.maximum(lo_next, hi), origin, width, n_b))
    assert (w >= former - 1e-6).all()
    checked = 0
    for policy in [*POLICY_NAMES, "carbonrouter"]:
        rec = run(table, policy, values, backend).records.sort_values(["session", "turn"])
        if len(capacity_rejected_sessions(rec, clairvoyant_bound(table, CONFIG,
                                                                 make_signal(values)))):
            continue
        d = rec["dispatch_s"].to_numpy()
        held = _overlap(d, np.r_[d[1:], 0.0], origin, width, n_b)
        assert (held[~last] >= w[~last] - 1e-6).all()
        checked += 1
    assert checked > 0


def test_the_priced_bound_at_zero_prices_is_the_plain_bound():
    from carbonrouter_lib.backend import BackendConfig

    values = ci_grid([100, 300] * 24, [300, 100] * 24)
    table = make_table([conversation(float(10 * i), 3, new=900, out=300, think=400.0)
                        for i in range(5)])
    plain = clairvoyant_bound(table, CONFIG, make_signal(values))
    no_ttl = BackendConfig(slots_per_pool=1, kv_tokens_per_pool=1e4, ttl_s=math.inf)
    priced = capacity_priced_bound(table, CONFIG, make_signal(values), no_ttl, upper_g=1.0,
                                   iterations=0)
    assert priced["bound_g"] == priced["ttl_g"] == priced["plain_g"]
    assert priced["plain_g"] == pytest.approx(plain["carbon_g"].sum(), rel=1e-12)
    pd.testing.assert_frame_equal(priced["records"].drop(columns=["price_g", "held_tokens",
                                                                  "returned"]),
                                  plain)
    assert (priced["records"]["price_g"] == 0).all()
    # the cache each row reused is the one its energy implies (Eq. 4 solved for L)
    rec = priced["records"]
    a = rec["deployment"].to_numpy()
    m = DEPS.model[a]
    rows = np.arange(len(rec))
    tok = {q: prepared.model_matrix(table, q).astype(float)[rows, m]
           for q in ("new_tokens", "history_tokens", "output_tokens")}
    e_in, e_cache, e_out = DEPS.e_in[a], DEPS.e_cache[a], DEPS.e_out[a]
    implied = (e_in * (tok["new_tokens"] + tok["history_tokens"]) + e_out * tok["output_tokens"]
               - rec["energy_kwh"].to_numpy()) / (e_in - e_cache)
    np.testing.assert_allclose(rec["held_tokens"], implied, rtol=1e-6, atol=1e-3)
    assert (rec["held_tokens"] > 0).any() and (rec["held_tokens"][rec["turn"] == 0] == 0).all()
    # A TTL below the think times: every turn after the first recomputes its history, exactly.
    short = dataclasses.replace(no_ttl, ttl_s=300.0)
    ttl = capacity_priced_bound(table, CONFIG, make_signal(values), short, upper_g=1.0,
                                iterations=0)
    assert ttl["ttl_g"] > ttl["plain_g"] and (ttl["records"]["held_tokens"] == 0).all()
    rec = run(table, "carbonrouter-no-gate", values, short).records
    assert rec.loc[rec["turn"] > 0, "cached_tokens"].eq(0).all()
    assert ttl["ttl_g"] <= rec["carbon_g"].sum() * (1 + 1e-12)


@settings(max_examples=25, deadline=None)
@given(workloads(), st.sampled_from([300.0, 1800.0]))
def test_the_priced_bound_is_below_every_capacity_feasible_replay(case, bucket_s):
    # Weak duality: every iterate (not only the best) is at most the realized carbon of every
    # replay on the same backend (slots, KV memory, TTL) in which no query was rejected for
    # lack of capacity.
    table, values, backend, _ = case
    plain = clairvoyant_bound(table, CONFIG, make_signal(values))
    realized = []
    for policy in [*POLICY_NAMES, "carbonrouter"]:
        rec = run(table, policy, values, backend).records
        if len(capacity_rejected_sessions(rec, plain)) == 0:
            realized.append(rec["carbon_g"].sum())
    # the step target: a replay's carbon, or (none feasible) one far above
    priced = capacity_priced_bound(table, CONFIG, make_signal(values), backend,
                                   upper_g=max(realized, default=10 * plain["carbon_g"].sum()),
                                   iterations=6, bucket_s=bucket_s)
    assert priced["bound_g"] >= priced["ttl_g"] >= priced["plain_g"] * (1 - 1e-12)
    assert priced["history"]["bound_g"].max() == priced["bound_g"]
    for c in realized:
        assert (priced["history"]["bound_g"] <= c * (1 + 1e-9) + 1e-12).all()


def test_capacity_lifts_the_bound_where_the_clean_region_cannot_hold_everyone():
    # Ten simultaneous long sessions; region B is 4x cleaner, but it holds 6 sessions (two slots
    # in each of its three GPU pools): the plain bound puts all ten there, the priced bound
    # must charge some of them A's intensity, and stays below the best replay.
    from carbonrouter_lib.backend import BackendConfig

    values = ci_grid(400, 100)
    table = make_table([conversation(float(i), 6, new=3000, out=400, think=900.0)
                        for i in range(10)])
    tight = BackendConfig(slots_per_pool=2, kv_tokens_per_pool=1e12, ttl_s=math.inf)
    reps = {p: run(table, p, values, tight).records for p in ("carbonrouter-no-gate",
                                                             "carbon-affinity")}
    plain = clairvoyant_bound(table, CONFIG, make_signal(values))
    assert all(len(capacity_rejected_sessions(r, plain)) == 0 for r in reps.values())
    best = min(r["carbon_g"].sum() for r in reps.values())
    priced = capacity_priced_bound(table, CONFIG, make_signal(values), tight, upper_g=best,
                                   iterations=30)
    lo = priced["plain_g"]
    assert priced["bound_g"] <= best * (1 + 1e-9)
    # at least half of the gap between the plain bound and the best replay is closed
    assert priced["bound_g"] - lo >= 0.5 * (best - lo)


def test_kv_memory_lifts_the_bound_where_caches_cannot_all_be_kept():
    # Four overlapping sessions whose histories grow to 40K tokens, one region cleaner, KV
    # memory for about one history per region: the plain bound keeps every cache, the priced
    # bound must pay for recomputing most histories, and stays below the best replay.
    from carbonrouter_lib.backend import BackendConfig

    values = ci_grid(400, 100)
    table = make_table([conversation(float(i), 5, new=8000, out=200, think=300.0)
                        for i in range(4)])
    small = BackendConfig(slots_per_pool=8, kv_tokens_per_pool=1.5e4, ttl_s=math.inf)
    plain = clairvoyant_bound(table, CONFIG, make_signal(values))
    reps = [run(table, p, values, small).records for p in POLICY_NAMES]
    assert all(len(capacity_rejected_sessions(r, plain)) == 0 for r in reps)
    best = min(r["carbon_g"].sum() for r in reps)
    priced = capacity_priced_bound(table, CONFIG, make_signal(values), small, upper_g=best,
                                   iterations=30)
    lo = priced["plain_g"]
    assert lo < best and priced["bound_g"] <= best * (1 + 1e-9)
    assert priced["bound_g"] - lo >= 0.3 * (best - lo)
    assert priced["history"]["kv_excess"].iloc[0] > 0.3  # the plain paths hold far too much


@settings(max_examples=40, deadline=None)
@given(workloads(), st.integers(0, 2**32 - 1))
def test_with_prices_a_reused_cache_is_one_the_deployment_holds(case, seed):
    # With prices every GPU is a candidate, and a cache is its deployment's, as in the replay:
    # a row that reuses the previous turn's cache is on the previous turn's deployment, and a
    # return (an older cache) goes to a (region, model) the session served before. Random
    # prices make other GPUs of the (region, model) cheaper at some turns; the former rule (the
    # cache status the (region, model)'s, each turn on its cheapest GPU) reused a cache on
    # another GPU than the one that held it.
    from carbonrouter_lib.bound import _kv_pools

    table, values, backend, _ = case
    rng = np.random.default_rng(seed)
    kv_pool, _ = _kv_pools(DEPS, backend)
    n = len(table)
    price = rng.choice([0.0, 1.0, 50.0], size=(n, DEPS.n_pools))
    hold = rng.choice([0.0, 1e-4, 1e-2], size=(n, int(kv_pool.max()) + 1))
    rec = clairvoyant_bound(table, CONFIG, make_signal(values), price=price, hold=hold,
                            kv_pool=kv_pool, ttl_s=backend.ttl_s)
    key = DEPS.region * len(DEPS.models) + DEPS.model
    for _, s in rec.groupby("session", sort=False):
        s = s[s["deployment"] >= 0]  # turns every policy rejects hold and reuse nothing
        d = s["deployment"].to_numpy()
        reused = (s["held_tokens"].to_numpy() > 0) & ~s["returned"].to_numpy()
        assert not reused[:1].any() and (d[1:][reused[1:]] == d[:-1][reused[1:]]).all()
        assert (s.loc[s["returned"], "held_tokens"] > 0).all()
        # a return goes where "served before" allows: a (region, model) served at an earlier
        # turn, the previous one included (tracked per (region, model), not per GPU)
        coarse = (s["tracking"] == "region+model").to_numpy()
        for k in np.flatnonzero(s["returned"].to_numpy()):
            before = d[:k]
            if coarse[k]:  # its region and its model each served before (module docstring)
                assert DEPS.region[d[k]] in set(DEPS.region[before])
                assert DEPS.model[d[k]] in set(DEPS.model[before])
            else:
                assert k >= 1 and key[d[k]] in set(key[before])


@pytest.mark.parametrize("ttl_s", [100.0, 1000.0])
def test_a_returns_cache_expires_over_the_two_think_times_since_it_was_left(ttl_s):
    # The session that hops to another model and returns to the 70B (think times 60 s each):
    # with a 100-s TTL the 70B's cache, idle since turn 0's completion for both think times and
    # turn 1's service, has expired when turn 2 comes back, though neither think time alone
    # exceeds the TTL. The priced bound (the TTL exact) charges the return a recomputation and
    # equals the replay; with a 1,000-s TTL the cache survives and the bound credits it.
    from carbonrouter_lib.backend import BackendConfig

    values = ci_grid(300, 100)
    table = _return_session()
    backend = BackendConfig(slots_per_pool=8, kv_tokens_per_pool=1e12, ttl_s=ttl_s)
    rec = run(table, "carbonrouter-no-gate", values, backend).records
    expired = ttl_s < 120
    assert rec["cached_tokens"].tolist() == [0, 0, 0 if expired else 6000]
    priced = capacity_priced_bound(table, CONFIG, make_signal(values), backend,
                                   upper_g=float(rec["carbon_g"].sum()), iterations=0)
    assert priced["records"]["returned"].tolist() == [False, False, not expired]
    assert priced["bound_g"] == pytest.approx(rec["carbon_g"].sum(), rel=1e-12)
    assert (priced["plain_g"] < priced["bound_g"] * (1 - 1e-3)) == expired
