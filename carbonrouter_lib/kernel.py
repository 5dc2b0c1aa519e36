"""The replay loop compiled with Numba, for the built-in policies (docs/model.md §4–§7).

:func:`carbonrouter_lib.simulator.simulate` replays a workload event by event: Python objects for
the backend (:class:`~carbonrouter_lib.backend.Backend`), the context and candidates
(:mod:`carbonrouter_lib.policies.base`) and the policy's ``choose``. That path is the
*reference*: any policy, any hook, decision timing. This module is the same loop — the event
order, the backend's slots, KV pools, eviction, expiry and overflow, the feasibility step of Eq. 7
and the decision rules of Session-Affinity, Carbon-Affinity, GAR†, FairCarbon, CarbonRouter
(with or without pricing; no gate, the learned XGBoost gate as arrays, the oracle gate, or the
two-branch labelling that trains the learned gate: :func:`_branch`) and the horizon router
(its forecasts precomputed per grid row and fold; its price of the future, :func:`horizon_future`,
is the one its Python ``choose`` calls) — written over arrays
and compiled, one call per replay. ``simulate`` uses it for those policies (``engine="auto"``)
and the Python loop for everything else. The horizon router's ``choose`` in the Python loop (and
the live router) is itself one compiled call, :func:`horizon_decide`, the loop's decision
sequence on a :class:`HorizonState` of the run's arrays.

Equivalence, not approximation: every quantity is computed with the same IEEE-754 operations in
the same order as the reference (Numba compiles without fast-math, so nothing is reassociated or
fused), every tie is broken the same way, and the caches' eviction order is the backend's
(departed sessions' caches first; least recently used first; exact ties by session id, then
deployment index). ``tests/test_kernel.py`` checks that both engines give identical records and
backend counters for every supported policy, under the shared and the per-deployment KV rules,
with tight memory (eviction and overflow), a short TTL (expiry), rejections and best-effort
queries.

The backend's state, as arrays: a cache is a record (tokens, last use, pinned, version) reached
from ``rec_of[session, deployment]`` (sessions numbered 0, 1, … in id order, so the numbering
keeps the order of ids). The LRU order of each KV pool's live caches and the expiry order are
doubly linked lists of entries (appended at completion, with the backend's rule for exact ties),
the departed sessions' caches a binary heap per KV pool; stale entries are skipped lazily, as the
backend does.
"""

from __future__ import annotations

import math
import platform
from collections import namedtuple
from dataclasses import dataclass
from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.experimental import structref
from numba.extending import intrinsic
from numba.typed import List

__all__ = ["CODES", "COUNTERS", "GATE_KINDS", "TIMES_DECISIONS", "TINY", "ReplayInfo", "cycles",
           "HORIZON_STATE_FIELDS", "HorizonState", "horizon_decide", "new_horizon_state",
           "horizon_future", "kv_evicted", "kv_prices", "observe_room", "running_mean",
           "slot_prices", "replay", "rule"]

#: Policy codes of the compiled decision rules.
CODES = {"session-affinity": 0, "carbon-affinity": 1, "faircarbon": 2, "gar": 3,
         "carbonrouter": 4, "carbonrouter-horizon": 5}
#: CarbonRouter's gates the loop computes itself (``g_kind``; the learned gate's trees are arrays).
GATE_KINDS = {"learned": 0, "oracle": 1, "labels": 2}
#: Backend counters, in the order :func:`replay` returns them (Backend.counters()'s keys).
COUNTERS = ("evicted_tokens", "evicted_caches", "expired_tokens", "expired_caches",
            "kv_overflow_events", "kv_overflow_tokens", "dispatches", "released_caches",
            "released_tokens")
_HOUR_S = 3600.0
#: Scratch of a two-branch label (_branch): the session's view at its next turn.
_Branch = namedtuple("_Branch",
                     "free tok f has ci cached avail hit_a hit_miss hit_new mask value eb eu")
#: The options of the helpers the loop calls per event or decision, none of which allocates:
#: compiled without Numba's reference counting (its ``_nrt=False``, which Numba's own
#: allocation-free helpers use, e.g. numba.misc.mergesort). With it, every call takes and drops a
#: reference to each array argument, two atomic operations per array: a large part of a call of
#: the horizon router's price of the future, which takes 21 arrays. The arrays belong to the
#: caller, which outlives the call.
_LEAF = {"cache": True, "_nrt": False}
#: The least normal float64. The horizon router's running averages (each KV pool's chance that a
#: new cache evicts another, what a session finds of the cache it left, how often it stays,
#: each pool's displacement) are set to 0 where an update leaves them below it. An average of
#: zeros decays geometrically into subnormal numbers, and x86 CPUs compute with those in
#: microcode, ~100 cycles an operation: the pools that never fill held subnormal chances for
#: most of a replay, and every decision computed with them. Where they enter the
#: prices, 1 − φ, the averages' updates and the sums the router compares, a subnormal is
#: absorbed exactly, so no decision changes (tests/test_horizon.py).
TINY = float(np.finfo(np.float64).tiny)
#: Whether the compiled loop can time its decisions here (the x86-64 time-stamp counter).
TIMES_DECISIONS = platform.machine().lower() in ("x86_64", "amd64")


# ---------------------------------------------------------------------------------------------
# decision timing: the CPU's time-stamp counter (x86-64: invariant, a few ns to read)
# ---------------------------------------------------------------------------------------------

@intrinsic
def _rdtsc(typingctx):
    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.IntType(64), [])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.readcyclecounter")
        return builder.call(fn, [])
    return types.int64(), codegen


@njit(cache=True)
def cycles() -> int:
    """The time-stamp counter, cycles (to calibrate the decision timings against a clock)."""
    return _rdtsc()


# ---------------------------------------------------------------------------------------------
# event heap: (time, key) pairs, lexicographic
# ---------------------------------------------------------------------------------------------

@njit(**_LEAF, inline="always")
def _less(t1, k1, t2, k2):
    return t1 < t2 or (t1 == t2 and k1 < k2)


@njit(**_LEAF, inline="always")
def _normal(x):
    """x ≥ 0, or 0 where it is below :data:`TINY` (subnormal)."""
    return x if x >= TINY else 0.0


@njit(**_LEAF, inline="always")
def running_mean(x, target, s):
    """The horizon router's running average x ≥ 0 moved a share ``s`` towards ``target``,
    x + s·(target − x), and set to 0 where that leaves it subnormal (:data:`TINY`); both replay
    loops update their averages through it."""
    return _normal(x + s * (target - x))


@njit(**_LEAF)
def observe_room(phi, cap, used, need, s):
    """The horizon router's φ per KV pool, the chance a new cache there evicts another
    (:func:`running_mean` of whether a context of ``need`` tokens would not fit in the pool's
    free memory, ``cap`` − ``used`` tokens), updated in place."""
    for p in range(len(phi)):
        full = 1.0 if cap[p] - used[p] < need else 0.0
        phi[p] = running_mean(phi[p], full, s)


@njit(**_LEAF)
def _hpush(ht, hk, size, t, k):
    i = size
    while i > 0:
        parent = (i - 1) >> 1
        if _less(t, k, ht[parent], hk[parent]):
            ht[i], hk[i] = ht[parent], hk[parent]
            i = parent
        else:
            break
    ht[i], hk[i] = t, k
    return size + 1


@njit(**_LEAF)
def _hpop(ht, hk, size):
    """Remove the smallest (it is at index 0); returns the new size."""
    size -= 1
    t, k = ht[size], hk[size]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= size:
            break
        if c + 1 < size and _less(ht[c + 1], hk[c + 1], ht[c], hk[c]):
            c += 1
        if _less(ht[c], hk[c], t, k):
            ht[i], hk[i] = ht[c], hk[c]
            i = c
        else:
            break
    if size > 0:
        ht[i], hk[i] = t, k
    return size


# ---------------------------------------------------------------------------------------------
# cache-entry order: (f_last, session, deployment, version)
# ---------------------------------------------------------------------------------------------

@njit(**_LEAF, inline="always")
def _key_gt3(ef, es, ea, i, f, s, a):
    """Entry i's (f_last, session, deployment) > (f, s, a)."""
    if ef[i] != f:
        return ef[i] > f
    if es[i] != s:
        return es[i] > s
    return ea[i] > a


@njit(**_LEAF)
def _append_sorted(head, tail, nxt, prv, q, e, ef, es, ea):
    """Append entry e to list q (heads/tails per list), after the last entry whose (f_last,
    session, deployment) is ≤ e's (completions come in time order: only exact ties in f_last
    walk back) — the backend's ``_append_sorted``."""
    f, s, a = ef[e], es[e], ea[e]
    cur = tail[q]
    while cur != -1 and _key_gt3(ef, es, ea, cur, f, s, a):
        cur = prv[cur]
    if cur == -1:  # at the head
        nxt[e] = head[q]
        prv[e] = -1
        if head[q] != -1:
            prv[head[q]] = e
        else:
            tail[q] = e
        head[q] = e
    else:
        nxt[e] = nxt[cur]
        prv[e] = cur
        if nxt[cur] != -1:
            prv[nxt[cur]] = e
        else:
            tail[q] = e
        nxt[cur] = e


@njit(**_LEAF)
def _popleft(head, tail, nxt, prv, q):
    e = head[q]
    h = nxt[e]
    head[q] = h
    if h == -1:
        tail[q] = -1
    else:
        prv[h] = -1


@njit(**_LEAF, inline="always")
def _dlt(df, ds, da, dv, i, j):
    """Departed entry i < entry j in (f_last, session, deployment, version)."""
    if df[i] != df[j]:
        return df[i] < df[j]
    if ds[i] != ds[j]:
        return ds[i] < ds[j]
    if da[i] != da[j]:
        return da[i] < da[j]
    return dv[i] < dv[j]


@njit(**_LEAF)
def _dpush(heap, size, e, df, ds, da, dv):
    i = size
    while i > 0:
        parent = (i - 1) >> 1
        if _dlt(df, ds, da, dv, e, heap[parent]):
            heap[i] = heap[parent]
            i = parent
        else:
            break
    heap[i] = e
    return size + 1


@njit(**_LEAF)
def _dpop(heap, size, df, ds, da, dv):
    size -= 1
    e = heap[size]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= size:
            break
        if c + 1 < size and _dlt(df, ds, da, dv, heap[c + 1], heap[c]):
            c += 1
        if _dlt(df, ds, da, dv, heap[c], e):
            heap[i] = heap[c]
            i = c
        else:
            break
    if size > 0:
        heap[i] = e
    return size


# ---------------------------------------------------------------------------------------------
# the learned gate's trees
# ---------------------------------------------------------------------------------------------

@njit(**_LEAF)
def _forest(f, z, left, right, feature, threshold, default_left, tree_start, n_trees, depth,
            base):
    """The fold-f forest's prediction for z (float64 features): gate._Forest.predict's
    arithmetic — float32 features and thresholds, ``x < t`` left, NaN the default direction,
    leaves summed in float32 in tree order onto the base score."""
    acc = base[f]
    for t in range(n_trees[f]):
        node = tree_start[f, t]
        for _ in range(depth[f]):
            v = np.float32(z[feature[f, node]])
            if np.isnan(v):
                go_left = default_left[f, node]
            else:
                go_left = v < threshold[f, node]
            node = left[f, node] if go_left else right[f, node]
        acc = np.float32(acc + threshold[f, node])
    return float(acc)


# ---------------------------------------------------------------------------------------------
# the horizon router's price of the rest of the session (policies/horizon.py)
# ---------------------------------------------------------------------------------------------

@njit(**_LEAF)
def _alpha(b, m, e_in, e_out, new_m, out_m, post_m):
    """α_b of :func:`horizon_future`: the carbon per unit intensity of a future turn j = 0 of
    model ``m`` recomputed on block ``b``, gCO2e per gCO2e/kWh (its history H_0 and new tokens
    prefilled, n̄_out decoded); a turn j costs α_b + j·β_b, β_b = e_in·(n̄_new + n̄_out)."""
    return e_in[b] * (new_m[m] + post_m[m]) + e_out[b] * out_m[m]


@njit(**_LEAF)
def _beta(b, m, e_in, new_m, out_m):
    """β_b of :func:`horizon_future`: how much a future turn's recomputation on block ``b``
    grows per turn, per unit intensity (the history grows by n̄_new + n̄_out a turn)."""
    return e_in[b] * (new_m[m] + out_m[m])


