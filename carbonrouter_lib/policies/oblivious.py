"""Cache-oblivious carbon-aware baselines (docs/model.md §7.3–4, §6a.7).

They rank candidates by the carbon of E_base (as if every deployment held the whole history), so
they move freely and pay the recomputation they do not see. Feasibility (including the TTFT bound)
still uses the real L(a) (§6a.1).

- :class:`FairCarbon`: per query, the lowest E_base carbon over all candidates (the fairness term
  of the original is omitted: the traces have no user groups).
- :class:`GARDagger` (GAR†): per query, the lowest E_base carbon among the candidates in the
  session's home region; if it has none, the FairCarbon rule.
"""

from __future__ import annotations

import numpy as np

from carbonrouter_lib import kernel
from carbonrouter_lib.policies.base import Candidates, Policy, QueryContext

__all__ = ["FairCarbon", "GARDagger"]


class FairCarbon(Policy):
    """FairCarbon (§7.4): argmin over candidates of CI·E_base (first index on ties)."""

    name = "faircarbon"

    def choose(self, ctx: QueryContext, cand: Candidates) -> int:
        return cand.argmin(cand.carbon_base)

    def compiled(self, info: kernel.ReplayInfo) -> dict | None:
        return kernel.rule(self.name) if type(self) is FairCarbon else None


#: GARDagger.draw_regions' memo: (seed, regions) → the draw of each session id (−1: not drawn
#: yet), for ids below _MEMO_IDS (one byte each).
_DRAWS: dict[tuple[int, int], np.ndarray] = {}
_MEMO_IDS = 1 << 28
#: Fresh draws from which the memo is also saved to the disk cache (each costs ~20 µs; below
#: this, reading and writing the entry would cost more than drawing again).
_SAVE_FROM = 20_000


class GARDagger(Policy):
    """GAR† (§7.3, §6a.7): the greenest model and GPU within one home region per session.

    Parameters
    ----------
    seed : int
        Seed of the home-region draw, ≥ 0. Session s draws its region uniformly from
        ``numpy.random.default_rng((seed, s))``, so the draw does not depend on the order in which
        sessions arrive or on other policies' runs.

    Notes
    -----
    The home region is fixed at the session's first turn (:meth:`on_session_start`, which the
    simulator calls at k = 0 whether or not the turn is then served): the drawn region if any of
    its pools has a free slot, else the region with the most free slots in total (first in region
    order on ties). If the hook was not called, the region is fixed at the session's first
    decision instead, with the free slots seen then.
    """

    name = "gar"

    def __init__(self, seed: int = 0) -> None:
        if not (isinstance(seed, int | np.integer) and seed >= 0):
            raise ValueError(f"GARDagger.seed must be an integer >= 0, got {seed!r}")
        self.seed = int(seed)
        self.home: dict[int, int] = {}

    def params(self) -> dict:
        return {"seed": self.seed}

    def draw_region(self, session: int, n_regions: int) -> int:
        """The uniformly drawn (not yet capacity-checked) region of ``session``."""
        if session < 0:
            raise ValueError(f"GARDagger needs session ids >= 0 to seed its draw, got {session}")
        return int(np.random.default_rng((self.seed, session)).integers(n_regions))

    def on_session_start(self, ctx: QueryContext) -> None:
        n_r = len(ctx.deployments.regions)
        r = self.draw_region(ctx.session, n_r)
        free = ctx.free_slots.reshape(n_r, -1).sum(axis=1)  # pool = region·n_gpus + gpu
        self.home[ctx.session] = r if free[r] > 0 else int(free.argmax())

    def home_region(self, ctx: QueryContext) -> int:
        """The session's home region (fixed now if it was not yet)."""
        r = self.home.get(ctx.session)
        if r is None:
            self.on_session_start(ctx)
            r = self.home[ctx.session]
        return r

    def choose(self, ctx: QueryContext, cand: Candidates) -> int:
        r = self.home_region(ctx)
        block = ctx.n // len(ctx.deployments.regions)  # a region's deployments are contiguous
        a = cand.argmin_in(cand.carbon_base, r * block, (r + 1) * block)
        return a if a >= 0 else cand.argmin(cand.carbon_base)

    def on_session_end(self, session: int) -> None:
        self.home.pop(session, None)

    def draw_regions(self, sessions: np.ndarray, n_regions: int) -> np.ndarray:
        """:meth:`draw_region` of every session in ``sessions`` (int64). A draw costs about
        20 µs (a generator seeded per session), and a service-scale replay has millions of
        sessions; the draws never change, so they are kept for ids below :data:`_MEMO_IDS`: in
        this process (every later run of the workload — another setting, memory rule or region
        set with as many regions — reuses them) and in the disk cache (:func:`_draws_entry`),
        where the next process, e.g. another sweep's worker, finds them."""
        ids = np.asarray(sessions, dtype=np.int64)
        if ids.size and ids.min() < 0:
            raise ValueError(f"GARDagger needs session ids >= 0 to seed its draw, got "
                             f"{int(ids.min())}")
        if ids.size == 0 or ids.max() >= _MEMO_IDS or n_regions > np.iinfo(np.int8).max:
            return np.array([self.draw_region(int(s), n_regions) for s in ids], np.int64)
        key = (self.seed, n_regions)
        known = _DRAWS.get(key, np.empty(0, np.int8))
        if len(known) <= ids.max() or (known[ids] < 0).any():
            stored = _load_draws(self.seed, n_regions)
            if stored is not None and len(stored) > len(known):
                head = stored[:len(known)]
                stored[:len(known)] = np.where(known >= 0, known, head)
                known = stored
        if len(known) <= ids.max():
            known = np.concatenate([known, np.full(int(ids.max()) + 1 - len(known), -1, np.int8)])
        _DRAWS[key] = known
        missing = np.unique(ids[known[ids] < 0]).tolist()
        for s in missing:
            known[s] = self.draw_region(s, n_regions)
        if len(missing) >= _SAVE_FROM:
            _draws_entry(self.seed, n_regions).save(known)
        return known[ids].astype(np.int64)

    def compiled(self, info: kernel.ReplayInfo) -> dict | None:
        if type(self) is not GARDagger:
            return None
        return kernel.rule(self.name, home_draw=self.draw_regions(info.sessions, info.n_regions))


def _draws_entry(seed: int, n_regions: int):
    """The disk-cache entry of GAR†'s home draws for ``(seed, n_regions)``: an int8 array over
    session ids (−1: not drawn yet). Its key holds numpy's version and the source of
    :meth:`GARDagger.draw_region`, which define the draws."""
    import inspect

    from carbonrouter_lib import cache

    params = {"seed": seed, "n_regions": n_regions, "numpy": np.__version__,
              "draw": inspect.getsource(GARDagger.draw_region)}
    return cache.entry("gar_draws", params, fmt="joblib")


def _load_draws(seed: int, n_regions: int) -> np.ndarray | None:
    """The draws stored by :func:`_draws_entry` (a writable copy), or None."""
    hit = _draws_entry(seed, n_regions).load()
    if hit is None:
        return None
    draws = np.asarray(hit[0])
    if draws.dtype != np.int8 or draws.ndim != 1:
        return None
    return draws.copy()
