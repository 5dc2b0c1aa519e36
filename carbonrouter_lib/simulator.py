"""Trace-driven replay of a prepared workload against the emulated backend (docs/model.md §4–§6).

The simulator owns time. Each session's first turn is sent at its arrival; each later turn a think
time after the previous turn's response completes, so dispatch d = max(t, f_prev) = t. At dispatch
the simulator asks the backend for L(a) and availability, builds the query's context over every
deployment, lets the policy choose, and accounts realized energy and carbon with the intensity at
dispatch (Eq. 4–5, realized output length); the turn completes at f = d + TTFT(a) + N_out / v_dec.
At equal times completions (and departures) are processed before dispatches (§6a.9).
"""

from __future__ import annotations

import array
import heapq
import math
import platform
from dataclasses import dataclass
from time import perf_counter_ns

import numpy as np
import pandas as pd

from carbonrouter_lib import cost, kernel, prepared
from carbonrouter_lib.backend import Backend, BackendConfig
from carbonrouter_lib.carbon import CarbonSignal
from carbonrouter_lib.deployments import Deployments
from carbonrouter_lib.policies import (
    Candidates,
    Policy,
    QueryBatch,
    QueryContext,
    feasibility,
    make_policy,
)
from carbonrouter_lib.profiles import MODELS
from carbonrouter_lib.setting import SimulationConfig, backend_config, setting

__all__ = [
    "SimulationResult",
    "simulate",
    "check_table",
]


@dataclass
class SimulationResult:
    """The outcome of one replay: per-query records (metrics.RECORD_COLUMNS) and provenance.

    ``decision_ns``: with ``simulate(..., time_decisions=True)``, the time of each query's
    decision in ns, in the records' (dispatch) order; None otherwise.
    """

    records: pd.DataFrame
    policy: str
    params: dict
    backend: dict
    counters: dict
    decision_ns: np.ndarray | None = None


#: The record columns the replay loop writes (the table row, then what only the replay knows),
#: with their dtypes and ``array`` type codes; the rest is computed from them after the loop.
_LOOP_FIELDS: tuple[tuple[str, type, str], ...] = tuple(
    (name, dtype, {np.int64: "q", np.float64: "d", np.bool_: "B"}[dtype])
    for name, dtype in (
        ("row", np.int64), ("deployment", np.int64), ("dispatch_s", np.float64),
        ("completion_s", np.float64), ("cached_tokens", np.float64), ("ttft_s", np.float64),
        ("best_effort", np.bool_), ("rejected", np.bool_), ("switched", np.bool_),
        ("switch_opportunity", np.bool_), ("gate_blocked", np.bool_),
    )
)


def _deployment_index(a: object, policy: Policy, row: int) -> int:
    """A policy's choice as a deployment index, or a clear error (None, a float, a bool …)."""
    if isinstance(a, int | np.integer) and not isinstance(a, bool | np.bool_):
        return int(a)
    shown = a.item() if isinstance(a, np.generic) else a
    raise TypeError(f"{type(policy).__name__}.choose returned {shown!r} ({type(a).__name__}) for "
                    f"row {row}: it must return a deployment index (an int with cand.mask[a])")


