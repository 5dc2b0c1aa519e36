"""Section 2 of the paper: how long conversation histories are, and what a KV-cache miss costs.

Figure 2(a) is the distribution of history length per query (its shares come from
:func:`carbonrouter_lib.sharegpt.history_shares`); Figure 2(b) the extra carbon and the extra
prefill latency of serving a query *without* its cached history on the same deployment.
Both work on the turns table of :func:`carbonrouter_lib.sharegpt.load_sharegpt_turns`
(columns ``history_tokens_<family>``, ``new_tokens_<family>``, ``output_tokens_<family>``).

"4K" means 4,096 tokens throughout (as 32K means 32,768 in the spec's context windows).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from carbonrouter_lib import cost

__all__ = [
    "DEFAULT_BUCKETS",
    "sample_sessions",
    "miss_penalty",
    "bucket_summary",
]

#: History buckets of Fig. 2(b), in tokens: (lower, upper] with K = 1,024.
DEFAULT_BUCKETS: tuple[tuple[str, int, float], ...] = (
    ("0–1K", 0, 1024),
    ("1K–2K", 1024, 2048),
    ("2K–4K", 2048, 4096),
    ("4K–8K", 4096, 8192),
    ("> 8K", 8192, np.inf),
)


def sample_sessions(turns: pd.DataFrame, n_sessions: int, seed: int) -> pd.DataFrame:
    """All turns of ``n_sessions`` conversations drawn uniformly without replacement (seeded)."""
    ids = turns["conversation_id"].unique()
    if not 0 < n_sessions <= len(ids):
        raise ValueError(
            f"n_sessions={n_sessions} must be between 1 and the {len(ids)} conversations available"
        )
    chosen = np.random.default_rng(seed).choice(ids, size=n_sessions, replace=False)
    return turns[turns["conversation_id"].isin(chosen)].reset_index(drop=True)


def miss_penalty(turns: pd.DataFrame, profile: pd.Series, family: str) -> pd.DataFrame:
    """Per turn with a history: extra energy (= carbon) and extra prefill time of a cache miss.

    A miss and a hit are compared on the same deployment at the same time, so the carbon intensity
    cancels: extra carbon (%) = 100 · (E_miss − E_hit) / E_hit with Eq. 4 at L = 0 vs L = N_hist,
    using the trace's realized output length. Extra prefill (s) = N_hist / v_pre (Eq. 6).

    Parameters
    ----------
    turns
        Turns table (one row per query).
    profile
        One row of a profiles table (``e_in_kwh``, ``e_cache_kwh``, ``e_out_kwh``,
        ``prefill_tok_s``, and ``context_window`` if present: queries that would not fit are
        dropped and counted in ``DataFrame.attrs["dropped_context"]``).
    family
        Tokenizer family of the profile's model ("gemma3", "llama3", "mistral").
    """
    n_hist = turns[f"history_tokens_{family}"].to_numpy(dtype=np.float64)
    n_new = turns[f"new_tokens_{family}"].to_numpy(dtype=np.float64)
    n_out = turns[f"output_tokens_{family}"].to_numpy(dtype=np.float64)
    fits = np.ones(len(turns), dtype=bool)
    if "context_window" in profile.index:
        fits = n_new + n_hist + n_out <= float(profile["context_window"])
    keep = (n_hist > 0) & fits
    e_in, e_cache, e_out = (float(profile[c]) for c in ("e_in_kwh", "e_cache_kwh", "e_out_kwh"))
    v_pre = float(profile["prefill_tok_s"])
    new, hist, out_tok = n_new[keep], n_hist[keep], n_out[keep]
    e_miss = cost.energy_kwh(e_in, e_cache, e_out, new, hist, 0.0, out_tok)
    e_hit = cost.energy_kwh(e_in, e_cache, e_out, new, hist, hist, out_tok)
    out = pd.DataFrame(
        {
            "conversation_id": turns["conversation_id"].to_numpy()[keep],
            "history_tokens": hist,
            "extra_carbon_pct": 100.0 * (e_miss - e_hit) / e_hit,
            "extra_prefill_s": cost.ttft_s(new, hist, 0.0, v_pre)
            - cost.ttft_s(new, hist, hist, v_pre),
        }
    )
    out.attrs["dropped_context"] = int(np.sum((n_hist > 0) & ~fits))
    out.attrs["first_turns"] = int(np.sum(n_hist == 0))
    return out


def bucket_summary(
    penalty: pd.DataFrame,
    buckets: Sequence[tuple[str, int, float]] = DEFAULT_BUCKETS,
) -> pd.DataFrame:
    """Median and interquartile range of the miss penalty per history bucket (lower, upper]."""
    rows = []
    h = penalty["history_tokens"].to_numpy()
    for label, lo, hi in buckets:
        sel = penalty[(h > lo) & (h <= hi)]
        row = {"bucket": label, "lower_tokens": lo, "upper_tokens": hi, "n_queries": len(sel)}
        for col in ("extra_carbon_pct", "extra_prefill_s"):
            q = sel[col].quantile([0.25, 0.5, 0.75]) if len(sel) else pd.Series([np.nan] * 3)
            row |= {f"{col}_q25": q.iloc[0], f"{col}_median": q.iloc[1], f"{col}_q75": q.iloc[2]}
        rows.append(row)
    return pd.DataFrame(rows)
