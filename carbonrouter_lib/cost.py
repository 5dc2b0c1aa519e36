"""The cost model of one query on candidate deployments (paper Eq. 4–6) and the break-even ratio.

For a query with N_new new input tokens, N_hist history tokens and N_out output tokens (all under
the candidate's model tokenizer), on a deployment a holding L(a) ≤ N_hist cached history tokens:

- energy (Eq. 4)     E(a)    = e_in·(N_new + N_hist − L) + e_cache·L + e_out·N_out       kWh
- base energy        E_base  = E with L = N_hist (history fully cached)                  kWh
- carbon (Eq. 5)     Ĉ(a)    = CI · E(a)                          gCO2e (CI in gCO2e/kWh)
- TTFT (Eq. 6)       TTFT(a) = (N_new + N_hist − L) / v_pre                               s
- service time       TTFT(a) + N_out / v_dec   (a turn dispatched at d completes at d + this)  s
- feasible (Eq. 7)   Q(m) ≥ β_Q·max Q  ∧  N_new + N_hist + N_out ≤ window  ∧  TTFT(a) ≤ D_TTFT

E − E_base = (e_in − e_cache)·(N_hist − L) ≥ 0 is the recomputation penalty of a (partial) miss;
the replay computes E in that form, E_base + (e_in − e_cache)·(N_hist − L)
(:func:`energy_from_base_kwh`), so that deployments with equal profiles tie exactly.

Every module that needs one of these equations (the policies' candidate evaluation, the
simulator's records, the gate's labels, the clairvoyant bound, the live router) calls the
function here; none writes the arithmetic again.

Two layers:

- the small *unchecked* functions (:func:`energy_kwh`, :func:`ttft_s`, ...) are plain arithmetic
  that works on Python scalars and on numpy arrays alike (broadcasting over candidates) without
  copying or validating — the simulator's hot path calls them;
- :func:`candidate_costs` validates its inputs (shapes, signs, L ≤ N_hist) and then calls them;
  :func:`deployment_costs` does the same from a profile table (``profiles.py``).

The break-even ratio (paper Section 2.3, Fig. 2(c)) asks how much cleaner another region must be
before leaving a full KV cache pays off; see :func:`break_even_ratio`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

import numpy as np
import pandas as pd

from carbonrouter_lib.paper import DEFAULTS
from carbonrouter_lib.profiles import validate_profiles

#: A scalar or an array over candidates (the unchecked functions broadcast).
Num = float | np.ndarray

__all__ = [
    "Num",
    "uncached_tokens",
    "energy_kwh",
    "energy_base_kwh",
    "recomputation_energy_kwh",
    "energy_from_base_kwh",
    "carbon_g",
    "ttft_s",
    "prefill_s",
    "service_time_s",
    "quality_feasible",
    "context_fits",
    "CandidateCosts",
    "candidate_costs",
    "deployment_costs",
    "break_even_ratio",
    "break_even_history",
    "cache_miss_penalty",
    "break_even_table",
]

# ---------------------------------------------------------------------------------------------
# Unchecked core (scalars or numpy arrays; broadcasting over candidates; no validation)
# ---------------------------------------------------------------------------------------------


def uncached_tokens(n_new: Num, n_hist: Num, cached: Num) -> Num:
    """Input tokens to prefill, N_new + N_hist − L (tokens). Unchecked."""
    return n_new + n_hist - cached


def energy_kwh(
    e_in: Num, e_cache: Num, e_out: Num, n_new: Num, n_hist: Num, cached: Num, n_out: Num
) -> Num:
    """Eq. 4: energy of a query, kWh. Unchecked.

    Parameters
    ----------
    e_in, e_cache, e_out : float or ndarray
        Energy per uncached input, cached input and output token of each candidate, kWh/token.
    n_new, n_hist, n_out : float or ndarray
        New input, history and output tokens under each candidate's model tokenizer, tokens.
    cached : float or ndarray
        L(a), history tokens cached on each candidate, tokens; must be ≤ ``n_hist`` (not checked
        here: see :func:`candidate_costs`).
    """
    return e_in * uncached_tokens(n_new, n_hist, cached) + e_cache * cached + e_out * n_out


def energy_base_kwh(
    e_in: Num, e_cache: Num, e_out: Num, n_new: Num, n_hist: Num, n_out: Num
) -> Num:
    """E_base: Eq. 4 with the history fully cached (L = N_hist), kWh. Unchecked.

    This is what cache-oblivious policies (GAR†, FairCarbon) believe every candidate costs.
    """
    return e_in * n_new + e_cache * n_hist + e_out * n_out


def recomputation_energy_kwh(e_in: Num, e_cache: Num, n_hist: Num, cached: Num) -> Num:
    """E − E_base = (e_in − e_cache)·(N_hist − L): the extra energy of a (partial) miss, kWh."""
    return (e_in - e_cache) * (n_hist - cached)


def energy_from_base_kwh(energy_base: Num, recompute_kwh_per_token: Num, missed: Num) -> Num:
    """Eq. 4 regrouped around E_base: (e_in − e_cache)·(N_hist − L) + E_base, kWh. Unchecked.

    The replay's form (:class:`~carbonrouter_lib.policies.QueryBatch` precomputes E_base once per
    query and deployment; a cache hit then costs one multiply-add). Equal to :func:`energy_kwh`
    up to rounding, and deployments with equal profiles get bit-identical values, so exact ties
    between them stay exact (``tests/test_cost.py`` pins both).

    Parameters
    ----------
    energy_base : float or ndarray
        E_base (:func:`energy_base_kwh`), kWh.
    recompute_kwh_per_token : float or ndarray
        e_in − e_cache, kWh/token: the energy of recomputing one missed history token.
    missed : float or ndarray
        N_hist − L, history tokens not cached, tokens.
    """
    return recompute_kwh_per_token * missed + energy_base


def carbon_g(ci: Num, energy: Num) -> Num:
    """Eq. 5: carbon, gCO2e, from intensity ``ci`` (gCO2e/kWh) and ``energy`` (kWh). Unchecked."""
    return ci * energy


def ttft_s(n_new: Num, n_hist: Num, cached: Num, v_pre: Num) -> Num:
    """Eq. 6: estimated time to first token, s — prefill of the uncached tokens at ``v_pre``
    tokens/s (no network, queueing or first-token decode). Unchecked."""
    return prefill_s(uncached_tokens(n_new, n_hist, cached), v_pre)


def prefill_s(uncached: Num, v_pre: Num) -> Num:
    """Eq. 6 from the uncached input tokens (:func:`uncached_tokens`), s: ``uncached / v_pre``.
    Unchecked. :func:`ttft_s` is this of N_new + N_hist − L."""
    return uncached / v_pre


def service_time_s(
    n_new: Num, n_hist: Num, cached: Num, n_out: Num, v_pre: Num, v_dec: Num
) -> Num:
    """TTFT + N_out / v_dec, s: a turn dispatched at time d completes at d + this. Unchecked."""
    return ttft_s(n_new, n_hist, cached, v_pre) + n_out / v_dec


def quality_feasible(quality: np.ndarray, beta_q: float) -> np.ndarray:
    """Eq. 7's quality constraint: model m is feasible when Q(m) ≥ β_Q · max_m Q(m), bool.

    ``quality`` holds Q(m) ∈ [0, 1] over models along its last axis (one query: (n_models,);
    many: (N, n_models)). Inclusive, and fl(β_Q·max) ≤ max for β_Q ≤ 1, so the best model always
    passes. Unchecked (``quality.feasible_models`` validates)."""
    return quality >= beta_q * quality.max(axis=-1, keepdims=True)


def context_fits(n_new: Num, n_hist: Num, n_out: Num, context_window: Num) -> Num:
    """Eq. 7's context constraint: N_new + N_hist + N_out ≤ the model's window (tokens), bool.
    Unchecked."""
    return n_new + n_hist + n_out <= context_window


# ---------------------------------------------------------------------------------------------
# Checked layer
# ---------------------------------------------------------------------------------------------


class CandidateCosts(NamedTuple):
    """Costs of one query on each candidate (arrays of one common shape)."""

    energy_kwh: np.ndarray  #: E(a), Eq. 4, kWh
    energy_base_kwh: np.ndarray  #: E_base(a), kWh
    carbon_g: np.ndarray  #: Ĉ(a) = CI·E(a), gCO2e
    carbon_base_g: np.ndarray  #: CI·E_base(a), gCO2e (the cache-oblivious estimate)
    ttft_s: np.ndarray  #: Eq. 6, s
    service_s: np.ndarray  #: TTFT + N_out / v_dec, s


def _as_float_array(name: str, value, positive: bool = False) -> np.ndarray:
    arr = np.asarray(value, dtype=float)
    bad = ~np.isfinite(arr) | ((arr <= 0) if positive else (arr < 0))
    if bad.any():
        rule = "finite and > 0" if positive else "finite and >= 0"
        if arr.ndim == 0:
            raise ValueError(f"{name} must be {rule}, got {arr.item()!r}")
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        at = idx[0] if len(idx) == 1 else idx
        raise ValueError(f"{name} must be {rule}, got {arr[idx]!r} at candidate {at}")
    return arr


def candidate_costs(
    e_in,
    e_cache,
    e_out,
    v_pre,
    v_dec,
    n_new,
    n_hist,
    cached,
    n_out,
    ci,
) -> CandidateCosts:
    """Eq. 4–6 for a query on every candidate, with validated inputs.

    Every argument is a scalar or an array broadcastable to the number of candidates.

    Parameters
    ----------
    e_in, e_cache, e_out : array_like
        kWh/token; ``e_in`` > 0, ``e_cache`` and ``e_out`` ≥ 0.
    v_pre, v_dec : array_like
        Prefill and decode throughput, tokens/s, > 0.
    n_new, n_hist, n_out : array_like
        Tokens (≥ 0) under each candidate's model tokenizer.
    cached : array_like
        L(a), tokens, 0 ≤ L(a) ≤ N_hist.
    ci : array_like
        Carbon intensity of each candidate's region at dispatch, gCO2e/kWh, ≥ 0.

    Returns
    -------
    CandidateCosts
        Float arrays of the broadcast shape.

    Raises
    ------
    ValueError
        On a negative, non-finite or (for ``e_in``, ``v_pre``, ``v_dec``) zero value, on
        ``cached > n_hist``, or on shapes that do not broadcast; the message names the argument
        and the first offending candidate.
    """
    e_in = _as_float_array("e_in", e_in, positive=True)
    e_cache = _as_float_array("e_cache", e_cache)
    e_out = _as_float_array("e_out", e_out)
    v_pre = _as_float_array("v_pre", v_pre, positive=True)
    v_dec = _as_float_array("v_dec", v_dec, positive=True)
    n_new = _as_float_array("n_new", n_new)
    n_hist = _as_float_array("n_hist", n_hist)
    cached = _as_float_array("cached", cached)
    n_out = _as_float_array("n_out", n_out)
    ci = _as_float_array("ci", ci)
    args = (e_in, e_cache, e_out, v_pre, v_dec, n_new, n_hist, cached, n_out, ci)
    try:
        shape = np.broadcast_shapes(*(a.shape for a in args))
    except ValueError as exc:
        names = "e_in e_cache e_out v_pre v_dec n_new n_hist cached n_out ci".split()
        shapes = ", ".join(f"{n}{a.shape}" for n, a in zip(names, args, strict=True))
        raise ValueError(f"candidate_costs: shapes do not broadcast: {shapes}") from exc
    over = np.broadcast_to(cached > n_hist, shape)
    if over.any():
        i = tuple(int(j) for j in np.argwhere(over)[0])
        c, h = np.broadcast_to(cached, shape)[i], np.broadcast_to(n_hist, shape)[i]
        at = i[0] if len(i) == 1 else i
        raise ValueError(f"cached (L = {c:g}) exceeds n_hist (N_hist = {h:g}) at candidate {at}")

    energy = np.broadcast_to(energy_kwh(e_in, e_cache, e_out, n_new, n_hist, cached, n_out), shape)
    base = np.broadcast_to(energy_base_kwh(e_in, e_cache, e_out, n_new, n_hist, n_out), shape)
    return CandidateCosts(
        energy_kwh=energy,
        energy_base_kwh=base,
        carbon_g=carbon_g(ci, energy),
        carbon_base_g=carbon_g(ci, base),
        ttft_s=np.broadcast_to(ttft_s(n_new, n_hist, cached, v_pre), shape),
        service_s=np.broadcast_to(
            service_time_s(n_new, n_hist, cached, n_out, v_pre, v_dec), shape
        ),
    )


def _per_row(name: str, value, profiles: pd.DataFrame) -> np.ndarray:
    """A scalar, an array with one value per profile row, or a mapping model → value."""
    if isinstance(value, Mapping):
        missing = sorted(set(profiles["model"]) - set(value))
        if missing:
            raise ValueError(f"{name}: no value for model(s) {missing}")
        return np.array([value[m] for m in profiles["model"]], dtype=float)
    arr = np.asarray(value, dtype=float)
    if arr.ndim == 0:
        return np.full(len(profiles), float(arr))
    if arr.shape != (len(profiles),):
        raise ValueError(
            f"{name}: expected a scalar, a mapping model -> value or {len(profiles)} values "
            f"(one per profile row), got shape {arr.shape}"
        )
    return arr


def deployment_costs(
    profiles: pd.DataFrame,
    n_new: float | Sequence[float] | Mapping[str, float],
    n_hist: float | Sequence[float] | Mapping[str, float],
    n_out: float | Sequence[float] | Mapping[str, float],
    cached: float | Sequence[float] = 0.0,
    ci: float | Sequence[float] = 1.0,
) -> pd.DataFrame:
    """Costs of one query on every deployment of a profile table (a readable, checked wrapper).

    Parameters
    ----------
    profiles : pandas.DataFrame
        A profile table (``profiles.analytical_profiles()`` or ``load_measured_profiles``).
    n_new, n_hist, n_out : scalar, per-row sequence, or mapping model → tokens
        Token counts (the mapping form carries per-model tokenizer counts).
    cached : scalar or per-row sequence
        L per row, tokens (0 = nothing cached anywhere).
    ci : scalar or per-row sequence
        Carbon intensity, gCO2e/kWh (1.0 makes ``carbon_g`` read as energy in kWh).

    Returns
    -------
    pandas.DataFrame
        ``model``, ``gpu``, ``uncached_tokens``, ``energy_kwh``, ``energy_base_kwh``,
        ``recomputation_kwh``, ``carbon_g``, ``carbon_base_g``, ``ttft_s``, ``service_s``.
    """
    p = validate_profiles(profiles, source="deployment_costs(profiles)")
    tok = {k: _per_row(k, v, p) for k, v in dict(n_new=n_new, n_hist=n_hist, n_out=n_out).items()}
    cached_arr = _per_row("cached", cached, p)
    costs = candidate_costs(
        p["e_in_kwh"].to_numpy(),
        p["e_cache_kwh"].to_numpy(),
        p["e_out_kwh"].to_numpy(),
        p["prefill_tok_s"].to_numpy(),
        p["decode_tok_s"].to_numpy(),
        tok["n_new"],
        tok["n_hist"],
        cached_arr,
        tok["n_out"],
        _per_row("ci", ci, p),
    )
    return pd.DataFrame(
        {
            "model": p["model"],
            "gpu": p["gpu"],
            "uncached_tokens": uncached_tokens(tok["n_new"], tok["n_hist"], cached_arr),
            "energy_kwh": costs.energy_kwh,
            "energy_base_kwh": costs.energy_base_kwh,
            "recomputation_kwh": costs.energy_kwh - costs.energy_base_kwh,
            "carbon_g": costs.carbon_g,
            "carbon_base_g": costs.carbon_base_g,
            "ttft_s": costs.ttft_s,
            "service_s": costs.service_s,
        }
    )


# ---------------------------------------------------------------------------------------------
# Break-even ratio (Section 2.3, Fig. 2(c))
# ---------------------------------------------------------------------------------------------


def _check_query(new_tokens: float, output_tokens: float, gamma: float, kappa: float) -> None:
    for name, v in (("new_tokens", new_tokens), ("output_tokens", output_tokens)):
        if not (np.isfinite(v) and v >= 0):
            raise ValueError(f"{name} must be finite and >= 0, got {v!r}")
    if not (np.isfinite(gamma) and 0 <= gamma <= 1):
        raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")
    if not (np.isfinite(kappa) and kappa >= 0):
        raise ValueError(f"kappa must be finite and >= 0, got {kappa!r}")
    if new_tokens + kappa * output_tokens <= 0:
        raise ValueError(
            "new_tokens + kappa * output_tokens must be > 0 (a query that costs nothing but its "
            "history has no finite break-even history)"
        )


def _scalar_or_array(x: np.ndarray, like) -> float | np.ndarray:
    return float(x) if np.ndim(like) == 0 else x


def break_even_ratio(
    history_tokens,
    new_tokens: float = 128,
    output_tokens: float = 256,
    gamma: float = DEFAULTS["gamma"],
    kappa: float = DEFAULTS["kappa"],
) -> float | np.ndarray:
    """CI_B / CI_A below which leaving a full cache on region A for region B pays off.

    Both regions run the same model on the same GPU; A holds the whole history H in cache, B none.
    Staying emits CI_A·E_hit, switching CI_B·E_miss, with (e_in cancels)

        E_hit  ∝ N_new + γ·H + κ·N_out,    E_miss ∝ N_new + H + κ·N_out,

    so switching pays off iff CI_B / CI_A < R(H) = E_hit / E_miss.

    Parameters
    ----------
    history_tokens : float or array_like
        H, cached history tokens (≥ 0).
    new_tokens, output_tokens : float
        N_new and N_out, tokens (≥ 0; N_new + κ·N_out must be > 0).
    gamma, kappa : float
        γ = e_cache/e_in in [0, 1]; κ = e_out/e_in ≥ 0.

    Returns
    -------
    float or ndarray
        R(H), dimensionless, in (γ, 1] for finite H (= 1 at H = 0), non-increasing in H (strictly
        decreasing when γ < 1) and → γ as H → ∞. A float for a scalar input.

    Raises
    ------
    ValueError
        On negative or non-finite history, out-of-range γ, κ, or N_new + κ·N_out = 0.
    """
    _check_query(new_tokens, output_tokens, gamma, kappa)
    h = np.asarray(history_tokens, dtype=float)
    if not (np.isfinite(h) & (h >= 0)).all():
        raise ValueError("history_tokens must be finite and >= 0")
    base = new_tokens + kappa * output_tokens
    ratio = (base + gamma * h) / (base + h)
    return _scalar_or_array(ratio, history_tokens)


def break_even_history(
    ratio=0.5,
    new_tokens: float = 128,
    output_tokens: float = 256,
    gamma: float = DEFAULTS["gamma"],
    kappa: float = DEFAULTS["kappa"],
) -> float | np.ndarray:
    """H*: the history length at which the break-even ratio falls to ``ratio`` (inverse of
    :func:`break_even_ratio`), tokens.

    Solving R(H) = r with c = N_new + κ·N_out:

        H* = (1 − r) · c / (r − γ)      for γ < r < 1,
        H* = 0                          for r ≥ 1   (R(H) ≤ 1 everywhere),
        H* = +inf                       for r ≤ γ   (R(H) > γ: never reached).

    For histories beyond H*, a region only ``1/r`` times cleaner no longer justifies leaving the
    cache (e.g. ``ratio=0.5``: beyond H*, halving the intensity is not enough).

    Parameters
    ----------
    ratio : float or array_like
        r = CI_B / CI_A, > 0.
    new_tokens, output_tokens, gamma, kappa : float
        As in :func:`break_even_ratio`.

    Returns
    -------
    float or ndarray
        H*, tokens (real-valued; may be ``inf``). A float for a scalar input.
    """
    _check_query(new_tokens, output_tokens, gamma, kappa)
    r = np.asarray(ratio, dtype=float)
    if not (np.isfinite(r) & (r > 0)).all():
        raise ValueError("ratio must be finite and > 0")
    c = new_tokens + kappa * output_tokens
    with np.errstate(divide="ignore", invalid="ignore"):
        h = (1.0 - r) * c / (r - gamma)
    h = np.where(r >= 1.0, 0.0, np.where(r <= gamma, np.inf, h))
    return _scalar_or_array(h, ratio)


def cache_miss_penalty(
    history_tokens,
    new_tokens: float = 128,
    output_tokens: float = 256,
    gamma: float = DEFAULTS["gamma"],
    kappa: float = DEFAULTS["kappa"],
) -> float | np.ndarray:
    """Relative increase of a query's energy (and carbon, at equal CI) when its full history
    misses the cache: E_miss / E_hit − 1 = 1 / R(H) − 1 (dimensionless; 1.26 = +126 %).

    The paper's Section 2 quotes medians of this quantity over ShareGPT queries (docs/model.md §10).
    """
    r = np.asarray(break_even_ratio(history_tokens, new_tokens, output_tokens, gamma, kappa))
    return _scalar_or_array(1.0 / r - 1.0, history_tokens)


def break_even_table(
    settings: Iterable[tuple[float, float]],
    ratio: float = 0.5,
    at_history: Sequence[float] = (4096, 8192, 16384),
    new_tokens: float = 128,
    output_tokens: float = 256,
) -> pd.DataFrame:
    """One row per (γ, κ) setting: H* at ``ratio`` and the break-even ratio at ``at_history``.

    Returns
    -------
    pandas.DataFrame
        ``gamma``, ``kappa``, ``h_star_tokens`` (H* at ``ratio``, tokens), then one column
        ``ratio_at_<H>`` per history length H (tokens).
    """
    rows = []
    for gamma, kappa in settings:
        row = {
            "gamma": float(gamma),
            "kappa": float(kappa),
            "h_star_tokens": break_even_history(ratio, new_tokens, output_tokens, gamma, kappa),
        }
        ratios = break_even_ratio(
            np.asarray(at_history, float), new_tokens, output_tokens, gamma, kappa
        )
        for h, r in zip(at_history, ratios, strict=True):
            row[f"ratio_at_{int(h)}"] = float(r)
        rows.append(row)
    return pd.DataFrame(rows)