def check_table(table: pd.DataFrame) -> None:
    """Check that ``table`` can be replayed: the columns the simulator reads, integer session
    ids ≥ 0 and turns 0, 1, 2, … grouped by session, ``n_turns`` per session, finite arrival
    times in seconds (not milliseconds) and think times ≥ 0 s. ``ValueError`` naming the
    column and the first bad row (token counts and quality are checked by
    :class:`~carbonrouter_lib.policies.QueryBatch`)."""
    if not isinstance(table, pd.DataFrame):
        raise TypeError(f"simulate: table must be a pandas DataFrame (a prepared workload), got "
                        f"{type(table).__name__}")
    missing = [c for c in ("session", "turn", "n_turns", "arrival_s", "think_s")
               if c not in table.columns]
    if missing:
        raise ValueError(f"simulate: the table lacks columns {missing} (a prepared workload: "
                         f"carbonrouter_lib.prepared)")
    if len(table) == 0:
        raise ValueError("simulate: the table is empty")
    for col in ("session", "turn", "n_turns"):
        values = table[col]
        if not pd.api.types.is_integer_dtype(values.dtype):
            bad = next((i for i, v in enumerate(values.tolist())
                        if isinstance(v, bool) or not isinstance(v, int | np.integer)), 0)
            raise ValueError(f"simulate: column {col!r} must hold integers, got dtype "
                             f"{values.dtype} (row {bad}: {values.iloc[bad]!r})")
        neg = np.flatnonzero(values.to_numpy() < 0)
        if neg.size:
            raise ValueError(f"simulate: column {col!r} has negative values ({neg.size} rows; "
                             f"first row {int(neg[0])}: {int(values.iloc[neg[0]])})")
    session = table["session"].to_numpy(np.int64)
    turn = table["turn"].to_numpy(np.int64)
    n_turns = table["n_turns"].to_numpy(np.int64)
    same = np.diff(session) == 0
    if not (np.all(np.diff(session) >= 0) and np.all(turn[1:][same] == turn[:-1][same] + 1)):
        raise ValueError("table rows must be grouped by session with turns 0, 1, 2, … in order")
    first_row = np.flatnonzero(turn == 0)
    if first_row.size == 0 or first_row[0] != 0:
        raise ValueError("table must start with a session's turn 0 (rows grouped by session)")
    rows_per_session = np.diff(np.append(first_row, len(table)))
    bad = np.flatnonzero(n_turns[first_row] != rows_per_session)
    if bad.size:
        s0 = int(session[first_row[bad[0]]])
        raise ValueError(f"session {s0}: n_turns = {int(n_turns[first_row[bad[0]]])} but it has "
                         f"{int(rows_per_session[bad[0]])} rows ({bad.size} sessions disagree)")
    arrival = table["arrival_s"].to_numpy(np.float64)[first_row]
    if not np.isfinite(arrival).all():
        r = int(first_row[~np.isfinite(arrival)][0])
        raise ValueError(f"row {r} (session {int(session[r])}, turn 0): arrival_s is not finite")
    if (arrival > 1e11).any():  # 1e11 s is the year 5138; 1e11 ms is 1973
        r = int(first_row[np.argmax(arrival > 1e11)])
        raise ValueError(f"row {r} (session {int(session[r])}): arrival_s = "
                         f"{table['arrival_s'].iloc[r]:.0f} looks like milliseconds; arrival_s "
                         f"is seconds since the Unix epoch")
    think = table["think_s"].to_numpy(np.float64)
    bad_think = ~np.isfinite(think) | (think < 0)
    if bad_think.any():
        r = int(np.argmax(bad_think))
        raise ValueError(f"row {r} (session {int(session[r])}, turn {int(turn[r])}): think_s = "
                         f"{float(think[r])!r}; think times must be finite and ≥ 0 s "
                         f"({int(bad_think.sum())} rows)")


def _token_matrix(table: pd.DataFrame, quantity: str) -> np.ndarray:
    """:func:`prepared.model_matrix` of a token count, int32 when the table's counts are
    integers that fit (half the memory of float64 at service scale; every use converts them
    exactly), else float64."""
    m = prepared.model_matrix(table, quantity)
    info = np.iinfo(np.int32)
    if np.issubdtype(m.dtype, np.integer) and (m.size == 0 or (info.min <= m.min()
                                                               and m.max() <= info.max)):
        return m.astype(np.int32)
    return m.astype(np.float64)


