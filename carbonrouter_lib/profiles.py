"""Energy and latency profiles per (model, GPU) deployment (paper Section 3.2 and Appendix A).

A *profile* gives, for one model on one GPU type, the five numbers the cost model (``cost.py``)
needs: energy per uncached input token ``e_in``, per cached input token ``e_cache``, per output
token ``e_out`` (all kWh/token), prefill throughput ``v_pre`` and decode throughput ``v_dec``
(tokens/s). Two sources give the same table schema:

- :func:`analytical_profiles` — the paper's analytical model from GPU datasheets (Appendix A,
  ``docs/model.md`` §3);
- :func:`load_measured_profiles` — an operator's measured profiles from a CSV file.

Both pass through :func:`validate_profiles`, so the rest of the code never checks again.

The analytical model (Appendix A, ``docs/model.md`` §3), with P_m parameters, F_h peak dense FP16
FLOP/s, TDP_h watts, B_h memory bandwidth in bytes/s, G_{m,h} GPUs per deployment:

- prefill MFU            η_{m,h} = η_ref · (P_m / 70e9)^(1−α) · η_h
- uncached input token   e_in  = 2·P_m · f · TDP_h / (η_{m,h} · F_h)   J/token (/3.6e6 → kWh)
- prefill throughput     v_pre = η_{m,h} · G_{m,h} · F_h / (2·P_m)      tokens/s
- decode throughput      v_dec = G_{m,h} · B_h / (2·P_m)                tokens/s (16-bit weights)
- e_out = κ · e_in,  e_cache = γ · e_in,  ρ_{m,h} = e_in / e_in(Llama-3.1-70B, A100).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from carbonrouter_lib.paper import DEFAULTS

__all__ = [
    "MODELS",
    "GPUS",
    "GPUSpec",
    "ModelSpec",
    "ProfileConstants",
    "GPU_SPECS",
    "MODEL_SPECS",
    "REFERENCE_DEPLOYMENT",
    "PROFILE_COLUMNS",
    "REQUIRED_COLUMNS",
    "ProfileError",
    "ProfileTable",
    "analytical_profiles",
    "load_measured_profiles",
    "validate_profiles",
    "appendix_a_table",
    "GPU_MEMORY_GB",
    "KVGeometry",
    "KV_GEOMETRY",
    "kv_tokens_per_instance",
]

#: Models of the paper, smallest to largest (docs/model.md §2). Tables are ordered this way.
MODELS: tuple[str, ...] = (
    "Gemma-3-1B",
    "Llama-3.2-3B",
    "Gemma-3-4B",
    "Mistral-7B-v0.2",
    "Llama-3.1-70B",
)
#: GPU types of the paper (A100 = A100-40GB, H100 = H100-SXM). Also the tie-break order
#: (docs/model.md §6a.9).
GPUS: tuple[str, ...] = ("A10", "A100", "H100")
#: The deployment every relative energy ρ is normalized to (docs/model.md §3).
REFERENCE_DEPLOYMENT: tuple[str, str] = ("Llama-3.1-70B", "A100")

_J_PER_KWH = 3.6e6
#: Size of the reference model in η_{m,h}'s scaling law (70B, docs/model.md §3), parameters.
_REF_PARAMS = 70e9


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def _positive(obj: object, name: str, value: float) -> None:
    _require(
        isinstance(value, int | float) and np.isfinite(value) and value > 0,
        f"{type(obj).__name__}.{name} must be a finite number > 0, got {value!r}",
    )


@dataclass(frozen=True)
class GPUSpec:
    """Datasheet numbers of one GPU type (one device, not a deployment).

    Parameters
    ----------
    name : str
        GPU type, e.g. ``"A100"``.
    peak_tflops : float
        Peak dense FP16 rate F_h, TFLOP/s.
    tdp_w : float
        Thermal design power TDP_h, W.
    mem_bw_gb_s : float
        Memory bandwidth B_h, GB/s (1 GB = 1e9 bytes).
    eta : float
        GPU factor η_h: achievable prefill MFU relative to the A100 (dimensionless, > 0). It may
        exceed 1 in principle, but the resulting MFU η_{m,h} must stay ≤ 1 (checked when the
        profiles are built).
    """

    name: str
    peak_tflops: float
    tdp_w: float
    mem_bw_gb_s: float
    eta: float

    def __post_init__(self) -> None:
        _require(isinstance(self.name, str) and self.name != "", "GPUSpec.name must be a name")
        for field in ("peak_tflops", "tdp_w", "mem_bw_gb_s", "eta"):
            _positive(self, field, getattr(self, field))


@dataclass(frozen=True)
class ModelSpec:
    """One model of the catalog.

    Parameters
    ----------
    name : str
        Model name, e.g. ``"Mistral-7B-v0.2"``.
    params_b : float
        Nominal size P_m, billions of parameters.
    context_window : int
        Context window, tokens (32K = 32,768, 128K = 131,072; ``docs/model.md``
        §6a.1).
    gpus_per_deployment : tuple of (str, int) pairs, or a mapping
        G_{m,h} for GPU types that need more than one device; every GPU type not listed runs the
        model on one device. A mapping is accepted and stored as sorted pairs (hashable).
    """

    name: str
    params_b: float
    context_window: int
    gpus_per_deployment: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        _require(isinstance(self.name, str) and self.name != "", "ModelSpec.name must be a name")
        _positive(self, "params_b", self.params_b)
        _require(
            isinstance(self.context_window, int | np.integer) and self.context_window > 0,
            f"ModelSpec.context_window must be a positive integer (tokens), "
            f"got {self.context_window!r}",
        )
        pairs = self.gpus_per_deployment
        if isinstance(pairs, Mapping):
            pairs = pairs.items()
        pairs = tuple(sorted((str(g), n) for g, n in pairs))
        for gpu, n in pairs:
            _require(
                isinstance(n, int | np.integer) and n >= 1,
                f"ModelSpec({self.name!r}).gpus_per_deployment[{gpu!r}] must be an integer >= 1, "
                f"got {n!r}",
            )
        object.__setattr__(self, "gpus_per_deployment", tuple((g, int(n)) for g, n in pairs))

    @property
    def params(self) -> float:
        """P_m in parameters (not billions)."""
        return self.params_b * 1e9

    def n_gpus(self, gpu: str) -> int:
        """G_{m,h}: devices of GPU type ``gpu`` one deployment of this model uses."""
        return dict(self.gpus_per_deployment).get(gpu, 1)


@dataclass(frozen=True)
class ProfileConstants:
    """Constants of the analytical profile model (paper defaults, Appendix A, ``docs/model.md`` §3).

    Parameters
    ----------
    f : float
        Fraction of TDP drawn during prefill, in (0, 1].
    eta_ref : float
        Prefill MFU of the 70B reference on 8×A100, in (0, 1].
    alpha : float
        Exponent of the MFU size law (MFU ∝ P^(1−α)), in [0, 1].
    kappa : float
        κ = e_out / e_in, energy of an output token relative to an uncached input token, > 0.
    gamma : float
        γ = e_cache / e_in, energy of a cached input token relative to an uncached one, in [0, 1]
        (a cache hit never costs more than recomputing).
    """

    f: float = DEFAULTS["f"]
    eta_ref: float = DEFAULTS["eta_ref"]
    alpha: float = DEFAULTS["alpha"]
    kappa: float = DEFAULTS["kappa"]
    gamma: float = DEFAULTS["gamma"]

    def __post_init__(self) -> None:
        for name in ("f", "eta_ref", "alpha", "kappa", "gamma"):
            value = getattr(self, name)
            _require(
                isinstance(value, int | float) and np.isfinite(value),
                f"ProfileConstants.{name} must be a finite number, got {value!r}",
            )
        _require(0 < self.f <= 1, f"ProfileConstants.f must be in (0, 1], got {self.f}")
        _require(
            0 < self.eta_ref <= 1, f"ProfileConstants.eta_ref must be in (0, 1], got {self.eta_ref}"
        )
        _require(
            0 <= self.alpha <= 1, f"ProfileConstants.alpha must be in [0, 1], got {self.alpha}"
        )
        _require(self.kappa > 0, f"ProfileConstants.kappa must be > 0, got {self.kappa}")
        _require(
            0 <= self.gamma <= 1, f"ProfileConstants.gamma must be in [0, 1], got {self.gamma}"
        )


#: Appendix A datasheet values (A100 = A100-40GB SXM, H100 = H100-SXM; dense FP16, no sparsity).
GPU_SPECS: dict[str, GPUSpec] = {
    "A10": GPUSpec("A10", peak_tflops=125.0, tdp_w=150.0, mem_bw_gb_s=600.0, eta=0.653),
    "A100": GPUSpec("A100", peak_tflops=312.0, tdp_w=400.0, mem_bw_gb_s=1555.0, eta=1.0),
    "H100": GPUSpec("H100", peak_tflops=989.5, tdp_w=700.0, mem_bw_gb_s=3350.0, eta=0.69),
}

#: Model catalog (docs/model.md §2): sizes, context windows, and the multi-GPU 70B deployments.
MODEL_SPECS: dict[str, ModelSpec] = {
    "Gemma-3-1B": ModelSpec("Gemma-3-1B", 1.0, 32_768),
    "Llama-3.2-3B": ModelSpec("Llama-3.2-3B", 3.0, 131_072),
    "Gemma-3-4B": ModelSpec("Gemma-3-4B", 4.0, 131_072),
    "Mistral-7B-v0.2": ModelSpec("Mistral-7B-v0.2", 7.0, 32_768),
    "Llama-3.1-70B": ModelSpec(
        "Llama-3.1-70B", 70.0, 131_072, (("A10", 8), ("A100", 8), ("H100", 4))
    ),
}
assert tuple(MODEL_SPECS) == MODELS and tuple(GPU_SPECS) == GPUS  # one source of truth

#: Device memory of each GPU type, GB (1 GB = 1e9 bytes; A100 = the 40 GB card).
GPU_MEMORY_GB: dict[str, float] = {"A10": 24.0, "A100": 40.0, "H100": 80.0}


@dataclass(frozen=True)
class KVGeometry:
    """What a model's KV cache and weights take in GPU memory (published configurations).

    Parameters
    ----------
    layers, kv_heads, head_dim : int
        Decoder layers, key/value heads (GQA) and head size.
    weight_params_b : float
        Parameters actually loaded, billions (the published count, not the nominal size P_m:
        Appendix A's 32–147 GB of free memory per Llama-3.1-70B instance uses 70.6B).
    """

    layers: int
    kv_heads: int
    head_dim: int
    weight_params_b: float

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of KV cache per token in 16-bit: 2 (K and V) × layers × KV heads × head size
        × 2 bytes. Sliding-window layers (Gemma-3) are counted in full, as an engine that
        allocates every layer's cache for the whole context does."""
        return 2 * self.layers * self.kv_heads * self.head_dim * 2


#: KV geometry of the catalog's models, from their published configurations (the same
#: hyperparameters ``benchmarks/gpu_profile.py`` builds the models from) and model cards.
KV_GEOMETRY: dict[str, KVGeometry] = {
    "Gemma-3-1B": KVGeometry(layers=26, kv_heads=1, head_dim=256, weight_params_b=1.0),
    "Llama-3.2-3B": KVGeometry(layers=28, kv_heads=8, head_dim=128, weight_params_b=3.21),
    "Gemma-3-4B": KVGeometry(layers=34, kv_heads=4, head_dim=256, weight_params_b=4.3),
    "Mistral-7B-v0.2": KVGeometry(layers=32, kv_heads=8, head_dim=128, weight_params_b=7.24),
    "Llama-3.1-70B": KVGeometry(layers=80, kv_heads=8, head_dim=128, weight_params_b=70.55),
}
assert tuple(KV_GEOMETRY) == MODELS and tuple(GPU_MEMORY_GB) == GPUS


def kv_tokens_per_instance(model: str, gpu: str, memory_fraction: float = 0.9) -> float:
    """KV-cache tokens one instance of ``model`` holds on its ``gpu`` devices (Appendix A's
    arithmetic): (G_{m,h} × device memory × ``memory_fraction`` − 16-bit weights) / KV bytes
    per token. E.g. Llama-3.1-70B: 31.7 GB free on 8×A10, 146.9 GB on 8×A100-40GB and on
    4×H100 → 96,700 / 448,300 / 448,300 tokens at 320 KiB per token.

    Raises ``ValueError`` for an unknown model or GPU, or when the weights do not fit."""
    if model not in KV_GEOMETRY or gpu not in GPU_MEMORY_GB:
        raise ValueError(f"kv_tokens_per_instance: unknown model {model!r} or GPU {gpu!r} "
                         f"(models {MODELS}, GPUs {GPUS})")
    if not 0 < memory_fraction <= 1:
        raise ValueError(f"memory_fraction must be in (0, 1], got {memory_fraction!r}")
    geo = KV_GEOMETRY[model]
    free = (MODEL_SPECS[model].n_gpus(gpu) * GPU_MEMORY_GB[gpu] * 1e9 * memory_fraction
            - 2.0 * geo.weight_params_b * 1e9)
    if free <= 0:
        raise ValueError(f"{model}'s 16-bit weights do not fit on its {gpu} deployment")
    return free / geo.kv_bytes_per_token


#: Columns of a profile table, in this order (extra columns may follow).
PROFILE_COLUMNS: tuple[str, ...] = (
    "model",
    "gpu",
    "n_gpus",
    "mfu",
    "relative_energy",
    "e_in_kwh",
    "e_out_kwh",
    "e_cache_kwh",
    "prefill_tok_s",
    "decode_tok_s",
)
#: Columns a measured profile file must have; the others are derived or filled (see
#: :func:`validate_profiles`).
REQUIRED_COLUMNS: tuple[str, ...] = (
    "model",
    "gpu",
    "e_in_kwh",
    "e_out_kwh",
    "e_cache_kwh",
    "prefill_tok_s",
    "decode_tok_s",
)
_EXTRA_COLUMNS: tuple[str, ...] = ("params_b", "context_window")


class ProfileError(ValueError):
    """A profile table (file or DataFrame) that breaks the schema; the message names where."""


def _merge_specs(
    defaults: Mapping[str, Any], overrides: Mapping[str, Any] | None, kind: type, what: str
) -> dict[str, Any]:
    """Defaults updated by ``overrides``: each value a full spec or a dict of changed fields.

    Names not in the defaults are appended (after the defaults, in the given order) and must be
    full specs. In a dict of fields, a ``gpus_per_deployment`` mapping updates the model's GPU
    counts per GPU type (others keep theirs); a full spec replaces everything.
    """
    merged = dict(defaults)
    for name, value in (overrides or {}).items():
        if isinstance(value, kind):
            _require(
                value.name == name,
                f"{what}[{name!r}] is a {kind.__name__} named {value.name!r}; names must match",
            )
            merged[name] = value
        elif isinstance(value, Mapping):
            if name not in merged:
                raise ValueError(
                    f"{what}[{name!r}]: unknown name, give a full {kind.__name__} to add it "
                    f"(known: {', '.join(merged)})"
                )
            fields = {f.name for f in dataclasses.fields(kind)} - {"name"}
            unknown = set(value) - fields
            if unknown:
                raise TypeError(
                    f"{what}[{name!r}]: unknown field(s) {sorted(unknown)}; "
                    f"allowed: {sorted(fields)}"
                )
            changes = dict(value)
            if isinstance(changes.get("gpus_per_deployment"), Mapping):
                # Update G_{m,h} per GPU type rather than replace the whole table: overriding
                # {"H100": 8} must not silently reset the model's other multi-GPU counts to 1.
                old = dict(merged[name].gpus_per_deployment)
                changes["gpus_per_deployment"] = old | dict(changes["gpus_per_deployment"])
            merged[name] = dataclasses.replace(merged[name], **changes)
        else:
            raise TypeError(
                f"{what}[{name!r}] must be a {kind.__name__} or a dict of its fields, "
                f"got {type(value).__name__}"
            )
    return merged


def analytical_profiles(
    *,
    gpus: Mapping[str, GPUSpec | Mapping[str, Any]] | None = None,
    models: Mapping[str, ModelSpec | Mapping[str, Any]] | None = None,
    constants: ProfileConstants | None = None,
    **overrides: float,
) -> pd.DataFrame:
    """The paper's analytical profiles, one row per (model, GPU) (Appendix A, ``docs/model.md`` §3).

    Parameters
    ----------
    gpus : mapping, optional
        Changes to :data:`GPU_SPECS`: ``{"A10": GPUSpec(...)}`` replaces a spec,
        ``{"A10": {"tdp_w": 200.0}}`` changes only the named fields, and a full ``GPUSpec``
        under a new name adds a GPU type (after the defaults).
    models : mapping, optional
        Changes to :data:`MODEL_SPECS`, same scheme (e.g.
        ``{"Llama-3.1-70B": {"gpus_per_deployment": {"H100": 8}}}`` changes the 70B's H100 count
        only; its A10 and A100 counts stay 8).
    constants : ProfileConstants, optional
        The constants; default the paper's.
    **overrides : float
        Any field of :class:`ProfileConstants` (``f``, ``eta_ref``, ``alpha``, ``kappa``,
        ``gamma``), applied on top of ``constants``. Any other keyword raises ``TypeError``.

    Returns
    -------
    pandas.DataFrame
        Rows model-major (catalog order, then GPU order); columns :data:`PROFILE_COLUMNS`
        (``n_gpus`` devices, ``mfu`` η_{m,h}, ``relative_energy`` ρ, energies in kWh/token,
        throughputs in tokens/s), then ``params_b`` (billions) and ``context_window`` (tokens).

    Notes
    -----
    ``e_in`` carries no G_{m,h}, as in the spec: a deployment of G devices draws G·f·TDP watts
    but also prefills G times faster, so its energy per token, G·f·TDP / v_pre, does not depend
    on G. The throughputs do scale with G. ``relative_energy`` is normalized to
    (Llama-3.1-70B, A100) when that pair is in the table, which it is unless it was renamed away.
    """
    allowed = {f.name for f in dataclasses.fields(ProfileConstants)}
    unknown = set(overrides) - allowed
    if unknown:
        raise TypeError(
            f"analytical_profiles: unknown keyword(s) {sorted(unknown)}; allowed: gpus, models, "
            f"constants, {', '.join(sorted(allowed))}"
        )
    const = dataclasses.replace(constants or ProfileConstants(), **overrides)
    gpu_specs = _merge_specs(GPU_SPECS, gpus, GPUSpec, "gpus")
    model_specs = _merge_specs(MODEL_SPECS, models, ModelSpec, "models")

    rows = []
    for model in model_specs.values():
        p = model.params  # parameters
        for gpu in gpu_specs.values():
            peak = gpu.peak_tflops * 1e12  # FLOP/s
            mfu = const.eta_ref * (p / _REF_PARAMS) ** (1.0 - const.alpha) * gpu.eta
            _require(
                0 < mfu <= 1,
                f"analytical_profiles: MFU of {model.name} on {gpu.name} is {mfu:.4g} > 1; "
                f"check eta_ref, alpha and the GPU factor eta",
            )
            n = model.n_gpus(gpu.name)
            # 2·P FLOPs per token at an effective mfu·F FLOP/s per device drawing f·TDP watts.
            e_in_j = 2.0 * p * const.f * gpu.tdp_w / (mfu * peak)
            rows.append(
                {
                    "model": model.name,
                    "gpu": gpu.name,
                    "n_gpus": n,
                    "mfu": mfu,
                    "e_in_kwh": e_in_j / _J_PER_KWH,
                    "prefill_tok_s": mfu * n * peak / (2.0 * p),
                    # Batch-one decode reads all 2·P bytes of 16-bit weights once per token.
                    "decode_tok_s": n * gpu.mem_bw_gb_s * 1e9 / (2.0 * p),
                    "params_b": model.params_b,
                    "context_window": model.context_window,
                }
            )
    df = pd.DataFrame(rows)
    df["e_out_kwh"] = const.kappa * df["e_in_kwh"]
    df["e_cache_kwh"] = const.gamma * df["e_in_kwh"]
    df["relative_energy"] = _relative_energy(df)
    df = df[list(PROFILE_COLUMNS) + list(_EXTRA_COLUMNS)]
    df.attrs["source"] = "analytical"
    df.attrs["constants"] = dataclasses.asdict(const)
    return validate_profiles(df, source="analytical_profiles()")


def _relative_energy(df: pd.DataFrame) -> pd.Series:
    """e_in / e_in(reference); the reference is (Llama-3.1-70B, A100), else the largest e_in."""
    ref = df[(df["model"] == REFERENCE_DEPLOYMENT[0]) & (df["gpu"] == REFERENCE_DEPLOYMENT[1])]
    denom = ref["e_in_kwh"].iloc[0] if len(ref) else df["e_in_kwh"].max()
    return df["e_in_kwh"] / denom


def validate_profiles(
    df: pd.DataFrame, source: str = "profiles", first_row: int = 0, row_word: str = "row"
) -> pd.DataFrame:
    """Check a profile table and return it in canonical form (a new DataFrame).

    Rules (each failure raises :class:`ProfileError` naming ``source``, the row and column):

    - columns :data:`REQUIRED_COLUMNS` present; ``model`` and ``gpu`` non-empty strings;
      (model, gpu) unique;
    - ``e_in_kwh``, ``e_out_kwh``, ``prefill_tok_s``, ``decode_tok_s`` finite and > 0;
      ``e_cache_kwh`` finite, ≥ 0 and ≤ ``e_in_kwh`` (a cache hit never costs more than a miss);
    - ``n_gpus`` (optional) a positive integer; when absent, taken from the catalog for known
      pairs and required otherwise;
    - ``context_window`` (optional) a positive integer, tokens; when absent, taken from the
      catalog for known models and required otherwise;
    - ``mfu`` (optional, NaN allowed: measured profiles have none) in (0, 1];
    - ``relative_energy`` (optional) recomputed from ``e_in_kwh`` when absent (see
      :func:`analytical_profiles`); when present it must be finite and > 0.

    Any names are allowed for models and GPU types (an operator's own deployments). Rows are kept
    in the given order; the index is reset. Messages name rows as ``f"{row_word} {first_row + i}"``
    (a CSV loader passes ``"line"`` and the file line of the first data row).
    """
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"{source}: expected a pandas DataFrame, got {type(df).__name__}")
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise ProfileError(
            f"{source}: missing column(s) {missing}; required: {list(REQUIRED_COLUMNS)}"
        )
    if len(df) == 0:
        raise ProfileError(f"{source}: no rows")
    out = df.reset_index(drop=True).copy()
    where = [f"{row_word} {i + first_row}" for i in range(len(out))]

    def fail(i: int, msg: str) -> None:
        raise ProfileError(f"{source}, {where[i]}: {msg}")

    for col in ("model", "gpu"):
        for i, v in enumerate(out[col]):
            if not isinstance(v, str) or v.strip() == "":
                fail(i, f"{col} must be a non-empty name, got {v!r}")
        out[col] = out[col].str.strip()
    dup = out.duplicated(["model", "gpu"], keep=False)
    if dup.any():
        idx = np.flatnonzero(dup.to_numpy())
        first = out.loc[idx[0], ["model", "gpu"]].tolist()
        same = [where[j] for j in idx if out.loc[j, ["model", "gpu"]].tolist() == first]
        raise ProfileError(f"{source}: (model, gpu) = {tuple(first)} appears in {', '.join(same)}")

    def numeric(col: str, allow_nan: bool = False) -> np.ndarray:
        raw = out[col]
        vals = pd.to_numeric(raw, errors="coerce").astype(float).to_numpy()
        bad = np.isnan(vals) & (raw.notna().to_numpy() | (not allow_nan))
        bad |= np.isinf(vals)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            fail(i, f"{col} must be a finite number, got {raw.iloc[i]!r}")
        return vals

    for col in ("e_in_kwh", "e_out_kwh", "prefill_tok_s", "decode_tok_s"):
        vals = numeric(col)
        if (vals <= 0).any():
            i = int(np.flatnonzero(vals <= 0)[0])
            fail(i, f"{col} must be > 0, got {vals[i]!r}")
        out[col] = vals
    cache = numeric("e_cache_kwh")
    bad = (cache < 0) | (cache > out["e_in_kwh"].to_numpy())
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        fail(
            i,
            f"e_cache_kwh must be in [0, e_in_kwh = {out['e_in_kwh'].iloc[i]!r}], got {cache[i]!r}",
        )
    out["e_cache_kwh"] = cache

    def integer_column(col: str, from_catalog) -> None:
        if col in out.columns:
            vals = numeric(col)
        else:
            vals = np.array(
                [from_catalog(m, g) for m, g in zip(out["model"], out["gpu"], strict=True)], float
            )
            if np.isnan(vals).any():
                i = int(np.flatnonzero(np.isnan(vals))[0])
                fail(
                    i,
                    f"no {col} column and {out['model'].iloc[i]!r} on "
                    f"{out['gpu'].iloc[i]!r} is not in the catalog; add the column",
                )
        bad = (vals < 1) | (vals != np.round(vals))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            fail(i, f"{col} must be a positive integer, got {vals[i]!r}")
        out[col] = vals.astype(np.int64)

    def catalog_gpus(m: str, g: str) -> float:
        return MODEL_SPECS[m].n_gpus(g) if m in MODEL_SPECS and g in GPU_SPECS else np.nan

    def catalog_window(m: str, g: str) -> float:
        return MODEL_SPECS[m].context_window if m in MODEL_SPECS else np.nan

    integer_column("n_gpus", catalog_gpus)
    integer_column("context_window", catalog_window)

    if "mfu" in out.columns:
        mfu = numeric("mfu", allow_nan=True)
        bad = ~np.isnan(mfu) & ((mfu <= 0) | (mfu > 1))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            fail(i, f"mfu must be in (0, 1] (or empty), got {mfu[i]!r}")
        out["mfu"] = mfu
    else:
        out["mfu"] = np.nan
    if "relative_energy" in out.columns:
        rel = numeric("relative_energy")
        if (rel <= 0).any():
            i = int(np.flatnonzero(rel <= 0)[0])
            fail(i, f"relative_energy must be > 0, got {rel[i]!r}")
        out["relative_energy"] = rel
    else:
        out["relative_energy"] = _relative_energy(out)
    if "params_b" in out.columns:
        out["params_b"] = numeric("params_b", allow_nan=True)

    extra = [c for c in out.columns if c not in PROFILE_COLUMNS]
    result = out[list(PROFILE_COLUMNS) + extra]
    result.attrs = dict(df.attrs)
    result.attrs.setdefault("source", source)
    return result


