"""The emulated geo-distributed backend: session slots, KV pools and caches (spec §6, §6a.3–4).

The simulator owns time; the backend owns capacity and caches. Per query of session ``s``
dispatched at time ``d`` the simulator calls :meth:`Backend.advance`, reads
:meth:`Backend.cached_tokens` (L(a) for every deployment), :meth:`Backend.available` and
:meth:`Backend.free_slots`, lets a policy choose ``a``, then calls :meth:`Backend.dispatch`; at
the turn's completion ``f`` it calls :meth:`Backend.complete` and, after the session's last turn,
:meth:`Backend.depart`.

Model (spec §6a.3–4)
--------------------
- A *pool* is a (region, GPU type). It has ``slots_per_pool`` session slots and
  ``kv_tokens_per_pool`` tokens of KV memory, shared by every model on that GPU type there.
- A session holds at most one slot: the pool of its latest dispatched turn. Dispatching it to
  another pool takes a slot there and releases the old one; :meth:`Backend.depart` releases it.
- A *cache* belongs to (session, deployment) and holds a prefix of the conversation, in tokens
  of that deployment's model. Dispatch sets it to the turn's post-turn context (reusing and
  extending the old prefix, or truncating it when the new context is shorter, e.g. after a
  branch) and *pins* it; :meth:`Backend.complete` unpins it (*idle*) and sets its last use
  ``f_last`` to the completion time. A cache survives the session moving elsewhere.
- Expiry: an idle cache is removed once ``now > f_last + ttl_s`` (strictly greater).
- Eviction: when a dispatch needs more tokens than its pool has free, exactly the missing tokens
  are freed from the pool's idle caches, token by token from each victim's suffix (a prefix
  stays usable), victims in the order: caches of departed sessions first, then the others; in
  each group least recently used first (smallest ``f_last``), exact ties by smaller session id,
  then smaller deployment index (a rule that does not depend on the order of calls). A cache
  trimmed to 0 tokens is removed.

Decisions where the spec is silent
----------------------------------
- *KV overflow*: when even evicting every idle cache of the pool does not free enough (pinned
  caches of running turns fill it, or the context exceeds the pool), every idle cache of the pool
  is evicted and the new cache stores the prefix that fits; the event and the tokens not stored
  are counted (``kv_overflow_events``, ``kv_overflow_tokens``). The turn still runs (capacity in
  *sessions* is the slot limit; KV memory only limits what stays cached), so pool usage never
  exceeds the pool's capacity.
- The pool's capacity in tokens is ``floor(kv_tokens_per_pool)`` (caches hold whole tokens).
- A session may not be dispatched while one of its turns is running, nor after it departed, nor
  to a deployment that is not available; these are simulator bugs and raise ``ValueError``.

Cost: :meth:`~Backend.cached_tokens` and :meth:`~Backend.available` are O(caches of the session)
plus one O(n) array fill; dispatch/complete/depart are O(log #caches) amortized plus the victims
they evict. Eviction order and expiry use heaps with lazy invalidation (each cache carries a
version number; stale heap entries are skipped when they surface), so memory grows with the
number of operations of one replay, not with time.
"""

from __future__ import annotations

import heapq
import math
import operator
from dataclasses import asdict, dataclass
from typing import NamedTuple

import numpy as np

from carbonrouter_lib.deployments import Deployments

__all__ = ["BackendConfig", "capacity_from_trace", "CacheView", "Backend"]


