"""How much of a session's slot holding the capacity-priced bound charges:
``horizon_held_intervals.csv``.

A policy holds turn k's slot from its dispatch of k to its dispatch of k + 1.
:func:`carbonrouter_lib.bound.capacity_priced_bound` charges, per bucket of time, the least
holding any policy can have there (``bound._holding_weights``: d_k anywhere in [lo_k, hi_k],
d_{k+1} at least the next think time plus turn k's shortest service later). Until 2026-12-06 it
charged only the part common to every holding, I_k = [hi_k, lo_{k+1}); hi_k − lo_k adds up the
longest possible service of every earlier turn (relaxation 3), so I_k shrank with the turn index
and was empty where that sum exceeded the think time. Per setting (the tuned one, the same with
ample memory, the Mooncake trace in winter): over the turns that are not a session's last and
that the router served with the next turn served too: the seconds the router's replay held
(Σ d_{k+1} − d_k); the seconds charged now with 60-minute buckets (the default); the former
charge (Σ |I_k|); each, and the charge with 30- and 5-minute buckets, as a share of the held
seconds; the share of those turns with an empty I_k; the same by turn index (k = 0, 1–2, 3–6,
7+, 0-based).

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
    x = bound._bound_inputs(table, scfg, scfg.signal(), shortest=True)
    lo, hi = x["lo"], x["hi"]
    charged = {label: np.asarray(bound._holding(x, width)[0].sum(axis=1)).ravel()
               for label, width in (("charged", 3600.0), ("charged_30min", 1800.0),
                                    ("charged_5min", 300.0))}
    rec = sweep.run_one(sweep.RunSpec.make(wcfg, scfg, he.TARGET, he.BEFORE_PAIR))
    rec = rec.set_index(["session", "turn"]).loc[
        list(zip(table["session"], table["turn"], strict=True))]
    d = rec["dispatch_s"].to_numpy()
    session = table["session"].to_numpy()
    turn = table["turn"].to_numpy()
    nxt = np.r_[session[1:] == session[:-1], False]  # the session has a next turn
    d_next = np.r_[d[1:], np.nan]
    ok = nxt & np.isfinite(d) & np.isfinite(d_next)  # both served by the router
    former = np.maximum(np.r_[lo[1:], 0.0] - hi, 0.0)  # |[hi_k, lo_{k+1})|
    held = d_next - d
    rows = []
    for lo_k, hi_k, label in ((0, 10**9, "all"), *TURNS):
        m = ok & (turn >= lo_k) & (turn <= hi_k)
        h = held[m].sum()
        rows.append({**st, "turns": label, "queries": int(m.sum()), "held_s": float(h),
                     "charged_s": float(charged["charged"][m].sum()),
                     "charged_share": float(charged["charged"][m].sum() / h),
                     "charged_30min_share": float(charged["charged_30min"][m].sum() / h),
                     "charged_5min_share": float(charged["charged_5min"][m].sum() / h),
                     "former_charged_s": float(former[m].sum()),
                     "former_share": float(former[m].sum() / h),
                     "former_empty_share": float((former[m] <= 0).mean())})
    return rows


def main() -> None:
    t = pd.DataFrame([r for st in SETTINGS for r in one(st)])
    save_table(t, "horizon_held_intervals", HERE, parquet=False)
    print(t.round(3).to_string(index=False))


if __name__ == "__main__":
    main()
