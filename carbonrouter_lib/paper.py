"""Every number the paper reports, in one place (arXiv 2610.35230; ``docs/model.md`` §10).

The notebooks set these beside ours; nothing here is computed from our data, and no notebook or
module types a number of the paper anywhere else. Where the paper gives a number as text ("7.8 →
22.4", "58.7–60.7% in all groups") the object's docstring says how it is read. Each object names
the place in the paper it comes from.

Units: shares in [0, 1] unless a column or key ends in ``_pct`` (percent); TTFT in s; energy per
query in mWh; intensities in gCO2e/kWh; CO2 and energy ratios normalized to Session-Affinity = 1.

Policies carry the registry names of :data:`carbonrouter_lib.policies.POLICIES`
(``session-affinity``, ``carbon-affinity``, ``gar`` = GAR†, ``faircarbon``, ``carbonrouter``,
``carbonrouter-no-gate`` = w/o Gate, ``carbonrouter-no-pricing`` = w/o Pricing); datasets the
paper's names (``ShareChat``, ``ShareGPT``: our Mooncake replay stands in for ShareChat).

Contents
--------
- Setting: :data:`PAPER_DATASET` (which of the paper's datasets each of ours stands for),
  :data:`REGIONS`, :data:`MODELS` (the paper's setup, ``docs/model.md`` §2),
  :data:`APPENDIX_A_GPUS`, :data:`DEFAULTS` (Appendix A constants and the default β_Q, D_TTFT, c,
  T_TTL of the paper's model and setup).
- Section 2: :data:`SECTION2_CARBON` (Figure 1), :data:`SECTION2_HISTORY` (Figure 2(a)),
  :data:`SECTION2_MISS_PENALTY` and :data:`SECTION2_MISS_SETTING` (Figure 2(b)).
- Main results: :data:`TABLE1`, :data:`TABLE1_MEAN_SAVING`, :data:`MECHANISMS`.
- By session length: :data:`FIGURE4`, :data:`FIGURE4_RANGES` (:func:`figure4_values`).
- Ablations: :data:`TABLE2`, :data:`FIGURE5`.
- Sensitivity: :data:`TABLE3`, :data:`TABLE4`, :data:`SENSITIVITY`.
"""

from __future__ import annotations

import math

import pandas as pd

__all__ = [
    "PAPER_DATASET",
    "REGIONS",
    "MODELS",
    "APPENDIX_A_GPUS",
    "DEFAULTS",
    "SECTION2_CARBON",
    "SECTION2_HISTORY",
    "SECTION2_MISS_PENALTY",
    "SECTION2_MISS_SETTING",
    "TABLE1",
    "TABLE1_MEAN_SAVING",
    "MECHANISMS",
    "FIGURE4_GROUPS",
    "FIGURE4",
    "FIGURE4_RANGES",
    "figure4_values",
    "TABLE2",
    "FIGURE5",
    "TABLE3",
    "TABLE4",
    "SENSITIVITY",
]

_NAN = math.nan

# ---------------------------------------------------------------------------------------------
# Setting (the paper's setup, Appendix A)
# ---------------------------------------------------------------------------------------------

#: The paper's dataset each of ours stands for (keys: ``prepared.DATASETS``): ShareGPT is the
#: paper's ShareGPT; the Mooncake trace stands in for ShareChat, which is not obtainable
#: (``docs/model.md`` §8). Our ShareChat column is the Mooncake replay.
PAPER_DATASET: dict[str, str] = {"sharegpt": "ShareGPT", "mooncake": "ShareChat"}

#: The paper's four regions, in the order the project breaks ties.
REGIONS: tuple[str, ...] = ("AT", "GB", "BE", "US-CAL-CISO")

#: The five models of the paper's setup: nominal size P_m (billions of parameters), context window
#: (tokens; 32K = 32,768, 128K = 131,072) and GPUs per deployment G_{m,h} on A10, A100-40GB and
#: H100-SXM (every model on one GPU except Llama-3.1-70B).
MODELS = pd.DataFrame(
    [
        ("Gemma-3-1B", 1.0, 32_768, 1, 1, 1),
        ("Llama-3.2-3B", 3.0, 131_072, 1, 1, 1),
        ("Gemma-3-4B", 4.0, 131_072, 1, 1, 1),
        ("Mistral-7B-v0.2", 7.0, 32_768, 1, 1, 1),
        ("Llama-3.1-70B", 70.0, 131_072, 8, 8, 4),
    ],
    columns=["model", "params_b", "context_window", "gpus_A10", "gpus_A100", "gpus_H100"],
)

