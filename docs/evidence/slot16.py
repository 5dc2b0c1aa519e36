"""The router with J = 1 and the slot price's remaining time over 16 turns
(``HorizonRouter(horizon=1, slot_turns=16)``, docs/model.md §11.4a, "The pair's horizon J") as
the target of notebook 09's tables, beside every online policy, the oracle gate and the pair with
J = 16 (:data:`PAIR_J16`): the tables the pair's are (``kv_price.py pair-*``), with the horizon
as :func:`horizon_length.slot16` chose it.

- ``full|fresh`` → ``horizon_slot16_{grid}_{table,verdicts,bound}.csv``
  (:func:`carbonrouter_lib.horizon_eval.table`: every policy's CO2, P95 TTFT, quality, hit rate
  and switches, and the router's saving over it with its paired 95% CI over conversations;
  :func:`~carbonrouter_lib.horizon_eval.verdicts`; each policy's share of the committed bound's
  possible saving over Session-Affinity). The full grid has the oracle gate (a reference, not in
  the verdicts) in every setting.
- ``scale`` → ``horizon_slot16_scale_{table,verdicts}.csv``: notebook 09's full scale sweep.
- ``scale-bound`` → ``horizon_slot16_scale_bound.csv``: the same runs' shares of the clairvoyant
  bound's possible saving over Session-Affinity at every scale of the sweep
  (:func:`carbonrouter_lib.horizon_eval.scale_bound_shares`; the bound computed and cached per
  setting, about 15 minutes with the sweep's runs cached): how the 70% target's verdict moves
  with the scale.
- ``variants`` → ``horizon_slot16_variants.csv``: its ablations and forecast errors
  (:data:`carbonrouter_lib.horizon_eval.VARIANTS` over its parameters: where a variant turns the
  slot price off, sets J = 0 or the residence, ``slot_turns`` does not act) in the four settings
  of notebook 09's ablations.

Every run is notebook 09's second phase: the router, each variant and the pair with J = 16 are
given CarbonRouter's P95 TTFT in the setting (a first phase of CarbonRouter's runs) as their SLO.
The router's parameters are given explicitly, and so are the pair's (J = 16, the slot price over
J), so the tables do not depend on the router's defaults. The runs that are also another table's
are that table's to the last digit (checked below: the router's the committed
``horizon_length_pair_{grid}_slot16_table.csv``'s, the pair's and every online policy's the
committed ``horizon_kv_price_pair_{grid}_table.csv``'s).

What was looked at: J = 1 with the slot price over 16 turns was designed on the full grid (after
``horizon_length.py roles``); the fresh weeks and the scale sweep are held-out for that choice.
The pair's two prices were designed after both grids, so ``held_out`` is False in both grids
(:data:`carbonrouter_lib.horizon_eval.DESIGNED_ON_PAIR`) and True in the scale sweep. About 20
minutes a grid on two cores from scratch (the oracle gate's 32 runs most of an hour). Run from the
repository root: ``.venv/bin/python docs/evidence/slot16.py
full|fresh|scale|scale-bound|variants``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pandas as pd

from carbonrouter_lib import horizon_eval as he
from carbonrouter_lib import sweep
from carbonrouter_lib.outputs import save_table

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from horizon_length import SLOT16, print_drift  # noqa: E402
from slot_credit import write_variant_grid  # noqa: E402  (table, verdicts and bound shares)
from told import first_phase_slos  # noqa: E402  (notebook 09's first phase)

#: The pair with J = 16 (the default router from 2026-12-06 to 2026-12-07), its label here; its
#: parameters :data:`carbonrouter_lib.horizon_eval.PAIR_J16`, given explicitly.
PAIR_J16 = "the pair, J = 16"
#: The router's label in :func:`horizon_length.slot16`'s tables.
SLOT16_LABEL = "J = 1, slot price over 16 turns"
#: The router's parameters, given explicitly (the router's defaults since 2026-12-07).
SLOT16_ROUTER: dict[str, Any] = SLOT16[SLOT16_LABEL]



def grid_runs(grid: str) -> pd.DataFrame:
    """The runs of ``full|fresh|variants``: every online policy, the router
    (:data:`SLOT16_ROUTER`) and :data:`PAIR_J16`, each router given its SLO; in the full grid
    also the oracle gate; in ``variants`` (the full grid's four settings of the ablations)
    also the router's ablations and forecast errors."""
    settings, with_variants = he.grid_settings("full" if grid == "variants" else grid)
    if grid == "variants":
        settings, variants, noise = with_variants, he.VARIANTS, he.NOISE
    else:
        variants, noise = {}, ()
    return he.grid(settings, variants_in=settings,
                   variants=variants | {PAIR_J16: he.PAIR_J16}, noise=noise,
                   reference=() if grid == "fresh" else he.REFERENCE,
                   target_params=SLOT16_ROUTER,
                   ttft_slo=first_phase_slos(he.grid(settings, noise=(), reference=())))


def scale_runs() -> pd.DataFrame:
    """The runs of ``scale``: notebook 09's full scale sweep, every online policy, the router and
    :data:`PAIR_J16`, each router given CarbonRouter's P95 TTFT at the same setting."""
    slo = first_phase_slos(he.scale_grid("full"), by=he.SCALE_BY)
    runs = he.scale_grid("full", ttft_slo=slo, target_params=SLOT16_ROUTER)
    j16 = he.scale_grid("full", ttft_slo=slo, target_params=he.PAIR_J16)
    return pd.concat([runs, j16[j16["policy"] == he.TARGET].assign(policy=PAIR_J16)],
                     ignore_index=True)


def _drift(t: pd.DataFrame, name: str, by) -> None:
    """The router's, the pair's and the online policies' CO2 against the committed tables."""
    print_drift(t.assign(policy=t["policy"].replace(he.TARGET, SLOT16_LABEL)),
                f"horizon_length_pair_{name}_slot16_table.csv", by, SLOT16_LABEL)
    pair = t.assign(policy=t["policy"].replace({he.TARGET: "mine", PAIR_J16: he.TARGET}))
    for policy in (he.TARGET, *he.ONLINE):
        print_drift(pair, f"horizon_kv_price_pair_{name}_table.csv", by, policy)


def scale_bound() -> None:
    """``scale-bound``: the scale sweep's runs (:func:`scale_runs`, their drift against the
    committed tables printed) and every online policy's, the router's and the pair's with
    J = 16 share of the bound's possible saving per setting."""
    runs = scale_runs()
    results = sweep.run_sweep(list(runs["spec"]))
    _drift(he.scale_table(results, runs), "scale", list(he.SCALE_BY))
    shares = he.scale_bound_shares(results, runs, policies=(*he.ONLINE, he.TARGET, PAIR_J16))
    save_table(shares, "horizon_slot16_scale_bound", HERE, parquet=False)
    print(shares.pivot_table(index=[*he.SCALE_BY, "peak_sessions"], columns="policy",
                             sort=False, values="share_of_possible_saving").round(3).to_string())


def main(grid: str) -> None:
    if grid == "scale-bound":
        scale_bound()
        return
    if grid == "scale":
        runs = scale_runs()
        t = he.scale_table(sweep.run_sweep(list(runs["spec"])), runs)
        _drift(t, "scale", list(he.SCALE_BY))
        v = he.verdicts(t, by=he.SCALE_BY)
        save_table(t, "horizon_slot16_scale_table", HERE, parquet=False)
        save_table(v, "horizon_slot16_scale_verdicts", HERE, parquet=False)
        print(v.round(3).to_string())
        return
    if grid not in ("full", "fresh", "variants"):
        raise SystemExit(f"slot16.py: grid must be 'full', 'fresh', 'scale', 'scale-bound' or "
                         f"'variants', got {grid!r}")
    runs = grid_runs(grid)
    t = he.table(sweep.run_sweep(list(runs["spec"])), runs, designed_on=he.DESIGNED_ON_PAIR)
    _drift(t, "full" if grid == "variants" else grid, he.SETTING)
    if grid == "variants":
        save_table(t, "horizon_slot16_variants", HERE, parquet=False)
        print(t[[*he.SETTING, "policy", "co2_rel", "saving_pct", "ci_low_pct", "ci_high_pct",
                 "p95_ttft_s"]].round(3).to_string())
        return
    write_variant_grid(t, "slot16", grid, other=PAIR_J16, designed_on=he.DESIGNED_ON_PAIR)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "full")