@njit(**_LEAF)
def _stay_line(b, m, d, alpha_b, beta_b, e_in, e_cache, e_out, new_m, out_m, post_m, keep,
               kv_pool, cache_survival):
    """(a0, a1) of :func:`horizon_future`: future turn j on deployment ``d`` (block ``b``,
    model ``m``) with its cache kept costs a0 + j·a1 per unit intensity — its recomputation
    (α_b, β_b) less the cached history's saving, weighted by p, the chance the cache survives
    (its KV pool's ``keep``); without ``cache_survival`` the cache always survives."""
    if cache_survival:
        de = keep[kv_pool[d]] * (e_in[b] - e_cache[b])
        return alpha_b - de * post_m[m], beta_b - de * (new_m[m] + out_m[m])
    return (e_in[b] * new_m[m] + e_out[b] * out_m[m] + e_cache[b] * post_m[m],
            e_cache[b] * (new_m[m] + out_m[m]))


@njit(**_LEAF)
def horizon_future(future, miss, work, surv, rho, fc, fc_lo, fc_arg, post_m, new_m, out_m,
                   stay_m, e_in, e_cache, e_out, region, model, kv_pool, keep, n_models,
                   cache_survival, model_stickiness, fallback, eligible, phi, use_fallback,
                   option, mask, dom, stay_j=None, exit_j=None, ret_dep=None, ret_len=None,
                   ret_keep=None):
    """The expected carbon of the session's future turns on each deployment, gCO2e, written to
    ``future`` (n,) (``miss``: scratch (n,); ``work``: scratch of :func:`horizon_work_size`, so
    that a decision allocates nothing); the sum of :mod:`carbonrouter_lib.policies.horizon`.
    ``surv`` (J,): S_k(j); ``rho``: the chance a future turn is still on the chosen deployment,
    per turn; ``fc`` (regions, J): the forecast, with ``fc_lo`` and ``fc_arg`` (J,) its least
    intensity per turn and that region (:func:`forecast_minima`); ``post_m``, ``new_m``,
    ``out_m``, ``stay_m`` per model: H_0, n̄_new, n̄_out, q_m; ``keep`` per KV pool: p.
    ``fallback`` (models, models): where a session goes when its model turns infeasible (rows
    sum to 1, zero diagonal), used with ``use_fallback`` (else the cheapest recomputing
    deployment of any other model); ``eligible`` (models,): the models a later turn can need;
    ``phi`` per KV pool: the chance a cache placed there evicts another; ``option``: price each
    future turn at the cheaper of committing and moving (weighted by 1 − phi of the move's
    pool). Without ``use_fallback`` and ``option`` the sum runs in its closed form (the former
    router's operations, to the bit); with either, turn by turn, for the candidates (``mask``)
    only (0 elsewhere), the deployments numbered region-major with the same energies in every
    region (:meth:`carbonrouter_lib.deployments.Deployments.build`'s); one future turn (J = 1,
    the default) with the option, no told models and no return exit has a path of its own
    without the set-up for J turns, the same values to the bit. Shared by the Python
    policy and the compiled loop, so both compute the same values (the sums over j run in
    order). ``stay_j`` (models, J) and ``exit_j`` (J,) are a reference's, told the models of the
    session's future turns (:func:`told_models`): turn j's q_m is ``stay_j[m, j]`` and, where
    ``exit_j[j]`` ≥ 0, its exit the least recomputing deployment of model ``exit_j[j]``. None for
    every online router: Numba compiles a version without the told branches (it prunes ``is
    None`` tests of arguments), so they cost the online router nothing. ``ret_dep`` and
    ``ret_len`` (models,) are the *return exit*'s (``HorizonRouter(exit="return")``, with
    ``use_fallback``; :func:`return_targets`): per model m′ the deployment holding the session's
    longest cache of m′ (−1: none) and its length, tokens; ``ret_keep`` per KV pool: p_left,
    the share of a cache *left behind* that survives a think time (:func:`observe_left`). An
    exit to m′ at turn j may then return there, its cache surviving the j + 1 think times with
    chance p_left^(j+1) (its KV pool's): the exit's term for m′ is E_j −
    p_left^(j+1)·max(E_j − R_j, 0), E_j the least recomputing
    turn of m′ (as without it) and R_j the return's carbon, the cached tokens at e_cache and the
    rest recomputed, at the forecast of the cache's region."""
    n_r, n_j = fc.shape
    a_r, b_r = work[:n_r], work[n_r:2 * n_r]
    best = work[2 * n_r:2 * n_r + n_models]
    move = work[2 * n_r + n_models:2 * n_r + 2 * n_models]
    nd = len(future)
    per_turn = use_fallback or option
    if stay_j is not None:
        per_turn = True
    if per_turn and n_j == 1 and stay_j is None and ret_dep is None and option and (
            use_fallback or not model_stickiness):
        # one future turn (J = 1): the sum below at j = 0, without its setup for J turns (each
        # value is the same expression, so the same to the bit; a j·x term is kept as 0.0·x)
        block = nd // n_r
        ex_m = work[:n_models]  # each model's exit (∞: none)
        best = work[n_models:2 * n_models]
        move = work[2 * n_models:3 * n_models]
        lines = True
        for m in range(n_models):
            lines = lines and dom[m] >= 0
        if lines:
            # each model's least block's α (best) and β (move); the option's move: the least
            # eligible α, the first on ties
            e0, m0 = np.inf, -1
            for m in range(n_models):
                b = dom[m]
                best[m] = _alpha(b, m, e_in, e_out, new_m, out_m, post_m)
                move[m] = _beta(b, m, e_in, new_m, out_m)
                if eligible[m] and best[m] < e0:
                    e0, m0 = best[m], m
            if m0 >= 0:
                b0 = dom[m0]
                w_lo = fc_lo[0] * (best[m0] + 0.0 * move[m0])
                w_free = 1.0 - phi[kv_pool[fc_arg[0] * block + b0]]
                w_s = surv[0] * 1.0
                if model_stickiness:
                    for m in range(n_models):
                        ea, eb, ws = 0.0, 0.0, 0.0
                        for m2 in range(n_models):
                            w = fallback[m, m2]
                            if m2 != m and w > 0.0:
                                ea += w * best[m2]
                                eb += w * move[m2]
                                ws += w
                        if ws > 0.0:
                            ea, eb = ea / ws, eb / ws
                        else:
                            ea, eb = np.inf, 0.0
                        ex_m[m] = fc_lo[0] * (ea + 0.0 * eb)
                for d in range(nd):
                    if not mask[d]:
                        future[d] = 0.0
                        continue
                    r = region[d]
                    b = d - r * block
                    m = model[b]
                    a0, a1 = _stay_line(b, m, d, _alpha(b, m, e_in, e_out, new_m, out_m, post_m),
                                        _beta(b, m, e_in, new_m, out_m), e_in, e_cache, e_out,
                                        new_m, out_m, post_m, keep, kv_pool, cache_survival)
                    q = stay_m[m]
                    ex = 0.0
                    if model_stickiness and ex_m[m] < np.inf:
                        ex = ex_m[m]
                    else:
                        q = 1.0
                    v = fc[r, 0] * (a0 + 0.0 * a1)
                    v = q * v + (1 - q) * ex
                    future[d] = 0.0 + w_s * (v - w_free * max(v - w_lo, 0.0))
                return
    if per_turn:
        # turn by turn: the option's min and the fallback's mixture do not sum in closed form.
        # Deployments are numbered region-major with the same (GPU, model) block of energies in
        # every region (Deployments.build), so turn j on a deployment costs its region's
        # forecast times its block's energy α_b + j·β_b (the history grows by n̄_new + n̄_out a
        # turn), and a model's least over the deployments is the least forecast times its
        # least block energy (intensities are ≥ 0). ``dom``: each model's block of least e_in
        # and least e_out, least at every turn (−1 where no block is both; then every turn
        # searches the blocks). First the turns' minima, then each candidate's sum over them.
        block = nd // n_r
        last = n_j - 1
        o = 0
        alpha, o = work[o:o + block], o + block
        beta, o = work[o:o + block], o + block
        w_s, o = work[o:o + n_j], o + n_j  # S_k(j)·ρ^j
        w_lo, o = work[o:o + n_j], o + n_j  # the move's carbon (∞: no option)
        w_free, o = work[o:o + n_j], o + n_j  # the chance its pool has room
        w_ex, o = work[o:o + n_models * n_j], o + n_models * n_j  # the exit, per model
        need, o = work[o:o + n_models], o + n_models  # the candidates' models
        ex_a, o = work[o:o + n_models], o + n_models  # the exit's energy: ex_a + j·ex_b
        ex_b, o = work[o:o + n_models], o + n_models
        best, o = work[o:o + n_models], o + n_models  # each model's least energy at turn j
        vv, o = work[o:o + n_j], o + n_j  # a candidate's terms (first the return exit's scratch)
        zero = work[o:o + n_j]
        zero[:] = 0.0
        need[:] = 0.0
        for d in range(nd):
            future[d] = 0.0
            if mask[d]:
                need[model[d]] = 1.0
        for b in range(block):
            m = model[b]
            alpha[b] = _alpha(b, m, e_in, e_out, new_m, out_m, post_m)
            beta[b] = _beta(b, m, e_in, new_m, out_m)
        lines = True  # every model has its least block at every turn
        for m in range(n_models):
            lines = lines and dom[m] >= 0
        # the option's move: the least block of the eligible models, fixed if the same at the
        # first and the last turn
        m0 = -1
        if option and lines:
            e0, e1, m1 = np.inf, np.inf, -1
            for m in range(n_models):
                b = dom[m]
                if eligible[m]:
                    if alpha[b] < e0:
                        e0, m0 = alpha[b], b
                    if alpha[b] + last * beta[b] < e1:
                        e1, m1 = alpha[b] + last * beta[b], b
            if m0 != m1:
                m0 = -2  # it changes: search at every turn
        # the exit as a line in j where its energies are (the fallback's mixture of lines)
        linear_exit = lines and use_fallback
        if model_stickiness and linear_exit:
            for m in range(n_models):
                if need[m] == 0.0:
                    continue  # no candidate's model: its exit is never read
                ea, eb, ws = 0.0, 0.0, 0.0
                for m2 in range(n_models):
                    w = fallback[m, m2]
                    if m2 != m and w > 0.0:
                        ea += w * alpha[dom[m2]]
                        eb += w * beta[dom[m2]]
                        ws += w
                if ws > 0.0:
                    ex_a[m], ex_b[m] = ea / ws, eb / ws
                else:
                    ex_a[m], ex_b[m] = np.inf, 0.0
        rho_j = 1.0
        for j in range(n_j):
            w_s[j] = surv[j] * rho_j  # ρ^j as a running product: no pow per turn
            rho_j *= rho
        vector = lines and m0 >= 0 and (not model_stickiness or linear_exit)
        if stay_j is not None:
            vector = False  # told: the exit changes with j
        if vector:
            # the move's block is the same at every turn and the exit is a line: each turn's
            # terms in loops of their own (they vectorize; the same operations per turn)
            a_lo, b_lo = alpha[m0], beta[m0]
            for j in range(n_j):
                w_lo[j] = fc_lo[j] * (a_lo + j * b_lo)
            for j in range(n_j):
                w_free[j] = 1.0 - phi[kv_pool[fc_arg[j] * block + m0]]
            if model_stickiness:
                for m in range(n_models):
                    if need[m] == 0.0:
                        continue
                    ea, eb = ex_a[m], ex_b[m]
                    row = w_ex[m * n_j:(m + 1) * n_j]
                    for j in range(n_j):
                        row[j] = fc_lo[j] * (ea + j * eb)
        else:
            for j in range(n_j):
                c_lo, r_lo = fc_lo[j], fc_arg[j]
                b_lo = m0
                search = not lines or m0 == -2 or (model_stickiness and not linear_exit)
                if stay_j is not None:
                    search = True
                if search:
                    for m in range(n_models):
                        best[m] = np.inf
                    e_lo, b_lo2 = np.inf, -1
                    if lines:
                        for m in range(n_models):
                            b = dom[m]
                            e = alpha[b] + j * beta[b]
                            best[m] = e
                            if option and e < e_lo and eligible[m]:
                                e_lo, b_lo2 = e, b
                    else:
                        for b in range(block):
                            m = model[b]
                            e = alpha[b] + j * beta[b]
                            if e < best[m]:
                                best[m] = e
                            if option and e < e_lo and eligible[m]:
                                e_lo, b_lo2 = e, b
                    if m0 < 0:
                        b_lo = b_lo2
                if b_lo >= 0:
                    w_lo[j] = c_lo * (alpha[b_lo] + j * beta[b_lo])
                    w_free[j] = 1.0 - phi[kv_pool[r_lo * block + b_lo]]
                else:
                    w_lo[j], w_free[j] = np.inf, 0.0
                if model_stickiness:
                    for m in range(n_models):
                        if need[m] == 0.0:
                            continue
                        told_ex = -1
                        if exit_j is not None:
                            told_ex = exit_j[j]  # told: the model turn j will need
                        if told_ex >= 0 and told_ex != m and best[told_ex] < np.inf:
                            ex = best[told_ex]
                        elif linear_exit:
                            ex = ex_a[m] + j * ex_b[m]
                        else:
                            ex, ws = 0.0, 0.0
                            if use_fallback:  # a model with no deployment here takes no weight
                                for m2 in range(n_models):
                                    w = fallback[m, m2]
                                    if m2 != m and w > 0.0 and best[m2] < np.inf:
                                        ex += w * best[m2]
                                        ws += w
                            if ws > 0.0:
                                ex = ex / ws
                            else:
                                ex = np.inf
                                for m2 in range(n_models):
                                    if m2 != m and best[m2] < ex:
                                        ex = best[m2]
                        w_ex[m * n_j + j] = c_lo * ex
        if ret_dep is not None and model_stickiness and use_fallback and stay_j is None:
            _return_exit(w_ex, ret_dep, ret_len, need, fallback, alpha, beta, fc, fc_lo,
                         e_in, e_cache, region, model, kv_pool, ret_keep, cache_survival,
                         block, n_models, vv)
        for d in range(nd):
            if not mask[d]:
                continue
            r = region[d]
            b = d - r * block
            m = model[b]
            a0, a1 = _stay_line(b, m, d, alpha[b], beta[b], e_in, e_cache, e_out, new_m, out_m,
                                post_m, keep, kv_pool, cache_survival)
            q = stay_m[m]
            # the turns' terms in a loop without a branch or a carried dependence (it
            # vectorizes), then their sum in the order of j; without an exit, q = 1 and the exit
            # row is 0, so v is unchanged
            if model_stickiness and w_ex[m * n_j] < np.inf:
                ex = w_ex[m * n_j:(m + 1) * n_j]
            else:
                ex, q = zero, 1.0
            c_r = fc[r]
            told = False
            if stay_j is not None:
                told = model_stickiness
            if told:
                # turn by turn: q_m and the exit of each future turn as told (a turn whose
                # model stays feasible, or with no exit, prices staying)
                for j in range(n_j):
                    v = c_r[j] * (a0 + j * a1)
                    qj, e = stay_j[m, j], w_ex[m * n_j + j]
                    if qj < 1.0 and e < np.inf:
                        v = qj * v + (1 - qj) * e
                    vv[j] = w_s[j] * (v - w_free[j] * max(v - w_lo[j], 0.0))
            else:
                for j in range(n_j):
                    v = c_r[j] * (a0 + j * a1)
                    v = q * v + (1 - q) * ex[j]
                    vv[j] = w_s[j] * (v - w_free[j] * max(v - w_lo[j], 0.0))
            total = 0.0
            for j in range(n_j):
                total += vv[j]
            future[d] = total
        return
    a_r[:] = 0.0
    b_r[:] = 0.0
    # j outside: S_k(j)·ρ^j once per turn, not per region (the pow dominated a decision); each
    # region's sums still run in the order of j, so the values are unchanged to the bit
    for j in range(n_j):
        sj = surv[j] * rho ** j
        for r in range(n_r):
            w = fc[r, j] * sj
            a_r[r] += w
            b_r[r] += w * j
    for d in range(nd):
        m = model[d]
        a_d, b_d = a_r[region[d]], b_r[region[d]]
        n_new, n_out = new_m[m], out_m[m]
        hist_sum = post_m[m] * a_d + (n_new + n_out) * b_d
        base = (e_in[d] * n_new + e_out[d] * n_out) * a_d
        miss[d] = base + e_in[d] * hist_sum
        if cache_survival:
            future[d] = miss[d] - keep[kv_pool[d]] * (e_in[d] - e_cache[d]) * hist_sum
        else:
            future[d] = base + e_cache[d] * hist_sum
    if model_stickiness:
        # the cheapest recomputing deployment of each model, then for each model the cheapest
        # of the other models: where the session goes if its model turns infeasible
        best[:] = np.inf
        for d in range(nd):
            if miss[d] < best[model[d]]:
                best[model[d]] = miss[d]
        move[:] = np.inf
        for m in range(n_models):
            for m2 in range(n_models):
                if m2 != m and best[m2] < move[m]:
                    move[m] = best[m2]
        for d in range(nd):
            q = stay_m[model[d]]
            future[d] = q * future[d] + (1 - q) * move[model[d]]


