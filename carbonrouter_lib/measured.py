"""Measured GPU energy profiles against the analytical model (beyond the paper,
``docs/model.md`` §11.3).

The paper's energy model is analytical (Appendix A, ``docs/model.md`` §3). A profile measurement
(``benchmarks/gpu_profile.py``; the data mirror holds one made on an NVIDIA H200) gives, per model
architecture with random weights: energy per uncached prefill token, the energy of a query's new
tokens on top of cached histories of several lengths, decode energy per token at several batch
sizes, and throughputs. This module turns such a measurement into the analytical model's quantities:

- relative energy across models and the α that fits it (e_in ∝ P^α on one GPU type,
  ``docs/model.md`` §3);
- γ per model: the extra energy per cached history token (least-squares slope of a query's
  energy over the cached history length) over the energy of an uncached prefill token;
- κ per model and batch size: decode energy per output token over the prefill energy per token;
- prefill and decode throughputs per card.

Layer-scaled measurements (a model measured with a fraction of its layers, ``layer_scale`` > 1)
are scaled to the whole model: energies per token × layer_scale, throughputs ÷ layer_scale.

Units: J/token, tokens/s, parameters in billions.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from carbonrouter_lib.profiles import MODEL_SPECS, MODELS, PROFILE_COLUMNS, validate_profiles

__all__ = ["MEASUREMENT_MODEL_NAMES", "load_measurement", "measured_summary", "fit_alpha",
           "calibration", "profile_table"]

#: Names used by the profile measurement → our model names (the model catalog, docs/model.md §2).
MEASUREMENT_MODEL_NAMES: dict[str, str] = {
    "gemma-3-1b": "Gemma-3-1B",
    "llama-3.2-3b": "Llama-3.2-3B",
    "gemma-3-4b": "Gemma-3-4B",
    "mistral-7b-v0.2": "Mistral-7B-v0.2",
    "llama-3.1-70b": "Llama-3.1-70B",
}


def load_measurement(path: str | os.PathLike | None = None) -> dict[str, Any]:
    """A profile measurement (the JSON written by ``benchmarks/gpu_profile.py``). Default: the
    H200 measurement of the data mirror (``profiles/h200_hf_random_weights.json``, verified by
    its SHA-256)."""
    if path is None:
        from carbonrouter_lib.datasets import fetch

        path = fetch("profiles/h200_hf_random_weights.json")
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read a profile measurement from {path}: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise ValueError(f"{path}: no 'results' list (not a profile measurement)")
    doc.setdefault("meta", {})
    doc["meta"]["source"] = str(path)
    return doc


def _slope(x: np.ndarray, y: np.ndarray) -> float:
    """Least-squares slope of y over x."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.size < 2 or np.ptp(x) == 0:
        return float("nan")
    return float(np.polyfit(x, y, 1)[0])


def measured_summary(doc: dict[str, Any]) -> pd.DataFrame:
    """One row per measured model: the analytical model's quantities from the measurement.

    Columns: ``model`` (our name), ``params_b`` (published size, billions), ``layer_scale``,
    ``e_in_j`` (J per uncached prefill token, whole model), ``e_cache_j`` (extra J per cached
    history token), ``gamma`` (= e_cache_j / e_in_j), ``kappa_b<B>`` (decode J per output token at
    batch B over e_in_j) for each batch size measured, ``prefill_tok_s`` and
    ``decode_tok_s_b<B>`` (per sequence; whole model on one card), ``relative_energy`` (e_in_j
    over the 70B's, when measured).
    """
    rows = []
    for i, r in enumerate(doc["results"]):
        name = MEASUREMENT_MODEL_NAMES.get(str(r.get("model", "")).lower())
        if name is None:
            raise ValueError(f"{doc['meta'].get('source', 'measurement')}: results[{i}] has "
                             f"unknown model {r.get('model')!r}; known: "
                             f"{sorted(MEASUREMENT_MODEL_NAMES)}")
        scale = float(r.get("layer_scale", 1.0))
        e_in = float(r["prefill_J_per_tok"]) * scale
        cached = sorted(r.get("cached", []), key=lambda c: c["history"])
        hist = np.array([c["history"] for c in cached], dtype=np.float64)
        j_query = np.array([c["J_per_query"] for c in cached], dtype=np.float64) * scale
        e_cache = _slope(hist, j_query)
        row = {"model": name, "params_b": MODEL_SPECS[name].params_b, "layer_scale": scale,
               "e_in_j": e_in, "e_cache_j": e_cache, "gamma": e_cache / e_in,
               "prefill_tok_s": float(r["prefill_tok_per_s"]) / scale}
        for d in r.get("decode", []):
            b = int(d["batch"])
            row[f"kappa_b{b}"] = float(d["J_per_tok"]) * scale / e_in
            row[f"decode_tok_s_b{b}"] = float(d["seq_tok_per_s"]) / scale
        rows.append(row)
    out = pd.DataFrame(rows)
    order = {m: k for k, m in enumerate(MODELS)}
    out = out.sort_values("model", key=lambda s: s.map(order)).reset_index(drop=True)
    big = out.loc[out["model"] == "Llama-3.1-70B", "e_in_j"]
    out["relative_energy"] = out["e_in_j"] / big.iloc[0] if len(big) else np.nan
    return out


