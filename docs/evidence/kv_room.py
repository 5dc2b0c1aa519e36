"""What the horizon router's fallback exit and option to move were designed from (docs/model.md
§11.4a), in the two settings they were designed on (``horizon_eval.DESIGNED_ON``):
``horizon_kv_room.csv`` and ``horizon_switch_kinds.csv``.

- ``horizon_kv_room.csv``: per KV pool, how full CarbonRouter's replay (without its gate) keeps
  it: the mean share of its memory in use and the share of the queries at which it is at least
  98% used, sampled at every 50th query (the Python loop; a read of ``Backend.pool_used_tokens``).
  Under the paper's memory rule some pools are full most of the time, the others rarely; with
  ten times the memory none is. That is what the option's weight 1 − φ reads.
- ``horizon_switch_kinds.csv``: per policy, the switches per session split by what they change
  (the model; only the GPU; only the region) and the recomputation energy of each kind: most
  switches change the model, which is what the fallback exit prices.

About five minutes on one core. Run from the repository root: ``.venv/bin/python
docs/evidence/kv_room.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from carbonrouter_lib import horizon_eval as he
from carbonrouter_lib.build import build_policy
from carbonrouter_lib.outputs import atomic_path
from carbonrouter_lib.policies import make_policy
from carbonrouter_lib.prepared import prepare_workload
from carbonrouter_lib.setting import backend_config
from carbonrouter_lib.simulator import simulate

HERE = Path(__file__).resolve().parent
EVERY = 50  # sample the pools at every 50th query
FULL = 0.98  # "full": at least this share of the pool's KV memory in use
#: policy label → (registry name, parameters) of the switch split
POLICIES = {"carbonrouter-no-gate": ("carbonrouter-no-gate", {}),
            "carbonrouter-horizon (former)": (he.TARGET, he.FORMER | he.BEFORE_PAIR),
            "carbonrouter-horizon": (he.TARGET, dict(he.BEFORE_PAIR))}


def _ready(policy, st):
    wcfg, scfg = he.setting(st)
    table = prepare_workload(wcfg)
    signal = scfg.signal()
    capacity = backend_config(table, scfg)
    return table, scfg, signal, capacity, build_policy(policy, table, scfg, signal=signal,
                                                       backend=capacity, workload=wcfg)


def kv_room(st: dict) -> pd.DataFrame:
    table, scfg, signal, capacity, policy = _ready(make_policy("carbonrouter-no-gate"), st)
    samples, seen = [], [0]
    choose = policy.choose

    def sampling(ctx, cand):
        seen[0] += 1
        if seen[0] % EVERY == 0:
            samples.append(ctx.backend.pool_used_tokens() / ctx.backend.kv_capacities())
        return choose(ctx, cand)

    policy.choose = sampling
    simulate(table, policy, scfg, signal=signal, backend=capacity, engine="python")
    used = np.array(samples)
    d = scfg.deployments()
    pools = np.arange(used.shape[1])  # the paper's rule: a pool per (region, GPU)
    first = [int(np.flatnonzero(d.pool == p)[0]) for p in pools]  # a deployment of each pool
    return pd.DataFrame({**st, "pool": pools,
                         "region": [d.regions[d.region[a]] for a in first],
                         "gpu": [d.gpus[d.gpu[a]] for a in first], "samples": len(used),
                         "mean_used": used.mean(axis=0), "share_full": (used >= FULL).mean(axis=0)})


def switch_kinds(st: dict) -> pd.DataFrame:
    rows = []
    for label, (name, params) in POLICIES.items():
        table, scfg, signal, capacity, policy = _ready(make_policy(name, **params), st)
        r = simulate(table, policy, scfg, signal=signal, backend=capacity).records
        r = r[~r["rejected"]].sort_values(["session", "turn"])
        dep = r["deployment"].to_numpy()
        d = scfg.deployments()
        same = np.r_[False, r["session"].to_numpy()[1:] == r["session"].to_numpy()[:-1]]
        prev = np.r_[-1, dep[:-1]]
        switched = same & (prev != dep)
        m, g, reg = d.model[dep], d.gpu[dep], d.region[dep]
        pm, pg, preg = d.model[prev], d.gpu[prev], d.region[prev]
        kinds = {"model": switched & (pm != m),
                 "gpu_only": switched & (pm == m) & (pg != g) & (preg == reg),
                 "region": switched & (pm == m) & (preg != reg)}
        n = r["session"].nunique()
        recompute = r["recompute_energy_kwh"].to_numpy()
        row = {**st, "policy": label, "switches_per_session": switched.sum() / n,
               "co2_kg": r["carbon_g"].sum() / 1e3,
               "recompute_energy_kwh": recompute.sum()}
        for k, mask in kinds.items():
            row[f"{k}_switches_per_session"] = mask.sum() / n
            row[f"{k}_recompute_energy_kwh"] = recompute[mask].sum()
        rows.append(row)
    return pd.DataFrame(rows)


def main() -> None:
    room = pd.concat([kv_room(dict(st)) for st in he.DESIGNED_ON], ignore_index=True)
    kinds = pd.concat([switch_kinds(dict(st)) for st in he.DESIGNED_ON], ignore_index=True)
    for frame, name in ((room, "horizon_kv_room"), (kinds, "horizon_switch_kinds")):
        with atomic_path(HERE / f"{name}.csv") as tmp:
            frame.to_csv(tmp, index=False)
    print(room.round(3).to_string())
    print(kinds.round(3).to_string())


if __name__ == "__main__":
    main()
