"""Routing policies (docs/model.md §7) over a shared feasibility step (docs/model.md §5, §6a.1–2).

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

Adding a policy: one :class:`Policy` subclass and one line in :data:`POLICIES`. A policy of one's
own, outside this package, needs no registry line: name it by import, ``"package.module:Class"``
(:func:`policy_class`), wherever a policy name is taken (:func:`make_policy`, ``simulate``,
``experiments.run_policies``, ``sweep.RunSpec``). Dask workers import it by that name, so it
reaches them where an entry added to :data:`POLICIES` at run time would not (the module must be
importable on the workers: installed, or on their ``sys.path``).
"""

from __future__ import annotations

import importlib

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
    "policy_class",
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


def policy_class(name: str) -> type[Policy]:
    """The class of a policy name: a registry name (:data:`POLICIES`) or an import name
    ``"package.module:Class"`` of a :class:`Policy` subclass defined anywhere importable.

    Raises
    ------
    KeyError
        ``name`` is neither a registry name nor of the form ``"module:Class"``.
    ValueError
        The module cannot be imported, has no such attribute, or it is not a Policy subclass.
    """
    if not isinstance(name, str):
        raise TypeError(f"a policy name must be a str, got {type(name).__name__}")
    if name in POLICIES:
        return POLICIES[name]
    module_name, sep, attr = name.partition(":")
    if not sep or not module_name or not attr:
        raise KeyError(f"unknown policy {name!r}; one of {sorted(POLICIES)}, or a Policy "
                       f"subclass by import name 'package.module:Class'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"policy {name!r}: cannot import module {module_name!r} ({exc}); it "
                         f"must be importable here and on every worker") from None
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"policy {name!r}: module {module_name!r} has no attribute "
                             f"{attr!r}") from None
    if not (isinstance(obj, type) and issubclass(obj, Policy)):
        raise ValueError(f"policy {name!r}: {attr} is {obj!r}, not a subclass of "
                         f"carbonrouter_lib.policies.Policy")
    return obj


def make_policy(name: str, **params) -> Policy:
    """A new policy instance (fresh per-session state) from its name (a registry name or an
    import name ``"package.module:Class"``, see :func:`policy_class`) and parameters. A policy
    class without a ``name`` of its own is named by its import name in the records."""
    cls = policy_class(name)
    try:
        policy = cls(**params)
    except TypeError as exc:
        raise TypeError(f"bad parameters {params} for policy {name!r}: {exc}") from None
    if not policy.name:
        policy.name = name
    return policy
