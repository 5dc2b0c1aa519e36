"""Run the analysis notebooks headlessly with papermill, for `make reproduce` and `make test`.

Every notebook in ``notebooks/`` has a ``parameters`` cell. ``make reproduce`` executes each with
its defaults (plus the output folders), writing the executed copy to ``results/notebooks/``;
``make test`` injects the small parameters of ``notebooks/test_parameters.json`` into copies under
``build/nbval/`` and lets nbval execute them (any exception or failed ``assert`` fails the test).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["NOTEBOOK_DIR", "list_notebooks", "small_parameters", "prepare_for_tests", "run_all"]

REPO_DIR = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = REPO_DIR / "notebooks"
TEST_PARAMETERS = NOTEBOOK_DIR / "test_parameters.json"


def list_notebooks(notebook_dir: Path = NOTEBOOK_DIR) -> list[Path]:
    """The numbered analysis notebooks (``NN_name.ipynb``, or ``NNx_name.ipynb`` for one inserted
    after ``NN``), in order."""
    found = sorted(p for p in notebook_dir.glob("[0-9][0-9]*_*.ipynb"))
    if not found:
        raise FileNotFoundError(f"no numbered notebooks (NN_name.ipynb) in {notebook_dir}")
    return found


def small_parameters(path: Path = TEST_PARAMETERS) -> dict[str, dict[str, Any]]:
    """Small parameters per notebook for the notebook tests: ``{notebook name: {param: value}}``.

    The key ``"*"`` applies to every notebook; a notebook's own entry overrides it.
    """
    data = json.loads(path.read_text())
    unknown = set(data) - {"*"} - {p.name for p in list_notebooks(path.parent)}
    if unknown:
        raise ValueError(f"{path}: parameters for notebooks that do not exist: {sorted(unknown)}")
    return data


def _parameters_for(nb: Path, table: dict[str, dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {**table.get("*", {}), **table.get(nb.name, {}), **extra}


def prepare_for_tests(dest: Path, figures_dir: Path, results_dir: Path) -> list[Path]:
    """Write copies of every notebook with the test parameters injected (unexecuted) to ``dest``."""
    import papermill as pm

    dest.mkdir(parents=True, exist_ok=True)
    for stale in dest.glob("*.ipynb"):
        stale.unlink()
    table = small_parameters()
    written = []
    for nb in list_notebooks():
        params = _parameters_for(
            nb, table, figures_dir=str(figures_dir), results_dir=str(results_dir)
        )
        out = dest / nb.name
        pm.execute_notebook(str(nb), str(out), parameters=params, prepare_only=True,
                            progress_bar=False)
        written.append(out)
    return written


def run_all(
    output_dir: Path = REPO_DIR / "results" / "notebooks",
    figures_dir: Path = REPO_DIR / "figures",
    results_dir: Path = REPO_DIR / "results",
    only: list[str] | None = None,
) -> dict[str, float]:
    """Execute every notebook with its default parameters; return wall time per notebook (s).

    Executed copies go to ``output_dir``. A failed notebook stops the run (its partly executed copy
    is kept with the suffix ``.failed.ipynb``, so it is never mistaken for a result).
    """
    import papermill as pm

    output_dir.mkdir(parents=True, exist_ok=True)
    notebooks = [nb for nb in list_notebooks() if not only or any(o in nb.name for o in only)]
    times: dict[str, float] = {}
    for i, nb in enumerate(notebooks, start=1):
        print(f"[{i}/{len(notebooks)}] {nb.name}", flush=True)
        out = output_dir / nb.name
        tmp = output_dir / (nb.stem + ".running.ipynb")
        start = time.perf_counter()
        try:
            pm.execute_notebook(
                str(nb), str(tmp), cwd=str(nb.parent), progress_bar=True,
                parameters={"figures_dir": str(figures_dir), "results_dir": str(results_dir)},
            )
        except BaseException:
            if tmp.exists():
                os.replace(tmp, output_dir / (nb.stem + ".failed.ipynb"))
            raise
        os.replace(tmp, out)
        (output_dir / (nb.stem + ".failed.ipynb")).unlink(missing_ok=True)
        times[nb.name] = time.perf_counter() - start
        print(f"    done in {times[nb.name]:.1f} s -> {out.relative_to(REPO_DIR)}", flush=True)
    return times


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m carbonrouter_lib.notebooks")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_run = sub.add_parser("run", help="execute every notebook with its defaults (make reproduce)")
    p_run.add_argument("--only", nargs="*", help="substrings of notebook names to run")
    p_prep = sub.add_parser("prepare-tests", help="inject test parameters into copies for nbval")
    p_prep.add_argument("dest", type=Path)
    args = parser.parse_args(argv)
    if args.cmd == "run":
        times = run_all(only=args.only)
        total = sum(times.values())
        print(f"executed {len(times)} notebooks in {total:.0f} s: "
              + ", ".join(f"{k} {v:.0f} s" for k, v in times.items()))
    else:
        dest = args.dest.resolve()
        out = prepare_for_tests(dest, dest / "figures", dest / "results")
        print(f"prepared {len(out)} notebooks with test parameters in {dest}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
