"""The arrival model (carbonrouter_lib.arrivals): session starts, think times, the service time
removed from a trace's gaps, and the think-time fit."""

from __future__ import annotations

import datetime as dt
import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from carbonrouter_lib import arrivals, profiles
from carbonrouter_lib.arrivals import ArrivalConfig, ServiceTimeModel

# --------------------------------------------------------------------------------------------
# Arrival model


def test_default_window_is_monday_2022_01_03_for_seven_days():
    cfg = ArrivalConfig()
    monday = dt.datetime(2022, 1, 3, tzinfo=dt.UTC)
    assert monday.weekday() == 0
    assert cfg.start_epoch_s == monday.timestamp()
    assert cfg.window_s == 7 * 24 * 3600
    assert cfg.end_epoch_s == (monday + dt.timedelta(days=7)).timestamp()
    assert cfg.think_time == "lognormal"
    d = cfg.to_dict()
    assert json.loads(json.dumps(d))["window_start"].startswith("2022-01-03T00:00:00")


def test_window_start_zones():
    naive = ArrivalConfig(window_start="2022-06-01 12:00")  # read as UTC
    shifted = ArrivalConfig(window_start="2022-06-01T14:00:00+02:00")
    assert naive.start_epoch_s == shifted.start_epoch_s
    assert naive.window_start == pd.Timestamp("2022-06-01 12:00", tz="UTC")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"window_days": 0}, "window_days"),
        ({"window_days": -1.0}, "window_days"),
        ({"window_days": float("nan")}, "window_days"),
        ({"window_days": "7"}, "window_days"),
        ({"think_time": "weibull"}, "think_time"),
        ({"lognormal_sigma": 0.0}, "lognormal_sigma"),
        ({"lognormal_mu": float("inf")}, "lognormal_mu"),
        ({"exponential_mean_s": -5.0}, "exponential_mean_s"),
        ({"window_start": "not a date"}, "window_start"),
        ({"window_start": None}, "window_start"),
    ],
)
def test_arrival_config_rejects_bad_parameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ArrivalConfig(**kwargs)


def test_session_starts_sorted_in_window_and_deterministic():
    cfg = ArrivalConfig(window_days=2.0)
    t = arrivals.session_start_times(5000, cfg, seed=7)
    assert t.dtype == np.float64 and t.shape == (5000,)
    assert np.all(np.diff(t) >= 0)
    assert t.min() >= cfg.start_epoch_s and t.max() < cfg.end_epoch_s
    assert np.array_equal(t, arrivals.session_start_times(5000, cfg, seed=7))
    assert not np.array_equal(t, arrivals.session_start_times(5000, cfg, seed=8))
    gen = np.random.default_rng(7)
    assert np.array_equal(t, arrivals.session_start_times(5000, cfg, seed=gen))
    assert arrivals.session_start_times(0, cfg, seed=1).shape == (0,)
    with pytest.raises(ValueError, match="seed must be an integer ≥ 0, got -1"):
        arrivals.session_start_times(5, cfg, seed=-1)
    with pytest.raises(TypeError, match="seed must be an int or a numpy Generator"):
        arrivals.think_times(5, cfg, rng="abc")


def test_session_starts_have_the_poisson_rate_and_are_uniform():
    cfg = ArrivalConfig()
    n, days = 7000, 7
    # Mean count in each day over many seeds ≈ n · 1 day / 7 days = 1000 (sd of mean ≈ 2).
    counts = np.array([
        np.histogram(arrivals.session_start_times(n, cfg, seed=s) - cfg.start_epoch_s,
                     bins=days, range=(0, cfg.window_s))[0]
        for s in range(200)
    ])
    assert np.allclose(counts.mean(axis=0), n / days, atol=10)
    # A count in a sub-window of a conditioned Poisson process is Binomial(n, len/T).
    p = 1 / days
    assert counts[:, 0].var() == pytest.approx(n * p * (1 - p), rel=0.25)
    # Uniformity at a fixed seed (KS against U[0, T)).
    u = (arrivals.session_start_times(3000, cfg, seed=123) - cfg.start_epoch_s) / cfg.window_s
    assert stats.kstest(u, "uniform").pvalue > 0.05
    # Gaps between consecutive starts are exponential-like with mean T / n.
    gaps = np.diff(arrivals.session_start_times(20000, cfg, seed=5))
    assert gaps.mean() == pytest.approx(cfg.window_s / 20000, rel=0.02)