def _records(rec: dict[str, np.ndarray], table: pd.DataFrame, deps: Deployments,
             signal: CarbonSignal, new: np.ndarray, hist: np.ndarray, out: np.ndarray,
             est: np.ndarray, qual: np.ndarray) -> pd.DataFrame:
    """The records table (metrics.RECORD_COLUMNS, dispatch order) from what the loop wrote: the
    realized energy (Eq. 4, realized output) and carbon with the intensity at dispatch (Eq. 5),
    the router's estimates Ĉ(a) = CI·E(a) (Eq. 4 with the estimated output, in QueryBatch's
    regrouped form so that they equal what the policy saw), the recomputation energy, quality
    and whether the region was the cleanest. Vectorized over queries: the same IEEE operations
    in the same order as per query, so the values are those a per-query computation gives."""
    row, dep = rec["row"], rec["deployment"]
    served = dep >= 0
    a = np.maximum(dep, 0)
    m = deps.model[a]
    n_new, n_hist, n_out = new[row, m], hist[row, m], out[row, m]
    cached = rec["cached_tokens"]
    e_in, e_cache, e_out = deps.e_in[a], deps.e_cache[a], deps.e_out[a]
    energy = np.where(served, cost.energy_kwh(e_in, e_cache, e_out, n_new, n_hist, cached,
                                              n_out), 0.0)
    ci_all = signal.at(rec["dispatch_s"])
    ci = ci_all[np.arange(len(a)), deps.region[a]]
    missed = n_hist - cached
    e_base = cost.energy_base_kwh(e_in, e_cache, e_out, n_new, n_hist, est[row, m])
    est_energy = np.where(served, cost.energy_from_base_kwh(e_base, e_in - e_cache, missed), 0.0)
    big = MODELS.index("Llama-3.1-70B")
    # copy=False: one block per column instead of stacking them (a copy of every column)
    return pd.DataFrame({
        "session": table["session"].to_numpy(np.int64)[row],
        "turn": table["turn"].to_numpy(np.int64)[row],
        "n_turns": table["n_turns"].to_numpy(np.int64)[row],
        "deployment": dep, "dispatch_s": rec["dispatch_s"], "completion_s": rec["completion_s"],
        # a rejected query's history is counted in the 70B's tokens
        "history_tokens": np.where(served, n_hist, hist[row, big]).astype(np.float64),
        "cached_tokens": cached, "energy_kwh": energy, "carbon_g": ci * energy,
        "est_energy_kwh": est_energy, "est_carbon_g": ci * est_energy,
        "recompute_energy_kwh": np.where(
            served, cost.recomputation_energy_kwh(e_in, e_cache, n_hist, cached), 0.0),
        "ttft_s": rec["ttft_s"], "quality": np.where(served, qual[row, m], np.nan),
        "best_effort": rec["best_effort"], "rejected": rec["rejected"],
        "in_cleanest_region": served & (ci <= ci_all.min(axis=1)),
        "switched": rec["switched"], "switch_opportunity": rec["switch_opportunity"],
        "gate_blocked": rec["gate_blocked"],
    }, copy=False)


