"""The paper's main experiment: every policy on one workload, and Table 1 from the records.

:func:`run_policies` replays one prepared workload under several policies (same arrivals, backend
capacity, carbon signal and constraints); :func:`table1` turns the records into the paper's
Table 1 (CO2, quality and energy normalized to Session-Affinity, P95 TTFT in seconds, and
CarbonRouter's CO2 saving over each policy with a paired session-level bootstrap 95% CI), and
:func:`mechanisms` into the quantities of the paper's mechanism figures. The paper's own numbers
are in :mod:`carbonrouter_lib.paper`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

from carbonrouter_lib import metrics
from carbonrouter_lib.build import build_policy
from carbonrouter_lib.carbon import CarbonSignal
from carbonrouter_lib.paper import SENSITIVITY
from carbonrouter_lib.setting import SimulationConfig, backend_config, setting
from carbonrouter_lib.simulator import simulate

__all__ = ["MAIN_POLICIES", "ABLATIONS", "SENSITIVITY_AXES", "run_policies", "summaries",
           "savings", "table1", "table2", "ablation_by_session_length", "mechanisms"]

#: Policies of Table 1, in the paper's row order.
MAIN_POLICIES: tuple[str, ...] = (
    "session-affinity", "carbon-affinity", "gar", "faircarbon", "carbonrouter",
)

#: The sensitivity grids around the paper defaults: the rows and columns of the paper's Table 3
#: (γ × κ) and Table 4 (c × β_Q, KV memory scaled with c), :data:`carbonrouter_lib.paper.
#: SENSITIVITY`, as :func:`carbonrouter_lib.sweep.grid_specs` axes (lists of floats, rows first).
SENSITIVITY_AXES: dict[str, dict[str, list[float]]] = {
    name: {t.index.name: [float(v) for v in t.index],
           t.columns.name: [float(v) for v in t.columns]}
    for name, t in SENSITIVITY.items()
}

#: CarbonRouter and its ablations (docs/model.md §7.6), Table 2's rows.
ABLATIONS: tuple[str, ...] = ("carbonrouter", "carbonrouter-no-gate", "carbonrouter-no-pricing")

MECHANISM_METRICS: tuple[str, ...] = (
    "share_in_cleanest_region", "share_history_recomputed", "switches_per_session",
    "share_on_70b", "share_best_effort", "kv_hit_rate_tokens",
)


def run_policies(
    table: pd.DataFrame,
    config: SimulationConfig | None = None,
    policies: Sequence[str] = MAIN_POLICIES,
    progress: bool = False,
    signal: CarbonSignal | None = None,
    profiles=None,
) -> dict[str, pd.DataFrame]:
    """Replay ``table`` under every policy with one shared signal and backend capacity.

    Parameters
    ----------
    table
        A prepared workload (:func:`.prepared.prepare_workload` or :func:`.prepared.from_turns`).
    config
        The setting; default :class:`SimulationConfig()`, over ``signal``'s regions when a
        signal is given.
    policies
        Registry names or import names ``"package.module:Class"``.
    signal
        A carbon signal of one's own (e.g. :meth:`CarbonSignal.from_csv`); default the
        setting's (:meth:`SimulationConfig.signal`).
    profiles
        A profile table of one's own (DataFrame, CSV path or ProfileTable) in place of the
        setting's; see :attr:`SimulationConfig.profiles`.

    Returns the per-query records per policy name (columns of ``metrics.RECORD_COLUMNS``).
    """
    config = setting(config, signal, profiles)
    signal = config.signal(signal)
    capacity = backend_config(table, config)
    out = {}
    for name in policies:
        policy = build_policy(name, table, config, signal=signal, backend=capacity)
        res = simulate(table, policy, config, signal=signal, backend=capacity, progress=progress)
        out[name] = res.records
    return out


Runs = Mapping[str, "pd.DataFrame | metrics.RunSummary"]


def summaries(runs: Runs) -> pd.DataFrame:
    """:func:`metrics.summarize` of each run (records, or a :class:`metrics.RunSummary`'s
    metrics), one row per policy (index ``policy``, in mapping order)."""
    if all(isinstance(r, pd.DataFrame) for r in runs.values()):
        return metrics.summary_table(runs)
    cols = list(metrics.SUMMARY_METRICS)
    rows = {p: (r.summary[cols] if isinstance(r, metrics.RunSummary)
                else metrics.summarize(r)) for p, r in runs.items()}
    table = pd.DataFrame(rows).T
    table.index.name = "policy"
    return table


def savings(runs: Runs, target: str = "carbonrouter", n_boot: int = 2000,
            seed: int = 0) -> pd.DataFrame:
    """The target's CO2 saving over every other run (%), paired bootstrap 95% CI over
    conversations (from the records, or from the runs' per-conversation sums): columns
    ``saving_pct, ci_low_pct, ci_high_pct``, index ``policy``."""
    if all(isinstance(r, pd.DataFrame) for r in runs.values()):
        saving = metrics.saving_table(runs, target=target, n_boot=n_boot, seed=seed)
        return saving.rename_axis("policy")[["saving_pct", "ci_low_pct", "ci_high_pct"]]
    if target not in runs:
        raise KeyError(f"savings: no run of the target {target!r}")
    rows = {}
    for policy, run in runs.items():
        if policy == target:
            continue
        ci = metrics.paired_saving_ci_sums(runs[target].by_conversation, run.by_conversation,
                                           n_boot=n_boot, seed=seed)
        rows[policy] = {"saving_pct": ci.estimate, "ci_low_pct": ci.low,
                        "ci_high_pct": ci.high}
    out = pd.DataFrame.from_dict(rows, orient="index")
    out.index.name = "policy"
    return out


def table1(records: Runs, n_boot: int = 2000, seed: int = 0,
           target: str = "carbonrouter") -> pd.DataFrame:
    """Table 1 from per-policy runs (records, or :class:`metrics.RunSummary` of service-scale
    replays): normalized CO2, quality and energy, P95 TTFT (s), and the target's CO2 saving over
    each policy (%) with its paired bootstrap 95% CI."""
    summary = summaries(records)
    norm = metrics.normalize(summary)
    saving = savings(records, target=target, n_boot=n_boot, seed=seed)
    out = norm.join(saving, how="left")
    out["total_co2_kg"] = summary["total_co2_kg"]
    out["share_best_effort"] = summary["share_best_effort"]
    out["share_rejected"] = summary["share_rejected"]
    return out.reset_index()


def mechanisms(records: Runs) -> pd.DataFrame:
    """The mechanism quantities per policy (docs/model.md §10): tidy (policy, metric, value)."""
    summary = summaries(records)
    cols = [c for c in MECHANISM_METRICS if c in summary.columns]
    return (summary[cols].rename_axis("policy").reset_index()
            .melt(id_vars="policy", var_name="metric", value_name="value"))


def _changes(records: Mapping[str, pd.DataFrame], target: str, n_boot: int, seed: int,
             sessions=None) -> pd.DataFrame:
    """Each policy's CO2 and P95-TTFT change over ``target`` (%), paired bootstrap CIs."""
    d_co2 = metrics.paired_table(records, target=target, kind="change", metric="carbon_g",
                                 n_boot=n_boot, seed=seed, sessions=sessions)
    d_ttft = metrics.paired_table(records, target=target, kind="change", metric="ttft_s",
                                  statistic="p95", n_boot=n_boot, seed=seed, sessions=sessions)
    cols = ["change_pct", "ci_low_pct", "ci_high_pct"]
    return (d_co2[cols].set_axis(["dco2_pct", "dco2_low_pct", "dco2_high_pct"], axis=1)
            .join(d_ttft[cols].set_axis(["dttft_pct", "dttft_low_pct", "dttft_high_pct"],
                                        axis=1))
            .rename_axis("policy"))


def table2(records: Mapping[str, pd.DataFrame], n_boot: int = 2000, seed: int = 0,
           reference: str = "session-affinity") -> pd.DataFrame:
    """Table 2 (docs/model.md §10) from per-policy records with ``reference`` and :data:`ABLATIONS`:
    CO2 and energy normalized to the reference, P95 TTFT (s), each ablation's CO2 and P95-TTFT
    change over CarbonRouter (%, paired session bootstrap 95% CIs), and the gate's activity
    (switch opportunities and blocked switches per session)."""
    missing = [p for p in (reference, *ABLATIONS) if p not in records]
    if missing:
        raise KeyError(f"table2: records lack {missing}")
    summary = metrics.summary_table({p: records[p] for p in (reference, *ABLATIONS)})
    norm = metrics.normalize(summary, reference=reference).loc[list(ABLATIONS)]
    out = norm[["co2_rel", "energy_rel", "quality_rel", "p95_ttft_s"]].join(
        _changes({p: records[p] for p in ABLATIONS}, ABLATIONS[0], n_boot, seed))
    for col in ("switches_per_session", "switch_opportunities_per_session",
                "gate_blocked_per_session", "share_history_recomputed"):
        out[col] = summary.loc[list(ABLATIONS), col]
    return out.rename_axis("policy").reset_index()


def ablation_by_session_length(
    records: Mapping[str, pd.DataFrame], thresholds: Sequence[int] = (5, 10, 20, 30),
    n_boot: int = 2000, seed: int = 0,
) -> pd.DataFrame:
    """Figure 5 (docs/model.md §10), a tidy table: per session-length group (all, > 5, > 10, …) and
    variant of :data:`ABLATIONS`, the CO2 and P95-TTFT change over CarbonRouter (%) with paired
    bootstrap CIs (resampled within the group), the P95 TTFT (s), switches and blocked switches
    per session, and the group's size."""
    rows = []
    ablations = {p: records[p] for p in ABLATIONS}
    ref = records[ABLATIONS[0]]
    for label, t in [("all", 0)] + [(f"> {t}", t) for t in thresholds]:
        ids = metrics.sessions_longer_than(ref, t)
        if len(ids) == 0:
            continue
        change = _changes(ablations, ABLATIONS[0], n_boot, seed, sessions=ids)
        for policy, rec in ablations.items():
            sub = metrics.summarize(rec.loc[rec["session"].isin(ids)])
            row = {"group": label, "more_than_turns": t, "policy": policy,
                   "n_sessions": len(ids), "p95_ttft_s": sub["p95_ttft_s"],
                   "switches_per_session": sub["switches_per_session"],
                   "gate_blocked_per_session": sub["gate_blocked_per_session"]}
            if policy in change.index:
                row.update(change.loc[policy].to_dict())
            rows.append(row)
    return pd.DataFrame(rows)
