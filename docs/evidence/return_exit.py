"""The horizon router with the *return exit* (``exit="return"``) against every online policy and
against the router's default exit (``exit="fallback"``), on notebook 09's full grid and fresh
weeks: ``horizon_return_exit_{grid}_table.csv`` (:func:`carbonrouter_lib.horizon_eval.table`:
every policy's CO2 and P95 TTFT, and the variant's saving over it, paired 95% CIs over
conversations), ``horizon_return_exit_{grid}_verdicts.csv``
(:func:`~carbonrouter_lib.horizon_eval.verdicts` of the variant) and
``horizon_return_exit_{grid}_bound.csv`` (each policy's share of the clairvoyant bound's possible
saving).

Why. The fallback exit prices a fall from a small model back to the 70B as recomputing the 70B's
history, even where the session still holds the 70B cache it left when it hopped: that makes a hop
look dearer than it is where caches survive (the fallback exit cost the router 1.8% on the Mooncake
trace with ample memory, docs/model.md §11.4a), and the bound's paths return to such caches in a
quarter of their later turns on ShareGPT (§11.4c). The return exit prices the fall as the cheaper
of recomputing and returning to the cache, the return weighted by the chance the cache survives
the think times until then (``policies/horizon.py``, "The return exit").

What was looked at before these tables were made: nothing but the engines' agreement on small
random workloads (``tests/test_kernel.py``). The rule was written from the two observations above
(docs/model.md), it adds no parameter, and every setting of both grids was first seen in these
tables: all are held-out for it.

The bound: its values in the committed ``horizon_full_bound.csv`` / ``horizon_fresh_bound.csv``
(the bound does not depend on the router), so no bound is recomputed here. Without the oracle
gate's reference runs. About 20 minutes a grid on two cores. Run from the repository root:
``.venv/bin/python docs/evidence/return_exit.py full|fresh``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from carbonrouter_lib import horizon_eval as he
from carbonrouter_lib import sweep

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from slot_credit import variant_runs, write_variant_grid  # noqa: E402  (variant grids)

#: The label of the router with its default exit in these tables.
FALLBACK = "carbonrouter-horizon (fallback exit)"
#: The variant, the target of these tables.
RETURN_PARAMS = {"exit": "return"}


def runs_with_return_exit(settings) -> pd.DataFrame:
    """:func:`horizon_eval.grid` of ``settings`` (no reference runs) with the variant
    (:data:`RETURN_PARAMS`) as the target and the default router as :data:`FALLBACK`."""
    return variant_runs(settings, RETURN_PARAMS, FALLBACK)


def main(grid: str) -> None:
    if grid not in ("full", "fresh"):
        raise SystemExit(f"return_exit.py: grid must be 'full' or 'fresh', got {grid!r}")
    runs = runs_with_return_exit(he.grid_settings(grid)[0])
    results = sweep.run_sweep(list(runs["spec"]))
    write_variant_grid(he.table(results, runs), "return_exit", grid, other=FALLBACK,
                       designed_on=[])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "full")
