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

import pandas as pd

from carbonrouter_lib import horizon_eval as he
from carbonrouter_lib import sweep
from carbonrouter_lib.outputs import atomic_path

HERE = Path(__file__).resolve().parent
#: without the slot price, and as the router was then: no fallback exit, no option to move
PARAMS = {"slot_price": False, **he.FORMER}


def _save(frame: pd.DataFrame, name: str) -> None:
    with atomic_path(HERE / f"{name}.csv") as tmp:
        frame.to_csv(tmp, index=False)


def main() -> None:
    settings, with_variants = he.grid_settings("full")
    runs = he.grid(settings, with_variants, target_params=PARAMS)
    runs = runs[runs["policy"] != "w/o slot price"].reset_index(drop=True)
    results = sweep.run_sweep(list(runs["spec"]))
    t = he.table(results, runs, n_boot=1000)
    _save(t, "horizon_plain_full_table")
    _save(he.verdicts(t), "horizon_plain_full_verdicts")
    _save(he.variants_table(t), "horizon_plain_full_variants")
    _save(he.bound_shares(results, runs), "horizon_plain_full_bound")

    scale_runs = he.scale_grid("full")
    target = scale_runs["policy"] == he.TARGET
    specs = [dataclasses.replace(s, policy_params=PARAMS) if is_target else s
             for s, is_target in zip(scale_runs["spec"], target, strict=True)]
    scale_runs = scale_runs.assign(spec=specs, key=[s.key() for s in specs])
    scale_results = sweep.run_sweep(specs)
    ts = he.scale_table(scale_results, scale_runs, n_boot=1000)
    _save(ts, "horizon_plain_scale_table")
    vs = he.verdicts(ts, by=he.SCALE_BY)
    _save(vs, "horizon_plain_scale_verdicts")
    print(he.verdicts(t)["lowest_co2"].value_counts().to_string())
    print(vs["lowest_co2"].value_counts().to_string())


if __name__ == "__main__":
    main()