#: Appendix A datasheet numbers per GPU type (A100 = A100-40GB SXM, H100 = H100-SXM): peak dense
#: FP16 rate F_h (TFLOP/s), TDP_h (W), memory bandwidth B_h (GB/s) and the GPU factor η_h
#: (prefill MFU relative to the A100).
APPENDIX_A_GPUS = pd.DataFrame(
    [
        ("A10", 125.0, 150.0, 600.0, 0.653),
        ("A100", 312.0, 400.0, 1555.0, 1.0),
        ("H100", 989.5, 700.0, 3350.0, 0.69),
    ],
    columns=["gpu", "peak_tflops", "tdp_w", "mem_bw_gb_s", "eta"],
)

#: The paper's default parameters. Appendix A: ``f`` (share of TDP drawn in prefill), ``eta_ref``
#: (MFU of the 70B reference on 8×A100), ``alpha`` (MFU size-law exponent), ``kappa`` (κ =
#: e_out / e_in), ``gamma`` (γ = e_cache / e_in). The model and setup: ``beta_q`` (quality threshold
#: β_Q), ``d_ttft_s`` (TTFT bound D_TTFT, s), ``c`` (capacity factor, K = c·P sessions per
#: region), ``ttl_s`` (KV-cache TTL T_TTL, s: 30 min).
DEFAULTS: dict[str, float] = {
    "f": 0.85,
    "eta_ref": 0.5,
    "alpha": 0.8,
    "kappa": 6.0,
    "gamma": 0.05,
    "beta_q": 0.85,
    "d_ttft_s": 5.0,
    "c": 0.5,
    "ttl_s": 1800.0,
}

# ---------------------------------------------------------------------------------------------
# Section 2 (motivation): Figure 1, Figure 2(a)(b)
# ---------------------------------------------------------------------------------------------

#: Section 2.1 and Figure 1: annual means span ``annual_span_ratio``× across
#: ``annual_span_n_countries`` countries, from ``annual_max`` to ``annual_min`` (country,
#: gCO2e/kWh); within each of the four regions a max/min range of ``range_ratio_low`` to
#: ``range_ratio_high``× over ``range_ratio_year``; a median gap of
#: ``median_cross_region_ratio``× between regions at the same time; each region the cleanest
#: ``cleanest_share_low`` to ``cleanest_share_high`` of the time.
SECTION2_CARBON: dict[str, object] = {
    "annual_span_ratio": 20.4,
    "annual_span_n_countries": 21,
    "annual_max": ("India", 705.0),
    "annual_min": ("Switzerland", 35.0),
    "range_ratio_low": 2.7,
    "range_ratio_high": 5.9,
    "range_ratio_year": 2025,
    "median_cross_region_ratio": 2.25,
    "cleanest_share_low": 0.13,
    "cleanest_share_high": 0.32,
}

#: Section 2.2 and Figure 2(a), ShareGPT: share of queries whose history holds at least this many
#: tokens (index: 4,096 = "4K" and 8,192 = "8K").
SECTION2_HISTORY = pd.Series(
    [0.403, 0.244],
    index=pd.Index([4096, 8192], name="history_tokens_at_least"),
    name="share_of_queries",
)

#: Section 2.2 and Figure 2(b): the median increase of a query's emissions when it misses its
#: KV cache, %, per history bucket (history tokens in (low, high]; "> 8K" has no upper end),
#: under :data:`SECTION2_MISS_SETTING`.
SECTION2_MISS_PENALTY = pd.DataFrame(
    [("2K–4K", 2048, 4096.0, 126.0), ("4K–8K", 4096, 8192.0, 231.0),
     ("> 8K", 8192, math.inf, 632.0)],
    columns=["bucket", "history_low_tokens", "history_high_tokens", "extra_co2_pct_median"],
)

#: Figure 2(b)'s setting and its latency number: ``n_sessions`` random ShareGPT sessions on
#: ``model`` / ``gpu``; a miss adds up to ``max_extra_prefill_s`` seconds of prefill.
SECTION2_MISS_SETTING: dict[str, object] = {
    "dataset": "ShareGPT",
    "model": "Mistral-7B-v0.2",
    "gpu": "A100",
    "n_sessions": 2000,
    "max_extra_prefill_s": 2.5,
}

# ---------------------------------------------------------------------------------------------
# Table 1 and the mechanism figures (Section 6, evaluation)
# ---------------------------------------------------------------------------------------------

