"""Figures the notebooks share: our values as bars, the paper's as black marks on them.

Every figure that sets our numbers beside the paper's draws bars and marks the paper's value of a
bar with a short black horizontal line at the bar's x (:func:`bars_with_paper`). Built on it:

- :func:`mechanism_panels` — one panel per mechanism quantity, one bar per policy: notebook 04's
  :func:`mechanisms_figure` and the explorer's :func:`carbonrouter_lib.explore.plot_mechanisms`;
- :func:`session_length_figure` — Figure 4 by session length (notebook 05);
- :func:`ablation_figure` — Figure 5, the ablations by session length (notebook 06).

The paper's values come from :mod:`carbonrouter_lib.paper`; ShareChat's are marked on the Mooncake
trace's panels (:data:`carbonrouter_lib.paper.PAPER_DATASET`). Units are those of the plotted
columns: shares in [0, 1], switches per session, %, s, mWh per query. Matplotlib is imported
when a figure is drawn, not with the module (its constants serve the explorer's widgets too).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from carbonrouter_lib.paper import FIGURE4, FIGURE5, MECHANISMS, PAPER_DATASET, figure4_values

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "DATASET_LABELS",
    "POLICY_LABELS",
    "ABLATION_LABELS",
    "MECHANISMS_SHOWN",
    "bars_with_paper",
    "paper_marks",
    "mechanism_panels",
    "mechanisms_figure",
    "session_length_figure",
    "ablation_figure",
]

#: How a dataset is named on axes and in printed tables.
DATASET_LABELS: dict[str, str] = {
    "sharegpt": "ShareGPT", "mooncake": "Mooncake (ShareChat stand-in)",
}

#: Short policy names for the axes of the mechanism figure.
POLICY_LABELS: dict[str, str] = {
    "session-affinity": "SA", "carbon-affinity": "CA", "gar": "GAR†", "faircarbon": "FC",
    "carbonrouter": "CR", "carbonrouter-no-gate": "CR w/o gate",
    "carbonrouter-no-pricing": "CR w/o pricing", "carbonrouter-oracle-gate": "CR oracle gate",
}

#: CarbonRouter and its variants as the paper's Table 2 and Figure 5 name them.
ABLATION_LABELS: dict[str, str] = {
    "carbonrouter": "CarbonRouter", "carbonrouter-no-gate": "w/o Gate",
    "carbonrouter-no-pricing": "w/o Pricing", "carbonrouter-oracle-gate": "oracle gate",
}

#: The panels of the mechanism figure (metrics of :func:`carbonrouter_lib.experiments.mechanisms`).
MECHANISMS_SHOWN: tuple[str, ...] = (
    "share_in_cleanest_region", "share_history_recomputed", "switches_per_session",
    "share_on_70b", "share_best_effort",
)

#: Bar colours of Figure 5's variants.
_ABLATION_COLORS: dict[str, str] = {
    "carbonrouter": "tab:purple", "carbonrouter-no-gate": "tab:gray",
    "carbonrouter-no-pricing": "tab:orange",
}


def bars_with_paper(
    ax: Axes,
    x: Any,
    heights: Any,
    paper: Sequence[float] | None = None,
    *,
    ci: tuple[Any, Any] | None = None,
    markersize: float = 18,
    **bar_kwargs: Any,
) -> None:
    """Bars of ``heights`` at ``x`` and the paper's value of each bar as a black mark on it.

    Parameters
    ----------
    ax
        The axes to draw on.
    x, heights
        Bar positions and heights (``heights`` in the unit of the quantity; NaN: no bar).
    paper
        The paper's value of each bar, same length as ``x``, same unit (NaN: the paper gives
        none, no mark); None: no marks.
    ci
        ``(low, high)``: each bar's confidence interval, drawn as black error bars.
    markersize
        Width of a mark (points).
    bar_kwargs
        Passed to :meth:`matplotlib.axes.Axes.bar` (``width``, ``color``, ``alpha``, ``label``).
    """
    ax.bar(x, heights, **bar_kwargs)
    if ci is not None:
        low, high = ci
        ax.errorbar(x, heights, yerr=[heights - low, high - heights], fmt="none", color="black",
                    capsize=3)
    if paper is not None:  # one mark per bar, each right after the bars (figures' order)
        for xi, value in zip(x, paper, strict=True):
            if not pd.isna(value):
                paper_marks(ax, [xi], [value], markersize)


def paper_marks(ax: Axes, x: Any, paper: Sequence[float] | None, markersize: float = 18) -> None:
    """The paper's values at ``x`` as black marks, one line of markers (NaN: no mark; None:
    nothing). Drawn after the bars of a panel, so that they lie on top of every bar."""
    if paper is not None:
        ax.plot(x, paper, "k_", markersize=markersize, mew=2)


def _paper_mechanisms(dataset: str | None) -> dict[tuple[str, str], float]:
    """The paper's mechanism values ``{(policy, metric): value}`` for ``dataset``'s counterpart."""
    if dataset is None:
        return {}
    ref = MECHANISMS[MECHANISMS["dataset"] == PAPER_DATASET[dataset]]
    return ref.set_index(["policy", "metric"])["paper"].to_dict()


def mechanism_panels(
    axes: Sequence[Axes],
    mechanisms: pd.DataFrame,
    dataset: str | None = None,
    metrics_shown: Sequence[str] = MECHANISMS_SHOWN,
    labels: Mapping[str, str] = POLICY_LABELS,
    **tick_kwargs: Any,
) -> None:
    """One panel per quantity of ``metrics_shown`` on ``axes`` (a row), one bar per policy of
    ``mechanisms`` (tidy ``policy, metric, value``, :func:`.experiments.mechanisms`; policies in
    their order there, coloured in turn), the paper's value marked where it reports one for
    ``dataset``'s counterpart, the policies' ``labels`` under the bars (``tick_kwargs`` go to
    :meth:`~matplotlib.axes.Axes.set_xticks`) and the quantity as the title."""
    import matplotlib.pyplot as plt

    values = mechanisms.set_index(["policy", "metric"])["value"]
    policies = list(dict.fromkeys(mechanisms["policy"]))
    paper = _paper_mechanisms(dataset)
    x = np.arange(len(policies))
    for ax, metric in zip(axes, metrics_shown, strict=True):
        bars_with_paper(ax, x, [values.get((p, metric), np.nan) for p in policies],
                        [paper.get((p, metric), np.nan) for p in policies],
                        color=plt.cm.tab10(x % 10))
        ax.set_xticks(x, [labels.get(p, p) for p in policies], **tick_kwargs)
        ax.set_title(metric.replace("_", " "), fontsize=9)


def mechanisms_figure(mechanisms: pd.DataFrame, datasets: Sequence[str], region_set: str,
                      metrics_shown: Sequence[str] = MECHANISMS_SHOWN) -> Figure:
    """Notebook 04's mechanism figure of one region set: a row of :func:`mechanism_panels` per
    dataset. ``mechanisms`` is the tidy table of every replay with ``dataset`` and
    ``region_set`` columns."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(datasets), len(metrics_shown),
                             figsize=(17, 3.3 * len(datasets)), squeeze=False)
    for r, ds in enumerate(datasets):
        sub = mechanisms[(mechanisms["dataset"] == ds) & (mechanisms["region_set"] == region_set)]
        mechanism_panels(axes[r], sub, ds, metrics_shown)
        axes[r, 0].set_ylabel(DATASET_LABELS[ds], fontsize=9)
    fig.suptitle(f"Mechanisms, region set '{region_set}' (black: paper)")
    fig.tight_layout()
    return fig


