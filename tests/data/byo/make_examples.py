"""Writes the made-up example files of this folder (run from anywhere: ``python make_examples.py``).

Everything here is invented for the examples and tests ("Solaria" and "Ventosa" are not real grid
zones; the profile numbers are plausible, not measured); no third-party data, no licence needed.
``chat_trace.jsonl`` is hand-written and not produced by this script.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
START = pd.Timestamp("2022-01-03T00:00:00Z")  # a Monday; 14 days of data
DAYS = 14


def solaria_hourly() -> pd.DataFrame:
    """A sunny grid: gas at night, solar at noon (gCO2e/kWh, hourly, UTC stamps with 'Z')."""
    t = pd.date_range(START, periods=DAYS * 24, freq="1h")
    hour = t.hour.to_numpy() + 0.5
    sun = np.clip(np.sin((hour - 6) / 12 * math.pi), 0, None)  # 06:00–18:00 UTC
    cloud = 0.5 + 0.5 * np.cos(np.arange(len(t)) / 24 / 3.1 * 2 * math.pi)  # multi-day weather
    ci = 430 - 330 * sun * (0.6 + 0.4 * cloud)
    return pd.DataFrame({"datetime": t.strftime("%Y-%m-%dT%H:%M:%SZ"),
                         "carbon_intensity": np.round(ci, 1)})


def ventosa_15min() -> pd.DataFrame:
    """A windy grid with hydro: slow multi-day swings (gCO2e/kWh, every 15 minutes)."""
    t = pd.date_range(START, periods=DAYS * 96, freq="15min")
    x = np.arange(len(t)) / 96  # days
    wind = 0.5 + 0.3 * np.sin(x / 2.3 * 2 * math.pi) + 0.2 * np.sin(x / 0.9 * 2 * math.pi + 1)
    ci = 60 + 340 * (1 - np.clip(wind, 0, 1))
    return pd.DataFrame({"datetime": t.strftime("%Y-%m-%dT%H:%M:%SZ"),
                         "carbon_intensity": np.round(ci, 1)})


def profiles() -> pd.DataFrame:
    """Made-up "measured" profiles of the five models on two GPU types of one's own (L4, H200):
    J per token converted to kWh/token, tokens/s per deployment."""
    rows = []
    models = ["Gemma-3-1B", "Llama-3.2-3B", "Gemma-3-4B", "Mistral-7B-v0.2", "Llama-3.1-70B"]
    spec = {  # gpu: (n_gpus per model, prefill J/token, kappa, prefill tok/s, decode tok/s)
        "L4": ([1, 1, 1, 1, 8], [0.006, 0.018, 0.024, 0.042, 0.40], 7.0,
               [9000, 3500, 2700, 1500, 1300], [120, 60, 45, 28, 12]),
        "H200": ([1, 1, 1, 1, 2], [0.004, 0.012, 0.016, 0.028, 0.25], 4.0,
                 [60000, 25000, 19000, 11000, 2400], [300, 180, 150, 110, 30]),
    }
    for gpu, (n, e_j, kappa, pre, dec) in spec.items():
        for i, m in enumerate(models):
            e_in = e_j[i] / 3.6e6
            rows.append({"model": m, "gpu": gpu, "n_gpus": n[i], "e_in_kwh": e_in,
                         "e_out_kwh": kappa * e_in, "e_cache_kwh": 0.03 * e_in,
                         "prefill_tok_s": pre[i], "decode_tok_s": dec[i]})
    return pd.DataFrame(rows)


if __name__ == "__main__":
    solaria_hourly().to_csv(HERE / "solaria_hourly.csv", index=False)
    ventosa_15min().to_csv(HERE / "ventosa_15min.csv", index=False)
    profiles().to_csv(HERE / "profiles_l4_h200.csv", index=False, float_format="%.6g")
