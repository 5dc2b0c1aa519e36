"""Speed and memory of dense (service-scale) replays (a measurement, not a test).

For the ShareGPT workload resampled to ``--copies`` times its rate over the same 7-day window
(1 copy: 61K queries, P = 40; 8: 490K; 32: 2.0M, P ≈ 770), measures per policy, each in a fresh
process pinned to one core with BLAS/OpenMP threads fixed to 1:

- replay throughput: queries/s of one ``simulate`` call (capacity, precomputation, replay and
  records; the table and the carbon signal loaded beforehand), median of ``--repeats``;
- peak memory: the process's peak resident set (``getrusage``) — the table, the signal and the
  replay; the largest table (32 copies) is the issue's 2M-query replay;
- for ``carbonrouter`` (the learned gate): the gate's training (the labelling replay and the five
  XGBoost fits), then the routing with the trained gate.

``--repo DIR`` times another checkout of the project instead (e.g. ``git worktree add /tmp/old
<commit>``) on the *same* tables, written to parquet by this one — the before/after comparison
of a change to the replay. Results: ``results/benchmarks/scale[_<label>].{csv,parquet}``.

Run with ``.venv/bin/python benchmarks/bench_scale.py`` (``--quick``: 1 and 8 copies, one repeat).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
POLICIES = ("session-affinity", "carbon-affinity", "gar", "faircarbon", "carbonrouter-no-gate",
            "carbonrouter", "carbonrouter-horizon")
#: Variants that ``--policies`` may name beside the registry's: label → (policy, parameters).
VARIANTS = {
    # the default router (docs/model.md §11.4a: J = 1, the slot price over 16 turns, since
    # 2026-12-07) given a 0.5-s SLO, so that the TTFT price prices and ν moves; the router
    # before the pair
    "carbonrouter-horizon (0.5-s TTFT SLO)": ("carbonrouter-horizon", {"ttft_slo_s": 0.5}),
    "carbonrouter-horizon (before the pair)": ("carbonrouter-horizon", {"kv_price": False,
                                                                        "horizon": 16,
                                                                        "slot_turns": None}),
    # the pair with J = 16 (the default from 2026-12-06 to 2026-12-07), and other horizons with
    # the slot price over J: how much of its extra time is the J future turns
    "carbonrouter-horizon (J = 16)": ("carbonrouter-horizon", {"horizon": 16, "slot_turns": None}),
    "carbonrouter-horizon (J = 4)": ("carbonrouter-horizon", {"horizon": 4, "slot_turns": None}),
    "carbonrouter-horizon (J = 1)": ("carbonrouter-horizon", {"horizon": 1, "slot_turns": None}),
}


def child(table_path: str, policy: str, repeats: int, cpu: int, engine: str) -> dict:
    """Runs in the measured process: load, (train the gate,) warm up (the compiled loop is
    compiled, or loaded from Numba's cache, on a first small replay: ``warmup_s``), replay
    ``repeats`` times with ``engine``."""
    os.sched_setaffinity(0, {cpu})
    import resource
    import statistics

    import pandas as pd

    from carbonrouter_lib import setting, simulator
    from carbonrouter_lib.build import build_policy
    from carbonrouter_lib.policies import make_policy

    table = pd.read_parquet(table_path)
    config = setting.SimulationConfig()
    signal = config.signal()
    out: dict = {"policy": policy, "queries": len(table)}
    gate = None
    if policy == "carbonrouter":
        from carbonrouter_lib import gate as gates

        t0 = time.perf_counter()
        opps = gates.collect_opportunities(table, config, signal)
        t1 = time.perf_counter()
        gate = gates.train_gate(opps)
        out.update(labelling_s=t1 - t0, fit_s=time.perf_counter() - t1,
                   opportunities=len(opps))
    first = table[table["session"] < table["session"].iloc[min(len(table) - 1, 2000)]]
    base, params = VARIANTS.get(policy, (policy, {}))
    policy_obj = make_policy(base, **params)
    if gate is not None:
        policy_obj.set_gate(gate)
    policy_obj = build_policy(policy_obj, table, config, signal=signal)
    t0 = time.perf_counter()
    simulator.simulate(first, policy_obj, config, signal=signal, engine=engine)
    out["warmup_s"] = time.perf_counter() - t0
    out["engine"] = engine
    walls = []
    for _ in range(repeats):
        policy_obj = make_policy(base, **params)
        if gate is not None:
            policy_obj.set_gate(gate)
        policy_obj = build_policy(policy_obj, table, config, signal=signal)  # horizon model
        t0 = time.perf_counter()
        simulator.simulate(table, policy_obj, config, signal=signal, engine=engine)
        walls.append(time.perf_counter() - t0)
    out["median_wall_s"] = statistics.median(walls)
    out["queries_per_s"] = len(table) / out["median_wall_s"]
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--copies", type=float, nargs="*", default=[1, 8, 32])
    parser.add_argument("--policies", nargs="*", default=list(POLICIES))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="1 and 8 copies, one repeat")
    parser.add_argument("--repo", default=str(REPO), help="checkout whose code is timed")
    parser.add_argument("--label", default=None, help="suffix of the results table")
    parser.add_argument("--cpu", type=int, default=None, help="core to pin the replays to")
    parser.add_argument("--engine", default="auto", choices=("auto", "python", "compiled"),
                        help="simulate's engine (auto: the compiled loop where it applies)")
    parser.add_argument("--child", nargs=5, metavar=("TABLE", "POLICY", "REPEATS", "CPU", "ENGINE"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        table, policy, repeats, cpu, engine = args.child
        print(json.dumps(child(table, policy, int(repeats), int(cpu), engine)))
        return

    import pandas as pd

    from carbonrouter_lib import prepared
    from carbonrouter_lib.outputs import save_table

    copies = [1.0, 8.0] if args.quick else args.copies
    repeats = 1 if args.quick else args.repeats
    cpu = sorted(os.sched_getaffinity(0))[-1] if args.cpu is None else args.cpu
    env = dict(os.environ, PYTHONPATH=str(Path(args.repo).resolve()))
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = "1"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in copies:
            table = prepared.prepare_workload(prepared.with_copies(prepared.WorkloadConfig(), k))
            path = Path(tmp) / f"sharegpt_x{k:g}.parquet"
            table.to_parquet(path, index=False)
            peak = prepared.peak_active_sessions(table)
            del table
            for policy in args.policies:
                cmd = [sys.executable, __file__, "--child", str(path), policy, str(repeats),
                       str(cpu), args.engine]
                done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    raise RuntimeError(f"{policy} at {k:g} copies failed:\n{done.stderr[-3000:]}")
                row = json.loads(done.stdout.strip().splitlines()[-1])
                row.update(copies=k, peak_sessions=peak, repo=str(args.repo))
                rows.append(row)
                print(f"{k:>5g} copies (P {peak:>5}) {policy:22s} "
                      f"{row['queries_per_s'] / 1e3:7.1f}K queries/s  "
                      f"peak RSS {row['peak_rss_mib'] / 1024:5.2f} GiB"
                      + (f"  gate: labelling {row['labelling_s']:.1f} s, fits {row['fit_s']:.1f} s"
                         if "labelling_s" in row else ""), flush=True)
    name = "scale" if args.label is None else f"scale_{args.label}"
    save_table(pd.DataFrame(rows), name, REPO / "results" / "benchmarks")


if __name__ == "__main__":
    main()