@njit(**_LEAF)
def _return_exit(w_ex, ret_dep, ret_len, need, fallback, alpha, beta, fc, fc_lo, e_in, e_cache,
                 region, model, kv_pool, ret_keep, cache_survival, block, n_models, diff):
    """The return exit's correction of :func:`horizon_future`'s exit rows ``w_ex`` (models × J,
    gCO2e): for each fallback model m′ the session has a cache of (``ret_dep[m′]`` ≥ 0) and each
    candidate model m with an exit, the fallback's weight of m′ times p_left^(j+1)·max(E_j −
    R_j, 0) is taken off turn j's exit (E_j: m′'s least recomputing turn, forecast least
    intensity times least energy; R_j: returning to the cache at the forecast of its region;
    p_left, ``ret_keep``, the cache's KV pool's). The fallback's weights are normalized over
    the models with a deployment, as the exit's. ``diff`` (J,): scratch for max(E_j − R_j, 0),
    computed once per cached model."""
    n_j = fc.shape[1]
    for m2 in range(n_models):
        h = ret_dep[m2]
        if h < 0:
            continue
        r_h = region[h]
        bh = h - r_h * block
        saved = (e_in[bh] - e_cache[bh]) * ret_len[m2]
        for j in range(n_j):
            e_best = np.inf
            for b in range(block):
                if model[b] == m2:
                    e = alpha[b] + j * beta[b]
                    if e < e_best:
                        e_best = e
            here = fc_lo[j] * e_best
            back = fc[r_h, j] * (alpha[bh] + j * beta[bh] - saved)
            diff[j] = here - back if back < here else 0.0
        p = ret_keep[kv_pool[h]] if cache_survival else 1.0
        for m in range(n_models):
            w = fallback[m, m2]
            if need[m] == 0.0 or m == m2 or w <= 0.0 or not w_ex[m * n_j] < np.inf:
                continue
            ws = 0.0
            for m3 in range(n_models):
                if m3 != m and fallback[m, m3] > 0.0:
                    for b in range(block):
                        if model[b] == m3:
                            ws += fallback[m, m3]
                            break
            pj = p
            for j in range(n_j):
                if diff[j] > 0.0:
                    w_ex[m * n_j + j] -= (w / ws) * pj * diff[j]
                pj *= p


@njit(**_LEAF)
def return_targets(ret_dep, ret_len, cached, model):
    """Per model, the deployment holding the session's longest cache (``cached`` (deployments,)
    L(a), tokens; the first on ties; −1 where none) into ``ret_dep`` and its length into
    ``ret_len``: the return exit's targets (:func:`horizon_future`), one function for both
    replay loops."""
    ret_dep[:] = -1
    ret_len[:] = 0.0
    for b in range(len(cached)):
        m = model[b]
        if cached[b] > ret_len[m]:
            ret_dep[m], ret_len[m] = b, cached[b]


@njit(**_LEAF)
def observe_left(keep_left, left_dep, left_len, cached, kv_pool, smoothing):
    """The return exit's survival of a cache left behind, observed at a session's turn: per
    model, the cache the session left at its previous served turn (``left_dep``, −1: none;
    ``left_len`` its tokens then; :func:`leave`) against what it holds there now (``cached``
    (deployments,), tokens), a running mean per KV pool into ``keep_left`` (p_left, the share of
    a left cache that survives a think time). One function for both replay loops."""
    for m in range(len(left_dep)):
        h = left_dep[m]
        if h >= 0 and left_len[m] > 0.0:
            kp = kv_pool[h]
            keep_left[kp] = running_mean(keep_left[kp], min(cached[h] / left_len[m], 1.0),
                                         smoothing)


@njit(**_LEAF)
def leave(left_dep, left_len, ret_dep, ret_len, a):
    """After a session's turn is served on ``a``: the caches it leaves behind, per model its
    longest cache (``ret_dep``/``ret_len``, :func:`return_targets` at the decision) unless it is
    on ``a`` (−1 there), for :func:`observe_left` at its next turn."""
    for m in range(len(ret_dep)):
        if ret_dep[m] >= 0 and ret_dep[m] != a:
            left_dep[m], left_len[m] = ret_dep[m], ret_len[m]
        else:
            left_dep[m], left_len[m] = -1, 0.0


@njit(**_LEAF)
def kv_prices(price, evict, loss, evicted, lam, prev, hist_prev, cached, e_in, e_cache, ci,
              post_m, model, kv_cap, used, kv_pool, mask):
    """The horizon router's KV price (``HorizonRouter(kv_price=True)``), gCO2e per deployment,
    into ``price`` (n,) for the candidates (``mask``; the others keep what they had), with the
    tokens each candidate's turn would evict into ``evict`` (n,). First it observes what the
    session lost on its previous deployment ``prev`` (−1: nothing to observe): the history it
    had there, ``hist_prev`` tokens, not found cached, priced at (e_in − e_cache)·CI there now,
    added to ``loss`` (per KV pool, gCO2e). A candidate a in pool p then evicts max(0, H_0(a) −
    L(a) − (capacity_p − used_p)) tokens of other caches (``post_m`` H_0 per model, ``cached``
    L(a), ``kv_cap``/``used`` per pool, tokens), each at λ_p = ``loss[p]`` / ``evicted[p]`` (0
    while the router has evicted nothing there), kept per pool in ``lam`` (gCO2e per token) and
    recomputed only where ``loss`` or ``evicted`` changes: here, and in :func:`kv_evicted`, which
    the caller runs with the chosen deployment's ``evict`` once it is served. One function for
    both replay loops."""
    if prev >= 0:
        lost = hist_prev - cached[prev]
        if lost > 0:
            kp = kv_pool[prev]
            loss[kp] += lost * (e_in[prev] - e_cache[prev]) * ci[prev]
            lam[kp] = loss[kp] / evicted[kp] if evicted[kp] > 0 else 0.0
    for b in range(len(price)):
        if mask[b]:
            kp = kv_pool[b]
            x = post_m[model[b]] - cached[b] - (kv_cap[kp] - used[kp])
            evict[b] = x if x > 0.0 else 0.0
            price[b] = lam[kp] * evict[b]


@njit(**_LEAF)
def kv_evicted(evicted, lam, loss, kp, tokens):
    """After a choice is served: the ``tokens`` its turn evicted (:func:`kv_prices`'s
    ``evict``) added to ``evicted[kp]``, its KV pool's, and that pool's λ in ``lam`` renewed."""
    evicted[kp] += tokens
    lam[kp] = loss[kp] / evicted[kp] if evicted[kp] > 0 else 0.0


@njit(**_LEAF)
def forecast_minima(fc, lo, arg):
    """Per future turn j of the forecast ``fc`` (regions, J), gCO2e/kWh: the least intensity
    into ``lo`` (J,) and its region, the first on ties, into ``arg`` (J,) — where
    :func:`horizon_future` prices the option to move; computed once per forecast rather than
    per decision."""
    n_r, n_j = fc.shape
    for j in range(n_j):
        c_lo, r_lo = np.inf, 0
        for r in range(n_r):
            if fc[r, j] < c_lo:
                c_lo, r_lo = fc[r, j], r
        lo[j], arg[j] = c_lo, r_lo


@njit(cache=True)
def dominant_blocks(e_in, e_out, model, n_models, block):
    """Per model, the first block (deployment index < ``block``: a (GPU, model) of the first
    region) whose e_in and e_out are both the model's least, so that it costs least at every
    turn of :func:`horizon_future`; −1 where no block is both. int64 (n_models,)."""
    dom = np.full(n_models, -1, np.int64)
    for m in range(n_models):
        lo_in, lo_out = np.inf, np.inf
        for b in range(block):
            if model[b] == m:
                lo_in = min(lo_in, e_in[b])
                lo_out = min(lo_out, e_out[b])
        for b in range(block):
            if model[b] == m and e_in[b] == lo_in and e_out[b] == lo_out:
                dom[m] = b
                break
    return dom


