"""Trace-driven replay of a prepared workload against the emulated backend (spec §4–§6).

The simulator owns time. Each session's first turn is sent at its arrival; each later turn a think
time after the previous turn's response completes, so dispatch d = max(t, f_prev) = t. At dispatch
the simulator asks the backend for L(a) and availability, builds the query's context over every
deployment, lets the policy choose, and accounts realized energy and carbon with the intensity at
dispatch (Eq. 4–5, realized output length); the turn completes at f = d + TTFT(a) + N_out / v_dec.
At equal times completions (and departures) are processed before dispatches (§6a.9).
"""

from __future__ import annotations

import array
import dataclasses
import functools
import heapq
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter_ns

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
    QueryBatch,
    QueryContext,
    feasibility,
    make_policy,
)
from carbonrouter_lib.prepared import mean_context_tokens, peak_active_sessions
from carbonrouter_lib.profiles import (
    MODELS,
    ProfileTable,
    analytical_profiles,
    kv_tokens_per_instance,
)

#: The KV-memory rules of :class:`SimulationConfig` (``kv_memory``).
KV_MEMORY_RULES: tuple[str, ...] = ("paper", "hardware")

__all__ = [
    "KV_MEMORY_RULES",
    "SimulationConfig",
    "SimulationResult",
    "backend_config",
    "setting",
    "simulate",
    "check_table",
    "mean_context_tokens",
    "peak_active_sessions",
]



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
    alpha
        Exponent of the analytical profiles' MFU size law (energy per token ∝ P^α across
        models; spec §3).
    kv_memory
        KV-memory rule (:data:`KV_MEMORY_RULES`): ``"paper"`` — each region holds K·C̄ tokens
        of any model, split over its (region, GPU) pools (spec §6; the reproduction's rule);
        ``"hardware"`` — every deployment holds what its instances' GPUs have left after the
        16-bit weights (90% of device memory, :func:`profiles.kv_tokens_per_instance`), with
        ⌈S·u / instance_batch⌉ instances per (region, GPU) pool and model (S slots per pool,
        u :func:`prepared.service_utilization`: enough instances to run the pool's sessions'
        turns in batches of ``instance_batch``). See :func:`backend_config`.
    kv_scale
        Multiplies the rule's KV memory (e.g. 10 for "ample"), > 0.
    instance_batch
        Concurrent requests one instance batches under the hardware rule (≥ 1; 64, the decode
        batch at which notebook 08 calibrates κ).
    profiles
        A profile table of one's own (measured energies and throughputs per (model, GPU);
        schema of :func:`profiles.validate_profiles`) in place of the analytical profiles: a
        DataFrame, a CSV path (:func:`profiles.load_measured_profiles`) or a
        :class:`profiles.ProfileTable`; stored as a ProfileTable (compared by content). κ, γ
        and α are then unused. It must hold every model of :data:`profiles.MODELS` on every
        GPU type it names; its GPU types (in order of first appearance: the tie-break order)
        replace the paper's, and each region's capacity is split over them. None (default):
        the analytical profiles with κ, γ, α.
    carbon_file
        A carbon-intensity CSV of one's own in place of the mirrored signal of
        :attr:`carbon_year` (which is then unused): a wide file that
        ``CarbonSignal.from_csv(path)`` reads (a ``datetime`` column and one column per
        region, e.g. written by :meth:`CarbonSignal.to_csv`), whose regions are
        :attr:`regions` in order. Stored as an absolute path; its SHA-256 is part of
        :meth:`to_dict`. The way to give a sweep (:class:`sweep.RunSpec`) its own signal.

    Fields that name files (``profiles``, ``carbon_file``) appear in :meth:`to_dict` only when
    set, as ``{"path": ..., "sha256": ...}``; the constructor accepts that form back (and checks
    that the file still has that content), so a setting survives a JSON round trip and the keys
    of settings without them are unchanged.
    """

    regions: tuple[str, ...] = REGION_SETS["paper"]
    carbon_year: int = 2022
    c: float = 0.5
    ttl_s: float = 1800.0
    beta_q: float = 0.85
    d_ttft_s: float = 5.0
    kappa: float = 6.0
    gamma: float = 0.05
    alpha: float = 0.8
    kv_memory: str = "paper"
    kv_scale: float = 1.0
    instance_batch: int = 64
    profiles: ProfileTable | None = None
    carbon_file: str | None = None

    def __post_init__(self) -> None:
        regions = self.regions
        if isinstance(regions, str) or not isinstance(regions, Sequence) or not regions or not all(
            isinstance(r, str) and r for r in regions
        ):
            raise ValueError(f"SimulationConfig.regions must be a non-empty sequence of region "
                             f"names such as ('AT', 'GB'), got {regions!r}")
        object.__setattr__(self, "regions", tuple(regions))
        y = self.carbon_year
        if isinstance(y, bool) or not isinstance(y, int | np.integer):
            raise ValueError(f"SimulationConfig.carbon_year must be an integer year, got {y!r}")
        for name in ("c", "ttl_s", "beta_q", "d_ttft_s", "kappa", "gamma", "alpha"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float | np.number) or math.isnan(v):
                raise ValueError(f"SimulationConfig.{name} must be a number, got {v!r}")
            object.__setattr__(self, name, float(v))
        if self.profiles is not None:
            object.__setattr__(self, "profiles", ProfileTable.of(self.profiles))
        if self.carbon_file is not None:
            object.__setattr__(self, "carbon_file", _carbon_file(self.carbon_file,
                                                                 self.regions))
        if not (math.isfinite(self.c) and self.c > 0):
            raise ValueError(f"c must be > 0, got {self.c}")
        if self.kv_memory not in KV_MEMORY_RULES:
            raise ValueError(f"kv_memory must be one of {KV_MEMORY_RULES}, got "
                             f"{self.kv_memory!r}")
        k = self.kv_scale
        if isinstance(k, bool) or not isinstance(k, int | float) or not (math.isfinite(k)
                                                                          and k > 0):
            raise ValueError(f"kv_scale must be a finite number > 0, got {k!r}")
        b = self.instance_batch
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise ValueError(f"instance_batch must be an integer ≥ 1, got {b!r}")
        if not 0 < self.beta_q <= 1:
            raise ValueError(f"beta_q must be in (0, 1], got {self.beta_q}")
        if not (self.ttl_s > 0 and self.d_ttft_s > 0):
            raise ValueError("ttl_s and d_ttft_s must be > 0")

    def to_dict(self) -> dict:
        """Plain-JSON form (file fields only when set, see the class doc)."""
        from carbonrouter_lib.datasets import sha256_of

        d = dataclasses.asdict(dataclasses.replace(self, profiles=None, carbon_file=None))
        del d["profiles"], d["carbon_file"]
        if self.profiles is not None:
            d["profiles"] = self.profiles.to_json()
        if self.carbon_file is not None:
            d["carbon_file"] = {"path": self.carbon_file, "sha256": sha256_of(self.carbon_file)}
        return d

    def constraints(self) -> ConstraintConfig:
        """The constraints of Eq. 7 of this setting (β_Q, D_TTFT)."""
        return ConstraintConfig(beta_q=self.beta_q, d_ttft_s=self.d_ttft_s)

    def signal(self, signal: CarbonSignal | None = None) -> CarbonSignal:
        """The carbon signal of this setting: ``signal`` checked against :attr:`regions` (same
        regions, same order), or, when None, read from :attr:`carbon_file` if set, else built
        from :attr:`carbon_year` and :attr:`regions` (parquet-cached)."""
        if signal is None and self.carbon_file is not None:
            from carbonrouter_lib.datasets import sha256_of

            signal = _signal_from_file(self.carbon_file, sha256_of(self.carbon_file))
        elif signal is None:
            signal = CarbonSignal.from_config(CarbonConfig(year=self.carbon_year,
                                                           regions=self.regions))
        if tuple(signal.regions) != tuple(self.regions):
            raise ValueError(f"signal regions {signal.regions} differ from config.regions "
                             f"{self.regions}")
        return signal

    def deployments(self) -> Deployments:
        """The deployments of this setting: the analytical profiles with this κ, γ, α, or
        :attr:`profiles` when set (the one place a setting's deployments are built)."""
        if self.profiles is not None:
            return _deployments(self.regions, math.nan, math.nan, math.nan, self.profiles)
        return _deployments(self.regions, self.kappa, self.gamma, self.alpha, None)

    def with_profiles(self, profiles) -> SimulationConfig:
        """This setting with ``profiles`` (anything :attr:`profiles` takes; None: analytical)."""
        return dataclasses.replace(self, profiles=profiles)


def setting(config: SimulationConfig | None = None, signal: CarbonSignal | None = None,
            profiles=None) -> SimulationConfig:
    """The setting of a replay from what a caller gives: ``config`` (default
    :class:`SimulationConfig()` over the regions of ``signal`` when one is given), with
    ``profiles`` in place of its own when given."""
    if config is None:
        config = (SimulationConfig() if signal is None
                  else SimulationConfig(regions=tuple(signal.regions)))
    return config if profiles is None else config.with_profiles(profiles)


@functools.lru_cache(maxsize=32)
def _deployments(regions: tuple[str, ...], kappa: float, gamma: float, alpha: float,
                 profiles: ProfileTable | None) -> Deployments:
    # Cached: building the profile table costs more than a short replay, and Deployments' arrays
    # are read-only, so one instance can be shared. A ProfileTable is hashed by its content's
    # SHA-256, never as a DataFrame.
    if profiles is None:
        return Deployments.build(regions, analytical_profiles(kappa=kappa, gamma=gamma,
                                                              alpha=alpha))
    gpus = tuple(pd.unique(profiles.frame["gpu"]))
    try:
        return Deployments.build(regions, profiles.frame, gpus=gpus)
    except ValueError as exc:
        where = profiles.path or "the profile table"
        raise ValueError(f"{where}: {exc} (every model of {MODELS} is needed on each GPU "
                         f"type of the table)") from None


def _carbon_file(value, regions: tuple[str, ...]) -> str:
    """The absolute path of a setting's ``carbon_file`` (a path, or ``{"path", "sha256"}``
    whose file must still have that SHA-256), checked to hold exactly ``regions``."""
    from carbonrouter_lib.carbon import _read_header
    from carbonrouter_lib.datasets import sha256_of

    expected = None
    if isinstance(value, Mapping):
        if set(value) != {"path", "sha256"}:
            raise TypeError(f"carbon_file {dict(value)!r}: give a path or "
                            f"{{'path': ..., 'sha256': ...}}")
        value, expected = value["path"], value["sha256"]
    if not isinstance(value, str | os.PathLike):
        raise TypeError(f"carbon_file must be a path, got {type(value).__name__}")
    path = Path(value).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"carbon_file: no such file {path}")
    if expected is not None and sha256_of(path) != expected:
        raise ValueError(f"carbon_file {path}: content changed since the setting was made "
                         f"(SHA-256 {sha256_of(path)[:12]}…, expected {str(expected)[:12]}…)")
    header = _read_header(path)
    in_file = tuple(c for c in header if c != "datetime")
    if "datetime" not in header or in_file != tuple(regions):
        raise ValueError(f"carbon_file {path}: its regions {in_file} (every column but "
                         f"'datetime') must be config.regions {tuple(regions)}, in order")
    return str(path)


