"""CarbonRouter (CCAR), paper Algorithm 1 (spec §7.5–6).

Per query:

1. candidates = the shared feasibility step (:func:`~carbonrouter_lib.policies.base.feasibility`);
2. proposal g = argmin over candidates of the *cache-aware* carbon Ĉ(a) = CI·E(a), which prices
   the recomputation of the uncached history (``pricing=False``, the "w/o Pricing" ablation,
   proposes from the cache-oblivious CI·E_base instead);
3. at a *switch opportunity* — not the session's first turn (k > 0 here, 0-based; the paper's
   k > 1), g ≠ b where b is the deployment of the previous served turn, b still a candidate and
   L(b) > 0 — ask the gate for Â, the predicted carbon (gCO2e) saved by staying on b over this
   and the next turn, and stay on b if Â > δ.

Without a gate, or with δ = +∞ (the "w/o Gate" ablation, the default), the gate is never called
and the policy always follows the proposal. The learned gate (an XGBoost regressor in the paper)
plugs in as any callable ``gate(ctx, cand, g, b) -> float``; see :class:`Gate`.
"""

from __future__ import annotations

import math
from typing import Protocol

from carbonrouter_lib.policies.base import Candidates, Policy, QueryContext

__all__ = ["Gate", "CarbonRouter"]


class Gate(Protocol):
    """The switch gate f_θ: predicted carbon saved by staying, Â, gCO2e.

    Called only at switch opportunities, with the proposal ``g`` and the previous deployment
    ``b`` (both candidates, ``g != b``, ``ctx.cached[b] > 0``). Everything the spec's features
    need that is known at dispatch is in ``ctx`` (tokens, turn, L(b) and N_hist, CI of every
    region, Q(m), free slots per pool, dispatch time) and ``cand`` (estimated energy and carbon of
    every deployment, cache-aware and oblivious); model / GPU / region of a deployment are
    ``ctx.deployments.model[a]`` etc. A gate must not modify ``ctx`` or ``cand`` and must not
    keep references to their arrays (they are reused for the next query). Return a finite float.
    """

    def __call__(self, ctx: QueryContext, cand: Candidates, g: int, b: int) -> float: ...


class CarbonRouter(Policy):
    """CarbonRouter / CCAR (§7.5) and its ablations (§7.6).

    Parameters
    ----------
    delta : float
        Gate threshold δ, gCO2e: stay on b when Â > δ (strict). ``math.inf`` (default) never
        stays: the "w/o Gate" ablation. Not NaN.
    gate : Gate or None
        The gate; None (default) never stays, whatever δ.
    pricing : bool
        True (default): proposal from the cache-aware carbon CI·E. False: from CI·E_base
        (the "w/o Pricing" ablation; its gate should be trained on this proposal).

    Attributes
    ----------
    opportunities, blocked : dict[int, int]
        Per session: switch opportunities met and switches the gate blocked (kept for the whole
        run, for the metrics; sessions with none are absent).
    last_proposal : int
        g of the latest decision.
    last_opportunity : bool
        Whether the latest decision was a switch opportunity.
    last_advantage : float
        Â of the latest decision (NaN when the gate was not called).
    """

    name = "carbonrouter"

    def __init__(
        self, delta: float = math.inf, gate: Gate | None = None, pricing: bool = True
    ) -> None:
        if not (isinstance(delta, int | float) and not math.isnan(delta)):
            raise ValueError(f"CarbonRouter.delta must be a number (gCO2e; inf allowed), "
                             f"got {delta!r}")
        if gate is not None and not callable(gate):
            raise ValueError(f"CarbonRouter.gate must be callable or None, got {gate!r}")
        if not isinstance(pricing, bool):
            raise ValueError(f"CarbonRouter.pricing must be a bool, got {pricing!r}")
        self.delta = float(delta)
        self.gate = gate
        self.pricing = pricing
        # The gate can only block when it exists and δ < +∞; otherwise it is never called
        # (at most one predictor call per query, none in the ablation).
        self._gated = gate is not None and self.delta < math.inf
        self.opportunities: dict[int, int] = {}
        self.blocked: dict[int, int] = {}
        self.last_proposal = -1
        self.last_opportunity = False
        self.last_advantage = math.nan

    def params(self) -> dict:
        gate = None if self.gate is None else getattr(self.gate, "name", repr(self.gate))
        return {"delta": self.delta, "gate": gate, "pricing": self.pricing}

    def propose(self, cand: Candidates) -> int:
        """g: the lowest estimated carbon among the candidates (cache-aware unless
        ``pricing=False``), first index on ties."""
        return cand.argmin(cand.carbon if self.pricing else cand.carbon_base)

    def choose(self, ctx: QueryContext, cand: Candidates) -> int:
        g = self.propose(cand)
        b = ctx.prev
        self.last_proposal = g
        self.last_advantage = math.nan
        self.last_opportunity = bool(
            ctx.turn > 0 and b >= 0 and g != b and cand.mask[b] and ctx.cached[b] > 0
        )
        if not self.last_opportunity:
            return g
        s = ctx.session
        self.opportunities[s] = self.opportunities.get(s, 0) + 1
        if not self._gated:
            return g
        adv = float(self.gate(ctx, cand, g, b))
        if math.isnan(adv):
            raise ValueError(f"CarbonRouter: the gate returned NaN (session {s}, turn "
                             f"{ctx.turn}, g={g}, b={b})")
        self.last_advantage = adv
        if adv > self.delta:
            self.blocked[s] = self.blocked.get(s, 0) + 1
            return b
        return g
