"""The emulated geo-distributed backend: slots, KV pools and caches (docs/model.md §6, §6a.3–4).

The simulator owns time; the backend owns capacity and caches. Per query of session ``s``
dispatched at time ``d`` the simulator calls :meth:`Backend.advance`, reads
:meth:`Backend.cached_tokens` (L(a) for every deployment), :meth:`Backend.available` and
:meth:`Backend.free_slots`, lets a policy choose ``a``, then calls :meth:`Backend.dispatch`; at
the turn's completion ``f`` it calls :meth:`Backend.complete` and, after the session's last turn,
:meth:`Backend.depart`.

Model (docs/model.md §6a.3–4)
--------------------
- A *pool* is a (region, GPU type). It has ``slots_per_pool`` session slots and, under the
  paper's rule, ``kv_tokens_per_pool`` tokens of KV memory, shared by every model on that GPU
  type there. Under a per-deployment rule (``kv_tokens_per_deployment``, e.g. the hardware rule
  of :func:`carbonrouter_lib.setting.backend_config`) each deployment's instances hold their own
  KV memory, in their model's tokens: the *KV pool* of a deployment is then the deployment
  itself. Slots are
  per (region, GPU type) either way; eviction competes only within a KV pool.
- A session holds at most one slot: the pool of its latest dispatched turn. Dispatching it to
  another pool takes a slot there and releases the old one; :meth:`Backend.depart` releases it.
- A *cache* belongs to (session, deployment) and holds a prefix of the conversation, in tokens
  of that deployment's model. Dispatch sets it to the turn's post-turn context (reusing and
  extending the old prefix, or truncating it when the new context is shorter, e.g. after a
  branch) and *pins* it; :meth:`Backend.complete` unpins it (*idle*) and sets its last use
  ``f_last`` to the completion time. A cache survives the session moving elsewhere.
- Expiry: an idle cache is removed once ``now > f_last + ttl_s`` (strictly greater).
- Eviction: when a dispatch needs more tokens than its KV pool has free, exactly the missing
  tokens are freed from the KV pool's idle caches, token by token from each victim's suffix (a
  prefix stays usable), victims in the order: caches of departed sessions first, then the others; in
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
plus one O(n) array fill; dispatch/complete are O(1) amortized plus the victims they evict, depart
O(log #caches) per cache of the session. Idle caches become idle in time order (a completion
never precedes an earlier one), so the LRU order of the live caches of a KV pool and the expiry
order are queues appended at completion (an exact tie in ``f_last`` is inserted in (session,
deployment) order at the queue's tail); caches of departed sessions, which leave the live order
out of turn, go to a heap per KV pool. Entries are invalidated lazily (each cache carries a
version number; stale entries are skipped when they surface).
"""

from __future__ import annotations

import array
import heapq
import math
import operator
from collections import deque
from dataclasses import asdict, dataclass
from typing import NamedTuple

import numpy as np

from carbonrouter_lib.deployments import Deployments
from carbonrouter_lib.paper import DEFAULTS

__all__ = ["BackendConfig", "CacheView", "Backend"]


