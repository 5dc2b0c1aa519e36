"""Trace-driven replay of a prepared workload against the emulated backend (spec §4–§6).

The simulator owns time. Each session's first turn is sent at its arrival; each later turn a think
time after the previous turn's response completes, so dispatch d = max(t, f_prev) = t. At dispatch
the simulator asks the backend for L(a) and availability, builds the query's context over every
deployment, lets the policy choose, and accounts realized energy and carbon with the intensity at
dispatch (Eq. 4–5, realized output length); the turn completes at f = d + TTFT(a) + N_out / v_dec.
At equal times completions (and departures) are processed before dispatches (§6a.9).
"""

from __future__ import annotations

import dataclasses
import heapq
from dataclasses import dataclass

import numpy as np
import pandas as pd

from carbonrouter_lib import cost, prepared
from carbonrouter_lib.backend import Backend, BackendConfig, capacity_from_trace
from carbonrouter_lib.carbon import REGION_SETS, CarbonConfig, CarbonSignal
from carbonrouter_lib.deployments import Deployments
from carbonrouter_lib.policies import (
    Candidates,
    CarbonRouter,
    ConstraintConfig,
    Policy,
    QueryContext,
    feasibility,
    make_policy,
)
from carbonrouter_lib.profiles import MODELS, analytical_profiles

__all__ = [
    "REFERENCE_DEPLOYMENT",
    "SimulationConfig",
    "SimulationResult",
    "backend_config",
    "simulate",
    "mean_context_tokens",
    "peak_active_sessions",
]

#: The deployment whose service times define "active" sessions when measuring the trace's peak
#: concurrency P (spec §6: capacity K = c·P). P is a property of the trace, not of a policy, so
#: it must not depend on routing: we replay every session on this one deployment, histories
#: always cached, with no capacity limit.
REFERENCE_DEPLOYMENT = ("Llama-3.1-70B", "A100")


@dataclass(frozen=True)
class SimulationConfig:
    """The setting of a replay (paper defaults), serialized with every result.

    Attributes
    ----------
    regions
        Regions in tie-break order (default the paper's AT, GB, BE, US-CAL-CISO).
    carbon_year
        Year of the carbon signal (spec §8a).
    c
        Capacity factor: each region holds K = c·P sessions (P = peak active sessions).
    ttl_s
        KV-cache time to live after the last use, s.
    beta_q
        Quality threshold β_Q.
    d_ttft_s
        TTFT bound D_TTFT, s.
    kappa, gamma
        Output/input and cached/uncached energy ratios of the analytical profiles.
    """

    regions: tuple[str, ...] = REGION_SETS["paper"]
    carbon_year: int = 2022
    c: float = 0.5
    ttl_s: float = 1800.0
    beta_q: float = 0.85
    d_ttft_s: float = 5.0
    kappa: float = 6.0
    gamma: float = 0.05

    def __post_init__(self) -> None:
        if not self.c > 0:
            raise ValueError(f"c must be > 0, got {self.c}")
        if not 0 < self.beta_q <= 1:
            raise ValueError(f"beta_q must be in (0, 1], got {self.beta_q}")
        if not (self.ttl_s > 0 and self.d_ttft_s > 0):
            raise ValueError("ttl_s and d_ttft_s must be > 0")

    def to_dict(self) -> dict:
        """Plain-JSON form."""
        return dataclasses.asdict(self)

    def deployments(self) -> Deployments:
        """The deployments of this setting (analytical profiles with this κ, γ)."""
        return Deployments.build(self.regions,
                                 analytical_profiles(kappa=self.kappa, gamma=self.gamma))


def _reference_service(table: pd.DataFrame) -> np.ndarray:
    m = MODELS.index(REFERENCE_DEPLOYMENT[0])
    prof = analytical_profiles().set_index(["model", "gpu"]).loc[REFERENCE_DEPLOYMENT]
    new = prepared.model_matrix(table, "new_tokens")[:, m].astype(np.float64)
    out = prepared.model_matrix(table, "output_tokens")[:, m].astype(np.float64)
    return cost.service_time_s(new, 0.0, 0.0, out, prof["prefill_tok_s"], prof["decode_tok_s"])


def peak_active_sessions(table: pd.DataFrame) -> int:
    """P: the peak number of simultaneously active sessions of a prepared workload (spec §6).

    A session is active from its first arrival to its last completion. Completion depends on
    routing, so it is measured with the service times of :data:`REFERENCE_DEPLOYMENT` for every
    turn (prefill of the new tokens, history cached; decode of the realized output) and the
    table's think times. Intervals are half-open [start, end): a session ending when another
    starts does not overlap it (completions before dispatches, §6a.9).
    """
    if table.empty:
        raise ValueError("peak_active_sessions: empty workload")
    service = _reference_service(table)
    first = table["turn"].to_numpy() == 0
    # Turn k is sent think_k after turn k-1 completes: session end = start + Σ(think + service).
    per_turn = table["think_s"].to_numpy() + service
    session = table["session"].to_numpy()
    length = np.bincount(session, weights=per_turn)
    start = np.zeros(length.size)
    start[session[first]] = table["arrival_s"].to_numpy()[first]
    end = start + length
    times = np.concatenate([start, end])
    delta = np.concatenate([np.ones(start.size), -np.ones(end.size)])
    order = np.lexsort((delta, times))  # at equal times, ends (-1) before starts (+1)
    return int(np.max(np.cumsum(delta[order])))


