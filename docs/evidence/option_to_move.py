"""A negative result, kept reproducible: the horizon router's future priced with the *option to
move* (``horizon_option_to_move.csv``).

The router prices each future turn as if the session stays on the deployment chosen now (cache
kept with chance p, weights S_k(j)·ρ^(j−1); :mod:`carbonrouter_lib.policies.horizon`). With
ample KV memory that loses to CarbonRouter's one-turn proposal (notebook 09's ablations: J = 0
is 2.1% better). The variant here prices every future turn j at the cheaper of staying and
moving to the least-carbon deployment with the history recomputed::

    C_j(a) = min(p_a·C⁺_j(a) + (1 − p_a)·C⁻_j(a),  min_a′ C⁻_j(a′))

(model stickiness as the router's, per turn), in three forms: ``option`` (weights S_k(j), the
moves being priced), ``option, eviction priced`` (a move also pays the others' recomputation it
may cause, (1 − p_a′)·(e_in − e_cache)·Î·H_j) and ``option, roomy pools`` (weights S_k(j)·ρ^j;
a move only to a deployment whose KV pool has room for the history now). A subclass of the
router, so it runs in the Python loop (about 3–5 minutes a run); slot price as the router's.
Three settings: the tuned one, ample memory and the Mooncake trace (paper regions, winter).

Result: it beats CarbonRouter with ample memory (the first variant to) but emits 6–10% more
than the router at the tuned setting, so it was not the router. The router here is the former
one (``horizon_eval.FORMER``); the option the router has had since 2026-12-05
(``HorizonRouter.option``) grew out of this: the move weighted by the chance its KV pool has
room, and the model a session falls back to learned from training conversations. Run from the
repository root: ``.venv/bin/python docs/evidence/option_to_move.py``.
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

from carbonrouter_lib import horizon_eval as he
from carbonrouter_lib import kernel, metrics
from carbonrouter_lib.build import build_policy
from carbonrouter_lib.outputs import atomic_path
from carbonrouter_lib.policies import make_policy
from carbonrouter_lib.policies.horizon import HorizonRouter
from carbonrouter_lib.prepared import prepare_workload
from carbonrouter_lib.setting import backend_config
from carbonrouter_lib.simulator import simulate

HERE = Path(__file__).resolve().parent
FORMS = ("option", "option, eviction priced", "option, roomy pools")
SETTINGS = (dict(he.TUNED), dict(he.TUNED, memory="paper x10"), dict(he.TUNED, dataset="mooncake"))


class OptionToMove(HorizonRouter):
    """The horizon router with the option to move at every future turn (module docstring);
    ``form`` one of :data:`FORMS`."""

    def __init__(self, form: str, **kw) -> None:
        super().__init__(**(he.FORMER | he.BEFORE_PAIR | kw))
        if form not in FORMS:
            raise ValueError(f"OptionToMove.form must be one of {FORMS}, got {form!r}")
        self.form = form

    def compiled(self, info):
        return None  # the Python loop only

    def _observe(self, ctx):
        """The router's run state, after this query's observation of the cache survival (what
        the session found of the cache it left on its previous deployment), as the router's
        compiled decision makes it (kernel.horizon_decide; no option, so no room)."""
        st = self._bound
        if st is None or st.deployments is not ctx.deployments:
            st = self._bound = self._bind(ctx)
            st.deployments = ctx.deployments
        b = ctx.prev
        if self.cache_survival and ctx.turn > 0 and b >= 0:
            hist_b = ctx.n_hist_m[st.model[b]]
            if hist_b > 0:
                pool = st.kv_pool[b]
                st.keep[pool] = kernel.running_mean(st.keep[pool], ctx.cached[b] / hist_b,
                                                    self.smoothing)
        return st

    def _slot_prices(self, ctx, cand, st, f, k):
        """The router's slot price per deployment, gCO2e (kernel.slot_prices, over the
        slot_horizon's turns as the router's)."""
        tau = float(self.model.gap_s[f])
        kernel.slot_prices(st.price, st.pi, st.displaced, st.gap, st.clock, cand.carbon,
                           cand.ok_if_free, len(st.price), ctx.available, cand.mask, st.pool,
                           ctx.prev, ctx.time_s, self.slot_smoothing,
                           tau * (0.5 + st.surv_sum[f, 0]), tau * (0.5 + st.surv_sum[f, k]),
                           self.slot_credit)
        return st.price

    def choose(self, ctx, cand):
        st = self._observe(ctx)
        model = self.model
        f = model.fold_of(ctx.conversation)
        k = min(ctx.turn, model.survival.shape[1] - 1)
        rho, n_j = st.stayed, self.horizon
        fc = st.forecast(ctx.time_s, f)
        m = st.model
        post = (ctx.n_hist_m + ctx.n_new_m + ctx.n_out_est_m)[m]
        n_new, n_out = model.new_tokens[f][m], model.out_tokens[f][m]
        hist = post[:, None] + np.arange(n_j)[None, :] * (n_new + n_out)[:, None]  # (n, J)
        ci = fc[st.region]
        base = ci * (st.e_in * n_new + st.e_out * n_out)[:, None]
        keep = st.keep[st.kv_pool][:, None]
        saved = ci * hist * (st.e_in - st.e_cache)[:, None]
        miss = base + ci * hist * st.e_in[:, None]
        hit = miss - keep * saved
        if self.form == "option, eviction priced":
            move = (miss + (1 - keep) * saved).min(axis=0)
        elif self.form == "option, roomy pools":
            free = (ctx.backend.kv_capacities() - ctx.backend.pool_used_tokens())[st.kv_pool]
            move = np.where(free[:, None] >= hist, miss, np.inf).min(axis=0)
        else:
            move = miss.min(axis=0)
        cost = np.minimum(hit, move[None, :])
        q = model.stay_feasible[f][m][:, None]
        n_m = model.new_tokens.shape[1]
        best = np.full((n_m, n_j), np.inf)
        for mm in range(n_m):
            if (m == mm).any():
                best[mm] = miss[m == mm].min(axis=0)
        other = np.stack([np.delete(best, mm, axis=0).min(axis=0) for mm in range(n_m)])
        cost = q * cost + (1 - q) * other[m]
        rho_w = rho if self.form == "option, roomy pools" else 1.0
        future = cost @ (model.survival[f, k, :n_j] * rho_w ** np.arange(n_j))
        return cand.argmin(cand.carbon + future + self._slot_prices(ctx, cand, st, f, k))


def one(job: tuple[dict, str]) -> dict:
    st, label = job
    wcfg, scfg = he.setting(st)
    table = prepare_workload(wcfg)
    signal = scfg.signal()
    capacity = backend_config(table, scfg)
    # the router as this table was made (he.FORMER: no fallback exit, no option to move)
    policy = OptionToMove(label) if label in FORMS else make_policy(
        label, **(he.FORMER | he.BEFORE_PAIR if label == he.TARGET else {}))
    policy = build_policy(policy, table, scfg, signal=signal, backend=capacity, workload=wcfg)
    s = metrics.summarize(simulate(table, policy, scfg, signal=signal, backend=capacity).records)
    row = {**st, "policy": label, **{c: float(s[c]) for c in (
        "total_co2_kg", "p95_ttft_s", "kv_hit_rate_tokens", "switches_per_session")}}
    print(row, flush=True)
    return row


def main() -> None:
    jobs = [(st, p) for st in SETTINGS for p in ("carbonrouter-no-gate", he.TARGET, *FORMS)]
    with ProcessPoolExecutor(2) as pool:
        rows = list(pool.map(one, jobs))
    out = pd.DataFrame(rows)
    router = out["total_co2_kg"].where(out["policy"] == he.TARGET).groupby(
        [out[c] for c in he.SETTING]).transform("max")
    out["co2_vs_router_pct"] = 100 * (out["total_co2_kg"] / router - 1)
    with atomic_path(HERE / "horizon_option_to_move.csv") as tmp:
        out.to_csv(tmp, index=False)
    print(out.round(3).to_string())


if __name__ == "__main__":
    main()
