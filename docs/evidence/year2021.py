"""The router as it is (its defaults: the pair, J = 1, the slot price over 16 turns) against every
online policy in a year no run had looked at: the seasons' weeks of 2021 (grid ``"2021"``,
:data:`carbonrouter_lib.horizon_eval.YEAR_2021_WEEKS`, the first Monday of January, April, July
and October), replayed with 2021's carbon signal, the full grid's 32 settings otherwise (both
datasets, both region sets, both KV-memory rules).

Why. Every part of the router was designed after the full grid (2022's seasons) had been seen, and
the pair's two prices after the fresh weeks (2022) too: in notebook 09's tables only the scale
sweep, which replays the tuned setting's window, is held-out for the router as it is. 2021 was
replayed first here, after all of it: every setting is held-out for every part, and its grid's
intensities (another year of every region's grid) are ones no choice was made on.

- ``horizon_2021_table.csv`` (:func:`carbonrouter_lib.horizon_eval.table`: every policy's CO2,
  P95 TTFT, quality, hit rate and switches, and the router's saving over it with its paired 95%
  CI over conversations);
- ``horizon_2021_verdicts.csv`` (:func:`~carbonrouter_lib.horizon_eval.verdicts`: the lowest CO2
  of every online policy, P95 TTFT against CarbonRouter's, quality);
- ``horizon_2021_bound.csv`` (:func:`~carbonrouter_lib.horizon_eval.bound_shares`: the
  clairvoyant bound of each setting and every policy's share of its possible saving over
  Session-Affinity).

The runs are notebook 09's with ``grid="2021"`` (its two phases: CarbonRouter first, its P95 TTFT
per setting the router's SLO), so the notebook reads them from the sweep's cache. No oracle gate
(a reference, not online: most of an hour of a grid on two cores). About 40 minutes on two cores
from scratch, the bounds included. Run from the repository root:
``.venv/bin/python docs/evidence/year2021.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from carbonrouter_lib import horizon_eval as he
from carbonrouter_lib import sweep

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from slot_credit import save_grid  # noqa: E402  (table, verdicts and bound shares)

#: The grid of these tables.
GRID = "2021"


def grid_runs() -> pd.DataFrame:
    """Notebook 09's runs of :data:`GRID`: every online policy and the router (its defaults),
    the router given CarbonRouter's P95 TTFT in each setting as its SLO (the first phase)."""
    settings = he.grid_settings(GRID)[0]
    first = he.slo_runs(he.grid(settings, reference=()))
    slo = he.ttft_slos(sweep.run_sweep(list(first["spec"])), first)
    return he.grid(settings, noise=(), reference=(), ttft_slo=slo)


def main() -> None:
    runs = grid_runs()
    results = sweep.run_sweep(list(runs["spec"]))
    t = he.table(results, runs, designed_on=he.DESIGNED_ON_PAIR)
    save_grid(t, he.bound_shares(results, runs), f"horizon_{GRID}")


if __name__ == "__main__":
    main()
