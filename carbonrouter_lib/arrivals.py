"""The arrival model we replay: when sessions start and how long users think between turns.

The paper uses "the multi-turn chat arrival model of UniCache" (POMACS 2026), whose parameters
could not be read. Our decision (``docs/model.md`` §8, "Arrivals and think times"; §8a) is
:class:`ArrivalConfig`: sessions start as a homogeneous Poisson process over a replay window of
the carbon year (7 days from Monday 2022-01-03 00:00 UTC by default); each later turn of a session
is sent a *think time* after the previous turn's response completes. The simulator resolves that
(completion depends on where the turn ran); this module only draws the start times
(:func:`session_start_times`) and per-turn think times (:func:`think_times`). The think-time
distribution is lognormal by default, exponential as an option, with parameters calibrated on the
Mooncake trace (:func:`carbonrouter_lib.mooncake.calibrate_think_time`).

Think times from a trace (:class:`ServiceTimeModel`, :func:`fit_think_time`)
-----------------------------------------------------------------------------
The gap between turn k and k+1 of a session contains the service time of turn k. We remove the
service time our simulator would give turn k on the reference deployment (``docs/model.md`` §3:
Llama-3.1-70B on 8×A100, :class:`ServiceTimeModel`): prefill of its new tokens (history cached)
plus decode of its response. Gaps not longer than that service time are excluded from the fit and
counted. The Mooncake trace covers one hour, so a gap is seen only if the follow-up arrives before
the trace ends: long think times are under-represented (right truncation). The fit corrects for it
by maximizing the truncated likelihood ``f(x_i) / F(b_i)``, ``b_i`` the longest think time that
request could have shown (trace end − its predecessor's arrival − service time); an untruncated
MLE is available for comparison. The gaps themselves are measured by
:func:`carbonrouter_lib.mooncake.inter_turn_gaps`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import optimize, stats

from carbonrouter_lib import cost

__all__ = [
    "THINK_TIME_DISTRIBUTIONS",
    "ArrivalConfig",
    "session_start_times",
    "think_times",
    "check_seed",
    "ServiceTimeModel",
    "ThinkTimeFit",
    "fit_think_time",
]

#: Think-time distributions :class:`ArrivalConfig` accepts.
THINK_TIME_DISTRIBUTIONS: tuple[str, ...] = ("lognormal", "exponential")


# --------------------------------------------------------------------------------------------
# Session starts and think times (docs/model.md §8)


@dataclass(frozen=True)
class ArrivalConfig:
    """When sessions start and how long users think between turns (``docs/model.md`` §8, §8a).

    Parameters
    ----------
    window_start : str, datetime or pandas.Timestamp
        Start of the replay window; a time without a zone is read as UTC. Stored as a UTC
        ``pandas.Timestamp``. Default Monday 2022-01-03 00:00 UTC (``docs/model.md`` §8a).
    window_days : float
        Length of the replay window (days), > 0. Default 7.
    think_time : {"lognormal", "exponential"}
        Distribution of the think time between a response's completion and the next turn.
    lognormal_mu, lognormal_sigma : float
        Parameters of the lognormal think time: ln(think time / 1 s) ~ Normal(mu, sigma²);
        median exp(mu) s, mean exp(mu + sigma²/2) s. sigma > 0.
    exponential_mean_s : float
        Mean of the exponential think time (s), > 0.

    Notes
    -----
    The think-time defaults are our calibration on the Mooncake trace
    (:func:`.mooncake.calibrate_think_time` with its defaults: service time of the reference
    deployment, Llama-3.1-70B on 8×A100 at 8,914 prefill / 88.9 decode tokens/s; truncated MLE on
    3,972 positive think times). Lognormal median 135.1 s, mean 242.0 s. ``tests/test_mooncake.py``
    re-runs the calibration and checks these literals.
    """

    window_start: Any = "2022-01-03T00:00:00Z"
    window_days: float = 7.0
    think_time: str = "lognormal"
    # Calibrated on the Mooncake trace: calibrate_think_time() (truncated MLE), see Notes.
    lognormal_mu: float = 4.90570
    lognormal_sigma: float = 1.07988
    exponential_mean_s: float = 224.630

    def __post_init__(self) -> None:
        try:
            start = pd.Timestamp(self.window_start)
        except (ValueError, TypeError) as exc:
            raise ValueError(
                f"ArrivalConfig.window_start must be a date/time, got {self.window_start!r} ({exc})"
            ) from None
        if pd.isna(start):
            raise ValueError(f"ArrivalConfig.window_start must be a date/time, got {start!r}")
        start = start.tz_localize("UTC") if start.tzinfo is None else start.tz_convert("UTC")
        object.__setattr__(self, "window_start", start)
        for name in ("window_days", "lognormal_mu", "lognormal_sigma", "exponential_mean_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float | np.number) or not (
                np.isfinite(value)
            ):
                raise ValueError(f"ArrivalConfig.{name} must be a finite number, got {value!r}")
            object.__setattr__(self, name, float(value))
        if self.window_days <= 0:
            raise ValueError(f"ArrivalConfig.window_days must be > 0, got {self.window_days}")
        if self.think_time not in THINK_TIME_DISTRIBUTIONS:
            raise ValueError(
                f"ArrivalConfig.think_time must be one of {THINK_TIME_DISTRIBUTIONS}, "
                f"got {self.think_time!r}"
            )
        if self.lognormal_sigma <= 0:
            raise ValueError(
                f"ArrivalConfig.lognormal_sigma must be > 0, got {self.lognormal_sigma}"
            )
        if self.exponential_mean_s <= 0:
            raise ValueError(
                f"ArrivalConfig.exponential_mean_s must be > 0 s, got {self.exponential_mean_s}"
            )

    @property
    def window_s(self) -> float:
        """Length of the replay window (s)."""
        return self.window_days * 86_400.0

    @property
    def start_epoch_s(self) -> float:
        """Window start, seconds since the Unix epoch (UTC)."""
        return self.window_start.value / 1e9

    @property
    def end_epoch_s(self) -> float:
        """Window end (exclusive), seconds since the Unix epoch."""
        return self.start_epoch_s + self.window_s

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly fields (the window start as ISO 8601 UTC), to record with results."""
        d = dataclasses.asdict(self)
        d["window_start"] = self.window_start.isoformat()
        return d


