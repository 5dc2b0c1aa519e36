"""Feasibility (Eq. 4–7, docs/model.md §6a.1–2) and the five routing policies (docs/model.md §7,
§6a.5–7) on hand-built
queries whose answers are derived by hand or by a brute-force re-implementation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from carbonrouter_lib.deployments import Deployments
from carbonrouter_lib.policies import (
    POLICIES,
    Candidates,
    CarbonAffinity,
    CarbonRouter,
    ConstraintConfig,
    FairCarbon,
    GARDagger,
    QueryContext,
    SessionAffinity,
    feasibility,
    make_policy,
)
from carbonrouter_lib.quality import feasible_models

D2 = Deployments.build(("A", "B"))
D4 = Deployments.build(("AT", "GB", "BE", "US-CAL-CISO"))
ONLY_70B = [0.1, 0.1, 0.1, 0.1, 0.9]  # only Llama-3.1-70B passes β_Q = 0.85
ALL_EQUAL = [0.5] * 5
GAMMA, KAPPA = 0.05, 6.0  # docs/model.md §3: e_cache = γ·e_in, e_out = κ·e_in


def ctx_for(d: Deployments = D2, **kw) -> QueryContext:
    """A validated context; defaults: first turn, 100 new / 0 history / 100 output tokens for
    every model, all models equal quality, 100 gCO2e/kWh everywhere, everything available."""
    fields = dict(
        session=0, turn=0, prev=-1, cached=np.zeros(d.n), n_new=np.full(5, 100.0),
        n_hist=np.zeros(5), n_out_est=np.full(5, 100.0), quality=ALL_EQUAL,
        ci=np.full(len(d.regions), 100.0), available=np.ones(d.n, dtype=bool),
        free_slots=np.full(d.n_pools, 10),
    )
    fields.update(kw)
    for k in ("n_new", "n_hist", "n_out_est"):
        fields[k] = np.broadcast_to(np.asarray(fields[k], dtype=float), (5,))
    return QueryContext.build(d, **fields)


def decide(policy, ctx, config=None):
    cand = feasibility(ctx, config)
    assert not cand.rejected
    a = policy.choose(ctx, cand)
    assert cand.mask[a], "a policy must choose a candidate"
    return a


def cached_at(d: Deployments, entries: dict[int, float]) -> np.ndarray:
    out = np.zeros(d.n)
    for a, v in entries.items():
        out[a] = v
    return out


# ---------------------------------------------------------------------------------------------
# Context and cost model


def test_context_broadcasts_tokens_by_model_and_ci_by_region():
    cached = np.arange(D2.n) * 1000.0
    ctx = ctx_for(n_new=[1, 2, 3, 4, 5], n_hist=[10, 20, 30, 40, 50],
                  n_out_est=[7, 8, 9, 10, 11], ci=[50.0, 300.0], cached=cached)
    for a in range(D2.n):
        m, r = D2.model[a], D2.region[a]
        assert ctx.n_new[a] == m + 1 and ctx.n_hist[a] == 10 * (m + 1)
        assert ctx.n_out_est[a] == m + 7
        assert ctx.ci[a] == (50.0, 300.0)[r]
        assert ctx.cached[a] == min(1000.0 * a, 10 * (m + 1))  # clipped to N_hist(m)


def test_costs_follow_eq_4_to_6():
    d = D4
    rng = np.random.default_rng(1)
    n_new, n_hist, n_out = (rng.integers(0, 5000, 5).astype(float) for _ in range(3))
    cached = rng.integers(0, 6000, d.n).astype(float)
    ci = np.array([40.0, 200.0, 150.0, 260.0])
    cand = feasibility(ctx_for(d, n_new=n_new, n_hist=n_hist, n_out_est=n_out, cached=cached,
                               ci=ci))
    for a in range(d.n):
        m = d.model[a]
        L = min(cached[a], n_hist[m])
        e = d.e_in[a] * (n_new[m] + n_hist[m] - L) + d.e_cache[a] * L + d.e_out[a] * n_out[m]
        eb = d.e_in[a] * n_new[m] + d.e_cache[a] * n_hist[m] + d.e_out[a] * n_out[m]
        ci_a = ci[d.region[a]]
        assert cand.energy[a] == pytest.approx(e, rel=1e-12)
        assert cand.energy_base[a] == pytest.approx(eb, rel=1e-12)
        assert cand.carbon[a] == pytest.approx(ci_a * e, rel=1e-12)
        assert cand.carbon_base[a] == pytest.approx(ci_a * eb, rel=1e-12)
        assert cand.miss[a] == n_hist[m] - L
        assert cand.ttft[a] == (n_new[m] + n_hist[m] - L) / d.v_pre[a]  # exact: same division
    # A miss always costs at least the base energy.
    assert np.all(cand.energy >= cand.energy_base)


def test_context_validation_names_the_field():
    with pytest.raises(ValueError, match="quality"):
        ctx_for(quality=[0.5, 0.5, 1.2, 0.5, 0.5])
    with pytest.raises(ValueError, match="n_hist_m"):
        ctx_for(n_hist=[-1, 0, 0, 0, 0])
    with pytest.raises(ValueError, match="cached"):
        ctx_for(cached=np.full(D2.n, -5.0))
    with pytest.raises(ValueError, match="prev"):
        ctx_for(prev=D2.n)
    with pytest.raises(ValueError):  # wrong shape
        ctx_for(available=np.ones(D2.n + 1, dtype=bool))


def test_constraint_config_validation():
    assert ConstraintConfig() == ConstraintConfig(beta_q=0.85, d_ttft_s=5.0)
    for bad in (0.0, 1.01, math.nan):
        with pytest.raises(ValueError, match="beta_q"):
            ConstraintConfig(beta_q=bad)
    for bad in (0.0, -1.0, math.nan):
        with pytest.raises(ValueError, match="d_ttft_s"):
            ConstraintConfig(d_ttft_s=bad)
    ConstraintConfig(d_ttft_s=math.inf)


# ---------------------------------------------------------------------------------------------
# Feasibility masks, inclusive bounds, best-effort and reject


def test_quality_bound_is_inclusive_and_matches_quality_module():
    q = [0.85, 0.849, 1.0, 0.2, 0.9]  # 0.85·1.0 == 0.85 exactly
    cand = feasibility(ctx_for(quality=q))
    expected = feasible_models(np.array([q]), 0.85)[0]
    assert expected.tolist() == [True, False, True, False, True]
    np.testing.assert_array_equal(cand.ok, expected[D2.model])
    np.testing.assert_array_equal(cand.mask, expected[D2.model])  # all fast: TTFT ≪ 5 s


def test_context_window_is_inclusive_per_model():
    no_ttft = ConstraintConfig(d_ttft_s=math.inf)
    # N_new + N_hist + N_out = 32,768 exactly: every model fits (32K = 32,768, docs/model.md §6a.1).
    cand = feasibility(ctx_for(n_new=20000, n_hist=12000, n_out_est=768), no_ttft)
    assert cand.ok.all()
    # One token more: the 32K models (Gemma-3-1B, Mistral-7B) drop out, the 128K ones stay.
    cand = feasibility(ctx_for(n_new=20001, n_hist=12000, n_out_est=768), no_ttft)
    assert cand.ok.tolist() == [D2.context_window[a] == 131072 for a in range(D2.n)]
    # Counts are per model (each its own tokenizer): only Llama-3.2-3B is over 131,072.
    cand = feasibility(ctx_for(n_new=[100, 131073, 131072, 100, 100], n_hist=0, n_out_est=0),
                       no_ttft)
    assert cand.ok.tolist() == [D2.model[a] != 1 for a in range(D2.n)]


def test_ttft_bound_is_inclusive():
    a = D2.index("Mistral-7B-v0.2", "A100", "B")
    ctx = ctx_for(n_new=3000, n_hist=2000, cached=cached_at(D2, {a: 500}))
    t = (3000 + 2000 - 500) / D2.v_pre[a]  # Eq. 6 by hand
    cand = feasibility(ctx, ConstraintConfig(d_ttft_s=t))
    assert cand.mask[a] and not cand.best_effort
    cand = feasibility(ctx, ConstraintConfig(d_ttft_s=float(np.nextafter(t, 0))))
    assert not cand.mask[a]


def test_best_effort_keeps_only_the_minimum_ttft():
    # 100,100 uncached tokens on the 70B: 10.3 s on H100, 11.2 s on A100, 43 s on A10 — all > 5 s.
    ctx = ctx_for(quality=ONLY_70B, n_hist=100_000)
    cand = feasibility(ctx)
    h100 = [D2.index("Llama-3.1-70B", "H100", r) for r in ("A", "B")]
    assert cand.best_effort and not cand.rejected
    assert np.flatnonzero(cand.mask).tolist() == h100  # equal TTFT in both regions
    # Unavailable deployments are not candidates even in best-effort.
    avail = np.ones(D2.n, dtype=bool)
    avail[h100[0]] = False
    cand = feasibility(ctx_for(quality=ONLY_70B, n_hist=100_000, available=avail))
    assert np.flatnonzero(cand.mask).tolist() == [h100[1]]
    # A partial cache on the 70B/A100 in B gives it the shortest TTFT: 70,100 / v_pre ≈ 7.9 s.
    b = D2.index("Llama-3.1-70B", "A100", "B")
    cand = feasibility(ctx_for(quality=ONLY_70B, n_hist=100_000, cached=cached_at(D2, {b: 30_000})))
    assert cand.best_effort and np.flatnonzero(cand.mask).tolist() == [b]
    assert cand.ttft[b] == pytest.approx(70_100 / 8914.285714, rel=1e-6) and cand.ttft[b] > 5
    # With 60,000 cached it meets the bound (40,100 tokens ≈ 4.5 s): not best-effort.
    cand = feasibility(ctx_for(quality=ONLY_70B, n_hist=100_000, cached=cached_at(D2, {b: 60_000})))
    assert not cand.best_effort and np.flatnonzero(cand.mask).tolist() == [b]
    # Every policy chooses inside the best-effort set (no switch opportunity: no gate needed).
    for name in POLICIES:
        if name == "carbonrouter-horizon":
            continue  # needs a replay (test_horizon.py)
        assert decide(make_policy(name), ctx_for(quality=ONLY_70B, n_hist=100_000)) in h100


def test_reject_when_nothing_meets_the_other_constraints():
    # Nothing available.
    cand = feasibility(ctx_for(available=np.zeros(D2.n, dtype=bool)))
    assert cand.rejected and not cand.best_effort and not cand.mask.any()
    # Nothing fits any context window.
    cand = feasibility(ctx_for(n_new=131_000, n_hist=100, n_out_est=100))
    assert cand.rejected and not cand.mask.any()
    # Only quality-infeasible models are available.
    avail = D2.model != 4
    cand = feasibility(ctx_for(quality=ONLY_70B, available=avail))
    assert cand.rejected
    # A reused buffer forgets the previous query's flags.
    cand = Candidates(D2.n)
    feasibility(ctx_for(quality=ONLY_70B, n_hist=100_000), out=cand)
    assert cand.best_effort
    feasibility(ctx_for(), out=cand)
    assert not cand.best_effort and not cand.rejected and cand.mask.all()


def _brute_force(d, n_new, n_hist, n_out, cached, q, avail, beta, dttft):
    """Eq. 7 with docs/model.md §5's best-effort and reject rules, one deployment at a time."""
    qmax = max(q)
    ok, ttft = [], []
    for a in range(d.n):
        m = d.model[a]
        L = min(cached[a], n_hist[m])
        ttft.append((n_new[m] + n_hist[m] - L) / d.v_pre[a])
        ok.append(bool(avail[a]) and q[m] >= beta * qmax
                  and n_new[m] + n_hist[m] + n_out[m] <= d.context_window[a])
    feasible = {a for a in range(d.n) if ok[a] and ttft[a] <= dttft}
    if feasible:
        return feasible, False, False
    if not any(ok):
        return set(), False, True
    tmin = min(t for t, o in zip(ttft, ok, strict=True) if o)
    return {a for a in range(d.n) if ok[a] and ttft[a] == tmin}, True, False


