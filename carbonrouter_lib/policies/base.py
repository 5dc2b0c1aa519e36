"""What a routing policy sees and the feasibility step all policies share (docs/model.md §4–§6a).

Per query of session s at dispatch time d the simulator

1. fills ONE :class:`QueryContext` with what is known at dispatch: the backend's cached prefix
   L(a), availability and free slots, the carbon intensity of every region, the query's token
   counts and predicted quality Q(m) per model;
2. calls :func:`feasibility`, which computes the cost model (Eq. 4–6, with the real L(a)) for all
   n deployments at once and the candidate set of Eq. 7 (available ∧ quality ∧ context window ∧
   TTFT, relaxed to best-effort or rejected as §5 / §6a.2 say) into a :class:`Candidates`;
3. unless the query is rejected, asks the policy: ``a = policy.choose(ctx, cand)``.

Everything is vectorized over deployments. Most of Eq. 4–7 does not depend on when or where a
query is dispatched: E_base(a), the energy with nothing cached, the quality and context-window
checks and the TTFT with nothing cached depend only on the query's token counts and Q(m).
:class:`QueryBatch` computes these *dispatch-independent* terms for many queries at once (the
simulator: the whole workload, vectorized over queries × deployments). Per query, the context
then only adds what is known at dispatch — the carbon intensity, the session's caches (a few
deployments, patched one by one with the same arithmetic) and availability — and
:class:`Candidates` computes each cost array on first access (a policy reads one or two). A
one-off context (:meth:`QueryContext.fill`) goes through a batch of one query: one code path.

The context and the candidates reuse their buffers from query to query, so the per-query path
allocates (almost) nothing: a policy must not keep references to their arrays beyond the call
(copy what it needs to remember; the policies here remember only indices).

Units: tokens (stored as float64), kWh, gCO2e, gCO2e/kWh, seconds.
"""

from __future__ import annotations

import array
import dataclasses
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from carbonrouter_lib import cost
from carbonrouter_lib.deployments import Deployments
from carbonrouter_lib.paper import DEFAULTS

