"""How much of the clairvoyant bound's possible saving is information the horizon router lacks:
the router told the future intensities (``forecast="clairvoyant"``), told each session's number
of turns (``session_length="told"``), told both, told the models its future turns will need
(``future_models="told"``), and told all three, against the router itself, on notebook 09's
full grid or fresh weeks: ``horizon_told_{grid}_table.csv`` (:func:`carbonrouter_lib.horizon_eval.
table`: each run's Table-1 quantities, and the router's saving over each told reference with its
paired 95% CI over conversations: negative where being told saves carbon) and
``horizon_told_{grid}_bound.csv`` (each one's share of the bound's possible saving over
Session-Affinity); with ``full`` also ``horizon_told_length_by_prompt.csv``: per dataset, the
conversations' number of turns by octile of their first prompt (could the router tell the length
from what it sees at the first turn?).

Why. The issue's fourth target, ≥ 70% of the bound's possible saving, is met in 3 of the full
grid's 32 settings. The bound knows the future: the intensities to come, which sessions return
and for how many turns, which models their turns will need, the think times, and every other
session. The told references measure the first three. They are not online policies (they read
the future) and the router's parameters are untouched; nothing here was tuned. What is left
between "told all three" and the bound is what no reference is told (which caches survive the
think times, the other sessions, the bound's relaxations) and what the router's one-step rule
cannot do with what it is told.

The told intensities are the signal's values at the times the router prices, d + j·τ (τ the mean
gap between turns): the forecast without its error, not the future turns' actual dispatch times.
The told session length replaces the learned survival S_k(j) by 1{k + j < K} in the future term
and in the slot price's remaining time T_k (the slot price's D̄ stays the training sessions').
The told models replace, at each future turn the session has, q_m by whether model m will be
quality-feasible there and the exit by the smallest model that will be (past the session's last
turn the learned values stay).

The bound: its values in the committed ``horizon_{grid}_bound.csv`` (it does not depend on the
router). The router's own runs here give the committed ``horizon_{grid}_table.csv`` CO2 to the last
digit (checked below). About 25 minutes a grid on two cores. Run from the repository root:
``.venv/bin/python docs/evidence/told.py full|fresh``.

``pair-full`` / ``pair-fresh`` (``horizon_told_pair_{grid}_{table,bound}.csv``): the same of the
default router (the pair, docs/model.md §11.4a) in notebook 09's two phases, the router and every
told reference given CarbonRouter's P95 TTFT as its SLO; its runs give the committed
``horizon_kv_price_pair_{grid}_table.csv`` CO2 to the last digit (checked below). No setting is
held-out for the pair (:data:`carbonrouter_lib.horizon_eval.DESIGNED_ON_PAIR`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from carbonrouter_lib import horizon_eval as he
from carbonrouter_lib import prepared, sweep
from carbonrouter_lib.outputs import save_table

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from slot_credit import bound_shares  # noqa: E402  (the variant grids' shares)


def runs(settings) -> pd.DataFrame:
    """Per setting: Session-Affinity (the shares' reference), the router and each
    :data:`carbonrouter_lib.horizon_eval.TOLD` reference (:func:`horizon_eval.grid`'s runs)."""
    grid = he.grid(settings, variants_in=settings, variants=he.TOLD, noise=(), reference=(),
                   target_params=he.BEFORE_PAIR)
    return grid[grid["policy"].isin(["session-affinity", he.TARGET, *he.TOLD])].reset_index(
        drop=True)


def first_phase_slos(first: pd.DataFrame, by=he.SETTING) -> dict[tuple, float]:
    """Notebook 09's first phase: of the runs ``first`` (:func:`carbonrouter_lib.horizon_eval.
    grid` or ``scale_grid``), CarbonRouter's (:func:`~carbonrouter_lib.horizon_eval.slo_runs`)
    replayed, its P95 TTFT per setting (the columns ``by``) the routers' SLO
    (:func:`~carbonrouter_lib.horizon_eval.ttft_slos`)."""
    return he.ttft_slos(sweep.run_sweep(list(he.slo_runs(first)["spec"])), first, by=by)


def pair_runs(settings, variants=he.TOLD, online=("session-affinity",)) -> pd.DataFrame:
    """:func:`runs` of the pair with J = 16 (the default router from 2026-12-06 to 2026-12-07,
    :data:`carbonrouter_lib.horizon_eval.PAIR_J16`, pinned; docs/model.md §11.4a) in notebook
    09's two phases: CarbonRouter first (:func:`carbonrouter_lib.horizon_eval.slo_runs`,
    replayed here), its P95 TTFT per setting the SLO of the router and of every told reference
    (:func:`carbonrouter_lib.horizon_eval.ttft_slos`). ``variants`` (label → HorizonRouter
    parameters over the pair's; default :data:`carbonrouter_lib.horizon_eval.TOLD`) and the
    online policies ``online`` are kept beside the router."""
    slo = first_phase_slos(he.grid(settings, noise=(), reference=()))
    grid = he.grid(settings, variants_in=settings, variants=variants, noise=(), reference=(),
                   target_params=he.PAIR_J16, ttft_slo=slo)
    return grid[grid["policy"].isin([*online, he.TARGET, *variants])].reset_index(drop=True)


def shares(t: pd.DataFrame, bounds: pd.DataFrame,
           designed_on=he.DESIGNED_ON) -> pd.DataFrame:
    """Per setting and run of table ``t``: CO2 (kg), the committed bound (kg) and the share of
    its possible saving over Session-Affinity (:func:`slot_credit.bound_shares`)."""
    return bound_shares(t, bounds, policies=(he.TARGET, *he.TOLD), designed_on=designed_on)


def save_told(t: pd.DataFrame, name: str, bound_csv: str, designed_on) -> None:
    """Save the told references' table ``t`` and their shares of the committed bound
    (``bound_csv`` here) as ``<name>_{table,bound}.csv`` here, and print the shares."""
    s = shares(t, pd.read_csv(HERE / bound_csv), designed_on)
    save_table(t, f"{name}_table", HERE, parquet=False)
    save_table(s, f"{name}_bound", HERE, parquet=False)
    wide = s.pivot_table(index=list(he.SETTING), columns="policy", sort=False,
                         values="share_of_possible_saving")[[he.TARGET, *he.TOLD]]
    print(wide.round(3).to_string())
    print(wide.groupby(level=["dataset", "memory"]).median().round(3).to_string())
    print("≥ 0.70:", (wide >= 0.70).sum().to_dict())


def length_by_prompt(bins: int = 8) -> pd.DataFrame:
    """Per dataset (the tuned setting's workload, each conversation once): the conversations'
    mean number of turns and share of one-turn conversations per quantile bin (``bins``) of their
    first prompt's new tokens (Llama-3.1-70B's tokenizer)."""
    rows = []
    for dataset in ("sharegpt", "mooncake"):
        table = prepared.prepare_workload(he.setting(dict(he.TUNED, dataset=dataset))[0])
        first = table[table["turn"] == 0].assign(
            conversation=prepared.conversation_codes(table)[table["turn"].to_numpy() == 0])
        first = first.drop_duplicates("conversation")
        tokens = first["new_tokens_Llama-3.1-70B"]
        octile = pd.qcut(tokens.rank(method="first"), bins, labels=False)
        for b, g in first.groupby(octile):
            rows.append({"dataset": dataset, "bin": int(b), "bins": bins,
                         "first_prompt_tokens_min": int(tokens[g.index].min()),
                         "first_prompt_tokens_max": int(tokens[g.index].max()),
                         "conversations": len(g), "mean_turns": float(g["n_turns"].mean()),
                         "share_one_turn": float((g["n_turns"] == 1).mean())})
        rows.append({"dataset": dataset, "bin": -1, "bins": bins,
                     "first_prompt_tokens_min": int(tokens.min()),
                     "first_prompt_tokens_max": int(tokens.max()), "conversations": len(first),
                     "mean_turns": float(first["n_turns"].mean()),
                     "share_one_turn": float((first["n_turns"] == 1).mean())})
    return pd.DataFrame(rows)


def main(grid: str) -> None:
    pair = grid.startswith("pair-")
    grid = grid.removeprefix("pair-")
    if grid not in ("full", "fresh"):
        raise SystemExit(f"told.py: grid must be 'full', 'fresh', 'pair-full' or 'pair-fresh', "
                         f"got {grid!r}")
    settings = he.grid_settings(grid)[0]
    r = pair_runs(settings) if pair else runs(settings)
    designed_on = he.DESIGNED_ON_PAIR if pair else he.DESIGNED_ON
    t = he.table(sweep.run_sweep(list(r["spec"])), r, designed_on=designed_on)
    committed = pd.read_csv(HERE / (f"horizon_kv_price_pair_{grid}_table.csv" if pair
                                    else f"horizon_{grid}_table.csv"))
    mine = t[t["policy"] == he.TARGET].merge(
        committed[committed["policy"] == he.TARGET], on=list(he.SETTING), suffixes=("", "_c"))
    drift = float(np.max(np.abs(mine["total_co2_kg"] / mine["total_co2_kg_c"] - 1)))
    print(f"the router's CO2 against the committed table: largest relative difference {drift:.2e}")
    save_told(t, f"horizon_told_pair_{grid}" if pair else f"horizon_told_{grid}",
              f"horizon_{grid}_bound.csv", designed_on)
    if grid == "full" and not pair:
        by = length_by_prompt()
        save_table(by, "horizon_told_length_by_prompt", HERE, parquet=False)
        print(by.round(3).to_string())


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "full")
