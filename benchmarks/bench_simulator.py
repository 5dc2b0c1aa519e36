"""Speed and memory of the trace-driven replay (a measurement, not a test).

Measures, on ONE pinned core with BLAS/OpenMP threads fixed to 1 (set before numpy is imported):

(a) decision latency per query and policy — context build (carbon lookup, the backend's caches,
    availability and free slots), feasibility and the policy's choice — timed per decision
    inside a full replay (``simulate(..., time_decisions=True)``) over the real contexts of every
    query, in the Python loop (``time.perf_counter_ns``) and, for the built-in policies, in the
    compiled loop (the time-stamp counter); p50 / p99 / mean in µs, over all 60 deployments,
    and p50 / p99 apart at the decisions on a new row of the carbon signal and at the others;
(b) end-to-end replay throughput per policy on the full ShareGPT workload: one ``simulate`` call
    (capacity from the trace, precomputation, replay, records), the workload table and the
    carbon signal loaded beforehand; queries/s and wall time, median (and best) of ``--repeats``;
(c) peak memory: the process's peak resident set (``getrusage``, covers every replay run here,
    the largest being 120 deployments × the full workload) and the Python-allocation peak of one
    replay (``tracemalloc``) of the default setting;
(d) scaling of (b) with the number of regions (2, 4, 8 → 30, 60, 120 deployments; 2022
    Electricity Maps zones added to the paper's regions) and of sessions (1K, 3K, all);
(e) the learned gate's training for the default setting: the two-branch labelling replay
    (``gate.collect_opportunities``) and the five XGBoost fits (``gate.train_gate``), wall s.

CarbonRouter (and its no-pricing ablation) route with their learned gate, trained once per
setting before the timed replays (so (a)–(d) time the routing with one XGBoost call per switch
opportunity, not the training, which (e) measures).

Run with ``.venv/bin/python benchmarks/bench_simulator.py`` (``--quick`` for fewer repeats).
Prints a table and writes ``results/benchmarks/simulator.{csv,parquet}``. Targets (the issue):
decision p50 ≤ 10 µs and p99 ≤ 50 µs, throughput ≥ 50,000 queries/s for FairCarbon and
CarbonRouter; peak memory < 2 GiB.
"""

from __future__ import annotations

import os

# Thread pools are sized when numpy loads its BLAS: pin them before the first numpy import.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
             "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from carbonrouter_lib import gate, horizon_eval, prepared, setting, simulator  # noqa: E402
from carbonrouter_lib.build import build_policy  # noqa: E402
from carbonrouter_lib.carbon import REGION_SETS, CarbonConfig, CarbonSignal  # noqa: E402
from carbonrouter_lib.outputs import save_table  # noqa: E402
from carbonrouter_lib.policies import POLICIES, make_policy  # noqa: E402

#: Region sets of the scaling runs: the paper's four, its first two, and four more Electricity
#: Maps zones with 2022 data (AT comes from ENTSO-E, as in every run).
REGIONS = {
    2: REGION_SETS["paper"][:2],
    4: REGION_SETS["paper"],
    8: REGION_SETS["paper"] + ("CH", "DE", "FR", "NL"),
}
SESSIONS = (1000, 3000, None)  # None: all
TARGET_POLICIES = ("faircarbon", "carbonrouter", "carbonrouter-no-gate")
#: Variants timed beside the registry's policies in (a): label → (policy, parameters).
VARIANTS = {f"{horizon_eval.TARGET} w/o slot price": (horizon_eval.TARGET,
                                                      horizon_eval.VARIANTS["w/o slot price"]),
            # the default router (the pair) with an SLO some candidates miss, so that the TTFT
            # price prices and ν moves
            f"{horizon_eval.TARGET} with a 0.5-s TTFT SLO": (horizon_eval.TARGET,
                                                             {"ttft_slo_s": 0.5}),
            f"{horizon_eval.TARGET} with the return exit": (horizon_eval.TARGET,
                                                            {"exit": "return"}),
            f"{horizon_eval.TARGET} with the KV price counting every loss": (
                horizon_eval.TARGET, {"kv_loss": "all"}),
            f"{horizon_eval.TARGET} before the pair": (horizon_eval.TARGET,
                                                       dict(horizon_eval.BEFORE_PAIR)),
            # the pair with J = 16 (the default from 2026-12-06 to 2026-12-07), with the SLO
            f"{horizon_eval.TARGET} with J = 16 and a 0.5-s TTFT SLO": (
                horizon_eval.TARGET, dict(horizon_eval.PAIR_J16) | {"ttft_slo_s": 0.5})}
_GATES: dict[tuple, gate.LearnedGate] = {}