def simulate(
    table: pd.DataFrame,
    policy: Policy | str,
    config: SimulationConfig | None = None,
    signal: CarbonSignal | None = None,
    backend: BackendConfig | None = None,
    progress: bool = False,
    time_decisions: bool = False,
    profiles=None,
    engine: str = "auto",
) -> SimulationResult:
    """Replay the prepared workload ``table`` under ``policy`` (docs/model.md §4–§7).

    Parameters
    ----------
    table
        A prepared workload (:func:`carbonrouter_lib.prepared.prepare_workload`, or
        :func:`carbonrouter_lib.prepared.from_turns` for a trace of one's own).
    policy
        A policy object, a registry name (:data:`carbonrouter_lib.policies.POLICIES`) or an
        import name ``"package.module:Class"`` (:func:`carbonrouter_lib.policies.policy_class`),
        ready to route: a policy that learns from the workload (CarbonRouter's learned or oracle
        gate, the horizon router's model) must be built first
        (:func:`carbonrouter_lib.build.build_policy`; ``experiments.run_policies`` and the
        sweeps do it), else ``ValueError``. The replay trains nothing.
    config
        The setting (regions, carbon year, capacity factor, constraints, κ, γ). Default:
        :class:`SimulationConfig()`, with the regions of ``signal`` when one is given.
    signal
        Carbon signal covering the replay (default: built from ``config``; its regions must be
        ``config.regions`` in order), e.g. :meth:`CarbonSignal.from_csv` of one's own files.
    backend
        Capacity (default :func:`backend_config` of the table).
    progress
        Show a tqdm progress bar over queries.
    time_decisions
        Time every decision (carbon lookup, the backend's state, context, feasibility and the
        policy's choice) into ``decision_ns`` (for benchmarks; see ``engine``).
    profiles
        Profiles of one's own in place of ``config``'s (a DataFrame, a CSV path or a
        :class:`~carbonrouter_lib.profiles.ProfileTable`; see :attr:`SimulationConfig.profiles`):
        the replay and its capacity use them. None: ``config``'s.
    engine
        ``"auto"`` (default): the compiled loop (:mod:`carbonrouter_lib.kernel`) for the
        built-in policies it knows (Session-Affinity, Carbon-Affinity, GAR†, FairCarbon,
        CarbonRouter without a gate or with its learned or oracle gate, the gate's two-branch
        labelling, the horizon router), the Python
        loop otherwise. ``"python"``: always the Python loop (the reference; any policy and its
        hooks). ``"compiled"``: the compiled loop, or ``ValueError`` when it cannot replay the
        policy. Both give identical records and counters. ``time_decisions`` times the
        decisions of the loop that runs (the compiled loop's with the x86-64 time-stamp
        counter, calibrated to ns over the replay).

    Returns
    -------
    SimulationResult
        ``records``: one row per query in dispatch order (columns of
        :data:`carbonrouter_lib.metrics.RECORD_COLUMNS`, plus ``policy``).

    Notes
    -----
    Speed: what does not depend on dispatch is computed for all queries at once
    (:class:`carbonrouter_lib.policies.QueryBatch`); the per-query path is either compiled
    (``engine``) or scalar Python over lists and typed arrays plus a few numpy calls over the n
    deployments. ``benchmarks/bench_simulator.py`` and ``benchmarks/bench_scale.py`` measure it.
    After a compiled replay a policy's per-session counters (CarbonRouter's ``opportunities``
    and ``blocked``) are those the Python loop leaves; its ``last_*`` attributes are not set.
    """
    if engine not in ("auto", "python", "compiled"):
        raise ValueError(f"simulate: engine must be 'auto', 'python' or 'compiled', got "
                         f"{engine!r}")
    if engine != "python" and time_decisions and not kernel.TIMES_DECISIONS:
        if engine == "compiled":
            raise ValueError(f"simulate: the compiled loop times decisions with the x86-64 "
                             f"time-stamp counter; on {platform.machine()} use "
                             f"engine='python' with time_decisions")
        engine = "python"
    config = setting(config, signal, profiles)
    policy = make_policy(policy) if isinstance(policy, str) else policy
    if not isinstance(policy, Policy):
        raise TypeError(f"simulate: policy must be a Policy or a registry name, got "
                        f"{type(policy).__name__}")
    if type(policy).choose is Policy.choose:
        raise TypeError(f"{type(policy).__name__} does not implement choose(ctx, cand)")
    problem = policy.unready()
    if problem is not None:
        raise ValueError(f"simulate: {policy.name or type(policy).__name__} is not ready to route "
                         f"({problem}): build it first with carbonrouter_lib.build.build_policy("
                         f"policy, table, config) — experiments.run_policies and the sweeps do")
    check_table(table)
    deps = config.deployments()
    signal = config.signal(signal)
    backend_cfg = backend or backend_config(table, config)
    be = Backend(deps, backend_cfg)
    constraints = config.constraints()

    n = len(table)
    session = table["session"].to_numpy(dtype=np.int64)
    turn = table["turn"].to_numpy(dtype=np.int64)
    n_turns = table["n_turns"].to_numpy(dtype=np.int64)
    arrival = table["arrival_s"].to_numpy(dtype=np.float64)
    think = table["think_s"].to_numpy(dtype=np.float64)
    new, hist, out, est = (_token_matrix(table, q) for q in (
        "new_tokens", "history_tokens", "output_tokens", "est_output_tokens"))
    qual = prepared.model_matrix(table, "quality").astype(np.float64)
    first_row = np.flatnonzero(turn == 0)
    # sessions' first turns in time order (ties by row): the arrivals both loops merge in
    first_order = np.lexsort((first_row, arrival[first_row]))
    # Everything of Eq. 4–7 that does not depend on dispatch, for all queries at once.
    conversation = prepared.conversation_codes(table)
    batch = QueryBatch(deps, new, hist, est, qual, constraints, conversation=conversation)

    def replay_info(span_s: tuple[float, float]) -> kernel.ReplayInfo:
        return kernel.ReplayInfo(sessions=session[first_row],
                                 conversations=conversation[first_row],
                                 n_regions=len(deps.regions), signal=signal, span_s=span_s)

    spec = None
    if engine != "python":
        spec = policy.compiled(replay_info(_span(table, signal)))
        if spec is None and engine == "compiled":
            raise ValueError(f"simulate: the compiled loop cannot replay {policy!r} (it knows "
                             f"{sorted(kernel.CODES)} and CarbonRouter's learned and oracle "
                             f"gates); use engine='python'")
    if spec is not None:
        loop_arrays = dict(
            sess=np.cumsum(turn == 0) - 1,  # sessions 0, 1, … in row order (see below)
            turn=turn, n_turns=n_turns, think=think, n_sessions=len(first_row),
            new_f=new.ravel(), hist_f=hist.ravel(), out_f=out.ravel(), est_f=est.ravel(),
            qual=qual, n_m=new.shape[1], arr_t=arrival[first_row][first_order],
            arr_row=first_row[first_order])
        rec, counters, dec_ns = _replay_compiled(
            spec, loop_arrays, replay_info, table, deps, batch, signal, be, backend_cfg,
            constraints, policy, progress, time_decisions)
        del batch, loop_arrays  # freed before the records are built (a large replay's peak)
        return _result(rec, table, deps, signal, new, hist, out, est, qual, conversation,
                       policy, backend_cfg, counters, dec_ns)

    # The loop reads scalars: Python lists and typed arrays are much faster to index, and
    # Python floats to do arithmetic on, than numpy scalars (the values, and so the results,
    # are the same). Per-model values are flat (row i, model m at i·n_models + m).
    session_l, turn_l, n_turns_l = session.tolist(), turn.tolist(), n_turns.tolist()
    think_l = think.tolist()
    n_m = new.shape[1]
    new_l, hist_l, out_l = (array.array("d", x.astype(np.float64).tobytes())
                            for x in (new, hist, out))
    v_pre, v_dec = deps.v_pre.tolist(), deps.v_dec.tolist()
    model_of, n_dep = deps.model.tolist(), deps.n
    ctx, cand = QueryContext(deps), Candidates(deps.n)
    ctx.backend, ctx.signal = be, signal

    # What only the replay knows, one typed array per column (_LOOP_FIELDS), in dispatch order:
    # stores convert to machine values at once, and the arrays become numpy columns without a
    # copy. Energy, carbon and the other record columns follow from them after the loop.
    cols = {name: array.array(code, bytes(n * np.dtype(dtype).itemsize))
            for name, dtype, code in _LOOP_FIELDS}
    (c_row, c_dep, c_disp, c_compl, c_cached, c_ttft, c_be, c_rej, c_switch, c_opp,
     c_block) = cols.values()
    served_on = [-1] * n  # deployment of each served row
    dec_ns = np.full(n, -1, np.int64) if time_decisions else None
    prev_served = {}  # session -> deployment of its previous served turn
    reports = policy.reports_opportunities
    opportunity = policy.switch_opportunity
    releases = policy.releases_caches
    # Carbon intensity: the grid row in force ([ci_from, ci_until), s).
    ci_from, ci_until = math.inf, -math.inf
    heappush, heappop = heapq.heappush, heapq.heappop
    ttft_s = cost.ttft_s
    fill_row, choose = ctx.fill_row, policy.choose
    session_caches, available, free_slots = be.session_caches, be.available, be.free_slots
    slots_now = free_slots(copy=False)  # the backend's own array, read during each decision

    # Event heap: (time, key) with key = row for the completion of a row and n + row for its
    # dispatch, so that at equal times completions and departures come first (§6a.9) and rows
    # break the remaining ties: the order of (time, kind, row) with 2-tuples, faster to compare.
    # Sessions' first turns are merged in from a sorted list rather than kept in the heap, so
    # the heap holds only what is in flight (about the active sessions).
    arrivals = list(zip(arrival[first_row][first_order].tolist(),
                        (n + first_row[first_order]).tolist(), strict=True))
    arrivals.append((math.inf, 2 * n))  # sentinel
    next_arrival = arrivals[0]
    n_arrived = 0
    events: list[tuple[float, int]] = []
    done = 0
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=n, desc=f"replay {policy.name}", unit="query", mininterval=1.0)
    while True:
        if events and events[0] < next_arrival:
            t, i = heappop(events)
        elif n_arrived < len(first_order):
            t, i = next_arrival
            n_arrived += 1
            next_arrival = arrivals[n_arrived]
        else:
            break
        if i < n:  # completion of row i (or the instant of its rejection)
            s = session_l[i]
            a = served_on[i]
            if a >= 0:
                be.complete(s, a, t)
            if turn_l[i] == n_turns_l[i] - 1:
                be.depart(s, t)
                policy.on_session_end(s)
            else:
                heappush(events, (t + think_l[i + 1], n + i + 1))
            continue
        i -= n
        s = session_l[i]

        be.advance(t)
        if time_decisions:
            t_dec = perf_counter_ns()
        if not ci_from <= t < ci_until:  # the intensity changes once per grid step
            ci_from, ci_until = signal.row_interval(signal.row_index(t))
            ctx.set_ci(signal.at(t))
        k = turn_l[i]
        prev = prev_served.get(s, -1)
        fill_row(batch, i, session=s, turn=k, prev=prev, cached=session_caches(s),
                 available=available(s), free_slots=slots_now, time_s=t)
        if k == 0:
            policy.on_session_start(ctx)
        feasibility(ctx, constraints, out=cand)
        j = done  # the query's place in dispatch order
        done += 1
        c_row[j], c_disp[j] = i, t
        if cand.rejected:
            if time_decisions:
                dec_ns[j] = perf_counter_ns() - t_dec
            # (columns start zeroed: only the nonzero values are written). A rejected query
            # never completes; its session goes on from the instant of the rejection.
            c_dep[j], c_compl[j], c_ttft[j] = -1, math.nan, math.nan
            c_rej[j] = True
            heappush(events, (t, i))
        else:
            a = choose(ctx, cand)
            if time_decisions:
                dec_ns[j] = perf_counter_ns() - t_dec
            if a.__class__ is not int:
                a = _deployment_index(a, policy, i)
            if not (0 <= a < n_dep and cand.mask[a]):
                raise RuntimeError(f"{policy.name} chose {a}, not a candidate (row {i})")
            policy.on_served(ctx, a)
            im = i * n_m + model_of[a]
            n_new, n_hist, n_out = new_l[im], hist_l[im], out_l[im]
            cached = float(ctx.cached[a])
            ttft = ttft_s(n_new, n_hist, cached, v_pre[a])
            done_at = t + ttft + n_out / v_dec[a]
            c_dep[j], c_compl[j], c_cached[j], c_ttft[j] = a, done_at, cached, ttft
            c_be[j] = cand.best_effort
            c_switch[j] = prev >= 0 and a != prev
            if reports:
                g = opportunity()
                if g >= 0:
                    c_opp[j] = True
                    c_block[j] = a == prev and g != prev
            served_on[i] = a
            be.dispatch(s, a, t, int(n_hist + n_new + n_out))
            if releases:
                for b in policy.released(ctx, a):
                    be.release(s, b, t)
            prev_served[s] = a
            heappush(events, (done_at, i))
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    if done != n:
        raise RuntimeError(f"replay dispatched {done} of {n} queries")

    rec = {name: np.frombuffer(cols[name], dtype=dtype) for name, dtype, _ in _LOOP_FIELDS}
    return _result(rec, table, deps, signal, new, hist, out, est, qual, conversation, policy,
                   backend_cfg, be.counters(), dec_ns)


