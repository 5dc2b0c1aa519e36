"""The clairvoyant bound: a per-session offline optimum with hindsight (docs/model.md §11).

The paper gives no bound on how far an online router is from the best possible routing. This
module computes, for every session, the least carbon any routing can reach in our simulator,
under relaxations that make it a *lower bound* on the realized carbon of every policy (online or
not) — the session's future turns, think times, outputs and carbon intensity are all known.

The relaxed model (each relaxation can only lower the carbon a path is charged):

1. **Capacity** is unlimited: every deployment is available, nothing is evicted or expires, no KV
   overflow. Caches only shrink in the simulator, so a deployment's cached prefix is at most the
   context after the last turn served there.
2. **TTFT** is not constrained: the candidates of turn k are the deployments whose model passes
   the quality threshold and whose context window fits the query (GPU-independent), a superset of
   every policy's candidate set (§5: available ∧ quality ∧ context ∧ TTFT, or its best-effort
   subset). A turn without such a deployment is rejected by every policy (carbon 0) and here too.
3. **Time**: the intensity of a region for turn k is its *minimum* over every dispatch time a
   policy can produce: from ``arrival + Σ think`` (zero service times) to that plus the longest
   possible service of every earlier turn (full recomputation on the slowest feasible deployment
   plus the realized decode).
4. **GPUs**: within a (region, model), a GPU whose three energy coefficients are all at least
   another's is dropped (merging its turns onto the better GPU of the same region and model keeps
   every cache at least as long and every energy at most as large); with the analytical profiles
   this keeps the H100 of each (region, model).
5. **Caches of deployments other than the previous one**: a deployment served before is charged
   as if it held the longest post-turn context of turns 0 … k − 2 (the most it can hold when it
   did not serve turn k − 1), of which turn k reuses at most its history N_hist, as the replay
   does (min(cached, N_hist)); one never served holds nothing (exact). Where contexts grow turn by
   turn (ShareGPT) that is the context up to turn k − 2; a Mooncake turn may keep less of the
   previous context than that turn's whole context, and then turn k can reuse more of an older
   cache than turn k − 1's history. Which deployments were served is tracked exactly
   when a session has at most ``max_tracked`` candidate deployments; otherwise a deployment counts
   as served before once its region *and* its model have each been served (by any deployment) —
   a necessary condition, so more optimistic, still a bound, with a state of 2^(regions + models).
   With ``returns=False`` such a deployment holds nothing (only the previous turn's may hold a
   cache): a bound on every routing that drops the cache a session leaves behind, not on every
   routing (docs/model.md §11.1).

Dynamic programming over states (previous deployment, set of served deployments or regions)
finds the optimal path of the relaxed model exactly (tested against brute force); the realized
output lengths are used, as the simulator does. The bound is valid for every replay in which no
query was rejected for lack of capacity (the relaxation gives those queries a deployment; the
comparisons in the notebooks leave such sessions out and count them).

Units: gCO2e, kWh, tokens, seconds.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from numba import njit
from scipy import sparse

from carbonrouter_lib import cache, cost, prepared
from carbonrouter_lib.carbon import CarbonSignal
from carbonrouter_lib.deployments import Deployments
from carbonrouter_lib.policies import QueryBatch
from carbonrouter_lib.setting import SimulationConfig

__all__ = ["bound_candidates", "bound_comparison", "capacity_priced_bound",
           "capacity_rejected_sessions", "clairvoyant_bound", "ensure_bound",
           "ensure_priced_bound", "return_credit", "session_bound_dp"]

def bound_candidates(deps: Deployments) -> np.ndarray:
    """Deployment indices kept by relaxation 4: per (region, model), the GPUs not dominated by
    another GPU of the same region and model in all of e_in, e_cache, e_out (equal profiles: the
    first in index order)."""
    e = np.stack([deps.e_in, deps.e_cache, deps.e_out], axis=1)
    keep = []
    for a in range(deps.n):
        same = np.flatnonzero((deps.region == deps.region[a]) & (deps.model == deps.model[a]))
        dominated = False
        for b in same:
            if b == a:
                continue
            le, lt = np.all(e[b] <= e[a]), np.any(e[b] < e[a])
            if (le and lt) or (le and np.all(e[b] == e[a]) and b < a):
                dominated = True
                break
        if not dominated:
            keep.append(a)
    return np.asarray(keep, dtype=np.int64)


@njit(cache=True)
def _dp(c_none, c_rev, c_full, feasible, flags, n_sets):
    """The DP of :func:`session_bound_dp`, compiled: returns (total, path). States are (the
    previous deployment, or n for none; the set of flags served); per turn and candidate j the
    best previous state for each set (first minimum: lowest previous index), then per target
    set the smallest value (ties: the smallest source set), kept where it improves.

    The best previous state of candidate j in set st is the better of staying (dp[j, st] plus
    j's cost with its cache) and the best other previous state (plus the cost without it). The
    latter is the first minimum of dp[:, st] over p ≠ j: the first or, where that is j, the
    second of the two smallest, found once per turn and set. That makes a turn O(n·sets), not
    O(n²·sets), with the same minima and ties (same-cost ties: the lowest index)."""
    k_turns, n = feasible.shape
    dp = np.full((n + 1, n_sets), np.inf)
    dp[n, 0] = 0.0
    new = np.empty_like(dp)
    back_p = np.zeros((k_turns, n + 1, n_sets), np.int32)
    back_s = np.zeros((k_turns, n + 1, n_sets), np.int32)
    served = np.zeros(k_turns, np.bool_)
    v_best = np.empty(n_sets)
    p_best = np.empty(n_sets, np.int64)
    t_val = np.empty(n_sets)
    t_src = np.empty(n_sets, np.int64)
    m1 = np.empty(n_sets)
    m2 = np.empty(n_sets)
    i1 = np.empty(n_sets, np.int64)
    i2 = np.empty(n_sets, np.int64)
    for k in range(k_turns):
        if not feasible[k].any():
            continue
        served[k] = True
        # the two smallest previous values per set, each the first in index order (an index
        # of −1: none finite)
        for st in range(n_sets):
            a1, b1, a2, b2 = np.inf, -1, np.inf, -1
            for p in range(n + 1):
                v = dp[p, st]
                if v < a1:
                    a2, b2 = a1, b1
                    a1, b1 = v, p
                elif v < a2:
                    a2, b2 = v, p
            m1[st], i1[st], m2[st], i2[st] = a1, b1, a2, b2
        new[:] = np.inf
        for j in range(n):
            if not feasible[k, j]:
                continue
            bit = flags[j]
            for st in range(n_sets):
                c = c_rev[k, j] if (st & bit) == bit else c_none[k, j]
                if i1[st] != j:
                    vo, po = m1[st], i1[st]
                else:
                    vo, po = m2[st], i2[st]
                bv, bp = np.inf, 0
                if po >= 0 and vo + c < bv:
                    bv, bp = vo + c, po
                vs = dp[j, st] + c_full[k, j]
                if vs < bv or (vs == bv and j < bp):
                    bv, bp = vs, j
                v_best[st], p_best[st] = bv, bp
            t_src[:] = -1
            for st in range(n_sets):
                tg = st | bit
                if t_src[tg] == -1 or v_best[st] < t_val[tg]:
                    t_val[tg], t_src[tg] = v_best[st], st
            for tg in range(n_sets):
                src = t_src[tg]
                if src != -1 and t_val[tg] < new[j, tg]:
                    new[j, tg] = t_val[tg]
                    back_p[k, j, tg] = p_best[src]
                    back_s[k, j, tg] = src
        dp, new = new, dp
    path = np.full(k_turns, -1, np.int64)
    if not served.any():
        return 0.0, path
    flat = np.argmin(dp)
    p, st = flat // n_sets, flat % n_sets
    total = dp[p, st]
    for k in range(k_turns - 1, -1, -1):
        if not served[k]:
            continue
        path[k] = p
        p, st = back_p[k, p, st], back_s[k, p, st]
    return total, path


def session_bound_dp(
    c_none: np.ndarray, c_rev: np.ndarray, c_full: np.ndarray, feasible: np.ndarray,
    flags: np.ndarray,
) -> tuple[float, np.ndarray, np.ndarray]:
    """Exact minimum of the relaxed model over one session's paths.

    Parameters
    ----------
    c_none, c_rev, c_full : (K, n) float
        Carbon of turn k on candidate j when j was never served before, when it was (but not at
        k − 1), and when it served turn k − 1, gCO2e.
    feasible : (K, n) bool
        Candidates of each turn; a turn with none is skipped (rejected by every policy).
    flags : (n,) int
        Bit mask of each candidate over the tracked flags: serving j sets its bits, and j counts
        as served before when all its bits are set (one bit per candidate: exact tracking; a
        region bit and a model bit: the necessary condition of the module docstring).

    Returns
    -------
    (total, path, kind)
        Minimum total carbon; the chosen candidate per turn (−1 where skipped) and which cost
        applied (0: never served before, 1: served before, 2: served turn k − 1; −1 skipped).
    """
    feasible = np.ascontiguousarray(feasible, dtype=np.bool_)
    flags = np.ascontiguousarray(flags, dtype=np.int64)
    k_turns, n = feasible.shape
    n_bits = int(flags.max()).bit_length() if n else 0
    total, path = _dp(np.ascontiguousarray(c_none, np.float64),
                      np.ascontiguousarray(c_rev, np.float64),
                      np.ascontiguousarray(c_full, np.float64), feasible, flags, 1 << n_bits)
    kind = np.full(k_turns, -1)
    if not (path >= 0).any():
        return 0.0, path, kind
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


def return_credit(new: np.ndarray, hist: np.ndarray, out: np.ndarray,
                  turn: np.ndarray) -> np.ndarray:
    """Relaxation 5's credit, tokens per row and model (the arrays of a prepared workload, rows
    grouped by session in turn order): the most a turn k can reuse of a cache the session left at
    turn k − 2 or before, min(max_{j ≤ k−2} (N_hist + N_new + N_out)_j, N_hist(k)); 0 at turns 0
    and 1. The replay reuses min(cached, N_hist), and a cache holds at most the post-turn context
    of the last turn served there. Contexts need not grow: a Mooncake turn may keep less of the
    previous context than that turn's whole context, so this can exceed N_hist(k − 1)."""
    context = pd.DataFrame(hist + new + out)
    longest = context.groupby(np.cumsum(turn == 0)).cummax().to_numpy()
    later = (turn >= 2)[:, None]
    return np.where(later, np.minimum(np.roll(longest, 2, axis=0), hist), 0.0)