@functools.lru_cache(maxsize=8)
def _signal_from_file(path: str, sha256: str) -> CarbonSignal:
    # Keyed by the content too: a file rewritten in place is read again.
    return CarbonSignal.from_csv(path)


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


def backend_config(table: pd.DataFrame, config: SimulationConfig) -> BackendConfig:
    """Capacity of this workload under ``config`` (spec §6): K = c·P sessions per region split
    over its G GPU types (``slots_per_pool`` S = ⌈c·P/G⌉; G = 3 unless ``config.profiles`` names
    other GPU types), and KV memory by ``config.kv_memory``,
    times ``config.kv_scale``:

    - ``"paper"``: K·C̄ tokens per region, shared by the models of each (region, GPU) pool
      (:func:`backend.capacity_from_trace`).
    - ``"hardware"``: per deployment (m, h, r), n·kv_tokens_per_instance(m, h) tokens of m, with
      n = max(1, ⌈S·u / instance_batch⌉) instances of every model in each pool.
    """
    deps = config.deployments()
    base = capacity_from_trace(peak_active_sessions(table), mean_context_tokens(table),
                               c=config.c, n_gpu_types=len(deps.gpus), ttl_s=config.ttl_s)
    if config.kv_memory == "paper":
        return dataclasses.replace(base, kv_tokens_per_pool=base.kv_tokens_per_pool
                                   * config.kv_scale)
    instances = max(1, math.ceil(base.slots_per_pool * prepared.service_utilization(table)
                                 / config.instance_batch))
    per_model_gpu = {(m, g): instances * config.kv_scale * kv_tokens_per_instance(m, g)
                     for m in deps.models for g in deps.gpus}
    return BackendConfig(
        slots_per_pool=base.slots_per_pool, kv_tokens_per_pool=None, ttl_s=config.ttl_s,
        kv_tokens_per_deployment=tuple(per_model_gpu[(deps.models[m], deps.gpus[g])]
                                       for m, g in zip(deps.model.tolist(), deps.gpu.tolist(),
                                                       strict=True)))


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