def load_measured_profiles(path: str | os.PathLike, complete: bool = True) -> pd.DataFrame:
    """Load an operator's measured profiles from a CSV file (schema of :func:`validate_profiles`).

    Parameters
    ----------
    path : path-like
        CSV with a header row and at least the columns :data:`REQUIRED_COLUMNS` (energies in
        kWh/token, throughputs in tokens/s). A table written by ``analytical_profiles().to_csv(
        path, index=False)`` round-trips.
    complete : bool
        Require a row for every (model, GPU) pair of the models and GPUs the file names (a
        replay deploys every model on every GPU type; default). False accepts any subset.

    Returns
    -------
    pandas.DataFrame
        The validated table, in file order, columns :data:`PROFILE_COLUMNS` then any extras.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ProfileError
        If the file is empty or breaks the schema; the message names the file and its line.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"measured profiles: no such file {path}")
    try:
        raw = pd.read_csv(path, dtype={"model": str, "gpu": str}, skipinitialspace=True)
    except pd.errors.EmptyDataError as exc:
        raise ProfileError(f"{path}: empty file") from exc
    except pd.errors.ParserError as exc:
        raise ProfileError(f"{path}: not a readable CSV ({exc})") from exc
    # Line 1 is the header, so data row i sits on line i + 2 (messages point into the file).
    df = validate_profiles(raw, source=str(path), first_row=2, row_word="line")
    if complete:
        have = set(zip(df["model"], df["gpu"], strict=True))
        models, gpus = dict.fromkeys(df["model"]), dict.fromkeys(df["gpu"])
        missing = [(m, g) for m in models for g in gpus if (m, g) not in have]
        if missing:
            raise ProfileError(f"{path}: no row for the (model, GPU) pairs {missing}: a replay "
                               f"deploys every model it names on every GPU type it names "
                               f"(complete=False accepts a subset)")
    df.attrs["source"] = str(path)
    return df


class ProfileTable:
    """A validated profile table and the SHA-256 of its content: what
    :attr:`carbonrouter_lib.setting.SimulationConfig.profiles` holds.

    Two tables are equal (and hash alike) when their content is, so a setting that carries one
    can key caches (``functools.lru_cache``, sweep and gate keys) without ever hashing a
    DataFrame. Build one with :meth:`of`.

    Attributes
    ----------
    frame : pandas.DataFrame
        The table as :func:`validate_profiles` returns it (do not modify it).
    sha256 : str
        SHA-256 (hex) of the file's bytes for a table read from a file, else of the validated
        table written as CSV.
    path : str or None
        Absolute path of the file it was read from; None for a table given as a DataFrame.
    """

    __slots__ = ("frame", "sha256", "path")

    def __init__(self, frame: pd.DataFrame, sha256: str, path: str | None = None) -> None:
        self.frame = frame
        self.sha256 = sha256
        self.path = path

    @classmethod
    def of(cls, source: Any) -> ProfileTable:
        """A profile table from a DataFrame (validated), a CSV path
        (:func:`load_measured_profiles`), an existing ProfileTable, or the JSON form of
        :meth:`to_json` (``{"path": ..., "sha256": ...}``: the file is read and must still have
        that SHA-256).

        Raises
        ------
        ProfileError
            The table breaks the schema, or a file's content differs from the ``sha256`` given.
        FileNotFoundError
            A path that does not exist.
        TypeError
            Anything else, or the JSON form of a table that was given as a DataFrame.
        """
        if isinstance(source, ProfileTable):
            return source
        if isinstance(source, pd.DataFrame):
            frame = validate_profiles(source, source="profiles (DataFrame)")
            blob = frame.to_csv(index=False).encode()
            return cls(frame, hashlib.sha256(blob).hexdigest())
        expected = None
        if isinstance(source, Mapping):
            if set(source) != {"path", "sha256"} or source["path"] is None:
                raise TypeError(
                    f"profiles {dict(source)!r}: the JSON form of a profile file is "
                    f"{{'path': ..., 'sha256': ...}}; a table given as a DataFrame cannot be "
                    f"rebuilt from JSON (save it as CSV and pass the path)")
            source, expected = source["path"], source["sha256"]
        if not isinstance(source, str | os.PathLike):
            raise TypeError(f"profiles must be a DataFrame, a CSV path or a ProfileTable, got "
                            f"{type(source).__name__}")
        from carbonrouter_lib.datasets import sha256_of

        path = Path(source).resolve()
        frame = load_measured_profiles(path)
        sha = sha256_of(path)
        if expected is not None and sha != expected:
            raise ProfileError(f"{path}: content changed (SHA-256 {sha[:12]}…, the setting was "
                               f"made with {str(expected)[:12]}…)")
        return cls(frame, sha, str(path))

    def to_json(self) -> dict[str, str | None]:
        """``{"path": absolute path or None, "sha256": ...}`` (recorded with results)."""
        return {"path": self.path, "sha256": self.sha256}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProfileTable) and other.sha256 == self.sha256

    def __hash__(self) -> int:
        return hash(self.sha256)

    def __repr__(self) -> str:
        where = self.path or "DataFrame"
        return f"ProfileTable({where}, {len(self.frame)} rows, sha256={self.sha256[:12]}…)"


def appendix_a_table(profiles: pd.DataFrame) -> pd.DataFrame:
    """The Appendix A summary of a profile table, in readable units.

    Returns one row per deployment with ``model``, ``gpu``, ``n_gpus``, ``mfu``,
    ``relative_energy`` (ρ, dimensionless), ``e_in_mwh_per_1k`` (mWh per 1,000 uncached input
    tokens), ``e_out_mwh_per_1k``, ``prefill_tok_s`` and ``decode_tok_s`` (tokens/s).
    """
    p = validate_profiles(profiles, source="appendix_a_table(profiles)")
    kwh_to_mwh_per_1k = 1e3 * 1e6  # 1,000 tokens × 1e6 mWh/kWh
    return pd.DataFrame(
        {
            "model": p["model"],
            "gpu": p["gpu"],
            "n_gpus": p["n_gpus"],
            "mfu": p["mfu"],
            "relative_energy": p["relative_energy"],
            "e_in_mwh_per_1k": p["e_in_kwh"] * kwh_to_mwh_per_1k,
            "e_out_mwh_per_1k": p["e_out_kwh"] * kwh_to_mwh_per_1k,
            "prefill_tok_s": p["prefill_tok_s"],
            "decode_tok_s": p["decode_tok_s"],
        }
    )
