"""The horizon router with the slot price (its default since these tables were made; docs/model.md
§11.4a) against every online policy and the router without it (``slot_price=False``), in the
README's seven settings (notebook 09's ``extended`` grid): ``horizon_slot_price_table.csv``
(:func:`carbonrouter_lib.horizon_eval.table`: every policy's CO2 and the slot-priced router's
saving over it, paired 95% CIs over conversations), ``horizon_slot_price_verdicts.csv``
(:func:`~carbonrouter_lib.horizon_eval.verdicts`) and ``horizon_slot_price_bound.csv`` (its
share of the clairvoyant bound's possible saving,
:func:`~carbonrouter_lib.horizon_eval.bound_shares`).

Nothing of the slot price was tuned: its smoothing (0.01) and its unit scale were set before
any setting was replayed with it; the tuned setting (``horizon_eval.TUNED``) is the horizon
router's. The slot-priced runs take seconds each in the compiled loop; the other runs come from
the sweep cache. Run from the
repository root: ``.venv/bin/python docs/evidence/slot_price.py [grid] [--residence]`` (a grid of
notebook 09; the Mooncake trace's settings are the ``full`` grid's rows; ``--residence``: the
target is the slot price with ``slot_residence=True``, tables
``horizon_slot_price[_grid]_residence_*.csv``, without the oracle gate's reference runs, which
the verdicts ignore and which take about an hour of the full grid on two cores).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pandas as pd

from carbonrouter_lib import horizon_eval as he
from carbonrouter_lib import sweep
from carbonrouter_lib.outputs import save_table

HERE = Path(__file__).resolve().parent
#: The label of the horizon router without the slot price in these tables.
PLAIN = "carbonrouter-horizon w/o slot price"
#: The router as these tables were made: no fallback exit, no option to move (he.FORMER).
PLAIN_PARAMS = {"slot_price": False, **he.FORMER, **he.BEFORE_PAIR}
#: The label of the slot-priced router when the residence variant is the target.
SLOT = "carbonrouter-horizon + slot price"
SLOT_PARAMS = {"slot_price": True, **he.FORMER, **he.BEFORE_PAIR}
RESIDENCE_PARAMS = {"slot_price": True, "slot_residence": True, **he.FORMER,
                    **he.BEFORE_PAIR}


def runs_with_slot_price(settings, residence: bool = False) -> pd.DataFrame:
    """:func:`horizon_eval.grid` of ``settings`` with the slot-priced router as the target and
    the router without it as :data:`PLAIN`; with ``residence`` the target is the residence
    variant (``slot_residence=True``), the slot-priced router is :data:`SLOT` and the reference
    (:data:`horizon_eval.REFERENCE`) is left out."""
    grid = he.grid(settings, reference_in=[] if residence else None)
    target = grid[grid["policy"] == he.TARGET]
    runs = grid[grid["policy"] != he.TARGET]
    variants = [(PLAIN, PLAIN_PARAMS), (SLOT, SLOT_PARAMS), (he.TARGET, RESIDENCE_PARAMS)] if (
        residence) else [(PLAIN, PLAIN_PARAMS), (he.TARGET, SLOT_PARAMS)]
    out = [runs]
    for label, params in variants:
        priced = target.copy()
        priced["spec"] = [dataclasses.replace(s, policy_params=params) for s in priced["spec"]]
        priced["key"] = [s.key() for s in priced["spec"]]
        priced["policy"] = label
        out.append(priced)
    return pd.concat(out, ignore_index=True)



def main(grid: str, residence: bool = False) -> None:
    settings = he.grid_settings(grid)[0]
    suffix = ("" if grid == "extended" else f"_{grid}") + ("_residence" if residence else "")
    runs = runs_with_slot_price(settings, residence)
    results = sweep.run_sweep(list(runs["spec"]))
    t = he.table(results, runs)
    v = he.verdicts(t)
    others = (PLAIN, SLOT) if residence else (PLAIN,)
    shares = he.bound_shares(results, runs, policies=(*he.ONLINE, *others, he.TARGET))
    save_table(t, f"horizon_slot_price{suffix}_table", HERE, parquet=False)
    save_table(v, f"horizon_slot_price{suffix}_verdicts", HERE, parquet=False)
    save_table(shares, f"horizon_slot_price{suffix}_bound", HERE, parquet=False)
    print(v.round(3).to_string())
    print(shares.pivot_table(index=list(he.SETTING), columns="policy", sort=False,
                             values="share_of_possible_saving").round(3).to_string())


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--residence"]
    main(args[0] if args else "extended", residence="--residence" in sys.argv[1:])
