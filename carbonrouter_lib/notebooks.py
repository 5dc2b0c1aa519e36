"""Run the analysis notebooks headlessly with papermill, for `make reproduce` and `make test`.

Every notebook in ``notebooks/`` has a ``parameters`` cell. ``make reproduce`` executes each with
its defaults (plus the output folders), writing the executed copy to ``results/notebooks/``;
``make test`` injects the small parameters of ``notebooks/test_parameters.json`` into copies under
``build/nbval/`` and lets nbval execute them (any exception or failed ``assert`` fails the test).

In JupyterLab the notebooks ask for the project's kernel, :data:`KERNEL_NAME`, which ``make lab``
registers with :func:`register_kernel`. Headless runs need no registration: they use the kernel of
the interpreter that runs them (:data:`HEADLESS_KERNEL`; nbval's ``--nbval-current-env``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["NOTEBOOK_DIR", "KERNEL_NAME", "KERNEL_DISPLAY_NAME", "HEADLESS_KERNEL",
           "list_notebooks", "small_parameters", "prepare_for_tests", "run_all", "register_kernel",
           "lab_command"]

REPO_DIR = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = REPO_DIR / "notebooks"
TEST_PARAMETERS = NOTEBOOK_DIR / "test_parameters.json"

#: The kernel spec every notebook names in its metadata: this environment's Python, registered by
#: :func:`register_kernel` (``make lab``), so JupyterLab runs the notebooks with the pinned packages
#: whichever Python started the server.
KERNEL_NAME = "carbonrouter"
KERNEL_DISPLAY_NAME = "Python 3 (carbonrouter)"
#: The kernel of papermill runs: jupyter_client maps ipykernel's own spec, ``python3``, to the
#: interpreter that runs papermill, so `make reproduce` needs no registered kernel.
HEADLESS_KERNEL = "python3"


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
                kernel_name=HEADLESS_KERNEL,
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


def register_kernel(prefix: str | os.PathLike | None = None) -> Path:
    """Register this interpreter as the Jupyter kernel :data:`KERNEL_NAME` and return the spec's
    folder.

    The spec goes under ``<prefix>/share/jupyter/kernels/`` (default ``sys.prefix``, i.e. inside
    the virtual environment, which every Jupyter started from it searches; nothing is written to
    the user's home). Its command is this interpreter's path as the environment names it
    (``.venv/bin/python``, not the base Python it links to), so the kernel imports the pinned
    packages. Registering again overwrites the spec.
    """
    from ipykernel import kernelspec

    where = kernelspec.install(kernel_name=KERNEL_NAME, display_name=KERNEL_DISPLAY_NAME,
                               prefix=str(prefix if prefix is not None else sys.prefix))
    return Path(where)


def lab_command(
    port: int = 8888,
    root_dir: str | os.PathLike = NOTEBOOK_DIR,
    token: str | None = None,
    open_browser: bool = True,
    extra: Sequence[str] = (),
) -> list[str]:
    """The command line of ``make lab``: this environment's JupyterLab serving ``root_dir`` on
    127.0.0.1:``port`` (loopback only: the server runs code), new notebooks on the project's
    kernel :data:`KERNEL_NAME`. ``token`` None lets Jupyter generate one (printed in the URL it
    shows); ``extra`` are further ``--Class.trait=value`` options."""
    cmd = [sys.executable, "-m", "jupyterlab", "--ServerApp.ip=127.0.0.1",
           f"--ServerApp.port={int(port)}", f"--ServerApp.root_dir={Path(root_dir).resolve()}",
           f"--MappingKernelManager.default_kernel_name={KERNEL_NAME}",
           f"--ServerApp.open_browser={open_browser}"]
    if token is not None:
        cmd.append(f"--IdentityProvider.token={token}")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        # Jupyter refuses root unless told; root is what a container or CI machine runs as, and
        # the server listens on loopback only, behind its token.
        cmd.append("--ServerApp.allow_root=True")
    return cmd + list(extra)


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m carbonrouter_lib.notebooks")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_run = sub.add_parser("run", help="execute every notebook with its defaults (make reproduce)")
    p_run.add_argument("--only", nargs="*", help="substrings of notebook names to run")
    p_prep = sub.add_parser("prepare-tests", help="inject test parameters into copies for nbval")
    p_prep.add_argument("dest", type=Path)
    p_kernel = sub.add_parser("kernel", help=f"register this Python as the Jupyter kernel "
                                             f"{KERNEL_NAME!r} (make lab)")
    p_kernel.add_argument("--prefix", type=Path, default=None,
                          help="install prefix (default: this environment, sys.prefix)")
    p_lab = sub.add_parser("lab", help="register the kernel and start JupyterLab (make lab)")
    p_lab.add_argument("--port", type=int, default=8888)
    args = parser.parse_args(argv)
    if args.cmd in ("kernel", "lab"):
        where = register_kernel(getattr(args, "prefix", None))
        print(f"kernel {KERNEL_NAME!r} ({sys.executable}) registered in {where}", flush=True)
        if args.cmd == "lab":
            cmd = lab_command(args.port)
            os.execv(cmd[0], cmd)  # JupyterLab takes over this process (and Ctrl-C)
    elif args.cmd == "run":
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