@dataclass(frozen=True)
class BackendConfig:
    """Capacity of every (region, GPU type) pool and the cache TTL (spec §6, §6a.3–4).

    Parameters
    ----------
    slots_per_pool : int
        Sessions one (region, GPU type) can hold at once, ≥ 1 (the region's K = c·P split over
        its GPU types; see :func:`capacity_from_trace`).
    kv_tokens_per_pool : float
        KV-cache memory of one pool, tokens (any model's tokens), > 0 and finite (K·C̄ split like
        the slots). The backend uses ``floor`` of it.
    ttl_s : float
        T_TTL: an idle cache is removed when ``now > f_last + ttl_s``, s. > 0; ``math.inf``
        disables expiry. Default 1,800 s (30 min, spec §6).
    """

    slots_per_pool: int
    kv_tokens_per_pool: float
    ttl_s: float = 1800.0

    def __post_init__(self) -> None:
        s = self.slots_per_pool
        if isinstance(s, bool) or not isinstance(s, int | np.integer) or s < 1:
            raise ValueError(f"BackendConfig.slots_per_pool must be an integer ≥ 1 sessions, "
                             f"got {s!r}")
        object.__setattr__(self, "slots_per_pool", int(s))
        kv = self.kv_tokens_per_pool
        if isinstance(kv, bool) or not isinstance(kv, int | float | np.number) or not (
            math.isfinite(kv) and kv > 0
        ):
            raise ValueError(f"BackendConfig.kv_tokens_per_pool must be a finite number > 0 "
                             f"tokens, got {kv!r}")
        object.__setattr__(self, "kv_tokens_per_pool", float(kv))
        ttl = self.ttl_s
        if isinstance(ttl, bool) or not isinstance(ttl, int | float | np.number) or not (
            ttl > 0  # NaN fails this too; +inf is allowed (no expiry)
        ):
            raise ValueError(f"BackendConfig.ttl_s must be a number > 0 s (inf allowed), "
                             f"got {ttl!r}")
        object.__setattr__(self, "ttl_s", float(ttl))

    @property
    def kv_capacity_tokens(self) -> int:
        """Whole tokens of KV memory per pool, ``floor(kv_tokens_per_pool)``."""
        return math.floor(self.kv_tokens_per_pool)

    def to_dict(self) -> dict:
        """The parameters as a JSON-serializable dict (stored with results)."""
        return asdict(self)


def capacity_from_trace(
    peak_sessions: int,
    mean_context_tokens: float,
    c: float = 0.5,
    n_gpu_types: int = 3,
    ttl_s: float = 1800.0,
) -> BackendConfig:
    """The paper's capacity rule (spec §6): K = c·P sessions and K·C̄ KV tokens per region.

    Parameters
    ----------
    peak_sessions : int
        P, the peak number of simultaneously active sessions of the trace (a session is active
        from its first arrival to its last completion), ≥ 1.
    mean_context_tokens : float
        C̄, the mean query context (history + new input tokens) of the trace, tokens, > 0.
    c : float
        Capacity factor, > 0. Default 0.5 (total capacity over 4 regions = 2 × peak demand).
    n_gpu_types : int
        GPU types per region that share the region's capacity equally, ≥ 1. Default 3.
    ttl_s : float
        Cache TTL, s (see :class:`BackendConfig`).

    Returns
    -------
    BackendConfig
        ``slots_per_pool = ceil(c·P / n_gpu_types)`` — rounded *up* so that no pool has zero
        slots and the total never falls below c·P per region (a value within 1e-9 of an integer
        counts as that integer, so float noise in c·P does not add a slot);
        ``kv_tokens_per_pool = c·P·C̄ / n_gpu_types`` exactly (not rounded with the slots: the
        paper gives the region K·C̄ tokens).
    """
    if isinstance(peak_sessions, bool) or not isinstance(peak_sessions, int | np.integer) or (
        peak_sessions < 1
    ):
        raise ValueError(f"peak_sessions must be an integer ≥ 1, got {peak_sessions!r}")
    if not (math.isfinite(mean_context_tokens) and mean_context_tokens > 0):
        raise ValueError(f"mean_context_tokens must be finite and > 0 tokens, "
                         f"got {mean_context_tokens!r}")
    if not (math.isfinite(c) and c > 0):
        raise ValueError(f"capacity factor c must be finite and > 0, got {c!r}")
    if isinstance(n_gpu_types, bool) or not isinstance(n_gpu_types, int) or n_gpu_types < 1:
        raise ValueError(f"n_gpu_types must be an integer ≥ 1, got {n_gpu_types!r}")
    per_pool = c * int(peak_sessions) / n_gpu_types
    nearest = round(per_pool)
    slots = nearest if abs(per_pool - nearest) <= 1e-9 else math.ceil(per_pool)
    return BackendConfig(
        slots_per_pool=max(1, int(slots)),
        kv_tokens_per_pool=per_pool * float(mean_context_tokens),
        ttl_s=ttl_s,
    )