def _records(rec: dict[str, np.ndarray], table: pd.DataFrame, deps: Deployments,
             batch: QueryBatch, signal: CarbonSignal, new: np.ndarray, hist: np.ndarray,
             out: np.ndarray, qual: np.ndarray) -> pd.DataFrame:
    """The records table (metrics.RECORD_COLUMNS, dispatch order) from what the loop wrote: the
    realized energy (Eq. 4, realized output) and carbon with the intensity at dispatch (Eq. 5),
    the router's estimates Ĉ(a) = CI·E(a) (Eq. 4 with the estimated output, in the batch's
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
    de = e_in - e_cache
    est_energy = np.where(served, de * (n_hist - cached)
                          + batch.energy_base[row, a % batch.block], 0.0)
    big = MODELS.index("Llama-3.1-70B")
    return pd.DataFrame({
        "session": table["session"].to_numpy(np.int64)[row],
        "turn": table["turn"].to_numpy(np.int64)[row],
        "n_turns": table["n_turns"].to_numpy(np.int64)[row],
        "deployment": dep, "dispatch_s": rec["dispatch_s"], "completion_s": rec["completion_s"],
        # a rejected query's history is counted in the 70B's tokens
        "history_tokens": np.where(served, n_hist, hist[row, big]),
        "cached_tokens": cached, "energy_kwh": energy, "carbon_g": ci * energy,
        "est_energy_kwh": est_energy, "est_carbon_g": ci * est_energy,
        "recompute_energy_kwh": np.where(served, de * (n_hist - cached), 0.0),
        "ttft_s": rec["ttft_s"], "quality": np.where(served, qual[row, m], np.nan),
        "best_effort": rec["best_effort"], "rejected": rec["rejected"],
        "in_cleanest_region": served & (ci <= ci_all.min(axis=1)),
        "switched": rec["switched"], "switch_opportunity": rec["switch_opportunity"],
        "gate_blocked": rec["gate_blocked"],
    })


def simulate(
    table: pd.DataFrame,
    policy: Policy | str,
    config: SimulationConfig | None = None,
    signal: CarbonSignal | None = None,
    backend: BackendConfig | None = None,
    progress: bool = False,
    time_decisions: bool = False,
    profiles=None,
) -> SimulationResult:
    """Replay the prepared workload ``table`` under ``policy`` (spec §4–§7).

    Parameters
    ----------
    table
        A prepared workload (:func:`carbonrouter_lib.prepared.prepare_workload`, or
        :func:`carbonrouter_lib.prepared.from_turns` for a trace of one's own).
    policy
        A policy object, a registry name (:data:`carbonrouter_lib.policies.POLICIES`) or an
        import name ``"package.module:Class"`` (:func:`carbonrouter_lib.policies.policy_class`). A
        CarbonRouter whose learned gate is not yet trained (``gate="learned"``, the default)
        gets it trained here on ``table`` with this setting (:func:`carbonrouter_lib.gate.
        ensure_gate`, session-held-out folds; a few seconds for the full ShareGPT workload);
        ``gate="oracle"`` gets the workload's :class:`carbonrouter_lib.gate.OracleGate`.
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
        policy's choice) with ``time.perf_counter_ns`` into ``decision_ns`` (for benchmarks).
    profiles
        Profiles of one's own in place of ``config``'s (a DataFrame, a CSV path or a
        :class:`~carbonrouter_lib.profiles.ProfileTable`; see :attr:`SimulationConfig.profiles`):
        the replay, its capacity and a gate trained here all use them. None: ``config``'s.

    Returns
    -------
    SimulationResult
        ``records``: one row per query in dispatch order (columns of
        :data:`carbonrouter_lib.metrics.RECORD_COLUMNS`, plus ``policy``).

    Notes
    -----
    Speed: the per-query path is scalar Python over lists and typed arrays plus a few numpy
    calls over the n deployments; what does not depend on dispatch is computed for all queries
    at once (:class:`carbonrouter_lib.policies.QueryBatch`). ``benchmarks/bench_simulator.py``
    measures it.
    """
    config = setting(config, signal, profiles)
    policy = make_policy(policy) if isinstance(policy, str) else policy
    if not isinstance(policy, Policy):
        raise TypeError(f"simulate: policy must be a Policy or a registry name, got "
                        f"{type(policy).__name__}")
    if type(policy).choose is Policy.choose:
        raise TypeError(f"{type(policy).__name__} does not implement choose(ctx, cand)")
    check_table(table)
    deps = config.deployments()
    signal = config.signal(signal)
    backend_cfg = backend or backend_config(table, config)
    build = policy.gate_to_build if isinstance(policy, CarbonRouter) else None
    if build is not None:
        # The learned gate of this very setting, trained on this workload with session-held-out
        # folds, or the oracle of this workload (lazy import: the gate module replays workloads).
        from carbonrouter_lib import gate as gates

        if build == "oracle":
            policy.set_gate(gates.OracleGate(table, config, pricing=policy.pricing))
        else:
            policy.set_gate(gates.ensure_gate(None, config, policy.pricing, policy.gate_training,
                                              table=table, signal=signal, backend=backend_cfg))
    if getattr(policy, "needs_model", False):
        from carbonrouter_lib.policies import fit_horizon_model

        policy.set_model(fit_horizon_model(table, config.beta_q, config.ttl_s, policy.horizon))
    be = Backend(deps, backend_cfg)
    constraints = config.constraints()

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
    first_row = np.flatnonzero(turn == 0)

    # The loop reads scalars: Python lists and typed arrays are much faster to index, and
    # Python floats to do arithmetic on, than numpy scalars (the values, and so the results,
    # are the same). Per-model values are flat (row i, model m at i·n_models + m).
    session_l, turn_l, n_turns_l = session.tolist(), turn.tolist(), n_turns.tolist()
    think_l = think.tolist()
    n_m = new.shape[1]
    new_l, hist_l, out_l = (array.array("d", x.tobytes()) for x in (new, hist, out))
    v_pre, v_dec = deps.v_pre.tolist(), deps.v_dec.tolist()
    model_of, n_dep = deps.model.tolist(), deps.n
    # Everything of Eq. 4–7 that does not depend on dispatch, for all queries at once.
    conversation = prepared.conversation_codes(table)
    batch = QueryBatch(deps, new, hist, est, qual, constraints, conversation=conversation)
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
    is_ccar = isinstance(policy, CarbonRouter)
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
    first_order = np.lexsort((first_row, arrival[first_row]))
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
            # (columns start zeroed: only the nonzero values are written)
            c_dep[j], c_compl[j], c_ttft[j] = -1, t, math.nan
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
            if is_ccar and policy.last_opportunity:
                c_opp[j] = True
                c_block[j] = a == prev and policy.last_proposal != prev
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
    records = _records(rec, table, deps, batch, signal, new, hist, out, qual)
    order = rec["row"]
    dep = rec["deployment"]
    served = dep >= 0
    labels = deps.frame()
    for col in ("model", "gpu", "region"):
        names = labels[col].to_numpy()
        records[col] = np.where(served, names[np.maximum(dep, 0)], "")
    records["recomputed_tokens"] = records["history_tokens"] - records["cached_tokens"]
    records["conversation"] = conversation[order]
    records.insert(0, "policy", policy.name)
    return SimulationResult(records=records, policy=policy.name, params=policy.params(),
                            backend=backend_cfg.to_dict(), counters=be.counters(),
                            decision_ns=dec_ns)
