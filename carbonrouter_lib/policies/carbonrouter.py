"""CarbonRouter (CCAR), paper Algorithm 1 (docs/model.md §7.5–6).

Per query:

1. candidates = the shared feasibility step (:func:`~carbonrouter_lib.policies.base.feasibility`);
2. proposal g = argmin over candidates of the *cache-aware* carbon Ĉ(a) = CI·E(a), which prices
   the recomputation of the uncached history (``pricing=False``, the "w/o Pricing" ablation,
   proposes from the cache-oblivious CI·E_base instead);
3. at a *switch opportunity* — not the session's first turn (k > 0 here, 0-based; the paper's
   k > 1), g ≠ b where b is the deployment of the previous served turn, b still a candidate and
   L(b) > 0 — ask the gate for Â, the predicted carbon (gCO2e) saved by staying on b over this
   and the next turn, and stay on b if Â > δ.

The default is the full system: ``gate="learned"`` with δ = 0 — the XGBoost gate of
:mod:`carbonrouter_lib.gate`, trained for the run's setting by whoever runs the policy
(:func:`carbonrouter_lib.build.build_policy`, called by ``experiments.run_policies`` and
``sweep.run_one``, trains it on the replayed workload with conversation-held-out folds and caches
it per setting), whose per-fold threshold δ_f is inside its margin Â − δ_f. Any callable
``gate(ctx, cand, g, b) -> float`` plugs in instead (see :class:`Gate`). Without a gate, or with
δ = +∞, the gate is never called and the policy always follows the proposal: the registry's
``carbonrouter-no-gate`` (:class:`CarbonRouterNoGate`, the "w/o Gate" ablation);
``carbonrouter-no-pricing`` (:class:`CarbonRouterNoPricing`) is the "w/o Pricing" ablation with its
own learned gate.
"""

from __future__ import annotations

import math
from typing import Protocol

from carbonrouter_lib import kernel
from carbonrouter_lib.policies.base import Candidates, Policy, QueryContext

__all__ = ["LEARNED", "ORACLE", "Gate", "CarbonRouter", "CarbonRouterNoGate",
           "CarbonRouterNoPricing", "CarbonRouterOracleGate"]

#: ``gate=LEARNED``: the learned gate of :mod:`carbonrouter_lib.gate`, trained for the setting by
#: the runner before the replay.
LEARNED = "learned"
#: ``gate=ORACLE``: :class:`carbonrouter_lib.gate.OracleGate`, perfect two-turn lookahead (the
#: ceiling for any gate), built by the runner for the replayed workload.
ORACLE = "oracle"
_BUILT_BY_RUNNER = (LEARNED, ORACLE)


class Gate(Protocol):
    """The switch gate f_θ: predicted carbon saved by staying, Â, gCO2e.

    Called only at switch opportunities, with the proposal ``g`` and the previous deployment
    ``b`` (both candidates, ``g != b``, ``ctx.cached[b] > 0``). Everything the spec's features
    need that is known at dispatch is in ``ctx`` (tokens, turn, L(b) and N_hist, CI of every
    region, Q(m), free slots per pool, dispatch time) and ``cand`` (estimated energy and carbon of
    every deployment, cache-aware and oblivious); model / GPU / region of a deployment are
    ``ctx.deployments.model[a]`` etc. A gate must not modify ``ctx`` or ``cand`` and must not
    keep references to their arrays (they are reused for the next query). Return a float, not
    NaN (−∞: never stay).
    """

    def __call__(self, ctx: QueryContext, cand: Candidates, g: int, b: int) -> float: ...