def _check_grouped(table: pd.DataFrame) -> np.ndarray:
    """The rows where ``table``'s sessions start (int64); a ValueError unless its rows are
    grouped by session and it starts with a session's turn 0."""
    if not np.all(np.diff(table["session"].to_numpy(np.int64)) >= 0):
        raise ValueError("clairvoyant_bound: table rows must be grouped by session")
    starts = np.flatnonzero(table["turn"].to_numpy(np.int64) == 0)
    if starts.size == 0 or starts[0] != 0:
        raise ValueError("clairvoyant_bound: the table must start with a session's turn 0")
    return starts


def _bound_inputs(table: pd.DataFrame, config: SimulationConfig, signal: CarbonSignal,
                  shortest: bool = False) -> dict[str, np.ndarray | float]:
    """What the bound's session loop reads: tokens per model (new, hist, out, the return credit
    :func:`return_credit`), the feasible deployments of each query (quality ∧ context window, no
    TTFT), think times, each query's longest possible service (s), the window [``lo``, ``hi``]
    of its dispatch times (s, :func:`_dispatch_windows`), the sessions' row ranges, the signal's
    grid and end; with ``shortest`` also ``gap``, the least time (s) from each query's dispatch
    to its session's next one: the next think time plus the query's shortest possible service
    (its history cached on the fastest feasible deployment; 0 if rejected), 0 at a last turn."""
    deps = config.deployments()
    new = prepared.model_matrix(table, "new_tokens").astype(np.float64)
    hist = prepared.model_matrix(table, "history_tokens").astype(np.float64)
    out = prepared.model_matrix(table, "output_tokens").astype(np.float64)
    est = prepared.model_matrix(table, "est_output_tokens").astype(np.float64)
    qual = prepared.model_matrix(table, "quality").astype(np.float64)
    feasible = QueryBatch(deps, new, hist, est, qual, config.constraints()).ok
    session = table["session"].to_numpy(np.int64)
    turn = table["turn"].to_numpy(np.int64)
    starts = _check_grouped(table)
    # Longest possible service of each query on any feasible deployment: full recomputation
    # (TTFT with nothing cached) plus the realized decode (s); 0 if rejected.
    m_of = deps.model
    serve = cost.service_time_s(new[:, m_of], hist[:, m_of], 0.0, out[:, m_of], deps.v_pre,
                                deps.v_dec)
    grid = signal.frame.to_numpy(np.float64)
    think = table["think_s"].to_numpy(np.float64)
    max_service = np.where(feasible, serve, 0.0).max(axis=1)
    starts = starts.astype(np.int64)
    ends = np.append(starts[1:], len(table))
    lo, hi = np.empty(len(table)), np.empty(len(table))
    _dispatch_windows(starts, ends, table["arrival_s"].to_numpy(np.float64), think,
                      max_service, lo, hi)
    x = {"new": new, "hist": hist, "out": out, "credit": return_credit(new, hist, out, turn),
         "feasible": feasible, "think": think, "max_service": max_service, "lo": lo, "hi": hi,
         "starts": starts, "ends": ends,
         "grid": grid, "end_s": signal.row_interval(len(grid) - 1)[1]}
    if shortest:
        fast = cost.service_time_s(new[:, m_of], hist[:, m_of], hist[:, m_of], out[:, m_of],
                                   deps.v_pre, deps.v_dec)
        fast = np.where(feasible, fast, np.inf).min(axis=1)
        last = np.r_[session[1:] != session[:-1], True]
        x["gap"] = np.where(last, 0.0, np.r_[think[1:], 0.0]
                            + np.where(np.isfinite(fast), fast, 0.0))
    return x


