"""Cache-aware baselines that bind a session to one deployment (docs/model.md §7.1–2, §6a.5–6).

- :class:`SessionAffinity` (carbon-agnostic; the reference = 1 in every table): keeps the bound
  deployment while it is a candidate; (re)binds to the lowest cache-aware estimated energy, ties
  by most free slots of the candidate's (region, GPU) pool, then index (region) order.
- :class:`CarbonAffinity`: (re)binds to the lowest cache-aware estimated carbon; keeps the
  binding while it holds a cache (L(b) > 0, a partial one counts) and is a candidate.

Both serve every turn on their binding, so the binding is the session's previous serving
deployment ``ctx.prev`` (rejected turns leave it unchanged); they need no per-session state.
"""

from __future__ import annotations

import numpy as np

from carbonrouter_lib import kernel
from carbonrouter_lib.policies.base import Candidates, Policy, QueryContext

__all__ = ["SessionAffinity", "CarbonAffinity"]


class SessionAffinity(Policy):
    """Session-Affinity (§7.1, §6a.5): stay while feasible, (re)bind by energy."""

    name = "session-affinity"

    def choose(self, ctx: QueryContext, cand: Candidates) -> int:
        b = ctx.prev
        if b >= 0 and cand.mask[b]:
            return b
        return self.bind(ctx, cand)

    def compiled(self, info: kernel.ReplayInfo) -> dict | None:
        return kernel.rule(self.name) if type(self) is SessionAffinity else None

    @staticmethod
    def bind(ctx: QueryContext, cand: Candidates) -> int:
        """Lowest estimated energy E(a) (cache-aware, kWh); among exact ties the most free slots
        of the candidate's pool (the backend counts the session's own slot as taken), then the
        lowest index (region order, §6a.9)."""
        a = cand.argmin(cand.energy)
        tied = cand.mask & (cand.energy == cand.energy[a])
        if np.count_nonzero(tied) > 1:
            slots = np.where(tied, ctx.free_slots[ctx.deployments.pool], -1)
            a = int(slots.argmax())  # first maximum: lowest index among the most free slots
        return a


class CarbonAffinity(Policy):
    """Carbon-Affinity (§7.2, §6a.6): stay while cached and feasible, (re)bind by carbon."""

    name = "carbon-affinity"

    def choose(self, ctx: QueryContext, cand: Candidates) -> int:
        b = ctx.prev
        if b >= 0 and ctx.cached[b] > 0 and cand.mask[b]:
            return b
        return cand.argmin(cand.carbon)

    def compiled(self, info: kernel.ReplayInfo) -> dict | None:
        return kernel.rule(self.name) if type(self) is CarbonAffinity else None