class CarbonRouter(Policy):
    """CarbonRouter / CCAR (§7.5) and its ablations (§7.6).

    Parameters
    ----------
    delta : float
        Gate threshold δ, gCO2e: stay on b when the gate's value > δ (strict). ``math.inf``
        never stays (the "w/o Gate" ablation). Not NaN. Default 0.0: the learned gate returns
        its margin Â − δ_f (its δ_f chosen on validation sessions).
    gate : Gate, "learned" or None
        The gate; ``"learned"`` (default, :data:`LEARNED`) for the learned gate, to be trained
        by the runner (:meth:`set_gate`); None never stays, whatever δ.
    pricing : bool
        True (default): proposal from the cache-aware carbon CI·E. False: from CI·E_base
        (the "w/o Pricing" ablation; its gate is trained on this proposal).
    gate_training : dict or None
        :class:`carbonrouter_lib.gate.GateTrainingConfig` fields for the learned gate (None:
        defaults).

    Attributes
    ----------
    opportunities, blocked : dict[int, int]
        Per session: switch opportunities met and switches the gate blocked (kept for the whole
        run, for the metrics; sessions with none are absent), unless ``keeps_session_counts`` is
        False (a live router's: a session's counts go when it leaves).
    last_proposal : int
        g of the latest decision.
    last_opportunity : bool
        Whether the latest decision was a switch opportunity.
    last_advantage : float
        Â of the latest decision (NaN when the gate was not called).
    """

    name = "carbonrouter"
    #: Whether :attr:`opportunities` and :attr:`blocked` keep a session's counts after it leaves
    #: (a replay's run); the live router sets False, so that its state stays bounded by its live
    #: sessions.
    keeps_session_counts: bool = True

    def __init__(
        self, delta: float = 0.0, gate: Gate | str | None = LEARNED, pricing: bool = True,
        gate_training: dict | None = None,
    ) -> None:
        if not (isinstance(delta, int | float) and not math.isnan(delta)):
            raise ValueError(f"CarbonRouter.delta must be a number (gCO2e; inf allowed), "
                             f"got {delta!r}")
        if gate is not None and gate not in _BUILT_BY_RUNNER and not callable(gate):
            raise ValueError(f"CarbonRouter.gate must be callable, {LEARNED!r}, {ORACLE!r} or "
                             f"None, got {gate!r}")
        if not isinstance(pricing, bool):
            raise ValueError(f"CarbonRouter.pricing must be a bool, got {pricing!r}")
        if gate_training is not None and not isinstance(gate_training, dict):
            raise ValueError(f"CarbonRouter.gate_training must be a dict or None, "
                             f"got {gate_training!r}")
        self.delta = float(delta)
        self.pricing = pricing
        self.gate_training = gate_training
        self.set_gate(gate)
        self.opportunities: dict[int, int] = {}
        self.blocked: dict[int, int] = {}
        self.last_proposal = -1
        self.last_opportunity = False
        self.last_advantage = math.nan

    @property
    def gate_to_build(self) -> str | None:
        """:data:`LEARNED` or :data:`ORACLE` while that gate is still to be built for the
        workload and set (:meth:`set_gate`) before the policy can route; None otherwise (also
        with δ = +∞: the gate would never be called)."""
        return self.gate if isinstance(self.gate, str) and self.delta < math.inf else None

    @property
    def needs_training(self) -> bool:
        """Whether the learned gate is still to be trained (``gate_to_build == LEARNED``)."""
        return self.gate_to_build == LEARNED

    reports_opportunities = True

    def switch_opportunity(self) -> int:
        return self.last_proposal if self.last_opportunity else -1

    def unready(self) -> str | None:
        build = self.gate_to_build
        return None if build is None else f"its {build} gate is not built"

    def set_gate(self, gate: Gate | str | None) -> None:
        """Set the gate (e.g. the trained learned gate)."""
        self.gate = gate
        # The gate can only block when it exists and δ < +∞; otherwise it is never called
        # (at most one predictor call per query, none in the ablation).
        self._gated = gate is not None and self.delta < math.inf

    def params(self) -> dict:
        gate = (self.gate if self.gate is None or isinstance(self.gate, str)
                else getattr(self.gate, "name", repr(self.gate)))
        return {"delta": self.delta, "gate": gate, "pricing": self.pricing,
                "gate_training": self.gate_training}

    def compiled(self, info: kernel.ReplayInfo) -> dict | None:
        """The compiled rule without a gate, or with a gate that compiles itself (the learned
        gate, the oracle gate, the two-branch labeler: ``gate.compiled(conversations)``); None
        for another gate (the Python loop)."""
        if type(self) not in (CarbonRouter, CarbonRouterNoGate, CarbonRouterNoPricing):
            return None
        params = {"pricing": self.pricing, "gated": self._gated, "delta": self.delta}
        if self._gated:
            compile_gate = getattr(self.gate, "compiled", None)
            # a gate that routes next turns by the proposal rule must use this router's pricing
            if compile_gate is None or getattr(self.gate, "pricing", self.pricing) != self.pricing:
                return None
            gate_params = compile_gate(info.conversations)
            if gate_params is None:
                return None
            params.update(gate_params)
        return kernel.rule("carbonrouter", **params)

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
        if isinstance(self.gate, str):
            raise RuntimeError(f"CarbonRouter: the {self.gate} gate has not been built; "
                               f"build.build_policy() builds it (experiments.run_policies and "
                               f"the sweeps call it), or set_gate() a gate")
        adv = float(self.gate(ctx, cand, g, b))
        if math.isnan(adv):
            raise ValueError(f"CarbonRouter: the gate returned NaN (session {s}, turn "
                             f"{ctx.turn}, g={g}, b={b})")
        self.last_advantage = adv
        if adv > self.delta:
            self.blocked[s] = self.blocked.get(s, 0) + 1
            return b
        return g

    def on_session_end(self, session: int) -> None:
        if not self.keeps_session_counts:
            self.opportunities.pop(session, None)
            self.blocked.pop(session, None)


class CarbonRouterNoGate(CarbonRouter):
    """The "w/o Gate" ablation (§7.6): CarbonRouter with δ = +∞ — always the proposal."""

    name = "carbonrouter-no-gate"

    def __init__(self, pricing: bool = True) -> None:
        super().__init__(delta=math.inf, gate=None, pricing=pricing)


class CarbonRouterNoPricing(CarbonRouter):
    """The "w/o Pricing" ablation (§7.6): cache-oblivious proposal (CI·E_base) with its own
    learned gate, trained on this proposal's switch opportunities."""

    name = "carbonrouter-no-pricing"

    def __init__(self, delta: float = 0.0, gate: Gate | str | None = LEARNED,
                 gate_training: dict | None = None) -> None:
        super().__init__(delta=delta, gate=gate, pricing=False, gate_training=gate_training)


class CarbonRouterOracleGate(CarbonRouter):
    """CarbonRouter with the oracle gate (:class:`carbonrouter_lib.gate.OracleGate`): at each
    switch opportunity it stays exactly when the realized two-turn label says staying saves
    carbon — the ceiling of what any gate of this form can add (not an online policy)."""

    name = "carbonrouter-oracle-gate"

    def __init__(self, pricing: bool = True) -> None:
        super().__init__(delta=0.0, gate=ORACLE, pricing=pricing)