def _session_parts(table: pd.DataFrame, part_rows: int) -> list[tuple[int, int]]:
    """Row ranges [r0, r1) of ``table`` (checked: :func:`_check_grouped`) of whole sessions,
    each of at most ``part_rows`` rows or a single longer session."""
    first = _check_grouped(table)
    ends = np.append(first[1:], len(table))
    parts, lo = [], 0
    while lo < len(first):
        hi = lo + 1
        while hi < len(first) and ends[hi] - first[lo] <= part_rows:
            hi += 1
        parts.append((int(first[lo]), int(ends[hi - 1])))
        lo = hi
    return parts


def clairvoyant_bound(
    table: pd.DataFrame,
    config: SimulationConfig | None = None,
    signal: CarbonSignal | None = None,
    max_tracked: int = 8,
    progress: bool = False,
    price: np.ndarray | None = None,
    hold: np.ndarray | None = None,
    kv_pool: np.ndarray | None = None,
    ttl_s: float = math.inf,
    returns: bool = True,
    part_rows: int = 2_000_000,
    _inputs: dict | None = None,
) -> pd.DataFrame:
    """The clairvoyant bound of every session of a prepared workload (module docstring).

    Parameters
    ----------
    table
        Prepared workload (rows grouped by session, turns in order).
    config
        :class:`~carbonrouter_lib.setting.SimulationConfig` (regions, carbon year, β_Q, κ, γ).
    signal
        Carbon signal (default: from ``config``).
    max_tracked
        Sessions with at most this many candidate deployments (with prices: (region, model)
        pairs) track "served before" per deployment (per pair), others per region and model.
    progress
        tqdm bar over sessions.
    price, hold, kv_pool, ttl_s
        What :func:`capacity_priced_bound` puts back into the relaxed model (None, None, None,
        inf: nothing, the plain bound). ``price`` (rows, slot pools): gCO2e added to the cost of
        serving each row in each (region, GPU) pool; ``hold`` (rows, KV pools): gCO2e per token
        of a reused cache for having kept it in its KV pool (``kv_pool`` of each deployment)
        during the previous row's interval (a row may recompute instead). With them, every
        deployment is a candidate, not only the dominant GPU of each (region, model), and the
        previous turn's cache is reused only where it was written; a return goes to a
        deployment whose (region, model) was served before ("served before" is tracked per
        (region, model), a necessary condition; the previous turn's counts, so a move to
        another GPU of its (region, model) is credited as a return, with the context up to
        turn k − 2). ``ttl_s``: no cache survives a longer think time. The ``carbon_g``
        written is the path's carbon without the prices; with prices the table also has
        ``held_tokens``, the cache each row reused, and ``returned``, whether that cache was
        one the session left before the previous turn.
    returns
        False: a deployment the session left holds nothing when the session comes back
        (relaxation 5 off: only the previous turn's deployment may hold a cache). Not a bound on
        every routing — a policy may return to a cache that survived — but on every routing
        that drops the cache a session leaves behind (the horizon router with ``release=True``),
        and the measure of how much of the plain bound's saving needs a second cache per session
        kept across a hop.
    part_rows
        The inputs (several arrays per query and deployment) are built and the bound run for
        parts of whole sessions of at most this many rows (a longer session is a part of its
        own): every session's bound is its own, so the result is the same to the bit, in the
        memory of a part (ShareGPT's 8.3M queries at 136 copies, built whole, ran a 24-GiB
        machine out of memory). Not with ``_inputs``, which are the whole table's.
    _inputs
        :func:`_bound_inputs` of the same table, config and signal, computed once by a caller
        that evaluates the bound many times (:func:`capacity_priced_bound`).

    Returns
    -------
    pandas.DataFrame
        One row per query: ``session``, ``turn``, ``n_turns``, the bound's ``deployment`` (−1:
        no feasible deployment, rejected by every policy), its relaxed ``carbon_g`` (gCO2e) and
        ``energy_kwh``, ``ci_min`` (the window-minimum intensity used) and ``tracking``
        ("deployment" or "region+model").
        ``carbon_g.sum()`` per session is the session's bound.
    """
    config = config or SimulationConfig()
    signal = config.signal(signal)
    deps = config.deployments()
    n = len(table)
    if (price is None) != (hold is None) or (hold is not None) != (kv_pool is not None):
        raise ValueError("clairvoyant_bound: price, hold and kv_pool go together")
    if isinstance(part_rows, bool) or not isinstance(part_rows, int) or part_rows < 1:
        raise ValueError(f"clairvoyant_bound: part_rows must be an integer ≥ 1, got {part_rows!r}")
    if price is None:  # relaxation 4: the dominant GPU of each (region, model)
        cand = bound_candidates(deps)
        slot_col = kv_col = np.zeros(len(cand), np.int64)
        price = hold = np.zeros((n, 1))
        track = np.arange(len(cand), dtype=np.int64)  # "served before" per deployment
    else:  # every deployment, its cache its own: the replay's (region, GPU) pools are priced
        cand = np.arange(deps.n, dtype=np.int64)
        slot_col = (deps.region * len(deps.gpus) + deps.gpu)[cand].astype(np.int64)
        kv_col = np.asarray(kv_pool, np.int64)[cand]
        # "served before" per (region, model): every GPU of one shares its bit (a deployment
        # served implies its (region, model) served, and the state does not grow with the
        # GPUs). The previous turn's bit is in the state too, so a move to another GPU of the
        # previous turn's (region, model) gets the return credit (context up to turn k − 2):
        # valid, and looser than the replay; a state bit for "the previous turn's (region,
        # model) was served before it" would remove that
        track = (deps.region * len(deps.models) + deps.model).astype(np.int64)
    # the outputs, written part by part
    dep = np.empty(n, np.int64)
    carbon, energy, ci_min = np.empty(n), np.empty(n), np.empty(n)
    coarse = np.zeros(n, np.bool_)  # "region+model" tracking
    held = np.zeros(n)
    ret = np.zeros(n, np.bool_)
    span_lo, span_hi = signal._span_s
    price, hold = np.ascontiguousarray(price), np.ascontiguousarray(hold)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=int((table["turn"].to_numpy() == 0).sum()), desc="clairvoyant bound",
                   unit="session")
    for r0, r1 in [(0, n)] if _inputs is not None else _session_parts(table, part_rows):
        x = _inputs if _inputs is not None else _bound_inputs(table.iloc[r0:r1], config, signal)
        rows = slice(r0, r1)  # the part's rows: the loop's row indices are the part's
        fixed = (x["lo"], x["hi"], x["think"], signal._t_s, float(span_lo),
                 float(span_hi), float(x["end_s"]), x["grid"],
                 np.ascontiguousarray(x["feasible"]), cand, deps.region[cand].astype(np.int64),
                 deps.model[cand].astype(np.int64), slot_col, kv_col,
                 deps.e_in[cand].astype(np.float64), deps.e_cache[cand].astype(np.float64),
                 deps.e_out[cand].astype(np.float64), x["new"], x["hist"], x["out"],
                 x["credit"], track, max_tracked, price[rows], hold[rows], float(ttl_s),
                 bool(returns), dep[rows], carbon[rows], energy[rows], ci_min[rows],
                 coarse[rows], held[rows], ret[rows])
        starts, ends = x["starts"], x["ends"]
        # in chunks of sessions: the progress bar moves, and a time the signal does not cover
        # is reported by the signal's own error
        step = 20_000
        for c0 in range(0, len(starts), step):
            c1 = min(c0 + step, len(starts))
            bad = _bound_sessions(starts[c0:c1], ends[c0:c1], *fixed)
            if not np.isnan(bad):
                signal.row_index(bad)  # raises, naming the time and the coverage
            if bar is not None:
                bar.update(c1 - c0)
    if bar is not None:
        bar.close()
    session = table["session"].to_numpy(np.int64)
    turn = table["turn"].to_numpy(np.int64)
    n_turns = table["n_turns"].to_numpy(np.int64)
    out = pd.DataFrame({"session": session, "turn": turn, "n_turns": n_turns,
                        "deployment": dep, "carbon_g": carbon, "energy_kwh": energy,
                        "ci_min": ci_min,
                        "tracking": np.where(coarse, "region+model", "deployment")})
    if kv_pool is not None:  # the cache each row reused: what it kept held, tokens
        out["held_tokens"] = held
        out["returned"] = ret
    return out