@njit(**_LEAF)
def told_models(stay_j, exit_j, feasible, start, c, k, stay_m):
    """The models of a session's future turns, told (the reference ``HorizonRouter(
    future_models="told")``; one function for both replay loops): for j = 1..J (column j − 1),
    ``stay_j[m, j − 1]`` = 1 if model m is quality-feasible at turn k + j of conversation ``c``
    (``feasible`` (rows, models) bool, its turns at rows ``start[c]`` … ``start[c + 1]`` − 1)
    and ``exit_j[j − 1]`` the smallest feasible model there; past the conversation's last turn
    the learned ``stay_m`` (q_m) and −1 (the learned exit)."""
    n_m, n_j = stay_j.shape
    lo, n_t = start[c], start[c + 1] - start[c]
    for j in range(n_j):
        t = k + 1 + j
        exit_j[j] = -1
        if t < n_t:
            for m in range(n_m):
                ok = feasible[lo + t, m]
                stay_j[m, j] = 1.0 if ok else 0.0
                if ok and exit_j[j] < 0:
                    exit_j[j] = m
        else:
            for m in range(n_m):
                stay_j[m, j] = stay_m[m]


@njit(**_LEAF, inline="always")
def pick(carbon, future, slot, ttft, kv, extra, mask, with_slot, with_ttft, with_kv, with_extra):
    """The horizon router's choice: the candidate (``mask``) of least total, gCO2e — Ĉ
    (``carbon``) + the future term, then each price that is on (the slot, TTFT and KV prices, a
    subclass's ``extra``), added in that order; the first on ties; the first candidate where no
    total is below +inf; −1 without candidates. Both replay loops choose with it."""
    # the candidates' totals, summed one by one: a loop over every deployment would read Ĉ, the
    # future and the prices back in vectors right after they were written one by one, and wait
    # for the stores to land
    a = -1
    lo = np.inf
    for b in range(len(mask)):
        if mask[b]:
            v = carbon[b] + future[b]
            if with_slot:
                v = v + slot[b]
            if with_ttft:
                v = v + ttft[b]
            if with_kv:
                v = v + kv[b]
            if with_extra:
                v = v + extra[b]
            if v < lo:
                lo, a = v, b
    if a == -1:
        for b in range(len(mask)):
            if mask[b]:
                return b
    return a


#: SplitMix64's constants (the conversations' folds).
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


@njit(cache=True)
def _fold_hash(conversation, folds, salt):
    # SplitMix64 of (seed, id); uint64 arithmetic wraps modulo 2**64
    x = np.uint64(conversation) + np.uint64(salt) * _GOLDEN + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _MIX1
    x = (x ^ (x >> np.uint64(27))) * _MIX2
    x = x ^ (x >> np.uint64(31))
    return np.int64(x % np.uint64(folds))


@njit(cache=True)
def fold_hashes(ids, folds, salt):
    """:func:`conversation_fold` of every id of ``ids`` (int64) with the salt already masked
    (:func:`carbonrouter_lib.prepared.conversation_folds` is the public form)."""
    out = np.empty(len(ids), np.int64)
    for i in range(len(ids)):
        out[i] = _fold_hash(ids[i], folds, salt)
    return out


def conversation_fold(conversation: int, folds: int, seed: int) -> int:
    """The fold (0 … folds−1) of one conversation (or session) id, int64:
    :func:`carbonrouter_lib.prepared.conversation_folds` of one id without building an array.
    The learned gate's and the horizon router's per-decision paths ask for it (0.14 µs)."""
    return _fold_hash(conversation, folds, seed & 0xFFFFFFFF)


@njit(cache=True)
def horizon_work_size(n_regions: int, n_models: int, n_deployments: int, horizon: int) -> int:
    """Length of :func:`horizon_future`'s scratch ``work`` (float64) for these sizes (one
    formula for the Python policy and the compiled loop)."""
    block = n_deployments // n_regions
    return max(2 * n_regions + 2 * n_models,
               2 * block + (5 + n_models) * horizon + 4 * n_models)


@njit(**_LEAF)
def residence_turns(surv, rho):
    """Σ_j S(j)·ρ^(j−1) over ``surv`` (J,) = S(1..J): the expected number of a session's future
    turns still on the deployment chosen now, when each later turn stays with chance ``rho``
    (the weights of :func:`horizon_future`); the slot price's ``slot_residence`` remaining
    time, in gaps τ."""
    total = 0.0
    for j in range(len(surv)):
        total += surv[j] * rho ** j
    return total


@njit(**_LEAF)
def ttft_prices(price, slo, nu, carbon, mask, ttft):
    """The horizon router's TTFT price (:mod:`carbonrouter_lib.policies.horizon`), gCO2e per
    deployment, written to ``price`` (n,) for the candidates (``mask``; the others keep what
    they had): ν·min Ĉ over the candidates (``carbon``) where the candidate's TTFT (``ttft``,
    Eq. 6, s; :attr:`Candidates.ttft`) exceeds the SLO ``slo`` (s), else 0."""
    lo = math.inf
    for b in range(len(mask)):
        if mask[b] and carbon[b] < lo:
            lo = carbon[b]
    c = nu * lo
    for b in range(len(mask)):
        if mask[b]:
            price[b] = c if ttft[b] > slo else 0.0


@njit(**_LEAF)
def _ttfts(out, nd, at, new_f, hist_f, model, cached, v_pre, mask=None):
    """:attr:`Candidates.ttft` of row ``at`` // n_models: Eq. 6 per deployment, (N_new + N_hist
    − L(a)) / v_pre, s, from L(a) (``cached``; 0 off a hit); for every deployment, or with
    ``mask`` for those it holds (the TTFT price reads the candidates only)."""
    if mask is None:
        for b in range(nd):
            m = model[b]
            out[b] = (new_f[at + m] + (hist_f[at + m] - cached[b])) / v_pre[b]
    else:
        for b in range(nd):
            if mask[b]:
                m = model[b]
                out[b] = (new_f[at + m] + (hist_f[at + m] - cached[b])) / v_pre[b]


@njit(**_LEAF, inline="always")
def ttft_dual(nu, ttft_served, slo, share, step):
    """The TTFT price's multiplier ν after a choice served with ``ttft_served`` (s): ν +
    ``step``·(1{TTFT > ``slo``} − ``share``), not below 0 (dual ascent on the chance
    constraint P(TTFT > SLO) ≤ share)."""
    over = 1.0 if ttft_served > slo else 0.0
    return max(0.0, nu + step * (over - share))


@njit(**_LEAF)
def slot_prices(price, pi, displaced, gap, clock, carbon, fits, n_fits, available, mask, pool,
                prev, t, smoothing, sessions_s, remaining_s, credit):
    """The horizon router's slot price (:mod:`carbonrouter_lib.policies.horizon`), gCO2e per
    deployment, written to ``price`` (n,) for the candidates (``mask``; the others keep what
    they had) (``pi``: scratch (pools,)). At a first turn
    (``prev`` < 0) it first observes the displacement — ``carbon`` (Ĉ per deployment) of the
    least among ``mask`` minus the least among the feasible deployments (``fits[b % n_fits]``),
    when that one is not ``available`` — into the per-pool averages ``displaced`` and ``gap``
    and the first turns' rate and last time ``clock`` = [rate 1/s, time s]; ``t`` is the
    dispatch time, s. ``credit``: a switch from the pool the session holds is credited that
    pool's price (it pays π_new − π_held); without it the held pool is free to stay on and a
    switch pays π_new. Shared by the Python policy and the compiled loop."""
    nd = len(carbon)
    if prev < 0:
        best, lo_c = -1, np.inf
        f = 0  # b % n_fits, counted (an integer division per deployment cost more)
        for b in range(nd):
            if fits[f] and carbon[b] < lo_c:
                lo_c, best = carbon[b], b
            f = f + 1 if f + 1 < n_fits else 0
        if best >= 0:
            g = 0.0
            if not available[best]:
                lo_m = np.inf
                for b in range(nd):
                    if mask[b] and carbon[b] < lo_m:
                        lo_m = carbon[b]
                if lo_m < np.inf:
                    g = max(lo_m - lo_c, 0.0)
            pb = pool[best]
            for p in range(len(displaced)):
                displaced[p] = _normal(displaced[p] * (1.0 - smoothing))
            displaced[pb] += smoothing * g
            if g > 0:
                gap[pb] = g if gap[pb] == 0 else gap[pb] + smoothing * (g - gap[pb])
        if not math.isnan(clock[1]):
            rate = 1.0 / max(t - clock[1], 1e-3)
            clock[0] = rate if clock[0] == 0 else clock[0] + smoothing * (rate - clock[0])
        clock[1] = t
    for p in range(len(pi)):
        pi[p] = min(displaced[p] * clock[0], gap[p] / max(sessions_s, 1.0))
    for b in range(nd):
        if not mask[b]:
            continue  # only the candidates are priced
        price[b] = pi[pool[b]] * remaining_s
        if prev >= 0:
            if pool[b] == pool[prev]:
                price[b] = 0.0
            elif credit:
                price[b] -= pi[pool[prev]] * remaining_s


# ---------------------------------------------------------------------------------------------
# the horizon router's decision from Python
# ---------------------------------------------------------------------------------------------

#: The fields of :class:`HorizonState`, in its constructor's order: the run's constants, the
#: horizon model's arrays, the router's parameters, a told reference's arrays, the state and
#: scratch a decision updates (the names :func:`_replay` gives them, where it has them;
#: ``new_tok`` and ``out_tok`` are its ``h_new`` and ``h_out``: a field must not be called
#: ``new``, which would shadow structref's constructor).
HORIZON_STATE_FIELDS = (
    "e_in", "e_cache", "e_out", "de", "v_pre", "region", "model", "kvp_of", "pool", "kv_cap",
    "dom", "n_m", "block",
    "survival", "new_tok", "out_tok", "stay", "fallback", "eligible", "surv_sum", "tau",
    "folds", "salt", "told_len", "turns",
    "j", "smoothing", "cache_survival", "stickiness", "use_fallback", "option", "ref", "slot",
    "slot_s", "slot_res", "slot_credit", "tg_slo", "kvp", "told_m", "ret",
    "stay_j", "exit_j", "tfeas", "tstart",
    "keep", "phi", "keep_left", "post_m", "future", "miss", "work", "value", "price", "pi",
    "disp", "gap", "clock", "tprice", "ttft", "kv_loss", "kv_evicted", "kv_lam", "kv_price",
    "kv_evict", "ret_dep", "ret_len", "hit_a", "hit_miss", "e_base", "e_unc",
)


@structref.register
class _HorizonStateType(types.StructRef):
    def preprocess_fields(self, fields):
        return tuple((name, types.unliteral(t)) for name, t in fields)


class HorizonState(structref.StructRefProxy):
    """The arrays and parameters of a :class:`~carbonrouter_lib.policies.horizon.HorizonRouter`
    run, bound once (fields :data:`HORIZON_STATE_FIELDS`, positional; :func:`new_horizon_state`
    makes one): one argument to
    :func:`horizon_decide` in place of some seventy. The arrays are the caller's (shared, not
    copied): the decision updates them in place, and the policy reads them back."""


structref.define_proxy(HorizonState, _HorizonStateType, list(HORIZON_STATE_FIELDS))


@njit(cache=True)
def new_horizon_state(*fields):
    """A :class:`HorizonState` of ``fields`` (:data:`HORIZON_STATE_FIELDS`' order): the proxy's
    constructor compiled once and cached on disk (called from Python it compiles in every
    process: the router's first bind in a process took 0.8 s so, 0.01 s through this)."""
    return HorizonState(*fields)


