"""Does the capacity-priced bound depend on two settings nobody chose, the iterations of its
subgradient ascent and the width of its price buckets? At the tuned setting:
``horizon_priced_convergence.csv``; the defaults (24 iterations, 60-minute buckets) were chosen
from it.

:func:`carbonrouter_lib.bound.capacity_priced_bound` prices every (region, GPU) pool's slots and
every KV pool's memory per bucket of time and keeps the largest Lagrangian value its projected
subgradient ascent reaches in ``iterations`` steps. Every iterate is a valid lower bound, so
running longer can only show how far a shorter run is from what the relaxation can give. The
bucket width cuts both ways: a bucket's constraint (use ≤ capacity × width) is implied by the
instantaneous one for any width, and a narrower bucket is a tighter constraint; but a session's
use is charged per bucket as the least holding over every dispatch time a policy can give it
(``bound._holding_weights``), and a narrower bucket charges less of it (``held_intervals.py``).
Here each of 30-, 60- and 5-minute buckets is taken to 48 iterations (the steps do not depend on
the number of iterations, so the first 24 at 60 minutes are the default's). The step target is
the router's CO2, as in ``follow_path.py``. Per iteration: the Lagrangian value, the largest so
far, the share of the paths' slot and memory use above capacity, and the router's share of the
saving over Session-Affinity that the largest so far says is possible.

Nothing here was tuned. About 35 minutes on two cores (one run per process; an iteration is one
evaluation of the DP over every session, about 25 s). Run from the repository root:
``.venv/bin/python docs/evidence/priced_convergence.py``.
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path

import pandas as pd

from carbonrouter_lib import bound, prepared, sweep
from carbonrouter_lib import horizon_eval as he
from carbonrouter_lib.outputs import save_table

HERE = Path(__file__).resolve().parent
ITERATIONS = 48
BUCKETS_S = (1800.0, 3600.0, 300.0)


def _runs() -> dict[str, float]:
    """The tuned setting's CO2 of Session-Affinity and the router, gCO2e."""
    wcfg, scfg = he.setting(he.TUNED)
    return {p: float(sweep.run_one(sweep.RunSpec.make(wcfg, scfg, p, params))["carbon_g"].sum())
            for p, params in (("session-affinity", {}), (he.TARGET, he.BEFORE_PAIR))}


def one(bucket_s: float, co2: dict[str, float]) -> pd.DataFrame:
    """The priced bound's ascent at the tuned setting with buckets of ``bucket_s`` seconds;
    ``co2``: :func:`_runs`."""
    wcfg, scfg = he.setting(he.TUNED)
    table = prepared.prepare_workload(wcfg)
    pb = bound.capacity_priced_bound(table, scfg, upper_g=co2[he.TARGET],
                                     iterations=ITERATIONS, bucket_s=bucket_s)
    h = pb["history"]
    best = h["bound_g"].cummax()
    return pd.DataFrame({
        **he.TUNED, "bucket_s": bucket_s,
        "iteration": h["iteration"], "lagrangian_kg": h["bound_g"] / 1e3,
        "priced_bound_kg": best / 1e3, "plain_bound_kg": pb["plain_g"] / 1e3,
        "slot_excess": h["slot_excess"], "kv_excess": h["kv_excess"],
        "co2_kg": co2[he.TARGET] / 1e3, "session_affinity_kg": co2["session-affinity"] / 1e3,
        "share_of_priced_saving": [bound.share_of_possible_saving(
            co2["session-affinity"], co2[he.TARGET], b) for b in best],
    })


def main() -> None:
    with ProcessPoolExecutor(len(BUCKETS_S)) as pool:
        parts = list(pool.map(partial(one, co2=_runs()), BUCKETS_S))
    t = pd.concat(parts, ignore_index=True)
    save_table(t, "horizon_priced_convergence", HERE, parquet=False)
    view = t[t["iteration"].isin([0, 12, 24, ITERATIONS])]
    print(view[["bucket_s", "iteration", "priced_bound_kg", "slot_excess", "kv_excess",
                "share_of_priced_saving"]].round(4).to_string(index=False))


if __name__ == "__main__":
    main()