@njit(cache=True)
def _bound_sessions(starts, ends, lo_all, hi_all, think, sig_t, span_lo, span_hi, end_s,
                    grid, feasible_all, cand, region_c, model_c, slot_c, kv_c, ec_in,
                    ec_cache, ec_out, new, hist, out, credit, track, max_tracked, price, hold,
                    ttl_s, returns, dep, carbon, energy, ci_min, coarse, held, ret):
    """The bound of the sessions [starts[q], ends[q]) (the loop of :func:`clairvoyant_bound`,
    compiled): writes each row's deployment, carbon, energy, intensity, tracking and the tokens
    of cache it reused (``held``) and whether that was a return's (``ret``); returns NaN, or the
    first time (s) the signal does not cover. The prices of :func:`capacity_priced_bound` (zeros
    and ``ttl_s`` = inf: the plain bound) enter the DP's costs but not the carbon written:
    ``price`` (rows, slot pools) is added to the cost of serving a row in a pool, ``hold``
    (rows, KV pools) × the tokens reused is the price of having kept that cache in its pool
    during the previous row's interval (a return: also the interval before, the previous row's
    ``hold``; a row may recompute instead), and no cache survives a think time above ``ttl_s``
    (a return's: the two think times since turn k − 2's completion); without ``returns`` a
    deployment other than the previous turn's holds no cache.

    Candidate c is deployment ``cand[c]``, with its energy coefficients ``ec_*``, its slot pool
    ``slot_c`` (the column of ``price``) and its KV pool ``kv_c`` (the column of ``hold``);
    ``track[c]`` is the key of its "served before" bit (candidates sharing a key share it)."""
    n_rows = len(grid)
    n_regions = grid.shape[1]
    n_c = len(cand)
    for q in range(len(starts)):
        i0, i1 = starts[q], ends[q]
        k_turns = i1 - i0
        # the minimum intensity per region over each turn's window of dispatch times
        ci_w = np.empty((k_turns, n_regions))
        for k in range(k_turns):
            lo, hi = lo_all[i0 + k], hi_all[i0 + k]
            if not span_lo <= lo < span_hi:
                return lo
            r_lo = np.searchsorted(sig_t, lo, side="right") - 1
            if hi < end_s:
                if not span_lo <= hi < span_hi:
                    return hi
                r_hi = np.searchsorted(sig_t, hi, side="right") - 1
            else:
                r_hi = n_rows - 1
            for g in range(n_regions):
                v = grid[r_lo, g]
                for row in range(r_lo + 1, r_hi + 1):
                    if grid[row, g] < v:
                        v = grid[row, g]
                ci_w[k, g] = v
        # the candidates some turn can use
        used = np.empty(n_c, np.int64)
        n_u = 0
        for c in range(n_c):
            for k in range(k_turns):
                if feasible_all[i0 + k, cand[c]]:
                    used[n_u] = c
                    n_u += 1
                    break
        if n_u == 0:  # no turn has a feasible deployment: every policy rejects them all
            for k in range(k_turns):
                i = i0 + k
                dep[i], carbon[i], energy[i], ci_min[i], coarse[i] = -1, 0.0, 0.0, math.nan, False
            continue
        used = used[:n_u]
        feas = np.empty((k_turns, n_u), np.bool_)
        e_none = np.empty((k_turns, n_u))
        e_rev = np.empty((k_turns, n_u))
        e_full = np.empty((k_turns, n_u))
        c_none = np.empty((k_turns, n_u))
        c_rev = np.empty((k_turns, n_u))
        c_full = np.empty((k_turns, n_u))
        ci = np.empty((k_turns, n_u))
        miss_full = np.zeros((k_turns, n_u), np.bool_)
        miss_rev = np.zeros((k_turns, n_u), np.bool_)
        for k in range(k_turns):
            i = i0 + k
            expired = k > 0 and think[i] > ttl_s  # every cache expired during the think time
            # a cache left at turn k − 2 or before has been idle at least the two think times
            expired_r = k > 1 and think[i] + think[i - 1] > ttl_s
            for u in range(n_u):
                c = used[u]
                m = model_c[c]
                feas[k, u] = feasible_all[i, cand[c]]
                n_new, n_hist, n_out = new[i, m], hist[i, m], out[i, m]
                # what a return reuses at most, when c served before but not at k − 1
                h_prev = credit[i, m]
                ci[k, u] = ci_w[k, region_c[c]]
                # Each way of serving the turn (with the prices: the slot and, for a reused
                # cache, its tokens held during the previous row's interval).
                ei, ec, eo = ec_in[c], ec_cache[c], ec_out[c]
                e_none[k, u] = ei * (n_new + n_hist) + eo * n_out
                e_rev[k, u] = ei * (n_new + n_hist - h_prev) + ec * h_prev + eo * n_out
                e_full[k, u] = ei * n_new + ec * n_hist + eo * n_out
                pr = price[i, slot_c[c]]
                mu = hold[i, kv_c[c]]
                # a return's cache was held since turn k − 2 at the latest: the interval
                # before the previous one too
                mu_r = mu + hold[i - 1, kv_c[c]] if k > 1 else mu
                b_none = ci[k, u] * e_none[k, u] + pr
                b_rev = ci[k, u] * e_rev[k, u] + pr + mu_r * h_prev
                b_full = ci[k, u] * e_full[k, u] + pr + mu * n_hist
                c_none[k, u] = b_none
                # recomputing instead of reusing is always possible (and forced after the TTL);
                # cost is linear in the tokens reused, so the best is one of the two ends
                if expired or b_full > b_none:
                    c_full[k, u] = b_none
                    miss_full[k, u] = True
                else:
                    c_full[k, u] = b_full
                if expired_r or not returns or b_rev > b_none:
                    c_rev[k, u] = b_none
                    miss_rev[k, u] = True
                else:
                    c_rev[k, u] = b_rev
        flags = np.empty(n_u, np.int64)
        keys = np.unique(track[used])
        is_coarse = len(keys) > max_tracked
        if not is_coarse:  # a bit per tracked key (per candidate in the plain bound)
            for u in range(n_u):
                flags[u] = 1 << np.searchsorted(keys, track[used[u]])
        else:  # a region bit and a model bit (ranks among the values present)
            r_vals = np.unique(region_c[used])
            m_vals = np.unique(model_c[used])
            n_r = len(r_vals)
            for u in range(n_u):
                r_bit = np.searchsorted(r_vals, region_c[used[u]])
                m_bit = np.searchsorted(m_vals, model_c[used[u]])
                flags[u] = (1 << r_bit) | (1 << (n_r + m_bit))
        n_bits = 0
        top = flags.max()
        while top > 0:
            n_bits += 1
            top >>= 1
        _, path = _dp(c_none, c_rev, c_full, feas, flags, 1 << n_bits)
        seen = 0
        prev = -1
        for k in range(k_turns):
            i = i0 + k
            coarse[i] = is_coarse
            u = path[k]
            held[i] = 0.0
            ret[i] = False
            if u < 0:
                dep[i], carbon[i], energy[i], ci_min[i] = -1, 0.0, 0.0, math.nan
                continue
            bit = flags[u]
            m = model_c[used[u]]
            if u == prev and not miss_full[k, u]:
                e = e_full[k, u]
                held[i] = hist[i, m]
            elif seen & bit == bit and u != prev and not miss_rev[k, u]:
                e = e_rev[k, u]
                held[i] = credit[i, m]
                ret[i] = held[i] > 0  # a return to a cache, not to a deployment holding none
            else:
                e = e_none[k, u]
            seen |= bit
            prev = u
            dep[i], energy[i], ci_min[i] = cand[used[u]], e, ci[k, u]
            carbon[i] = ci[k, u] * e
    return math.nan