def mean_context_tokens(table: pd.DataFrame) -> float:
    """C̄: mean query context (history + new input tokens) of the workload, in the reference
    model's tokens (spec §6: KV memory per region = K·C̄)."""
    m = MODELS.index(REFERENCE_DEPLOYMENT[0])
    ctx = (prepared.model_matrix(table, "history_tokens")[:, m]
           + prepared.model_matrix(table, "new_tokens")[:, m])
    return float(np.mean(ctx))


@dataclass
class SimulationResult:
    """The outcome of one replay: per-query records (metrics.RECORD_COLUMNS) and provenance."""

    records: pd.DataFrame
    policy: str
    params: dict
    backend: dict
    counters: dict


def backend_config(table: pd.DataFrame, config: SimulationConfig) -> BackendConfig:
    """Capacity of spec §6 for this workload: K = c·P per region, KV memory K·C̄ per region."""
    return capacity_from_trace(peak_active_sessions(table), mean_context_tokens(table),
                               c=config.c, n_gpu_types=3, ttl_s=config.ttl_s)


def simulate(
    table: pd.DataFrame,
    policy: Policy | str,
    config: SimulationConfig | None = None,
    signal: CarbonSignal | None = None,
    backend: BackendConfig | None = None,
    progress: bool = False,
) -> SimulationResult:
    """Replay the prepared workload ``table`` under ``policy`` (spec §4–§7).

    Parameters
    ----------
    table
        A prepared workload (:func:`carbonrouter_lib.prepared.prepare_workload`).
    policy
        A policy object or a registry name (:data:`carbonrouter_lib.policies.POLICIES`).
    config
        The setting (regions, carbon year, capacity factor, constraints, κ, γ).
    signal
        Carbon signal covering the replay (default: built from ``config``; its regions must be
        ``config.regions`` in order).
    backend
        Capacity (default :func:`backend_config` of the table).
    progress
        Show a tqdm progress bar over queries.

    Returns
    -------
    SimulationResult
        ``records``: one row per query in dispatch order (columns of
        :data:`carbonrouter_lib.metrics.RECORD_COLUMNS`, plus ``policy``).
    """
    config = config or SimulationConfig()
    policy = make_policy(policy) if isinstance(policy, str) else policy
    deps = config.deployments()
    if signal is None:
        signal = CarbonSignal.from_config(CarbonConfig(year=config.carbon_year,
                                                       regions=config.regions))
    if tuple(signal.regions) != tuple(config.regions):
        raise ValueError(f"signal regions {signal.regions} differ from config.regions "
                         f"{config.regions}")
    backend_cfg = backend or backend_config(table, config)
    be = Backend(deps, backend_cfg)
    constraints = ConstraintConfig(beta_q=config.beta_q, d_ttft_s=config.d_ttft_s)

    n = len(table)
    session = table["session"].to_numpy(dtype=np.int64)
    turn = table["turn"].to_numpy(dtype=np.int64)
    n_turns = table["n_turns"].to_numpy(dtype=np.int64)
    arrival = table["arrival_s"].to_numpy(dtype=np.float64)
    think = table["think_s"].to_numpy(dtype=np.float64)
    new = prepared.model_matrix(table, "new_tokens").astype(np.float64)
    hist = prepared.model_matrix(table, "history_tokens").astype(np.float64)
    out = prepared.model_matrix(table, "output_tokens").astype(np.float64)
    est = prepared.model_matrix(table, "est_output_tokens").astype(np.float64)
    qual = prepared.model_matrix(table, "quality").astype(np.float64)
    if not (np.all(np.diff(session) >= 0) and np.all(turn[1:][np.diff(session) == 0]
                                                     == turn[:-1][np.diff(session) == 0] + 1)):
        raise ValueError("table rows must be grouped by session with turns 0, 1, 2, … in order")
    first_row = np.flatnonzero(turn == 0)
    big = MODELS.index("Llama-3.1-70B")

    ctx, cand = QueryContext(deps), Candidates(deps.n)
    rec = {
        "deployment": np.full(n, -1, np.int64), "dispatch_s": np.zeros(n),
        "completion_s": np.zeros(n), "history_tokens": np.zeros(n),
        "cached_tokens": np.zeros(n), "energy_kwh": np.zeros(n), "carbon_g": np.zeros(n),
        "est_energy_kwh": np.zeros(n), "est_carbon_g": np.zeros(n),
        "recompute_energy_kwh": np.zeros(n), "ttft_s": np.full(n, np.nan),
        "quality": np.full(n, np.nan), "best_effort": np.zeros(n, bool),
        "rejected": np.zeros(n, bool), "in_cleanest_region": np.zeros(n, bool),
        "switched": np.zeros(n, bool), "switch_opportunity": np.zeros(n, bool),
        "gate_blocked": np.zeros(n, bool),
    }
    order = np.empty(n, np.int64)  # dispatch order
    prev_served = {}  # session -> deployment of its previous served turn
    is_ccar = isinstance(policy, CarbonRouter)

    # Event heap: (time, kind, row) with kind 0 = completion, 1 = dispatch, so that at equal
    # times completions and departures come first (§6a.9); rows break remaining ties.
    events = [(arrival[i], 1, int(i)) for i in first_row]
    heapq.heapify(events)
    done = 0
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=n, desc=f"replay {policy.name}", unit="query", mininterval=1.0)
    while events:
        t, kind, i = heapq.heappop(events)
        s = int(session[i])
        if kind == 0:  # completion of row i (or the instant of its rejection)
            a = int(rec["deployment"][i])
            if a >= 0:
                be.complete(s, a, t)
            if turn[i] == n_turns[i] - 1:
                be.depart(s, t)
                policy.on_session_end(s)
            else:
                heapq.heappush(events, (t + think[i + 1], 1, i + 1))
            continue

        be.advance(t)
        ci_region = signal.at(t)
        prev = prev_served.get(s, -1)
        ctx.fill(session=s, turn=int(turn[i]), prev=prev, cached=be.cached_tokens(s),
                 n_new=new[i], n_hist=hist[i], n_out_est=est[i], quality=qual[i],
                 ci=ci_region, available=be.available(s), free_slots=be.free_slots(),
                 time_s=t)
        if turn[i] == 0:
            policy.on_session_start(ctx)
        feasibility(ctx, constraints, out=cand)
        order[done] = i
        done += 1
        rec["dispatch_s"][i] = t
        if cand.rejected:
            rec["rejected"][i] = True
            rec["history_tokens"][i] = hist[i, big]
            rec["completion_s"][i] = t
            heapq.heappush(events, (t, 0, i))
        else:
            a = int(policy.choose(ctx, cand))
            if not (0 <= a < deps.n and cand.mask[a]):
                raise RuntimeError(f"{policy.name} chose {a}, not a candidate (row {i})")
            policy.on_served(ctx, a)
            m = int(deps.model[a])
            cached = float(ctx.cached[a])
            energy = cost.energy_kwh(deps.e_in[a], deps.e_cache[a], deps.e_out[a], new[i, m],
                                     hist[i, m], cached, out[i, m])
            ttft = cost.ttft_s(new[i, m], hist[i, m], cached, deps.v_pre[a])
            done_at = t + ttft + out[i, m] / deps.v_dec[a]
            ci_a = ci_region[deps.region[a]]
            rec["deployment"][i] = a
            rec["history_tokens"][i] = hist[i, m]
            rec["cached_tokens"][i] = cached
            rec["energy_kwh"][i] = energy
            rec["carbon_g"][i] = ci_a * energy
            rec["est_energy_kwh"][i] = cand.energy[a]
            rec["est_carbon_g"][i] = cand.carbon[a]
            rec["recompute_energy_kwh"][i] = (deps.e_in[a] - deps.e_cache[a]) * (hist[i, m]
                                                                                 - cached)
            rec["ttft_s"][i] = ttft
            rec["quality"][i] = qual[i, m]
            rec["best_effort"][i] = cand.best_effort
            rec["in_cleanest_region"][i] = ci_a <= ci_region.min()
            rec["switched"][i] = prev >= 0 and a != prev
            if is_ccar:
                rec["switch_opportunity"][i] = policy.last_opportunity
                rec["gate_blocked"][i] = (policy.last_opportunity and a == prev
                                          and policy.last_proposal != prev)
            rec["completion_s"][i] = done_at
            be.dispatch(s, a, t, int(hist[i, m] + new[i, m] + out[i, m]))
            prev_served[s] = a
            heapq.heappush(events, (done_at, 0, i))
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    if done != n:
        raise RuntimeError(f"replay dispatched {done} of {n} queries")

    labels = deps.frame()
    dep = rec["deployment"]
    served = dep >= 0
    records = pd.DataFrame({"session": session, "turn": turn, "n_turns": n_turns, **rec})
    for col in ("model", "gpu", "region"):
        names = labels[col].to_numpy()
        records[col] = np.where(served, names[np.maximum(dep, 0)], "")
    records["recomputed_tokens"] = records["history_tokens"] - records["cached_tokens"]
    records = records.iloc[order].reset_index(drop=True)
    records.insert(0, "policy", policy.name)
    return SimulationResult(records=records, policy=policy.name, params=policy.params(),
                            backend=backend_cfg.to_dict(), counters=be.counters())
