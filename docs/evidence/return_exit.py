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

The rule has had three forms, each run on both grids: the return weighted by p^(j+1), p the
pool's chance a cache the session *stayed* on survives a think time (commit c786c95, with nothing
looked at before); by (1 − φ)·p^(j+1), φ the chance a new cache in the pool evicts another
(commit 83a30e1, designed after the first rule's full grid); and, as it stands, by
p_left^(j+1), p_left learned online from what sessions find of the caches they *left*
(``kernel.observe_left``), designed after the second rule's full grid and tried before on
``tests/test_kernel.py``'s random workloads only. Each form's tables are its commit's; the fresh
weeks are the held-out test of all three.

``kinds`` (``horizon_return_exit_kinds.csv``): in four winter settings, the variant's and the
default's queries by what each did (stay, move, return) with the backend's evictions, where the
variant's carbon goes (about 10 minutes on two cores).

The bound: its values in the committed ``horizon_full_bound.csv`` / ``horizon_fresh_bound.csv``
(the bound does not depend on the router), so no bound is recomputed here. Without the oracle
gate's reference runs. About 20 minutes a grid on two cores. Run from the repository root:
``.venv/bin/python docs/evidence/return_exit.py full|fresh|kinds``.
"""

from __future__ import annotations

import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

from carbonrouter_lib import horizon_eval as he
from carbonrouter_lib import sweep
from carbonrouter_lib.outputs import save_table

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


#: The settings of :func:`kinds` (winter, the paper's regions): the tuned one, where the variant
#: loses most, and the Mooncake trace with ample memory, where it gains most, with their
#: neighbours in memory and workload.
KIND_SETTINGS = [{"dataset": d, "region_set": "paper", "memory": m, "season": "winter"}
                 for d in ("sharegpt", "mooncake") for m in ("paper", "paper x10")]


def kinds_one(job: tuple[dict, str]) -> pd.DataFrame:
    """One replay of :func:`kinds`: the router of ``job``'s label in ``job``'s setting, its
    queries by kind (:func:`horizon_eval.by_turn_kind`) with the backend's counters of the run."""
    st, label = job
    runs = runs_with_return_exit([st])
    spec = runs.loc[runs["policy"] == label, "spec"].iloc[0]
    res = sweep.replay(spec)
    counts = {c: int(res.counters[c]) for c in ("evicted_tokens", "evicted_caches",
                                                 "expired_tokens", "expired_caches")}
    return he.by_turn_kind(res.records).assign(**st, policy=label, **counts)


def kinds() -> pd.DataFrame:
    """``horizon_return_exit_kinds.csv``: in :data:`KIND_SETTINGS`, the return exit's and the
    default's queries by what each did (stay, move to a deployment the session had not used,
    return to one it used before the previous turn; :func:`horizon_eval.turn_kinds`), the share
    of their history found cached and their CO2, with the backend's evictions and expiries of
    the run: where the return exit's carbon goes."""
    jobs = [(st, p) for st in KIND_SETTINGS for p in (FALLBACK, he.TARGET)]
    with ProcessPoolExecutor(2) as pool:
        parts = list(tqdm(pool.map(kinds_one, jobs), total=len(jobs), desc="replays"))
    t = pd.concat(parts, ignore_index=True)
    t = t[[*he.SETTING, "policy", "kind", "queries", "history_found", "co2_kg", "evicted_tokens",
           "evicted_caches", "expired_tokens", "expired_caches"]]
    save_table(t, "horizon_return_exit_kinds", HERE, parquet=False)
    print(t.round(3).to_string())
    return t


def main(grid: str) -> None:
    if grid == "kinds":
        kinds()
        return
    if grid not in ("full", "fresh"):
        raise SystemExit(f"return_exit.py: grid must be 'full', 'fresh' or 'kinds', got {grid!r}")
    runs = runs_with_return_exit(he.grid_settings(grid)[0])
    results = sweep.run_sweep(list(runs["spec"]))
    write_variant_grid(he.table(results, runs), "return_exit", grid, other=FALLBACK,
                       designed_on=[])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "full")
