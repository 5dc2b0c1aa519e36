"""The former default kept as evidence: notebook 09's full grid and scale sweep with the horizon
router *without* the slot price (``slot_price=False``; docs/model.md §11.4a):
``horizon_plain_full_{table,verdicts,variants,bound}.csv`` and
``horizon_plain_scale_{table,verdicts}.csv``, the same tables notebook 09 saves with
``grid="full"`` and ``bound_every_setting=True`` (``horizon_table``, ``horizon_verdicts``,
``horizon_ablations``, ``horizon_bound_shares``, ``horizon_scale_table``,
``horizon_scale_verdicts``). The ablation ``w/o slot price`` is left out: without the slot
price it is the router itself.

These were the router's tables before the slot price was made its default, on all 32 settings
at once (README, "How the slot price was found"). The online policies' runs are the sweep
cache's, shared with notebook 09; the router's runs take seconds each in the compiled loop, the
bounds come from the cache (``bound_every_setting``) or take 15–30 s each. Run from the
repository root: ``.venv/bin/python docs/evidence/plain.py``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from carbonrouter_lib import horizon_eval as he
from carbonrouter_lib import sweep
from carbonrouter_lib.outputs import save_table

HERE = Path(__file__).resolve().parent
#: without the slot price, and as the router was then: no fallback exit, no option to move
PARAMS = {"slot_price": False, **he.FORMER, **he.BEFORE_PAIR}



def main() -> None:
    settings, with_variants = he.grid_settings("full")
    runs = he.grid(settings, with_variants, target_params=PARAMS,
                   variants=he.VARIANTS_BEFORE_PAIR)
    runs = runs[runs["policy"] != "w/o slot price"].reset_index(drop=True)
    results = sweep.run_sweep(list(runs["spec"]))
    t = he.table(results, runs, n_boot=1000)
    save_table(t, "horizon_plain_full_table", HERE, parquet=False)
    save_table(he.verdicts(t), "horizon_plain_full_verdicts", HERE, parquet=False)
    save_table(he.variants_table(t, he.VARIANTS_BEFORE_PAIR), "horizon_plain_full_variants", HERE,
               parquet=False)
    save_table(he.bound_shares(results, runs), "horizon_plain_full_bound", HERE, parquet=False)

    scale_runs = he.scale_grid("full")
    target = scale_runs["policy"] == he.TARGET
    specs = [dataclasses.replace(s, policy_params=PARAMS) if is_target else s
             for s, is_target in zip(scale_runs["spec"], target, strict=True)]
    scale_runs = scale_runs.assign(spec=specs, key=[s.key() for s in specs])
    scale_results = sweep.run_sweep(specs)
    ts = he.scale_table(scale_results, scale_runs, n_boot=1000)
    save_table(ts, "horizon_plain_scale_table", HERE, parquet=False)
    vs = he.verdicts(ts, by=he.SCALE_BY)
    save_table(vs, "horizon_plain_scale_verdicts", HERE, parquet=False)
    print(he.verdicts(t)["lowest_co2"].value_counts().to_string())
    print(vs["lowest_co2"].value_counts().to_string())


if __name__ == "__main__":
    main()