# ---------------------------------------------------------------------------------------------
# The bound with capacity priced (a Lagrangian relaxation of the slot and KV-memory limits)
# ---------------------------------------------------------------------------------------------

@njit(cache=True)
def _dispatch_windows(starts, ends, arrival, think, max_service, lo, hi):
    """Per row, the window [lo_k, hi_k] of the dispatch times any policy can give turn k
    (relaxation 3): from ``arrival + Σ think`` (zero service times) to that plus the longest
    possible service of every earlier turn, s."""
    for q in range(len(starts)):
        i0, i1 = starts[q], ends[q]
        cum_think, cum_serve = 0.0, 0.0
        for k in range(i1 - i0):
            if k > 0:
                cum_think += think[i0 + k]
                cum_serve += max_service[i0 + k - 1]
            lo[i0 + k] = arrival[i0] + cum_think
            hi[i0 + k] = lo[i0 + k] + cum_serve


@njit(cache=True)
def _holding_weights(lo, hi, gap, origin, width, n_b, count_only, indptr, idx, w):
    """The least overlap, s, of a row's holding [d_k, d_{k+1}) with each bucket
    [origin + b·width, … + width) over every d_k ∈ [lo_k, hi_k] and d_{k+1} ≥ d_k + gap_k.

    A longer interval overlaps at least as much, so d_{k+1} = d_k + gap_k; the overlap of this
    sliding window with a fixed bucket first rises, then falls in d_k, so its least value is at
    d_k = lo_k or hi_k: min(|[lo_k, lo_k + gap) ∩ b|, |[hi_k, hi_k + gap) ∩ b|) per bucket
    (bucket by bucket, not one d_k for all). Nonzero only where both windows meet the bucket.
    With ``count_only`` fills ``indptr[i + 1]`` with row i's number of buckets; else writes the
    buckets and weights of a CSR matrix whose ``indptr`` is the cumulative count."""
    for i in range(len(lo)):
        g = gap[i]
        if count_only:
            indptr[i + 1] = 0
        if not g > 0.0:
            continue
        a0, a1 = (lo[i] - origin) / width, (lo[i] + g - origin) / width
        c0, c1 = (hi[i] - origin) / width, (hi[i] + g - origin) / width
        b0 = max(int(math.floor(c0)), 0)
        b1 = min(int(math.ceil(a1)) - 1, n_b - 1)
        pos = indptr[i]
        for b in range(b0, b1 + 1):
            x = min(min(a1, b + 1.0) - max(a0, float(b)), min(c1, b + 1.0) - max(c0, float(b)))
            if x <= 0.0:
                continue
            if count_only:
                indptr[i + 1] += 1
            else:
                idx[pos] = b
                w[pos] = x * width
                pos += 1


