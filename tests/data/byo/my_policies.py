"""A routing policy of one's own, named by import in the examples and tests:
``"my_policies:LowestEnergy"`` with this folder on ``sys.path`` (Dask workers started afterwards
inherit it), or ``"mypackage.my_policies:LowestEnergy"`` once it is in an installed package.

One :class:`~carbonrouter_lib.policies.Policy` subclass with one ``choose`` method over the arrays
of candidates; no registry line is needed.
"""

from __future__ import annotations

from carbonrouter_lib.policies import Candidates, Policy, QueryContext


class LowestEnergy(Policy):
    """Per query, the candidate with the lowest estimated energy E(a) (cache-aware, Eq. 4),
    whatever its region's carbon intensity: carbon-agnostic, without Session-Affinity's binding.
    ``tolerance`` (≥ 0) keeps the previous deployment while its energy is within that share of
    the lowest."""

    name = "lowest-energy"

    def __init__(self, tolerance: float = 0.0) -> None:
        if not tolerance >= 0:
            raise ValueError(f"tolerance must be >= 0, got {tolerance!r}")
        self.tolerance = float(tolerance)

    def params(self) -> dict:
        return {"tolerance": self.tolerance}

    def choose(self, ctx: QueryContext, cand: Candidates) -> int:
        best = cand.argmin(cand.energy)
        prev = ctx.prev
        if prev >= 0 and cand.mask[prev] and (
                cand.energy[prev] <= (1 + self.tolerance) * cand.energy[best]):
            return prev
        return best
