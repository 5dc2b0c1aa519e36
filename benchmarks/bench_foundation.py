"""Speed of the foundation's building blocks (a measurement, not a test).

Measures: building the ShareGPT turns table from scratch (salvage, re-join, three tokenizers);
building the 2022 multi-region carbon signal from the CSVs; the carbon lookup at a single dispatch
time and over a batch; and the cost model evaluated over all 60 candidate deployments of a query.
Run with ``.venv/bin/python benchmarks/bench_foundation.py`` (``make benchmarks``); prints a table.
"""

from __future__ import annotations

import os
import tempfile
import time
import timeit

import numpy as np


def _best_per_call(stmt, number: int, repeat: int = 5) -> float:
    return min(timeit.repeat(stmt, number=number, repeat=repeat)) / number


def main() -> None:
    # Build into a private cache so "from scratch" really is from scratch.
    os.environ["CARBONROUTER_CACHE_DIR"] = tempfile.mkdtemp(prefix="carbonrouter-bench-")
    from carbonrouter_lib import carbon, cost, profiles, sharegpt

    rows = []
    t0 = time.perf_counter()
    turns, _ = sharegpt.load_sharegpt_turns(progress=False)
    rows.append(("ShareGPT turns table, uncached build", time.perf_counter() - t0, "s",
                 f"{len(turns):,} turns"))
    t0 = time.perf_counter()
    sharegpt.load_sharegpt_turns(progress=False, with_text=False)
    rows.append(("ShareGPT turns table, cached load (no text)", time.perf_counter() - t0, "s", ""))

    t0 = time.perf_counter()
    sig = carbon.CarbonSignal.from_config(carbon.CarbonConfig(), cache=False)
    rows.append(("carbon signal 2022, 4 regions, 5-min grid, build", time.perf_counter() - t0, "s",
                 f"{len(sig.frame):,} rows"))
    start = sig.frame.index[0].timestamp()
    t_one = start + 12_345.6
    rows.append(("carbon lookup, one time", _best_per_call(lambda: sig.at(t_one), 20_000) * 1e6,
                 "µs/call", "all regions"))
    batch = start + np.random.default_rng(0).uniform(0, 360 * 86400, 1_000_000)
    per = _best_per_call(lambda: sig.at(batch), 3, repeat=3)
    rows.append(("carbon lookup, batch of 1M times", per, "s", f"{1e6 / per / 1e6:.1f} M/s"))

    prof = profiles.analytical_profiles()
    # 60 candidates = 15 (model, GPU) profiles x 4 regions.
    rep = lambda col: np.tile(prof[col].to_numpy(), 4)  # noqa: E731
    e_in, e_cache, e_out = rep("e_in_kwh"), rep("e_cache_kwh"), rep("e_out_kwh")
    v_pre = rep("prefill_tok_s")
    ci = np.repeat([50.0, 200.0, 150.0, 250.0], 15)
    cached = np.zeros(60)
    cached[7] = 3000.0

    def decide() -> int:
        e = cost.energy_kwh(e_in, e_cache, e_out, 120.0, 3000.0, cached, 250.0)
        c = cost.carbon_g(ci, e)
        ok = cost.ttft_s(120.0, 3000.0, cached, v_pre) <= 5.0
        return int(np.argmin(np.where(ok, c, np.inf)))

    rows.append(("cost model + argmin over 60 candidates", _best_per_call(decide, 20_000) * 1e6,
                 "µs/query", "numpy, unchecked path"))

    width = max(len(r[0]) for r in rows)
    for name, value, unit, note in rows:
        print(f"{name:<{width}}  {value:10.3f} {unit:<8} {note}")


if __name__ == "__main__":
    main()