@st.composite
def contexts(draw):
    d = D2
    n_new = draw(st.lists(st.integers(0, 40_000), min_size=5, max_size=5))
    n_hist = draw(st.lists(st.integers(0, 100_000), min_size=5, max_size=5))
    n_out = draw(st.lists(st.integers(0, 20_000), min_size=5, max_size=5))
    cached = draw(st.lists(st.sampled_from([0, 0, 0, 500, 20_000, 90_000, 200_000]),
                           min_size=d.n, max_size=d.n))
    q = draw(st.lists(st.sampled_from([0.0, 0.3, 0.68, 0.8, 0.85, 1.0]), min_size=5,
                      max_size=5))
    avail = draw(st.lists(st.booleans(), min_size=d.n, max_size=d.n))
    ci = draw(st.lists(st.sampled_from([0.0, 30.0, 120.0, 400.0]), min_size=2, max_size=2))
    turn = draw(st.integers(0, 5))
    prev = draw(st.integers(-1, d.n - 1)) if turn > 0 else -1
    free = draw(st.lists(st.integers(0, 3), min_size=d.n_pools, max_size=d.n_pools))
    return dict(session=draw(st.integers(0, 50)), turn=turn, prev=prev,
                cached=np.array(cached, dtype=float), n_new=np.array(n_new, dtype=float),
                n_hist=np.array(n_hist, dtype=float), n_out_est=np.array(n_out, dtype=float),
                quality=np.array(q), ci=np.array(ci), available=np.array(avail),
                free_slots=np.array(free))


