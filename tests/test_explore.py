"""Tests of carbonrouter_lib.explore: widget values → settings → the notebooks' configs and runs;
explore() gives experiments.table1 / mechanisms of exactly those runs, read back from the cache
(as summaries, or summarized from a notebook's cached records); the notebook itself runs."""

from __future__ import annotations

import dataclasses
import datetime as dt

import matplotlib
import nbformat
import numpy as np
import pandas as pd
import pytest

from carbonrouter_lib import experiments, explore, notebooks, scale, sweep
from carbonrouter_lib import paper as paper_numbers
from carbonrouter_lib.arrivals import ArrivalConfig
from carbonrouter_lib.carbon import REGION_SETS

matplotlib.use("Agg")

QUICK = explore.PRESETS["quick"]


def test_the_explorer_is_a_notebook_but_not_a_numbered_one():
    path = notebooks.NOTEBOOK_DIR / "explore.ipynb"
    assert path.name not in [p.name for p in notebooks.list_notebooks()]  # not in make reproduce
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, (
                "explore.ipynb has outputs: run `make strip` (nbstripout) before committing")


def test_widget_values_become_settings():
    s = explore.ExplorerSettings.from_values(
        dataset="mooncake", region_set="em-only", window_start=dt.date(2022, 7, 4), peak="25",
        memory="paper x10", gamma=0.1 + 0.05, kappa=8, c=0.35000000000000003, beta_q=0.9,
        policies=["faircarbon", "carbonrouter-no-gate"], max_conversations=0, n_boot=200)
    assert s.gamma == 0.15 and s.kappa == 8.0 and s.c == 0.35 and s.beta_q == 0.9
    assert s.window_start == "2022-07-04" and s.peak == 25 and s.max_conversations is None
    assert s.policies == ("faircarbon", "carbonrouter-no-gate")
    # values() gives the widgets back what from_values reads
    assert explore.ExplorerSettings.from_values(**s.values()) == s
    with pytest.raises(TypeError, match="unknown settings"):
        explore.ExplorerSettings.from_values(regions="paper")


@pytest.mark.parametrize("bad, match", [
    ({"dataset": "sharechat"}, "dataset"), ({"region_set": "eu"}, "region_set"),
    ({"memory": "lots"}, "memory"), ({"peak": 0}, "peak"), ({"peak": "all"}, "peak"),
    ({"policies": ("nope",)}, "unknown policies"), ({"target": "nope"}, "unknown policies"),
    ({"max_conversations": 0}, "max_conversations"), ({"n_boot": 0}, "n_boot"),
    ({"beta_q": 1.5}, "beta_q"), ({"c": 0.0}, "c must be"), ({"window_start": "someday"}, "window"),
])
def test_bad_settings_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        explore.ExplorerSettings(**bad)


def test_settings_give_the_notebooks_configs():
    s = dataclasses.replace(QUICK, region_set="em-only", window_start="2022-04-04",
                            memory="hardware", gamma=0.1, kappa=8.0, c=0.35, beta_q=0.8, seed=3)
    wcfg, sim = s.configs()
    arrival = ArrivalConfig(window_start="2022-04-04T00:00:00Z")
    ref_w, ref_s = scale.setting("sharegpt", "em-only", 4, "hardware", arrival=arrival,
                                 max_conversations=40, seed=3)
    assert wcfg == ref_w and wcfg.arrival.window_start == pd.Timestamp("2022-04-04", tz="UTC")
    assert sim == dataclasses.replace(ref_s, gamma=0.1, kappa=8.0, c=0.35, beta_q=0.8)
    assert sim.regions == REGION_SETS["em-only"]
    assert (sim.kv_memory, sim.kv_scale) == ("hardware", 1.0)
    unscaled, _ = dataclasses.replace(s, peak="unscaled").configs()
    assert unscaled.sessions_per_s is None and wcfg.sessions_per_s is not None


def test_default_window_and_parameters_are_the_results_notebooks_runs():
    # Notebook 04 builds its runs with scale.setting and the default arrival: the explorer's
    # default window and parameters give the same runs, so it reads 04's cache.
    specs = explore.run_specs(QUICK)
    for policy, spec in specs.items():
        nb04 = sweep.RunSpec.make(*scale.setting("sharegpt", "paper", 4, None,
                                                 max_conversations=40, seed=0), policy)
        assert dataclasses.replace(spec, output="records").key() == nb04.key()
        assert spec.output == "summary"


def test_the_reference_and_the_target_are_always_replayed():
    s = dataclasses.replace(QUICK, policies=("carbonrouter-no-gate", "faircarbon"))
    assert s.run_policies() == ("session-affinity", "faircarbon", "carbonrouter",
                                "carbonrouter-no-gate")
    assert list(explore.run_specs(s)) == list(s.run_policies())