def session_length_figure(groups: pd.DataFrame, bound_groups: pd.DataFrame,
                          datasets: Sequence[str]) -> Figure:
    """Figure 4 (notebook 05): per dataset, by session-length group, (a) CarbonRouter's CO2
    saving over FairCarbon with and without its gate (95% CIs), (b)–(d) KV hit rate, switches
    per session and recomputation energy per query of FairCarbon and CarbonRouter, each with the
    paper's values (:data:`.paper.FIGURE4`) marked on its bars, and (e), beyond the paper,
    CarbonRouter's CO2 and the clairvoyant bound relative to FairCarbon.

    ``groups`` is the notebook's table per dataset and group (columns ``saving_pct``,
    ``ci_low_pct``, ``ci_high_pct``, the same prefixed ``no gate: ``, and ``<policy>: <metric>``);
    ``bound_groups`` is :func:`.bound.bound_comparison` per group with a ``dataset`` column.
    """
    import matplotlib.pyplot as plt

    panels = [("saving_pct", "saving over FairCarbon (%)"),
              ("kv_hit_rate_tokens", "KV hit rate (tokens)"),
              ("switches_per_session", "switches per session"),
              ("recompute_energy_per_query_mwh", "recomputation energy per query (mWh)")]
    paper_pairs = set(zip(FIGURE4["metric"], FIGURE4["policy"], strict=True))
    fig, axes = plt.subplots(len(datasets), 5, figsize=(21, 3.4 * len(datasets)), squeeze=False)
    for r, ds in enumerate(datasets):
        g = groups[(groups["dataset"] == ds) & (groups["group"] != "all")]
        names = tuple(g["group"])
        x = np.arange(len(g))

        def paper(metric: str, policy: str, names: tuple[str, ...] = names) -> list[float] | None:
            if (metric, policy) not in paper_pairs:
                return None
            return figure4_values(metric, policy, groups=names)

        for c, (col, title) in enumerate(panels):
            ax = axes[r, c]
            if col == "saving_pct":
                for j, (pre, alpha, name) in enumerate([("", 0.85, "CarbonRouter"),
                                                        ("no gate: ", 0.35, "w/o Gate")]):
                    v = g[f"{pre}saving_pct"]
                    bars_with_paper(ax, x + (j - 0.5) * 0.38, v,
                                    ci=(g[f"{pre}ci_low_pct"], g[f"{pre}ci_high_pct"]),
                                    width=0.38, color="tab:purple", alpha=alpha, label=name)
            else:
                for j, (p, color) in enumerate([("faircarbon", "tab:red"),
                                                ("carbonrouter", "tab:purple")]):
                    bars_with_paper(ax, x + (j - 0.5) * 0.38, g[f"{p}: {col}"],
                                    width=0.38, color=color, alpha=0.8, label=p)
            # the paper's marks over all bars: on CarbonRouter's (a) or each policy's bar
            for p in dict.fromkeys(FIGURE4.loc[FIGURE4["metric"] == col, "policy"]):
                shift = -0.19 if col == "saving_pct" or p == "faircarbon" else 0.19
                paper_marks(ax, x + shift, paper(col, p), markersize=14)
            ax.set_xticks(x, g["group"])
            ax.set_title(title, fontsize=9)
            if c == 0:
                ax.set_ylabel(DATASET_LABELS[ds], fontsize=9)
            if r == 0 and c in (0, 1):
                ax.legend(fontsize=7)
        # (e) beyond the paper: CO2 relative to FairCarbon, CarbonRouter and the clairvoyant bound
        ax = axes[r, 4]
        bg = bound_groups[(bound_groups["dataset"] == ds)
                          & (bound_groups["policy"] == "carbonrouter")].set_index("group")
        bg = bg.reindex(list(g["group"]))
        ax.bar(x - 0.19, bg["co2_rel"], width=0.38, color="tab:purple", alpha=0.8,
               label="CarbonRouter")
        ax.bar(x + 0.19, bg["bound_rel"], width=0.38, color="tab:green", alpha=0.8,
               label="clairvoyant bound")
        ax.axhline(1.0, color="tab:red", lw=1, label="FairCarbon")
        ax.set_xticks(x, g["group"])
        ax.set_title("CO2 relative to FairCarbon (beyond the paper)", fontsize=9)
        if r == 0:
            ax.legend(fontsize=7)
    fig.suptitle("Figure 4 by session length (black: paper, ShareChat)")
    fig.tight_layout()
    return fig