BOUNDS = [(0.85, 5.0), (1.0, 1.0), (0.85, 0.2), (0.85, 0.02), (0.5, 30.0)]  # (β_Q, D_TTFT s)


@settings(max_examples=200, deadline=None)
@given(contexts(), st.sampled_from(BOUNDS))
def test_feasibility_matches_brute_force(fields, bounds):
    beta, dttft = bounds
    cand = feasibility(ctx_for(**fields), ConstraintConfig(beta_q=beta, d_ttft_s=dttft))
    expected, best_effort, rejected = _brute_force(
        D2, fields["n_new"].tolist(), fields["n_hist"].tolist(), fields["n_out_est"].tolist(),
        fields["cached"].tolist(), fields["quality"].tolist(), fields["available"], beta, dttft)
    assert set(np.flatnonzero(cand.mask).tolist()) == expected
    assert (cand.best_effort, cand.rejected) == (best_effort, rejected)


@settings(max_examples=100, deadline=None)
@given(contexts())
def test_every_policy_chooses_a_candidate(fields):
    ctx = ctx_for(**fields)
    cand = feasibility(ctx)
    if cand.rejected:
        return
    chosen = {}
    for name in POLICIES:
        if name in ("carbonrouter", "carbonrouter-no-pricing"):  # the rule without a gate
            p = make_policy(name, gate=None)
        elif name in ("carbonrouter-oracle-gate", "carbonrouter-horizon"):
            continue  # need a replay (test_gate.py, test_horizon.py)
        else:
            p = make_policy(name)
        if ctx.turn == 0:
            p.on_session_start(ctx)
        chosen[name] = p.choose(ctx, cand)
        assert cand.mask[chosen[name]], name
    # The rules, restated with Python's min (first minimum in index order).
    members = [a for a in range(D2.n) if cand.mask[a]]
    b = ctx.prev
    assert chosen["faircarbon"] == min(members, key=lambda a: cand.carbon_base[a])
    assert chosen["carbonrouter"] == min(members, key=lambda a: cand.carbon[a])  # no gate
    assert chosen["carbonrouter-no-gate"] == chosen["carbonrouter"]
    assert chosen["carbonrouter-no-pricing"] == min(members, key=lambda a: cand.carbon_base[a])
    kept = b >= 0 and cand.mask[b]
    if kept:
        assert chosen["session-affinity"] == b
    else:
        free = ctx.free_slots[D2.pool]
        assert chosen["session-affinity"] == min(members,
                                                 key=lambda a: (cand.energy[a], -free[a]))
    if kept and ctx.cached[b] > 0:
        assert chosen["carbon-affinity"] == b
    else:
        assert chosen["carbon-affinity"] == min(members, key=lambda a: cand.carbon[a])