def fit_alpha(summary: pd.DataFrame) -> tuple[float, float]:
    """α of e_in ∝ P^α (Appendix A, ``docs/model.md`` §3: e_in ∝ P / MFU and MFU ∝ P^(1−α)), fitted
    by least squares on
    log e_in over log P across the measured models; returns (α, R² of the fit)."""
    x = np.log(summary["params_b"].to_numpy(np.float64))
    y = np.log(summary["e_in_j"].to_numpy(np.float64))
    if x.size < 2:
        raise ValueError("fit_alpha: need at least two models")
    slope, intercept = np.polyfit(x, y, 1)
    res = y - (slope * x + intercept)
    r2 = 1.0 - float(res @ res) / float(((y - y.mean()) ** 2).sum())
    return float(slope), r2


def calibration(summary: pd.DataFrame, model: str = "Llama-3.1-70B", batch: int = 64
                ) -> dict[str, float]:
    """The analytical model's constants calibrated to a measurement: α fitted across models, and
    γ and κ (decode at ``batch``) of ``model`` — by default the 70B, which serves most queries
    in every replay (notebook 04's mechanisms), so its ratios drive the routing costs."""
    alpha, _ = fit_alpha(summary)
    row = summary.set_index("model").loc[model]
    col = f"kappa_b{batch}"
    if col not in row.index:
        raise KeyError(f"calibration: no decode measurement at batch {batch} for {model}")
    return {"alpha": alpha, "gamma": float(row["gamma"]), "kappa": float(row[col])}


def profile_table(doc: dict[str, Any], gpu: str | None = None, decode_batch: int = 64,
                  require_energy: bool = True) -> pd.DataFrame:
    """A measurement as a profile table in the :func:`~carbonrouter_lib.profiles.
    analytical_profiles` schema (one row per model, ``n_gpus`` 1, ``mfu`` NaN), validated by
    :func:`~carbonrouter_lib.profiles.validate_profiles`: e_in = J per uncached prefill token,
    e_cache = extra J per cached history token (clipped at 0: a measured slope below zero is
    noise), e_out = decode J per output token at ``decode_batch``, in kWh; prefill tokens/s and
    decode tokens/s per sequence at batch 1, per card.

    ``gpu``: the GPU type's name (default: the measurement's device). Without an energy counter
    (a CPU run) the energies are NaN: ``require_energy=False`` returns the table unvalidated
    (same columns), for a dry run; otherwise that is an error.
    """
    summ = measured_summary(doc)
    col = f"kappa_b{decode_batch}"
    if col not in summ.columns:
        raise KeyError(f"profile_table: no decode measurement at batch {decode_batch}")
    e_in = summ["e_in_j"] / 3.6e6
    out = pd.DataFrame({
        "model": summ["model"], "gpu": gpu or str(doc["meta"].get("device", "measured")),
        "n_gpus": 1, "mfu": np.nan, "relative_energy": np.nan,
        "e_in_kwh": e_in, "e_out_kwh": summ[col] * e_in,
        "e_cache_kwh": np.clip(summ["e_cache_j"], 0.0, None) / 3.6e6,
        "prefill_tok_s": summ["prefill_tok_s"],
        "decode_tok_s": summ["decode_tok_s_b1"] if "decode_tok_s_b1" in summ.columns
        else summ[f"decode_tok_s_b{decode_batch}"],
        "params_b": summ["params_b"],
        "context_window": [MODEL_SPECS[m].context_window for m in summ["model"]],
    })
    energies = out[["e_in_kwh", "e_out_kwh", "e_cache_kwh"]].to_numpy()
    if not np.isfinite(energies).all():
        if require_energy:
            raise ValueError(f"{doc['meta'].get('source', 'measurement')}: energies missing "
                             f"(no energy counter?); pass require_energy=False for a dry run")
        return out[[*PROFILE_COLUMNS, "params_b"]]
    out = out.drop(columns="relative_energy")
    return validate_profiles(out, source=str(doc["meta"].get("source", "measurement")))