def check_seed(seed: Any, name: str = "seed") -> int:
    """``seed`` as an int, or a ``ValueError`` naming ``name`` unless it is an integer ≥ 0
    (numpy's own message for a bad seed names nothing)."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"{name} must be an integer ≥ 0, got {seed!r}")
    return int(seed)


def _generator(seed: int | np.random.Generator) -> np.random.Generator:
    if isinstance(seed, np.random.Generator):
        return seed
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise TypeError(f"seed must be an int or a numpy Generator, got {seed!r}")
    return np.random.default_rng(check_seed(seed))


def _count(n: Any, name: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
        raise ValueError(f"{name} must be a non-negative int, got {n!r}")
    return int(n)


def session_start_times(
    n_sessions: int, cfg: ArrivalConfig | None = None, seed: int | np.random.Generator = 0
) -> np.ndarray:
    """Start times of ``n_sessions`` sessions: a Poisson process conditioned on its count.

    The sessions fill the window: the rate is λ = n_sessions / window (sessions/s). A Poisson
    process conditioned on n arrivals in [0, T) puts them at the order statistics of n iid
    uniforms on [0, T) — which is how they are drawn, so the count is exactly ``n_sessions``
    (a trace's sessions are all replayed) and the gaps between starts are iid-exponential-like
    with mean T / n.

    Parameters
    ----------
    n_sessions
        Number of sessions (≥ 0).
    cfg
        The window; default :class:`ArrivalConfig()`.
    seed
        Seed or numpy Generator (the same seed gives the same times).

    Returns
    -------
    numpy.ndarray
        float64, sorted, seconds since the Unix epoch, in ``[cfg.start_epoch_s, cfg.end_epoch_s)``.
    """
    cfg = cfg or ArrivalConfig()
    n = _count(n_sessions, "n_sessions")
    rng = _generator(seed)
    offsets = np.sort(rng.uniform(0.0, cfg.window_s, size=n))
    return cfg.start_epoch_s + offsets


def think_times(
    n: int, cfg: ArrivalConfig | None = None, rng: int | np.random.Generator = 0
) -> np.ndarray:
    """``n`` iid think times (s) from ``cfg.think_time``.

    A think time is the wait between the completion of a turn's response and the next turn's
    arrival (the simulator adds it to the completion time it computes).

    Parameters
    ----------
    n
        Number of draws (≥ 0).
    cfg
        Distribution and parameters; default :class:`ArrivalConfig()`.
    rng
        numpy Generator (advanced by the call) or a seed.

    Returns
    -------
    numpy.ndarray
        float64 think times (s), all > 0.
    """
    cfg = cfg or ArrivalConfig()
    n = _count(n, "n")
    gen = _generator(rng)
    if cfg.think_time == "lognormal":
        return gen.lognormal(cfg.lognormal_mu, cfg.lognormal_sigma, size=n)
    return gen.exponential(cfg.exponential_mean_s, size=n)


# --------------------------------------------------------------------------------------------
# Think times measured on a trace: service time removed, distributions fitted


@dataclass(frozen=True)
class ServiceTimeModel:
    """Service time of a turn, removed from an inter-turn gap to leave the think time.

    ``service = new_tokens / prefill_tok_s + output_tokens / decode_tok_s`` (s): prefill of the
    uncached input (the history is assumed cached, as where a session stays) and batch-one
    decode of the response, as the simulator computes a turn's completion (Eq. 6 and the
    completion time, ``docs/model.md`` §4).

    Parameters
    ----------
    prefill_tok_s, decode_tok_s : float
        Throughputs (tokens/s), > 0. Defaults: the analytical profile (Appendix A,
        ``docs/model.md`` §3) of the
        reference deployment, Llama-3.1-70B on 8×A100-40GB: v_pre = 0.5·8·312e12 / (2·70e9)
        = 8,914.3 and v_dec = 8·1,555e9 / (2·70e9) = 88.86 tokens/s. Kimi's production speeds
        are unknown; the notebook shows the fit with the decode speed halved and doubled.
    """

    prefill_tok_s: float = 8914.285714285714
    decode_tok_s: float = 88.85714285714286

    def __post_init__(self) -> None:
        for name in ("prefill_tok_s", "decode_tok_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float | np.number) or not (
                np.isfinite(value) and value > 0
            ):
                raise ValueError(f"ServiceTimeModel.{name} must be a finite number > 0 tokens/s, "
                                 f"got {value!r}")
            object.__setattr__(self, name, float(value))

    @classmethod
    def from_profile(cls, model: str, gpu: str, profile_table: pd.DataFrame | None = None
                     ) -> ServiceTimeModel:
        """Speeds of one (model, GPU) row of a profile table (default: analytical profiles)."""
        if profile_table is None:
            from carbonrouter_lib.profiles import analytical_profiles

            profile_table = analytical_profiles()
        row = profile_table[(profile_table["model"] == model) & (profile_table["gpu"] == gpu)]
        if len(row) != 1:
            raise KeyError(f"no profile row for model {model!r} on GPU {gpu!r}")
        return cls(float(row["prefill_tok_s"].iloc[0]), float(row["decode_tok_s"].iloc[0]))

    def scaled(self, decode_factor: float = 1.0, prefill_factor: float = 1.0) -> ServiceTimeModel:
        """The same model with the speeds multiplied by the given factors."""
        return ServiceTimeModel(self.prefill_tok_s * prefill_factor,
                                self.decode_tok_s * decode_factor)

    def service_s(self, new_tokens: Any, output_tokens: Any) -> np.ndarray:
        """Service time (s) of turns with these new-input and output token counts."""
        new = np.asarray(new_tokens, dtype=np.float64)
        out = np.asarray(output_tokens, dtype=np.float64)
        return cost.service_time_s(new, 0.0, 0.0, out, self.prefill_tok_s, self.decode_tok_s)


@dataclass(frozen=True)
class ThinkTimeFit:
    """A lognormal and an exponential think-time fit to the same data.

    Attributes
    ----------
    n_used
        Think times fitted (> 0 s).
    n_nonpositive
        Think times ≤ 0 s (gap not longer than the assumed service time), excluded.
    truncated
        Whether the likelihood was the truncated one ``f(x)/F(b)`` (else plain MLE).
    lognormal_mu, lognormal_sigma
        ln(think / 1 s) ~ Normal(mu, sigma²).
    exponential_mean_s
        Mean of the exponential (s).
    lognormal_loglik, exponential_loglik
        Maximized log-likelihoods (of the same likelihood form; x in s).
    lognormal_aic, exponential_aic
        AIC = 2·(number of parameters) − 2·loglik (2 and 1 parameters).
    lognormal_ks, exponential_ks, lognormal_ks_pvalue, exponential_ks_pvalue
        Kolmogorov–Smirnov statistic and p-value of the probability-integral transform
        u = F(x)/F(b) (u = F(x) without truncation) against Uniform(0, 1).
    """

    n_used: int
    n_nonpositive: int
    truncated: bool
    lognormal_mu: float
    lognormal_sigma: float
    lognormal_loglik: float
    lognormal_aic: float
    lognormal_ks: float
    lognormal_ks_pvalue: float
    exponential_mean_s: float
    exponential_loglik: float
    exponential_aic: float
    exponential_ks: float
    exponential_ks_pvalue: float

    @property
    def lognormal_median_s(self) -> float:
        """Median of the lognormal fit, exp(mu) (s)."""
        return math.exp(self.lognormal_mu)

    @property
    def lognormal_mean_s(self) -> float:
        """Mean of the lognormal fit, exp(mu + sigma²/2) (s)."""
        return math.exp(self.lognormal_mu + self.lognormal_sigma**2 / 2)

    def to_dict(self) -> dict[str, Any]:
        """Fields plus the lognormal median and mean."""
        d = dataclasses.asdict(self)
        d["lognormal_median_s"] = self.lognormal_median_s
        d["lognormal_mean_s"] = self.lognormal_mean_s
        return d

    def arrival_config(self, **fields: Any) -> ArrivalConfig:
        """An :class:`ArrivalConfig` with these think-time parameters (other fields as given)."""
        return ArrivalConfig(lognormal_mu=self.lognormal_mu, lognormal_sigma=self.lognormal_sigma,
                             exponential_mean_s=self.exponential_mean_s, **fields)

    def cdf(self, x: Any, dist: str = "lognormal") -> np.ndarray:
        """CDF of the fitted (untruncated) distribution at ``x`` (s): what a replay draws from."""
        x = np.asarray(x, dtype=np.float64)
        if dist == "lognormal":
            return stats.lognorm.cdf(x, self.lognormal_sigma, scale=math.exp(self.lognormal_mu))
        if dist == "exponential":
            return stats.expon.cdf(x, scale=self.exponential_mean_s)
        raise ValueError(f"dist must be one of {THINK_TIME_DISTRIBUTIONS}, got {dist!r}")

    def observed_cdf(self, x: Any, bound_s: Any, dist: str = "lognormal") -> np.ndarray:
        """CDF the fit predicts for the *observed* (truncated) think times.

        ``G(x) = mean_i F(min(x, b_i)) / F(b_i)`` over the truncation bounds ``b_i`` of the fitted
        observations: the curve to compare with their empirical CDF.
        """
        x = np.asarray(x, dtype=np.float64)
        b = np.asarray(bound_s, dtype=np.float64)
        fb = self.cdf(b, dist)
        return np.mean(self.cdf(np.minimum(x[:, None], b[None, :]), dist) / fb, axis=1)


def fit_think_time(think_s: Any, bound_s: Any = None) -> ThinkTimeFit:
    """Fit a lognormal and an exponential think-time distribution by maximum likelihood.

    Parameters
    ----------
    think_s
        Think times (s). Values ≤ 0 are excluded and counted (``n_nonpositive``): a lognormal
        has no mass there, and a floor at some ε would put a spike at ln ε that drives sigma.
    bound_s
        Optional truncation bounds (s), one per think time: x_i was observable only if
        x_i ≤ b_i. Given, the likelihood is ``Σ ln f(x_i) − ln F(b_i)``; else plain MLE
        (closed forms, as ``scipy.stats.lognorm.fit(x, floc=0)`` / ``expon.fit(x, floc=0)``).

    Returns
    -------
    ThinkTimeFit

    Raises
    ------
    ValueError
        Non-finite values, mismatched lengths, a bound below its think time, or fewer than 2
        positive think times.
    """
    x = np.asarray(think_s, dtype=np.float64).ravel()
    if not np.isfinite(x).all():
        raise ValueError("think_s contains NaN or infinite values")
    keep = x > 0
    n_nonpositive = int((~keep).sum())
    x = x[keep]
    if len(x) < 2:
        raise ValueError(f"need at least 2 positive think times to fit, got {len(x)}")
    lx = np.log(x)
    # Plain MLE (closed form for both): start point, and the answer without truncation.
    mu, sigma = float(lx.mean()), float(lx.std())
    mean = float(x.mean())
    truncated = bound_s is not None
    if truncated:
        b_all = np.asarray(bound_s, dtype=np.float64).ravel()
        if b_all.shape != keep.shape:
            raise ValueError(f"bound_s has {b_all.size} values for {keep.size} think times")
        b = b_all[keep]
        if not np.isfinite(b).all() or (b < x).any():
            raise ValueError("every bound_s must be finite and ≥ its think time")
        lb = np.log(b)

        def nll_lognormal(theta: np.ndarray) -> float:
            m, s = theta[0], math.exp(theta[1])
            z, zb = (lx - m) / s, (lb - m) / s
            return float(-(stats.norm.logpdf(z) - math.log(s) - lx - stats.norm.logcdf(zb)).sum())

        res = optimize.minimize(nll_lognormal, [mu, math.log(sigma)], method="Nelder-Mead",
                                options={"xatol": 1e-9, "fatol": 1e-9, "maxiter": 4000})
        if not res.success:
            raise RuntimeError(f"truncated lognormal fit did not converge: {res.message}")
        mu, sigma = float(res.x[0]), float(math.exp(res.x[1]))

        def nll_exponential(log_mean: float) -> float:
            m = math.exp(log_mean)
            return float((math.log(m) + x / m + np.log(-np.expm1(-b / m))).sum())

        lo, hi = math.log(x.min()) - 5, math.log(x.max()) + 10
        res_e = optimize.minimize_scalar(nll_exponential, bounds=(lo, hi), method="bounded",
                                         options={"xatol": 1e-10})
        mean = float(math.exp(res_e.x))

    dist_l = stats.lognorm(sigma, scale=math.exp(mu))
    dist_e = stats.expon(scale=mean)
    ll_l = dist_l.logpdf(x)
    ll_e = dist_e.logpdf(x)
    u_l, u_e = dist_l.cdf(x), dist_e.cdf(x)
    if truncated:
        ll_l = ll_l - dist_l.logcdf(b)
        ll_e = ll_e - dist_e.logcdf(b)
        u_l, u_e = u_l / dist_l.cdf(b), u_e / dist_e.cdf(b)
    ks_l = stats.kstest(u_l, "uniform")
    ks_e = stats.kstest(u_e, "uniform")
    loglik_l, loglik_e = float(ll_l.sum()), float(ll_e.sum())
    return ThinkTimeFit(
        n_used=int(len(x)),
        n_nonpositive=n_nonpositive,
        truncated=truncated,
        lognormal_mu=mu,
        lognormal_sigma=sigma,
        lognormal_loglik=loglik_l,
        lognormal_aic=2 * 2 - 2 * loglik_l,
        lognormal_ks=float(ks_l.statistic),
        lognormal_ks_pvalue=float(ks_l.pvalue),
        exponential_mean_s=mean,
        exponential_loglik=loglik_e,
        exponential_aic=2 * 1 - 2 * loglik_e,
        exponential_ks=float(ks_e.statistic),
        exponential_ks_pvalue=float(ks_e.pvalue),
    )