# ---------------------------------------------------------------------------------------------
# Session-Affinity


def test_session_affinity_binds_by_energy_and_breaks_ties_by_free_slots():
    p = SessionAffinity()
    h100_a = D2.index("Llama-3.1-70B", "H100", "A")
    h100_b = D2.index("Llama-3.1-70B", "H100", "B")
    # 70B on H100 has the lowest energy (e_in 0.068 vs 0.085 and 0.121 mWh/token); equal in A
    # and B, so the pool with more free slots wins: (B, H100) = pool 5 has 7 > 3.
    free = np.array([9, 9, 3, 9, 9, 7])
    assert decide(p, ctx_for(quality=ONLY_70B, free_slots=free)) == h100_b
    # Equal free slots: region order.
    assert decide(p, ctx_for(quality=ONLY_70B, free_slots=np.full(6, 4))) == h100_a
    # Carbon-agnostic: a much dirtier region A does not matter.
    assert decide(p, ctx_for(quality=ONLY_70B, ci=[900.0, 10.0], free_slots=np.full(6, 4))) \
        == h100_a


def test_session_affinity_never_switches_while_feasible():
    p = SessionAffinity()
    b = D2.index("Llama-3.1-70B", "H100", "A")
    # Later turns: cleaner region B, cache lost or kept, other deployments cheaper — it stays.
    for turn, (ci, L) in enumerate([([500.0, 5.0], 3000), ([500.0, 5.0], 0), ([100.0, 1.0], 10)],
                                   start=1):
        ctx = ctx_for(quality=ONLY_70B, turn=turn, prev=b, ci=ci, n_hist=3000,
                      cached=cached_at(D2, {b: L}))
        assert decide(p, ctx) == b
    # Also when every model is feasible and a 1B model would be 30x cheaper.
    assert decide(p, ctx_for(turn=4, prev=b, n_hist=3000)) == b


def test_session_affinity_rebinds_when_its_model_fails_quality_or_is_unavailable():
    p = SessionAffinity()
    b = D2.index("Llama-3.1-70B", "H100", "A")
    # Quality now prefers Gemma-3-1B only: rebind to its lowest-energy deployment (H100, A).
    q = [0.9, 0.1, 0.1, 0.1, 0.1]
    assert decide(p, ctx_for(quality=q, turn=2, prev=b, n_hist=500)) == \
        D2.index("Gemma-3-1B", "H100", "A")
    # b unavailable; an older full cache on 70B/A100/B makes that the lowest cache-aware energy:
    # e_in·(100 + 0.05·2000 + 6·100) = 800·e_in(A100) vs 2700·e_in(H100) without cache.
    old = D2.index("Llama-3.1-70B", "A100", "B")
    avail = np.ones(D2.n, dtype=bool)
    avail[b] = False
    ctx = ctx_for(quality=ONLY_70B, turn=2, prev=b, n_hist=2000, available=avail,
                  cached=cached_at(D2, {old: 2000}))
    assert 800 * D2.e_in[old] < 2700 * D2.e_in[D2.index("Llama-3.1-70B", "H100", "B")]
    assert decide(p, ctx) == old