def test_presets_are_among_the_offered_values():
    for preset in explore.PRESETS.values():
        assert preset.peak in explore.PEAKS
        assert preset.max_conversations in explore.CONVERSATIONS
        assert preset.n_boot in explore.N_BOOT
        assert preset.window_start in explore.SEASONS.values()
        assert set(preset.policies) <= set(explore.EXPLORER_POLICIES)


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """The quick preset explored twice in an empty cache: replayed, then read back."""
    cache = tmp_path_factory.mktemp("sweeps")
    first = explore.explore(QUICK, cache_dir=cache)
    again = explore.explore(QUICK, cache_dir=cache)
    return cache, first, again


def test_explore_is_table1_and_mechanisms_of_its_runs(quick):
    cache, first, again = quick
    assert (first.n_computed, first.n_cached, first.n_from_records) == (5, 0, 0)
    assert (again.n_computed, again.n_cached, again.n_from_records) == (0, 5, 0)
    runs = sweep.run_named(explore.run_specs(QUICK), cache_dir=cache, progress=False)
    expected = experiments.table1(runs, n_boot=QUICK.n_boot, seed=QUICK.seed)
    for result in (first, again):
        pd.testing.assert_frame_equal(result.table1, expected)
        pd.testing.assert_frame_equal(result.mechanisms, experiments.mechanisms(runs))
    assert list(first.table1["policy"]) == list(experiments.MAIN_POLICIES)
    assert first.table1.set_index("policy").loc["session-affinity", "co2_rel"] == 1.0
    assert first.scale["peak_sessions"] == pytest.approx(4, abs=0.5)
    assert "5 cached" in again.describe() and "P = 4" in again.describe()


def test_cached_records_are_summarized_not_replayed(tmp_path, quick):
    full = {p: dataclasses.replace(s, output="records")
            for p, s in explore.run_specs(QUICK).items()}
    records = sweep.run_named(full, cache_dir=tmp_path, serial=True, progress=False)
    result = explore.explore(QUICK, cache_dir=tmp_path)
    assert (result.n_from_records, result.n_computed) == (5, 0)
    # The same Table 1 as from the records themselves, and as from the compact runs.
    from_records = experiments.table1(records, n_boot=QUICK.n_boot, seed=QUICK.seed)
    pd.testing.assert_frame_equal(result.table1, from_records, rtol=1e-9)
    pd.testing.assert_frame_equal(result.table1, quick[1].table1, rtol=1e-9)


def test_table1_view_sets_the_paper_beside_ours(quick):
    view = explore.table1_view(quick[1])
    assert list(view.index) == list(experiments.MAIN_POLICIES)
    saving = "saving of carbonrouter % [95% CI]"
    assert view.loc["carbonrouter", saving] == "–"
    row = quick[1].table1.set_index("policy").loc["faircarbon"]
    assert view.loc["faircarbon", saving] == (
        f"{row.saving_pct:.1f} [{row.ci_low_pct:.1f}, {row.ci_high_pct:.1f}]")
    paper = paper_numbers.TABLE1.query("dataset == 'ShareGPT'").set_index("policy")
    assert view.loc["gar", "paper co2_rel"] == paper.loc["gar", "co2_rel"]
    assert view.loc["gar", "paper saving % (of carbonrouter)"] == "31.6"


def test_plot_mechanisms_draws_every_policy_and_the_paper(quick):
    mech = quick[1].mechanisms
    fig = explore.plot_mechanisms(mech, "sharegpt", title="t")
    axes = fig.axes
    assert [ax.get_title() for ax in axes] == [m.replace("_", " ")
                                               for m in explore.MECHANISMS_SHOWN]
    values = mech.set_index(["policy", "metric"])["value"]
    cleanest = axes[0]
    heights = [bar.get_height() for bar in cleanest.patches]
    expected = [values[(p, "share_in_cleanest_region")] for p in experiments.MAIN_POLICIES]
    np.testing.assert_allclose(heights, expected)
    # the paper's markers: ShareGPT's cleanest-region share for FairCarbon and CarbonRouter
    marks = [line.get_ydata()[0] for line in cleanest.lines]
    assert marks == [0.67, 0.67]
    matplotlib.pyplot.close(fig)


def test_the_notebook_runs_headless(tmp_path, quick):
    """explore.ipynb executed as stored (the quick preset): no error, and its Output widget holds
    Table 1 (the browser test checks the same in Chromium)."""
    import nbclient

    nb = nbformat.read(notebooks.NOTEBOOK_DIR / "explore.ipynb", as_version=4)
    nbclient.NotebookClient(nb, kernel_name=notebooks.HEADLESS_KERNEL, timeout=300,
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    shown = [o for m in state.values() if m["model_name"] == "OutputModel"
             for o in m["state"].get("outputs", [])]
    errors = [f"{o['ename']}: {o['evalue']}" for o in shown if o["output_type"] == "error"]
    assert not errors, errors
    text = "".join(str(o.get("text", "")) + str(o.get("data", {}).get("text/html", ""))
                   for o in shown)
    assert "Table 1" in text and "session-affinity" in text and "dataframe" in text, text[:2000]
    assert any(o.get("data", {}).get("image/png") for o in shown)  # the mechanism figure
