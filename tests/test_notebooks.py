"""Notebooks as stored: no outputs, a papermill parameters cell, test parameters that fit."""

from __future__ import annotations

import json

import nbformat
import pandas as pd
import pytest

from carbonrouter_lib import notebooks

NOTEBOOKS = notebooks.list_notebooks()
#: Not numbered, so not part of `make reproduce` or the nbval run: executed by its own test below.
BYO_NOTEBOOK = notebooks.NOTEBOOK_DIR / "byo_data.ipynb"


@pytest.mark.parametrize("path", [*NOTEBOOKS, BYO_NOTEBOOK], ids=lambda p: p.name)
def test_notebook_is_stored_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, (
                f"{path.name} has outputs: run `make strip` (nbstripout) before committing"
            )


@pytest.mark.parametrize("path", [*NOTEBOOKS, BYO_NOTEBOOK], ids=lambda p: p.name)
def test_notebook_has_a_parameters_cell_with_output_folders(path):
    nb = nbformat.read(path, as_version=4)
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, f"{path.name}: expected exactly one cell tagged 'parameters'"
    names = {line.split("=")[0].strip() for line in tagged[0].source.splitlines() if "=" in line}
    assert {"figures_dir", "results_dir"} <= names


def test_small_parameters_name_only_real_parameters():
    table = notebooks.small_parameters()
    for nb_path in NOTEBOOKS:
        nb = nbformat.read(nb_path, as_version=4)
        source = next(c.source for c in nb.cells if "parameters" in c.metadata.get("tags", []))
        declared = {ln.split("=")[0].strip() for ln in source.splitlines() if "=" in ln}
        unknown = set(table.get(nb_path.name, {})) - declared
        assert not unknown, f"{nb_path.name}: test parameters {unknown} are not declared"


def test_prepare_for_tests_injects_parameters(tmp_path):
    written = notebooks.prepare_for_tests(tmp_path / "nb", tmp_path / "fig", tmp_path / "res")
    assert [p.name for p in written] == [p.name for p in NOTEBOOKS]
    table = notebooks.small_parameters()
    for path in written:
        nb = json.loads(path.read_text())
        injected = [c for c in nb["cells"]
                    if "injected-parameters" in c.get("metadata", {}).get("tags", [])]
        assert len(injected) == 1
        src = "".join(injected[0]["source"])
        assert str(tmp_path / "fig") in src and str(tmp_path / "res") in src
        for name in table.get(path.name, {}):
            assert f"{name} = " in src


# --- parameters, setup, the README table, the runner ------------------------------------------


def test_parameters_are_parsed_with_defaults_and_comments():
    p = notebooks.parameters("03_break_even")
    assert p["ratio"].default == 0.5 and p["ratio"].comment.startswith("CI_B / CI_A")
    assert p["settings"].default[0] == (0.05, 6.0)
    assert p["figures_dir"].default is None
    for nb in NOTEBOOKS:  # every notebook's defaults are literals papermill can override
        assert {"figures_dir", "results_dir"} <= set(notebooks.parameters(nb))


def test_setup_rejects_unknown_parameters_and_resolves_outputs_in_the_repository():
    defaults = {k: p.default for k, p in notebooks.parameters("03_break_even").items()}
    fig, res, at_defaults = notebooks.setup("03_break_even", dict(defaults))
    assert fig == str(notebooks.REPO_DIR / "figures") and res == str(notebooks.REPO_DIR / "results")
    assert at_defaults
    fig, _, at_defaults = notebooks.setup("03_break_even", {**defaults, "ratio": 0.3,
                                                            "figures_dir": "build/figs"})
    assert fig == str(notebooks.REPO_DIR / "build" / "figs") and not at_defaults
    # where the output goes does not change the results: still the default setting
    assert notebooks.setup("03_break_even", {**defaults, "results_dir": "/tmp/x"})[2]
    # a tuple default given back as a list (papermill's YAML) is the same value
    assert notebooks.setup("03_break_even", {**defaults, "settings": [list(s) for s in
                                                                      defaults["settings"]]})[2]
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['ration'\]"):
        notebooks.setup("03_break_even", {**defaults, "ration": 0.3})


def test_readme_lists_every_notebook_parameter():
    text = notebooks.README.read_text()
    assert notebooks.parameters_markdown() in text, (
        "README's notebook parameters table is stale: "
        "run `python -m carbonrouter_lib.notebooks readme`")


def test_runner_passes_parameters_and_rejects_unknown_ones(tmp_path, capsys):
    code = notebooks._main(["run", "--only", "03_break", "-p", "ration", "0.3"])
    assert code == 2 and "unknown parameter(s) ['ration']" in capsys.readouterr().err
    times = notebooks.run_all(output_dir=tmp_path / "nb", figures_dir=tmp_path / "fig",
                              results_dir=tmp_path / "res", only=["03_break"],
                              params={"ratio": 0.3})
    assert list(times) == ["03_break_even.ipynb"]
    nb = json.loads((tmp_path / "nb" / "03_break_even.ipynb").read_text())
    injected = next(c for c in nb["cells"]
                    if "injected-parameters" in c["metadata"].get("tags", []))
    assert "ratio = 0.3" in "".join(injected["source"])
    assert (tmp_path / "fig" / "fig2c_break_even.png").is_file()


def test_byo_notebook_runs_on_the_example_files(tmp_path):
    """notebooks/byo_data.ipynb end to end (its own asserts included) on tests/data/byo."""
    import papermill as pm

    out = tmp_path / "byo_data.ipynb"
    pm.execute_notebook(str(BYO_NOTEBOOK), str(out), cwd=str(BYO_NOTEBOOK.parent),
                        kernel_name=notebooks.HEADLESS_KERNEL, progress_bar=False,
                        parameters={"figures_dir": str(tmp_path / "fig"),
                                    "results_dir": str(tmp_path / "res"), "n_boot": 200})
    t1 = pd.read_csv(tmp_path / "res" / "byo_table1.csv")
    assert "my_policies:LowestEnergy" in set(t1["policy"])
    assert (tmp_path / "fig" / "byo_signal.png").is_file()