def _holding(x: dict, bucket_s: float):
    """The buckets of :func:`capacity_priced_bound` over the dispatch windows of ``x``
    (:func:`_bound_inputs` with ``shortest``): the (rows, buckets) sparse matrix W of
    :func:`_holding_weights` (s), the first bucket's start (s) and each bucket's width (s; the
    last ends where the last holding can)."""
    lo, hi, gap = x["lo"], x["hi"], x["gap"]
    origin = float(lo.min())
    end = float((hi + gap).max())
    n_b = max(1, math.ceil((end - origin) / bucket_s))
    width = np.full(n_b, bucket_s)
    width[-1] = max(end - origin - (n_b - 1) * bucket_s, 1e-9)
    return _holding_matrix(lo, hi, gap, origin, bucket_s, n_b), origin, width


def _holding_matrix(lo: np.ndarray, hi: np.ndarray, gap: np.ndarray, origin: float,
                    width: float, n_b: int) -> sparse.csr_matrix:
    """(rows, buckets) sparse matrix of :func:`_holding_weights`, s."""
    n = len(lo)
    indptr = np.zeros(n + 1, np.int64)
    none_i, none_f = np.zeros(0, np.int64), np.zeros(0)
    _holding_weights(lo, hi, gap, origin, width, n_b, True, indptr, none_i, none_f)
    indptr = np.cumsum(indptr)
    idx, w = np.empty(indptr[-1], np.int64), np.empty(indptr[-1])
    _holding_weights(lo, hi, gap, origin, width, n_b, False, indptr, idx, w)
    return sparse.csr_matrix((w, idx, indptr), shape=(n, n_b))


def _kv_pools(deps: Deployments, backend) -> tuple[np.ndarray, np.ndarray]:
    """The KV pool of each deployment and each pool's memory, tokens, as the backend has them:
    the (region, GPU) pools (the paper's rule) or one per deployment (the hardware rule, in its
    own model's tokens)."""
    if backend.kv_tokens_per_deployment is not None:
        return (np.arange(deps.n, dtype=np.int64),
                np.floor(np.asarray(backend.kv_tokens_per_deployment, np.float64)))
    pool = (deps.region * len(deps.gpus) + deps.gpu).astype(np.int64)
    return pool, np.full(deps.n_pools, float(math.floor(backend.kv_tokens_per_pool)))


