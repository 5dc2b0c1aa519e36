"""How the pair (docs/model.md §11.4a) moves with its horizon J, the number of future turns it
prices (``HorizonRouter(horizon=J)``; J = 16 was chosen on the tuned setting alone, and was the
default until 2026-12-07, when these tables made J = 1 with the slot price over 16 turns the
default: :mod:`slot16`). Its tables' router is the pair with J = 16
(:data:`carbonrouter_lib.horizon_eval.PAIR_J16`, pinned here through :func:`told.pair_runs` and
:func:`scale_runs`, so that rerunning the script makes its tables again):
the pair with J = 1, 4, 8, 12 and 24 beside its own J = 16 and every online
policy, on notebook 09's full grid or fresh weeks, in notebook 09's two phases (the router and
each J given CarbonRouter's P95 TTFT as its SLO): ``horizon_length_pair_{grid}_table.csv``
(:func:`carbonrouter_lib.horizon_eval.table`: each run's Table-1 quantities and the default's
saving over each J with its paired 95% CI over conversations: positive where J = 16 emits less),
``horizon_length_pair_{grid}_bound.csv`` (each J's share of the bound's possible saving over
Session-Affinity, the bound the committed ``horizon_{grid}_bound.csv``'s) and
``horizon_length_pair_{grid}_verdicts.csv`` (:func:`length_verdicts`: per J, with that J as the
router, the targets of notebook 09's verdicts: the lowest CO2 of the online policies with a paired
CI against the best other, P95 TTFT, quality).

Why. J = 16 was one of the defaults tuned on one setting (``horizon_eval.TUNED``), before the
pair, whose design looked at every setting of both grids (none is held-out for it:
:data:`carbonrouter_lib.horizon_eval.DESIGNED_ON_PAIR`). A headline that hinges on a setting
nobody chose should show how it moves with it. Two questions: does the router need its 16
turns (is the CO2 the same with fewer), and would more turns close the gap to the 70% target?
Each J's horizon model (the survival S_k(j) of its J turns) is fitted as the default's is, on
the replayed workload's training conversations. Nothing here was tuned: the tables report every
J.

The router's own runs give the committed ``horizon_kv_price_pair_{grid}_table.csv`` CO2 to the
last digit (checked below). About 10 minutes a grid on two cores. ``scale``
(``horizon_length_pair_scale_{table,verdicts}.csv``): J = 1 and 4 beside the default across
notebook 09's full scale sweep, held-out for the pair (``kv_price.py pair-scale``'s runs).
``roles`` (``horizon_length_pair_full_roles.csv``, :func:`roles`): J's two roles apart, J = 1
against J = 16 on the full grid without the slot price. ``slot16-full|slot16-fresh``
(:func:`slot16`): both together, J = 1 with the slot price's remaining time over 16 turns
(``slot_turns=16``), designed on the full grid after ``roles``; the fresh weeks and the scale
sweep (``slot16-scale``) are held-out for it. Run from the repository root:
``.venv/bin/python docs/evidence/horizon_length.py
full|fresh|scale|roles|slot16-full|slot16-fresh|slot16-scale``.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from carbonrouter_lib import horizon_eval as he
from carbonrouter_lib import sweep
from carbonrouter_lib.outputs import save_table

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from slot_credit import bound_shares  # noqa: E402  (the variant grids' shares)
from told import first_phase_slos, pair_runs  # noqa: E402  (the pair's two phases)

#: The horizons beside the pair's J = 16: label → HorizonRouter parameters over the pair's.
LENGTHS: dict[str, dict[str, int]] = {f"J = {j}": {"horizon": j} for j in (1, 4, 8, 12, 24)}
#: Those of the scale sweep (held-out for the pair; its longest replays are 8M queries).
SCALE_LENGTHS: dict[str, dict[str, int]] = {k: LENGTHS[k] for k in ("J = 1", "J = 4")}


def label_horizon(label: str) -> int:
    """The J of a policy label of these tables (:data:`LENGTHS`' or the router's, 16)."""
    return 16 if label == he.TARGET else LENGTHS[label]["horizon"]


def print_drift(t: pd.DataFrame, committed: str, by, policy: str = he.TARGET) -> None:
    """Prints the largest relative difference of ``policy``'s CO2 in table ``t`` from the
    committed table ``committed`` (a file here), per setting (the columns ``by``)."""
    c = pd.read_csv(HERE / committed)
    mine = t[t["policy"] == policy].merge(c[c["policy"] == policy], on=list(by),
                                          suffixes=("", "_c"))
    drift = float(np.max(np.abs(mine["total_co2_kg"] / mine["total_co2_kg_c"] - 1)))
    print(f"{policy}'s CO2 against {committed}: largest relative difference {drift:.2e}")


def length_verdicts(results, runs: pd.DataFrame, lengths, table_fn,
                    by=he.SETTING, column: str = "horizon") -> pd.DataFrame:
    """Per J (the router's 16 and each of ``lengths``) and setting, the targets with that J as
    the router (:func:`carbonrouter_lib.horizon_eval.verdicts`: the lowest CO2 of the online
    policies against the best other with its paired CI, P95 TTFT, quality), from ``runs`` and
    their ``results``; ``table_fn(results, runs)`` makes the table (:func:`horizon_eval.table`
    or :func:`horizon_eval.scale_table`). Column ``column``: ``"horizon"`` J, else the label."""
    out = []
    for label in (he.TARGET, *lengths):
        keep = runs[runs["policy"].isin(he.ONLINE) | (runs["policy"] == label)]
        t = table_fn(results, keep.assign(policy=keep["policy"].replace(label, he.TARGET)))
        tag = label_horizon(label) if column == "horizon" else label
        out.append(he.verdicts(t, by).assign(**{column: tag}))
    return pd.concat(out, ignore_index=True)


def scale_runs(lengths=SCALE_LENGTHS) -> pd.DataFrame:
    """Notebook 09's full scale sweep in its two phases (``kv_price.py pair-scale``'s runs: the
    router given CarbonRouter's P95 TTFT at the same :data:`~carbonrouter_lib.horizon_eval.
    SCALE_BY` setting), and the router with each of ``lengths`` (label → parameters) given the
    same SLO."""
    slo = first_phase_slos(he.scale_grid("full"), by=he.SCALE_BY)
    runs = [he.scale_grid("full", ttft_slo=slo, target_params=he.PAIR_J16)]
    for label, params in lengths.items():
        r = he.scale_grid("full", ttft_slo=slo, target_params=he.PAIR_J16 | params)
        runs.append(r[r["policy"] == he.TARGET].assign(policy=label))
    return pd.concat(runs, ignore_index=True)


def scale(lengths=SCALE_LENGTHS, name: str = "horizon_length_pair_scale",
          column: str = "horizon") -> pd.DataFrame:
    """``scale``: :func:`scale_runs` → ``{name}_table.csv``
    (:func:`carbonrouter_lib.horizon_eval.scale_table`: J = 16's saving over each J with its
    CI), checked against the committed ``horizon_kv_price_pair_scale_table.csv``, and
    ``{name}_verdicts.csv`` (:func:`length_verdicts`, its ``column``). Returns the table."""
    r = scale_runs(lengths)
    results = sweep.run_sweep(list(r["spec"]))
    t = he.scale_table(results, r)
    by = list(he.SCALE_BY)
    print_drift(t, "horizon_kv_price_pair_scale_table.csv", by)
    save_table(t, f"{name}_table", HERE, parquet=False)
    v = length_verdicts(results, r, lengths, he.scale_table, he.SCALE_BY, column=column)
    save_table(v, f"{name}_verdicts", HERE, parquet=False)
    print(v.groupby(column)["lowest_co2"].value_counts().unstack(fill_value=0).to_string())
    v = t[t["policy"].isin(list(lengths))]
    print(v[[*by, "policy", "saving_pct", "ci_low_pct", "ci_high_pct"]].round(2).to_string())
    return t


#: J's two roles apart: J = 16 and J = 1 without the slot price (its remaining time T_k is the sum
#: of S_k(j) over j ≤ J), so that only the future term differs.
WITHOUT_SLOT: dict[str, dict[str, Any]] = {
    "J = 16, w/o slot price": {"slot_price": False},
    "J = 1, w/o slot price": {"horizon": 1, "slot_price": False}}


def roles() -> None:
    """``roles``: on the full grid, J = 1 against J = 16 with the slot price (the committed
    ``horizon_length_pair_full_table.csv``) and without it (:data:`WITHOUT_SLOT`, given the same
    SLO): ``horizon_length_pair_full_roles.csv``, per setting J = 16's saving over J = 1 with its
    paired CI in each case (negative where J = 1 emits less)."""
    settings = he.grid_settings("full")[0]
    r = pair_runs(settings, variants=WITHOUT_SLOT, online=he.ONLINE)
    results = sweep.run_sweep(list(r["spec"]))
    j16, j1 = WITHOUT_SLOT
    keep = r[r["policy"].isin([*he.ONLINE, j16, j1])]
    t = he.table(results, keep.assign(policy=keep["policy"].replace(j16, he.TARGET)),
                 designed_on=he.DESIGNED_ON_PAIR)
    committed = pd.read_csv(HERE / "horizon_length_pair_full_table.csv")
    cols = ["saving_pct", "ci_low_pct", "ci_high_pct"]
    with_slot = committed[committed["policy"] == "J = 1"][[*he.SETTING, *cols]]
    without = t[t["policy"] == j1][[*he.SETTING, *cols]]
    out = with_slot.merge(without, on=list(he.SETTING), suffixes=("", "_without_slot_price"))
    save_table(out, "horizon_length_pair_full_roles", HERE, parquet=False)
    print(out.round(2).to_string())


#: The roles' combination: J = 1 for the future term, the slot price's remaining time over 16
#: turns (``slot_turns``), beside J = 1.
SLOT16: dict[str, dict[str, Any]] = {
    "J = 1": {"horizon": 1}, "J = 1, slot price over 16 turns": {"horizon": 1, "slot_turns": 16}}


def grid_tables(grid: str, variants, name: str, column: str):
    """``variants`` (label → parameters over the pair's) beside the default and every online
    policy in ``grid`` (the pair's two phases, :func:`told.pair_runs`), the router's runs checked
    against the committed pair table: ``{name}_{table,bound,verdicts}.csv`` (the verdicts'
    ``column``: :func:`length_verdicts`'s). Returns the three tables."""
    r = pair_runs(he.grid_settings(grid)[0], variants=variants, online=he.ONLINE)
    results = sweep.run_sweep(list(r["spec"]))
    t = he.table(results, r, designed_on=he.DESIGNED_ON_PAIR)
    print_drift(t, f"horizon_kv_price_pair_{grid}_table.csv", he.SETTING)
    s = bound_shares(t, pd.read_csv(HERE / f"horizon_{grid}_bound.csv"),
                     designed_on=he.DESIGNED_ON_PAIR, policies=(*he.ONLINE, he.TARGET, *variants))
    v = length_verdicts(results, r, variants, functools.partial(
        he.table, designed_on=he.DESIGNED_ON_PAIR), column=column)
    for table, part in ((t, "table"), (s, "bound"), (v, "verdicts")):
        save_table(table, f"{name}_{part}", HERE, parquet=False)
    print(v.groupby(column)["lowest_co2"].value_counts().unstack(fill_value=0).to_string())
    return t, s, v


def slot16(grid: str) -> None:
    """``slot16-full|slot16-fresh``: :data:`SLOT16` beside the default and every online policy
    in ``grid`` → ``horizon_length_pair_{grid}_slot16_{table,bound,verdicts}.csv``
    (:func:`grid_tables`); J = 1's runs are checked against the committed J table.
    ``slot16-scale``: the same across the scale sweep (:func:`scale`) →
    ``horizon_length_pair_scale_slot16_{table,verdicts}.csv``, held-out for it."""
    if grid == "scale":
        t = scale(SLOT16, "horizon_length_pair_scale_slot16", "router")
        print_drift(t, "horizon_length_pair_scale_table.csv", list(he.SCALE_BY), "J = 1")
        return
    t, s, _ = grid_tables(grid, SLOT16, f"horizon_length_pair_{grid}_slot16", "router")
    print_drift(t, f"horizon_length_pair_{grid}_table.csv", he.SETTING, "J = 1")
    x = t[t["policy"].isin(list(SLOT16))]
    print(x[[*he.SETTING, "policy", "saving_pct", "ci_low_pct", "ci_high_pct"]].round(2)
          .to_string())
    wide = s.pivot_table(index=list(he.SETTING), columns="policy",
                         values="share_of_possible_saving")[[*SLOT16, he.TARGET]]
    print(wide.groupby(level=["dataset", "memory"]).median().round(3).to_string())


def main(grid: str) -> None:
    if grid.startswith("slot16-"):
        slot16(grid.removeprefix("slot16-"))
        return
    if grid == "scale":
        scale()
        return
    if grid == "roles":
        roles()
        return
    if grid not in ("full", "fresh"):
        raise SystemExit(f"horizon_length.py: grid must be 'full', 'fresh', 'scale', 'roles', "
                         f"'slot16-full', 'slot16-fresh' or 'slot16-scale', got {grid!r}")
    t, s, _ = grid_tables(grid, LENGTHS, f"horizon_length_pair_{grid}", "horizon")
    wide = s.pivot_table(index=list(he.SETTING), columns="policy", sort=False,
                         values="share_of_possible_saving")[[*LENGTHS, he.TARGET]]
    print(wide.round(3).to_string())
    print(wide.groupby(level=["dataset", "memory"]).median().round(3).to_string())
    print("≥ 0.70:", (wide >= 0.70).sum().to_dict())
    v = t[t["policy"].isin(list(LENGTHS))]
    print("J = 16's saving over each J, %: median, CI above 0, CI below 0")
    for label, g in v.groupby("policy", sort=False):
        print(f"  {label}: {g['saving_pct'].median():+.2f}, {(g['ci_low_pct'] > 0).sum()}, "
              f"{(g['ci_high_pct'] < 0).sum()} of {len(g)}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "full")