def _replay_compiled(spec: dict, loop_arrays: dict[str, np.ndarray], replay_info,
                     table: pd.DataFrame, deps: Deployments, batch: QueryBatch,
                     signal: CarbonSignal, be: Backend, backend_cfg: BackendConfig,
                     constraints, policy: Policy, progress: bool, time_decisions: bool
                     ) -> tuple[dict[str, np.ndarray], dict[str, int], np.ndarray | None]:
    """The replay by :mod:`carbonrouter_lib.kernel`: the loop columns and the backend's
    counters (the same as the Python loop's), and each decision's time in ns with
    ``time_decisions`` (time-stamp-counter cycles, calibrated against ``perf_counter_ns``
    over the replay). ``loop_arrays``: the table's arrays as the loop reads them (sessions
    numbered 0, 1, … in row order: rows are grouped by session with ids ascending
    (check_table), so the numbering keeps the order of ids the backend breaks ties by);
    ``replay_info(span_s)``: the :class:`kernel.ReplayInfo` asked of the policy."""
    n = len(table)
    rec = {name: np.zeros(n, dtype) for name, dtype, _ in _LOOP_FIELDS}
    counters = np.zeros(len(kernel.COUNTERS), np.int64)
    span_lo, span_hi = signal._span_s
    arrays = dict(
        **loop_arrays,
        ok_all=batch.ok_block, fast_all=batch.fast_block, block=batch.block,
        model=deps.model.astype(np.int64), pool=np.asarray(deps.pool, np.int64),
        region=deps.region.astype(np.int64), gpu=deps.gpu.astype(np.int64),
        v_pre=deps.v_pre.astype(np.float64), v_dec=deps.v_dec.astype(np.float64),
        de=(deps.e_in - deps.e_cache).astype(np.float64), e_in=deps.e_in.astype(np.float64),
        e_cache=deps.e_cache.astype(np.float64), e_out=deps.e_out.astype(np.float64),
        n_regions=len(deps.regions),
        n_pools=deps.n_pools, d_ttft=float(constraints.d_ttft_s),
        slots=backend_cfg.slots_per_pool, kvp_of=be.kv_pool_of(), kv_cap=be.kv_capacities(),
        ttl=backend_cfg.ttl_s,
        sig_t=signal._t_s, sig_v=signal._values, span_lo=float(span_lo), span_hi=float(span_hi),
        **spec,
        **{f"c_{k}": rec[name] for k, name in zip(
            ("row", "dep", "disp", "compl", "cached", "ttft", "be", "rej", "switch", "opp",
             "block"), (f[0] for f in _LOOP_FIELDS), strict=True)},
        counters=counters, time_decisions=time_decisions,
        dec_cyc=np.full(n if time_decisions else 1, -1, np.int64),
    )
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=n, desc=f"replay {policy.name} (compiled)", unit="query")
    c0, t0 = kernel.cycles(), perf_counter_ns()
    status, t = kernel.replay(arrays)
    for _ in range(8):  # forecasts precomputed for too short a span: longer, and again
        if status != 2:
            break
        lo, hi = _span(table, signal)
        spec = policy.compiled(replay_info((lo, max(hi, t) + 7 * 86400.0)))
        for col in rec.values():
            col[:] = 0
        counters[:] = 0
        arrays.update(spec)
        status, t = kernel.replay(arrays)
    if status == 1:
        signal.row_index(t)  # raises the signal's own error, naming the time and the coverage
    if status != 0:
        raise RuntimeError(f"the compiled replay stopped at t = {t} s (status {status})")
    dec_ns = None
    if time_decisions:
        ns_per_cycle = (perf_counter_ns() - t0) / max(kernel.cycles() - c0, 1)
        dec_ns = np.rint(arrays["dec_cyc"] * ns_per_cycle).astype(np.int64)
    if bar is not None:
        bar.update(n)
        bar.close()
    if spec["code"] == kernel.CODES["carbonrouter"]:
        # the per-session counters the Python loop's CarbonRouter keeps
        sessions = table["session"].to_numpy(np.int64)[rec["row"]]
        for name, col in (("opportunities", "switch_opportunity"), ("blocked", "gate_blocked")):
            ids, counts = np.unique(sessions[rec[col]], return_counts=True)
            getattr(policy, name).update(zip(ids.tolist(), counts.tolist(), strict=True))
    return rec, dict(zip(kernel.COUNTERS, counters.tolist(), strict=True)), dec_ns