# ---------------------------------------------------------------------------------------------
# Carbon-Affinity


def test_carbon_affinity_keeps_a_partial_cache_and_rebinds_when_it_is_gone():
    p = CarbonAffinity()
    b = D2.index("Llama-3.1-70B", "A100", "A")
    kw = dict(quality=ONLY_70B, turn=3, prev=b, n_hist=4000, ci=[400.0, 20.0])
    # 10 of 4,000 history tokens cached: still bound, although B is 20x cleaner.
    assert decide(p, ctx_for(cached=cached_at(D2, {b: 10}), **kw)) == b
    # L(b) = 0: rebind to the lowest cache-aware carbon, 70B/H100 in the clean region B.
    ctx = ctx_for(cached=cached_at(D2, {b: 0}), **kw)
    cand = feasibility(ctx)
    best = min(np.flatnonzero(cand.mask), key=lambda a: cand.carbon[a])
    assert decide(p, ctx) == best == D2.index("Llama-3.1-70B", "H100", "B")
    # Cached but no longer feasible (unavailable): rebind too.
    avail = np.ones(D2.n, dtype=bool)
    avail[b] = False
    assert decide(p, ctx_for(cached=cached_at(D2, {b: 4000}), available=avail, **kw)) == best


def test_carbon_affinity_binding_prices_the_cache():
    # First turn of a rebinding with an older full cache on a dirtier deployment: the cache-aware
    # carbon decides (1.35·800·e_A100 = 1080 e_A100 vs 2700·e_H100·1 ≈ 2160 e_A100).
    p = CarbonAffinity()
    old = D2.index("Llama-3.1-70B", "A100", "A")
    ctx = ctx_for(quality=ONLY_70B, turn=2, prev=-1, n_hist=2000, ci=[135.0, 100.0],
                  cached=cached_at(D2, {old: 2000}))
    assert decide(p, ctx) == old


# ---------------------------------------------------------------------------------------------
# GAR†


def test_gar_home_region_is_a_seeded_uniform_draw():
    p = GARDagger(seed=7)
    homes = []
    for s in range(800):
        p.on_session_start(ctx_for(D4, session=s))
        homes.append(p.home[s])
    counts = np.bincount(homes, minlength=4)
    assert counts.min() > 150 and counts.max() < 250  # ≈ 200 each
    # Deterministic in (seed, session), whatever the order of sessions.
    q = GARDagger(seed=7)
    for s in reversed(range(800)):
        q.on_session_start(ctx_for(D4, session=s))
    assert q.home == p.home
    assert [GARDagger(seed=8).draw_region(s, 4) for s in range(50)] != homes[:50]


def test_gar_memoized_draws_equal_the_per_session_draws():
    # The compiled rule's draws come from a per-process memo; whatever was drawn before (other
    # ids, another seed or region count, repeated and unsorted ids), they are draw_region's.
    ids = np.array([5, 3, 3, 900, 0, 41, 5, 2_000])
    for seed, n_r in ((11, 4), (11, 3), (12, 4), (11, 4)):
        p = GARDagger(seed=seed)
        want = [p.draw_region(int(s), n_r) for s in ids]
        assert p.draw_regions(ids, n_r).tolist() == want
        assert p.draw_regions(ids[::-1], n_r).tolist() == want[::-1]
    p = GARDagger(seed=11)
    assert p.draw_regions(np.arange(3_000), 4).tolist() == [
        p.draw_region(s, 4) for s in range(3_000)]
    assert p.draw_regions(np.array([], np.int64), 4).tolist() == []
    with pytest.raises(ValueError, match="ids >= 0"):
        p.draw_regions(np.array([3, -1]), 4)