def _policy(name: str, table: pd.DataFrame, config: setting.SimulationConfig,
            signal: CarbonSignal):
    """A fresh policy (a registry name or a :data:`VARIANTS` label); a learned gate is trained
    once per (workload, setting, pricing) here."""
    base, params = VARIANTS.get(name, (name, {}))
    policy = make_policy(base, **params)
    if getattr(policy, "needs_training", False):
        key = (id(table), config, policy.pricing)
        if key not in _GATES:
            _GATES[key] = gate.ensure_gate(None, config, policy.pricing, table=table,
                                           signal=signal)
        policy.set_gate(_GATES[key])
    return build_policy(policy, table, config, signal=signal)  # the horizon model, the oracle


def _row(measurement: str, policy: str, table: pd.DataFrame, n_regions: int, statistic: str,
         value: float, unit: str, n_sessions: int | None = None, engine: str = "auto") -> dict:
    return {
        "measurement": measurement, "policy": policy, "engine": engine, "n_regions": n_regions,
        "n_deployments": 15 * n_regions,
        "n_sessions": int(table["session"].nunique()) if n_sessions is None else n_sessions,
        "n_queries": len(table), "statistic": statistic, "value": float(value), "unit": unit,
    }


def decision_latency(table: pd.DataFrame, signal: CarbonSignal,
                     only: list[str] | None = None) -> list[dict]:
    """(a): per-query decision time of every policy (``only``: of these registry names and
    :data:`VARIANTS` labels) over a full replay, µs, in each loop that can replay it (the
    compiled loop: the built-in policies)."""
    rows = []
    config = setting.SimulationConfig()
    for name in only or (*POLICIES, *VARIANTS):
        for engine in ("python", "compiled"):
            try:
                res = simulator.simulate(table, _policy(name, table, config, signal), config,
                                         signal=signal, time_decisions=True, engine=engine)
            except ValueError as e:
                if "cannot replay" in str(e):
                    continue  # a policy only the Python loop replays
                raise
            us = res.decision_ns / 1e3
            # decisions at a new row of the carbon signal (5-minute steps; the records are in
            # dispatch order) against the rest: what is computed once per row shows there
            row = np.array([signal.row_index(t) for t in res.records["dispatch_s"].tolist()])
            new_row = np.r_[True, row[1:] != row[:-1]]
            stats = [("p50", np.percentile(us, 50)), ("p99", np.percentile(us, 99)),
                     ("mean", us.mean()), ("max", us.max()),
                     ("share_new_row", new_row.mean())]
            for part, sel in (("new_row", new_row), ("other", ~new_row)):
                stats += [(f"p50_{part}", np.percentile(us[sel], 50)),
                          (f"p99_{part}", np.percentile(us[sel], 99))]
            for stat, value in stats:
                rows.append(_row("decision_latency", name, table, 4, stat, value,
                                 "share" if stat == "share_new_row" else "us", engine=engine))
    return rows


def throughput(table: pd.DataFrame, policies, signal: CarbonSignal, regions: tuple[str, ...],
               repeats: int, measurement: str) -> list[dict]:
    """(b), (d): wall time of ``simulate`` per policy, median and best of ``repeats``."""
    config = setting.SimulationConfig(regions=regions)
    rows = []
    for name in policies:
        walls = []
        for _ in range(repeats):
            policy = _policy(name, table, config, signal)
            t0 = time.perf_counter()
            simulator.simulate(table, policy, config, signal=signal)
            walls.append(time.perf_counter() - t0)
        med, best = statistics.median(walls), min(walls)
        for stat, value, unit in (("median_wall", med, "s"), ("best_wall", best, "s"),
                                  ("median_rate", len(table) / med, "queries/s"),
                                  ("best_rate", len(table) / best, "queries/s")):
            rows.append(_row(measurement, name, table, len(regions), stat, value, unit))
    return rows


def replay_allocations(table: pd.DataFrame, signal: CarbonSignal) -> list[dict]:
    """(c): Python-allocation peak of one default replay (tracemalloc; slows the run)."""
    config = setting.SimulationConfig()
    policy = _policy("carbonrouter", table, config, signal)
    tracemalloc.start()
    tracemalloc.reset_peak()
    simulator.simulate(table, policy, config, signal=signal)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return [_row("memory", "carbonrouter", table, 4, "tracemalloc_peak_replay", peak / 2**20,
                 "MiB")]


def gate_training(table: pd.DataFrame, signal: CarbonSignal) -> list[dict]:
    """(e): wall time of the labelling replay and of the training, default setting."""
    config = setting.SimulationConfig()
    t0 = time.perf_counter()
    opps = gate.collect_opportunities(table, config, signal)
    t1 = time.perf_counter()
    gate.train_gate(opps)
    t2 = time.perf_counter()
    return [_row("gate_training", "carbonrouter", table, 4, "labelling_wall", t1 - t0, "s"),
            _row("gate_training", "carbonrouter", table, 4, "fit_wall", t2 - t1, "s"),
            _row("gate_training", "carbonrouter", table, 4, "opportunities", len(opps), "rows")]


