"""The horizon router's *KV price* (``HorizonRouter(kv_price=True)``; docs/model.md §11.4a, "The
KV price"; §11.4a's return exit and §11.4c's caching ceiling point to it) against every online
policy and against the default router, on notebook 09's full grid and fresh weeks. "The default
router" of these tables is the router before the pair (the KV price within the TTL with the TTFT
price) became the default on 2026-12-06: :data:`carbonrouter_lib.horizon_eval.BEFORE_PAIR`, which
this script pins, as it pins the KV price's first rule (:data:`KV_PARAMS`, every loss):

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

``ttl-full`` / ``ttl-fresh`` (``horizon_kv_price_ttl_{grid}.csv``): the per-setting table of the
rule that counts only the losses within the TTL (``kv_loss="within_ttl"``; :data:`TTL_PARAMS`),
designed after both grids and the ``losses`` table below, so no setting is held-out for it
(about 8 minutes a grid).

``slo-full`` / ``slo-fresh`` (``horizon_kv_price_slo_{grid}.csv``): the same per-setting table of
the rule within the TTL with the TTFT price beside it (``ttft_slo_s`` = CarbonRouter's P95 TTFT
in the setting, from the committed grid table, as ``docs/evidence/ttft_slo.py`` sets it): both
parts as they are, nothing chosen for the pair, run once on both grids (about 8 minutes a grid).

``pair-full`` / ``pair-fresh`` (``horizon_kv_price_pair_{grid}_{table,verdicts,bound}.csv``):
the pair's grid against every online policy, with paired CIs, as notebook 09's: a first phase
replays every online policy and the router before the pair (labelled :data:`PAIR_DEFAULT`), then
the pair (the default router from 2026-12-06 to 2026-12-07, J = 16: :data:`carbonrouter_lib.
horizon_eval.PAIR_J16`, pinned here), given CarbonRouter's P95 TTFT of the first phase in the
setting as its SLO (:func:`carbonrouter_lib.horizon_eval.ttft_slos`), is the target. Its tables
were computed before the switch, with the pair's parameters given explicitly (the same router).
Both parts were designed after both grids, so no setting is held-out (``held_out`` is False
throughout). About 25 minutes a grid on two cores.

``pair-scale`` (``horizon_kv_price_pair_scale_{table,verdicts}.csv``): the same across notebook
09's full scale sweep (:data:`carbonrouter_lib.horizon_eval.SCALE_GRIDS` ``"full"``; the SLO
CarbonRouter's P95 at the same dataset, memory rule and scale), which no part of the pair was
looked at on.

``pair-variants`` (``horizon_kv_price_pair_variants.csv``, :func:`carbonrouter_lib.horizon_eval.
table`): notebook 09's ablations and forecast errors over the pair
(:data:`carbonrouter_lib.horizon_eval.VARIANTS`: the former router's, and the pair without each
of its prices) in the full grid's four settings with
ablations, with every online policy, the oracle gate and the default router replayed beside it;
no setting held-out. About 9 minutes on two cores.

``pair-reference`` (``horizon_kv_price_pair_full_reference.csv``): the pair's saving over
CarbonRouter with the oracle gate (a reference, not an online policy) in every setting of the
full grid, with the pair's row; the runs of ``pair-full`` with the oracle gate beside them.

``losses`` (``horizon_kv_price_losses.csv``): what λ_p is made of, in four winter settings (the
paper's regions; ShareGPT and the Mooncake trace, each under the paper's memory rule and with
ample memory), replayed in the Python loop with a log of every loss the price observes. Each loss
is split by its cause: the session came back after the TTL (its dispatch more than ``ttl_s``
after its previous served turn completed, so the cache on that deployment had expired whatever
the router did) or within it (what only an eviction can have taken). About 15 minutes on two
cores: ``.venv/bin/python docs/evidence/kv_price.py losses``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from carbonrouter_lib import bound, metrics, sweep
from carbonrouter_lib import horizon_eval as he
from carbonrouter_lib.outputs import save_table
from carbonrouter_lib.policies import HorizonRouter

HERE = Path(__file__).resolve().parent
#: The variant's parameters: the KV price counting every loss (the router before the pair had
#: no KV price, :data:`carbonrouter_lib.horizon_eval.BEFORE_PAIR`; since the pair is the default
#: the KV price's default counts the losses within the TTL).
KV_PARAMS = {"kv_price": True, "kv_loss": "all"}
#: The rule that counts only the losses within the TTL (``kv_loss="within_ttl"``).
TTL_PARAMS = KV_PARAMS | {"kv_loss": "within_ttl"}
#: The label of the router with its defaults in the variant's grid tables.
DEFAULT = "carbonrouter-horizon (no KV price)"
#: The label of the router before the pair in the pair's grid tables (``pair-*``), where the
#: pair, now the default router, is the target.
PAIR_DEFAULT = "carbonrouter-horizon (default)"


def one(job: tuple[dict[str, str], str], params: dict | None = None) -> dict:
    """The KV price (``params``, default :data:`KV_PARAMS`) against the default router in
    setting ``job[0]`` of grid ``job[1]``: CO2,
    the paired saving over the default with its 95% CI (sessions resampled), the shares of the
    committed bound's possible saving, P95 TTFT, KV hit rate, switches, evicted tokens, and the
    least CO2 of the other online policies in the committed grid table."""
    st, grid = job
    wcfg, scfg = he.setting(st)
    default = sweep.run_one(sweep.RunSpec.make(wcfg, scfg, he.TARGET, he.BEFORE_PAIR))
    res = sweep.replay(sweep.RunSpec.make(wcfg, scfg, he.TARGET,
                                          policy_params=params or KV_PARAMS))
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


class LossLog(HorizonRouter):
    """The KV price with a log of what it observes (Python loop only): per observed loss the
    session, turn, KV pool and lost carbon (g, the term :func:`carbonrouter_lib.kernel.kv_prices`
    adds to λ_p's numerator); per served turn its KV pool and the tokens its choice was priced
    as evicting (the denominator's term)."""

    def __init__(self) -> None:
        super().__init__(**KV_PARAMS)
        self.losses: list[tuple[int, int, int, float]] = []
        self.evictions: list[tuple[int, float]] = []

    def compiled(self, info) -> dict | None:
        return None

    def choose(self, ctx, cand) -> int:
        before = None if self._bound is None else self._bound.kv_loss.copy()
        a = super().choose(ctx, cand)
        # what kernel.kv_prices added to the numerator at this query (one pool at most)
        added = self._bound.kv_loss - (0.0 if before is None else before)
        for p in np.flatnonzero(added):
            self.losses.append((ctx.session, ctx.turn, int(p), float(added[p])))
        return a

    def on_served(self, ctx, a: int) -> None:
        super().on_served(ctx, a)
        st = self._bound
        self.evictions.append((int(st.kv_pool[a]), float(st.kv_evict[a])))


def split_losses(losses: pd.DataFrame, records: pd.DataFrame, ttl_s: float) -> pd.Series:
    """The observed losses (``losses``: ``session``, ``turn``, ``lost_g``) split by cause against
    a run's ``records``: ``expired_g`` where the session's dispatch came more than ``ttl_s`` (s)
    after its previous *served* turn completed (the cache had expired by then, so no eviction
    caused the loss), ``within_ttl_g`` the rest; with their sum ``lost_g`` and the count of
    losses ``n``."""
    served = records[~records["rejected"].to_numpy(bool)].sort_values(["session", "turn"])
    prev_done = served.groupby("session")["completion_s"].shift(1)
    at = pd.DataFrame({"session": served["session"].to_numpy(), "turn": served["turn"].to_numpy(),
                       "dispatch_s": served["dispatch_s"].to_numpy(),
                       "prev_done_s": prev_done.to_numpy()})
    m = losses.merge(at, on=["session", "turn"], how="left", validate="one_to_one")
    if m["prev_done_s"].isna().any():
        raise ValueError(f"split_losses: {int(m['prev_done_s'].isna().sum())} losses have no "
                         f"served earlier turn in the records")
    expired = (m["dispatch_s"] - m["prev_done_s"]) > ttl_s
    return pd.Series({"n": len(m), "lost_g": float(m["lost_g"].sum()),
                      "expired_g": float(m.loc[expired, "lost_g"].sum()),
                      "within_ttl_g": float(m.loc[~expired, "lost_g"].sum())})


def losses_one(st: dict[str, str]) -> dict:
    """:func:`losses`' replay of one setting: the KV price in the Python loop with
    :class:`LossLog`, its losses split by :func:`split_losses`, λ over all of them and over
    those within the TTL (g per token the router's choices evicted, all pools together)."""
    wcfg, scfg = he.setting(st)
    spec = sweep.RunSpec.make(wcfg, scfg, he.TARGET, policy_params=KV_PARAMS)
    policy = LossLog()
    res, _, _, capacity = sweep._replay(spec, policy=policy, engine="python")
    compiled = sweep.run_one(spec)  # the compiled loop's run: the same records
    if not np.array_equal(res.records["deployment"].to_numpy(),
                          compiled["deployment"].to_numpy()):
        raise RuntimeError(f"kv_price.py losses: the logged replay is not the variant's in {st}")
    losses = pd.DataFrame(policy.losses, columns=["session", "turn", "pool", "lost_g"])
    split = split_losses(losses, res.records, capacity.ttl_s)
    evicted = float(sum(e for _, e in policy.evictions))

    def lam(g: float) -> float:
        return g / evicted if evicted > 0 else np.nan

    return st | {"ttl_s": capacity.ttl_s, "losses": int(split["n"]),
                 "lost_kg": split["lost_g"] / 1e3, "expired_kg": split["expired_g"] / 1e3,
                 "within_ttl_kg": split["within_ttl_g"] / 1e3,
                 "expired_share": split["expired_g"] / split["lost_g"] if split["lost_g"] > 0
                 else np.nan,
                 "priced_evicted_tokens": evicted,
                 "evicted_tokens": int(res.counters["evicted_tokens"]),
                 "expired_tokens": int(res.counters["expired_tokens"]),
                 "lambda_g_per_token": lam(split["lost_g"]),
                 "lambda_within_ttl_g_per_token": lam(split["within_ttl_g"])}


#: The settings of :func:`losses` (winter, the paper's regions).
LOSS_SETTINGS = [{"dataset": d, "region_set": "paper", "memory": m, "season": "winter"}
                 for d in ("sharegpt", "mooncake") for m in ("paper", "paper x10")]


def losses() -> pd.DataFrame:
    """``horizon_kv_price_losses.csv``: per setting of :data:`LOSS_SETTINGS`, the losses λ_p
    is made of, split by cause (:func:`losses_one`)."""
    from concurrent.futures import ProcessPoolExecutor

    from tqdm.auto import tqdm

    with ProcessPoolExecutor(2) as pool:
        rows = list(tqdm(pool.map(losses_one, LOSS_SETTINGS), total=len(LOSS_SETTINGS),
                         desc="replays"))
    t = pd.DataFrame(rows)
    save_table(t, "horizon_kv_price_losses", HERE, parquet=False)
    print(t.round(4).to_string())
    return t


def one_slo(job: tuple[dict[str, str], str]) -> dict:
    """:func:`one` of the rule within the TTL (:data:`TTL_PARAMS`) with the TTFT price, its SLO
    CarbonRouter's P95 TTFT in the setting (the committed grid table's), with that SLO as
    ``slo_s``."""
    st, grid = job
    t = pd.read_csv(HERE / f"horizon_{grid}_table.csv").set_index(list(he.SETTING))
    g = t.loc[tuple(st[c] for c in he.SETTING)]
    slo = float(g.loc[g["policy"] == "carbonrouter", "p95_ttft_s"].iloc[0])
    return one(job, params=TTL_PARAMS | {"ttft_slo_s": slo}) | {"slo_s": slo}


def _pair(first: pd.DataFrame, pair: pd.DataFrame) -> pd.DataFrame:
    """The pair's runs: of the first phase ``first`` (the router before the pair as the
    target), the other policies and that router relabelled :data:`PAIR_DEFAULT`; then of
    ``pair`` (notebook 09's runs, the router given its SLO) the router and its variants."""
    before = first["policy"] == he.TARGET
    return pd.concat([first[~before], first[before].assign(policy=PAIR_DEFAULT),
                      pair[~pair["policy"].isin([*he.ONLINE, *he.REFERENCE])]],
                     ignore_index=True)


def pair_runs(grid: str, reference: bool = False) -> pd.DataFrame:
    """The pair's grid runs (``pair-full|pair-fresh``), notebook 09's two phases: every online
    policy and the router before the pair (with ``reference`` also the oracle gate), run here,
    then the default router given CarbonRouter's P95 TTFT as its SLO
    (:func:`carbonrouter_lib.horizon_eval.ttft_slos`)."""
    settings = he.grid_settings(grid)[0]
    first = he.grid(settings, reference_in=None if reference else [],
                    target_params=he.BEFORE_PAIR)
    slo = he.ttft_slos(sweep.run_sweep(list(first["spec"])), first)
    return _pair(first, he.grid(settings, reference=(), ttft_slo=slo,
                                target_params=he.PAIR_J16))


def pair_scale_runs() -> pd.DataFrame:
    """:func:`pair_runs` over notebook 09's full scale sweep, the SLO CarbonRouter's P95 TTFT of
    the first phase at the same :data:`~carbonrouter_lib.horizon_eval.SCALE_BY` setting."""
    first = he.scale_grid("full", target_params=he.BEFORE_PAIR)
    slo = he.ttft_slos(sweep.run_sweep(list(first["spec"])), first, by=he.SCALE_BY)
    return _pair(first, he.scale_grid("full", ttft_slo=slo, target_params=he.PAIR_J16))


def pair_variant_runs() -> pd.DataFrame:
    """The pair's ablations and forecast errors (``pair-variants``) in notebook 09's four settings
    of the full grid's ablations (:func:`carbonrouter_lib.horizon_eval.grid_settings` ``"full"``:
    both datasets × both memory rules, the paper's regions, winter): a first phase replays every
    online policy, the oracle gate and the router before the pair (:data:`PAIR_DEFAULT`); then
    the default router (SLO CarbonRouter's P95 TTFT of the first phase), each of its ablations
    (:data:`carbonrouter_lib.horizon_eval.VARIANTS`) and each forecast error over it
    (:data:`carbonrouter_lib.horizon_eval.NOISE`)."""
    settings = he.grid_settings("full")[1]
    first = he.grid(settings, target_params=he.BEFORE_PAIR)
    slo = he.ttft_slos(sweep.run_sweep(list(first["spec"])), first)
    return _pair(first, he.grid(settings, settings, reference=(), ttft_slo=slo,
                                target_params=he.PAIR_J16))


def main(grid: str) -> None:
    import functools

    from returns import over_settings  # the per-setting loop
    from slot_credit import variant_runs, write_variant_grid  # variant grids

    if grid == "losses":
        losses()
        return
    if grid == "pair-scale":  # across the scale sweep, which no part of the pair was looked at on
        runs = pair_scale_runs()
        t = he.scale_table(sweep.run_sweep(list(runs["spec"])), runs)
        v = he.verdicts(t, by=he.SCALE_BY)
        save_table(t, "horizon_kv_price_pair_scale_table", HERE, parquet=False)
        save_table(v, "horizon_kv_price_pair_scale_verdicts", HERE, parquet=False)
        print(v.round(3).to_string())
        return
    if grid == "pair-variants":  # the pair's ablations, no setting held-out
        runs = pair_variant_runs()
        every = he.grid_settings("full")[1]
        t = he.table(sweep.run_sweep(list(runs["spec"])), runs, designed_on=every)
        save_table(t, "horizon_kv_price_pair_variants", HERE, parquet=False)
        print(t[[*he.SETTING, "policy", "co2_rel", "saving_pct", "ci_low_pct", "ci_high_pct",
                 "p95_ttft_s"]].round(3).to_string())
        return
    if grid == "pair-reference":  # the pair against the oracle gate, every setting of the full grid
        runs = pair_runs("full", reference=True)
        t = he.table(sweep.run_sweep(list(runs["spec"])), runs, designed_on=he.DESIGNED_ON_PAIR)
        t = t[t["policy"].isin([*he.REFERENCE, he.TARGET])].reset_index(drop=True)
        save_table(t, "horizon_kv_price_pair_full_reference", HERE, parquet=False)
        print(t[[*he.SETTING, "policy", "co2_rel", "saving_pct", "ci_low_pct", "ci_high_pct"]]
              .round(3).to_string())
        return
    if grid.startswith("pair-"):  # the pair against every online policy, no setting held-out
        g = grid.split("-", 1)[1]
        runs = pair_runs(g)
        every = he.grid_settings(g)[0]
        results = sweep.run_sweep(list(runs["spec"]))
        write_variant_grid(he.table(results, runs, designed_on=every), "kv_price_pair", g,
                           other=PAIR_DEFAULT, designed_on=every)
        return
    if grid.startswith(("ttl-", "slo-")):  # per setting, against the default router
        kind, g = grid.split("-", 1)
        fn = functools.partial(one, params=TTL_PARAMS) if kind == "ttl" else one_slo
        t = pd.DataFrame(over_settings(fn, g, "kv_price.py", with_grid=True))
        t["lowest_co2"] = t["co2_kg_kv_price"] < t["best_other_co2_kg"]
        save_table(t, f"horizon_kv_price_{kind}_{g}", HERE, parquet=False)
        print(t.round(4).to_string())
        return
    if grid not in ("full", "fresh"):
        raise SystemExit(f"kv_price.py: grid must be 'full', 'fresh', 'ttl-full', 'ttl-fresh', "
                         f"'slo-full', 'slo-fresh', 'pair-full', 'pair-fresh', 'pair-scale', "
                         f"'pair-variants', 'pair-reference' or 'losses', got {grid!r}")
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