def test_gar_draws_are_kept_in_the_disk_cache_for_the_next_process(tmp_path, monkeypatch):
    # A fresh process (another sweep's worker) reads the draws another process saved, instead of
    # drawing again; what it reads is draw_region's, and ids it has not seen are drawn as usual.
    from carbonrouter_lib.policies import oblivious

    monkeypatch.setenv("CARBONROUTER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(oblivious, "_DRAWS", {})
    monkeypatch.setattr(oblivious, "_SAVE_FROM", 500)
    p = GARDagger(seed=5)
    ids = np.arange(0, 1_200, 2)
    want = p.draw_regions(ids, 4).tolist()
    assert want == [p.draw_region(int(s), 4) for s in ids]
    monkeypatch.setattr(oblivious, "_DRAWS", {})  # "the next process"
    drawn = []
    real_rng = np.random.default_rng

    def counting(seed_seq):
        drawn.append(seed_seq[1])
        return real_rng(seed_seq)

    monkeypatch.setattr(np.random, "default_rng", counting)
    assert GARDagger(seed=5).draw_regions(ids, 4).tolist() == want
    assert drawn == []  # all from the disk cache
    more = np.array([1, 3, 1_198, 1_500])
    want_more = [p.draw_region(int(s), 4) for s in more]
    drawn.clear()
    assert GARDagger(seed=5).draw_regions(more, 4).tolist() == want_more
    assert sorted(drawn) == [1, 3, 1_500]
    # another seed or region count has its own draws
    want6 = [GARDagger(seed=6).draw_region(int(s), 4) for s in ids[:10]]
    drawn.clear()
    assert GARDagger(seed=6).draw_regions(ids[:10], 4).tolist() == want6
    assert len(drawn) == 10


def test_gar_full_home_region_goes_to_the_region_with_most_free_slots():
    p = GARDagger(seed=3)
    s = 11
    r = p.draw_region(s, 4)
    free = np.full(D4.n_pools, 2).reshape(4, 3)
    free[r] = 0
    other = [x for x in range(4) if x != r]
    free[other[1]] = [1, 5, 1]  # 7 free in total: the most
    p.on_session_start(ctx_for(D4, session=s, free_slots=free.ravel()))
    assert p.home[s] == other[1]
    # One free slot left in the drawn region is enough.
    free[r] = [0, 0, 1]
    p.on_session_start(ctx_for(D4, session=s, free_slots=free.ravel()))
    assert p.home[s] == r


def test_gar_stays_home_and_falls_back_to_faircarbon():
    p = GARDagger(seed=0)
    s = next(s for s in range(100) if p.draw_region(s, 2) == 0)  # a session homed in A
    p.on_session_start(ctx_for(session=s))
    assert p.home[s] == 0
    # B is 10x cleaner, and a full cache in A sits on a dearer GPU: GAR† ignores both and takes
    # the lowest E_base carbon in A, the 70B on H100.
    cache = D2.index("Llama-3.1-70B", "A10", "A")
    ctx = ctx_for(session=s, turn=1, prev=cache, quality=ONLY_70B, n_hist=3000, ci=[300.0, 30.0],
                  cached=cached_at(D2, {cache: 3000}))
    assert decide(p, ctx) == D2.index("Llama-3.1-70B", "H100", "A")
    # Nothing feasible in A: the FairCarbon rule over all candidates.
    avail = D2.region != 0
    ctx = ctx_for(session=s, turn=2, quality=ONLY_70B, ci=[300.0, 30.0], available=avail)
    assert decide(p, ctx) == decide(FairCarbon(), ctx) == D2.index("Llama-3.1-70B", "H100", "B")
    # The home region is fixed at the first turn, whatever the slots later.
    assert p.home[s] == 0
    p.on_session_end(s)
    assert s not in p.home


# ---------------------------------------------------------------------------------------------
# FairCarbon


def test_faircarbon_takes_the_cleanest_whatever_the_cache():
    p = FairCarbon()
    b = D2.index("Llama-3.1-70B", "H100", "A")
    g = D2.index("Llama-3.1-70B", "H100", "B")
    # Full cache on b; B only 10% cleaner: cache-aware, staying is far cheaper, but FairCarbon
    # (E_base) moves.
    ctx = ctx_for(quality=ONLY_70B, turn=5, prev=b, n_hist=8000, ci=[100.0, 90.0],
                  cached=cached_at(D2, {b: 8000}))
    cand = feasibility(ctx)
    assert cand.carbon[b] < cand.carbon[g]
    assert decide(p, ctx) == g
    # Exact ties go to the lowest index (region order).
    assert decide(p, ctx_for(quality=ONLY_70B, ci=[50.0, 50.0])) == b


# ---------------------------------------------------------------------------------------------
# CarbonRouter (CCAR)

H = 4000.0  # history tokens, all cached on b
N_NEW, N_OUT = 100.0, 200.0
B_DEP = D2.index("Llama-3.1-70B", "H100", "A")
G_DEP = D2.index("Llama-3.1-70B", "H100", "B")
# Break-even: staying costs CI_A·e_in·(N_new + γH + κN_out), moving CI_B·e_in·(N_new + H + κN_out).
RHO = (N_NEW + GAMMA * H + KAPPA * N_OUT) / (N_NEW + H + KAPPA * N_OUT)  # = 1500 / 5300


def switch_ctx(ci_b_over_a: float, **kw) -> QueryContext:
    fields = dict(session=1, turn=3, prev=B_DEP, quality=ONLY_70B, n_new=N_NEW, n_hist=H,
                  n_out_est=N_OUT, ci=[200.0, 200.0 * ci_b_over_a],
                  cached=cached_at(D2, {B_DEP: H}))
    fields.update(kw)
    return ctx_for(**fields)


def test_profiles_have_the_spec_ratios():
    np.testing.assert_allclose(D2.e_cache / D2.e_in, GAMMA, rtol=1e-12)
    np.testing.assert_allclose(D2.e_out / D2.e_in, KAPPA, rtol=1e-12)


def test_carbonrouter_stays_when_recomputation_outweighs_the_cleaner_region():
    p = CarbonRouter(gate=None)
    assert RHO == pytest.approx(0.2830, abs=1e-4)
    assert decide(p, switch_ctx(RHO * 1.01)) == B_DEP  # B 3.5x cleaner: not enough
    assert decide(p, switch_ctx(RHO * 0.99)) == G_DEP  # a bit more: worth the recomputation
    assert decide(FairCarbon(), switch_ctx(RHO * 1.01)) == G_DEP  # cache-oblivious moves
    # Without the cache the break-even is 1: B just has to be cleaner.
    assert decide(p, switch_ctx(0.99, cached=np.zeros(D2.n))) == G_DEP
    # "w/o Pricing": the proposal ignores the recomputation, as FairCarbon does.
    assert decide(CarbonRouter(pricing=False, gate=None), switch_ctx(RHO * 1.01)) == G_DEP


def test_an_untrained_learned_gate_is_a_clear_error_only_where_it_would_be_called():
    p = CarbonRouter()  # the full system: gate="learned", δ = 0
    assert p.needs_training and p.params()["gate"] == "learned"
    assert decide(p, switch_ctx(RHO * 1.01)) == B_DEP  # no opportunity: no gate needed
    with pytest.raises(RuntimeError, match="learned gate has not been built"):
        decide(p, switch_ctx(RHO * 0.5))  # an opportunity
    assert not make_policy("carbonrouter-no-gate").needs_training
    assert not CarbonRouter(delta=math.inf).needs_training  # never called: nothing to train
    p.set_gate(RecordingGate(1.0))
    assert not p.needs_training and decide(p, switch_ctx(RHO * 0.5)) == B_DEP
    oracle = make_policy("carbonrouter-oracle-gate")
    assert oracle.gate_to_build == "oracle" and not oracle.needs_training
    with pytest.raises(RuntimeError, match="oracle gate has not been built"):
        decide(oracle, switch_ctx(RHO * 0.5))


class RecordingGate:
    name = "recording"

    def __init__(self, value: float) -> None:
        self.value, self.calls = value, []

    def __call__(self, ctx, cand, g, b):
        self.calls.append((ctx.session, ctx.turn, g, b))
        return self.value


def test_gate_blocks_a_switch_when_the_advantage_exceeds_delta():
    gate = RecordingGate(1.0)
    p = CarbonRouter(delta=0.5, gate=gate)
    assert decide(p, switch_ctx(RHO * 0.5)) == B_DEP  # proposal G, the gate keeps b
    assert gate.calls == [(1, 3, G_DEP, B_DEP)]
    assert p.last_opportunity and p.last_proposal == G_DEP and p.last_advantage == 1.0
    assert decide(p, switch_ctx(RHO * 0.5, session=2, turn=5)) == B_DEP
    assert p.opportunities == {1: 1, 2: 1} and p.blocked == {1: 1, 2: 1}
    # Â = δ does not block (strict), and is counted as an opportunity only.
    p = CarbonRouter(delta=1.0, gate=RecordingGate(1.0))
    assert decide(p, switch_ctx(RHO * 0.5)) == G_DEP
    assert p.opportunities == {1: 1} and p.blocked == {}
    # A negative Â (switching is predicted to pay) never blocks at δ = 0.
    assert decide(CarbonRouter(delta=0.0, gate=RecordingGate(-3.0)), switch_ctx(0.1)) == G_DEP


def test_gate_never_acts_outside_switch_opportunities():
    gate = RecordingGate(1e9)
    p = CarbonRouter(delta=0.0, gate=gate)
    avail = np.ones(D2.n, dtype=bool)
    avail[B_DEP] = False
    cases = {
        "first turn": switch_ctx(0.1, turn=0, prev=-1, cached=np.zeros(D2.n)),
        "first turn with prev set": switch_ctx(0.1, turn=0),
        "proposal is b": switch_ctx(RHO * 1.5),
        "no cache on b": switch_ctx(0.1, cached=np.zeros(D2.n)),
        "b unavailable": switch_ctx(0.1, available=avail),
        "b fails quality": switch_ctx(0.1, quality=[0.1, 0.1, 0.1, 0.9, 0.1]),
        "nothing served before": switch_ctx(0.1, prev=-1),
    }
    for why, ctx in cases.items():
        a = decide(p, ctx)
        assert not p.last_opportunity, why
        assert a == p.last_proposal, why
    assert gate.calls == [] and p.blocked == {} and p.opportunities == {}
    # δ = +∞ (w/o Gate): the gate is never called, opportunities are still counted.
    gate = RecordingGate(1e9)
    p = CarbonRouter(delta=math.inf, gate=gate)
    assert decide(p, switch_ctx(0.1)) == G_DEP
    assert gate.calls == [] and p.opportunities == {1: 1} and p.blocked == {}


def test_gate_returning_nan_is_an_error():
    p = CarbonRouter(delta=0.0, gate=RecordingGate(math.nan))
    with pytest.raises(ValueError, match="NaN"):
        decide(p, switch_ctx(0.1))


# ---------------------------------------------------------------------------------------------
# Registry


def test_registry_and_params():
    assert set(POLICIES) == {"session-affinity", "carbon-affinity", "gar", "faircarbon",
                             "carbonrouter", "carbonrouter-no-gate", "carbonrouter-no-pricing",
                             "carbonrouter-oracle-gate", "carbonrouter-horizon"}
    for name, cls in POLICIES.items():
        p = make_policy(name)
        assert isinstance(p, cls) and p.name == name
    assert make_policy("gar", seed=5).params() == {"seed": 5}
    p = make_policy("carbonrouter", delta=2.0, gate=RecordingGate(0.0), pricing=False)
    assert p.params() == {"delta": 2.0, "gate": "recording", "pricing": False,
                          "gate_training": None}
    assert make_policy("carbonrouter-no-gate").params() == {
        "delta": math.inf, "gate": None, "pricing": True, "gate_training": None}
    assert make_policy("carbonrouter-no-pricing").params() == {
        "delta": 0.0, "gate": "learned", "pricing": False, "gate_training": None}
    with pytest.raises(KeyError, match="faircarbon"):
        make_policy("greedy")
    with pytest.raises(TypeError, match="faircarbon"):
        make_policy("faircarbon", delta=1.0)
    with pytest.raises(ValueError, match="seed"):
        make_policy("gar", seed=-1)
    with pytest.raises(ValueError, match="delta"):
        make_policy("carbonrouter", delta=math.nan)


# ---------------------------------------------------------------------------------------------
# Policies of one's own, by import name


BYO = __import__("pathlib").Path(__file__).parent / "data" / "byo"


def test_a_policy_by_import_name(monkeypatch):
    from carbonrouter_lib.policies import policy_class

    monkeypatch.syspath_prepend(str(BYO))
    cls = policy_class("my_policies:LowestEnergy")
    assert cls.__name__ == "LowestEnergy" and "my_policies:LowestEnergy" not in POLICIES
    p = make_policy("my_policies:LowestEnergy", tolerance=0.25)
    assert isinstance(p, cls) and p.name == "lowest-energy" and p.params() == {"tolerance": 0.25}
    # its rule: the lowest estimated energy over the candidates, here the smallest model
    ctx = ctx_for(quality=ALL_EQUAL)
    cand = feasibility(ctx)
    assert decide(p, ctx) == cand.argmin(cand.energy) == D2.index("Gemma-3-1B", "H100", "A")
    # a registry class by import name is the registry's class
    assert policy_class("carbonrouter_lib.policies:FairCarbon") is FairCarbon


def test_a_nameless_policy_is_named_by_its_import_name(tmp_path, monkeypatch):
    (tmp_path / "nameless_mod.py").write_text(
        "from carbonrouter_lib.policies import Policy\n"
        "class First(Policy):\n"
        "    def choose(self, ctx, cand):\n"
        "        return int(cand.mask.argmax())\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert make_policy("nameless_mod:First").name == "nameless_mod:First"


@pytest.mark.parametrize("name,error,words", [
    ("carbon-router", KeyError, "unknown policy 'carbon-router'"),
    (":FairCarbon", KeyError, "import name 'package.module:Class'"),
    ("no_such_module_xyz:Policy", ValueError, "cannot import module 'no_such_module_xyz'"),
    ("carbonrouter_lib.policies:Nope", ValueError, "has no attribute 'Nope'"),
    ("carbonrouter_lib.policies:make_policy", ValueError, "not a subclass"),
    ("carbonrouter_lib.policies:Policy", None, ""),
])
def test_bad_import_names(name, error, words):
    from carbonrouter_lib.policies import Policy, policy_class

    if error is None:
        assert policy_class(name) is Policy
        return
    with pytest.raises(error, match=words.replace("(", r"\(")):
        policy_class(name)
    with pytest.raises(error):
        make_policy(name)
    with pytest.raises(TypeError, match="bad parameters"):
        make_policy("carbonrouter_lib.policies:FairCarbon", delta=1.0)


def test_a_policy_name_must_be_text():
    from carbonrouter_lib.policies import policy_class

    with pytest.raises(TypeError, match="must be a str"):
        policy_class(FairCarbon)
