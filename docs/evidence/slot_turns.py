"""How the default router moves with the slot price's remaining time (``slot_turns``, the turns
T_k sums the survival S_k(j) over; docs/model.md §11.4a, "The default since 2026-12-07").

Why. The default router prices one future turn (J = 1) and the slot price's remaining time
T_k = Σ_{j ≤ 16} S_k(j) (times the think time τ) over 16 turns. The 16 was not chosen: it is the
J = 16 the router had before (chosen at the tuned setting for a router without either price),
kept for the slot price when J became 1. A headline that hinges on a setting nobody chose should
show how it moves with it. 8% of ShareGPT's sessions have more than 16 turns (2.6% more than 32,
the longest 300); on the Mooncake trace 0.09% more than 16. With fewer turns T_k counts less of a
long session's stay, with more it counts all of it.

The runs: the default router (its parameters given explicitly, :data:`slot16.SLOT16_ROUTER`) and
the same router with ``slot_turns`` = 4, 8, 32, 64 and 300 (300: every session's whole rest, no
training session is longer), every online policy beside them, on notebook 09's full grid or fresh
weeks in notebook 09's two phases (each router given CarbonRouter's P95 TTFT in the setting as its
SLO). Each value's horizon model (S_k(j) over its turns) is fitted as the default's is.
Nothing here is tuned: every value is reported. The full grid is where J = 1 with 16 turns was
chosen, so only the fresh weeks are held-out for any choice made from these tables.

``full|fresh`` → ``horizon_slot_turns_{grid}_table.csv`` (:func:`carbonrouter_lib.horizon_eval.
table`: each run's quantities and the default's saving over each value with its paired 95% CI
over conversations: positive where 16 turns emit less), ``_bound.csv`` (each run's share of the
committed bound's possible saving over Session-Affinity) and ``_verdicts.csv`` (per value, with it
as the router, the targets of notebook 09's verdicts). The default's runs are checked against the
committed ``horizon_slot16_{grid}_table.csv`` (to the last digit). About 15 minutes a grid on two
cores with the online policies' runs cached. Run from the repository root:
``.venv/bin/python docs/evidence/slot_turns.py full|fresh``.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pandas as pd

from carbonrouter_lib import horizon_eval as he
from carbonrouter_lib import sweep
from carbonrouter_lib.outputs import save_table

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from horizon_length import length_verdicts, print_drift  # noqa: E402
from slot16 import SLOT16_ROUTER  # noqa: E402  (the default router's parameters, explicit)
from slot_credit import bound_shares  # noqa: E402
from told import first_phase_slos  # noqa: E402  (notebook 09's first phase)

#: The values beside the default's 16: label → HorizonRouter parameters over the default's.
TURNS: dict[str, dict[str, int]] = {f"slot price over {n} turns": {"slot_turns": n}
                                    for n in (4, 8, 32, 64, 300)}


def runs(grid: str, variants: dict[str, dict] = TURNS) -> pd.DataFrame:
    """Every online policy, the default router and each of ``variants`` (label → HorizonRouter
    parameters over the default's; default :data:`TURNS`) in ``grid``'s settings, each router
    given CarbonRouter's P95 TTFT in the setting as its SLO."""
    settings = he.grid_settings(grid)[0]
    slo = first_phase_slos(he.grid(settings, noise=(), reference=()))
    return he.grid(settings, variants_in=settings, variants=variants, noise=(), reference=(),
                   target_params=SLOT16_ROUTER, ttft_slo=slo)


def tables(grid: str, variants: dict[str, dict], name: str) -> None:
    """``variants`` beside the default router and every online policy in ``grid``
    (:func:`runs`) → ``{name}_{grid}_{table,bound,verdicts}.csv``, the default's runs checked
    against the committed ``horizon_slot16_{grid}_table.csv``; prints the summaries."""
    if grid not in ("full", "fresh"):
        raise SystemExit(f"grid must be 'full' or 'fresh', got {grid!r}")
    r = runs(grid, variants)
    results = sweep.run_sweep(list(r["spec"]))
    table = functools.partial(he.table, designed_on=he.DESIGNED_ON_PAIR)
    t = table(results, r)
    print_drift(t, f"horizon_slot16_{grid}_table.csv", he.SETTING)
    s = bound_shares(t, pd.read_csv(HERE / f"horizon_{grid}_bound.csv"),
                     designed_on=he.DESIGNED_ON_PAIR, policies=(*he.ONLINE, he.TARGET, *variants))
    v = length_verdicts(results, r, variants, table, column="router")
    for df, part in ((t, "table"), (s, "bound"), (v, "verdicts")):
        save_table(df, f"{name}_{grid}_{part}", HERE, parquet=False)
    print(v.groupby("router")["lowest_co2"].value_counts().unstack(fill_value=0).to_string())
    x = t[t["policy"].isin(list(variants))]
    print("the default's saving over each variant, %: median, range, CI above 0, CI below 0")
    for label, g in x.groupby("policy", sort=False):
        print(f"  {label}: {g['saving_pct'].median():+.2f} [{g['saving_pct'].min():+.2f}, "
              f"{g['saving_pct'].max():+.2f}], {(g['ci_low_pct'] > 0).sum()}, "
              f"{(g['ci_high_pct'] < 0).sum()} of {len(g)}")
    wide = s.pivot_table(index=list(he.SETTING), columns="policy", sort=False,
                         values="share_of_possible_saving")[[he.TARGET, *variants]]
    print(wide.groupby(level=["dataset", "memory"]).median().round(3).to_string())
    print("median:", wide.median().round(3).to_dict())
    print("≥ 0.70:", (wide >= 0.70).sum().to_dict())


def main(grid: str) -> None:
    tables(grid, TURNS, "horizon_slot_turns")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "full")
