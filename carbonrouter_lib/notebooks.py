"""Run the analysis notebooks headlessly with papermill, for `make reproduce` and `make test`.

Every notebook in ``notebooks/`` has a ``parameters`` cell (one ``name = value  # comment`` per
line) and starts its next cell with :func:`setup`, which rejects parameters the notebook does not
have (papermill would run a misspelled ``-p ration 0.3`` silently on the defaults), resolves the
output folders against the repository (not the caller's working directory) and says whether the
run is at the defaults, where the notebook also checks the paper-default properties.

``make reproduce`` executes each notebook with its defaults, writing the executed copy to
``results/notebooks/``; ``python -m carbonrouter_lib.notebooks run --only 03 -p ratio 0.3`` runs a
selection with parameters. ``make test`` injects the small parameters of
``notebooks/test_parameters.json`` into copies under ``build/nbval/`` and lets nbval execute them
(any exception or failed ``assert`` fails the test). ``python -m carbonrouter_lib.notebooks
readme`` rewrites the README's table of every notebook's parameters (a test checks it is current).

In JupyterLab the notebooks ask for the project's kernel, :data:`KERNEL_NAME`, which ``make lab``
registers with :func:`register_kernel`. Headless runs need no registration: they use the kernel of
the interpreter that runs them (:data:`HEADLESS_KERNEL`; nbval's ``--nbval-current-env``).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import time
import types
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["NOTEBOOK_DIR", "KERNEL_NAME", "KERNEL_DISPLAY_NAME", "HEADLESS_KERNEL", "Parameter",
           "list_notebooks", "parameters", "setup", "parameters_markdown", "small_parameters",
           "prepare_for_tests", "run_all", "register_kernel", "lab_command"]

REPO_DIR = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = REPO_DIR / "notebooks"
TEST_PARAMETERS = NOTEBOOK_DIR / "test_parameters.json"
README = REPO_DIR / "README.md"
#: Parameters that say where and how a notebook runs, not what it computes.
EXECUTION_PARAMETERS = frozenset({"figures_dir", "results_dir", "scheduler", "n_workers",
                                  "cache_dir"})
#: Names IPython puts in a notebook's namespace (not parameters).
_IPYTHON_NAMES = frozenset({"In", "Out", "get_ipython", "exit", "quit", "open"})
_README_START = "<!-- notebook-parameters:start -->"
_README_END = "<!-- notebook-parameters:end -->"


@dataclass(frozen=True)
class Parameter:
    """One line of a notebook's ``parameters`` cell: ``name = default  # comment``."""

    name: str
    default: Any
    source: str
    comment: str


def _notebook_path(name: str | os.PathLike) -> Path:
    path = Path(name)
    if path.suffix != ".ipynb":
        path = NOTEBOOK_DIR / f"{path.name}.ipynb"
    if not path.is_file():
        raise FileNotFoundError(f"no notebook {path}")
    return path


def parameters(name: str | os.PathLike) -> dict[str, Parameter]:
    """The parameters of a notebook (``"03_break_even"`` or a path), in order, from its cell
    tagged ``parameters``: every top-level ``name = value`` with its literal default and the
    comment on its line. ``ValueError`` naming the notebook and line if a default is not a
    literal (papermill could not override it reliably)."""
    path = _notebook_path(name)
    cells = json.loads(path.read_text())["cells"]
    tagged = [c for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(tagged) != 1:
        raise ValueError(f"{path.name}: expected one cell tagged 'parameters', found {len(tagged)}")
    source = "".join(tagged[0]["source"])
    lines = source.splitlines()
    out: dict[str, Parameter] = {}
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)):
            continue
        value_src = ast.get_source_segment(source, node.value) or ""
        try:
            default = ast.literal_eval(node.value)
        except ValueError:
            raise ValueError(f"{path.name}, parameters line {node.lineno}: the default of "
                             f"{node.targets[0].id} is not a literal ({value_src})") from None
        line = lines[node.end_lineno - 1]
        comment = line.split("#", 1)[1].strip() if "#" in line[node.end_col_offset:] else ""
        out[node.targets[0].id] = Parameter(node.targets[0].id, default, value_src, comment)
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _resolve_dir(value: str | os.PathLike | None, default: str) -> str:
    if value is None:
        return str(REPO_DIR / default)
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else REPO_DIR / path)


def setup(name: str, namespace: dict[str, Any]) -> tuple[str, str, bool]:
    """Call first in the cell after a notebook's parameters (``namespace``: ``globals()``).

    Raises ``ValueError`` if the run was given a parameter the notebook does not declare (its
    message lists the notebook's parameters). Returns the figure and result folders as absolute
    paths — ``None`` means the repository's ``figures/`` and ``results/``, a relative path is
    relative to the repository, not to the caller's working directory — and whether every
    parameter that changes results has its default value (:data:`EXECUTION_PARAMETERS` aside):
    the notebook then also checks the properties of the paper's default setting.
    """
    declared = parameters(name)
    given = {k for k, v in namespace.items()
             if not k.startswith("_") and k not in _IPYTHON_NAMES
             and not isinstance(v, types.ModuleType | types.FunctionType | type)}
    unknown = sorted(given - set(declared))
    if unknown:
        raise ValueError(f"{name}: unknown parameter(s) {unknown}; its parameters are "
                         f"{list(declared)}")
    at_defaults = all(_same(namespace.get(k, p.default), p.default)
                      for k, p in declared.items() if k not in EXECUTION_PARAMETERS)
    return (_resolve_dir(namespace.get("figures_dir"), "figures"),
            _resolve_dir(namespace.get("results_dir"), "results"), at_defaults)


