"""The setting of a replay: its parameters, its capacity and the paper's defaults (docs/model.md).

One frozen dataclass, :class:`SimulationConfig`, holds everything a replay is run under besides the
workload and the policy: the regions and carbon year (or a carbon file of one's own), the
constraints of Eq. 7 (β_Q, D_TTFT), the analytical profiles' κ, γ, α (or a profile table of one's
own), the capacity factor c, the KV-cache TTL and the KV-memory rule. Its defaults are the paper's
(:data:`carbonrouter_lib.paper.DEFAULTS`, the one place those numbers are written).

The capacity of a workload under a setting is derived here too, from the workload's peak active
sessions P and mean context C̄ (:func:`carbonrouter_lib.prepared.peak_active_sessions`,
:func:`~carbonrouter_lib.prepared.mean_context_tokens`): K = c·P session slots per region and K·C̄
KV tokens (:func:`capacity_from_trace`), or the hardware rule (:func:`backend_config`).

Units: s, tokens, gCO2e/kWh.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from carbonrouter_lib import prepared
from carbonrouter_lib.backend import BackendConfig
from carbonrouter_lib.carbon import REGION_SETS, CarbonConfig, CarbonSignal
from carbonrouter_lib.deployments import Deployments
from carbonrouter_lib.paper import DEFAULTS
from carbonrouter_lib.policies.base import ConstraintConfig
from carbonrouter_lib.prepared import mean_context_tokens, peak_active_sessions
from carbonrouter_lib.profiles import (
    MODELS,
    ProfileTable,
    analytical_profiles,
    kv_tokens_per_instance,
)

__all__ = [
    "KV_MEMORY_RULES",
    "SimulationConfig",
    "backend_config",
    "capacity_from_trace",
    "setting",
]

#: The KV-memory rules of :class:`SimulationConfig` (``kv_memory``).
KV_MEMORY_RULES: tuple[str, ...] = ("paper", "hardware")

@dataclass(frozen=True)
class SimulationConfig:
    """The setting of a replay (paper defaults), serialized with every result.

    Attributes
    ----------
    regions
        Regions in tie-break order (default the paper's AT, GB, BE, US-CAL-CISO).
    carbon_year
        Year of the carbon signal (docs/model.md §8a).
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
        models; docs/model.md §3).
    kv_memory
        KV-memory rule (:data:`KV_MEMORY_RULES`): ``"paper"`` — each region holds K·C̄ tokens
        of any model, split over its (region, GPU) pools (docs/model.md §6; reproduction's rule);
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
    c: float = DEFAULTS["c"]
    ttl_s: float = DEFAULTS["ttl_s"]
    beta_q: float = DEFAULTS["beta_q"]
    d_ttft_s: float = DEFAULTS["d_ttft_s"]
    kappa: float = DEFAULTS["kappa"]
    gamma: float = DEFAULTS["gamma"]
    alpha: float = DEFAULTS["alpha"]
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


def backend_config(table: pd.DataFrame, config: SimulationConfig) -> BackendConfig:
    """Capacity of a workload under ``config`` (docs/model.md §6): K = c·P sessions per region split
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


def capacity_from_trace(
    peak_sessions: int,
    mean_context_tokens: float,
    c: float = DEFAULTS["c"],
    n_gpu_types: int = 3,
    ttl_s: float = DEFAULTS["ttl_s"],
) -> BackendConfig:
    """The paper's capacity rule (docs/model.md §6): K = c·P sessions and K·C̄ KV tokens per region.

    Parameters
    ----------
    peak_sessions : int
        P, the peak number of simultaneously active sessions of the trace (a session is active
        from its first arrival to its last completion), ≥ 1.
    mean_context_tokens : float
        C̄, the mean query context (history + new input tokens) of the trace, tokens, > 0.
    c : float
        Capacity factor, > 0. Default 0.5 (total capacity over 4 regions = 2 × peak demand).
    n_gpu_types : int
        GPU types per region that share the region's capacity equally, ≥ 1. Default 3.
    ttl_s : float
        Cache TTL, s (see :class:`BackendConfig`).

    Returns
    -------
    BackendConfig
        ``slots_per_pool = ceil(c·P / n_gpu_types)`` — rounded *up* so that no pool has zero
        slots and the total never falls below c·P per region (a value within 1e-9 of an integer
        counts as that integer, so float noise in c·P does not add a slot);
        ``kv_tokens_per_pool = c·P·C̄ / n_gpu_types`` exactly (not rounded with the slots: the
        paper gives the region K·C̄ tokens).
    """
    if isinstance(peak_sessions, bool) or not isinstance(peak_sessions, int | np.integer) or (
        peak_sessions < 1
    ):
        raise ValueError(f"peak_sessions must be an integer ≥ 1, got {peak_sessions!r}")
    if not (math.isfinite(mean_context_tokens) and mean_context_tokens > 0):
        raise ValueError(f"mean_context_tokens must be finite and > 0 tokens, "
                         f"got {mean_context_tokens!r}")
    if not (math.isfinite(c) and c > 0):
        raise ValueError(f"capacity factor c must be finite and > 0, got {c!r}")
    if isinstance(n_gpu_types, bool) or not isinstance(n_gpu_types, int) or n_gpu_types < 1:
        raise ValueError(f"n_gpu_types must be an integer ≥ 1, got {n_gpu_types!r}")
    per_pool = c * int(peak_sessions) / n_gpu_types
    nearest = round(per_pool)
    slots = nearest if abs(per_pool - nearest) <= 1e-9 else math.ceil(per_pool)
    return BackendConfig(
        slots_per_pool=max(1, int(slots)),
        kv_tokens_per_pool=per_pool * float(mean_context_tokens),
        ttl_s=ttl_s,
    )