def capacity_priced_bound(
    table: pd.DataFrame,
    config: SimulationConfig | None = None,
    signal: CarbonSignal | None = None,
    backend=None,
    *,
    upper_g: float,
    iterations: int = 24,
    bucket_s: float = 3600.0,
    max_tracked: int = 8,
    progress: bool = False,
) -> dict:
    """The clairvoyant bound with the replay's capacity and TTL put back: slots and KV memory
    by Lagrangian relaxation, the TTL exactly.

    The plain bound (:func:`clairvoyant_bound`) lets every session use the best GPU of the
    cleanest region at every instant and keep every cache forever. In the replay (a
    ``backend`` of :class:`~carbonrouter_lib.backend.BackendConfig`; default the setting's),
    whatever the policy:

    - a session holds its slot in the (region, GPU) pool p of turn k from turn k's dispatch
      d_k to turn k + 1's, and a pool has S slots. d_k lies in [lo_k, hi_k] (relaxation 3) and
      d_{k+1} − d_k is at least g_k, the next think time plus turn k's shortest service, so in
      each bucket of time b the holding lasts at least w_{k,b} = min(|[lo_k, lo_k + g_k) ∩ b|,
      |[hi_k, hi_k + g_k) ∩ b|) (:func:`_holding_weights`; until 2026-12-06 only the part
      common to every holding, [hi_k, lo_{k+1}), was charged, empty where hi_k ≥ lo_{k+1});
    - a turn k that reuses a cache on a deployment — the previous turn's (its post-turn
      context, the history H_k of turn k) or an earlier one's (relaxation 5) — found it held
      in that deployment's KV pool q from d_{k−1} on (a turn reserves its post-turn context at
      dispatch), a return from d_{k−2} on too (it was written at turn k − 2 or before), so for
      at least w_{k−1,b} (and w_{k−2,b}) in bucket b; a pool holds M_q tokens
      (:func:`_kv_pools`: the (region, GPU) pools, or each deployment under the hardware
      rule);
    - no cache survives a think time above the TTL (a turn is sent a think time after the
      previous completion; exact, not a relaxation), and a return's cache not the two think
      times since turn k − 2's completion (it has been idle at least that long).

    Summed over buckets of time b, every capacity-feasible routing x has slot occupancy
    occ_{p,b}(x) ≤ S·|b| and memory use mem_{q,b}(x) ≤ M_q·|b|. For prices λ, μ ≥ 0,

        L(λ, μ) = Σ_s min_path [C_s(path) + Σ_k Σ_b w_{k,b} λ_{p(k),b} / S
                                + Σ_k L_k Σ_b w_{k−1,b} μ_{q(k),b} / M_q
                                + Σ_{k a return} L_k Σ_b w_{k−2,b} μ_{q(k),b} / M_q]
                  − Σ_{p,b} λ_{p,b}·|b| − Σ_{q,b} μ_{q,b}·|b|

    (L_k the cache tokens turn k reuses) is at most the carbon of every such x: x's path with
    its reuse is in the DP, whose candidates are every deployment (the previous turn's cache is
    reused on the deployment that wrote it, as in the replay; until 2026-12-06 every GPU of a
    (region, model) shared its cache status, a looser relaxation) and which may reuse the
    largest cache the relaxed model allows, or none (carbon plus price is linear in the tokens
    reused, so one of the two is at most x's); its bracket is at
    most x's carbon plus its priced use, and the use is within the capacity (weak duality; the
    other relaxations of the module docstring stay). With zero prices and an infinite TTL it
    is the plain bound. Projected subgradient ascent on (λ, μ) — the constraints normalized by
    capacity, Polyak steps towards ``upper_g``, halved after two iterations without progress —
    keeps the largest L seen; every iterate is a valid bound. It applies to a replay in which
    no query was rejected for lack of capacity.

    Parameters
    ----------
    table, config, signal, max_tracked
        As :func:`clairvoyant_bound`.
    backend
        The replay's capacity (slots per pool, KV memory, TTL); default
        :func:`~carbonrouter_lib.setting.backend_config` of the table and setting.
    upper_g
        The carbon of some capacity-feasible routing, gCO2e (e.g. the best policy's replay): the
        target of the step sizes (the bound stays below it whatever it is).
    iterations
        Evaluations of L after L(0, 0).
    bucket_s
        Width of the price buckets, s. A narrower bucket is a tighter constraint but is charged
        less of each holding; the defaults (24 iterations, 3,600 s) were chosen from the ascent
        at the tuned setting (``docs/evidence/priced_convergence.py``, docs/model.md §11.1).

    Returns
    -------
    dict
        ``bound_g`` (the largest L, gCO2e), ``plain_g`` (the plain bound), ``ttl_g`` (L(0, 0):
        with the TTL only), ``history`` (DataFrame: iteration, bound_g, slot_excess and
        kv_excess — the share of the path's slot and memory use above capacity — and step),
        ``slot_prices`` and ``kv_prices`` (pools × buckets, the best λ, μ, per unit of
        normalized use and second), ``origin_s``, ``bucket_s``, ``slots`` (S per slot pool),
        ``kv_tokens`` (M per KV pool), ``records`` (the paths at the best prices, as
        :func:`clairvoyant_bound` returns them, with ``held_tokens`` and ``price_g``: what each
        row paid).
    """
    from carbonrouter_lib.setting import backend_config

    config = config or SimulationConfig()
    signal = config.signal(signal)
    deps = config.deployments()
    if backend is None:
        backend = backend_config(table, config)
    if iterations < 0 or not bucket_s > 0:
        raise ValueError(f"capacity_priced_bound: iterations must be ≥ 0 and bucket_s > 0, got "
                         f"{iterations}, {bucket_s}")
    x = _bound_inputs(table, config, signal, shortest=True)
    n = len(table)
    # W[k, b]: the least time turn k's session holds its slot (and the cache turn k + 1
    # reuses) within bucket b, whatever the policy
    w, origin, width = _holding(x, bucket_s)
    n_b = len(width)
    first = table["turn"].to_numpy() == 0
    rows = np.arange(n)
    slot_pool = (deps.region * len(deps.gpus) + deps.gpu).astype(np.int64)
    slots = np.full(deps.n_pools, float(backend.slots_per_pool))
    kv_pool, kv = _kv_pools(deps, backend)
    slot_of = np.append(slot_pool, -1)
    kv_of = np.append(kv_pool, -1)

    def use(pool, weight, shift, n_pools):
        """(pools, buckets): Σ over rows i of weight[i]·W[i − shift] in row i's pool."""
        m = (pool >= 0) & (weight != 0) & (rows >= shift)
        z = sparse.csr_matrix((weight[m], (pool[m], rows[m] - shift)), shape=(n_pools, n))
        return (z @ w).toarray()

    def evaluate(lam: np.ndarray, mu: np.ndarray):
        price = np.ascontiguousarray(w @ (lam / slots[:, None]).T)
        # the previous row's holding prices the cache a row reuses (zero at a first turn)
        hold = np.ascontiguousarray(np.where(first[:, None], 0.0,
                                             np.roll(w @ (mu / kv[:, None]).T, 1, axis=0)))
        rec = clairvoyant_bound(table, config, signal, max_tracked=max_tracked, price=price,
                                hold=hold, kv_pool=kv_pool, ttl_s=backend.ttl_s, _inputs=x)
        a = rec["deployment"].to_numpy()
        sp, kp = slot_of[a], kv_of[a]
        h = rec["held_tokens"].to_numpy()
        back = rec["returned"].to_numpy()
        paid = np.where(a >= 0, price[rows, np.maximum(sp, 0)]
                        + hold[rows, np.maximum(kp, 0)] * h, 0.0)
        paid += np.where(back, hold[np.maximum(rows - 1, 0), np.maximum(kp, 0)] * h, 0.0)
        occ = use(sp, np.ones(n), 0, len(slots))
        mem = use(kp, h, 1, len(kv)) + use(kp, np.where(back, h, 0.0), 2, len(kv))
        value = float(rec["carbon_g"].sum() + paid.sum() - (lam * width).sum()
                      - (mu * width).sum())
        # normalized use minus capacity, per bucket: (use / capacity − 1)·|b|
        g = (occ / slots[:, None] - width, mem / kv[:, None] - width)
        return value, g, rec.assign(price_g=paid)

    lam = np.zeros((len(slots), n_b))
    mu = np.zeros((len(kv), n_b))
    value, g, rec = evaluate(lam, mu)
    plain = float(clairvoyant_bound(table, config, signal, max_tracked=max_tracked,
                                    _inputs=x)["carbon_g"].sum())
    with_ttl = value
    upper = float(upper_g)
    best = (value, lam.copy(), mu.copy(), rec)
    # every iterate is a lower bound (weak duality), so the bound is their largest; the step
    # halves after two iterates without a relative gain of 1e-9 over ``ref``, the last that had one
    theta, stale, ref = 1.0, 0, value
    history = []
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=iterations, desc="capacity-priced bound", unit="iteration")
    for it in range(iterations + 1):
        g_slot, g_kv = g
        excess = [float(np.maximum(gg, 0.0).sum() / max((gg + width).sum(), 1e-12))
                  for gg in g]
        norm = float((g_slot ** 2).sum() + (g_kv ** 2).sum())
        step = theta * max(upper - value, 0.0) / norm if norm > 0 else 0.0
        history.append({"iteration": it, "bound_g": value, "slot_excess": excess[0],
                        "kv_excess": excess[1], "step": step})
        if it == iterations or step == 0.0:
            break
        lam = np.maximum(lam + step * g_slot, 0.0)
        mu = np.maximum(mu + step * g_kv, 0.0)
        value, g, rec = evaluate(lam, mu)
        if value > best[0]:
            best = (value, lam.copy(), mu.copy(), rec)
        if value > ref * (1 + 1e-9):
            ref, stale = value, 0
        else:
            stale += 1
            if stale >= 2:
                theta, stale = theta / 2, 0
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return {"bound_g": best[0], "plain_g": plain, "ttl_g": with_ttl,
            "history": pd.DataFrame(history), "slot_prices": best[1], "kv_prices": best[2],
            "origin_s": origin, "bucket_s": float(bucket_s), "slots": slots, "kv_tokens": kv,
            "records": best[3]}