@pytest.mark.parametrize("n", [-1, 2.5, True])
def test_counts_must_be_non_negative_ints(n):
    with pytest.raises(ValueError):
        arrivals.session_start_times(n, ArrivalConfig(), seed=0)
    with pytest.raises(ValueError):
        arrivals.think_times(n, ArrivalConfig(), rng=0)


def test_lognormal_think_times_match_the_formula():
    cfg = ArrivalConfig(lognormal_mu=4.0, lognormal_sigma=0.8)
    x = arrivals.think_times(400_000, cfg, np.random.default_rng(3))
    assert (x > 0).all()
    assert np.median(x) == pytest.approx(math.exp(4.0), rel=0.01)
    assert x.mean() == pytest.approx(math.exp(4.0 + 0.8**2 / 2), rel=0.01)
    assert np.log(x).std() == pytest.approx(0.8, rel=0.01)


def test_exponential_think_times_match_the_formula():
    cfg = ArrivalConfig(think_time="exponential", exponential_mean_s=120.0)
    x = arrivals.think_times(400_000, cfg, np.random.default_rng(4))
    assert x.mean() == pytest.approx(120.0, rel=0.01)
    assert np.median(x) == pytest.approx(120.0 * math.log(2), rel=0.01)


def test_think_times_are_deterministic_for_a_seed():
    a = arrivals.think_times(100, ArrivalConfig(), np.random.default_rng(9))
    b = arrivals.think_times(100, ArrivalConfig(), np.random.default_rng(9))
    assert np.array_equal(a, b)
    assert np.array_equal(a, arrivals.think_times(100, ArrivalConfig(), 9))


# --------------------------------------------------------------------------------------------
# Think-time fit and the service-time model


def test_fit_counts_and_excludes_nonpositive_think_times():
    fit = arrivals.fit_think_time([-21.1, 0.0, 48.8, 27.9, 100.0])
    assert fit.n_nonpositive == 2 and fit.n_used == 3
    lx = np.log([48.8, 27.9, 100.0])
    assert fit.lognormal_mu == pytest.approx(lx.mean())
    assert fit.lognormal_sigma == pytest.approx(lx.std())  # MLE: divide by n
    assert fit.exponential_mean_s == pytest.approx(np.mean([48.8, 27.9, 100.0]))


def test_fit_rejects_bad_input():
    with pytest.raises(ValueError, match="NaN"):
        arrivals.fit_think_time([1.0, np.nan, 3.0])
    with pytest.raises(ValueError, match="at least 2"):
        arrivals.fit_think_time([-1.0, 5.0])
    with pytest.raises(ValueError, match="≥ its think time"):
        arrivals.fit_think_time([10.0, 20.0], bound_s=[5.0, 30.0])
    with pytest.raises(ValueError, match="bound_s has"):
        arrivals.fit_think_time([10.0, 20.0], bound_s=[30.0])


def test_plain_fit_matches_scipy_and_recovers_parameters():
    x = np.random.default_rng(11).lognormal(4.5, 1.2, size=20_000)
    fit = arrivals.fit_think_time(x)
    s, _, scale = stats.lognorm.fit(x, floc=0)
    assert fit.lognormal_sigma == pytest.approx(s, rel=1e-3)
    assert fit.lognormal_mu == pytest.approx(math.log(scale), rel=1e-4)
    assert fit.lognormal_mu == pytest.approx(4.5, abs=0.03)
    assert fit.lognormal_sigma == pytest.approx(1.2, abs=0.02)
    assert fit.exponential_mean_s == pytest.approx(stats.expon.fit(x, floc=0)[1])
    assert fit.lognormal_aic < fit.exponential_aic
    assert fit.lognormal_ks < 0.015 < fit.exponential_ks
    assert fit.lognormal_loglik == pytest.approx(stats.lognorm(s, scale=scale).logpdf(x).sum(),
                                                 rel=1e-6)


