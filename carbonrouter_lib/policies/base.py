"""What a routing policy sees and the feasibility step every policy shares (spec §4, §5, §6a.1–2).

Per query of session s at dispatch time d the simulator

1. fills ONE :class:`QueryContext` with what is known at dispatch: the backend's cached prefix
   L(a), availability and free slots, the carbon intensity of every region, the query's token
   counts and predicted quality Q(m) per model;
2. calls :func:`feasibility`, which computes the cost model (Eq. 4–6, with the real L(a)) for all
   n deployments at once and the candidate set of Eq. 7 (available ∧ quality ∧ context window ∧
   TTFT, relaxed to best-effort or rejected as §5 / §6a.2 say) into a :class:`Candidates`;
3. unless the query is rejected, asks the policy: ``a = policy.choose(ctx, cand)``.

Everything is vectorized over deployments. The context and the candidates own preallocated
buffers that :meth:`QueryContext.fill` and :func:`feasibility` overwrite in place, so the
per-query path allocates (almost) nothing: a policy must not keep references to their arrays
beyond the call (copy what it needs to remember; the policies here remember only indices).

Units: tokens (stored as float64), kWh, gCO2e, gCO2e/kWh, seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from carbonrouter_lib.deployments import Deployments

__all__ = [
    "ConstraintConfig",
    "QueryContext",
    "Candidates",
    "feasibility",
    "Policy",
]


@dataclass(frozen=True)
class ConstraintConfig:
    """The constraints of Eq. 7 (paper defaults).

    Parameters
    ----------
    beta_q : float
        β_Q in (0, 1]: model m is quality-feasible when Q(m) ≥ β_Q · max_m Q(m) (inclusive, so
        the best model always is). Default 0.85.
    d_ttft_s : float
        TTFT bound D_TTFT, s, > 0 (``math.inf`` switches it off); TTFT ≤ D_TTFT is inclusive.
        Default 5.0.
    """

    beta_q: float = 0.85
    d_ttft_s: float = 5.0

    def __post_init__(self) -> None:
        b = self.beta_q
        if not (isinstance(b, int | float) and math.isfinite(b) and 0.0 < b <= 1.0):
            raise ValueError(f"ConstraintConfig.beta_q must be in (0, 1], got {b!r}")
        d = self.d_ttft_s
        if not (isinstance(d, int | float) and not math.isnan(d) and d > 0.0):
            raise ValueError(f"ConstraintConfig.d_ttft_s must be > 0 (s; inf allowed), got {d!r}")


class QueryContext:
    """Everything a policy may read about one query, as arrays over the n deployments.

    Create one per simulation run (``QueryContext(deployments)``, which allocates the buffers)
    and :meth:`fill` it once per query; :meth:`build` does both for a one-off context.

    Attributes
    ----------
    deployments : Deployments
        The deployments (index order = tie-break order, §6a.9).
    n : int
        Number of deployments.
    session, turn, prev : int
        Session id; turn index k (0-based); deployment that served the session's previous served
        turn (−1 if none: first turn, or every earlier turn rejected).
    time_s : float
        Dispatch time d, s since the Unix epoch (NaN if the caller did not give it).
    cached : ndarray, float64 (n,)
        L(a): history tokens cached on each deployment, clipped to N_hist of its model.
    n_new, n_hist, n_out_est : ndarray, float64 (n,)
        New input, history and *estimated* output tokens under each deployment's model tokenizer.
    n_new_m, n_hist_m, n_out_est_m : ndarray, float64 (n_models,)
        The same per model (MODELS order); views of one (3, n_models) buffer.
    quality : ndarray, float64 (n_models,)
        Predicted quality Q(m) of each model for this query, in [0, 1].
    ci : ndarray, float64 (n,)
        Carbon intensity of each deployment's region at dispatch, gCO2e/kWh.
    ci_region : ndarray, float64 (n_regions,)
        The same per region.
    available : ndarray, bool (n,)
        The backend can take the query on the deployment now (its pool holds the session or has a
        free slot).
    free_slots : ndarray, int64 (n_pools,)
        Free session slots per (region, GPU) pool; a pool holding the session counts its slot as
        taken.
    """

    __slots__ = (
        "deployments", "n", "session", "turn", "prev", "time_s",
        "cached", "n_new", "n_hist", "n_out_est", "n_new_m", "n_hist_m", "n_out_est_m",
        "quality", "ci", "ci_region", "available", "free_slots",
        "_tok_m_b", "_tok_b", "_ci_region_b", "_ci_b", "_de",
    )

    def __init__(self, deployments: Deployments) -> None:
        d = deployments
        n_m, n_r = len(d.models), len(d.regions)
        # Deployment a = (region·n_gpus + gpu)·n_models + model (deployments.py), so a per-model
        # array broadcasts to deployments as an (n_regions·n_gpus, n_models) block view and a
        # per-region one as (n_regions, n_gpus·n_models): a plain broadcast copy, far cheaper than
        # fancy indexing on the hot path.
        if not (np.array_equal(d.model, np.arange(d.n) % n_m)
                and np.array_equal(d.region, np.arange(d.n) // (d.n // n_r))):
            raise ValueError("QueryContext needs deployments numbered region-major, model-minor "
                             "(Deployments.build's order)")
        self.deployments = d
        self.n = d.n
        self.session, self.turn, self.prev, self.time_s = 0, 0, -1, math.nan
        # Rows: new, history, estimated output tokens.
        tok_m = np.zeros((3, n_m))
        tok = np.zeros((3, d.n))
        self._tok_m_b = tok_m[:, None, :]
        self._tok_b = tok.reshape(3, -1, n_m)
        self.n_new_m, self.n_hist_m, self.n_out_est_m = tok_m
        self.n_new, self.n_hist, self.n_out_est = tok
        self.cached = np.zeros(d.n)
        self.quality = np.zeros(n_m)
        self.ci_region = np.zeros(n_r)
        self.ci = np.zeros(d.n)
        self._ci_region_b = self.ci_region[:, None]
        self._ci_b = self.ci.reshape(n_r, -1)
        self.available = np.zeros(d.n, dtype=bool)
        self.free_slots = np.zeros(d.n_pools, dtype=np.int64)
        # e_in − e_cache, kWh/token: the recomputation energy of one missed history token.
        self._de = d.e_in - d.e_cache

    def fill(
        self,
        *,
        session: int,
        turn: int,
        prev: int,
        cached: np.ndarray,
        n_new: np.ndarray,
        n_hist: np.ndarray,
        n_out_est: np.ndarray,
        quality: np.ndarray,
        ci: np.ndarray,
        available: np.ndarray,
        free_slots: np.ndarray,
        time_s: float = math.nan,
        check: bool = False,
    ) -> QueryContext:
        """Overwrite the context with one query (in place; returns ``self``).

        Parameters
        ----------
        session, turn, prev : int
            Session id, turn index k ≥ 0, previous serving deployment (−1 if none).
        cached : array_like (n,)
            Cached prefix tokens per deployment as the backend reports it (not yet clipped).
        n_new, n_hist, n_out_est : array_like (n_models,)
            Tokens per model (MODELS order) under its tokenizer; ``n_out_est`` is the routing-time
            estimate of the output length.
        quality : array_like (n_models,)
            Q(m) ∈ [0, 1].
        ci : array_like (n_regions,)
            Carbon intensity of each region at dispatch, gCO2e/kWh.
        available : array_like of bool (n,)
        free_slots : array_like of int (n_pools,)
        time_s : float
            Dispatch time, s since the Unix epoch (optional; for gate features).
        check : bool
            Validate the values (:meth:`validate`); shapes are always checked by the copies.
        """
        self.session, self.turn, self.prev, self.time_s = int(session), int(turn), int(prev), time_s
        self.n_new_m[:] = n_new
        self.n_hist_m[:] = n_hist
        self.n_out_est_m[:] = n_out_est
        np.copyto(self._tok_b, self._tok_m_b)
        np.minimum(cached, self.n_hist, out=self.cached)
        self.quality[:] = quality
        self.ci_region[:] = ci
        np.copyto(self._ci_b, self._ci_region_b)
        np.copyto(self.available, available)
        np.copyto(self.free_slots, free_slots)
        if check:
            self.validate(raw_cached=cached)
        return self

    @classmethod
    def build(cls, deployments: Deployments, **fields) -> QueryContext:
        """A new, validated context (allocates; for tests and one-off use). See :meth:`fill`."""
        fields.setdefault("check", True)
        return cls(deployments).fill(**fields)

    def validate(self, raw_cached: np.ndarray | None = None) -> None:
        """Raise ``ValueError`` naming the field (and first bad index) on an invalid value."""

        def bad(name: str, arr: np.ndarray, cond: np.ndarray) -> None:
            if cond.any():
                i = int(np.argmax(cond))
                raise ValueError(f"QueryContext (session {self.session}, turn {self.turn}): "
                                 f"{name}[{i}] = {arr[i]!r} is invalid")

        for name in ("n_new_m", "n_hist_m", "n_out_est_m", "ci_region"):
            arr = getattr(self, name)
            bad(name, arr, ~np.isfinite(arr) | (arr < 0))
        bad("quality", self.quality, ~((self.quality >= 0) & (self.quality <= 1)))
        if raw_cached is not None:
            raw = np.asarray(raw_cached, dtype=float)
            bad("cached", raw, ~np.isfinite(raw) | (raw < 0))
        bad("free_slots", self.free_slots, self.free_slots < 0)
        if self.turn < 0:
            raise ValueError(f"QueryContext: turn must be >= 0, got {self.turn}")
        if not -1 <= self.prev < self.n:
            raise ValueError(f"QueryContext: prev must be -1 or a deployment index < {self.n}, "
                             f"got {self.prev}")


class Candidates:
    """Cost estimates of one query on every deployment and its candidate set (spec §5, §6a.1–2).

    Written by :func:`feasibility` (in place when passed as ``out``).

    Attributes
    ----------
    energy, energy_base : ndarray (n,)
        E(a) (Eq. 4 with the real L(a) and the estimated N_out) and E_base(a) (history fully
        cached), kWh.
    carbon, carbon_base : ndarray (n,)
        CI·E and CI·E_base, gCO2e (cache-aware and cache-oblivious estimates, Eq. 5).
    miss : ndarray (n,)
        History tokens to recompute, N_hist − L(a).
    ttft : ndarray (n,)
        Eq. 6 with the real L(a), s.
    ok : ndarray of bool (n,)
        Available ∧ quality-feasible model ∧ context fits (every constraint but TTFT).
    mask : ndarray of bool (n,)
        The candidate set policies choose from: ``ok`` ∧ TTFT ≤ D_TTFT, or in best-effort the
        ``ok`` deployments with the minimum TTFT; all False when rejected.
    best_effort, rejected : bool
        No ``ok`` deployment met the TTFT bound / no deployment is ``ok``.
    """

    __slots__ = ("n", "energy", "energy_base", "carbon", "carbon_base", "miss", "ttft",
                 "ok", "mask", "best_effort", "rejected", "_buf", "_okm")

    def __init__(self, n: int) -> None:
        self.n = n
        (self.energy, self.energy_base, self.carbon, self.carbon_base, self.miss, self.ttft,
         self._buf) = np.zeros((7, n))
        self.ok = np.zeros(n, dtype=bool)
        self.mask = np.zeros(n, dtype=bool)
        self._okm = np.zeros(n, dtype=bool)
        self.best_effort = False
        self.rejected = False

    def argmin(self, values: np.ndarray) -> int:
        """Index of the smallest of ``values`` over the candidate set (first one on ties), or
        −1 if the set is empty. ``values`` must not hold +inf at candidates."""
        buf = self._buf
        buf.fill(np.inf)
        np.copyto(buf, values, where=self.mask)
        a = int(buf.argmin())
        return a if self.mask[a] else -1

    def argmin_in(self, values: np.ndarray, start: int, stop: int) -> int:
        """As :meth:`argmin`, restricted to the index range [start, stop) (a region's block)."""
        buf = self._buf
        buf.fill(np.inf)
        np.copyto(buf, values, where=self.mask)
        a = start + int(buf[start:stop].argmin())
        return a if self.mask[a] else -1


def feasibility(
    ctx: QueryContext, config: ConstraintConfig | None = None, out: Candidates | None = None
) -> Candidates:
    """Eq. 4–7 for one query over all deployments: costs, feasibility, best-effort, reject.

    Parameters
    ----------
    ctx
        The filled query context.
    config
        β_Q and D_TTFT (default :class:`ConstraintConfig`()).
    out
        Buffers to overwrite (reuse one per run on the hot path); new ones if None.

    Returns
    -------
    Candidates
        ``out`` (or a new one). A deployment is a candidate when it is available, its model is
        quality-feasible (Q(m) ≥ β_Q·max Q), N_new + N_hist + N_out_est ≤ its context window and
        TTFT ≤ D_TTFT (all inclusive). If no deployment meets the TTFT bound but some meet the
        rest, the candidates are those among them with the minimum TTFT (``best_effort``); if
        none meets the rest, the set is empty (``rejected``).
    """
    cfg = _DEFAULT_CONSTRAINTS if config is None else config
    c = Candidates(ctx.n) if out is None else out
    d = ctx.deployments
    buf, eb = c._buf, c.energy_base
    # Cost model: cost.py's Eq. 4–6 written into preallocated buffers.
    np.subtract(ctx.n_hist, ctx.cached, out=c.miss)
    # E_base = e_in·N_new + e_cache·N_hist + e_out·N_out (cost.energy_base_kwh)
    np.multiply(d.e_in, ctx.n_new, out=eb)
    np.multiply(d.e_cache, ctx.n_hist, out=buf)
    np.add(eb, buf, out=eb)
    np.multiply(d.e_out, ctx.n_out_est, out=buf)
    np.add(eb, buf, out=eb)
    # E = E_base + (e_in − e_cache)·(N_hist − L): Eq. 4 regrouped (equal to cost.energy_kwh up
    # to rounding; deployments with the same profile and L get bit-identical values, so exact
    # ties stay exact).
    np.multiply(ctx._de, c.miss, out=c.energy)
    np.add(c.energy, eb, out=c.energy)
    np.multiply(ctx.ci, c.energy, out=c.carbon)
    np.multiply(ctx.ci, eb, out=c.carbon_base)
    # TTFT = (N_new + N_hist − L) / v_pre, a division as in cost.ttft_s, so that the inclusive
    # bound agrees exactly with a hand computation.
    np.add(ctx.n_new, c.miss, out=c.ttft)
    np.divide(c.ttft, d.v_pre, out=c.ttft)
    # Every constraint but TTFT: quality (Q ≥ β_Q·max Q, as quality.feasible_models), availability,
    # context window (N_new + N_hist + N_out_est ≤ window).
    q = ctx.quality
    qok = q >= cfg.beta_q * max(q.tolist())
    np.logical_and(qok[d.model], ctx.available, out=c.ok)
    np.add(ctx.n_new, ctx.n_hist, out=buf)
    np.add(buf, ctx.n_out_est, out=buf)
    np.less_equal(buf, d.context_window, out=c._okm)
    np.logical_and(c.ok, c._okm, out=c.ok)
    np.less_equal(c.ttft, cfg.d_ttft_s, out=c.mask)
    np.logical_and(c.mask, c.ok, out=c.mask)
    c.rejected = False
    c.best_effort = False
    if not np.count_nonzero(c.mask):
        if not np.count_nonzero(c.ok):
            c.rejected = True
        else:
            # Best-effort (§6a.2): the ok deployments with the shortest estimated TTFT.
            buf.fill(np.inf)
            np.copyto(buf, c.ttft, where=c.ok)
            np.equal(buf, buf[buf.argmin()], out=c.mask)
            c.best_effort = True
    return c


_DEFAULT_CONSTRAINTS = ConstraintConfig()


class Policy:
    """A routing policy: one decision per query over the candidate set.

    Subclasses implement :meth:`choose`; the hooks are optional. Per-session state lives in the
    policy, keyed by session id. Parameters are keyword arguments of ``__init__`` and are
    reported by :meth:`params` (recorded with every result).
    """

    #: Registry name (``POLICIES`` key).
    name: str = ""

    def choose(self, ctx: QueryContext, cand: Candidates) -> int:
        """The deployment to serve the query on; called only when ``cand`` is not rejected.

        Must return an index with ``cand.mask[a]`` True.
        """
        raise NotImplementedError

    def on_session_start(self, ctx: QueryContext) -> None:
        """Called once at the session's first turn (k = 0), before feasibility and the decision,
        whether or not that turn is then served."""

    def on_served(self, ctx: QueryContext, a: int) -> None:
        """Called after the query was dispatched on deployment ``a``."""

    def on_session_end(self, session: int) -> None:
        """Called when the session leaves (its last turn completed or was rejected)."""

    def params(self) -> dict:
        """The policy's parameters (JSON-friendly), recorded with results."""
        return {}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"