@njit(cache=True)
def horizon_decide(hs, conversation, k, prev, t, expired, rho, nu, tokens, row, cached, ci, mask,
                   avail, fits, used, fcs, fcs_lo, fcs_arg, left_dep, left_len):
    """The horizon router's decision in the Python loop and the live router (J ≥ 1;
    :mod:`carbonrouter_lib.policies.horizon`), in one call: the candidate of least this-turn
    carbon + future term + prices, −1 without candidates. The compiled loop (:func:`_replay`)
    runs the same sequence inline (a call there cost 0.6 µs of its 0.7-µs decision, measured),
    and tests/test_kernel.py holds the two loops' decisions alike.

    ``hs`` (:class:`HorizonState`): the run's arrays and parameters, and the state and scratch
    the decision updates. Per decision: the ``conversation`` (its fold and, told, its length
    are found here), turn ``k``, previous deployment ``prev`` (−1: none), dispatch time ``t``
    (s), ``expired`` (the session's caches outlived the TTL: the KV price observes no loss), the
    continuation ``rho``, the TTFT price's multiplier ``nu``; the query's tokens, row ``row`` of
    ``tokens`` (queries, 3, models: N_new, N_hist, N̂_out per model; QueryBatch.tokens); per
    deployment L(a) (``cached``; its hits are found here), CI, the candidates (``mask``),
    availability and feasibility if free (``fits``); the KV tokens used per pool; every fold's
    forecast at the dispatch's grid row (folds, regions, J) and its minima (folds, J;
    :func:`forecast_minima`); the return exit's caches the session left
    (:func:`observe_left`)."""
    e_in, e_cache, e_out, de, v_pre = hs.e_in, hs.e_cache, hs.e_out, hs.de, hs.v_pre
    region, model, kvp_of, pool, kv_cap = hs.region, hs.model, hs.kvp_of, hs.pool, hs.kv_cap
    dom, n_m, block = hs.dom, hs.n_m, hs.block
    survival, new, out, stay = hs.survival, hs.new_tok, hs.out_tok, hs.stay
    fallback, eligible, surv_sum, tau = hs.fallback, hs.eligible, hs.surv_sum, hs.tau
    j, smoothing, cache_survival, stickiness = hs.j, hs.smoothing, hs.cache_survival, hs.stickiness
    use_fallback, option, ref, slot, slot_s = hs.use_fallback, hs.option, hs.ref, hs.slot, hs.slot_s
    slot_res, slot_credit, tg_slo, kvp = hs.slot_res, hs.slot_credit, hs.tg_slo, hs.kvp
    told_m, ret = hs.told_m, hs.ret
    stay_j, exit_j, tfeas, tstart = hs.stay_j, hs.exit_j, hs.tfeas, hs.tstart
    keep, phi, keep_left, post_m = hs.keep, hs.phi, hs.keep_left, hs.post_m
    future, miss, work, value = hs.future, hs.miss, hs.work, hs.value
    price, pi, disp, gap, clock = hs.price, hs.pi, hs.disp, hs.gap, hs.clock
    tprice, ttft, kv_loss, kv_evicted = hs.tprice, hs.ttft, hs.kv_loss, hs.kv_evicted
    kv_lam, kv_price, kv_evict = hs.kv_lam, hs.kv_price, hs.kv_evict
    ret_dep, ret_len = hs.ret_dep, hs.ret_len
    hit_a, hit_miss, e_base, e_unc = hs.hit_a, hs.hit_miss, hs.e_base, hs.e_unc
    fo = _fold_hash(conversation, hs.folds, hs.salt)
    sf = hs.folds + hs.turns[conversation] if hs.told_len else fo  # S_k(j)'s row
    kk = min(k, survival.shape[1] - 1)
    fc, fc_lo, fc_arg = fcs[fo], fcs_lo[fo], fcs_arg[fo]
    tk = tokens[row]
    new_m, hist_m, est_m = tk[0], tk[1], tk[2]
    n_hits = 0
    for b in range(len(cached)):
        if cached[b] > 0.0:
            hit_a[n_hits] = b
            hit_miss[n_hits] = hist_m[model[b]] - cached[b]
            n_hits += 1
    _energy_row(0, block, model, e_in, e_cache, e_out, de, new_m, hist_m, est_m, e_base, e_unc)
    nd = len(mask)
    if cache_survival and k > 0 and prev >= 0:
        hb = hist_m[model[prev]]
        if hb > 0:  # what the session found of the cache it left on prev
            kp = kvp_of[prev]
            keep[kp] = running_mean(keep[kp], cached[prev] / hb, smoothing)
    for m in range(n_m):
        post_m[m] = hist_m[m] + new_m[m] + est_m[m]
    if option:  # would this query's context fit in each pool, no eviction?
        observe_room(phi, kv_cap, used, post_m[ref], smoothing)
    if told_m:
        told_models(stay_j, exit_j, tfeas, tstart, conversation, k, stay[fo])
        horizon_future(future, miss, work, survival[sf, kk, :j], rho, fc, fc_lo, fc_arg,
                       post_m, new[fo], out[fo], stay[fo], e_in, e_cache, e_out, region, model,
                       kvp_of, keep, n_m, cache_survival, stickiness, fallback[fo],
                       eligible[fo], phi, use_fallback, option, mask, dom, stay_j, exit_j)
    elif ret:
        if cache_survival:
            observe_left(keep_left, left_dep, left_len, cached, kvp_of, smoothing)
        return_targets(ret_dep, ret_len, cached, model)
        horizon_future(future, miss, work, survival[sf, kk, :j], rho, fc, fc_lo, fc_arg,
                       post_m, new[fo], out[fo], stay[fo], e_in, e_cache, e_out, region, model,
                       kvp_of, keep, n_m, cache_survival, stickiness, fallback[fo],
                       eligible[fo], phi, use_fallback, option, mask, dom, None, None, ret_dep,
                       ret_len, keep_left)
    else:
        horizon_future(future, miss, work, survival[sf, kk, :j], rho, fc, fc_lo, fc_arg,
                       post_m, new[fo], out[fo], stay[fo], e_in, e_cache, e_out, region, model,
                       kvp_of, keep, n_m, cache_survival, stickiness, fallback[fo],
                       eligible[fo], phi, use_fallback, option, mask, dom)
    _values(1, nd, ci, e_base, e_unc, block, de, hit_a, hit_miss, n_hits, value)  # Ĉ(a)
    if slot:
        if slot_res:  # T̄ and T_k with the continuation (slot_residence)
            ahead0 = residence_turns(survival[fo, 0, :j], rho)
            ahead = residence_turns(survival[sf, kk, :j], rho)
        else:
            ahead0, ahead = surv_sum[fo, 0], surv_sum[sf, kk]
        slot_prices(price, pi, disp, gap, clock, value, fits, len(fits), avail, mask, pool,
                    prev, t, slot_s, tau[fo] * (0.5 + ahead0), tau[fo] * (0.5 + ahead),
                    slot_credit)
    priced = tg_slo > 0.0 and nu > 0.0  # ν = 0: the price is 0 everywhere
    if priced:
        _ttfts(ttft, nd, 0, new_m, hist_m, model, cached, v_pre, mask)
        ttft_prices(tprice, tg_slo, nu, value, mask, ttft)
    if kvp:
        b = prev if k > 0 else -1
        if b >= 0 and expired:
            b = -1  # the cache had expired: no eviction took it
        hist_b = hist_m[model[b]] if b >= 0 else 0.0
        kv_prices(kv_price, kv_evict, kv_loss, kv_evicted, kv_lam, b, hist_b, cached, e_in,
                  e_cache, ci, post_m, model, kv_cap, used, kvp_of, mask)
    return pick(value, future, price, tprice, kv_price, future, mask, slot, priced, kvp, False)


# ---------------------------------------------------------------------------------------------
# the replay
# ---------------------------------------------------------------------------------------------

@njit(**_LEAF)
def _remove(r, rec_of, rec_s, rec_a, rec_tok, used, kvp_of):
    used[kvp_of[rec_a[r]]] -= rec_tok[r]
    rec_of[rec_s[r], rec_a[r]] = -1


@njit(**_LEAF)
def _valid(s, a, ver, rec_of, rec_ver, rec_pin):
    r = rec_of[s, a]
    if r == -1 or rec_ver[r] != ver or rec_pin[r]:
        return -1
    return r


@njit(**_LEAF)
def _feasibility(i, at, nd, n_hits, hit_a, hit_miss, hit_new, ok_all, fast_all, avail, v_pre,
                 d_ttft, hist_f, new_f, model, cached, mask, value):
    """policies.feasibility for row i: writes the candidate ``mask`` (``value`` is scratch);
    returns 0, 1 when the candidates are best-effort, 2 when the query is rejected.
    ``ok_all`` and ``fast_all`` are per (GPU, model) pair of one region (QueryBatch.ok_block):
    deployment b's at column b % B."""
    nb = ok_all.shape[1]
    for r0 in range(0, nd, nb):
        for c in range(nb):
            mask[r0 + c] = fast_all[i, c] and avail[r0 + c]
    for j in range(n_hits):
        b = hit_a[j]
        if ok_all[i, b % nb] and avail[b]:
            mask[b] = (hit_new[j] + hit_miss[j]) / v_pre[b] <= d_ttft
    for b in range(nd):
        if mask[b]:
            return 0
    lo = math.inf
    n_ok = 0
    _ttfts(value, nd, at, new_f, hist_f, model, cached, v_pre)
    for b in range(nd):
        if ok_all[i, b % nb] and avail[b]:
            n_ok += 1
            if value[b] < lo:
                lo = value[b]
        else:
            value[b] = math.inf
    if n_ok == 0:
        return 2
    for b in range(nd):
        mask[b] = value[b] == lo
    return 1


@njit(**_LEAF)
def _energy_row(at, block, model, e_in, e_cache, e_out, de, new_f, hist_f, est_f, e_base, e_unc):
    """QueryBatch.energy_base and energy_uncached of the row whose tokens start at ``at``
    (kWh, per (GPU, model) pair of one region, into ``e_base`` and ``e_unc``): the same
    operations in the same order, so the same values, computed per decision rather than
    stored for every query (a service-scale replay's largest array)."""
    for c in range(block):
        k = at + model[c]
        x = e_in[c] * new_f[k] + e_cache[c] * hist_f[k] + e_out[c] * est_f[k]
        e_base[c] = x
        e_unc[c] = de[c] * hist_f[k] + x


@njit(**_LEAF)
def _values(kind, nd, ci, e_base, e_unc, block, de, hit_a, hit_miss, n_hits, value):
    """Per deployment, into ``value``: the query's energy Ê (``kind`` 0: e_unc, or on a hit
    de·miss + e_base), its carbon Ĉ = CI·Ê (1; Candidates.carbon) or its base carbon CI·e_base
    (2). Deployments are region-major, so a deployment's block is its index within the region
    (no integer division per deployment)."""
    for r0 in range(0, nd, block):
        for b in range(r0, r0 + block):
            if kind == 2:
                value[b] = ci[b] * e_base[b - r0]
            elif kind == 1:
                value[b] = ci[b] * e_unc[b - r0]
            else:
                value[b] = e_unc[b - r0]
    if kind != 2:
        for jh in range(n_hits):
            b = hit_a[jh]
            e = de[b] * hit_miss[jh] + e_base[b % block]
            value[b] = ci[b] * e if kind == 1 else e


@njit(**_LEAF)
def _rank(code, pricing, nd, ci, e_base, e_unc, block, de, hit_a, hit_miss, n_hits, mask,
          value):
    """The candidate with the lowest ranking value (first on ties): energy (SA), carbon (CA,
    CarbonRouter's proposal with pricing) or base carbon (FairCarbon, the proposal without
    pricing); ``value`` holds the values after. ``e_base``, ``e_unc``: the query's
    (_energy_row)."""
    kind = 2 if code == 2 or (code == 4 and not pricing) else (0 if code == 0 else 1)
    _values(kind, nd, ci, e_base, e_unc, block, de, hit_a, hit_miss, n_hits, value)
    a = -1
    lo = math.inf
    for b in range(nd):
        if mask[b] and value[b] < lo:
            lo, a = value[b], b
    if a == -1:  # every candidate at +inf: the first candidate (numpy's argmin)
        for b in range(nd):
            if mask[b]:
                return b
    return a