@dataclass(frozen=True)
class BackendConfig:
    """Capacity of every (region, GPU type) pool and the cache TTL (docs/model.md §6, §6a.3–4).

    Parameters
    ----------
    slots_per_pool : int
        Sessions one (region, GPU type) can hold at once, ≥ 1 (the region's K = c·P split over
        its GPU types; see :func:`carbonrouter_lib.setting.capacity_from_trace`).
    kv_tokens_per_pool : float or None
        KV-cache memory of one (region, GPU type) pool shared by its models, tokens (any model's
        tokens), > 0 and finite (the paper's rule: K·C̄ split like the slots). The backend uses
        ``floor`` of it. None when ``kv_tokens_per_deployment`` is given.
    ttl_s : float
        T_TTL: an idle cache is removed when ``now > f_last + ttl_s``, s. > 0; ``math.inf``
        disables expiry. Default 1,800 s (30 min, docs/model.md §6).
    kv_tokens_per_deployment : tuple of float or None
        KV memory of every deployment's own instances, in its model's tokens (deployment index
        order), each > 0 and finite; the backend uses ``floor`` of each. Given instead of
        ``kv_tokens_per_pool`` (exactly one of the two).
    """

    slots_per_pool: int
    kv_tokens_per_pool: float | None
    ttl_s: float = DEFAULTS["ttl_s"]
    kv_tokens_per_deployment: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        s = self.slots_per_pool
        if isinstance(s, bool) or not isinstance(s, int | np.integer) or s < 1:
            raise ValueError(f"BackendConfig.slots_per_pool must be an integer ≥ 1 sessions, "
                             f"got {s!r}")
        object.__setattr__(self, "slots_per_pool", int(s))
        kv, per_dep = self.kv_tokens_per_pool, self.kv_tokens_per_deployment
        if (kv is None) == (per_dep is None):
            raise ValueError("BackendConfig: give exactly one of kv_tokens_per_pool and "
                             "kv_tokens_per_deployment")
        if kv is not None:
            _check_tokens("kv_tokens_per_pool", kv)
            object.__setattr__(self, "kv_tokens_per_pool", float(kv))
        else:
            values = tuple(per_dep) if not isinstance(per_dep, str) else ()
            if not values:
                raise ValueError(f"BackendConfig.kv_tokens_per_deployment must be a non-empty "
                                 f"sequence of tokens, got {per_dep!r}")
            for i, v in enumerate(values):
                _check_tokens(f"kv_tokens_per_deployment[{i}]", v)
            object.__setattr__(self, "kv_tokens_per_deployment", tuple(float(v) for v in values))
        ttl = self.ttl_s
        if isinstance(ttl, bool) or not isinstance(ttl, int | float | np.number) or not (
            ttl > 0  # NaN fails this too; +inf is allowed (no expiry)
        ):
            raise ValueError(f"BackendConfig.ttl_s must be a number > 0 s (inf allowed), "
                             f"got {ttl!r}")
        object.__setattr__(self, "ttl_s", float(ttl))

    @property
    def kv_capacity_tokens(self) -> int:
        """Whole tokens of KV memory per shared pool, ``floor(kv_tokens_per_pool)``; raises
        ``ValueError`` under a per-deployment rule (see :meth:`Backend.kv_capacities`)."""
        if self.kv_tokens_per_pool is None:
            raise ValueError("kv_capacity_tokens: KV memory is per deployment "
                             "(kv_tokens_per_deployment)")
        return math.floor(self.kv_tokens_per_pool)

    def to_dict(self) -> dict:
        """The parameters as a JSON-serializable dict (stored with results)."""
        d = asdict(self)
        if d["kv_tokens_per_deployment"] is not None:
            d["kv_tokens_per_deployment"] = list(d["kv_tokens_per_deployment"])
        return d


