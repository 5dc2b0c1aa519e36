"""How much of a session's slot holding the capacity-priced bound charges:
``horizon_held_intervals.csv``.

:func:`carbonrouter_lib.bound.capacity_priced_bound` charges a turn k's slot over I_k = [hi_k,
lo_{k+1}), from the latest dispatch any policy can give turn k to the earliest of turn k + 1. A
policy holds the slot from its dispatch of k to its dispatch of k + 1, which contains I_k. But
hi_k − lo_k adds up the longest possible service of every earlier turn (relaxation 3), so I_k
shrinks with the turn index and is empty where that sum exceeds the think time. The priced
bound's slot constraint is then looser than the replay's by the holding it does not charge. Per
setting (the tuned one, the same with ample memory, the Mooncake trace in winter): over the
turns that are not a session's last and that the router served with the next turn served too,
the seconds the bound charges (Σ |I_k|), the seconds the router's replay held (Σ d_{k+1} − d_k),
their ratio, the share of those turns with an empty I_k, and the same by turn index (k = 0,
1–2, 3–6, 7+, 0-based).

Nothing here was tuned; the router is the committed default (the sweep's cache). About two
minutes. Run from the repository root: ``.venv/bin/python docs/evidence/held_intervals.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from carbonrouter_lib import bound, prepared, sweep
from carbonrouter_lib import horizon_eval as he
from carbonrouter_lib.outputs import save_table

HERE = Path(__file__).resolve().parent
SETTINGS = (dict(he.TUNED), {**he.TUNED, "memory": "paper x10"},
            {**he.TUNED, "dataset": "mooncake"})
TURNS = ((0, 0, "0"), (1, 2, "1–2"), (3, 6, "3–6"), (7, 10**9, "7+"))


def one(st: dict[str, str]) -> list[dict]:
    """The charged and the held slot seconds in setting ``st``, all turns and by turn index."""
    wcfg, scfg = he.setting(st)
    table = prepared.prepare_workload(wcfg)
    x = bound._bound_inputs(table, scfg, scfg.signal())
    n = len(table)
    t0, t1 = np.empty(n), np.empty(n)
    bound._held_intervals(x["starts"], x["ends"], x["arrival"], x["think"], x["max_service"],
                          t0, t1)
    rec = sweep.run_one(sweep.RunSpec.make(wcfg, scfg, he.TARGET))
    rec = rec.set_index(["session", "turn"]).loc[
        list(zip(table["session"], table["turn"], strict=True))]
    d = rec["dispatch_s"].to_numpy()
    session = table["session"].to_numpy()
    turn = table["turn"].to_numpy()
    nxt = np.r_[session[1:] == session[:-1], False]  # the session has a next turn
    d_next = np.r_[d[1:], np.nan]
    ok = nxt & np.isfinite(d) & np.isfinite(d_next)  # both served by the router
    charged = np.maximum(t1 - t0, 0.0)
    held = d_next - d
    rows = []
    for lo, hi, label in ((0, 10**9, "all"), *TURNS):
        m = ok & (turn >= lo) & (turn <= hi)
        rows.append({**st, "turns": label, "queries": int(m.sum()),
                     "charged_s": float(charged[m].sum()), "held_s": float(held[m].sum()),
                     "charged_share": float(charged[m].sum() / held[m].sum()),
                     "empty_share": float((charged[m] <= 0).mean())})
    return rows


def main() -> None:
    t = pd.DataFrame([r for st in SETTINGS for r in one(st)])
    save_table(t, "horizon_held_intervals", HERE, parquet=False)
    print(t.round(3).to_string(index=False))


if __name__ == "__main__":
    main()
