"""The clairvoyant bound's own path, replayed: ``horizon_follow_path.csv``.

Why. The issue's fourth target measures the router against the bound's possible saving. The bound
is a per-session optimum of a relaxed model (unlimited slots and memory, caches that survive every
hop: docs/model.md §11.1). Is its routing one the replay can carry out? Here every query is sent
where the bound's path put it (:class:`carbonrouter_lib.horizon_eval.FollowPath`: that deployment
if it is a candidate, else another GPU of the same region and model, else the least-carbon
candidate), for the plain bound's path and for the capacity-priced bound's (its path at the best
slot and memory prices, :func:`carbonrouter_lib.bound.capacity_priced_bound` at its defaults,
the router's CO2 as the step target), in three settings: the tuned one, the same with ample memory
and the Mooncake trace (winter, paper regions and memory rule). Per setting and path: the CO2
(kg), the share of the plain bound's possible saving over Session-Affinity, the KV hit rate
(``metrics.summarize``'s: cached / history tokens of the served queries), the queries that went
where the path said, to another GPU of its (region, model), or elsewhere, and the rejected
queries; beside the router's and Session-Affinity's rows. Not online policies and not tuned:
references for what the bound's routing is worth in the replay. About 30 minutes on two cores
(the priced bound evaluates the DP 25 times; the followed paths run in the Python loop). Run
from the repository root: ``.venv/bin/python docs/evidence/follow_path.py``.
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

from carbonrouter_lib import bound, prepared, sweep
from carbonrouter_lib import horizon_eval as he
from carbonrouter_lib.build import build_policy
from carbonrouter_lib.metrics import summarize
from carbonrouter_lib.outputs import save_table
from carbonrouter_lib.setting import backend_config
from carbonrouter_lib.simulator import simulate

HERE = Path(__file__).resolve().parent
SETTINGS = (dict(he.TUNED), {**he.TUNED, "memory": "paper x10"},
            {**he.TUNED, "dataset": "mooncake"})


def _row(st: dict, policy: str, rec: pd.DataFrame, **extra) -> dict:
    m = summarize(rec)
    return {**st, "policy": policy, "co2_kg": m["total_co2_kg"],
            "kv_hit_rate": m["kv_hit_rate_tokens"], "rejected": int(rec["rejected"].sum()),
            **extra}


def one(st: dict[str, str]) -> list[dict]:
    """The router, Session-Affinity and the two followed paths in setting ``st``."""
    wcfg, scfg = he.setting(st)
    table = prepared.prepare_workload(wcfg)
    signal = scfg.signal()
    backend = backend_config(table, scfg)
    runs = {p: sweep.run_one(sweep.RunSpec.make(wcfg, scfg, p, params))
            for p, params in (("session-affinity", {}), (he.TARGET, he.BEFORE_PAIR))}
    plain = bound.ensure_bound(wcfg, scfg)
    priced = bound.capacity_priced_bound(table, scfg, signal,
                                         upper_g=float(runs[he.TARGET]["carbon_g"].sum()))
    rows = [_row(st, p, r) for p, r in runs.items()]
    for name, paths, kg in (("the plain bound's path", plain, plain["carbon_g"].sum() / 1e3),
                            ("the priced bound's path", priced["records"],
                             priced["bound_g"] / 1e3)):
        policy = he.FollowPath(paths)
        ready = build_policy(policy, table, scfg, signal=signal, backend=backend)
        rec = simulate(table, ready, scfg, signal, backend).records
        rows.append(_row(st, name, rec, path_bound_kg=kg, followed=policy.followed,
                         same_region_model=policy.same_region_model, other=policy.other))
    sa = rows[0]["co2_kg"]
    for r in rows:
        r["bound_kg"] = plain["carbon_g"].sum() / 1e3
        r["share_of_possible_saving"] = bound.share_of_possible_saving(sa, r["co2_kg"],
                                                                       r["bound_kg"])
    return rows


def main() -> None:
    with ProcessPoolExecutor(2) as pool:
        parts = list(pool.map(one, SETTINGS))
    t = pd.DataFrame([r for p in parts for r in p])
    n = t[["followed", "same_region_model", "other"]].sum(axis=1)
    for col in ("followed", "same_region_model", "other"):
        t[col] = t[col] / n.where(n > 0)
    t = t[[*he.SETTING, "policy", "co2_kg", "share_of_possible_saving", "kv_hit_rate",
           "followed", "same_region_model", "other", "rejected", "bound_kg", "path_bound_kg"]]
    save_table(t, "horizon_follow_path", HERE, parquet=False)
    with pd.option_context("display.width", 200):
        print(t.round(3).to_string(index=False))
    assert np.isfinite(t["co2_kg"]).all()


if __name__ == "__main__":
    main()