def test_truncated_fit_recovers_parameters_the_naive_fit_misses():
    rng = np.random.default_rng(21)
    x = rng.lognormal(4.8, 1.1, size=60_000)
    b = rng.uniform(30.0, 3600.0, size=x.size)  # e.g. time left before the trace ends
    seen = x <= b
    naive = arrivals.fit_think_time(x[seen])
    fit = arrivals.fit_think_time(x[seen], b[seen])
    assert fit.truncated and not naive.truncated
    assert fit.lognormal_mu == pytest.approx(4.8, abs=0.03)
    assert fit.lognormal_sigma == pytest.approx(1.1, abs=0.03)
    assert naive.lognormal_mu < 4.8 - 0.05  # long think times are under-represented
    assert fit.lognormal_aic < fit.exponential_aic
    # The truncated model's predicted CDF of the observations matches their ECDF.
    grid = np.quantile(x[seen], [0.1, 0.5, 0.9])
    ecdf = [(x[seen] <= g).mean() for g in grid]
    assert fit.observed_cdf(grid, b[seen]) == pytest.approx(ecdf, abs=0.01)

    e = rng.exponential(300.0, size=60_000)
    seen = e <= b
    fit_e = arrivals.fit_think_time(e[seen], b[seen])
    assert fit_e.exponential_mean_s == pytest.approx(300.0, rel=0.03)
    assert arrivals.fit_think_time(e[seen]).exponential_mean_s < 0.95 * 300.0
    assert fit_e.exponential_aic < fit_e.lognormal_aic


def test_fit_helpers():
    fit = arrivals.fit_think_time(np.random.default_rng(1).lognormal(4.0, 1.0, 500))
    assert fit.lognormal_median_s == pytest.approx(math.exp(fit.lognormal_mu))
    assert fit.lognormal_mean_s == pytest.approx(
        math.exp(fit.lognormal_mu + fit.lognormal_sigma**2 / 2))
    x = np.array([10.0, 100.0, 1000.0])
    # Bounds far beyond the data: the observed CDF is the plain CDF.
    assert fit.observed_cdf(x, np.full(5, 1e12)) == pytest.approx(fit.cdf(x))
    assert fit.observed_cdf(np.array([5e3]), np.array([100.0, 5e3])) == pytest.approx([1.0])
    cfg = fit.arrival_config(window_days=3.0)
    assert cfg.lognormal_mu == fit.lognormal_mu and cfg.window_days == 3.0
    with pytest.raises(ValueError, match="dist"):
        fit.cdf(x, "gamma")


def test_service_model_defaults_are_the_reference_deployment():
    ref = ServiceTimeModel.from_profile(*profiles.REFERENCE_DEPLOYMENT)
    default = ServiceTimeModel()
    assert default.prefill_tok_s == pytest.approx(ref.prefill_tok_s, rel=1e-12)
    assert default.decode_tok_s == pytest.approx(ref.decode_tok_s, rel=1e-12)
    # By hand (Appendix A, docs/model.md §3): 0.5·8·312e12/(2·70e9) and 8·1555e9/(2·70e9).
    assert default.prefill_tok_s == pytest.approx(0.5 * 8 * 312e12 / 140e9)
    assert default.decode_tok_s == pytest.approx(8 * 1555e9 / 140e9)
    assert default.scaled(decode_factor=0.5).decode_tok_s == pytest.approx(default.decode_tok_s
                                                                           / 2)
    with pytest.raises(ValueError, match="decode_tok_s"):
        ServiceTimeModel(decode_tok_s=0)
    with pytest.raises(KeyError):
        ServiceTimeModel.from_profile("GPT-5", "A100")
