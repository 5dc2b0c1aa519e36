"""The horizon router's slot price without the credit for the slot a switch frees
(``slot_credit=False``) against every online policy and against the router's default slot price
(``slot_credit=True``), on notebook 09's full grid and fresh weeks:
``horizon_slot_credit_{grid}_table.csv`` (:func:`carbonrouter_lib.horizon_eval.table`: every
policy's CO2 and P95 TTFT, and the variant's saving over it, paired 95% CIs over conversations),
``horizon_slot_credit_{grid}_verdicts.csv`` (:func:`~carbonrouter_lib.horizon_eval.verdicts` of
the variant) and ``horizon_slot_credit_{grid}_bound.csv`` (each policy's share of the clairvoyant
bound's possible saving).

Why. With the default slot price a switch pays (π_new − π_held)·T_k: leaving the pool the session
holds is credited that pool's slot price. The credit pays a session to leave, and each move
recomputes the history where it lands: with ample KV memory on ShareGPT the router's P95 TTFT was
1.14–1.28× CarbonRouter's. Without the credit, staying in the held pool is free and a switch pays
the new pool's price, π_new·T_k.

What was looked at before these tables were made: the two settings the router was designed on
(``horizon_eval.DESIGNED_ON``). In the Python loop there (prototypes, 2026-12-05), ample memory:
17.907 kg and P95 TTFT 0.197 s against the default's 18.093 kg / 0.257 s and CarbonRouter's 18.244
kg / 0.203 s; the tuned setting: 22.281 kg / 0.238 s against 22.300 kg / 0.267 s. Three other rules
were tried there and dropped, their P95 TTFT with ample memory still above CarbonRouter's:
choosing, among the candidates no slower to a first token than the router's choice without the slot
price, the one of least priced cost; the same with CarbonRouter's proposal as the reference; and
crediting a switch only when the held pool has no free slot. Their code was not kept, so no numbers
of them are given; the variant's prototype gave the compiled variant's CO2 to the last digit, and
the numbers above are in the tables. Every other setting of the full grid was first seen in these
tables, and the choice between the credit and none was made on them, so only the fresh weeks are
held-out for it.

The bound: its values in the committed ``horizon_full_bound.csv`` / ``horizon_fresh_bound.csv``
(the bound does not depend on the router, and the slot credit touches only the router's slot
price), so no bound is recomputed here. Without the oracle gate's reference runs (not online: the
verdicts ignore them; they take most of an hour of a grid on two cores). About 20 minutes a grid on
two cores. Run from the repository root: ``.venv/bin/python docs/evidence/slot_credit.py
full|fresh``.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from carbonrouter_lib import bound, sweep
from carbonrouter_lib import horizon_eval as he
from carbonrouter_lib.outputs import save_table

HERE = Path(__file__).resolve().parent
#: The label of the router with its default slot price (the credit on) in these tables.
CREDIT = "carbonrouter-horizon (slot credit)"
#: The variant, the target of these tables.
NO_CREDIT_PARAMS = {"slot_credit": False}


def runs_without_credit(settings) -> pd.DataFrame:
    """:func:`horizon_eval.grid` of ``settings`` (no reference runs) with the variant
    (:data:`NO_CREDIT_PARAMS`) as the target and the default router as :data:`CREDIT`."""
    return variant_runs(settings, NO_CREDIT_PARAMS, CREDIT)


def variant_runs(settings, params: dict, default_label: str) -> pd.DataFrame:
    """:func:`horizon_eval.grid` of ``settings`` (no reference runs) with the router of
    ``params`` (HorizonRouter parameters over its defaults) as the target and the default router
    relabelled ``default_label``: a variant grid of these evidence scripts."""
    grid = he.grid(settings, reference_in=[], target_params=he.BEFORE_PAIR)
    target = grid[grid["policy"] == he.TARGET]
    variant = target.copy()
    variant["spec"] = [dataclasses.replace(s, policy_params=dict(s.policy_params) | params)
                       for s in variant["spec"]]
    variant["key"] = [s.key() for s in variant["spec"]]
    return pd.concat([grid[grid["policy"] != he.TARGET], target.assign(policy=default_label),
                      variant], ignore_index=True)


def bound_shares(t: pd.DataFrame, bounds: pd.DataFrame | None, other: str = CREDIT,
                 designed_on=he.DESIGNED_ON, policies=None) -> pd.DataFrame:
    """Per setting and policy of table ``t`` (``policies``; None: the online policies, ``other``
    and the target), the share of the committed bound's possible saving over Session-Affinity
    (NaN where ``bounds`` has no bound for the setting); ``held_out`` against ``designed_on``."""
    rows = []
    kg = {} if bounds is None else bounds.groupby(list(he.SETTING))["bound_kg"].first().to_dict()
    for st, g in t.groupby(list(he.SETTING), sort=False):
        g = g.set_index("policy")
        sa = float(g.loc["session-affinity", "total_co2_kg"])
        b = kg.get(st, np.nan)
        for p in (*he.ONLINE, other, he.TARGET) if policies is None else policies:
            co2 = float(g.loc[p, "total_co2_kg"])
            share = bound.share_of_possible_saving(sa, co2, b) if np.isfinite(b) else np.nan
            rows.append(dict(zip(he.SETTING, st, strict=True)) | {
                "policy": p, "co2_kg": co2, "bound_kg": b, "session_affinity_kg": sa,
                "share_of_possible_saving": share, "held_out": he.held_out(
                    dict(zip(he.SETTING, st, strict=True)), designed_on)})
    return pd.DataFrame(rows)



def main(grid: str) -> None:
    if grid not in ("full", "fresh"):
        raise SystemExit(f"slot_credit.py: grid must be 'full' or 'fresh', got {grid!r}")
    settings = he.grid_settings(grid)[0]
    runs = runs_without_credit(settings)
    results = sweep.run_sweep(list(runs["spec"]))
    write_variant_grid(he.table(results, runs), "slot_credit", grid)


def write_variant_grid(t: pd.DataFrame, name: str, grid: str, other: str = CREDIT,
                       designed_on=he.DESIGNED_ON) -> None:
    """Save a variant's grid (table ``t``, the variant as the target and the default router as
    ``other``) as ``horizon_{name}_{grid}_{table,verdicts,bound}.csv`` here, with the verdicts
    and the shares of the committed bound, and print them."""
    path = HERE / f"horizon_{grid}_bound.csv"
    shares = bound_shares(t, pd.read_csv(path) if path.exists() else None, other, designed_on)
    save_grid(t, shares, f"horizon_{name}_{grid}")


def save_grid(t: pd.DataFrame, shares: pd.DataFrame, name: str) -> None:
    """Save a grid's table ``t``, its verdicts and its bound ``shares`` as
    ``<name>_{table,verdicts,bound}.csv`` here, and print the verdicts and the shares."""
    v = he.verdicts(t)
    for part, frame in (("table", t), ("verdicts", v), ("bound", shares)):
        save_table(frame, f"{name}_{part}", HERE, parquet=False)
    print(v.round(3).to_string())
    print(shares.pivot_table(index=list(he.SETTING), columns="policy", sort=False,
                             values="share_of_possible_saving").round(3).to_string())


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "full")