def _check_tokens(name: str, kv: object) -> None:
    if isinstance(kv, bool) or not isinstance(kv, int | float | np.number) or not (
        math.isfinite(kv) and kv > 0
    ):
        raise ValueError(f"BackendConfig.{name} must be a finite number > 0 tokens, got {kv!r}")


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
    """Slots, KV pools and caches of all deployments (docs/model.md §6, §6a.3–4); see the module.

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
        self._ttl = config.ttl_s
        # KV pools: the (region, GPU) pools (paper rule) or one per deployment.
        if config.kv_tokens_per_deployment is None:
            self._kvp_of = list(self._pool_of)
            self._kv_cap = [config.kv_capacity_tokens] * self._n_pools
        else:
            if len(config.kv_tokens_per_deployment) != self._n:
                raise ValueError(f"BackendConfig.kv_tokens_per_deployment has "
                                 f"{len(config.kv_tokens_per_deployment)} values for {self._n} "
                                 f"deployments")
            self._kvp_of = list(range(self._n))
            self._kv_cap = [math.floor(v) for v in config.kv_tokens_per_deployment]
        n_kv = len(self._kv_cap)
        self._now = -math.inf
        self._version = 0
        # state
        self._caches: dict[int, dict[int, _Cache]] = {}  # session → deployment → cache
        self._running: dict[int, int] = {}  # session → deployment of its running turn
        self._holder: dict[int, int] = {}  # session → pool whose slot it holds
        self._departed: set[int] = set()
        self._done: dict[int, float] = {}  # session → when its latest turn completed
        # Free slots per pool and, per deployment, whether its pool has one: kept up to date on
        # every slot change so that the per-query reads are one copy each.
        self._free = np.full(self._n_pools, self._slots, dtype=np.int64)
        self._open = np.ones(self._n, dtype=bool)
        self._deps_of_pool = [_index_of(np.flatnonzero(self._pool_arr == p))
                              for p in range(self._n_pools)]
        # KV tokens in use per KV pool: a typed array, as fast as a list to update from Python,
        # whose buffer a policy can read as a numpy array without a copy (pool_used_view)
        self._used = array.array("q", bytes(8 * n_kv))
        # eviction order per KV pool, entries (f_last, session, deployment, version): a heap for
        # departed sessions' caches, a queue sorted by completion for the others
        self._lru_departed: list[list[tuple]] = [[] for _ in range(n_kv)]
        self._lru_live: list[deque[tuple]] = [deque() for _ in range(n_kv)]
        # expiry: a queue of (f_last, session, deployment, version), sorted by f_last
        self._expiry: deque[tuple] = deque()
        # counters
        self._c = dict.fromkeys(
            ("evicted_tokens", "evicted_caches", "expired_tokens", "expired_caches",
             "kv_overflow_events", "kv_overflow_tokens", "dispatches", "released_caches",
             "released_tokens"), 0)

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
        queue, ttl = self._expiry, self._ttl
        while queue and queue[0][0] + ttl < now:
            _, s, a, ver = queue.popleft()
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

    def free_slots(self, copy: bool = True) -> np.ndarray:
        """Free slots per pool, int64 (n_pools,); a pool holding a session counts it as taken.

        ``copy=False`` returns the backend's own array (read it, never write it; it changes at
        the next dispatch, completion or departure): the simulator's per-query path."""
        return self._free.copy() if copy else self._free

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
        kp = self._kvp_of[a]
        if delta > 0:
            missing = delta - (self._kv_cap[kp] - self._used[kp])
            if missing > 0:
                freed = self._evict(kp, missing)
                if freed < missing:
                    self._c["kv_overflow_events"] += 1
                    self._c["kv_overflow_tokens"] += missing - freed
                    delta -= missing - freed
        rec.tokens += delta
        self._used[kp] += delta

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

    def release(self, session: int, a: int, now: float) -> int:
        """Drop ``session``'s idle cache at ``a`` at ``now`` (s), e.g. the one it left behind by
        moving elsewhere, so that it stops crowding other sessions' caches; returns the tokens
        freed (0 where there is none). Raises ``ValueError`` for a running turn's cache."""
        s, a = operator.index(session), operator.index(a)
        if now != self._now:
            self.advance(now)
        rec = self._caches.get(s, {}).get(a)
        if rec is None:
            return 0
        if rec.pinned:
            raise ValueError(f"session {s}: the cache on deployment {a} belongs to a running turn")
        self._c["released_caches"] += 1
        self._c["released_tokens"] += rec.tokens
        self._remove(s, a, rec)  # its queue entries go stale: the cache is gone
        return rec.tokens

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
        self._done[s] = self._now
        rec = self._caches[s][a]
        rec.pinned = False
        rec.f_last = self._now
        self._version += 1
        rec.version = self._version
        if rec.tokens == 0:
            self._remove(s, a, rec)
        else:
            entry = (rec.f_last, s, a, rec.version)
            _append_sorted(self._lru_live[self._kvp_of[a]], entry)
            _append_sorted(self._expiry, entry)

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
        self._done.pop(s, None)  # read only at a next turn: bounded by the live sessions
        p = self._holder.pop(s, None)
        if p is not None:
            self._add_free(p, 1)
        for a, rec in self._caches.get(s, {}).items():
            # Idle (no turn runs): its live-queue entry is now skipped (the session departed)
            # and its expiry entry stays valid.
            heapq.heappush(self._lru_departed[self._kvp_of[a]], (rec.f_last, s, a, rec.version))

    # -----------------------------------------------------------------------------------------
    # inspection (tests, metrics, gate features)

    @property
    def kv_capacity_tokens(self) -> int:
        """KV memory of each shared (region, GPU) pool, whole tokens (paper rule only; see
        :meth:`kv_capacities`)."""
        return self.config.kv_capacity_tokens

    def kv_capacities(self) -> np.ndarray:
        """KV memory of each KV pool, whole tokens, int64 (one per (region, GPU) pool under the
        shared rule, one per deployment under a per-deployment rule)."""
        return np.array(self._kv_cap, dtype=np.int64)

    def kv_pool_of(self) -> np.ndarray:
        """The KV pool of each deployment, int64 (n,)."""
        return np.array(self._kvp_of, dtype=np.int64)

    def pool_used_tokens(self) -> np.ndarray:
        """KV tokens held by caches, per KV pool, int64 (see :meth:`kv_capacities`)."""
        return np.array(self._used, dtype=np.int64)

    def pool_used_view(self) -> np.ndarray:
        """:meth:`pool_used_tokens` without the copy: a read-only int64 view of the backend's
        own counts (tokens per KV pool), which change as it runs; a policy takes it once and
        reads it at every decision (the horizon router: 0.7 µs a decision less than a copy)."""
        view = np.frombuffer(self._used, dtype=np.int64)
        view.flags.writeable = False
        return view

    def kv_used_share(self, a: int) -> float:
        """Share of deployment ``a``'s KV pool in use (tokens held / capacity)."""
        kp = self._kvp_of[a]
        return self._used[kp] / float(self._kv_cap[kp])

    def slot_holder(self, session: int) -> int:
        """The pool whose slot ``session`` holds, or -1."""
        return self._holder.get(session, -1)

    def running(self, session: int) -> int:
        """The deployment of ``session``'s running turn, or -1."""
        return self._running.get(session, -1)

    def last_completion(self, session: int) -> float:
        """When ``session``'s latest turn completed, s since the Unix epoch (−inf if none has):
        its caches idle since then expire once ``now > last_completion + ttl_s``. Forgotten when
        the session departs (it has no next turn)."""
        return self._done.get(session, -math.inf)

    def has_departed(self, session: int) -> bool:
        """Whether ``session`` has departed (and is not forgotten, :meth:`forget_departed`)."""
        return session in self._departed

    def forget_departed(self) -> int:
        """Forget the departed sessions that hold no cache any more (all evicted or expired),
        for a router that runs without end (``serve``): its state then stays bounded by the live
        sessions and the caches departed ones left. A forgotten id is unknown again (a turn under
        it starts a new session; the versions of its former caches' queue entries are stale). A
        replay never needs it (no id comes back). Returns how many departed sessions are still
        known (they hold caches)."""
        caches = self._caches
        self._departed = {s for s in self._departed if s in caches}
        return len(self._departed)

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
        new._done = dict(self._done)
        new._free = self._free.copy()
        new._open = self._open.copy()
        new._used = array.array("q", self._used)
        new._lru_departed = [list(h) for h in self._lru_departed]
        new._lru_live = [deque(q) for q in self._lru_live]
        new._expiry = deque(self._expiry)
        new._c = dict(self._c)
        return new

    def session_after_turn(
        self, session: int, a: int, now: float, context_tokens: int, done: float, later: float
    ) -> tuple[dict[int, int], np.ndarray, np.ndarray]:
        """What ``session`` would see at ``later`` (s) if its turn were dispatched on ``a`` at
        ``now`` (the current time) with ``context_tokens`` post-turn tokens, completed at
        ``done`` and no other session acted meanwhile: ``({deployment: cached tokens},
        available (n,), free slots (n_pools,))`` — what :meth:`session_caches`,
        :meth:`available` and :meth:`free_slots` would return after :meth:`dispatch`,
        :meth:`complete` and :meth:`advance` on a :meth:`copy`, without copying: the state is
        read, never written (O(the session's caches + the victims its dispatch evicts)).

        The dispatch may evict the session's own idle caches of ``a``'s KV pool (the same
        eviction order as :meth:`dispatch`) or store only a prefix (KV overflow); its caches
        whose last use plus the TTL is before ``later`` expire. Raises like :meth:`dispatch`
        when ``a`` is unavailable, and ``ValueError`` unless now ≤ done ≤ later.
        """
        s, a, ctx = operator.index(session), operator.index(a), operator.index(context_tokens)
        if now != self._now or not now <= done <= later:
            raise ValueError(f"session_after_turn: need now = the backend's time ({self._now}) "
                             f"≤ done ≤ later, got {now}, {done}, {later}")
        if s in self._departed or s in self._running:
            raise ValueError(f"session {s} has departed or has a turn running")
        p, kp = self._pool_of[a], self._kvp_of[a]
        free = self._free.copy()
        held = self._holder.get(s)
        if held != p:
            if free[p] <= 0:
                raise ValueError(f"deployment {a} (pool {p}) is not available to session {s}: "
                                 f"no free slot")
            if held is not None:
                free[held] += 1
            free[p] -= 1
        caches = {b: [rec.tokens, rec.f_last] for b, rec in self._caches.get(s, {}).items()}
        old = caches[a][0] if a in caches else 0
        delta = ctx - old
        if delta > 0:
            missing = delta - (self._kv_cap[kp] - self._used[kp])
            if missing > 0:
                freed = 0
                for s2, b, tokens in self._victims(kp, exclude=(s, a)):
                    take = min(tokens, missing - freed)
                    freed += take
                    if s2 == s:
                        caches[b][0] -= take
                    if freed >= missing:
                        break
                if freed < missing:
                    delta -= missing - freed
        caches[a] = [old + delta, done]
        ttl = self._ttl
        out = {b: tokens for b, (tokens, f_last) in caches.items()
               if tokens > 0 and not f_last + ttl < later}
        ok = (free > 0)[self._pool_arr]
        ok[self._deps_of_pool[p]] = True
        return out, ok, free

    # -----------------------------------------------------------------------------------------
    # internals

    def _add_free(self, p: int, delta: int) -> None:
        free = self._free[p] + delta
        self._free[p] = free
        self._open[self._deps_of_pool[p]] = free > 0

    def _valid(self, s: int, a: int, ver: int) -> _Cache | None:
        caches = self._caches.get(s)
        rec = None if caches is None else caches.get(a)
        if rec is None or rec.version != ver or rec.pinned:
            return None
        return rec

    def _remove(self, s: int, a: int, rec: _Cache) -> None:
        self._used[self._kvp_of[a]] -= rec.tokens
        caches = self._caches[s]
        del caches[a]
        if not caches:
            del self._caches[s]

    def _victims(self, p: int, exclude: tuple[int, int]):
        """The idle caches of KV pool ``p`` in eviction order, as (session, deployment, tokens),
        without changing anything (:meth:`_evict`'s order: departed sessions' caches by
        (f_last, session, deployment), then the live queue); ``exclude`` (the pinned cache of
        the dispatch being predicted) is skipped."""
        all_caches, departed = self._caches, self._departed
        for group, live in ((sorted(self._lru_departed[p]), False), (self._lru_live[p], True)):
            for _, s, a, ver in group:
                caches = all_caches.get(s)
                rec = None if caches is None else caches.get(a)
                if (rec is None or rec.version != ver or rec.pinned or (live and s in departed)
                        or (s, a) == exclude):
                    continue
                yield s, a, rec.tokens

    def _evict(self, p: int, missing: int) -> int:
        """Free up to ``missing`` tokens from idle caches of KV pool ``p``; return tokens
        freed."""
        freed = removed = 0
        all_caches, departed = self._caches, self._departed
        heap = self._lru_departed[p]
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
        queue = self._lru_live[p]
        while freed < missing and queue:
            _, s, a, ver = queue[0]
            caches = all_caches.get(s)
            rec = None if caches is None else caches.get(a)
            # stale, or a departed session's (evicted through the departed heap)
            if rec is None or rec.version != ver or rec.pinned or s in departed:
                queue.popleft()
                continue
            take = min(rec.tokens, missing - freed)
            rec.tokens -= take
            freed += take
            if rec.tokens == 0:
                queue.popleft()
                removed += 1
                self._remove(s, a, rec)
        self._used[p] -= freed
        self._c["evicted_tokens"] += freed
        self._c["evicted_caches"] += removed
        return freed


def _append_sorted(queue: deque[tuple], entry: tuple) -> None:
    """Append ``entry`` (f_last, session, deployment, version) to a queue sorted by its first
    three fields, whose last entries have f_last ≤ ``entry``'s (completions come in time order):
    at an exact tie in f_last it goes before the tail entries with a larger (session,
    deployment), so that the order does not depend on the order of the calls."""
    if not queue or queue[-1][0] < entry[0] or queue[-1][:3] <= entry[:3]:
        queue.append(entry)
        return
    i = len(queue) - 1
    while i > 0 and queue[i - 1][:3] > entry[:3]:
        i -= 1
    queue.insert(i, entry)
