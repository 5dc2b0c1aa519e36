"""How much of the clairvoyant bound's possible saving the horizon router could capture if every
cache it stays on or returns to had survived, on notebook 09's full grid or fresh weeks:
``horizon_recompute_ceiling_{grid}.csv``, one row per setting: the router's CO2, the carbon of the
history it recomputed (:func:`carbonrouter_lib.horizon_eval.by_turn_kind`'s ``recompute_kg``) on
the turns that stayed, returned to an older cache and moved to a deployment the session had not
used, its share of the possible saving over Session-Affinity, and that share with the stays' and
returns' recomputation taken off (``share_caches_kept``) and with all of it
(``share_nothing_recomputed``).

Why. The issue's fourth target, ≥ 70% of the bound's possible saving at the default scale, is
met in 3 of the full grid's 32 settings, and the levers tried last (the return exit's rules,
docs/model.md §11.4a) act on which caches survive. This table says how far that kind of lever can
go on the router's own routing. A lever that only keeps caches alive removes at most the
recomputation of the turns that stay or return: a cache kept intact there would have held the
whole history (for a return, more than the bound's relaxation 5 credits). The moves' recomputation
comes with moving: the session has no cache there. So ``share_caches_kept`` is an upper bound for
such levers with the routing unchanged. A lever that also changes the routing is not bounded by it.
``share_nothing_recomputed`` is a looser bound still: as if even a move found the history cached.

Nothing here was tuned; the router is the committed default, its CO2 and the bound are the
committed ``horizon_{grid}_bound.csv`` values (checked below). About 10 minutes a grid on two
cores. Run from the repository root: ``.venv/bin/python docs/evidence/recompute_ceiling.py
full|fresh``. Those tables are the router before the pair became the default (pinned,
:data:`carbonrouter_lib.horizon_eval.BEFORE_PAIR`); ``pair-full|pair-fresh``
(``horizon_recompute_ceiling_pair_{grid}.csv``) are the same of the default router, the pair,
its SLO CarbonRouter's P95 TTFT in the setting and its CO2 and the bound the committed
``horizon_kv_price_pair_{grid}_bound.csv`` values.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from carbonrouter_lib import horizon_eval as he
from carbonrouter_lib import sweep
from carbonrouter_lib.outputs import save_table

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from returns import over_settings  # noqa: E402  (the per-setting loop)


def one(job: tuple[dict[str, str], str],
        slo: dict[tuple[str, ...], float] | None = None) -> dict:
    """:func:`horizon_eval.caching_ceiling` of the router in setting ``job[0]`` of grid ``job[1]``
    (Session-Affinity's CO2 and the bound the committed ``horizon_{grid}_bound.csv``'s); with
    ``slo`` (:func:`gap.pair_slos`) of the default router, the pair, given its SLO (CO2 and bound
    :func:`committed`'s with ``pair``)."""
    from gap import router_params

    st, grid = job
    wcfg, scfg = he.setting(st)
    kinds = he.by_turn_kind(sweep.run_one(sweep.RunSpec.make(wcfg, scfg, he.TARGET,
                                                             router_params(st, slo))))
    b = committed(grid, slo is not None).loc[tuple(st[c] for c in he.SETTING)]
    return st | {"session_affinity_kg": b["session_affinity_kg"], "bound_kg": b["bound_kg"]} | (
        he.caching_ceiling(kinds, b["session_affinity_kg"], b["bound_kg"]))


def committed(grid: str, pair: bool = False) -> pd.DataFrame:
    """The router's rows of the committed ``horizon_{grid}_bound.csv`` (with ``pair``:
    ``horizon_kv_price_pair_{grid}_bound.csv``), by setting."""
    b = pd.read_csv(HERE / (f"horizon_kv_price_pair_{grid}_bound.csv" if pair
                            else f"horizon_{grid}_bound.csv"))
    return b[b["policy"] == he.TARGET].set_index(list(he.SETTING))


COLUMNS = [*he.SETTING, "co2_kg", "recompute_stay_kg", "recompute_return_kg", "recompute_move_kg",
           "session_affinity_kg", "bound_kg", "share", "share_caches_kept",
           "share_nothing_recomputed", "reaches_70"]


def main(grid: str) -> None:
    import functools

    pair = grid.startswith("pair-")
    grid = grid.removeprefix("pair-")
    from gap import pair_slos

    rows = over_settings(functools.partial(one, slo=pair_slos(grid) if pair else None), grid,
                         "recompute_ceiling.py", with_grid=True)
    t = pd.DataFrame(rows)
    t["reaches_70"] = t["share_caches_kept"] >= 0.7
    t = t[COLUMNS]
    mine = t.set_index(list(he.SETTING))
    drift = np.abs(mine["co2_kg"] / committed(grid, pair).loc[mine.index, "co2_kg"] - 1).max()
    print(f"against the committed CO2, largest relative difference: {drift:.2e}")
    save_table(t, f"horizon_recompute_ceiling_{'pair_' if pair else ''}{grid}", HERE,
               parquet=False)
    print(t.round(3).to_string())


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "full")