#: Table 1: per dataset and policy, CO2 and mean predicted quality normalized to
#: Session-Affinity, P95 TTFT (s) and CarbonRouter's CO2 saving over the policy (%; NaN on
#: CarbonRouter's own row). Rows in the paper's order.
TABLE1 = pd.DataFrame(
    [
        ("ShareChat", "session-affinity", 1.000, 1.000, 0.05, 53.7),
        ("ShareChat", "carbon-affinity", 0.586, 0.999, 0.09, 21.0),
        ("ShareChat", "gar", 0.630, 0.973, 1.72, 26.5),
        ("ShareChat", "faircarbon", 0.545, 0.973, 1.67, 15.1),
        ("ShareChat", "carbonrouter", 0.463, 0.979, 0.52, _NAN),
        ("ShareGPT", "session-affinity", 1.000, 1.000, 0.04, 54.9),
        ("ShareGPT", "carbon-affinity", 0.575, 1.000, 0.05, 21.6),
        ("ShareGPT", "gar", 0.660, 0.976, 0.56, 31.6),
        ("ShareGPT", "faircarbon", 0.544, 0.976, 0.53, 17.0),
        ("ShareGPT", "carbonrouter", 0.451, 0.979, 0.20, _NAN),
    ],
    columns=["dataset", "policy", "co2_rel", "quality_rel", "p95_ttft_s", "saving_pct"],
)

#: Table 1's last column: CarbonRouter's CO2 saving over each policy, % (the mean of the two
#: datasets' savings).
TABLE1_MEAN_SAVING = pd.Series(
    {"session-affinity": 54.3, "carbon-affinity": 21.3, "gar": 29.1, "faircarbon": 16.1},
    name="mean_saving_pct",
).rename_axis("policy")

#: The mechanism numbers of Section 6 (its figures and text), one row per (dataset, policy,
#: metric), ``paper`` the value in the unit of :func:`carbonrouter_lib.metrics.summarize`'s
#: metric of that name (shares in [0, 1], switches per session). "~57% / 67% in the cleanest
#: region" is given for CarbonRouter and FairCarbon alike; "GAR† 28.6%" and Carbon-Affinity's
#: "2.9%" recomputed history are ShareChat's.
MECHANISMS = pd.DataFrame(
    [
        ("ShareGPT", "carbonrouter", "share_in_cleanest_region", 0.67),
        ("ShareGPT", "faircarbon", "share_in_cleanest_region", 0.67),
        ("ShareChat", "carbonrouter", "share_in_cleanest_region", 0.57),
        ("ShareChat", "faircarbon", "share_in_cleanest_region", 0.57),
        ("ShareGPT", "faircarbon", "share_history_recomputed", 0.255),
        ("ShareGPT", "carbonrouter", "share_history_recomputed", 0.100),
        ("ShareChat", "faircarbon", "share_history_recomputed", 0.277),
        ("ShareChat", "carbonrouter", "share_history_recomputed", 0.094),
        ("ShareChat", "gar", "share_history_recomputed", 0.286),
        ("ShareChat", "carbon-affinity", "share_history_recomputed", 0.029),
        ("ShareChat", "faircarbon", "switches_per_session", 7.14),
        ("ShareChat", "carbonrouter", "switches_per_session", 5.58),
        ("ShareChat", "carbon-affinity", "share_on_70b", 0.875),
        ("ShareChat", "session-affinity", "share_on_70b", 0.900),
        ("ShareGPT", "session-affinity", "share_on_70b", 0.820),
        ("ShareChat", "carbonrouter", "share_best_effort", 0.0018),
        ("ShareChat", "faircarbon", "share_best_effort", 0.0076),
    ],
    columns=["dataset", "policy", "metric", "paper"],
)

# ---------------------------------------------------------------------------------------------
# Figure 4: by session length (ShareChat)
# ---------------------------------------------------------------------------------------------

#: Figure 4's session groups: sessions with more than 5, 10, 20 and 30 turns.
FIGURE4_GROUPS: tuple[str, ...] = ("> 5", "> 10", "> 20", "> 30")

#: Figure 4 (ShareChat), the values the paper states per group: CarbonRouter's CO2 saving over
#: FairCarbon (``saving_pct``, %), KV hit rate (share of history tokens served from cache),
#: switches per session, recomputation energy per query (mWh). Metric names are those of
#: :func:`carbonrouter_lib.metrics.summarize`. "FairCarbon 7.8 → 22.4 switches" and "129 → 205
#: mWh" are read as the > 5 and > 30 groups (the first and the last); groups the paper gives no
#: value for have no row. Ranges over all groups are in :data:`FIGURE4_RANGES`.
FIGURE4 = pd.DataFrame(
    [
        ("> 5", 5, "carbonrouter", "saving_pct", 15.3),
        ("> 10", 10, "carbonrouter", "saving_pct", 16.6),
        ("> 20", 20, "carbonrouter", "saving_pct", 19.8),
        ("> 30", 30, "carbonrouter", "saving_pct", 23.1),
        ("> 30", 30, "carbonrouter", "kv_hit_rate_tokens", 0.737),
        ("> 5", 5, "faircarbon", "switches_per_session", 7.8),
        ("> 30", 30, "faircarbon", "switches_per_session", 22.4),
        ("> 30", 30, "carbonrouter", "switches_per_session", 14.9),
        ("> 5", 5, "faircarbon", "recompute_energy_per_query_mwh", 129.0),
        ("> 30", 30, "faircarbon", "recompute_energy_per_query_mwh", 205.0),
    ],
    columns=["group", "more_than_turns", "policy", "metric", "value"],
)