# ---------------------------------------------------------------------------------------------
# Cached bounds and comparisons with the policies
# ---------------------------------------------------------------------------------------------

def ensure_bound(workload_config: prepared.WorkloadConfig, simulation_config: SimulationConfig,
                 cache_dir: str | os.PathLike | None = None, progress: bool = False,
                 returns: bool = True) -> pd.DataFrame:
    """:func:`clairvoyant_bound` of a setting (``returns``: its argument), cached as parquet
    (default ``derived_dir()/bounds``, keyed by the workload, the setting and the code:
    :mod:`carbonrouter_lib.cache`)."""
    from carbonrouter_lib.datasets import derived_dir

    params = {"workload": workload_config.key(), "simulation": simulation_config.to_dict()}
    if not returns:
        params["returns"] = False
    entry = cache.entry("bound", params, "carbonrouter_lib.bound",
                        folder=cache_dir or derived_dir() / "bounds")
    if (hit := entry.load()) is not None:
        return hit[0]
    table = prepared.prepare_workload(workload_config)
    return entry.save(clairvoyant_bound(table, simulation_config, progress=progress,
                                        returns=returns))


def ensure_priced_bound(workload_config: prepared.WorkloadConfig,
                        simulation_config: SimulationConfig, upper_g: float,
                        iterations: int = 24, bucket_s: float = 3600.0,
                        cache_dir: str | os.PathLike | None = None) -> dict:
    """:func:`capacity_priced_bound` of a setting (its replay's capacity), cached (default
    ``derived_dir()/bounds``, keyed by the workload, the setting, the arguments and the code):
    ``bound_g``, ``plain_g``, ``ttl_g`` (gCO2e) and ``history`` (DataFrame), without the
    per-query paths."""
    from carbonrouter_lib.datasets import derived_dir

    params = {"workload": workload_config.key(), "simulation": simulation_config.to_dict(),
              "upper_g": float(upper_g), "iterations": int(iterations),
              "bucket_s": float(bucket_s)}
    entry = cache.entry("priced_bound", params, "carbonrouter_lib.bound",
                        folder=cache_dir or derived_dir() / "bounds", fmt="json")
    if (hit := entry.load()) is None:
        table = prepared.prepare_workload(workload_config)
        pb = capacity_priced_bound(table, simulation_config, upper_g=upper_g,
                                   iterations=iterations, bucket_s=bucket_s)
        doc = {k: pb[k] for k in ("bound_g", "plain_g", "ttl_g")}
        doc["history"] = pb["history"].to_dict(orient="list")
        hit = (entry.save(doc), None)
    doc = dict(hit[0])
    doc["history"] = pd.DataFrame(doc["history"])
    return doc


def capacity_rejected_sessions(records: pd.DataFrame, bound: pd.DataFrame) -> np.ndarray:
    """Sessions in which ``records`` rejected a query that the bound serves (rejected for lack of
    capacity, which the bound relaxes): the bound does not apply to them."""
    merged = records[["session", "turn", "rejected"]].merge(
        bound[["session", "turn", "deployment"]], on=["session", "turn"], validate="one_to_one")
    bad = merged["rejected"].to_numpy() & (merged["deployment"].to_numpy() >= 0)
    return np.unique(merged.loc[bad, "session"].to_numpy())


def share_of_possible_saving(reference: float, policy: float, bound: float) -> float:
    """(reference − policy) / (reference − bound): the share of the saving the bound says is
    possible over the reference that the policy captures (the three in one unit, e.g. kg CO2);
    NaN when the bound is not below the reference."""
    return (reference - policy) / (reference - bound) if reference > bound else math.nan


def bound_comparison(
    records: Mapping[str, pd.DataFrame], bound: pd.DataFrame,
    reference: str = "session-affinity", thresholds: Sequence[int] = (),
) -> pd.DataFrame:
    """Each policy's carbon beside the bound, on the sessions where the bound applies to every
    policy given (none rejected a query for lack of capacity), overall and per session-length
    group (``> t`` turns for each threshold).

    Columns: ``group``, ``policy``, ``co2_kg``, ``co2_rel`` (to ``reference``), ``bound_rel``
    (the bound over the reference), ``share_of_possible_saving`` = (reference − policy) /
    (reference − bound), ``gap_to_bound_pct`` = 100·(policy / bound − 1), ``n_sessions`` and
    ``n_sessions_excluded``.
    """
    if reference not in records:
        raise KeyError(f"bound_comparison: no records for the reference {reference!r}")
    excluded = set()
    for rec in records.values():
        excluded.update(capacity_rejected_sessions(rec, bound).tolist())
    n_turns = bound.groupby("session")["n_turns"].first()
    b_s = bound.groupby("session")["carbon_g"].sum()
    per = {p: r.groupby("session")["carbon_g"].sum().reindex(b_s.index, fill_value=0.0)
           for p, r in records.items()}
    rows = []
    for label, t in [("all", 0), *[(f"> {t}", t) for t in thresholds]]:
        keep = (n_turns > t) & ~n_turns.index.isin(list(excluded))
        ref, lo = per[reference][keep].sum(), b_s[keep].sum()
        for p, s in per.items():
            c = s[keep].sum()
            rows.append({"group": label, "policy": p, "co2_kg": c / 1e3,
                         "co2_rel": c / ref if ref > 0 else np.nan,
                         "bound_rel": lo / ref if ref > 0 else np.nan,
                         "share_of_possible_saving": share_of_possible_saving(ref, c, lo),
                         "gap_to_bound_pct": 100 * (c / lo - 1) if lo > 0 else np.nan,
                         "n_sessions": int(keep.sum()),
                         "n_sessions_excluded": int(((n_turns > t)
                                                     & n_turns.index.isin(list(excluded))).sum())})
    return pd.DataFrame(rows)