def _span(table: pd.DataFrame, signal: CarbonSignal) -> tuple[float, float]:
    """(first arrival, latest arrival plus the longest session's think times and a day), s:
    the times a replay of ``table`` is expected to dispatch in, clipped to the signal."""
    arrival = table["arrival_s"].to_numpy(np.float64)
    first = np.flatnonzero(table["turn"].to_numpy() == 0)
    think = np.add.reduceat(table["think_s"].to_numpy(np.float64), first)
    lo = float(arrival[first].min())
    hi = float((arrival[first] + think).max()) + 86400.0
    return lo, min(hi, signal.row_interval(len(signal.frame) - 1)[1])


def _label_column(names: list[str], codes: np.ndarray) -> pd.api.extensions.ExtensionArray:
    """``names[codes]`` as pandas' default string column, gathered in Arrow: a gather of
    Python strings costs about a second per million queries."""
    import pyarrow as pa
    import pyarrow.compute as pc

    return pd.array(pc.take(pa.array(names, type=pa.large_string()), pa.array(codes)),
                    dtype="str")


def _result(rec: dict[str, np.ndarray], table: pd.DataFrame, deps: Deployments,
            signal: CarbonSignal, new: np.ndarray, hist: np.ndarray, out: np.ndarray,
            est: np.ndarray, qual: np.ndarray, conversation: np.ndarray, policy: Policy,
            backend_cfg: BackendConfig, counters: dict[str, int],
            dec_ns: np.ndarray | None) -> SimulationResult:
    """The records and provenance of a replay from the loop's columns."""
    records = _records(rec, table, deps, signal, new, hist, out, est, qual)
    order = rec["row"]
    dep = rec["deployment"]
    served = dep >= 0
    labels = deps.frame()
    for col in ("model", "gpu", "region"):
        names = [*labels[col], ""]  # a rejected query (−1) gets ""
        records[col] = _label_column(names, np.where(served, dep, len(names) - 1))
    # A rejected query recomputes nothing (its history is not prefilled anywhere).
    records["recomputed_tokens"] = np.where(
        served, records["history_tokens"] - records["cached_tokens"], 0.0)
    records["conversation"] = conversation[order]
    records.insert(0, "policy", _label_column([policy.name], np.zeros(len(records), np.int64)))
    return SimulationResult(records=records, policy=policy.name, params=policy.params(),
                            backend=backend_cfg.to_dict(), counters=counters,
                            decision_ns=dec_ns)
