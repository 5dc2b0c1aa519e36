"""Tests of carbonrouter_lib.plots: bars where the values are, the paper's marks on the right
bars."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from carbonrouter_lib import paper, plots  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _bars(ax) -> list[tuple[float, float, float]]:
    """(centre, height, width) of every bar of ``ax``, in drawing order."""
    return [(r.get_x() + r.get_width() / 2, r.get_height(), r.get_width())
            for c in ax.containers if hasattr(c, "patches") for r in c.patches]


def _marks(ax) -> list[tuple[float, float]]:
    """(x, y) of every paper mark (a black '_' marker) of ``ax``, in drawing order."""
    return [(float(x), float(y)) for line in ax.lines
            if line.get_marker() == "_" and line.get_color() == "k"
            for x, y in zip(line.get_xdata(), line.get_ydata(), strict=True) if not np.isnan(y)]


def _same(marks, expected) -> None:
    assert len(marks) == len(expected), (marks, expected)
    if expected:
        np.testing.assert_allclose(np.array(marks, dtype=float), np.array(expected, dtype=float),
                                   rtol=0, atol=1e-12)


def test_bars_with_paper_heights_positions_and_marks():
    fig, ax = plt.subplots()
    x = np.arange(3) - 0.2
    heights = pd.Series([1.0, 2.5, np.nan])
    plots.bars_with_paper(ax, x, heights, [0.8, np.nan, 3.0], width=0.4, color="tab:red",
                          label="ours")
    bars = _bars(ax)
    assert [b[0] for b in bars] == pytest.approx(list(x))
    assert [b[1] for b in bars[:2]] == [1.0, 2.5] and np.isnan(bars[2][1])
    assert {b[2] for b in bars} == {0.4}
    # a mark per paper value, at its bar's x; none where the paper gives none
    _same(_marks(ax), [(-0.2, 0.8), (1.8, 3.0)])
    assert all(line.get_markersize() == 18 for line in ax.lines)
    assert ax.get_legend_handles_labels()[1] == ["ours"]


def test_bars_with_paper_error_bars_and_no_marks():
    fig, ax = plt.subplots()
    h = pd.Series([10.0, 20.0])
    plots.bars_with_paper(ax, np.arange(2), h, ci=(h - 1.0, h + 4.0), markersize=14)
    assert _marks(ax) == []
    err = [c for c in ax.containers if type(c).__name__ == "ErrorbarContainer"]
    assert len(err) == 1
    segments = err[0].lines[2][0].get_segments()
    assert [tuple(s[:, 1]) for s in segments] == [(9.0, 14.0), (19.0, 24.0)]


def test_mechanism_panels_mark_the_papers_values_for_the_datasets_counterpart():
    mech = pd.DataFrame({
        "policy": ["faircarbon", "carbonrouter", "faircarbon", "carbonrouter"],
        "metric": ["share_in_cleanest_region"] * 2 + ["switches_per_session"] * 2,
        "value": [0.4, 0.5, 3.0, 2.0],
    })
    fig, axes = plt.subplots(1, 2)
    shown = ("share_in_cleanest_region", "switches_per_session")
    plots.mechanism_panels(axes, mech, "mooncake", shown)
    ref = paper.MECHANISMS[paper.MECHANISMS["dataset"] == "ShareChat"].set_index(
        ["policy", "metric"])["paper"]
    for ax, metric in zip(axes, shown, strict=True):
        assert [b[1] for b in _bars(ax)] == list(mech[mech.metric == metric]["value"])
        assert [t.get_text() for t in ax.get_xticklabels()] == ["FC", "CR"]
        assert ax.get_title() == metric.replace("_", " ")
        policies = ["faircarbon", "carbonrouter"]
        expected = [(float(j), ref[(p, metric)]) for j, p in enumerate(policies)
                    if (p, metric) in ref.index]
        assert expected
        _same(_marks(ax), expected)
    # without a dataset there is no paper value to mark
    fig, axes = plt.subplots(1, 2)
    plots.mechanism_panels(axes, mech, None, shown)
    assert _marks(axes[0]) == [] and _marks(axes[1]) == []


def test_mechanisms_figure_has_a_row_per_dataset():
    mech = pd.DataFrame({"policy": ["carbonrouter"] * 5, "metric": list(plots.MECHANISMS_SHOWN),
                         "value": [0.1, 0.2, 3.0, 0.8, 0.0]})
    both = pd.concat([mech.assign(dataset=ds, region_set="paper")
                      for ds in ("sharegpt", "mooncake")])
    fig = plots.mechanisms_figure(both, ["sharegpt", "mooncake"], "paper")
    axes = np.array(fig.axes).reshape(2, 5)
    assert [axes[r, 0].get_ylabel() for r in range(2)] == [plots.DATASET_LABELS["sharegpt"],
                                                           plots.DATASET_LABELS["mooncake"]]
    # ShareGPT's 67% in the cleanest region for CarbonRouter, ShareChat's 57%
    assert _marks(axes[0, 0]) == [(0.0, 0.67)] and _marks(axes[1, 0]) == [(0.0, 0.57)]


def _groups() -> tuple[pd.DataFrame, pd.DataFrame]:
    names = ["all", *paper.FIGURE4_GROUPS]
    n = len(names)
    g = pd.DataFrame({"dataset": "mooncake", "group": names,
                      "saving_pct": np.linspace(10, 20, n), "ci_low_pct": np.linspace(8, 18, n),
                      "ci_high_pct": np.linspace(12, 22, n)})
    for col in ("saving_pct", "ci_low_pct", "ci_high_pct"):
        g[f"no gate: {col}"] = g[col] - 2
    for p in ("faircarbon", "carbonrouter"):
        for col in ("kv_hit_rate_tokens", "switches_per_session", "recompute_energy_per_query_mwh"):
            g[f"{p}: {col}"] = np.arange(n, dtype=float) + (p == "carbonrouter")
    b = pd.DataFrame({"dataset": "mooncake", "group": names, "policy": "carbonrouter",
                      "co2_rel": 0.9, "bound_rel": 0.7})
    return g, b


def test_session_length_figure_marks_figure4_on_each_policys_bars():
    groups, bound_groups = _groups()
    fig = plots.session_length_figure(groups, bound_groups, ["mooncake"])
    ax_saving, ax_hit, ax_switch, ax_energy, ax_bound = fig.axes[:5]
    x = np.arange(len(paper.FIGURE4_GROUPS))
    # (a) the paper's savings on CarbonRouter's bars (the left ones)
    _same(_marks(ax_saving), list(zip(x - 0.19, paper.figure4_values("saving_pct", "carbonrouter"),
                                      strict=True)))
    # (c) FairCarbon's switches on its (left) bars, CarbonRouter's on the right ones
    fc = [(xi - 0.19, v) for xi, v in zip(x, paper.figure4_values(
        "switches_per_session", "faircarbon"), strict=True) if not np.isnan(v)]
    cr = [(xi + 0.19, v) for xi, v in zip(x, paper.figure4_values(
        "switches_per_session", "carbonrouter"), strict=True) if not np.isnan(v)]
    _same(_marks(ax_switch), fc + cr)
    bars = _bars(ax_switch)
    assert [b[1] for b in bars] == list(groups["faircarbon: switches_per_session"][1:]) + list(
        groups["carbonrouter: switches_per_session"][1:])
    assert _marks(ax_hit) and _marks(ax_energy) and _marks(ax_bound) == []


def test_ablation_figure_marks_figure5_on_the_first_bar():
    rows = []
    for group in ("all", "> 5", "> 30"):
        for i, p in enumerate(("carbonrouter", "carbonrouter-no-gate", "carbonrouter-no-pricing")):
            rows.append({"dataset": "mooncake", "group": group, "policy": p, "dco2_pct": 1.0 + i,
                         "dco2_low_pct": 0.5 + i, "dco2_high_pct": 2.0 + i, "p95_ttft_s": 0.5,
                         "gate_blocked_per_session": 0.3 * i})
    fig = plots.ablation_figure(pd.DataFrame(rows), ["mooncake"])
    ax_co2, ax_ttft, ax_blocked = fig.axes
    ref = paper.FIGURE5.set_index("group")
    # (a) two ablations shown: the paper's w/o-Gate change on the first (left) bar of its group
    w = 0.8 / 2
    _same(_marks(ax_co2), [(0 - w / 2, ref.loc["all", "no_gate_dco2_pct"]),
                           (2 - w / 2, ref.loc["> 30", "no_gate_dco2_pct"])])
    assert [t.get_text() for t in ax_co2.get_legend().get_texts()] == ["w/o Gate", "w/o Pricing"]
    # (c) CarbonRouter's blocked switches, no w/o-Gate bar
    _same(_marks(ax_blocked), [(0 - w / 2, ref.loc["all", "gate_blocked_per_session"]),
                               (2 - w / 2, ref.loc["> 30", "gate_blocked_per_session"])])
    assert _marks(ax_ttft) == [] and len(_bars(ax_ttft)) == 9