def main(argv: list[str] | None = None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results-dir", default=str(Path(__file__).resolve().parents[1]
                                                      / "results" / "benchmarks"))
    parser.add_argument("--repeats", type=int, default=3, help="replays per throughput cell")
    parser.add_argument("--quick", action="store_true", help="1 repeat, no session scaling")
    parser.add_argument("--cpu", type=int, default=None,
                        help="core to pin to (default: the last one this process may use)")
    parser.add_argument("--decisions-only", action="store_true",
                        help="only (a), the decision latency (results: simulator_decisions)")
    parser.add_argument("--policies", nargs="+", default=None, metavar="NAME",
                        help="with --decisions-only: time these policies (registry names or "
                             "variant labels) only")
    args = parser.parse_args(argv)
    unknown = set(args.policies or ()) - set(POLICIES) - set(VARIANTS)
    if unknown:
        parser.error(f"--policies: unknown {sorted(unknown)}; registry names {sorted(POLICIES)} "
                     f"or variant labels {sorted(VARIANTS)}")
    if args.policies and not args.decisions_only:
        parser.error("--policies needs --decisions-only")
    repeats = 1 if args.quick else args.repeats

    allowed = sorted(os.sched_getaffinity(0))
    cpu = allowed[-1] if args.cpu is None else args.cpu
    os.sched_setaffinity(0, {cpu})
    print(f"pinned to CPU {cpu} of {allowed}; Python {platform.python_version()}, "
          f"numpy {np.__version__}; threads: OMP/BLAS = 1")

    full = prepared.prepare_workload(prepared.WorkloadConfig(dataset="sharegpt"))
    signals = {k: CarbonSignal.from_config(CarbonConfig(year=2022, regions=r))
               for k, r in REGIONS.items()}
    rows = []
    t0 = time.perf_counter()
    if not args.decisions_only:
        rows += gate_training(full, signals[4])
    rows += decision_latency(full, signals[4], args.policies)
    if args.decisions_only:
        result = pd.DataFrame(rows)
        # a selection does not overwrite the whole measurement
        name = "simulator_decisions_selected" if args.policies else "simulator_decisions"
        save_table(result, name, args.results_dir)
        _print(result)
        return result
    rows += throughput(full, list(POLICIES), signals[4], REGIONS[4], repeats, "throughput")
    for k in (2, 8):
        rows += throughput(full, TARGET_POLICIES, signals[k], REGIONS[k], repeats,
                           "scaling_regions")
    if not args.quick:
        for n_s in SESSIONS[:-1]:
            table = prepared.prepare_workload(
                prepared.WorkloadConfig(dataset="sharegpt", n_sessions=n_s, seed=0))
            rows += throughput(table, TARGET_POLICIES, signals[4], REGIONS[4], repeats,
                               "scaling_sessions")
    # ru_maxrss is in KiB on Linux: the peak over every replay above (the largest: 120
    # deployments × the full workload).
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10
    rows.append(_row("memory", "all", full, 8, "peak_rss_process", rss, "MiB"))
    rows += replay_allocations(full, signals[4])
    elapsed = time.perf_counter() - t0

    result = pd.DataFrame(rows)
    save_table(result, "simulator", args.results_dir)
    _print(result)
    print(f"\n{elapsed:.0f} s; written to {args.results_dir}/simulator.csv")
    return result


def _print(result: pd.DataFrame) -> None:
    with pd.option_context("display.width", 140, "display.max_rows", 200, "display.max_columns", 20,
                           "display.float_format", "{:,.2f}".format):
        lat = result[result.measurement == "decision_latency"]
        print("\n(a) decision latency per query, µs (60 deployments, full ShareGPT)")
        print(lat.pivot(index=["policy", "engine"], columns="statistic", values="value")
              [["p50", "p99", "mean", "max"]])
        print("\n    at a new row of the carbon signal (share of decisions) and at the others, µs")
        print(lat.pivot(index=["policy", "engine"], columns="statistic", values="value")
              [["share_new_row", "p50_new_row", "p99_new_row", "p50_other", "p99_other"]])
        rate = result[result.statistic.isin(["median_rate", "best_rate", "median_wall"])]
        if rate.empty:  # --decisions-only
            return
        print("\n(b, d) replay throughput (queries/s) and median wall time (s)")
        print(rate.pivot_table(index=["measurement", "n_deployments", "n_sessions",
                                      "n_queries", "policy"],
                               columns="statistic", values="value", sort=False))
        mem = result[result.measurement == "memory"]
        print("\n(c) memory")
        print(mem[["policy", "n_deployments", "statistic", "value", "unit"]]
              .to_string(index=False))
        gt = result[result.measurement == "gate_training"]
        print("\n(e) learned gate, default setting: labelling replay and 5 fits")
        print(gt[["statistic", "value", "unit"]].to_string(index=False))


if __name__ == "__main__":
    main()
