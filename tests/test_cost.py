"""Tests of carbonrouter_lib.cost: Eq. 4–6 by hand, invariants, and the break-even ratio."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from carbonrouter_lib.cost import (
    break_even_history,
    break_even_ratio,
    break_even_table,
    cache_miss_penalty,
    candidate_costs,
    carbon_g,
    deployment_costs,
    energy_base_kwh,
    energy_kwh,
    recomputation_energy_kwh,
    service_time_s,
    ttft_s,
)
from carbonrouter_lib.profiles import analytical_profiles

# --- Eq. 4–6 golden values ---------------------------------------------------------------------


def test_hand_example_scalars():
    # e_in = 1e-7 kWh, γ = 0.05, κ = 6; 100 new, 1,000 history of which 600 cached, 50 out.
    e_in, e_cache, e_out = 1e-7, 5e-9, 6e-7
    uncached = 100 + 1000 - 600  # 500 tokens prefilled
    expected_e = 500 * 1e-7 + 600 * 5e-9 + 50 * 6e-7  # = 8.3e-5 kWh
    assert energy_kwh(e_in, e_cache, e_out, 100, 1000, 600, 50) == pytest.approx(8.3e-5)
    assert energy_kwh(e_in, e_cache, e_out, 100, 1000, 600, 50) == pytest.approx(expected_e)
    assert energy_base_kwh(e_in, e_cache, e_out, 100, 1000, 50) == pytest.approx(
        100 * 1e-7 + 1000 * 5e-9 + 50 * 6e-7
    )
    assert recomputation_energy_kwh(e_in, e_cache, 1000, 600) == pytest.approx(400 * 9.5e-8)
    assert carbon_g(250.0, expected_e) == pytest.approx(250.0 * 8.3e-5)  # gCO2e
    assert ttft_s(100, 1000, 600, 2000.0) == pytest.approx(uncached / 2000.0)
    assert service_time_s(100, 1000, 600, 50, 2000.0, 25.0) == pytest.approx(0.25 + 2.0)
    # Unchecked functions keep Python scalars scalar (no array allocation on the hot path).
    assert isinstance(energy_kwh(e_in, e_cache, e_out, 100, 1000, 600, 50), float)


def test_paper_scale_prefill_of_16k_history_mistral_a100():
    # Figure 2(b) (paper.SECTION2_MISS_SETTING): a miss adds "up to 2.5 s of prefill" on
    # Mistral-7B/A100. v_pre by hand:
    v_pre = 0.5 * (7 / 70) ** 0.2 * 312e12 / (2 * 7e9)  # ≈ 7,031 tokens/s
    df = deployment_costs(analytical_profiles(), n_new=128, n_hist=16_384, n_out=256)
    r = df[(df["model"] == "Mistral-7B-v0.2") & (df["gpu"] == "A100")].iloc[0]
    assert r["ttft_s"] == pytest.approx((128 + 16_384) / v_pre)
    assert 2.0 < r["ttft_s"] < 2.5


def test_deployment_costs_matches_hand_formula_per_row():
    prof = analytical_profiles()
    n_new = {m: 100 + i for i, m in enumerate(prof["model"].unique())}  # per-model tokenizer
    cached = np.arange(len(prof)) * 10.0
    ci = np.linspace(50, 400, len(prof))
    df = deployment_costs(prof, n_new=n_new, n_hist=500, n_out=200, cached=cached, ci=ci)
    for i, p in prof.iterrows():
        nn = n_new[p["model"]]
        e = p["e_in_kwh"] * (nn + 500 - cached[i]) + p["e_cache_kwh"] * cached[i]
        e += p["e_out_kwh"] * 200
        assert df.loc[i, "energy_kwh"] == pytest.approx(e, rel=1e-12)
        assert df.loc[i, "carbon_g"] == pytest.approx(ci[i] * e, rel=1e-12)
        assert df.loc[i, "ttft_s"] == pytest.approx((nn + 500 - cached[i]) / p["prefill_tok_s"])
        assert df.loc[i, "uncached_tokens"] == nn + 500 - cached[i]
    assert (df["model"] == prof["model"]).all() and (df["gpu"] == prof["gpu"]).all()


def test_deployment_costs_bad_inputs():
    prof = analytical_profiles()
    with pytest.raises(ValueError, match="n_new: no value for model"):
        deployment_costs(prof, n_new={"Gemma-3-1B": 1}, n_hist=0, n_out=1)
    with pytest.raises(ValueError, match="cached: expected"):
        deployment_costs(prof, n_new=1, n_hist=10, n_out=1, cached=[1, 2])
    with pytest.raises(ValueError, match="exceeds n_hist"):
        deployment_costs(prof, n_new=1, n_hist=10, n_out=1, cached=11)


def test_candidate_costs_validation():
    ok = dict(
        e_in=[1e-7, 2e-7],
        e_cache=[5e-9, 1e-8],
        e_out=[6e-7, 1.2e-6],
        v_pre=[1e4, 2e4],
        v_dec=[50.0, 80.0],
        n_new=10,
        n_hist=100,
        cached=[100, 0],
        n_out=20,
        ci=[100.0, 200.0],
    )
    out = candidate_costs(**ok)
    assert out.energy_kwh.shape == (2,)
    with pytest.raises(ValueError, match=r"exceeds n_hist .* at candidate 1"):
        candidate_costs(**(ok | {"cached": [0, 101]}))
    with pytest.raises(ValueError, match=r"ci must be finite and >= 0.*at candidate 0"):
        candidate_costs(**(ok | {"ci": [-1.0, 1.0]}))
    with pytest.raises(ValueError, match="v_pre must be finite and > 0"):
        candidate_costs(**(ok | {"v_pre": 0.0}))
    with pytest.raises(ValueError, match="n_hist must be finite"):
        candidate_costs(**(ok | {"n_hist": np.nan}))
    with pytest.raises(ValueError, match="do not broadcast"):
        candidate_costs(**(ok | {"ci": [1.0, 2.0, 3.0]}))


# --- invariants ----------------------------------------------------------------------------------

N = 7  # candidates per query in property tests
coef = hnp.arrays(float, N, elements=st.floats(1e-9, 1e-6))
frac = hnp.arrays(float, N, elements=st.floats(0.0, 1.0))
tokens = st.integers(0, 200_000)


@settings(max_examples=60, deadline=None)
@given(
    e_in=coef,
    g=frac,
    kappa=st.floats(0.5, 10.0),
    n_new=tokens,
    n_hist=tokens,
    n_out=tokens,
    cached_frac=frac,
)
def test_energy_bounds_and_penalty(e_in, g, kappa, n_new, n_hist, n_out, cached_frac):
    e_cache, e_out = g * e_in, kappa * e_in
    cached = np.floor(cached_frac * n_hist)
    c = candidate_costs(e_in, e_cache, e_out, 1e4, 50.0, n_new, n_hist, cached, n_out, 100.0)
    penalty = (e_in - e_cache) * (n_hist - cached)
    np.testing.assert_allclose(c.energy_kwh - c.energy_base_kwh, penalty, rtol=1e-9, atol=1e-15)
    assert (c.energy_kwh >= c.energy_base_kwh * (1 - 1e-12)).all()
    # A full miss (L = 0) bounds E from above.
    miss = energy_kwh(e_in, e_cache, e_out, n_new, n_hist, 0, n_out)
    assert (c.energy_kwh <= miss * (1 + 1e-12)).all()
    assert (c.ttft_s >= 0).all() and (c.service_s >= c.ttft_s).all()


@settings(max_examples=60, deadline=None)
@given(
    e_in=st.floats(1e-9, 1e-6),
    g=st.floats(0.0, 1.0),
    n_hist=st.integers(1, 100_000),
    l1=st.floats(0, 1),
    l2=st.floats(0, 1),
)
def test_energy_and_ttft_monotone_in_cached(e_in, g, n_hist, l1, l2):
    lo, hi = sorted((np.floor(l1 * n_hist), np.floor(l2 * n_hist)))
    e_lo = energy_kwh(e_in, g * e_in, 6 * e_in, 50, n_hist, lo, 100)
    e_hi = energy_kwh(e_in, g * e_in, 6 * e_in, 50, n_hist, hi, 100)
    assert e_hi <= e_lo * (1 + 1e-12)
    assert ttft_s(50, n_hist, hi, 1e4) <= ttft_s(50, n_hist, lo, 1e4)


@settings(max_examples=60, deadline=None)
@given(
    e_in=coef,
    g=frac,
    ci=hnp.arrays(float, N, elements=st.floats(1.0, 1000.0)),
    n_new=tokens,
    n_hist=tokens,
    n_out=tokens,
    cached_frac=frac,
    k=st.integers(-30, 30),
)
def test_scaling_energy_coefficients_keeps_argmin(
    e_in, g, ci, n_new, n_hist, n_out, cached_frac, k
):
    # docs/model.md §3: scaling every coefficient by one factor changes no decision. A power of two
    # scales exactly in binary floating point, so even ties are preserved.
    cached = np.floor(cached_frac * n_hist)
    e_cache, e_out = g * e_in, 6.0 * e_in
    base = candidate_costs(e_in, e_cache, e_out, 1e4, 50, n_new, n_hist, cached, n_out, ci)
    s = 2.0**k
    scaled = candidate_costs(
        s * e_in, s * e_cache, s * e_out, 1e4, 50, n_new, n_hist, cached, n_out, ci
    )
    assume(np.isfinite(base.carbon_g).all())
    assert np.argmin(scaled.carbon_g) == np.argmin(base.carbon_g)
    assert np.argmin(scaled.carbon_base_g) == np.argmin(base.carbon_base_g)
    np.testing.assert_array_equal(scaled.carbon_g, s * base.carbon_g)


# --- break-even ratio ----------------------------------------------------------------------------


def test_break_even_by_hand():
    # Default N_new = 128, N_out = 256, γ = 0.05, κ = 6: c = 128 + 1536 = 1664 tokens.
    assert break_even_ratio(4096) == pytest.approx((1664 + 0.05 * 4096) / (1664 + 4096))
    assert break_even_ratio(4096) == pytest.approx(0.324444, abs=1e-6)
    assert break_even_history(0.5) == pytest.approx(0.5 * 1664 / 0.45)  # 1,848.9 tokens
    assert break_even_ratio(0) == 1.0
    assert isinstance(break_even_ratio(10), float)
    assert break_even_ratio([0, 10]).shape == (2,)


def test_break_even_ratio_is_energy_ratio_of_eq4():
    # Derive R(H) through Eq. 4 instead of the closed form: E(L = H) / E(L = 0), any e_in.
    h = np.array([0, 1, 100, 2048, 4096, 16_384, 1e6])
    for gamma, kappa in [(0.05, 6.0), (0.1, 5.0), (0.0, 8.0), (1.0, 6.0)]:
        e_in = 3.7e-8
        hit = energy_kwh(e_in, gamma * e_in, kappa * e_in, 128, h, h, 256)
        miss = energy_kwh(e_in, gamma * e_in, kappa * e_in, 128, h, 0, 256)
        r = break_even_ratio(h, 128, 256, gamma, kappa)
        np.testing.assert_allclose(r, hit / miss, rtol=1e-12)
        np.testing.assert_allclose(
            cache_miss_penalty(h, 128, 256, gamma, kappa), miss / hit - 1, rtol=1e-12, atol=1e-12
        )


@settings(max_examples=80, deadline=None)
@given(
    h1=st.floats(0, 1e7),
    h2=st.floats(0, 1e7),
    gamma=st.floats(0, 0.99),
    kappa=st.floats(0, 20),
    n_new=st.integers(1, 10_000),
    n_out=st.integers(0, 10_000),
)
def test_break_even_ratio_properties(h1, h2, gamma, kappa, n_new, n_out):
    lo, hi = sorted((h1, h2))
    r_lo = break_even_ratio(lo, n_new, n_out, gamma, kappa)
    r_hi = break_even_ratio(hi, n_new, n_out, gamma, kappa)
    assert gamma <= r_hi <= r_lo <= 1.0
    if hi > lo * (1 + 1e-6) + 1e-6:
        assert r_hi < r_lo or np.isclose(r_hi, r_lo, rtol=1e-12)  # strictly, up to rounding
    # Inverse: H*(R(H)) = H, up to conditioning.
    if hi > 0 and r_hi < 1.0 - 1e-9 and r_hi > gamma + 1e-9:
        h_back = break_even_history(r_hi, n_new, n_out, gamma, kappa)
        assert h_back == pytest.approx(hi, rel=1e-5)


@settings(max_examples=80, deadline=None)
@given(
    ratio=st.floats(0.01, 0.999),
    ci_a=st.floats(10, 1000),
    gamma=st.floats(0, 0.5),
    kappa=st.floats(0, 10),
)
def test_break_even_history_is_the_switch_threshold(ratio, ci_a, gamma, kappa):
    # Below H* switching to a region with CI_B = ratio·CI_A saves carbon; above it, it does not.
    h_star = break_even_history(ratio, 128, 256, gamma, kappa)
    if ratio <= gamma:
        assert h_star == np.inf
        return
    assert break_even_ratio(h_star, 128, 256, gamma, kappa) == pytest.approx(ratio, rel=1e-9)
    # With ratio within rounding of γ, H* is ~1e18 tokens and the two energies at H*/2 are equal
    # in float64 (e.g. ratio = 0.5, γ = 0.5 − 1 ulp): no decision to check there.
    assume(ratio - gamma > 1e-9)
    e_in, ci_b = 1e-7, ratio * ci_a
    for h, switch_pays in [(0.5 * h_star, True), (2 * h_star + 10, False)]:
        stay = ci_a * energy_kwh(e_in, gamma * e_in, kappa * e_in, 128, h, h, 256)
        switch = ci_b * energy_kwh(e_in, gamma * e_in, kappa * e_in, 128, h, 0, 256)
        if h_star > 0:
            assert (switch < stay) == switch_pays


def test_break_even_limits_and_errors():
    assert break_even_ratio(1e15) == pytest.approx(0.05, rel=1e-9)  # → γ as H → ∞
    np.testing.assert_array_equal(
        break_even_history([0.05, 0.01, 1.0, 3.0]), [np.inf, np.inf, 0, 0]
    )
    with pytest.raises(ValueError, match="history_tokens"):
        break_even_ratio(-1)
    with pytest.raises(ValueError, match="gamma"):
        break_even_ratio(10, gamma=1.5)
    with pytest.raises(ValueError, match="ratio"):
        break_even_history(0.0)
    with pytest.raises(ValueError, match="new_tokens"):
        break_even_ratio(10, new_tokens=0, output_tokens=0)


def test_break_even_table_and_setting_orderings():
    settings_ = [(0.05, 6.0), (0.025, 6.0), (0.1, 6.0), (0.05, 5.0), (0.05, 8.0)]
    t = break_even_table(settings_)
    assert list(t.columns) == [
        "gamma",
        "kappa",
        "h_star_tokens",
        "ratio_at_4096",
        "ratio_at_8192",
        "ratio_at_16384",
    ]
    hand = [0.5 * (128 + k * 256) / (0.5 - g) for g, k in settings_]
    np.testing.assert_allclose(t["h_star_tokens"], hand)
    # Cheaper cache hits (smaller γ) or cheaper outputs (smaller κ) make switching harder.
    by = {(g, k): r for g, k, r in t[["gamma", "kappa", "ratio_at_4096"]].itertuples(index=False)}
    assert by[(0.025, 6.0)] < by[(0.05, 6.0)] < by[(0.1, 6.0)]
    assert by[(0.05, 5.0)] < by[(0.05, 6.0)] < by[(0.05, 8.0)]
    assert isinstance(t, pd.DataFrame)
