"""Tests of carbonrouter_lib.metrics: docs/model.md §9 metrics by hand, normalization, paired
bootstrap."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from carbonrouter_lib import metrics as M
from carbonrouter_lib.metrics import (
    bootstrap_counts,
    by_session_length,
    normalize,
    paired_by_session_length,
    paired_change_ci,
    paired_ratio_ci,
    paired_saving_ci,
    paired_table,
    saving_table,
    sessions_longer_than,
    summarize,
    summary_table,
    validate_records,
)

# --- builders -----------------------------------------------------------------------------------

_DEFAULTS = dict(
    deployment=0,
    model="Llama-3.1-70B",
    gpu="A100",
    region="GB",
    dispatch_s=0.0,
    completion_s=1.0,
    history_tokens=0.0,
    cached_tokens=0.0,
    energy_kwh=0.0,
    carbon_g=0.0,
    est_energy_kwh=0.0,
    est_carbon_g=0.0,
    recompute_energy_kwh=0.0,
    ttft_s=0.1,
    quality=0.9,
    best_effort=False,
    rejected=False,
    in_cleanest_region=False,
    switched=False,
    switch_opportunity=False,
    gate_blocked=False,
)


def table(rows: list[dict]) -> pd.DataFrame:
    """A records table from partial rows (session, turn, n_turns given; the rest defaulted)."""
    full = []
    for r in rows:
        row = {**_DEFAULTS, **r}
        row["recomputed_tokens"] = row["history_tokens"] - row["cached_tokens"]
        if row["rejected"]:
            row.update(deployment=-1, model="", gpu="", region="", ttft_s=np.nan, quality=np.nan)
        full.append(row)
    return pd.DataFrame(full)


def synthetic(
    session_carbon: np.ndarray, turns: np.ndarray, seed: int = 0, ttft: np.ndarray | None = None
) -> pd.DataFrame:
    """A records table with the given per-session carbon spread evenly over each session's turns
    (vectorized; for bootstrap tests). ``ttft`` per query, default random."""
    turns = np.asarray(turns, dtype=np.int64)
    sess = np.repeat(np.arange(len(turns)), turns)
    turn = np.concatenate([np.arange(t) for t in turns])
    n = len(sess)
    rng = np.random.default_rng(seed)
    carbon = np.repeat(np.asarray(session_carbon, float) / turns, turns)
    return pd.DataFrame(
        {
            **{k: np.full(n, v) for k, v in _DEFAULTS.items()},
            "session": sess,
            "turn": turn,
            "n_turns": np.repeat(turns, turns),
            "history_tokens": turn * 100.0,
            "cached_tokens": turn * 50.0,
            "recomputed_tokens": turn * 50.0,
            "carbon_g": carbon,
            "energy_kwh": carbon / 200.0,
            "ttft_s": rng.uniform(0, 1, n) if ttft is None else ttft,
        }
    )


@pytest.fixture
def hand() -> pd.DataFrame:
    """Three sessions, six queries; every metric is computed by hand in the test below."""
    return table(
        [
            # session 0: first turn, a full hit (gate kept it), then a partial-hit switch
            dict(session=0, turn=0, n_turns=3, energy_kwh=0.010, carbon_g=2.0, ttft_s=0.1,
                 quality=0.9, in_cleanest_region=True),
            dict(session=0, turn=1, n_turns=3, history_tokens=100.0, cached_tokens=100.0,
                 energy_kwh=0.020, carbon_g=3.0, ttft_s=0.2, quality=0.8,
                 switch_opportunity=True, gate_blocked=True),
            dict(session=0, turn=2, n_turns=3, model="Mistral-7B-v0.2", history_tokens=250.0,
                 cached_tokens=50.0, energy_kwh=0.030, carbon_g=1.0, recompute_energy_kwh=0.004,
                 ttft_s=0.5, quality=0.7, best_effort=True, in_cleanest_region=True,
                 switched=True, switch_opportunity=True),
            # session 1: a rejected first turn, then a miss (the rejected turn left no cache)
            dict(session=1, turn=0, n_turns=2, rejected=True),
            dict(session=1, turn=1, n_turns=2, model="Gemma-3-1B", history_tokens=80.0,
                 energy_kwh=0.005, carbon_g=0.5, recompute_energy_kwh=0.001, ttft_s=0.3,
                 quality=0.6, in_cleanest_region=True),
            # session 2: one turn
            dict(session=2, turn=0, n_turns=1, energy_kwh=0.001, carbon_g=0.25, ttft_s=0.05,
                 quality=0.95),
        ]
    )  # fmt: skip


# --- summarize ----------------------------------------------------------------------------------


def test_summarize_hand_table(hand):
    s = summarize(hand)
    expected = {
        "n_queries": 6,
        "n_served": 5,
        "n_sessions": 3,
        "total_co2_kg": 6.75 / 1000,  # 2 + 3 + 1 + 0 + 0.5 + 0.25 g
        "total_energy_kwh": 0.066,
        "mean_quality": 3.95 / 5,  # rejected query excluded
        "p95_ttft_s": 0.5,  # served TTFTs .05 .1 .2 .3 .5: ceil(.95·5) = 5th value
        "share_best_effort": 1 / 6,
        "share_rejected": 1 / 6,
        "kv_hit_rate_tokens": 150 / 430,  # cached 100 + 50, history 100 + 250 + 80
        "full_hit_share": 1 / 3,  # of the 3 served turns with history, only s0 t1
        "share_history_recomputed": 280 / 430,
        "switches_per_session": 1 / 3,
        "switch_opportunities_per_session": 2 / 3,
        "gate_blocked_per_session": 1 / 3,
        "recompute_energy_per_query_mwh": 0.005 * 1e6 / 5,
        "share_in_cleanest_region": 3 / 5,
        "share_on_70b": 3 / 5,
    }
    assert set(s.index) == set(expected)
    for k, v in expected.items():
        assert s[k] == pytest.approx(v, rel=1e-12), k
    assert s["kv_hit_rate_tokens"] + s["share_history_recomputed"] == pytest.approx(1.0)


def test_summarize_p95_matches_numpy_inverted_cdf():
    rng = np.random.default_rng(3)
    for n in (1, 2, 19, 20, 21, 100, 101, 977):
        rec = synthetic(np.ones(n), np.ones(n, dtype=int), ttft=rng.exponential(size=n))
        assert summarize(rec)["p95_ttft_s"] == np.quantile(
            rec["ttft_s"], 0.95, method="inverted_cdf"
        )


def test_summarize_empty_populations_are_nan():
    # Only first turns: no history, so both KV hit metrics are undefined; all rejected: no quality.
    s = summarize(table([dict(session=0, turn=0, n_turns=1), dict(session=1, turn=0, n_turns=1)]))
    assert np.isnan(s["kv_hit_rate_tokens"]) and np.isnan(s["full_hit_share"])
    s = summarize(table([dict(session=0, turn=0, n_turns=1, rejected=True)]))
    assert s["share_rejected"] == 1.0 and s["n_served"] == 0
    assert np.isnan(s["mean_quality"]) and np.isnan(s["p95_ttft_s"])
    assert s["total_co2_kg"] == 0.0


def test_summary_table_rows_in_order_with_integer_counts(hand):
    t = summary_table({"b": hand, "a": hand.assign(carbon_g=hand["carbon_g"] * 2)})
    assert list(t.index) == ["b", "a"] and t.index.name == "policy"
    assert t["n_queries"].dtype == np.int64
    assert t.loc["a", "total_co2_kg"] == pytest.approx(2 * t.loc["b", "total_co2_kg"])
    pd.testing.assert_series_equal(
        t.loc["b"].astype(float), summarize(hand), check_names=False, check_dtype=False
    )


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda r: r.drop(columns=["gate_blocked"]), "missing column"),
        (lambda r: r.assign(cached_tokens=r["history_tokens"] + 1), "cached_tokens > history"),
        (lambda r: r.assign(recomputed_tokens=0.0), "recomputed_tokens"),
        (lambda r: r.assign(rejected=r["rejected"].astype(int)), "boolean"),
        (lambda r: r.iloc[0:0], "empty"),
        (lambda r: r.assign(carbon_g=1.0), "rejected query with nonzero carbon_g"),
        (lambda r: r.assign(best_effort=r["rejected"]), "both rejected and best-effort"),
    ],
)
def test_validation_errors(hand, mutate, match):
    with pytest.raises((ValueError, TypeError), match=match):
        validate_records(mutate(hand))


def test_validation_names_the_row(hand):
    bad = hand.copy()
    bad.loc[4, "cached_tokens"] = 1e6
    with pytest.raises(ValueError, match=r"index 4, session 1, turn 1"):
        summarize(bad)


# --- normalize ----------------------------------------------------------------------------------


def _summary3() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "total_co2_kg": [10.0, 5.0, 4.0],
            "total_energy_kwh": [20.0, 25.0, 16.0],
            "mean_quality": [0.8, 0.76, 0.78],
            "p95_ttft_s": [0.05, 1.7, 0.5],
            "n_queries": [100, 100, 100],
        },
        index=pd.Index(["session-affinity", "faircarbon", "carbonrouter"], name="policy"),
    )


def test_normalize_ratios_by_hand():
    n = normalize(_summary3())
    assert list(n.columns) == ["co2_rel", "energy_rel", "quality_rel", "p95_ttft_s"]
    np.testing.assert_allclose(n["co2_rel"], [1.0, 0.5, 0.4])
    np.testing.assert_allclose(n["energy_rel"], [1.0, 1.25, 0.8])
    np.testing.assert_allclose(n["quality_rel"], [1.0, 0.95, 0.975])
    np.testing.assert_array_equal(n["p95_ttft_s"], [0.05, 1.7, 0.5])  # seconds, not a ratio
    assert (n.loc["session-affinity", ["co2_rel", "energy_rel", "quality_rel"]] == 1.0).all()


def test_normalize_options_and_errors():
    s = _summary3().rename(index={"session-affinity": "Session-Affinity"})
    n = normalize(s, columns=["total_co2_kg"], keep=None)  # case-insensitive reference
    assert list(n.columns) == [
        "total_co2_kg_rel", "total_energy_kwh", "mean_quality", "p95_ttft_s", "n_queries"
    ]  # fmt: skip
    np.testing.assert_allclose(normalize(s, reference="faircarbon")["co2_rel"], [2.0, 1.0, 0.8])
    with pytest.raises(KeyError, match="reference policy 'gar'"):
        normalize(s, reference="gar")
    with pytest.raises(KeyError, match="'nope'"):
        normalize(s, columns=["nope"])
    with pytest.raises(ValueError, match="reference"):
        normalize(s.assign(total_co2_kg=[0.0, 1.0, 1.0]))


# --- bootstrap ----------------------------------------------------------------------------------


def _pair(n: int, seed: int, saving: float = 0.2, noise: float = 0.05, sigma: float = 1.5):
    """B: sessions with very different carbon (lognormal, σ = 1.5); A = B·(1 − saving)·(1 + ε)."""
    rng = np.random.default_rng(seed)
    turns = rng.integers(1, 12, n)
    base = rng.lognormal(0.0, sigma, n)
    a = base * (1 - saving) * (1 + noise * rng.standard_normal(n))
    return synthetic(a, turns, seed), synthetic(base, turns, seed + 1)


def test_bootstrap_counts_resample_sessions_and_do_not_depend_on_chunks():
    chunks = list(bootstrap_counts(7, 50, seed=4, chunk_rows=8))
    counts = np.vstack(chunks)
    assert counts.shape == (50, 7) and (counts.sum(axis=1) == 7).all()
    assert [len(c) for c in chunks] == [8] * 6 + [2]
    np.testing.assert_array_equal(counts, np.vstack(list(bootstrap_counts(7, 50, seed=4))))
    # The documented scheme: each draw = n session indices uniform with replacement.
    idx = np.random.default_rng(4).integers(0, 7, size=(50, 7))
    np.testing.assert_array_equal(counts, [np.bincount(r, minlength=7) for r in idx])


def test_saving_point_estimate_ci_and_determinism():
    a, b = _pair(300, seed=1)
    res = paired_saving_ci(a, b, n_boot=500, seed=7)
    assert res.estimate == pytest.approx(100 * (1 - a["carbon_g"].sum() / b["carbon_g"].sum()))
    assert res.low < res.estimate < res.high
    assert res.n_sessions == 300 and res.n_boot == 500 and res.n_invalid == 0
    again = paired_saving_ci(a, b, n_boot=500, seed=7)
    np.testing.assert_array_equal(res.draws, again.draws)
    assert (res.low, res.high) == (again.low, again.high)
    # Other chunking: same resampled sessions; only BLAS summation order may differ.
    chunked = paired_saving_ci(a, b, n_boot=500, seed=7, chunk_elements=1000)
    np.testing.assert_allclose(res.draws, chunked.draws, rtol=1e-12)
    other = paired_saving_ci(a, b, n_boot=500, seed=8)
    assert not np.array_equal(res.draws, other.draws)
    np.testing.assert_allclose(
        [res.low, res.high], np.quantile(res.draws, [0.025, 0.975]), rtol=1e-12
    )


def test_quantile_draws_do_not_depend_on_chunking():
    # A quantile involves no summation: any chunking gives the same draws bit for bit (one row
    # at a time, or all at once).
    a, b = _pair(120, seed=3)
    b = b.assign(ttft_s=b["ttft_s"] * 1.3)
    kw = dict(metric="ttft_s", statistic="p95", n_boot=300, seed=4)
    one_row = paired_change_ci(a, b, chunk_elements=1, **kw)
    for chunk in (1000, 1 << 22):
        np.testing.assert_array_equal(paired_change_ci(a, b, chunk_elements=chunk, **kw).draws,
                                      one_row.draws)


def test_draws_match_a_slow_reference():
    # Same documented draws (Generator.integers, one row per draw), statistics by plain code.
    a, b = _pair(40, seed=2)
    b = b.assign(ttft_s=b["ttft_s"] * 1.5 + 0.01)
    n_boot, seed = 60, 11
    idx = np.random.default_rng(seed).integers(0, 40, size=(n_boot, 40))
    ca = a.groupby("session")["carbon_g"].sum().to_numpy()
    cb = b.groupby("session")["carbon_g"].sum().to_numpy()
    slow = [100 * (1 - ca[r].sum() / cb[r].sum()) for r in idx]
    np.testing.assert_allclose(paired_saving_ci(a, b, n_boot=n_boot, seed=seed).draws, slow)

    def p95(rec, r):
        w = np.bincount(r, minlength=40)[rec["session"].to_numpy()]
        return np.quantile(rec["ttft_s"], 0.95, method="inverted_cdf", weights=w)

    slow = [p95(a, r) / p95(b, r) for r in idx]
    fast = paired_ratio_ci(a, b, metric="ttft_s", statistic="p95", n_boot=n_boot, seed=seed)
    np.testing.assert_allclose(fast.draws, slow, rtol=1e-12)
    assert fast.estimate == pytest.approx(summarize(a)["p95_ttft_s"] / summarize(b)["p95_ttft_s"])
    ch = paired_change_ci(a, b, metric="ttft_s", statistic="p95", n_boot=n_boot, seed=seed)
    np.testing.assert_allclose(ch.draws, 100 * (np.asarray(slow) - 1), rtol=1e-9)
    mean = paired_ratio_ci(a, b, metric="quality", statistic="mean", n_boot=n_boot, seed=seed)
    assert mean.estimate == pytest.approx(1.0) and mean.high == pytest.approx(1.0)


@pytest.mark.parametrize("q", [0.95, 0.5, 0.05])
def test_weighted_quantile_matches_numpy(q):
    # 3,000 values with ties; the top 20% belong to session 0, so draws without it scan past a
    # weightless top; one draw has no weight at all (NaN).
    rng = np.random.default_rng(5)
    v = np.sort(rng.integers(0, 800, size=3000) / 8.0)
    codes = np.where(np.arange(3000) >= 2400, 0, rng.integers(1, 6, 3000))
    counts = rng.integers(0, 3, size=(40, 6))
    counts[::2, 0] = 0
    counts[7] = 0
    got = M._weighted_quantile(v, codes, counts, q)
    exp = [np.quantile(v, q, method="inverted_cdf", weights=c[codes]) if c[codes].sum() else
           np.nan for c in counts]
    np.testing.assert_array_equal(got, exp)


def test_ci_narrows_with_more_sessions():
    # Mildly skewed sessions (σ = 0.5), so 40 sessions already give a representative spread.
    small = paired_saving_ci(*_pair(40, seed=3, noise=0.3, sigma=0.5), n_boot=400)
    large = paired_saving_ci(*_pair(2000, seed=3, noise=0.3, sigma=0.5), n_boot=400)
    # Width ∝ 1/√n: √(2000/40) ≈ 7; ask for a factor 3.
    assert (large.high - large.low) < (small.high - small.low) / 3


def test_pairing_removes_the_common_session_variance():
    a, b = _pair(400, seed=4, noise=0.02)
    paired = paired_saving_ci(a, b, n_boot=1000, seed=0)
    # Unpaired bootstrap by hand: independent session draws for A and B.
    ca = a.groupby("session")["carbon_g"].sum().to_numpy()
    cb = b.groupby("session")["carbon_g"].sum().to_numpy()
    rng = np.random.default_rng(0)
    ia, ib = rng.integers(0, 400, (2, 1000, 400))
    unpaired = np.quantile(100 * (1 - ca[ia].sum(1) / cb[ib].sum(1)), [0.025, 0.975])
    assert paired.low <= paired.estimate <= paired.high
    assert (paired.high - paired.low) < (unpaired[1] - unpaired[0]) / 10


@pytest.mark.parametrize("fn", [paired_saving_ci, paired_change_ci])
def test_identical_runs_give_zero_with_zero_width(fn):
    a, _ = _pair(100, seed=5)
    res = fn(a, a.copy(), n_boot=300)
    assert res.estimate == 0.0 and res.low == 0.0 and res.high == 0.0
    res = paired_change_ci(a, a.copy(), metric="ttft_s", statistic="p95", n_boot=300)
    assert res.estimate == res.low == res.high == 0.0


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0.01, 100.0), st.floats(0.01, 100.0), st.integers(1, 4)),
        min_size=1,
        max_size=12,
    ),
    st.integers(0, 2**16),
)
def test_saving_a_over_b_and_b_over_a_are_consistent(sessions, seed):
    ca, cb, turns = (np.array(x) for x in zip(*sessions, strict=True))
    a, b = synthetic(ca, turns), synthetic(cb, turns)
    ab = paired_saving_ci(a, b, n_boot=50, seed=seed)
    ba = paired_saving_ci(b, a, n_boot=50, seed=seed)
    # (1 − s_AB)(1 − s_BA) = (ΣA/ΣB)(ΣB/ΣA) = 1, for the estimate and for every paired draw.
    assert (1 - ab.estimate / 100) * (1 - ba.estimate / 100) == pytest.approx(1.0)
    np.testing.assert_allclose((1 - ab.draws / 100) * (1 - ba.draws / 100), 1.0)
    assert ab.estimate == pytest.approx(100 * (1 - ca.sum() / cb.sum()))
    assert ab.low <= ab.high and ba.low <= ba.high


def test_mismatched_sessions_are_clear_errors():
    a, b = _pair(20, seed=6)
    with pytest.raises(ValueError, match=r"not hold the same sessions: 1 only in A \(e.g. \[19\]"):
        paired_saving_ci(a, b.loc[b["session"] != 19])
    with pytest.raises(ValueError, match="queries per session"):
        paired_saving_ci(a, b.drop(index=b.index[b["session"] == 3][-1:]))
    with pytest.raises(ValueError, match="not in the records"):
        paired_saving_ci(a, b, sessions=[1, 99])
    with pytest.raises(ValueError, match="2 duplicate id"):
        paired_saving_ci(a, b, sessions=[1, 5, 1, 5, 2])
    with pytest.raises(ValueError, match=r"2 requested session\(s\) are not in the records "
                                         r"\(e.g. \[-1, 99\]"):
        paired_saving_ci(a, b, sessions=[99, 1, -1])
    with pytest.raises(ValueError, match="undefined"):
        paired_saving_ci(a, b.assign(carbon_g=0.0, energy_kwh=0.0))
    with pytest.raises(ValueError, match="statistic"):
        paired_ratio_ci(a, b, statistic="median")


def test_sessions_filter_equals_prefiltered_tables():
    a, b = _pair(60, seed=7)
    keep = np.arange(0, 60, 3)
    res = paired_saving_ci(a, b, sessions=keep, n_boot=200, seed=2)
    sub = paired_saving_ci(
        a[a["session"].isin(keep)], b[b["session"].isin(keep)], n_boot=200, seed=2
    )
    np.testing.assert_array_equal(res.draws, sub.draws)
    assert res.n_sessions == 20


def test_invalid_draws_are_counted():
    # B emits only in session 0: draws without session 0 have ΣB = 0 and are left out, counted.
    turns = np.array([1, 1, 1])
    a, b = synthetic(np.array([1.0, 1.0, 1.0]), turns), synthetic(np.array([2.0, 0, 0]), turns)
    res = paired_saving_ci(a, b, n_boot=200, seed=9)
    idx = np.random.default_rng(9).integers(0, 3, size=(200, 3))
    assert res.n_invalid == int((~(idx == 0).any(axis=1)).sum()) > 0
    assert np.isnan(res.draws).sum() == res.n_invalid
    assert res.estimate == pytest.approx(100 * (1 - 3 / 2))


# --- tables -------------------------------------------------------------------------------------


def test_saving_and_paired_tables():
    rng = np.random.default_rng(8)
    turns = rng.integers(1, 10, 50)
    base = rng.lognormal(0, 1, 50)
    runs = {
        "session-affinity": synthetic(base, turns),
        "faircarbon": synthetic(base * 0.6, turns),
        "CarbonRouter": synthetic(base * 0.5, turns),
    }
    t = saving_table(runs, target="carbonrouter", n_boot=100)
    assert list(t.index) == ["session-affinity", "faircarbon"] and t.index.name == "baseline"
    np.testing.assert_allclose(t["saving_pct"], [50.0, 100 / 6])
    ref = paired_saving_ci(runs["CarbonRouter"], runs["faircarbon"], n_boot=100)
    assert t.loc["faircarbon", "ci_low_pct"] == ref.low
    assert t["n_sessions"].tolist() == [50, 50]
    ch = paired_table(runs, target="CarbonRouter", kind="change", n_boot=100)
    np.testing.assert_allclose(ch["change_pct"], [100.0, 20.0])  # each row over the target
    r = paired_table(runs, target="CarbonRouter", kind="ratio", metric="ttft_s",
                     statistic="p95", n_boot=100)  # fmt: skip
    assert list(r.columns[:3]) == ["ratio", "ci_low", "ci_high"]
    with pytest.raises(ValueError, match="defined on sums"):
        paired_table(runs, kind="saving", statistic="p95")
    with pytest.raises(KeyError, match="target policy"):
        saving_table(runs, target="gar")


# --- session length -----------------------------------------------------------------------------


def test_by_session_length_groups(hand):
    assert sessions_longer_than(hand, 1).tolist() == [0, 1]
    assert sessions_longer_than(hand, 2).tolist() == [0]
    g = by_session_length(hand, thresholds=(1, 2, 3))
    assert list(g.index) == ["all", "> 1", "> 2", "> 3"]
    assert g["more_than_turns"].tolist() == [0, 1, 2, 3]
    assert g["n_sessions"].tolist() == [3, 2, 1, 0]
    assert g["n_queries"].tolist() == [6, 5, 3, 0]
    assert g.loc["> 2", "kv_hit_rate_tokens"] == pytest.approx(150 / 350)  # session 0 only
    assert g.loc["> 2", "switches_per_session"] == 1.0
    assert g.loc["> 1", "switches_per_session"] == 0.5
    assert np.isnan(g.loc["> 3", "kv_hit_rate_tokens"])
    pd.testing.assert_series_equal(
        g.loc["all"].drop("more_than_turns").astype(float), summarize(hand), check_names=False
    )
    with pytest.raises(ValueError, match="n_turns differs"):
        by_session_length(hand.assign(n_turns=np.arange(6)))


def test_paired_by_session_length_equals_filtered_bootstrap():
    a, b = _pair(120, seed=9)
    t = paired_by_session_length(a, b, thresholds=(5, 8, 50), n_boot=200, seed=3)
    assert list(t.index) == ["all", "> 5", "> 8", "> 50"]
    for label, th in [("all", 0), ("> 5", 5), ("> 8", 8)]:
        ids = sessions_longer_than(b, th)
        ref = paired_saving_ci(a, b, sessions=ids, n_boot=200, seed=3)
        assert t.loc[label, "saving_pct"] == ref.estimate
        assert (t.loc[label, "ci_low_pct"], t.loc[label, "ci_high_pct"]) == (ref.low, ref.high)
        assert t.loc[label, "n_sessions"] == len(ids)
    assert t.loc["> 50", "n_sessions"] == 0 and np.isnan(t.loc["> 50", "saving_pct"])
    ch = paired_by_session_length(b, a, thresholds=(5,), kind="change", n_boot=50)
    assert ch.loc["all", "change_pct"] == pytest.approx(
        100 * (b["carbon_g"].sum() / a["carbon_g"].sum() - 1)
    )


def test_copies_of_a_conversation_are_resampled_together():
    # 40 conversations, each replayed as 3 sessions (replay scale): the bootstrap draws
    # conversations, every session of a drawn conversation with it (a slow reference here).
    a, b = _pair(120, seed=5)
    conv = np.arange(120) % 40
    a = a.assign(conversation=conv[a["session"].to_numpy()])
    b = b.assign(conversation=conv[b["session"].to_numpy()])
    n_boot, seed = 80, 3
    res = paired_saving_ci(a, b, n_boot=n_boot, seed=seed)
    assert res.n_sessions == 120 and res.n_clusters == 40
    idx = np.random.default_rng(seed).integers(0, 40, size=(n_boot, 40))
    ca = a.groupby("conversation")["carbon_g"].sum().to_numpy()
    cb = b.groupby("conversation")["carbon_g"].sum().to_numpy()
    np.testing.assert_allclose(res.draws, [100 * (1 - ca[r].sum() / cb[r].sum()) for r in idx])
    # Copies are not independent: treating each session as its own unit gives another CI.
    alone = paired_saving_ci(a.drop(columns="conversation"), b.drop(columns="conversation"),
                             n_boot=n_boot, seed=seed)
    assert alone.n_clusters == 120 and alone.estimate == pytest.approx(res.estimate)
    # One conversation per session is exactly the session bootstrap.
    one = paired_saving_ci(a.assign(conversation=a["session"]), b.assign(
        conversation=b["session"]), n_boot=n_boot, seed=seed)
    np.testing.assert_array_equal(one.draws, alone.draws)
    with pytest.raises(ValueError, match="different conversations"):
        paired_saving_ci(a, b.assign(conversation=b["session"]), n_boot=10)
