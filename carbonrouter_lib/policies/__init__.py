"""Routing policies (spec §7) over a shared feasibility step (spec §5, §6a.1–2).

The simulator fills one :class:`QueryContext` per query, calls :func:`feasibility` (costs of
Eq. 4–6 and the candidate set of Eq. 7 for all deployments), and, unless the query is rejected,
asks the policy for a deployment::

    policy = make_policy("carbonrouter", delta=0.5, gate=my_gate)
    ctx, cand = QueryContext(deployments), Candidates(deployments.n)   # once per run
    batch = QueryBatch(deployments, n_new, n_hist, n_out_est, quality, constraints)
    ...                                                                # per query:
    ctx.set_ci(ci)                                   # when the carbon intensity changes
    ctx.fill_row(batch, i, session=s, turn=k, prev=..., cached={a: L}, ...)
    if k == 0:
        policy.on_session_start(ctx)
    feasibility(ctx, constraints, out=cand)
    if not cand.rejected:
        a = policy.choose(ctx, cand); ...; policy.on_served(ctx, a)
    ...
    policy.on_session_end(s)

(``ctx.fill(...)`` fills a one-off context from per-model arrays instead of a batch row.)

Adding a policy: one :class:`Policy` subclass and one line in :data:`POLICIES`.
"""

from __future__ import annotations

from carbonrouter_lib.policies.affinity import CarbonAffinity, SessionAffinity
from carbonrouter_lib.policies.base import (
    Candidates,
    ConstraintConfig,
    Policy,
    QueryBatch,
    QueryContext,
    feasibility,
)
from carbonrouter_lib.policies.carbonrouter import (
    LEARNED,
    ORACLE,
    CarbonRouter,
    CarbonRouterNoGate,
    CarbonRouterNoPricing,
    CarbonRouterOracleGate,
    Gate,
)
from carbonrouter_lib.policies.horizon import HorizonModel, HorizonRouter, fit_horizon_model
from carbonrouter_lib.policies.oblivious import FairCarbon, GARDagger

__all__ = [
    "POLICIES",
    "make_policy",
    "Candidates",
    "ConstraintConfig",
    "Policy",
    "QueryBatch",
    "QueryContext",
    "feasibility",
    "SessionAffinity",
    "CarbonAffinity",
    "GARDagger",
    "FairCarbon",
    "CarbonRouter",
    "CarbonRouterNoGate",
    "CarbonRouterNoPricing",
    "CarbonRouterOracleGate",
    "Gate",
    "HorizonModel",
    "HorizonRouter",
    "fit_horizon_model",
    "LEARNED",
    "ORACLE",
]

#: Registry name → policy class (the names used in results and notebooks).
POLICIES: dict[str, type[Policy]] = {
    "session-affinity": SessionAffinity,
    "carbon-affinity": CarbonAffinity,
    "gar": GARDagger,
    "faircarbon": FairCarbon,
    "carbonrouter": CarbonRouter,
    "carbonrouter-no-gate": CarbonRouterNoGate,
    "carbonrouter-no-pricing": CarbonRouterNoPricing,
    "carbonrouter-oracle-gate": CarbonRouterOracleGate,
    "carbonrouter-horizon": HorizonRouter,
}


def make_policy(name: str, **params) -> Policy:
    """A new policy instance (fresh per-session state) from its registry name and parameters."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise KeyError(f"unknown policy {name!r}; one of {sorted(POLICIES)}") from None
    try:
        return cls(**params)
    except TypeError as exc:
        raise TypeError(f"bad parameters {params} for policy {name!r}: {exc}") from None
