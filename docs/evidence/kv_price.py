"""The horizon router's *KV price* (``HorizonRouter(kv_price=True)``; docs/model.md §11.4a, "The
KV price"; §11.4a's return exit and §11.4c's caching ceiling point to it) against every online
policy and against the default router, on notebook 09's full grid and fresh weeks:

- ``horizon_kv_price_{grid}_table.csv`` (:func:`carbonrouter_lib.horizon_eval.table`: every
  policy's CO2 and P95 TTFT, and the variant's saving over it, paired 95% CIs over
  conversations), ``horizon_kv_price_{grid}_verdicts.csv`` (:func:`~carbonrouter_lib.
  horizon_eval.verdicts` of the variant) and ``horizon_kv_price_{grid}_bound.csv`` (each
  policy's share of the committed clairvoyant bound's possible saving);
- ``horizon_kv_price_{grid}.csv``: per setting the variant against the default router, with
  the paired saving's CI, the shares of the bound's saving, P95 TTFT, KV hit rate, switches,
  quality and the tokens evicted (the backend's counter).

The price. For each candidate deployment a in KV pool p, the tokens its turn adds beyond what is
cached there, H_0(a) − L(a), evict max(0, H_0(a) − L(a) − free_p) tokens of other caches (free_p
the pool's free tokens at dispatch). Each evicted token is priced at λ_p, gCO2e per token: the
carbon sessions lost to missing history in pool p (at each session's turn, what its cache on its
previous deployment lost, (H − L)·(e_in − e_cache)·I at that deployment's intensity now; eviction
and TTL both), over the tokens this router's own choices evicted in p, both summed since the
replay's start (:func:`carbonrouter_lib.kernel.kv_prices`). No parameter.

What was looked at: the rule was written before its first run, at the tuned setting (ShareGPT,
the paper's regions and memory rule, winter; 4.7% [4.1, 5.4] less CO2 than the default router
there), and not changed after; that setting is not held-out here (``designed_on``). Every other
setting of both grids is held-out. It was first run as a Python-loop prototype (commit 6334e0e,
a subclass of the router, on the ShareGPT settings and the Mooncake trace's winter); built into
both loops, it gives those runs' records to the bit (the ``horizon_kv_price_{grid}.csv`` rows
of that commit are this script's). About 25 minutes a grid on two cores (every policy is
replayed; the bound is the committed one). Run from the repository root:
``.venv/bin/python docs/evidence/kv_price.py full|fresh``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from carbonrouter_lib import bound, metrics, sweep
from carbonrouter_lib import horizon_eval as he
from carbonrouter_lib.outputs import save_table

HERE = Path(__file__).resolve().parent
#: The variant's parameters over the router's defaults.
KV_PARAMS = {"kv_price": True}
#: The label of the router with its defaults in the variant's grid tables.
DEFAULT = "carbonrouter-horizon (no KV price)"


def one(job: tuple[dict[str, str], str]) -> dict:
    """The KV price against the default router in setting ``job[0]`` of grid ``job[1]``: CO2,
    the paired saving over the default with its 95% CI (sessions resampled), the shares of the
    committed bound's possible saving, P95 TTFT, KV hit rate, switches, evicted tokens, and the
    least CO2 of the other online policies in the committed grid table."""
    st, grid = job
    wcfg, scfg = he.setting(st)
    default = sweep.run_one(sweep.RunSpec.make(wcfg, scfg, he.TARGET))
    res = sweep.replay(sweep.RunSpec.make(wcfg, scfg, he.TARGET, policy_params=KV_PARAMS))
    key = tuple(st[c] for c in he.SETTING)
    b = pd.read_csv(HERE / f"horizon_{grid}_bound.csv")
    row = b[b["policy"] == he.TARGET].set_index(list(he.SETTING)).loc[key]
    sa, bd = float(row["session_affinity_kg"]), float(row["bound_kg"])
    t = pd.read_csv(HERE / f"horizon_{grid}_table.csv").set_index(list(he.SETTING)).loc[key]
    others = t[t["policy"].isin([p for p in he.ONLINE if p != he.TARGET])]
    best = others.sort_values("total_co2_kg").iloc[0]
    ci = metrics.paired_saving_ci(res.records, default)
    out = st | {"best_other": best["policy"], "best_other_co2_kg": float(best["total_co2_kg"]),
                "session_affinity_kg": sa, "bound_kg": bd, "saving_over_default_pct": ci.estimate,
                "ci_low_pct": ci.low, "ci_high_pct": ci.high,
                "evicted_tokens": int(res.counters["evicted_tokens"])}
    for tag, rec in (("default", default), ("kv_price", res.records)):
        s = metrics.summarize(rec)
        co2 = float(rec["carbon_g"].sum()) / 1e3
        out |= {f"co2_kg_{tag}": co2,
                f"share_{tag}": bound.share_of_possible_saving(sa, co2, bd),
                f"p95_ttft_s_{tag}": float(s["p95_ttft_s"]),
                f"kv_hit_rate_{tag}": float(s["kv_hit_rate_tokens"]),
                f"switches_{tag}": float(s["switches_per_session"]),
                f"quality_{tag}": float(s["mean_quality"])}
    return out


def main(grid: str) -> None:
    from returns import over_settings  # the per-setting loop
    from slot_credit import variant_runs, write_variant_grid  # variant grids

    if grid not in ("full", "fresh"):
        raise SystemExit(f"kv_price.py: grid must be 'full' or 'fresh', got {grid!r}")
    runs = variant_runs(he.grid_settings(grid)[0], KV_PARAMS, DEFAULT)
    results = sweep.run_sweep(list(runs["spec"]))
    write_variant_grid(he.table(results, runs), "kv_price", grid, other=DEFAULT,
                       designed_on=[he.TUNED])
    t = pd.DataFrame(over_settings(one, grid, "kv_price.py", with_grid=True))
    t["lowest_co2"] = t["co2_kg_kv_price"] < t["best_other_co2_kg"]
    save_table(t, f"horizon_kv_price_{grid}", HERE, parquet=False)
    print(t.round(4).to_string())


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    main(sys.argv[1] if len(sys.argv) > 1 else "full")