@njit(cache=True)
def _branch(a, i, s, t, pricing, cached, ci, n_m, new_f, hist_f, out_f, think, turn, n_turns,
            model, pool, region, v_pre, v_dec, de, e_in, e_cache, e_out, est_f, block,
            ok_all, fast_all, d_ttft, slots_free, holder, n_pools, rec_of, rec_tok, rec_f,
            rec_ver, rec_pin, used, kv_cap, kvp_of, ttl, heaps, hsize, ds, da, dv, l_head, l_nxt,
            es, ea, ev, departed, sig_t, sig_v, span_lo, span_hi, bw):
    """gate.TwoBranchLabeler.branch_carbon: the realized carbon (gCO2e) of serving row i of
    session s on ``a`` at t plus the session's next turn routed by CarbonRouter's proposal on
    what it would see then, the other sessions frozen (Backend.session_after_turn: read, never
    written). ``bw``: scratch of the branch (see _replay). Returns (carbon, time): time is the
    next turn's dispatch when the signal does not cover it (carbon NaN), else 0."""
    nd = len(model)
    m = model[a]
    at = i * n_m
    n_new, n_hist, n_out = new_f[at + m], hist_f[at + m], out_f[at + m]
    c = cached[a]
    now_c = ci[a] * (e_in[a] * (n_new + n_hist - c) + e_cache[a] * c + e_out[a] * n_out)
    if turn[i] == n_turns[i] - 1:
        return now_c, 0.0
    done = t + ((n_new + n_hist - c) / v_pre[a] + n_out / v_dec[a])
    t2 = done + think[i + 1]
    # session_after_turn(s, a, t, context, done, t2)
    free2 = bw.free
    for p in range(n_pools):
        free2[p] = slots_free[p]
    p = pool[a]
    held = holder[s]
    if held != p:
        if held != -1:
            free2[held] += 1
        free2[p] -= 1
    tok2, f2, has2 = bw.tok, bw.f, bw.has
    for b in range(nd):
        r = rec_of[s, b]
        has2[b] = r != -1
        if r != -1:
            tok2[b], f2[b] = rec_tok[r], rec_f[r]
    old = tok2[a] if has2[a] else 0
    delta = np.int64(n_hist + n_new + n_out) - old
    kp = kvp_of[a]
    if delta > 0:
        missing = delta - (kv_cap[kp] - used[kp])
        if missing > 0:
            # departed sessions' caches go first; none is the session's own, so only their sum
            # matters (Backend._victims walks them sorted)
            freed = 0
            heap = heaps[kp]
            for q in range(hsize[kp]):
                if freed >= missing:
                    break
                e = heap[q]
                r = _valid(ds[e], da[e], dv[e], rec_of, rec_ver, rec_pin)
                if r != -1:
                    freed += min(rec_tok[r], missing - freed)
            e = l_head[kp]
            while freed < missing and e != -1:
                s2, b2 = es[e], ea[e]
                r = _valid(s2, b2, ev[e], rec_of, rec_ver, rec_pin)
                if r != -1 and not departed[s2] and not (s2 == s and b2 == a):
                    take = min(rec_tok[r], missing - freed)
                    freed += take
                    if s2 == s:
                        tok2[b2] -= take
                e = l_nxt[e]
            if freed < missing:
                delta -= missing - freed
    tok2[a], f2[a], has2[a] = old + delta, done, True
    # the next turn (row i + 1) in that state
    if not span_lo <= t2 < span_hi:
        return math.nan, t2
    row = np.searchsorted(sig_t, t2, side="right") - 1
    ci2, cached2, avail2 = bw.ci, bw.cached, bw.avail
    for b in range(nd):
        ci2[b] = sig_v[row, region[b]]
        avail2[b] = free2[pool[b]] > 0 or pool[b] == p
    i2 = i + 1
    at2 = i2 * n_m
    n_hits = 0
    for b in range(nd):
        cached2[b] = 0.0
        if has2[b] and tok2[b] > 0 and not f2[b] + ttl < t2:
            m2 = model[b]
            hist = hist_f[at2 + m2]
            L = min(float(tok2[b]), hist)
            if L != 0.0:
                cached2[b] = L
                bw.hit_a[n_hits] = b
                bw.hit_miss[n_hits] = hist - L
                bw.hit_new[n_hits] = new_f[at2 + m2]
                n_hits += 1
    status = _feasibility(i2, at2, nd, n_hits, bw.hit_a, bw.hit_miss, bw.hit_new, ok_all,
                          fast_all, avail2, v_pre, d_ttft, hist_f, new_f, model, cached2,
                          bw.mask, bw.value)
    if status == 2:  # rejected: no next-turn carbon in this branch
        return now_c, 0.0
    _energy_row(at2, block, model, e_in, e_cache, e_out, de, new_f, hist_f, est_f, bw.eb, bw.eu)
    a2 = _rank(4, pricing, nd, ci2, bw.eb, bw.eu, block, de, bw.hit_a, bw.hit_miss, n_hits,
               bw.mask, bw.value)
    m2 = model[a2]
    c2 = cached2[a2]
    nxt = ci2[a2] * (e_in[a2] * (new_f[at2 + m2] + hist_f[at2 + m2] - c2) + e_cache[a2] * c2
                     + e_out[a2] * out_f[at2 + m2])
    return now_c + nxt, 0.0


