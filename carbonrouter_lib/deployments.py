"""The candidate deployments a = (model, GPU, region) as flat arrays (``docs/model.md`` §1–§3,
§6a.9).

Every per-query computation of the router is vectorized over these arrays. Deployments are numbered
so that index order *is* the tie-break order of ``docs/model.md`` §6a.9 (region order as configured,
then GPU order A10, A100, H100, then model order): ``index = (region · n_gpus + gpu) · n_models +
model``. ``np.argmin`` returns the first minimum, so it breaks exact ties as that section says.

A *pool* is a (region, GPU type): it holds the session slots and the KV-cache memory shared by all
models on that GPU type in that region (``docs/model.md`` §6a.3–4);
``pool = region · n_gpus + gpu``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from carbonrouter_lib.profiles import GPUS, MODELS, analytical_profiles

__all__ = ["Deployments"]


@dataclass(frozen=True, eq=False)
class Deployments:
    """All deployments of a setting, as read-only arrays of length ``n`` (one per deployment).

    Attributes
    ----------
    models, gpus, regions
        Names, in their configured order.
    model, gpu, region, pool
        Integer index of each deployment's model / GPU / region / (region, GPU) pool.
    e_in, e_cache, e_out
        Energy per uncached input, cached input and output token, kWh/token.
    v_pre, v_dec
        Prefill and decode throughput, tokens/s.
    context_window
        The model's context window, tokens.
    """

    models: tuple[str, ...]
    gpus: tuple[str, ...]
    regions: tuple[str, ...]
    model: np.ndarray
    gpu: np.ndarray
    region: np.ndarray
    pool: np.ndarray
    e_in: np.ndarray
    e_cache: np.ndarray
    e_out: np.ndarray
    v_pre: np.ndarray
    v_dec: np.ndarray
    context_window: np.ndarray

    @classmethod
    def build(
        cls,
        regions: Sequence[str],
        profiles: pd.DataFrame | None = None,
        models: Sequence[str] = MODELS,
        gpus: Sequence[str] = GPUS,
    ) -> Deployments:
        """Every (model, GPU, region) of ``profiles`` (default: the analytical profiles).

        ``profiles`` needs one row per (model, GPU) with ``e_in_kwh``, ``e_cache_kwh``,
        ``e_out_kwh``, ``prefill_tok_s``, ``decode_tok_s`` and ``context_window``.
        """
        if not regions:
            raise ValueError("at least one region is needed")
        if len(set(regions)) != len(regions):
            raise ValueError(f"duplicate regions in {list(regions)}")
        profiles = analytical_profiles() if profiles is None else profiles
        table = profiles.set_index(["model", "gpu"])
        missing = [(m, g) for m in models for g in gpus if (m, g) not in table.index]
        if missing:
            raise ValueError(f"profiles lack the (model, GPU) pairs {missing}")
        n_m, n_g, n_r = len(models), len(gpus), len(regions)
        idx = np.arange(n_m * n_g * n_r)
        model = idx % n_m
        gpu = (idx // n_m) % n_g
        region = idx // (n_m * n_g)
        rows = table.loc[[(models[m], gpus[g]) for m, g in zip(model, gpu, strict=True)]]

        def col(name: str) -> np.ndarray:
            arr = rows[name].to_numpy(dtype=np.float64).copy()
            arr.flags.writeable = False
            return arr

        def ro(arr: np.ndarray) -> np.ndarray:
            arr = arr.astype(np.int64)
            arr.flags.writeable = False
            return arr

        return cls(
            models=tuple(models), gpus=tuple(gpus), regions=tuple(regions),
            model=ro(model), gpu=ro(gpu), region=ro(region), pool=ro(region * n_g + gpu),
            e_in=col("e_in_kwh"), e_cache=col("e_cache_kwh"), e_out=col("e_out_kwh"),
            v_pre=col("prefill_tok_s"), v_dec=col("decode_tok_s"),
            context_window=col("context_window"),
        )

    @property
    def n(self) -> int:
        """Number of deployments."""
        return len(self.model)

    @property
    def n_pools(self) -> int:
        """Number of (region, GPU) pools."""
        return len(self.regions) * len(self.gpus)

    def index(self, model: str, gpu: str, region: str) -> int:
        """Index of the deployment (model, gpu, region)."""
        m, g, r = self.models.index(model), self.gpus.index(gpu), self.regions.index(region)
        return (r * len(self.gpus) + g) * len(self.models) + m

    def label(self, a: int) -> str:
        """``"model/GPU/region"`` of deployment ``a``."""
        return (f"{self.models[self.model[a]]}/{self.gpus[self.gpu[a]]}/"
                f"{self.regions[self.region[a]]}")

    def frame(self) -> pd.DataFrame:
        """The deployments as a table (one row per deployment, in index order)."""
        return pd.DataFrame({
            "deployment": np.arange(self.n),
            "model": [self.models[i] for i in self.model],
            "gpu": [self.gpus[i] for i in self.gpu],
            "region": [self.regions[i] for i in self.region],
            "pool": self.pool, "e_in_kwh": self.e_in, "e_cache_kwh": self.e_cache,
            "e_out_kwh": self.e_out, "prefill_tok_s": self.v_pre, "decode_tok_s": self.v_dec,
            "context_window": self.context_window,
        })