def ablation_figure(fig5: pd.DataFrame, datasets: Sequence[str]) -> Figure:
    """Figure 5 (notebook 06): per dataset, by session-length group, (a) each ablation's CO2
    change over CarbonRouter (95% CIs), (b) P95 TTFT, (c) the switches the gate blocks per
    session. The paper's values (:data:`.paper.FIGURE5`: w/o Gate's CO2 change, CarbonRouter's
    blocked switches) are marked on the first bar of panels (a) and (c).

    ``fig5`` is :func:`.experiments.ablation_by_session_length` with a ``dataset`` column; the
    variants are drawn in its order."""
    import matplotlib.pyplot as plt

    paper5 = FIGURE5.set_index("group")
    variants = list(dict.fromkeys(fig5["policy"]))
    fig, axes = plt.subplots(len(datasets), 3, figsize=(16, 3.6 * len(datasets)), squeeze=False)
    for r, ds in enumerate(datasets):
        f = fig5[fig5["dataset"] == ds]
        groups = list(dict.fromkeys(f["group"]))
        x = np.arange(len(groups))
        for c, (col, title) in enumerate([("dco2_pct", "CO2 change over CarbonRouter (%)"),
                                          ("p95_ttft_s", "P95 TTFT (s)"),
                                          ("gate_blocked_per_session",
                                           "switches blocked per session")]):
            ax = axes[r, c]
            shown = [p for p in variants if not (col == "dco2_pct" and p == "carbonrouter")
                     and not (col == "gate_blocked_per_session" and p == "carbonrouter-no-gate")]
            # the paper: w/o Gate's CO2 change, CarbonRouter's blocked switches (the first bar)
            paper_col = {"dco2_pct": "no_gate_dco2_pct",
                         "gate_blocked_per_session": "gate_blocked_per_session"}.get(col)
            w = 0.8 / len(shown)
            for j, p in enumerate(shown):
                v = f[f["policy"] == p].set_index("group").reindex(groups)
                bars_with_paper(ax, x + (j - (len(shown) - 1) / 2) * w, v[col],
                                ci=((v["dco2_low_pct"], v["dco2_high_pct"])
                                    if col == "dco2_pct" else None),
                                width=w, color=_ABLATION_COLORS[p], label=ABLATION_LABELS[p])
            if paper_col:  # on the first bar of each group the paper reports
                for name, value in paper5[paper_col].items():
                    if name in groups:
                        paper_marks(ax, [groups.index(name) - (len(shown) - 1) / 2 * w],
                                    [value], markersize=16)
            ax.axhline(0, color="black", lw=0.5)
            ax.set_xticks(x, groups)
            ax.set_title(title, fontsize=9)
            if c == 0:
                ax.set_ylabel(DATASET_LABELS[ds], fontsize=9)
            if r == 0:
                ax.legend(fontsize=7)
    fig.suptitle("Figure 5: ablations by session length (black: paper, ShareChat)")
    fig.tight_layout()
    return fig