__all__ = [
    "ConstraintConfig",
    "QueryBatch",
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

    beta_q: float = DEFAULTS["beta_q"]
    d_ttft_s: float = DEFAULTS["d_ttft_s"]

    def __post_init__(self) -> None:
        b = self.beta_q
        if not (isinstance(b, int | float) and math.isfinite(b) and 0.0 < b <= 1.0):
            raise ValueError(f"ConstraintConfig.beta_q must be in (0, 1], got {b!r}")
        d = self.d_ttft_s
        if not (isinstance(d, int | float) and not math.isnan(d) and d > 0.0):
            raise ValueError(f"ConstraintConfig.d_ttft_s must be > 0 (s; inf allowed), got {d!r}")


# Module-level names: cheaper lookups on the per-query path.
_INF = math.inf
_copyto = np.copyto
_count_nonzero = np.count_nonzero
_energy_from_base = cost.energy_from_base_kwh
_prefill_s = cost.prefill_s

#: Queries per block when a :class:`QueryBatch` is computed (bounds the temporaries' memory).
_BLOCK = 4096


def _first_region(d: Deployments) -> Deployments:
    """The deployments of the first region. Every region holds the same (GPU, model) profiles in
    the same order (deployments.py), so per-query terms that do not depend on the region are
    computed on these and copied to the other regions."""
    n_r = len(d.regions)
    block = d.n // n_r
    d0 = dataclasses.replace(
        d, regions=d.regions[:1],
        **{f: getattr(d, f)[:block] for f in ("model", "gpu", "region", "pool", "e_in", "e_cache",
                                             "e_out", "v_pre", "v_dec", "context_window")},
    )
    for f in ("model", "gpu", "e_in", "e_cache", "e_out", "v_pre", "context_window"):
        if not np.array_equal(getattr(d, f).reshape(n_r, block), np.tile(getattr(d0, f),
                                                                         (n_r, 1))):
            raise ValueError(f"deployments must repeat the same profiles in every region ({f})")
    return d0


def _gather(d: Deployments, per_model: np.ndarray) -> np.ndarray:
    """(..., n_models) per-model values → (..., n) per-deployment values."""
    return per_model[..., d.model]


def _checks(
    d: Deployments, quality: np.ndarray, new: np.ndarray, hist: np.ndarray, out: np.ndarray,
    cfg: ConstraintConfig,
) -> tuple[np.ndarray, np.ndarray]:
    """The constraints of Eq. 7 that need no dispatch-time state, for queries × deployments.

    ``quality`` is (N, n_models); ``new``, ``hist``, ``out`` are (N, n) tokens on the
    deployments ``d`` (here: one region's). Returns
    ``ok`` (quality-feasible model and the context fits: :func:`.cost.quality_feasible`,
    :func:`.cost.context_fits`) and ``fast`` (``ok`` and, with nothing cached,
    TTFT ≤ D_TTFT: :func:`.cost.ttft_s`).
    """
    ok = _gather(d, cost.quality_feasible(quality, cfg.beta_q)) & cost.context_fits(
        new, hist, out, d.context_window)
    fast = ok & (cost.ttft_s(new, hist, 0.0, d.v_pre) <= cfg.d_ttft_s)
    return ok, fast


class QueryBatch:
    """The dispatch-independent terms of Eq. 4–7 for a batch of queries over all deployments.

    Parameters
    ----------
    deployments : Deployments
    n_new, n_hist, n_out_est : array_like, float (N, n_models)
        New input, history and *estimated* output tokens of each query under each model's
        tokenizer (MODELS order).
    quality : array_like, float (N, n_models)
        Predicted quality Q(m) of each query, in [0, 1].
    config : ConstraintConfig or None
        Constraints whose checks are precomputed for every query; :func:`feasibility` called with
        another config computes them for its query instead. None: none precomputed.
    check : bool
        Validate the values (finite and ≥ 0 tokens, quality in [0, 1]); ``ValueError`` naming
        the quantity and the first bad query (row) otherwise. Shapes are always checked.
    conversation : array_like of int (N,), optional
        The conversation each query belongs to (:func:`carbonrouter_lib.prepared.
        conversation_codes`; copies of a conversation in a resampled replay share it). None:
        each session is its own conversation (:attr:`QueryContext.conversation`).
    first_region : Deployments, optional
        ``deployments``' first region (its (GPU, model) pairs), where the caller keeps it: a
        context filling one query at a time (:meth:`QueryContext.fill`, the live router) would
        otherwise build it for every query (31 µs of a 49-µs fill).

    Attributes
    ----------
    deployments : Deployments
    config : ConstraintConfig or None
    tokens : ndarray, float64 (N, 3, n_models)
        Rows new, history, estimated output tokens per model (built on first access: the
        compiled loop reads the inputs themselves).
    quality : ndarray, float64 (N, n_models)
    block : int
        Deployments per region, B = n / n_regions. The per-deployment terms below do not depend
        on the region (every region holds the same (GPU, model) profiles in the same order), so
        they are stored for the first region's B deployments only; deployment a's value is at
        column ``a % B``.
    energy_base : ndarray, float64 (N, B)
        E_base(a) = e_in·N_new + e_cache·N_hist + e_out·N_out_est (:func:`.cost.energy_base_kwh`),
        kWh; built on first access (the compiled loop computes a query's per decision).
    energy_uncached : ndarray, float64 (N, B)
        E(a) with nothing cached, E_base + (e_in − e_cache)·N_hist
        (:func:`.cost.energy_from_base_kwh`), kWh; built on first access.
    ok_block, fast_block : ndarray of bool (N, B), or None without ``config``
        See :func:`_checks`: quality ∧ context window, and that ∧ TTFT(L = 0) ≤ D_TTFT; like
        the energies, per (GPU, model) pair of one region.
    ok, fast : ndarray of bool (N, n), or None without ``config``
        ``ok_block`` and ``fast_block`` over every deployment (one byte each: the Python
        loop's per-query mask is then one flat operation), built on first access.

    Every array is read-only. Memory: 2 bool arrays of N × B (2M queries, 15 (GPU, model)
    pairs: 60 MB); the Python loop's arrays (the energies, ``tokens``, ``ok``, ``fast`` and flat
    copies) add about 26 bytes per query and deployment when first read. The compiled loop
    reads none of them: a service-scale replay keeps only what it needs.
    """

    def __init__(
        self,
        deployments: Deployments,
        n_new: np.ndarray,
        n_hist: np.ndarray,
        n_out_est: np.ndarray,
        quality: np.ndarray,
        config: ConstraintConfig | None = None,
        check: bool = True,
        conversation: np.ndarray | None = None,
        first_region: Deployments | None = None,
    ) -> None:
        d = deployments
        n_m = len(d.models)
        # Read-only views of the inputs (no copies; integer counts stay integers): the Python
        # loop's stacked and flat float64 forms are built from them on first access.
        inputs = [np.asarray(x) for x in (n_new, n_hist, n_out_est)]
        inputs = [(x if np.issubdtype(x.dtype, np.integer) else x.astype(np.float64, copy=False))
                  .view() for x in inputs]
        q = np.asarray(quality, dtype=np.float64).view()
        if (any(x.ndim != 2 or x.shape[1] != n_m or x.shape != inputs[0].shape for x in inputs)
                or q.shape != inputs[0].shape):
            raise ValueError(f"QueryBatch: token counts and quality must be (N, {n_m}) arrays "
                             f"of one N; got tokens {[x.shape for x in inputs]}, quality "
                             f"{q.shape}")
        if check:
            for x, name in zip(inputs, ("n_new", "n_hist", "n_out_est"), strict=True):
                _check_rows(name, x, ~np.isfinite(x) | (x < 0))
            _check_rows("quality", q, ~((q >= 0) & (q <= 1)))
        n_q = q.shape[0]
        self._conversation: np.ndarray | None = None
        if conversation is not None:
            conv = np.asarray(conversation)
            if conv.shape != (n_q,) or not np.issubdtype(conv.dtype, np.integer):
                raise ValueError(f"QueryBatch: conversation must be {n_q} integers, got "
                                 f"{conv.dtype} {conv.shape}")
            self._conversation = conv
        self.deployments, self.config = d, config
        self._inputs, self.quality = inputs, q
        self._n_models = n_m
        self._d0 = d0 = _first_region(d) if first_region is None else first_region
        self._n_regions = len(d.regions)
        self.block = d0.n
        self.ok_block = self.fast_block = None
        if config is not None:
            self.ok_block = np.empty((n_q, d0.n), dtype=bool)
            self.fast_block = np.empty((n_q, d0.n), dtype=bool)
            for lo in range(0, n_q, _BLOCK):
                rows = slice(lo, lo + _BLOCK)
                new, hist, out = (_gather(d0, x[rows]).astype(np.float64) for x in inputs)
                self.ok_block[rows], self.fast_block[rows] = _checks(d0, q[rows], new, hist, out,
                                                                     config)
        for arr in (*inputs, q, self.ok_block, self.fast_block):
            if arr is not None:
                arr.flags.writeable = False

    @functools.cached_property
    def _energies(self) -> tuple[np.ndarray, np.ndarray]:
        d0 = self._d0
        n_q = self.quality.shape[0]
        energy_base, energy_uncached = np.empty((n_q, d0.n)), np.empty((n_q, d0.n))
        de = d0.e_in - d0.e_cache  # kWh/token: the recomputation energy of one missed token
        for lo in range(0, n_q, _BLOCK):
            rows = slice(lo, lo + _BLOCK)
            new, hist, out = (_gather(d0, x[rows]).astype(np.float64) for x in self._inputs)
            eb = cost.energy_base_kwh(d0.e_in, d0.e_cache, d0.e_out, new, hist, out)
            energy_base[rows] = eb
            energy_uncached[rows] = cost.energy_from_base_kwh(eb, de, hist)
        energy_base.flags.writeable = energy_uncached.flags.writeable = False
        return energy_base, energy_uncached

    @property
    def energy_base(self) -> np.ndarray:
        """E_base per query and (GPU, model) pair, kWh (N, B); built on first access."""
        return self._energies[0]

    @property
    def energy_uncached(self) -> np.ndarray:
        """E with nothing cached per query and (GPU, model) pair, kWh (N, B); built on first
        access."""
        return self._energies[1]

    @functools.cached_property
    def tokens(self) -> np.ndarray:
        """New, history and estimated output tokens per model, float64 (N, 3, n_models)."""
        tokens = np.stack(self._inputs, axis=1, dtype=np.float64)
        tokens.flags.writeable = False
        return tokens

    @functools.cached_property
    def _new_hist(self) -> array.array:
        # N_new and N_hist per model as a flat typed array: scalar reads on the hot path.
        return array.array("d", self.tokens[:, :2].tobytes())

    @functools.cached_property
    def conversation(self) -> list[int] | None:
        """The conversation of each query (None: each session is its own), a list: scalar
        reads on the Python loop's hot path."""
        return None if self._conversation is None else self._conversation.tolist()

    @functools.cached_property
    def ok(self) -> np.ndarray | None:
        """``ok_block`` over every deployment, bool (N, n)."""
        return self._tiled(self.ok_block)

    @functools.cached_property
    def fast(self) -> np.ndarray | None:
        """``fast_block`` over every deployment, bool (N, n)."""
        return self._tiled(self.fast_block)

    def _tiled(self, per_block: np.ndarray | None) -> np.ndarray | None:
        if per_block is None:
            return None
        out = np.tile(per_block, (1, self._n_regions))
        out.flags.writeable = False
        return out

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def checks(self, row: int, config: ConstraintConfig) -> tuple[np.ndarray, np.ndarray]:
        """``ok`` and ``fast`` (see the class) of query ``row`` under ``config``, each (n,)."""
        if self.ok is not None and (config is self.config or config == self.config):
            return self.ok[row], self.fast[row]
        d0, n_r = self._d0, len(self.deployments.regions)
        new, hist, out = _gather(d0, self.tokens[row])[:, None]
        ok, fast = _checks(d0, self.quality[row][None], new, hist, out, config)
        return np.tile(ok[0], n_r), np.tile(fast[0], n_r)


def _check_rows(name: str, arr: np.ndarray, bad: np.ndarray) -> None:
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise ValueError(f"QueryBatch: {name}[{i}, {j}] = {arr[i, j]!r} is invalid (row {i})")


class QueryContext:
    """Everything a policy may read about one query, as arrays over the n deployments.

    Create one per simulation run (``QueryContext(deployments)``, which allocates the buffers)
    and fill it once per query: :meth:`fill_row` (the simulator's path: a row of a
    :class:`QueryBatch` plus the backend's state, no copies) or :meth:`fill` (one query from
    per-model arrays); :meth:`build` creates and fills a one-off context.

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
    batch, row : QueryBatch, int
        Where the query's dispatch-independent terms are (``batch`` row ``row``).
    conversation : int
        The conversation the session replays (the batch's ``conversation``; the session id when
        the batch has none): copies of one conversation share it (replay scale).
    cached : ndarray, float64 (n,)
        L(a): history tokens cached on each deployment, clipped to N_hist of its model.
    n_new, n_hist, n_out_est : ndarray, float64 (n,)
        New input, history and *estimated* output tokens under each deployment's model tokenizer
        (computed on access).
    n_new_m, n_hist_m, n_out_est_m : ndarray, float64 (n_models,)
        The same per model (MODELS order).
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
    backend : Backend or None
        Read-only view of the emulated backend at dispatch (set once per run by the simulator;
        None for a standalone context): for features beyond the above, e.g. the KV memory in use
        per pool (the learned gate). A policy must not mutate it (``backend.copy()`` to explore).
    signal : CarbonSignal or None
        The run's carbon signal (set once per run by the simulator; None for a standalone
        context): e.g. the recent change of the intensity (the learned gate).
    """

    __slots__ = (
        "deployments", "n", "session", "turn", "prev", "time_s", "batch", "row",
        "cached", "ci", "ci_region", "available", "free_slots", "backend", "signal",
        "_hits", "_model", "_v_pre", "_de", "_ci_region_b", "_ci_b", "_own_available",
        "_own_free", "_n_regions", "_block", "_d0",
    )

    def __init__(self, deployments: Deployments) -> None:
        d = deployments
        n_r = len(d.regions)
        # A region's deployments are contiguous (deployments.py), so a per-region array
        # broadcasts to deployments as an (n_regions, n_gpus·n_models) block view: a plain
        # broadcast copy, far cheaper than fancy indexing.
        if not np.array_equal(d.region, np.arange(d.n) // (d.n // n_r)):
            raise ValueError("QueryContext needs deployments numbered region-major "
                             "(Deployments.build's order)")
        self.deployments = d
        self.n = d.n
        self.session, self.turn, self.prev, self.time_s = 0, 0, -1, math.nan
        self.batch: QueryBatch | None = None
        self.row = 0
        self.cached = np.zeros(d.n)
        self.ci_region = np.zeros(n_r)
        self.ci = np.zeros(d.n)
        self._ci_region_b = self.ci_region[:, None]
        self._ci_b = self.ci.reshape(n_r, -1)
        self._n_regions, self._block = n_r, d.n // n_r
        self._d0 = _first_region(d)  # for fill's one-query batches
        self._own_available = np.zeros(d.n, dtype=bool)
        self._own_free = np.zeros(d.n_pools, dtype=np.int64)
        self.available = self._own_available
        self.free_slots = self._own_free
        self.backend = None
        self.signal = None
        # (a, L, N_hist − L, N_new) of every deployment with L(a) > 0: the few entries where the
        # costs differ from the batch's "nothing cached" terms.
        self._hits: list[tuple[int, float, float, float]] = []
        # Python lists: the per-hit arithmetic is scalar.
        self._model = d.model.tolist()
        self._v_pre = d.v_pre.tolist()
        self._de = (d.e_in - d.e_cache).tolist()  # kWh/token

    # ---- per-model and per-deployment views of the query ---------------------------------

    @property
    def conversation(self) -> int:
        conv = self.batch.conversation
        return self.session if conv is None else conv[self.row]

    @property
    def n_new_m(self) -> np.ndarray:
        return self.batch.tokens[self.row, 0]

    @property
    def n_hist_m(self) -> np.ndarray:
        return self.batch.tokens[self.row, 1]

    @property
    def n_out_est_m(self) -> np.ndarray:
        return self.batch.tokens[self.row, 2]

    @property
    def quality(self) -> np.ndarray:
        return self.batch.quality[self.row]

    @property
    def n_new(self) -> np.ndarray:
        return _gather(self.deployments, self.n_new_m)

    @property
    def n_hist(self) -> np.ndarray:
        return _gather(self.deployments, self.n_hist_m)

    @property
    def n_out_est(self) -> np.ndarray:
        return _gather(self.deployments, self.n_out_est_m)

    # ---- filling ----------------------------------------------------------------------------

    def set_ci(self, ci: np.ndarray) -> None:
        """Set the carbon intensity of every region, gCO2e/kWh (n_regions,). The simulator calls
        it only when the signal's value changes (once per grid step); :meth:`fill` every time."""
        self.ci_region[:] = ci
        np.copyto(self._ci_b, self._ci_region_b)

    def fill_row(
        self,
        batch: QueryBatch,
        row: int,
        *,
        session: int,
        turn: int,
        prev: int,
        cached: Mapping[int, float],
        available: np.ndarray,
        free_slots: np.ndarray,
        time_s: float = math.nan,
    ) -> QueryContext:
        """Point the context at query ``row`` of ``batch`` at dispatch (in place; returns
        ``self``). The carbon intensity is set by :meth:`set_ci`.

        Parameters
        ----------
        session, turn, prev : int
            Session id, turn index k ≥ 0, previous serving deployment (−1 if none).
        cached : mapping of int to int or float
            ``{deployment: cached prefix tokens}`` of the session as the backend reports it
            (:meth:`Backend.session_caches`; absent deployments hold none); clipped to N_hist
            here.
        available : ndarray of bool (n,)
        free_slots : ndarray of int (n_pools,)
            Used as given, not copied: the caller must not change them while the context is in
            use.
        time_s : float
            Dispatch time, s since the Unix epoch (optional; for gate features).
        """
        self.session, self.turn, self.prev, self.time_s = session, turn, prev, time_s
        self.batch, self.row = batch, row
        self.available, self.free_slots = available, free_slots
        buf = self.cached
        for hit in self._hits:  # the dense L(a) is zero except at the hits: reset only those
            buf[hit[0]] = 0.0
        hits = []
        if cached:
            new_hist, model, n_m = batch._new_hist, self._model, batch._n_models
            at = 2 * n_m * row  # N_new of model m at at + m, N_hist at at + n_m + m
            for a, tokens in cached.items():
                m = model[a]
                hist = new_hist[at + n_m + m]
                L = min(float(tokens), hist)
                if L != 0.0:
                    buf[a] = L
                    hits.append((a, L, hist - L, new_hist[at + m]))
        self._hits = hits
        return self

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
        """Overwrite the context with one query given per model (in place; returns ``self``).

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
            Copied into the context's own buffers (shapes are checked by the copies).
        time_s : float
            Dispatch time, s since the Unix epoch (optional; for gate features).
        check : bool
            Validate the values (:meth:`validate`).
        """
        n_m = len(self.deployments.models)
        per_model = [np.broadcast_to(np.asarray(x, dtype=np.float64), (n_m,))[None]
                     for x in (n_new, n_hist, n_out_est, quality)]
        batch = QueryBatch(self.deployments, *per_model, check=False, first_region=self._d0)
        raw = np.asarray(cached, dtype=np.float64)
        if raw.shape != (self.n,):
            raise ValueError(f"QueryContext: cached must have shape ({self.n},), got {raw.shape}")
        np.copyto(self._own_available, available)
        np.copyto(self._own_free, free_slots)
        self.set_ci(ci)
        at = np.flatnonzero(raw)
        self.fill_row(batch, 0, session=int(session), turn=int(turn), prev=int(prev),
                      cached=dict(zip(at.tolist(), raw[at].tolist(), strict=True)),
                      available=self._own_available, free_slots=self._own_free, time_s=time_s)
        if check:
            self.validate(raw_cached=raw)
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
    """Cost estimates of one query on each deployment, its candidates (docs/model.md §5, §6a.1–2).

    Written by :func:`feasibility` (in place when passed as ``out``). ``mask`` and the flags are
    set by it; ``ok`` and each cost array are computed on their first access after it (a policy
    reads one or two of them), from the query's context, which must not be refilled meanwhile.

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
    ok_if_free : ndarray of bool (n,)
        Quality-feasible model ∧ context fits: ``ok`` had every pool a free slot.
    mask : ndarray of bool (n,)
        The candidate set policies choose from: ``ok`` ∧ TTFT ≤ D_TTFT, or in best-effort the
        ``ok`` deployments with the minimum TTFT; all False when rejected.
    best_effort, rejected : bool
        No ``ok`` deployment met the TTFT bound / no deployment is ``ok``.

    The arrays are read-only to policies.
    """

    __slots__ = ("n", "mask", "best_effort", "rejected", "_ctx", "_ok_row", "_buf",
                 "_ok", "_energy", "_energy_base", "_carbon", "_carbon_base", "_miss", "_ttft",
                 "_o", "_e", "_eb", "_c", "_cb", "_m", "_t", "_he", "_nr", "_views")

    def __init__(self, n: int) -> None:
        self.n = n
        # Buffers; the cost arrays of the current query are in _e, _eb, ... (None: not yet).
        (self._energy, self._energy_base, self._carbon, self._carbon_base, self._miss,
         self._ttft, self._buf) = np.zeros((7, n))
        self._ok = np.zeros(n, dtype=bool)
        self.mask = np.zeros(n, dtype=bool)
        self.best_effort = False
        self.rejected = False
        self._ctx: QueryContext | None = None
        self._ok_row: np.ndarray | None = None
        self._nr = 0
        self._views: tuple[np.ndarray, ...] = ()
        self._o = self._e = self._eb = self._c = self._cb = self._m = self._t = self._he = None

    def _bind(self, ctx: QueryContext, ok_row: np.ndarray) -> None:
        self._ctx, self._ok_row = ctx, ok_row
        self._o = self._e = self._eb = self._c = self._cb = self._m = self._t = self._he = None
        n_r = ctx._n_regions
        if n_r != self._nr:
            # (region, deployment of the region) views: per-region terms broadcast against the
            # batch's (B,) rows in one call.
            self._nr = n_r
            self._views = tuple(x.reshape(n_r, -1) for x in (
                self.mask, self._ok, self._energy, self._energy_base, self._carbon,
                self._carbon_base))

    @property
    def ok_if_free(self) -> np.ndarray:
        """``ok`` whatever the backend's state: the deployments with a quality-feasible model
        whose context fits, whether or not their pool has a free slot now (read-only)."""
        return self._ok_row

    @property
    def ok(self) -> np.ndarray:
        if self._o is None:
            self._o = np.logical_and(self._ok_row, self._ctx.available, out=self._ok)
        return self._o

    @property
    def energy_base(self) -> np.ndarray:
        if self._eb is None:
            ctx = self._ctx
            np.copyto(self._views[3], ctx.batch.energy_base[ctx.row])
            self._eb = self._energy_base
        return self._eb

    def _hit_energy(self) -> list[tuple[int, float]]:
        """(a, E(a)) where part of the history is cached, the only entries where E differs from
        the batch's nothing-cached energy (:func:`.cost.energy_from_base_kwh`, as the batch)."""
        if self._he is None:
            ctx = self._ctx
            eb, de, block = ctx.batch.energy_base[ctx.row], ctx._de, ctx._block
            self._he = [(a, _energy_from_base(float(eb[a % block]), de[a], miss))
                        for a, _, miss, _ in ctx._hits]
        return self._he

    @property
    def energy(self) -> np.ndarray:
        if self._e is None:
            ctx = self._ctx
            e = self._energy
            np.copyto(self._views[2], ctx.batch.energy_uncached[ctx.row])
            if ctx._hits:
                for a, e_a in self._hit_energy():
                    e[a] = e_a
            self._e = e
        return self._e

    def energy_of(self, a: int) -> float:
        """E(a) of one deployment, kWh: ``float(energy[a])`` without computing the array."""
        if self._e is not None:
            return float(self._e[a])
        ctx = self._ctx
        if ctx._hits:
            for b, e_b in self._hit_energy():
                if b == a:
                    return e_b
        return float(ctx.batch.energy_uncached[ctx.row, a % ctx._block])

    @property
    def carbon(self) -> np.ndarray:
        if self._c is None:
            ctx = self._ctx
            if self._e is not None:
                self._c = np.multiply(ctx.ci, self._e, out=self._carbon)
            else:  # CI·E from the nothing-cached energy, patched where it differs
                c = self._carbon
                np.multiply(ctx._ci_b, ctx.batch.energy_uncached[ctx.row], out=self._views[4])
                if ctx._hits:
                    ci = ctx.ci
                    for a, e_a in self._hit_energy():
                        c[a] = ci[a] * e_a
                self._c = c
        return self._c

    @property
    def carbon_base(self) -> np.ndarray:
        if self._cb is None:
            ctx = self._ctx
            np.multiply(ctx._ci_b, ctx.batch.energy_base[ctx.row], out=self._views[5])
            self._cb = self._carbon_base
        return self._cb

    @property
    def miss(self) -> np.ndarray:
        if self._m is None:
            ctx, miss = self._ctx, self._miss
            np.take(ctx.n_hist_m, ctx.deployments.model, out=miss)
            for a, _, m, _ in ctx._hits:
                miss[a] = m
            self._m = miss
        return self._m

    @property
    def ttft(self) -> np.ndarray:
        if self._t is None:
            ctx, t = self._ctx, self._ttft
            np.take(ctx.n_new_m, ctx.deployments.model, out=t)  # N_new
            np.add(t, self.miss, out=t)  # + N_hist − L: the uncached tokens
            self._t = cost.prefill_s(t, ctx.deployments.v_pre)
        return self._t

    def argmin(self, values: np.ndarray) -> int:
        """Index of the smallest of ``values`` over the candidate set (first one on ties), or
        −1 if the set is empty. ``values`` must not hold +inf at candidates."""
        buf, mask = self._buf, self.mask
        buf.fill(_INF)
        _copyto(buf, values, where=mask)
        a = buf.argmin()
        return int(a) if mask[a] else -1

    def argmin_in(self, values: np.ndarray, start: int, stop: int) -> int:
        """As :meth:`argmin`, restricted to the index range [start, stop) (a region's block)."""
        buf, mask = self._buf, self.mask
        buf.fill(_INF)
        _copyto(buf, values, where=mask)
        a = start + int(buf[start:stop].argmin())
        return a if mask[a] else -1


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
        none meets the rest, the set is empty (``rejected``). The cost arrays are computed on
        first access (:class:`Candidates`).
    """
    cfg = _DEFAULT_CONSTRAINTS if config is None else config
    c = Candidates(ctx.n) if out is None else out
    batch, row = ctx.batch, ctx.row
    if cfg is batch.config:  # the usual case, spelled out: the batch's precomputed rows
        ok_row, fast_row = batch.ok[row], batch.fast[row]
    else:
        ok_row, fast_row = batch.checks(row, cfg)
    c._bind(ctx, ok_row)
    avail, mask = ctx.available, c.mask
    np.logical_and(fast_row, avail, out=mask)
    if ctx._hits:
        # Where part of the history is cached the TTFT is shorter than the batch's: recheck it
        # (uncached tokens N_new + (N_hist − L), as Candidates.ttft).
        v_pre, d_max = ctx._v_pre, cfg.d_ttft_s
        for a, _, miss, new in ctx._hits:
            if ok_row[a] and avail[a]:
                mask[a] = _prefill_s(new + miss, v_pre[a]) <= d_max
    c.rejected = False
    c.best_effort = False
    if not _count_nonzero(mask):
        ok = c.ok
        if not _count_nonzero(ok):
            c.rejected = True
        else:
            # Best-effort (§6a.2): the ok deployments with the shortest estimated TTFT.
            buf = c._buf
            buf.fill(np.inf)
            np.copyto(buf, c.ttft, where=ok)
            np.equal(buf, buf[buf.argmin()], out=mask)
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
        raise NotImplementedError(f"{type(self).__name__} does not implement choose(ctx, cand)")

    def on_session_start(self, ctx: QueryContext) -> None:
        """Called once at the session's first turn (k = 0), before feasibility and the decision,
        whether or not that turn is then served."""

    def on_served(self, ctx: QueryContext, a: int) -> None:
        """Called after the query was dispatched on deployment ``a``."""

    def on_session_end(self, session: int) -> None:
        """Called when the session leaves (its last turn completed or was rejected)."""

    #: Whether :meth:`switch_opportunity` reports switch opportunities (the simulator asks only
    #: then; the records' ``switch_opportunity`` and ``gate_blocked`` columns stay False otherwise).
    reports_opportunities: bool = False

    def switch_opportunity(self) -> int:
        """After :meth:`choose`: the deployment the policy's proposal preferred if that decision
        was a switch opportunity (the session's previous deployment b was a candidate with a
        cache and the proposal g ≠ b), else −1. The replay records the opportunity, and a
        blocked switch when the policy then stayed on b."""
        return -1

    def unready(self) -> str | None:
        """None when the policy can route; otherwise what must be built first, in words (the
        replay refuses an unready policy: :func:`carbonrouter_lib.build.build_policy` builds
        it)."""
        return None

    #: Whether :meth:`released` may name caches to drop (the simulator asks only then).
    releases_caches: bool = False

    def released(self, ctx: QueryContext, a: int) -> tuple[int, ...]:
        """Deployments whose cache of this session the backend should drop once the query is
        dispatched on ``a`` (a hint a backend may honour; default none). Only read when
        :attr:`releases_caches` is True."""
        return ()

    def params(self) -> dict:
        """The policy's parameters (JSON-friendly), recorded with results."""
        return {}

    def compiled(self, info) -> dict | None:
        """The policy's rule for the compiled replay loop (:func:`carbonrouter_lib.kernel.rule`)
        given what it may need of the replay (:class:`carbonrouter_lib.kernel.ReplayInfo`), or
        None (default): the Python loop replays it. Only the built-in policies have one, and
        only their own class (a subclass may change ``choose``)."""
        return None

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"
