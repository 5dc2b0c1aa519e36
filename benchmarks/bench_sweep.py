"""Wall time of notebook 07's full sensitivity grid on Dask (a measurement, not a test).

Runs every replay of Tables 3 and 4 (both datasets, :data:`experiments.SENSITIVITY_AXES`,
FairCarbon and CarbonRouter with its learned gate, trained per cell) three times, each into an
empty temporary cache (so every run and every gate is computed): in this process one after the
other (``serial=True``), on a LocalCluster with 1 worker, and with 2 workers. The prepared
workloads and carbon signals are built (or read from their caches) beforehand and are not timed.

Run with ``.venv/bin/python benchmarks/bench_sweep.py`` (``--workers 1 2 4`` to choose).
Prints a table and writes ``results/benchmarks/sweep.{csv,parquet}``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import pandas as pd

from carbonrouter_lib import experiments, prepared, setting, sweep
from carbonrouter_lib.outputs import save_table


def grid() -> list[sweep.RunSpec]:
    """The distinct runs of notebook 07 at its default parameters."""
    specs = {}
    for ds in ("mooncake", "sharegpt"):
        wcfg = prepared.WorkloadConfig(dataset=ds)
        for axes in experiments.SENSITIVITY_AXES.values():
            g = sweep.grid_specs(wcfg, setting.SimulationConfig(), axes,
                                 ["faircarbon", "carbonrouter"])
            specs.update(zip(g["key"], g["spec"], strict=True))
    return list(specs.values())


def main(argv: list[str] | None = None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results-dir", default=str(Path(__file__).resolve().parents[1]
                                                      / "results" / "benchmarks"))
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--no-serial", action="store_true", help="skip the in-process run")
    args = parser.parse_args(argv)
    specs = grid()
    sweep._prepare_inputs(specs)  # build the workload / signal caches outside the timing
    modes = ([] if args.no_serial else ["serial"]) + list(args.workers)
    rows = []
    for mode in modes:
        with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
            t0 = time.perf_counter()
            res = sweep.run_sweep(specs, cache_dir=tmp, serial=mode == "serial",
                                  n_workers=None if mode == "serial" else mode, progress=False)
            wall = time.perf_counter() - t0
        rows.append({"mode": "in-process" if mode == "serial" else f"{mode} worker(s)",
                     "n_runs": len(specs), "n_computed": res.n_computed, "wall_s": wall,
                     "cpu_count": os.cpu_count()})
        print(rows[-1], flush=True)
    result = pd.DataFrame(rows)
    save_table(result, "sweep", args.results_dir)
    print(result.to_string(index=False))
    return result


if __name__ == "__main__":
    main()
