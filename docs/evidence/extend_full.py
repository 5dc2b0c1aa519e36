"""Extend the committed full scale study (``scale_full*.csv``) with the runs of
``scale.GRIDS["full"]`` it does not hold yet, and recompute its convergence, default and claims.

The study's earlier runs were replayed by the Python loop, the added ones (ShareGPT to P = 3,060)
by the compiled loop, whose records are bit-identical (tests/test_kernel.py), so the rows join
into one table; notebook 04b with ``grid="full"`` recomputes all of them at once. Run from the
repository root: ``.venv/bin/python docs/evidence/extend_full.py [dataset/region_set ...]``
(default: every block of the grid; ``sharegpt/paper`` for one).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from carbonrouter_lib import prepared, scale

HERE = Path(__file__).resolve().parent
TARGET = "carbonrouter-no-gate"  # notebook 04b's
N_BOOT, SEED = 1000, 0  # notebook 04b's defaults


def main(only: list[str]) -> None:
    old = pd.read_csv(HERE / "scale_full.csv")
    workloads = {ds: prepared.WorkloadConfig(dataset=ds, seed=SEED)
                 for ds in ("sharegpt", "mooncake")}
    runs = scale.grid_specs("full", workloads)
    have = set(old[["dataset", "region_set", "memory", "copies"]].itertuples(index=False,
                                                                           name=None))
    todo = runs[[(d, r, m, float(c)) not in have for d, r, m, c in
                 runs[["dataset", "region_set", "memory", "copies"]].itertuples(index=False)]]
    if only:
        todo = todo[(todo["dataset"] + "/" + todo["region_set"]).isin(only)]
    print(f"{len(todo)} runs to add:")
    print(todo.groupby(["dataset", "region_set", "memory"])["copies"].agg(
        lambda c: sorted(set(c))).to_string(), flush=True)
    if todo.empty:
        return
    results = scale.run_grid(todo, workloads, n_workers=1)
    new = scale.scale_table(results, todo, target=TARGET, n_boot=N_BOOT, seed=SEED)
    table = in_study_order(pd.concat([old, new[old.columns]], ignore_index=True), old)
    mooncake_peak = int(pd.read_csv(HERE / "scale_full_default.csv")
                        .set_index("dataset").loc["default", "mooncake_peak"])
    _write(table, "scale_full.csv")
    _write(scale.convergence(table), "scale_full_convergence.csv")
    _write(scale.choose_default(table, datasets=list(workloads), mooncake_peak=mooncake_peak),
           "scale_full_default.csv")
    _write(scale.claims(table, target=TARGET), "scale_full_claims.csv")


def in_study_order(table: pd.DataFrame, reference: pd.DataFrame) -> pd.DataFrame:
    """One row per run, in the reference table's order: (dataset, region set) as they first
    appear (new ones after), then copies, then the memory rules and the policies in their
    order — so an extended table differs from the committed one by its added rows only."""
    keys = ["dataset", "region_set", "memory", "copies", "policy"]
    table = table.drop_duplicates(keys, keep="last")

    def rank(cols: list[str]) -> dict:
        seen = dict.fromkeys(reference[cols].itertuples(index=False, name=None))
        seen |= dict.fromkeys(table[cols].itertuples(index=False, name=None))
        return {g: i for i, g in enumerate(seen)}

    group, memory = rank(["dataset", "region_set"]), rank(["memory"])
    policy = {p: i for i, p in enumerate(scale.SCALE_POLICIES)}
    order = pd.DataFrame({
        "group": [group[g] for g in table[keys[:2]].itertuples(index=False, name=None)],
        "copies": table["copies"].to_numpy(),
        "memory": [memory[(m,)] for m in table["memory"]],
        "policy": table["policy"].map(policy).to_numpy()}, index=table.index)
    return table.loc[order.sort_values(["group", "copies", "memory", "policy"],
                                       kind="stable").index].reset_index(drop=True)


def _write(frame: pd.DataFrame, name: str) -> None:
    tmp = HERE / (name + ".tmp")
    frame.to_csv(tmp, index=False)
    tmp.replace(HERE / name)
    print("wrote", HERE / name, len(frame), "rows", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