@njit(cache=True)
def _replay(
    sess, turn, n_turns, think, n_sessions, new_f, hist_f, out_f, est_f, qual, n_m,
    arr_t, arr_row,
    ok_all, fast_all, block,
    model, pool, region, gpu, v_pre, v_dec, de, e_in, e_cache, e_out, n_regions, n_pools,
    d_ttft,
    slots, kvp_of, kv_cap, ttl,
    sig_t, sig_v, span_lo, span_hi,
    code, pricing, gated, delta, home_draw, fold, fold_delta,
    f_left, f_right, f_feature, f_threshold, f_default_left, f_tree_start, f_n_trees, f_depth,
    f_base, g_kind, l_row, l_g, l_b, l_z, l_sw, l_st, l_n,
    h_j, h_online, h_rho, h_smoothing, h_cache_survival, h_stickiness, h_release, h_survival,
    h_new, h_out, h_stay, h_keep0, h_fc, h_row0, h_fold, h_sfold, h_slot, h_slot_s, h_surv_sum,
    h_tau, h_slot_res, h_slot_credit, h_fallback, h_eligible, h_use_fallback, h_option, h_ref,
    h_tg_slo, h_tg_share, h_tg_step, h_told_m, h_tfeas, h_tstart, h_conv, h_return, h_kvp,
    h_kv_ttl,
    c_row, c_dep, c_disp, c_compl, c_cached, c_ttft, c_be, c_rej, c_switch, c_opp, c_block,
    counters, time_decisions, dec_cyc,
):
    """The loop of simulator.simulate over arrays (see the module). Writes the loop columns
    (c_*) and counters (and, with ``time_decisions``, each decision's time-stamp-counter
    cycles into ``dec_cyc``, dispatch order); returns (status, time): status 0 done, 1 the
    carbon signal does not cover ``time``, 2 the horizon router's precomputed forecasts do
    not."""
    n = len(sess)
    nd = len(model)
    n_kv = len(kv_cap)
    inf = math.inf

    # backend state
    # (per-row arrays of indices, deployments and versions are int32: replay() admits fewer
    # than 2**30 rows, and at service scale these arrays are most of the loop's memory)
    rec_of = np.full((n_sessions, nd), -1, np.int32)
    rec_s = np.empty(n + 1, np.int32)
    rec_a = np.empty(n + 1, np.int32)
    rec_tok = np.empty(n + 1, np.int64)
    rec_f = np.empty(n + 1, np.float64)
    rec_pin = np.empty(n + 1, np.bool_)
    rec_ver = np.empty(n + 1, np.int32)
    n_rec = 0
    version = 0
    now = -inf
    holder = np.full(n_sessions, -1, np.int64)
    departed = np.zeros(n_sessions, np.bool_)
    free = np.full(n_pools, slots, np.int64)
    open_ = np.ones(nd, np.bool_)
    used = np.zeros(n_kv, np.int64)
    # queue entries (one per completion with tokens > 0): live LRU list per KV pool + expiry list
    ef = np.empty(n + 1, np.float64)
    es = np.empty(n + 1, np.int32)
    ea = np.empty(n + 1, np.int32)
    ev = np.empty(n + 1, np.int32)
    l_nxt = np.empty(n + 1, np.int32)
    l_prv = np.empty(n + 1, np.int32)
    x_nxt = np.empty(n + 1, np.int32)
    x_prv = np.empty(n + 1, np.int32)
    n_e = 0
    l_head = np.full(n_kv, -1, np.int64)
    l_tail = np.full(n_kv, -1, np.int64)
    x_head = np.full(1, -1, np.int64)
    x_tail = np.full(1, -1, np.int64)
    # departed sessions' caches: entries and one heap per KV pool
    df = np.empty(n + 1, np.float64)
    ds = np.empty(n + 1, np.int32)
    da = np.empty(n + 1, np.int32)
    dv = np.empty(n + 1, np.int32)
    n_d = 0
    heaps = List()
    for _ in range(n_kv):
        heaps.append(np.empty(16, np.int64))
    hsize = np.zeros(n_kv, np.int64)

    # per-query buffers
    cached = np.zeros(nd)  # L(a), clipped
    hit_a = np.empty(nd, np.int64)
    hit_miss = np.empty(nd)
    hit_new = np.empty(nd)
    mask = np.zeros(nd, np.bool_)
    avail = np.zeros(nd, np.bool_)
    ci = np.zeros(nd)
    ci_region = np.zeros(n_regions)
    value = np.zeros(nd)
    z = np.zeros(28)
    future = np.zeros(nd)
    miss_buf = np.zeros(nd)
    post_m = np.zeros(n_m)
    ret_dep = np.full(n_m, -1, np.int64)  # the return exit's targets, per model
    ret_len = np.zeros(n_m)
    # the return exit's caches left behind, per session and model (observe_left, leave)
    left_dep = np.full((n_sessions if h_return else 1, n_m), -1, np.int64)
    left_len = np.zeros((n_sessions if h_return else 1, n_m))
    h_keep_left = np.full(n_kv, h_keep0)  # per KV pool: p_left
    h_work = np.empty(horizon_work_size(n_regions, n_m, nd, max(h_j, 1)))
    bw = _Branch(np.empty(n_pools, np.int64), np.empty(nd, np.int64), np.empty(nd),
                 np.empty(nd, np.bool_), np.empty(nd), np.empty(nd), np.empty(nd, np.bool_),
                 np.empty(nd, np.int64), np.empty(nd), np.empty(nd), np.empty(nd, np.bool_),
                 np.empty(nd), np.empty(block), np.empty(block))
    e_base = np.empty(block)  # the query's energies (_energy_row)
    e_unc = np.empty(block)
    h_keep = np.full(n_kv, h_keep0)
    h_phi = np.ones(n_kv)  # per KV pool: the chance a new cache there evicts another
    h_dom = dominant_blocks(e_in, e_out, model, n_m, nd // n_regions)
    # the forecasts' least intensity and region per turn (forecast_minima), per row and fold
    h_fc_lo = np.empty((h_fc.shape[0], h_fc.shape[1], h_fc.shape[3]))
    h_fc_arg = np.empty((h_fc.shape[0], h_fc.shape[1], h_fc.shape[3]), np.int64)
    if code == 5:
        for x in range(h_fc.shape[0]):
            for f in range(h_fc.shape[1]):
                forecast_minima(h_fc[x, f], h_fc_lo[x, f], h_fc_arg[x, f])
    h_stayed = 1.0
    # told the models of the future turns (a reference): q_m and the exit per future turn
    h_stay_j = np.ones((n_m, max(h_j, 1)))
    h_exit_j = np.full(max(h_j, 1), -1, np.int64)
    # the slot price (HorizonRouter.slot_price): displacement per first turn, mean nonzero
    # displacement, price per pool; the rate of first turns and the last one's time
    h_disp = np.zeros(n_pools)
    h_gap = np.zeros(n_pools)
    h_pi = np.zeros(n_pools)
    h_clock = np.array([0.0, math.nan])
    h_price = np.zeros(nd)
    # the TTFT price (HorizonRouter.ttft_slo_s): its multiplier ν and prices
    h_nu = 0.0
    h_tprice = np.zeros(nd)
    h_ttft = np.zeros(nd)
    # the KV price (kv_prices): per KV pool the carbon lost to missing history and the tokens
    # the router's choices evicted; per deployment the price and its turn's evicted tokens
    h_kv_loss = np.zeros(n_kv)
    h_kv_evicted = np.zeros(n_kv)
    h_kv_lam = np.zeros(n_kv)
    h_kv_price = np.zeros(nd)
    h_kv_evict = np.zeros(nd)
    last_done = np.full(n_sessions, -inf)  # Backend.last_completion
    cur_row = -1
    prev_served = np.full(n_sessions, -1, np.int64)
    served_on = np.full(n, -1, np.int32)
    home = np.full(n_sessions, -1, np.int64)
    ci_from, ci_until = inf, -inf

    ht = np.empty(n_sessions + 1, np.float64)
    hk = np.empty(n_sessions + 1, np.int64)
    h = 0
    n_first = len(arr_t)
    na = 0
    done = 0
    while True:
        if na < n_first:
            nt, nk = arr_t[na], n + arr_row[na]
        else:
            nt, nk = inf, 2 * n
        if h > 0 and _less(ht[0], hk[0], nt, nk):
            t, i = ht[0], hk[0]
            h = _hpop(ht, hk, h)
        elif na < n_first:
            t, i = nt, nk
            na += 1
        else:
            break

        # advance(t): expiry of idle caches with f_last + ttl < t
        if t != now:
            now = t
            while x_head[0] != -1 and ef[x_head[0]] + ttl < now:
                e = x_head[0]
                _popleft(x_head, x_tail, x_nxt, x_prv, 0)
                r = _valid(es[e], ea[e], ev[e], rec_of, rec_ver, rec_pin)
                if r == -1:
                    continue
                counters[3] += 1
                counters[2] += rec_tok[r]
                _remove(r, rec_of, rec_s, rec_a, rec_tok, used, kvp_of)

        if i < n:  # completion of row i (or the instant of its rejection)
            s = sess[i]
            a = served_on[i]
            if a >= 0:  # complete(s, a, t)
                last_done[s] = now
                r = rec_of[s, a]
                rec_pin[r] = False
                rec_f[r] = now
                version += 1
                rec_ver[r] = version
                if rec_tok[r] == 0:
                    _remove(r, rec_of, rec_s, rec_a, rec_tok, used, kvp_of)
                else:
                    e = n_e
                    n_e += 1
                    ef[e], es[e], ea[e], ev[e] = now, s, a, version
                    _append_sorted(l_head, l_tail, l_nxt, l_prv, kvp_of[a], e, ef, es, ea)
                    _append_sorted(x_head, x_tail, x_nxt, x_prv, 0, e, ef, es, ea)
            if turn[i] == n_turns[i] - 1:  # depart(s, t)
                departed[s] = True
                p = holder[s]
                if p != -1:
                    holder[s] = -1
                    free[p] += 1
                    for b in range(nd):
                        if pool[b] == p:
                            open_[b] = free[p] > 0
                for b in range(nd):
                    r = rec_of[s, b]
                    if r != -1:
                        kp = kvp_of[b]
                        e = n_d
                        n_d += 1
                        df[e], ds[e], da[e], dv[e] = rec_f[r], s, b, rec_ver[r]
                        hp = heaps[kp]
                        if hsize[kp] == len(hp):
                            grown = np.empty(2 * len(hp), np.int64)
                            grown[:len(hp)] = hp
                            heaps[kp] = grown
                            hp = grown
                        hsize[kp] = _dpush(hp, hsize[kp], e, df, ds, da, dv)
            else:
                h = _hpush(ht, hk, h, t + think[i + 1], n + i + 1)
            continue

        i -= n
        s = sess[i]
        if time_decisions:  # as the Python loop: from the carbon lookup to the choice
            c0 = _rdtsc()
        if not ci_from <= t < ci_until:  # the grid row in force changes
            if not span_lo <= t < span_hi:
                return 1, t
            row_ci = np.searchsorted(sig_t, t, side="right") - 1
            cur_row = row_ci
            ci_from = sig_t[row_ci]
            ci_until = sig_t[row_ci + 1] if row_ci + 1 < len(sig_t) else span_hi
            for g in range(n_regions):
                ci_region[g] = sig_v[row_ci, g]
            for b in range(nd):
                ci[b] = ci_region[region[b]]
        k = turn[i]
        prev = prev_served[s]
        # fill_row: L(a) and the hits
        n_hits = 0
        at = i * n_m
        for b in range(nd):
            cached[b] = 0.0
            r = rec_of[s, b]
            if r != -1:
                m = model[b]
                hist = hist_f[at + m]
                L = min(float(rec_tok[r]), hist)
                if L != 0.0:
                    cached[b] = L
                    hit_a[n_hits] = b
                    hit_miss[n_hits] = hist - L
                    hit_new[n_hits] = new_f[at + m]
                    n_hits += 1
        # available(s)
        held = holder[s]
        for b in range(nd):
            avail[b] = open_[b] or pool[b] == held
        if k == 0 and code == 3:  # GAR: the home region at the session's first turn
            r0 = home_draw[s]
            best, best_free, r0_free = 0, -1, 0
            for g in range(n_regions):
                tot = 0
                for p in range(g * (n_pools // n_regions), (g + 1) * (n_pools // n_regions)):
                    tot += free[p]
                if g == r0:
                    r0_free = tot
                if tot > best_free:
                    best, best_free = g, tot
            home[s] = r0 if r0_free > 0 else best
        _energy_row(at, block, model, e_in, e_cache, e_out, de, new_f, hist_f, est_f, e_base,
                    e_unc)
        # feasibility (Eq. 7)
        status = _feasibility(i, at, nd, n_hits, hit_a, hit_miss, hit_new, ok_all, fast_all,
                              avail, v_pre, d_ttft, hist_f, new_f, model, cached, mask, value)
        best_effort = status == 1
        rejected = status == 2
        j = done
        done += 1
        c_row[j], c_disp[j] = i, t
        if rejected:
            if time_decisions:
                dec_cyc[j] = _rdtsc() - c0
            c_dep[j], c_compl[j], c_ttft[j] = -1, math.nan, math.nan
            c_rej[j] = True
            h = _hpush(ht, hk, h, t, i)
            continue

        # the decision
        a = -1
        if code == 0 or code == 1:  # Session- / Carbon-Affinity: stay on the binding
            if prev >= 0 and mask[prev] and (code == 0 or cached[prev] > 0):
                a = prev
        if code == 5 and h_j > 0:  # the horizon router: this turn's carbon + the future's
            if h_cache_survival and k > 0 and prev >= 0:
                hb = hist_f[at + model[prev]]
                if hb > 0:  # what the session found of the cache it left on prev
                    kp = kvp_of[prev]
                    h_keep[kp] = running_mean(h_keep[kp], cached[prev] / hb, h_smoothing)
            fo = h_fold[s]
            sf = h_sfold[s]  # S_k(j)'s row: the fold's, or the told session length's
            kk = min(k, h_survival.shape[1] - 1)
            fr = cur_row - h_row0
            if fr < 0 or fr >= h_fc.shape[0]:
                return 2, t
            for m in range(n_m):
                post_m[m] = hist_f[at + m] + new_f[at + m] + est_f[at + m]
            if h_option:  # would this query's context fit in each pool, no eviction?
                observe_room(h_phi, kv_cap, used, post_m[h_ref], h_smoothing)
            rho_now = h_stayed if h_online else h_rho
            if h_told_m:
                told_models(h_stay_j, h_exit_j, h_tfeas, h_tstart, h_conv[s], k, h_stay[fo])
                horizon_future(future, miss_buf, h_work, h_survival[sf, kk, :h_j], rho_now,
                               h_fc[fr, fo], h_fc_lo[fr, fo], h_fc_arg[fr, fo], post_m,
                               h_new[fo], h_out[fo], h_stay[fo], e_in, e_cache, e_out, region,
                               model, kvp_of, h_keep, n_m, h_cache_survival, h_stickiness,
                               h_fallback[fo], h_eligible[fo], h_phi, h_use_fallback, h_option,
                               mask, h_dom, h_stay_j, h_exit_j)
            elif h_return:
                if h_cache_survival:
                    observe_left(h_keep_left, left_dep[s], left_len[s], cached, kvp_of,
                                 h_smoothing)
                return_targets(ret_dep, ret_len, cached, model)
                horizon_future(future, miss_buf, h_work, h_survival[sf, kk, :h_j], rho_now,
                               h_fc[fr, fo], h_fc_lo[fr, fo], h_fc_arg[fr, fo], post_m,
                               h_new[fo], h_out[fo], h_stay[fo], e_in, e_cache, e_out, region,
                               model, kvp_of, h_keep, n_m, h_cache_survival, h_stickiness,
                               h_fallback[fo], h_eligible[fo], h_phi, h_use_fallback, h_option,
                               mask, h_dom, None, None, ret_dep, ret_len, h_keep_left)
            else:
                horizon_future(future, miss_buf, h_work, h_survival[sf, kk, :h_j], rho_now,
                               h_fc[fr, fo], h_fc_lo[fr, fo], h_fc_arg[fr, fo], post_m,
                               h_new[fo], h_out[fo], h_stay[fo], e_in, e_cache, e_out, region,
                               model, kvp_of, h_keep, n_m, h_cache_survival, h_stickiness,
                               h_fallback[fo], h_eligible[fo], h_phi, h_use_fallback, h_option,
                               mask, h_dom)
            _values(1, nd, ci, e_base, e_unc, block, de, hit_a, hit_miss, n_hits, value)  # Ĉ(a)
            if h_slot:
                slot_prices(h_price, h_pi, h_disp, h_gap, h_clock, value, ok_all[i],
                            ok_all.shape[1], avail, mask, pool, prev, t, h_slot_s,
                            h_tau[fo] * (0.5 + (residence_turns(h_survival[fo, 0, :h_j], rho_now)
                                                if h_slot_res else h_surv_sum[fo, 0])),
                            h_tau[fo] * (0.5 + (residence_turns(h_survival[sf, kk, :h_j], rho_now)
                                                if h_slot_res else h_surv_sum[sf, kk])),
                            h_slot_credit)
            priced = h_tg_slo > 0.0 and h_nu > 0.0  # ν = 0: the price is 0 everywhere
            if priced:
                _ttfts(h_ttft, nd, at, new_f, hist_f, model, cached, v_pre, mask)
                ttft_prices(h_tprice, h_tg_slo, h_nu, value, mask, h_ttft)
            if h_kvp:
                b = prev if k > 0 else -1
                if h_kv_ttl and b >= 0 and last_done[s] + ttl < t:
                    b = -1  # the cache had expired: no eviction took it
                kv_prices(h_kv_price, h_kv_evict, h_kv_loss, h_kv_evicted, h_kv_lam, b,
                          hist_f[at + model[b]] if b >= 0 else 0.0, cached, e_in, e_cache, ci,
                          post_m, model, kv_cap, used, kvp_of, mask)
            a = pick(value, future, h_price, h_tprice, h_kv_price, future, mask, h_slot, priced,
                     h_kvp, False)
        elif a == -1 and code != 3:
            a = _rank(code, pricing, nd, ci, e_base, e_unc, block, de, hit_a, hit_miss,
                      n_hits, mask, value)
            if code == 0:  # SA's tie-break: the most free slots of the pool, then the index
                n_tied = 0
                for b in range(nd):
                    if mask[b] and value[b] == value[a]:
                        n_tied += 1
                if n_tied > 1:
                    tie, best_slots = value[a], -1
                    for b in range(nd):
                        if mask[b] and value[b] == tie and free[pool[b]] > best_slots:
                            best_slots, a = free[pool[b]], b
        elif code == 3:  # GAR†: the home region's lowest base carbon, else anywhere
            r0 = home[s]
            lo = inf
            _values(2, nd, ci, e_base, e_unc, block, de, hit_a, hit_miss, n_hits, value)
            for b in range(r0 * block, (r0 + 1) * block):
                if mask[b] and value[b] < lo:
                    lo, a = value[b], b
            if a == -1:
                for b in range(nd):
                    if mask[b] and value[b] < lo:
                        lo, a = value[b], b
        if code == 4:
            g = a
            if k > 0 and prev >= 0 and g != prev and mask[prev] and cached[prev] > 0:
                c_opp[j] = True
                if gated and g_kind != 0:  # the two-branch labels: the oracle gate, labelling
                    c_sw = c_st = 0.0
                    for side in range(2):  # switch to g, stay on prev
                        a_br = g if side == 0 else prev
                        c_br, t_fail = _branch(
                            a_br, i, s, t, pricing, cached, ci, n_m, new_f,
                            hist_f, out_f, think, turn, n_turns, model, pool, region, v_pre, v_dec,
                            de, e_in, e_cache, e_out, est_f, block, ok_all, fast_all,
                            d_ttft, free, holder, n_pools, rec_of, rec_tok, rec_f, rec_ver,
                            rec_pin, used, kv_cap, kvp_of, ttl, heaps, hsize, ds, da, dv, l_head,
                            l_nxt, es, ea, ev, departed, sig_t, sig_v, span_lo, span_hi, bw)
                        if math.isnan(c_br):
                            return 1, t_fail
                        if side == 0:
                            c_sw = c_br
                        else:
                            c_st = c_br
                    if g_kind == 1:
                        adv = c_sw - c_st
                    else:  # record the opportunity; never block
                        q = l_n[0]
                        l_n[0] += 1
                        _features(l_z[q], i, g, prev, ci, ci_region, e_base, e_unc, block, de,
                                  hit_a, hit_miss, n_hits, cached, new_f, hist_f, est_f, qual,
                                  n_m, k, model, gpu, region, pool, kvp_of, used, kv_cap, free,
                                  sig_t, sig_v, t)
                        l_row[q], l_g[q], l_b[q], l_sw[q], l_st[q] = i, g, prev, c_sw, c_st
                        adv = -inf
                elif gated:
                    fo = fold[s]
                    if fold_delta[fo] == inf:
                        adv = -inf
                    else:
                        _features(z, i, g, prev, ci, ci_region, e_base, e_unc, block, de,
                                  hit_a, hit_miss, n_hits, cached, new_f, hist_f, est_f, qual,
                                  n_m, k, model, gpu, region, pool, kvp_of, used, kv_cap, free,
                                  sig_t, sig_v, t)
                        adv = _forest(fo, z, f_left, f_right, f_feature, f_threshold,
                                      f_default_left, f_tree_start, f_n_trees, f_depth,
                                      f_base) - fold_delta[fo]
                if gated and adv > delta:
                    a = prev
                    c_block[j] = True

        if time_decisions:
            dec_cyc[j] = _rdtsc() - c0
        # record and dispatch
        m = model[a]
        n_new, n_hist, n_out = new_f[at + m], hist_f[at + m], out_f[at + m]
        cached_a = cached[a]
        ttft = (n_new + n_hist - cached_a) / v_pre[a]
        done_at = t + ttft + n_out / v_dec[a]
        c_dep[j], c_compl[j], c_cached[j], c_ttft[j] = a, done_at, cached_a, ttft
        c_be[j] = best_effort
        c_switch[j] = prev >= 0 and a != prev
        served_on[i] = a
        # dispatch(s, a, t, context)
        ctx_tok = np.int64(n_hist + n_new + n_out)
        p = pool[a]
        old = holder[s]
        if old != p:
            if old != -1:
                free[old] += 1
                for b in range(nd):
                    if pool[b] == old:
                        open_[b] = free[old] > 0
            free[p] -= 1
            for b in range(nd):
                if pool[b] == p:
                    open_[b] = free[p] > 0
            holder[s] = p
        version += 1
        r = rec_of[s, a]
        if r == -1:
            r = n_rec
            n_rec += 1
            rec_of[s, a] = r
            rec_s[r], rec_a[r], rec_tok[r], rec_f[r] = s, a, 0, now
        rec_pin[r] = True
        rec_ver[r] = version
        counters[6] += 1
        dlt = ctx_tok - rec_tok[r]
        kp = kvp_of[a]
        if dlt > 0:
            missing = dlt - (kv_cap[kp] - used[kp])
            if missing > 0:
                freed = _evict(kp, missing, heaps, hsize, df, ds, da, dv, l_head, l_tail,
                               l_nxt, l_prv, es, ea, ev, rec_of, rec_ver, rec_pin, rec_tok,
                               rec_s, rec_a, used, kvp_of, departed, counters)
                if freed < missing:
                    counters[4] += 1
                    counters[5] += missing - freed
                    dlt -= missing - freed
        rec_tok[r] += dlt
        used[kp] += dlt
        if code == 5 and h_j > 0:
            if h_tg_slo > 0.0:
                h_nu = ttft_dual(h_nu, ttft, h_tg_slo, h_tg_share, h_tg_step)
            if k > 0 and prev >= 0:  # on_served: how often the router keeps a session
                h_stayed = running_mean(h_stayed, 1.0 if a == prev else 0.0, h_smoothing)
            if h_kvp:  # the tokens the chosen turn evicted, for λ_p
                kv_evicted(h_kv_evicted, h_kv_lam, h_kv_loss, kvp_of[a], h_kv_evict[a])
            if h_return:  # the caches the session leaves behind now
                leave(left_dep[s], left_len[s], ret_dep, ret_len, a)
            if h_release and prev >= 0 and prev != a:  # drop the cache left behind
                r2 = rec_of[s, prev]
                if r2 != -1:
                    counters[7] += 1
                    counters[8] += rec_tok[r2]
                    _remove(r2, rec_of, rec_s, rec_a, rec_tok, used, kvp_of)
        prev_served[s] = a
        h = _hpush(ht, hk, h, done_at, i)
    return 0, 0.0


@njit(cache=True)
def _evict(p, missing, heaps, hsize, df, ds, da, dv, l_head, l_tail, l_nxt, l_prv, es, ea, ev,
           rec_of, rec_ver, rec_pin, rec_tok, rec_s, rec_a, used, kvp_of, departed, counters):
    """Backend._evict: free up to ``missing`` tokens of KV pool p, departed sessions' caches
    first, then the live LRU list; victims trimmed from their suffix."""
    freed = 0
    removed = 0
    heap = heaps[p]
    while freed < missing and hsize[p] > 0:
        e = heap[0]
        r = _valid(ds[e], da[e], dv[e], rec_of, rec_ver, rec_pin)
        if r == -1:
            hsize[p] = _dpop(heap, hsize[p], df, ds, da, dv)
            continue
        take = min(rec_tok[r], missing - freed)
        rec_tok[r] -= take
        freed += take
        if rec_tok[r] == 0:
            hsize[p] = _dpop(heap, hsize[p], df, ds, da, dv)
            removed += 1
            _remove(r, rec_of, rec_s, rec_a, rec_tok, used, kvp_of)
    while freed < missing and l_head[p] != -1:
        e = l_head[p]
        s = es[e]
        r = _valid(s, ea[e], ev[e], rec_of, rec_ver, rec_pin)
        if r == -1 or departed[s]:
            _popleft(l_head, l_tail, l_nxt, l_prv, p)
            continue
        take = min(rec_tok[r], missing - freed)
        rec_tok[r] -= take
        freed += take
        if rec_tok[r] == 0:
            _popleft(l_head, l_tail, l_nxt, l_prv, p)
            removed += 1
            _remove(r, rec_of, rec_s, rec_a, rec_tok, used, kvp_of)
    used[p] -= freed
    counters[0] += freed
    counters[1] += removed
    return freed


@njit(cache=True)
def _features(z, i, g, b, ci, ci_region, e_base, e_unc, block, de, hit_a, hit_miss, n_hits,
              cached, new_f, hist_f, est_f, qual, n_m, k, model, gpu, region, pool, kvp_of, used,
              kv_cap, free, sig_t, sig_v, t):
    """gate.gate_features for the switch opportunity (g, b) of row i (same values)."""
    # E(a), CI·E(a) and CI·E_base(a) at g and b
    e_g = e_unc[g % block]
    e_b = e_unc[b % block]
    for jh in range(n_hits):
        if hit_a[jh] == g:
            e_g = de[g] * hit_miss[jh] + e_base[g % block]
        if hit_a[jh] == b:
            e_b = de[b] * hit_miss[jh] + e_base[b % block]
    c_g, c_b = ci[g] * e_g, ci[b] * e_b
    cb_g, cb_b = ci[g] * e_base[g % block], ci[b] * e_base[b % block]
    mb, mg = model[b], model[g]
    at = i * n_m
    hist_b, hist_g = hist_f[at + mb], hist_f[at + mg]
    rb, rg = region[b], region[g]
    kb, kg = kvp_of[b], kvp_of[g]
    # the intensity an hour earlier (not before the signal's start)
    te = max(t - _HOUR_S, sig_t[0])
    row = np.searchsorted(sig_t, te, side="right") - 1
    z[0], z[1], z[2] = c_g, c_b, c_b - c_g
    z[3], z[4] = cb_g, cb_b
    z[5], z[6], z[7] = e_g, e_b, e_b - e_g
    z[8], z[9], z[10] = hist_b, new_f[at + mb], est_f[at + mb]
    z[11] = k
    z[12] = cached[b] / hist_b if hist_b > 0 else 0.0
    z[13] = cached[g] / hist_g if hist_g > 0 else 0.0
    z[14] = used[kb] / float(kv_cap[kb])
    z[15] = used[kg] / float(kv_cap[kg])
    z[16], z[17] = free[pool[b]], free[pool[g]]
    z[18], z[19] = ci_region[rb], ci_region[rg]
    z[20] = ci_region[rb] - sig_v[row, rb]
    z[21] = ci_region[rg] - sig_v[row, rg]
    z[22] = (t % 86400.0) / _HOUR_S
    z[23] = 1.0 if mb != mg else 0.0
    z[24] = 1.0 if gpu[b] != gpu[g] else 0.0
    z[25] = 1.0 if rb != rg else 0.0
    z[26], z[27] = qual[i, mb], qual[i, mg]


@dataclass(frozen=True)
class ReplayInfo:
    """What a policy's compiled rule may need to know of the replay
    (:meth:`carbonrouter_lib.policies.Policy.compiled`).

    Attributes
    ----------
    sessions : ndarray of int64
        The sessions' ids in order (the loop numbers them 0, 1, … in this order).
    conversations : ndarray of int64
        Each session's conversation (copies of a conversation share it).
    n_regions : int
        Regions of the setting.
    signal : CarbonSignal
        The replay's carbon signal.
    span_s : tuple of float
        (first arrival, a time the replay is expected to end before), s since the Unix epoch:
        what precomputed forecasts must cover (the loop stops with status 2 past them and
        :func:`carbonrouter_lib.simulator.simulate` retries with a longer span).
    """

    sessions: np.ndarray
    conversations: np.ndarray
    n_regions: int
    signal: Any
    span_s: tuple[float, float]


def rule(name: str, **params) -> dict:
    """The compiled decision rule ``name`` (a :data:`CODES` key) with its parameters, as the
    keyword arrays of the loop; a built-in policy's :meth:`~carbonrouter_lib.policies.Policy.
    compiled` returns it. ``params``: ``pricing``, ``gated``, ``delta`` (CarbonRouter),
    ``home_draw`` (GAR†'s drawn region per session), the learned gate's ``fold``,
    ``fold_delta`` and forest arrays (:meth:`carbonrouter_lib.gate.LearnedGate.compiled`), and
    ``g_kind`` (:data:`GATE_KINDS`) with the labelling's output arrays ``l_*``
    (:meth:`carbonrouter_lib.gate.TwoBranchLabeler.compiled`)."""
    if name not in CODES:
        raise ValueError(f"kernel.rule: no compiled rule {name!r}; one of {sorted(CODES)}")
    one = np.zeros((1, 1), np.int64)
    spec = dict(code=CODES[name], pricing=True, gated=False, delta=0.0,
                home_draw=np.zeros(1, np.int64), fold=np.zeros(1, np.int64),
                fold_delta=np.zeros(1), f_left=one, f_right=one, f_feature=one,
                f_threshold=np.zeros((1, 1), np.float32),
                f_default_left=np.zeros((1, 1), np.bool_), f_tree_start=one,
                f_n_trees=np.zeros(1, np.int64), f_depth=np.zeros(1, np.int64),
                f_base=np.zeros(1, np.float32), g_kind=0, l_row=np.zeros(1, np.int64),
                l_g=np.zeros(1, np.int64), l_b=np.zeros(1, np.int64), l_z=np.zeros((1, 28)),
                l_sw=np.zeros(1), l_st=np.zeros(1), l_n=np.zeros(1, np.int64),
                h_j=0, h_online=True, h_rho=1.0, h_smoothing=0.05, h_cache_survival=True,
                h_stickiness=True, h_release=False, h_survival=np.zeros((1, 1, 1)),
                h_new=np.zeros((1, 1)), h_out=np.zeros((1, 1)), h_stay=np.ones((1, 1)),
                h_keep0=1.0, h_fc=np.zeros((1, 1, 1, 1)), h_row0=0,
                h_fold=np.zeros(1, np.int64), h_sfold=np.zeros(1, np.int64), h_slot=False,
                h_slot_s=0.01, h_surv_sum=np.zeros((1, 1)), h_tau=np.zeros(1), h_slot_res=False,
                h_slot_credit=True, h_fallback=np.zeros((1, 1, 1)),
                h_eligible=np.ones((1, 1), np.bool_), h_use_fallback=False, h_option=False,
                h_ref=0, h_tg_slo=0.0, h_tg_share=0.05, h_tg_step=0.05, h_told_m=False,
                h_tfeas=np.zeros((1, 1), np.bool_), h_tstart=np.zeros(2, np.int64),
                h_conv=np.zeros(1, np.int64), h_return=False, h_kvp=False,
                h_kv_ttl=False)
    unknown = set(params) - set(spec)
    if unknown:
        raise ValueError(f"kernel.rule: unknown parameters {sorted(unknown)}")
    spec.update(params)
    return spec


def replay(arrays: dict) -> tuple[int, float]:
    """Run the compiled loop on the arrays ``simulator.simulate`` prepared (the keyword names of
    :func:`_replay`); returns (status, time): status 1 when the carbon signal does not cover
    the dispatch ``time`` (s)."""
    if len(arrays["sess"]) >= 2**30:
        raise ValueError(f"kernel.replay: {len(arrays['sess'])} queries; the compiled loop "
                         f"indexes rows and cache versions (up to two per row) with int32, so "
                         f"a replay holds fewer than 2**30 queries")
    status, t = _replay(**arrays)
    return int(status), float(t)
