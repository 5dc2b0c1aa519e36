"""The paper's main experiment: every policy on one workload, and Table 1 from the records.

:func:`run_policies` replays one prepared workload under several policies (same arrivals, backend
capacity, carbon signal and constraints); :func:`table1` turns the records into the paper's
Table 1 (CO2, quality and energy normalized to Session-Affinity, P95 TTFT in seconds, and
CarbonRouter's CO2 saving over each policy with a paired session-level bootstrap 95% CI), and
:func:`mechanisms` into the quantities of the paper's mechanism figures (spec §10).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

from carbonrouter_lib import metrics
from carbonrouter_lib.carbon import CarbonConfig, CarbonSignal
from carbonrouter_lib.simulator import SimulationConfig, backend_config, simulate

__all__ = ["MAIN_POLICIES", "PAPER_TABLE1", "PAPER_MECHANISMS", "run_policies", "table1",
           "mechanisms"]

#: Policies of Table 1, in the paper's row order.
MAIN_POLICIES: tuple[str, ...] = (
    "session-affinity", "carbon-affinity", "gar", "faircarbon", "carbonrouter",
)

#: The paper's Table 1 (spec §10): per dataset and policy, CO2 and quality normalized to
#: Session-Affinity, P95 TTFT (s) and CarbonRouter's CO2 saving over the policy (%).
PAPER_TABLE1 = pd.DataFrame(
    [
        ("ShareChat", "session-affinity", 1.000, 1.000, 0.05, 53.7),
        ("ShareChat", "carbon-affinity", 0.586, 0.999, 0.09, 21.0),
        ("ShareChat", "gar", 0.630, 0.973, 1.72, 26.5),
        ("ShareChat", "faircarbon", 0.545, 0.973, 1.67, 15.1),
        ("ShareChat", "carbonrouter", 0.463, 0.979, 0.52, float("nan")),
        ("ShareGPT", "session-affinity", 1.000, 1.000, 0.04, 54.9),
        ("ShareGPT", "carbon-affinity", 0.575, 1.000, 0.05, 21.6),
        ("ShareGPT", "gar", 0.660, 0.976, 0.56, 31.6),
        ("ShareGPT", "faircarbon", 0.544, 0.976, 0.53, 17.0),
        ("ShareGPT", "carbonrouter", 0.451, 0.979, 0.20, float("nan")),
    ],
    columns=["dataset", "policy", "co2_rel", "quality_rel", "p95_ttft_s", "saving_pct"],
)

#: The paper's mechanism numbers (spec §10), for the figures' reference markers.
PAPER_MECHANISMS = pd.DataFrame(
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

MECHANISM_METRICS: tuple[str, ...] = (
    "share_in_cleanest_region", "share_history_recomputed", "switches_per_session",
    "share_on_70b", "share_best_effort", "kv_hit_rate_tokens",
)


def run_policies(
    table: pd.DataFrame,
    config: SimulationConfig | None = None,
    policies: Sequence[str] = MAIN_POLICIES,
    progress: bool = False,
) -> dict[str, pd.DataFrame]:
    """Replay ``table`` under every policy with one shared signal and backend capacity.

    Returns the per-query records per policy name (columns of ``metrics.RECORD_COLUMNS``).
    """
    config = config or SimulationConfig()
    signal = CarbonSignal.from_config(CarbonConfig(year=config.carbon_year,
                                                   regions=config.regions))
    capacity = backend_config(table, config)
    out = {}
    for name in policies:
        res = simulate(table, name, config, signal=signal, backend=capacity, progress=progress)
        out[name] = res.records
    return out


def table1(records: Mapping[str, pd.DataFrame], n_boot: int = 2000, seed: int = 0,
           target: str = "carbonrouter") -> pd.DataFrame:
    """Table 1 from per-policy records: normalized CO2, quality and energy, P95 TTFT (s), and
    the target's CO2 saving over each policy (%) with its paired bootstrap 95% CI."""
    summary = metrics.summary_table(records)
    norm = metrics.normalize(summary)
    saving = metrics.saving_table(records, target=target, n_boot=n_boot, seed=seed)
    saving = saving.rename_axis("policy")[["saving_pct", "ci_low_pct", "ci_high_pct"]]
    out = norm.join(saving, how="left")
    out["total_co2_kg"] = summary["total_co2_kg"]
    out["share_best_effort"] = summary["share_best_effort"]
    out["share_rejected"] = summary["share_rejected"]
    return out.reset_index()


def mechanisms(records: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """The mechanism quantities of spec §10 per policy, as a tidy table (policy, metric, value)."""
    summary = metrics.summary_table(records)
    cols = [c for c in MECHANISM_METRICS if c in summary.columns]
    return (summary[cols].rename_axis("policy").reset_index()
            .melt(id_vars="policy", var_name="metric", value_name="value"))
