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


def test_byo_notebook_runs_on_the_example_files(tmp_path):
    """notebooks/byo_data.ipynb end to end (its own asserts included) on tests/data/byo."""
    import papermill as pm

    out = tmp_path / "byo_data.ipynb"
    pm.execute_notebook(str(BYO_NOTEBOOK), str(out), cwd=str(BYO_NOTEBOOK.parent),
                        progress_bar=False,
                        parameters={"figures_dir": str(tmp_path / "fig"),
                                    "results_dir": str(tmp_path / "res"), "n_boot": 200})
    t1 = pd.read_csv(tmp_path / "res" / "byo_table1.csv")
    assert "my_policies:LowestEnergy" in set(t1["policy"])
    assert (tmp_path / "fig" / "byo_signal.png").is_file()