#: Figure 4's statements over all four groups: FairCarbon's KV hit rate stays within 58.7–60.7%,
#: CarbonRouter's recomputation energy within 54–61 mWh per query.
FIGURE4_RANGES = pd.DataFrame(
    [("faircarbon", "kv_hit_rate_tokens", 0.587, 0.607),
     ("carbonrouter", "recompute_energy_per_query_mwh", 54.0, 61.0)],
    columns=["policy", "metric", "low", "high"],
)


def figure4_values(metric: str, policy: str,
                   groups: tuple[str, ...] = FIGURE4_GROUPS) -> list[float]:
    """The paper's Figure 4 value of ``metric`` for ``policy`` in each of ``groups`` (NaN where
    the paper gives none), e.g. ``figure4_values("switches_per_session", "faircarbon")`` →
    ``[7.8, nan, nan, 22.4]``. ``KeyError`` if the paper gives no value of that pair at all."""
    rows = FIGURE4[(FIGURE4["metric"] == metric) & (FIGURE4["policy"] == policy)]
    if rows.empty:
        raise KeyError(f"Figure 4 has no {metric!r} of {policy!r}; pairs: "
                       f"{sorted(set(zip(FIGURE4['metric'], FIGURE4['policy'], strict=True)))}")
    return rows.set_index("group")["value"].reindex(list(groups)).tolist()


# ---------------------------------------------------------------------------------------------
# Table 2 and Figure 5: ablations (ShareChat)
# ---------------------------------------------------------------------------------------------

#: Table 2 (ShareChat): CO2 and energy normalized to Session-Affinity, P95 TTFT (s), and each
#: ablation's change over CarbonRouter (%) with its 95% CI (``dco2_*`` CO2, ``dttft_*`` P95
#: TTFT; NaN on CarbonRouter's row).
TABLE2 = pd.DataFrame(
    [
        ("carbonrouter", 0.463, 0.826, 0.52, _NAN, _NAN, _NAN, _NAN, _NAN, _NAN),
        ("carbonrouter-no-gate", 0.479, 0.854, 0.89, 3.5, 2.6, 4.6, 71.4, 60.3, 81.9),
        ("carbonrouter-no-pricing", 0.504, 0.907, 0.74, 8.9, 7.8, 10.2, 42.4, 35.7, 49.6),
    ],
    columns=["policy", "co2_rel", "energy_rel", "p95_ttft_s", "dco2_pct", "dco2_low_pct",
             "dco2_high_pct", "dttft_pct", "dttft_low_pct", "dttft_high_pct"],
)

#: Figure 5 (ShareChat): the CO2 cost of removing the gate (%) and the switches the gate blocks
#: per session, over all sessions and for sessions with more than 30 turns.
FIGURE5 = pd.DataFrame(
    [("all", 3.5, 0.7), ("> 30", 7.3, 4.1)],
    columns=["group", "no_gate_dco2_pct", "gate_blocked_per_session"],
)

# ---------------------------------------------------------------------------------------------
# Tables 3 and 4: sensitivity (ShareChat)
# ---------------------------------------------------------------------------------------------

#: Table 3 (ShareChat): CarbonRouter's CO2 saving over FairCarbon, %, by γ (rows) and κ
#: (columns), as the paper lays it out (``.stack()`` gives the tidy form).
TABLE3 = pd.DataFrame(
    [[18.8, 16.7, 13.6], [16.8, 15.1, 12.6], [12.9, 12.7, 9.7]],
    index=pd.Index([0.025, 0.05, 0.1], name="gamma"),
    columns=pd.Index([5.0, 6.0, 8.0], name="kappa"),
)

#: Table 4 (ShareChat): CarbonRouter's CO2 saving over FairCarbon, %, by capacity factor c
#: (rows; KV memory scales with c) and quality threshold β_Q (columns).
TABLE4 = pd.DataFrame(
    [[17.8, 15.1, 13.2], [11.4, 11.2, 11.4], [10.7, 9.4, 10.5]],
    index=pd.Index([0.5, 0.35, 0.25], name="c"),
    columns=pd.Index([0.8, 0.85, 0.9], name="beta_q"),
)

#: Tables 3 and 4 under the keys of :data:`carbonrouter_lib.experiments.SENSITIVITY_AXES`.
SENSITIVITY: dict[str, pd.DataFrame] = {"gamma_kappa": TABLE3, "c_beta": TABLE4}
