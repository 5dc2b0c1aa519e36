"""The router as it is (its defaults: the pair, J = 1, the slot price over 16 turns) against every
online policy in a year no run had looked at: the seasons' weeks of 2021 (grid ``"year2021"``,
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

``told`` → ``horizon_told_2021_{table,bound}.csv``: the router as it is told the future
(:data:`carbonrouter_lib.horizon_eval.TOLD`: the intensities, the session length, both, the
models its future turns will need, all three; docs/model.md §11.4c), each given the router's SLO,
beside the router, and each one's share of the bound's possible saving: on a held-out year, how
much of the bound's saving the information the router lacks is worth. References, not online
policies. The router's runs are the main tables' to the last digit (checked). 10–15 minutes on
two cores with the main tables' runs cached.

The runs are notebook 09's with ``grid="year2021"`` (its two phases: CarbonRouter first, its P95
TTFT per setting the router's SLO), with the router's parameters given explicitly
(:data:`slot16.SLOT16_ROUTER`, its defaults since 2026-12-07), so a rerun makes these tables again
whatever the defaults become. No oracle gate (a reference, not online: most of an hour of a grid
on two cores). About 20 minutes on two cores from scratch (224 runs in 7 minutes, the data's
preparation and the 32 bounds the rest). Run from the repository root:
``.venv/bin/python docs/evidence/year2021.py [told]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from carbonrouter_lib import horizon_eval as he
from carbonrouter_lib import sweep

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from slot16 import SLOT16_ROUTER  # noqa: E402  (the router's defaults, given explicitly)
from slot_credit import save_grid  # noqa: E402  (table, verdicts and bound shares)
from told import first_phase_slos, save_told  # noqa: E402  (notebook 09's first phase)

#: The grid of these tables.
GRID = "year2021"
#: The tables' names: ``horizon_2021_*``, ``horizon_told_2021_*``.
YEAR = "2021"


def grid_runs(told: bool = False) -> pd.DataFrame:
    """Notebook 09's runs of :data:`GRID`: every online policy and the router (its defaults
    since 2026-12-07, given explicitly: :data:`slot16.SLOT16_ROUTER`), the router given
    CarbonRouter's P95 TTFT in each setting as its SLO (the first phase). With ``told``:
    Session-Affinity, the router and every told reference (given the same SLO)."""
    settings = he.grid_settings(GRID)[0]
    slo = first_phase_slos(he.grid(settings, noise=(), reference=()))
    if not told:
        return he.grid(settings, noise=(), reference=(), target_params=SLOT16_ROUTER,
                       ttft_slo=slo)
    grid = he.grid(settings, variants_in=settings, variants=he.TOLD, noise=(), reference=(),
                   target_params=SLOT16_ROUTER, ttft_slo=slo)
    return grid[grid["policy"].isin(["session-affinity", he.TARGET, *he.TOLD])].reset_index(
        drop=True)


def main(what: str) -> None:
    if what not in ("grid", "told"):
        raise SystemExit(f"year2021.py: 'told' or nothing, got {what!r}")
    runs = grid_runs(told=what == "told")
    results = sweep.run_sweep(list(runs["spec"]))
    t = he.table(results, runs, designed_on=he.DESIGNED_ON_PAIR)
    if what == "grid":
        save_grid(t, he.bound_shares(results, runs), f"horizon_{YEAR}")
        return
    committed = pd.read_csv(HERE / f"horizon_{YEAR}_table.csv")
    key = [*he.SETTING, "policy"]
    mine = t.merge(committed[[*key, "total_co2_kg"]], on=key, suffixes=("", "_c"))
    if len(mine) != 2 * 32 or not (mine["total_co2_kg"] == mine["total_co2_kg_c"]).all():
        raise SystemExit("year2021.py told: the router's or Session-Affinity's runs are not the "
                         f"committed horizon_{YEAR}_table.csv's")
    save_told(t, f"horizon_told_{YEAR}", f"horizon_{YEAR}_bound.csv", he.DESIGNED_ON_PAIR)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "grid")