def _index_of(members: np.ndarray) -> slice | np.ndarray:
    """A slice for a contiguous run of indices (cheaper to assign through), else the indices."""
    if members.size and np.array_equal(members, np.arange(members[0], members[-1] + 1)):
        return slice(int(members[0]), int(members[-1]) + 1)
    return members


class CacheView(NamedTuple):
    """Read-only snapshot of one cache: its length (tokens), last use (s) and pin state."""

    tokens: int
    f_last: float
    pinned: bool


class _Cache:
    """One (session, deployment) cache. ``version`` invalidates its stale heap entries."""

    __slots__ = ("tokens", "f_last", "pinned", "version")

    def __init__(self, tokens: int, f_last: float, pinned: bool, version: int) -> None:
        self.tokens = tokens
        self.f_last = f_last
        self.pinned = pinned
        self.version = version


class Backend:
    """Slots, KV pools and caches of all deployments (spec §6, §6a.3–4); see the module doc.

    Parameters
    ----------
    deployments : Deployments
        The deployments; ``deployments.pool`` maps each to its (region, GPU type) pool.
    config : BackendConfig
        Slots and KV tokens per pool, and the TTL.

    Notes
    -----
    Sessions are integers (any ids). Times are float seconds and never go backwards:
    :meth:`advance` (called by every mutating method too) raises on an earlier time.
    """

    def __init__(self, deployments: Deployments, config: BackendConfig) -> None:
        if not isinstance(config, BackendConfig):
            raise TypeError(f"config must be a BackendConfig, got {type(config).__name__}")
        self.deployments = deployments
        self.config = config
        self._n = deployments.n
        self._n_pools = deployments.n_pools
        self._pool_of = [int(p) for p in deployments.pool]  # list: fast scalar lookups
        self._pool_arr = np.asarray(deployments.pool, dtype=np.int64)
        self._slots = config.slots_per_pool
        self._kv_cap = config.kv_capacity_tokens
        self._ttl = config.ttl_s
        self._now = -math.inf
        self._version = 0
        # state
        self._caches: dict[int, dict[int, _Cache]] = {}  # session → deployment → cache
        self._running: dict[int, int] = {}  # session → deployment of its running turn
        self._holder: dict[int, int] = {}  # session → pool whose slot it holds
        self._departed: set[int] = set()
        # Free slots per pool and, per deployment, whether its pool has one: kept up to date on
        # every slot change so that the per-query reads are one copy each.
        self._free = np.full(self._n_pools, self._slots, dtype=np.int64)
        self._open = np.ones(self._n, dtype=bool)
        self._deps_of_pool = [_index_of(np.flatnonzero(self._pool_arr == p))
                              for p in range(self._n_pools)]
        self._used = [0] * self._n_pools  # KV tokens in use per pool
        # eviction order per pool: heaps of (f_last, session, deployment, version)
        self._lru_departed: list[list[tuple]] = [[] for _ in range(self._n_pools)]
        self._lru_live: list[list[tuple]] = [[] for _ in range(self._n_pools)]
        # expiry: heap of (f_last + ttl, session, deployment, version)
        self._expiry: list[tuple] = []
        # counters
        self._c = dict.fromkeys(
            ("evicted_tokens", "evicted_caches", "expired_tokens", "expired_caches",
             "kv_overflow_events", "kv_overflow_tokens", "dispatches"), 0)

    # -----------------------------------------------------------------------------------------
    # time

    @property
    def now(self) -> float:
        """The latest time the backend was advanced to, s (-inf before the first call)."""
        return self._now

    def advance(self, now: float) -> None:
        """Move the clock to ``now`` (s) and remove idle caches with ``now > f_last + ttl``.

        Idempotent for an equal time; raises ``ValueError`` if ``now`` is earlier than the
        latest time seen or not finite. Pinned caches never expire.
        """
        now = float(now)
        if not math.isfinite(now):
            raise ValueError(f"time must be finite, got {now!r}")
        if now < self._now:
            raise ValueError(f"time went backwards: {now!r} s < {self._now!r} s")
        self._now = now
        heap = self._expiry
        while heap and heap[0][0] < now:
            _, s, a, ver = heapq.heappop(heap)
            rec = self._valid(s, a, ver)
            if rec is None:
                continue  # stale entry: the cache was reused, moved, evicted or removed
            self._c["expired_caches"] += 1
            self._c["expired_tokens"] += rec.tokens
            self._remove(s, a, rec)

    # -----------------------------------------------------------------------------------------
    # queries (what the router sees)

    def cached_tokens(self, session: int) -> np.ndarray:
        """L(a) for every deployment: tokens of ``session``'s cache there (0 where none).

        Returns an int64 array of shape (n,). The router clips it to N_hist itself.
        """
        out = np.zeros(self._n, dtype=np.int64)
        caches = self._caches.get(session)
        if caches:
            for a, rec in caches.items():
                out[a] = rec.tokens
        return out

    def available(self, session: int) -> np.ndarray:
        """Bool (n,): the deployment's pool holds ``session``'s slot or has a free slot."""
        ok = self._open.copy()
        held = self._holder.get(session)
        if held is not None:
            ok[self._deps_of_pool[held]] = True
        return ok

    def free_slots(self) -> np.ndarray:
        """Free slots per pool, int64 (n_pools,); a pool holding a session counts it as taken."""
        return self._free.copy()

    # -----------------------------------------------------------------------------------------
    # events

    def dispatch(self, session: int, a: int, now: float, context_tokens: int) -> None:
        """Start a turn of ``session`` on deployment ``a`` at ``now`` (s).

        Takes ``a``'s pool slot (releasing the session's old slot) unless the session holds it;
        sets the session's cache at ``a`` to ``context_tokens`` tokens (the post-turn context
        N_hist + N_new + N_out in ``a``'s model tokens: the old prefix is reused and extended,
        or truncated if longer) and pins it. Evicts idle caches of the pool if needed; if even
        that is not enough, stores the prefix that fits and counts a KV overflow.

        Raises ``ValueError`` if the deployment is unavailable to the session, the session has
        a turn running or has departed, or an argument is invalid.
        """
        s = operator.index(session)
        a = operator.index(a)
        ctx = operator.index(context_tokens)
        if not 0 <= a < self._n:
            raise ValueError(f"deployment {a} out of range [0, {self._n})")
        if ctx < 0:
            raise ValueError(f"context_tokens must be ≥ 0, got {ctx}")
        if s in self._departed:
            raise ValueError(f"session {s} has departed")
        if s in self._running:
            raise ValueError(f"session {s} already has a turn running on deployment "
                             f"{self._running[s]}")
        if now != self._now:  # advancing to the current time is a no-op
            self.advance(now)
        p = self._pool_of[a]
        old = self._holder.get(s)
        if old != p:
            if self._free[p] <= 0:
                raise ValueError(f"deployment {a} (pool {p}) is not available to session {s}: "
                                 f"no free slot")
            if old is not None:
                self._add_free(old, 1)
            self._add_free(p, -1)
            self._holder[s] = p
        self._version += 1  # a new version takes the cache out of the eviction and expiry heaps
        caches = self._caches.get(s)
        if caches is None:
            caches = self._caches[s] = {}
        rec = caches.get(a)
        if rec is None:
            rec = caches[a] = _Cache(0, self._now, True, self._version)
        else:
            rec.pinned = True
            rec.version = self._version
        self._running[s] = a
        self._c["dispatches"] += 1
        delta = ctx - rec.tokens
        if delta > 0:
            missing = delta - (self._kv_cap - self._used[p])
            if missing > 0:
                freed = self._evict(p, missing)
                if freed < missing:
                    self._c["kv_overflow_events"] += 1
                    self._c["kv_overflow_tokens"] += missing - freed
                    delta -= missing - freed
        rec.tokens += delta
        self._used[p] += delta

    def correct(self, session: int, a: int, context_tokens: int, now: float) -> None:
        """Set the cache of ``session``'s running turn on ``a`` to ``context_tokens`` at ``now``
        (s); the turn keeps running.

        For a router that cannot know the realized output at dispatch (the proxy of
        :mod:`carbonrouter_lib.serve`): it dispatches the *estimated* post-turn context and
        corrects it to the realized one when the response ends (or, after a failed request, back
        to the cache's length before the turn). It is the turn completing and the same turn
        dispatched again at once with ``context_tokens``: growing evicts idle caches of the
        pool as :meth:`dispatch` does (KV overflow counted), shrinking truncates; the slot and
        the ``dispatches`` count do not change. Raises ``ValueError`` if no turn of the session
        is running on ``a`` or ``context_tokens`` < 0.
        """
        s = operator.index(session)
        if self.running(s) != operator.index(a):
            raise ValueError(f"session {s} has no turn running on deployment {a}")
        if operator.index(context_tokens) < 0:
            raise ValueError(f"context_tokens must be ≥ 0, got {context_tokens}")
        self.complete(s, a, now)
        self.dispatch(s, a, now, context_tokens)
        self._c["dispatches"] -= 1

    def complete(self, session: int, a: int, now: float) -> None:
        """The turn of ``session`` on ``a`` completes at ``now`` (s): its cache becomes idle
        with ``f_last = now`` (removed at once if it holds 0 tokens)."""
        s = operator.index(session)
        a = operator.index(a)
        if self._running.get(s) != a:
            raise ValueError(f"session {s} has no turn running on deployment {a}")
        if now != self._now:  # advancing to the current time is a no-op
            self.advance(now)
        del self._running[s]
        rec = self._caches[s][a]
        rec.pinned = False
        rec.f_last = self._now
        self._version += 1
        rec.version = self._version
        if rec.tokens == 0:
            self._remove(s, a, rec)
        else:
            self._push(s, a, rec)

    def depart(self, session: int, now: float) -> None:
        """``session`` leaves at ``now`` (s): its slot is released; its caches stay, idle, and
        are evicted before those of live sessions."""
        s = operator.index(session)
        if s in self._running:
            raise ValueError(f"session {s} cannot depart with a turn running on deployment "
                             f"{self._running[s]}")
        if s in self._departed:
            raise ValueError(f"session {s} has already departed")
        if now != self._now:  # advancing to the current time is a no-op
            self.advance(now)
        self._departed.add(s)
        p = self._holder.pop(s, None)
        if p is not None:
            self._add_free(p, 1)
        for a, rec in self._caches.get(s, {}).items():
            rec.version = self._bump()
            self._push(s, a, rec)  # into the departed heap (and a fresh expiry entry)

    # -----------------------------------------------------------------------------------------
    # inspection (tests, metrics, gate features)

    @property
    def kv_capacity_tokens(self) -> int:
        """KV memory of each pool, whole tokens."""
        return self._kv_cap

    def pool_used_tokens(self) -> np.ndarray:
        """KV tokens held by caches, per pool, int64 (n_pools,)."""
        return np.array(self._used, dtype=np.int64)

    def slot_holder(self, session: int) -> int:
        """The pool whose slot ``session`` holds, or -1."""
        return self._holder.get(session, -1)

    def running(self, session: int) -> int:
        """The deployment of ``session``'s running turn, or -1."""
        return self._running.get(session, -1)

    def has_departed(self, session: int) -> bool:
        """Whether ``session`` has departed."""
        return session in self._departed

    def cache_length(self, session: int, a: int) -> int:
        """Tokens of ``session``'s cache at deployment ``a`` (0 where none)."""
        rec = self._caches.get(session, {}).get(a)
        return 0 if rec is None else rec.tokens

    def cache(self, session: int, a: int) -> CacheView | None:
        """Snapshot of ``session``'s cache at ``a``, or None."""
        rec = self._caches.get(session, {}).get(a)
        return None if rec is None else CacheView(rec.tokens, rec.f_last, rec.pinned)

    def session_caches(self, session: int) -> dict[int, int]:
        """``{deployment: tokens}`` of every cache of ``session``."""
        return {a: rec.tokens for a, rec in self._caches.get(session, {}).items()}

    @property
    def n_caches(self) -> int:
        """Number of caches present."""
        return sum(len(c) for c in self._caches.values())

    def counters(self) -> dict[str, int]:
        """Event counts so far: ``evicted_tokens``, ``evicted_caches`` (removed by eviction),
        ``expired_tokens``, ``expired_caches``, ``kv_overflow_events``, ``kv_overflow_tokens``
        (tokens of dispatched contexts that could not be stored), ``dispatches``."""
        return dict(self._c)

    def copy(self) -> Backend:
        """An independent copy of the state (e.g. for a two-branch replay of a session)."""
        new = object.__new__(Backend)
        new.__dict__.update(self.__dict__)
        new._caches = {
            s: {a: _Cache(r.tokens, r.f_last, r.pinned, r.version) for a, r in c.items()}
            for s, c in self._caches.items()
        }
        new._running = dict(self._running)
        new._holder = dict(self._holder)
        new._departed = set(self._departed)
        new._free = self._free.copy()
        new._open = self._open.copy()
        new._used = list(self._used)
        new._lru_departed = [list(h) for h in self._lru_departed]
        new._lru_live = [list(h) for h in self._lru_live]
        new._expiry = list(self._expiry)
        new._c = dict(self._c)
        return new

    # -----------------------------------------------------------------------------------------
    # internals

    def _add_free(self, p: int, delta: int) -> None:
        free = self._free[p] + delta
        self._free[p] = free
        self._open[self._deps_of_pool[p]] = free > 0

    def _bump(self) -> int:
        # Versions are global, so a removed and re-created cache never matches an old entry.
        self._version += 1
        return self._version

    def _valid(self, s: int, a: int, ver: int) -> _Cache | None:
        caches = self._caches.get(s)
        rec = None if caches is None else caches.get(a)
        if rec is None or rec.version != ver or rec.pinned:
            return None
        return rec

    def _push(self, s: int, a: int, rec: _Cache) -> None:
        p = self._pool_of[a]
        heap = self._lru_departed[p] if s in self._departed else self._lru_live[p]
        heapq.heappush(heap, (rec.f_last, s, a, rec.version))
        heapq.heappush(self._expiry, (rec.f_last + self._ttl, s, a, rec.version))

    def _remove(self, s: int, a: int, rec: _Cache) -> None:
        self._used[self._pool_of[a]] -= rec.tokens
        caches = self._caches[s]
        del caches[a]
        if not caches:
            del self._caches[s]

    def _evict(self, p: int, missing: int) -> int:
        """Free up to ``missing`` tokens from idle caches of pool ``p``; return tokens freed."""
        freed = removed = 0
        all_caches = self._caches
        for heap in (self._lru_departed[p], self._lru_live[p]):
            while freed < missing and heap:
                _, s, a, ver = heap[0]
                caches = all_caches.get(s)
                rec = None if caches is None else caches.get(a)
                if rec is None or rec.version != ver or rec.pinned:  # stale (see _valid)
                    heapq.heappop(heap)
                    continue
                take = min(rec.tokens, missing - freed)
                rec.tokens -= take  # trim the suffix; the prefix stays usable
                freed += take
                if rec.tokens == 0:
                    heapq.heappop(heap)
                    removed += 1
                    self._remove(s, a, rec)
            if freed >= missing:
                break
        self._used[p] -= freed
        self._c["evicted_tokens"] += freed
        self._c["evicted_caches"] += removed
        return freed
