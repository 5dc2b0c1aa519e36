"""What the corrected return credit of the clairvoyant bound changes in notebook 09's full grid or
fresh weeks: ``horizon_return_credit_{grid}.csv``.

Why. The bound's relaxation 5 (``carbonrouter_lib.bound``) charges a turn k that returns to a
deployment the session left at turn k − 2 or before with the most that deployment's cache can
give it. Until 2026-12-06 it took that to be turn k − 1's history N_hist(k − 1), "the context up
to turn k − 2". The replay reuses min(cached, N_hist(k)), and a cache holds the post-turn context
of the last turn served there; where contexts grow turn by turn (ShareGPT) the two agree, but a
Mooncake turn may keep less of the previous context than that turn's whole context (its history
is what the previous context shares with its input). Then N_hist(k − 1) can be below what a
return reuses (a bound above the replay: ``tests/test_bound.py``, hand-built, and the random
traces, which now have such turns, both fail with the former credit) or above N_hist(k) (a turn
charged a negative recomputation). The credit is now min(the longest post-turn context of turns
0 … k − 2, N_hist(k)).

The committed tables (``horizon_{grid}_bound.csv`` and those computed from the same bounds) hold
the former bound. This table gives, per setting, the committed bound and the bound now (kg), the
share of the later turns (k ≥ 2, where a return can happen) whose credit changed (lower or
higher, any model), and the horizon router's share of the possible saving over Session-Affinity
with each (its CO2 and Session-Affinity's are the committed table's: the replays do not read the
bound). The plain bound does not read the KV-memory rule (relaxation 1), so each (dataset,
regions, window) is computed once. Two to four minutes a grid on two cores. Run from the
repository root: ``.venv/bin/python docs/evidence/return_credit.py full|fresh``.
"""

from __future__ import annotations

import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from carbonrouter_lib import bound, prepared
from carbonrouter_lib import horizon_eval as he
from carbonrouter_lib.outputs import save_table

HERE = Path(__file__).resolve().parent


def credit_changes(table: pd.DataFrame) -> tuple[int, int, int]:
    """(later turns, those whose return credit fell, those whose credit rose) in a prepared
    workload: the former credit N_hist(k − 1) against :func:`carbonrouter_lib.bound.
    return_credit`, per model, a row counted where any model's changed. Later turns are turns
    k ≥ 2."""
    new = prepared.model_matrix(table, "new_tokens").astype(np.float64)
    hist = prepared.model_matrix(table, "history_tokens").astype(np.float64)
    out = prepared.model_matrix(table, "output_tokens").astype(np.float64)
    turn = table["turn"].to_numpy(np.int64)
    later = turn >= 2
    former = np.roll(hist, 1, axis=0)[later]
    now = bound.return_credit(new, hist, out, turn)[later]
    return (int(later.sum()), int((now < former).any(axis=1).sum()),
            int((now > former).any(axis=1).sum()))


def one(st: dict[str, str]) -> dict:
    """The bound now and the credit changes of setting ``st``."""
    wcfg, scfg = he.setting(st)
    later, fell, rose = credit_changes(prepared.prepare_workload(wcfg))
    return {**st, "bound_kg": bound.ensure_bound(wcfg, scfg)["carbon_g"].sum() / 1e3,
            "later_turns": later, "credit_fell": fell / max(later, 1),
            "credit_rose": rose / max(later, 1)}


def main(grid: str) -> None:
    if grid not in ("full", "fresh"):
        raise SystemExit(f"return_credit.py: grid must be 'full' or 'fresh', got {grid!r}")
    settings = he.grid_settings(grid)[0]
    first = {}
    for st in settings:  # one bound per (dataset, regions, window): the first memory rule's
        first.setdefault((st["dataset"], st["region_set"], st["season"]), st)
    with ProcessPoolExecutor(2) as pool:
        parts = list(tqdm(pool.map(one, first.values()), total=len(first), desc="bounds"))
    now = pd.DataFrame(parts).drop(columns="memory")
    committed = pd.read_csv(HERE / f"horizon_{grid}_bound.csv")
    committed = committed[committed["policy"] == he.TARGET]
    t = committed[[*he.SETTING, "co2_kg", "session_affinity_kg", "bound_kg",
                   "share_of_possible_saving"]].rename(
        columns={"bound_kg": "bound_committed_kg", "share_of_possible_saving": "share_committed"})
    t = t.merge(now, on=["dataset", "region_set", "season"], how="left", validate="many_to_one")
    if t["bound_kg"].isna().any():
        raise RuntimeError(f"return_credit.py: no bound for {t[t['bound_kg'].isna()]}")
    t["bound_change"] = t["bound_kg"] / t["bound_committed_kg"] - 1
    t["share"] = [bound.share_of_possible_saving(sa, co2, b) for sa, co2, b in
                  zip(t["session_affinity_kg"], t["co2_kg"], t["bound_kg"], strict=True)]
    t["share_change_points"] = 100 * (t["share"] - t["share_committed"])
    save_table(t, f"horizon_return_credit_{grid}", HERE, parquet=False)
    print(t.drop(columns=["co2_kg", "session_affinity_kg"]).to_string(index=False))
    print(t.groupby("dataset")[["bound_change", "share_change_points", "credit_fell",
                                "credit_rose"]].agg(["min", "max"]).to_string())


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "full")