def all_notebooks() -> list[Path]:
    """Every notebook of ``notebooks/``: the numbered ones in order, then the others (the
    examples and the explorer, not in ``make reproduce``)."""
    numbered = list_notebooks()
    return numbered + sorted(set(NOTEBOOK_DIR.glob("*.ipynb")) - set(numbered))


def _has_parameters_cell(path: Path) -> bool:
    cells = json.loads(path.read_text())["cells"]
    return any("parameters" in c.get("metadata", {}).get("tags", []) for c in cells)


def parameters_markdown() -> str:
    """The README's table of every notebook's parameters (name, default, comment)."""
    rows = ["| notebook | parameter | default | meaning |", "|---|---|---|---|"]
    for nb in all_notebooks():
        if not _has_parameters_cell(nb):
            # The explorer is interactive: its widgets, not papermill, set its inputs.
            rows.append(f"| `{nb.stem}` | – | – | none: set with the notebook's controls |")
            continue
        for p in parameters(nb).values():
            src = p.source.replace("|", "\\|")
            rows.append(f"| `{nb.stem}` | `{p.name}` | `{src}` | {p.comment.replace('|', '/')} |")
    return "\n".join(rows)


def update_readme(path: Path = README) -> bool:
    """Rewrite the parameters table between the README's markers; True if it changed."""
    text = path.read_text()
    if _README_START not in text or _README_END not in text:
        raise ValueError(f"{path}: markers {_README_START} / {_README_END} not found")
    head, rest = text.split(_README_START, 1)
    _, tail = rest.split(_README_END, 1)
    new = f"{head}{_README_START}\n{parameters_markdown()}\n{_README_END}{tail}"
    if new != text:
        path.write_text(new)
    return new != text

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
    params: dict[str, Any] | None = None,
) -> dict[str, float]:
    """Execute every notebook (or those whose name contains a string of ``only``) with its
    default parameters, overridden by ``params`` (each must be a parameter of every selected
    notebook, else ``ValueError`` before anything runs); return wall time per notebook (s).

    Executed copies go to ``output_dir``. A failed notebook stops the run (its partly executed copy
    is kept with the suffix ``.failed.ipynb``, so it is never mistaken for a result).
    """
    import papermill as pm

    notebooks = [nb for nb in list_notebooks() if not only or any(o in nb.name for o in only)]
    if not notebooks:
        raise ValueError(f"no notebook matches {only}; notebooks: "
                         f"{[nb.stem for nb in list_notebooks()]}")
    params = dict(params or {})
    for nb in notebooks:
        unknown = sorted(set(params) - set(parameters(nb)))
        if unknown:
            raise ValueError(f"{nb.stem}: unknown parameter(s) {unknown}; its parameters are "
                             f"{list(parameters(nb))}")
    output_dir.mkdir(parents=True, exist_ok=True)
    times: dict[str, float] = {}
    for i, nb in enumerate(notebooks, start=1):
        print(f"[{i}/{len(notebooks)}] {nb.name}", flush=True)
        out = output_dir / nb.name
        tmp = output_dir / (nb.stem + ".running.ipynb")
        start = time.perf_counter()
        try:
            pm.execute_notebook(
                str(nb), str(tmp), cwd=str(nb.parent), progress_bar=True,
                parameters={"figures_dir": str(figures_dir), "results_dir": str(results_dir),
                            **params},
                kernel_name=HEADLESS_KERNEL,
            )
        except BaseException:
            if tmp.exists():
                os.replace(tmp, output_dir / (nb.stem + ".failed.ipynb"))
            raise
        os.replace(tmp, out)
        (output_dir / (nb.stem + ".failed.ipynb")).unlink(missing_ok=True)
        times[nb.name] = time.perf_counter() - start
        shown = out.relative_to(REPO_DIR) if out.is_relative_to(REPO_DIR) else out
        print(f"    done in {times[nb.name]:.1f} s -> {shown}", flush=True)
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
    p_run.add_argument("-p", "--parameter", nargs=2, action="append", default=[],
                       metavar=("NAME", "VALUE"),
                       help="override a parameter (VALUE read as YAML: 0.3, [1, 2], null, text)")
    p_prep = sub.add_parser("prepare-tests", help="inject test parameters into copies for nbval")
    p_prep.add_argument("dest", type=Path)
    sub.add_parser("readme", help="rewrite the README's table of notebook parameters")
    p_kernel = sub.add_parser("kernel", help=f"register this Python as the Jupyter kernel "
                                             f"{KERNEL_NAME!r} (make lab)")
    p_kernel.add_argument("--prefix", type=Path, default=None,
                          help="install prefix (default: this environment, sys.prefix)")
    p_lab = sub.add_parser("lab", help="register the kernel and start JupyterLab (make lab)")
    p_lab.add_argument("--port", type=int, default=8888)
    args = parser.parse_args(argv)
    if args.cmd == "readme":
        print("README updated" if update_readme() else "README already current")
        return 0
    if args.cmd in ("kernel", "lab"):
        where = register_kernel(getattr(args, "prefix", None))
        print(f"kernel {KERNEL_NAME!r} ({sys.executable}) registered in {where}", flush=True)
        if args.cmd == "lab":
            cmd = lab_command(args.port)
            os.execv(cmd[0], cmd)  # JupyterLab takes over this process (and Ctrl-C)
    elif args.cmd == "run":
        import yaml

        params = {name: yaml.safe_load(value) for name, value in args.parameter}
        try:
            times = run_all(only=args.only, params=params)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
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
