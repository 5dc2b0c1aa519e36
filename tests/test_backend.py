"""Backend: slots, KV pools, TTL expiry and eviction (docs/model.md §6, §6a.3–4).

Random operation sequences are checked step by step against a brute-force reference written
here with different code (full scans and sorting instead of heaps), plus invariants; hand-built
scenarios pin down the exact eviction order and the TTL boundary.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from carbonrouter_lib.backend import Backend, BackendConfig
from carbonrouter_lib.deployments import Deployments
from carbonrouter_lib.setting import capacity_from_trace

DEP = Deployments.build(("AT", "GB"))  # 30 deployments, 6 pools
# Deployments of pool 0 (A10/AT) and pool 1 (A100/AT): models 0..4 on each.
P0 = [DEP.index(m, "A10", "AT") for m in DEP.models]
P1 = [DEP.index(m, "A100", "AT") for m in DEP.models]


def make(slots: int = 4, kv: float = 100.0, ttl: float = 10.0) -> Backend:
    return Backend(DEP, BackendConfig(slots_per_pool=slots, kv_tokens_per_pool=kv, ttl_s=ttl))


def turn(b: Backend, s: int, a: int, d: float, ctx: int, f: float | None = None) -> None:
    """Dispatch at d, complete at f (default d)."""
    b.dispatch(s, a, d, ctx)
    b.complete(s, a, d if f is None else f)


# --------------------------------------------------------------------------------------------
# Configuration


def test_capacity_from_trace_follows_the_paper_rule():
    cfg = capacity_from_trace(2000, 3000.0)
    # K = 0.5·2000 = 1000 per region; 1000/3 = 333.3 → 334 slots; K·C̄/3 = 1e6 tokens.
    assert cfg.slots_per_pool == 334
    assert cfg.kv_tokens_per_pool == pytest.approx(1000 * 3000 / 3)
    assert cfg.ttl_s == 1800.0
    for p, c, expected in [(6, 0.5, 1), (7, 0.5, 2), (1, 0.25, 1), (300, 0.35, 35),
                           (3000, 0.35, 350), (90, 0.1, 3)]:
        exact = Fraction(c).limit_denominator(1000) * p / 3  # c as the decimal it stands for
        cfg = capacity_from_trace(p, 10.0, c)
        assert cfg.slots_per_pool == max(1, math.ceil(exact)) == expected
        assert cfg.kv_tokens_per_pool == pytest.approx(float(exact) * 10.0)
    assert capacity_from_trace(100, 500.0, c=0.5, n_gpu_types=1).slots_per_pool == 50


@pytest.mark.parametrize("args", [(0, 10.0), (10, 0.0), (10, math.nan), (10, 10.0, -0.5),
                                  (10, 10.0, 0.5, 0), (True, 10.0)])
def test_capacity_from_trace_rejects_bad_input(args):
    with pytest.raises(ValueError):
        capacity_from_trace(*args)


@pytest.mark.parametrize(
    "kwargs, match",
    [({"slots_per_pool": 0}, "slots_per_pool"), ({"slots_per_pool": 2.0}, "slots_per_pool"),
     ({"slots_per_pool": True}, "slots_per_pool"), ({"kv_tokens_per_pool": 0}, "kv_tokens"),
     ({"kv_tokens_per_pool": math.inf}, "kv_tokens"), ({"ttl_s": 0}, "ttl_s"),
     ({"ttl_s": math.nan}, "ttl_s"), ({"ttl_s": "30"}, "ttl_s")],
)
def test_backend_config_validation(kwargs, match):
    args = {"slots_per_pool": 2, "kv_tokens_per_pool": 10.0} | kwargs
    with pytest.raises(ValueError, match=match):
        BackendConfig(**args)


def test_config_defaults_and_floor():
    cfg = BackendConfig(slots_per_pool=np.int64(3), kv_tokens_per_pool=99.9)
    assert cfg.ttl_s == 1800.0 and type(cfg.slots_per_pool) is int
    assert cfg.kv_capacity_tokens == 99 and make(kv=99.9).kv_capacity_tokens == 99
    assert cfg.to_dict() == {"slots_per_pool": 3, "kv_tokens_per_pool": 99.9, "ttl_s": 1800.0,
                             "kv_tokens_per_deployment": None}
    assert BackendConfig(1, 1.0, ttl_s=math.inf).ttl_s == math.inf


# --------------------------------------------------------------------------------------------
# Hand-built scenarios


def test_ttl_boundary_and_refresh():
    b = make(ttl=10.0)
    turn(b, 1, P0[0], 0.0, 40, f=2.0)  # f_last = 2
    b.advance(12.0)  # now == f_last + ttl: still there (expiry is strictly after)
    assert b.cache_length(1, P0[0]) == 40
    b.advance(np.nextafter(12.0, np.inf))
    assert b.cache_length(1, P0[0]) == 0 and b.pool_used_tokens()[0] == 0
    assert b.counters()["expired_caches"] == 1 and b.counters()["expired_tokens"] == 40
    # A reuse refreshes f_last: dispatch exactly at the boundary reuses the cache.
    turn(b, 2, P0[1], 20.0, 30, f=21.0)
    turn(b, 2, P0[1], 31.0, 50, f=33.0)  # 31 == 21 + 10: still cached, then refreshed
    assert b.counters()["expired_caches"] == 1
    b.advance(42.0)
    assert b.cache_length(2, P0[1]) == 50 and b.cache(2, P0[1]).f_last == 33.0
    b.advance(43.5)
    assert b.cache_length(2, P0[1]) == 0


def test_last_completion_is_when_the_sessions_latest_turn_completed():
    # Backend.last_completion: −inf before any completion; the latest completion of the session
    # (whichever deployment), kept after its caches expire and in a copy, not shared with it
    b = make(ttl=10.0)
    assert b.last_completion(1) == -math.inf
    turn(b, 1, P0[0], 0.0, 40, f=2.0)
    turn(b, 1, P0[1], 5.0, 60, f=7.5)
    assert b.last_completion(1) == 7.5 and b.last_completion(2) == -math.inf
    b.advance(30.0)  # both caches expired: 30 > 7.5 + 10
    assert b.cache_length(1, P0[1]) == 0 and b.last_completion(1) == 7.5
    c = b.copy()
    turn(c, 1, P0[0], 31.0, 10, f=32.0)
    assert c.last_completion(1) == 32.0 and b.last_completion(1) == 7.5

def test_pinned_cache_never_expires_or_is_evicted():
    b = make(kv=100.0, ttl=10.0)
    b.dispatch(1, P0[0], 0.0, 80)
    b.advance(1e6)
    assert b.cache(1, P0[0]) == (80, 0.0, True)
    # Another session needs 50 in the same pool: only 20 are free, nothing idle to evict.
    b.dispatch(2, P0[1], 1e6, 50)
    assert b.cache_length(1, P0[0]) == 80
    assert b.cache_length(2, P0[1]) == 20  # the prefix that fits
    c = b.counters()
    assert c["kv_overflow_events"] == 1 and c["kv_overflow_tokens"] == 30
    assert c["evicted_tokens"] == 0
    assert b.pool_used_tokens()[0] == 100


def test_overflow_evicts_every_idle_cache_then_stores_a_prefix():
    b = make(kv=100.0)
    turn(b, 1, P0[0], 0.0, 30)
    b.dispatch(2, P0[1], 1.0, 60)  # pinned
    b.dispatch(3, P0[2], 2.0, 90)  # needs 90: free 10 + idle 30 = 40
    assert b.cache_length(1, P0[0]) == 0 and b.cache_length(3, P0[2]) == 40
    assert b.counters()["kv_overflow_tokens"] == 50
    b.complete(3, P0[2], 3.0)
    b.dispatch(3, P0[2], 4.0, 95)  # reuses its 40, extends to what fits again
    assert b.cache_length(3, P0[2]) == 40 and b.counters()["kv_overflow_events"] == 2


def test_departed_sessions_are_evicted_first_then_lru_with_suffix_trimming():
    b = make(slots=4, kv=100.0, ttl=1e9)
    turn(b, 10, P0[0], 0.0, 30, f=1.0)  # live, oldest
    turn(b, 11, P0[1], 1.0, 30, f=5.0)  # departs later: most recent but evicted first
    b.depart(11, 6.0)
    assert b.slot_holder(11) == -1 and b.cache_length(11, P0[1]) == 30
    turn(b, 12, P0[2], 7.0, 20, f=8.0)  # live, newer than 10
    # Pool: 80 used, 20 free. Session 13 needs 45 → 25 missing, all from departed 11.
    b.dispatch(13, P0[3], 9.0, 45)
    assert [b.cache_length(s, a) for s, a in ((10, P0[0]), (11, P0[1]), (12, P0[2]))] == \
        [30, 5, 20]
    b.complete(13, P0[3], 10.0)
    # Session 14 needs 35 (0 free): 5 from 11 (removed), then LRU live: 10 (f_last 1) loses 30,
    # which is not enough, so 12 (f_last 8) loses 0 — exactly 35 = 5 + 30.
    b.dispatch(14, P0[4], 11.0, 35)
    assert b.cache(11, P0[1]) is None and b.cache(10, P0[0]) is None
    assert b.cache_length(12, P0[2]) == 20 and b.cache_length(13, P0[3]) == 45
    b.complete(14, P0[4], 12.0)
    # One more token: trimmed from the LRU idle cache (12, f_last 8), keeping a 19-token prefix.
    b.dispatch(10, P0[0], 13.0, 1)
    assert b.cache_length(12, P0[2]) == 19
    c = b.counters()
    assert c["evicted_tokens"] == 25 + 35 + 1 and c["evicted_caches"] == 2
    assert c["kv_overflow_events"] == 0 and b.pool_used_tokens()[0] == 100
    # The trimmed cache is a prefix: L(a) reported to the router is its length.
    assert b.cached_tokens(12)[P0[2]] == 19


def test_lru_ties_broken_by_session_then_deployment():
    b = make(slots=4, kv=100.0, ttl=1e9)
    turn(b, 7, P0[0], 0.0, 25, f=5.0)
    turn(b, 3, P0[1], 5.0, 25, f=5.0)  # same f_last as session 7, smaller id
    turn(b, 2, P0[3], 5.0, 25, f=5.0)  # session 2: two caches with f_last 5, deployments 3, 2
    turn(b, 2, P0[2], 5.0, 25, f=5.0)
    b.dispatch(9, P0[4], 6.0, 30)
    assert b.session_caches(2) == {P0[3]: 20}  # (2, P0[2]) removed first, then 5 from P0[3]
    assert b.cache_length(2, P0[3]) == 20
    assert b.cache_length(3, P0[1]) == 25 and b.cache_length(7, P0[0]) == 25


def test_slots_move_with_the_session_and_caches_survive():
    b = make(slots=1, kv=100.0, ttl=1e9)
    turn(b, 1, P0[0], 0.0, 10)
    assert b.slot_holder(1) == 0
    np.testing.assert_array_equal(b.free_slots(), [0, 1, 1, 1, 1, 1])
    av1, av2 = b.available(1), b.available(2)
    assert av1.all()  # holds pool 0, other pools free
    assert not av2[DEP.pool == 0].any() and av2[DEP.pool != 0].all()
    with pytest.raises(ValueError, match="not available"):
        b.dispatch(2, P0[1], 1.0, 5)
    assert b.slot_holder(2) == -1 and b.cache(2, P0[1]) is None
    turn(b, 1, P1[2], 2.0, 15)  # moves to pool 1, releasing pool 0
    assert b.slot_holder(1) == 1 and b.free_slots()[0] == 1 and b.free_slots()[1] == 0
    assert b.session_caches(1) == {P0[0]: 10, P1[2]: 15}
    L = b.cached_tokens(1)
    assert L.dtype == np.int64 and L.shape == (DEP.n,) and L.sum() == 25
    turn(b, 2, P0[1], 3.0, 5)
    b.depart(1, 4.0)
    assert b.slot_holder(1) == -1 and b.free_slots()[1] == 1 and b.has_departed(1)
    assert b.session_caches(1) == {P0[0]: 10, P1[2]: 15}  # caches stay after departure


def test_branch_truncates_and_models_have_separate_caches():
    b = make(kv=100.0)
    turn(b, 1, P0[0], 0.0, 70)
    turn(b, 1, P0[0], 1.0, 40)  # shorter context than cached (a branch): truncated
    assert b.cache_length(1, P0[0]) == 40 and b.pool_used_tokens()[0] == 40
    turn(b, 1, P0[1], 2.0, 50)  # another model on the same GPU: its own cache
    assert b.session_caches(1) == {P0[0]: 40, P0[1]: 50}
    turn(b, 1, P0[2], 3.0, 0)  # an empty cache is not kept
    assert b.cache(1, P0[2]) is None and b.counters()["evicted_tokens"] == 0


def test_misuse_raises():
    b = make(slots=2)
    b.dispatch(1, P0[0], 5.0, 10)
    with pytest.raises(ValueError, match="backwards"):
        b.advance(4.0)
    with pytest.raises(ValueError, match="running"):
        b.dispatch(1, P0[1], 5.0, 10)
    with pytest.raises(ValueError, match="turn running"):
        b.depart(1, 5.0)
    with pytest.raises(ValueError, match="no turn running"):
        b.complete(1, P0[1], 6.0)
    with pytest.raises(ValueError, match="out of range"):
        b.dispatch(2, DEP.n, 6.0, 1)
    with pytest.raises(ValueError, match="≥ 0"):
        b.dispatch(2, 0, 6.0, -1)
    with pytest.raises(TypeError):
        b.dispatch(2, 0, 6.0, 1.5)
    with pytest.raises(ValueError, match="finite"):
        b.advance(math.nan)
    b.complete(1, P0[0], 6.0)
    b.advance(6.0)  # idempotent
    b.depart(1, 6.0)
    with pytest.raises(ValueError, match="departed"):
        b.depart(1, 7.0)
    with pytest.raises(ValueError, match="departed"):
        b.dispatch(1, P0[0], 7.0, 5)
    b.depart(99, 7.0)  # a session whose turns were all rejected may depart
    with pytest.raises(TypeError):
        Backend(DEP, {"slots_per_pool": 1})


def test_copy_is_independent():
    b = make(kv=100.0)
    turn(b, 1, P0[0], 0.0, 60)
    c = b.copy()
    c.dispatch(2, P0[1], 1.0, 70)  # evicts 30 of session 1 in the copy only
    assert c.cache_length(1, P0[0]) == 30 and b.cache_length(1, P0[0]) == 60
    assert b.pool_used_tokens()[0] == 60 and b.free_slots()[0] == 3 and c.free_slots()[0] == 2
    assert b.counters()["evicted_tokens"] == 0


# --------------------------------------------------------------------------------------------
# Property tests against a brute-force reference


class RefBackend:
    """Brute-force model of docs/model.md §6a.3–4: full scans and sorting, no heaps or versions.

    ``caps``: None for the shared (region, GPU) KV pools of ``cap`` tokens each; else the KV
    memory of every deployment (KV pool = the deployment)."""

    def __init__(self, slots: int, cap: int, ttl: float, caps: list[int] | None = None) -> None:
        self.slots, self.cap, self.ttl, self.caps = slots, cap, ttl, caps
        self.caches: dict[tuple[int, int], list] = {}  # (s, a) → [tokens, f_last, pinned]
        self.holder: dict[int, int] = {}
        self.departed: set[int] = set()
        self.evicted = self.expired = self.overflows = 0

    def kv_pool(self, a: int) -> int:
        return int(DEP.pool[a]) if self.caps is None else a

    def capacity(self, kp: int) -> int:
        return self.cap if self.caps is None else self.caps[kp]

    def used(self, kp: int) -> int:
        return sum(c[0] for (s, a), c in self.caches.items() if self.kv_pool(a) == kp)

    def slots_used(self, p: int) -> int:
        return sum(1 for q in self.holder.values() if q == p)

    def advance(self, now: float) -> None:
        for key, (_, f_last, pinned) in list(self.caches.items()):
            if not pinned and now > f_last + self.ttl:
                del self.caches[key]
                self.expired += 1

    def can_dispatch(self, s: int, a: int) -> bool:
        p = int(DEP.pool[a])
        return self.holder.get(s) == p or self.slots_used(p) < self.slots

    def dispatch(self, s: int, a: int, now: float, ctx: int) -> None:
        self.advance(now)
        p = int(DEP.pool[a])
        self.holder[s] = p
        old = self.caches.get((s, a), [0, now, False])[0]
        self.caches[(s, a)] = [old, now, True]
        if ctx <= old:
            self.caches[(s, a)][0] = ctx
            return
        need = ctx - old
        kp = self.kv_pool(a)
        missing = need - (self.capacity(kp) - self.used(kp))
        if missing > 0:
            victims = sorted(
                (k for k, c in self.caches.items() if self.kv_pool(k[1]) == kp and not c[2]),
                key=lambda k: (k[0] not in self.departed, self.caches[k][1], k[0], k[1]))
            for k in victims:
                take = min(missing, self.caches[k][0])
                self.caches[k][0] -= take
                missing -= take
                self.evicted += take
                if self.caches[k][0] == 0:
                    del self.caches[k]
                if missing == 0:
                    break
            if missing > 0:
                self.overflows += 1
                need -= missing
        self.caches[(s, a)][0] = old + need

    def complete(self, s: int, a: int, now: float) -> None:
        self.advance(now)
        self.caches[(s, a)][1] = now
        self.caches[(s, a)][2] = False
        if self.caches[(s, a)][0] == 0:
            del self.caches[(s, a)]

    def depart(self, s: int, now: float) -> None:
        self.advance(now)
        self.departed.add(s)
        self.holder.pop(s, None)


N_SESSIONS = 8
# Time steps, s (TTL is 10 s in the property tests): mostly short, so caches live for a dozen
# operations and pools fill up; sometimes exactly the TTL, just over it, or far over it.
DT = [0.0] * 20 + [0.5] * 20 + [1.0] * 15 + [3.0] * 3 + [10.0, 10.000001, 25.0]
op_strategy = st.tuples(
    st.sampled_from(["turn"] * 7 + ["depart", "advance"]),
    st.integers(0, N_SESSIONS - 1),  # session
    st.integers(0, 11),  # deployment: pools 0, 1 and two of pool 2 (crowded on purpose)
    st.sampled_from(DT),
    st.integers(-15, 50),  # growth of the session's context, tokens (< 0: a branch)
)


def per_deployment_caps(cap: int) -> list[int]:
    """KV memory per deployment for the per-deployment rule's property tests (varied)."""
    return [max(5, cap // 3 + 7 * (a % 4) - 10) for a in range(DEP.n)]


def run_ops(ops, slots, cap, check=True, per_deployment=False):
    """Apply ops to the backend (and the reference, checking both after each step); with
    ``per_deployment`` every deployment has its own KV pool (:func:`per_deployment_caps`)."""
    if per_deployment:
        caps = per_deployment_caps(cap)
        b = Backend(DEP, BackendConfig(slots, None, ttl_s=10.0,
                                       kv_tokens_per_deployment=[c + 0.5 for c in caps]))
        ref = RefBackend(slots, cap, 10.0, caps)
    else:
        b = make(slots=slots, kv=cap + 0.5, ttl=10.0)
        ref = RefBackend(slots, cap, 10.0)
    now = 1000.0
    running: dict[int, int] = {}
    last_ctx: dict[tuple[int, int], int] = {}
    pinned_len: dict[int, int] = {}
    context: dict[int, int] = {}  # session → its latest context, tokens
    for kind, s, a, dt, grow in ops:
        now += dt
        ctx = max(0, context.get(s, 0) + grow)
        if kind == "turn":  # dispatch if the session is idle, else complete its turn
            kind = "complete" if s in running else "dispatch"
        if kind == "dispatch":
            if s in ref.departed:
                continue
            if not ref.can_dispatch(s, a):
                assert not b.available(s)[a]
                with pytest.raises(ValueError, match="not available"):
                    b.dispatch(s, a, now, ctx)
                ref.advance(now)
            else:
                assert b.available(s)[a]
                b.dispatch(s, a, now, ctx)
                ref.dispatch(s, a, now, ctx)
                running[s] = a
                context[s] = ctx
                last_ctx[(s, a)] = ctx
                pinned_len[s] = b.cache_length(s, a)
                assert pinned_len[s] <= ctx
        elif kind == "complete":
            if s not in running:
                continue
            assert b.cache_length(s, running[s]) == pinned_len.pop(s)  # pinned: untouched
            b.complete(s, running[s], now)
            ref.complete(s, running.pop(s), now)
        elif kind == "depart":
            if s in running or s in ref.departed:
                continue
            b.depart(s, now)
            ref.depart(s, now)
        else:
            b.advance(now)
            ref.advance(now)
        if check:
            check_state(b, ref, running, last_ctx, pinned_len)
    return b


def check_state(b, ref, running, last_ctx, pinned_len):
    used = b.pool_used_tokens()
    free = b.free_slots()
    caps = b.kv_capacities()
    for kp in range(len(caps)):
        assert used[kp] == ref.used(kp) <= ref.capacity(kp) == caps[kp]
    for a in range(DEP.n):
        assert b.kv_used_share(a) == used[b.kv_pool_of()[a]] / caps[b.kv_pool_of()[a]]
    for p in range(DEP.n_pools):
        assert 0 <= free[p] == ref.slots - ref.slots_used(p) <= ref.slots
    assert b.n_caches == len(ref.caches)
    # Every session that is live or still has a cache (departed ones without caches are covered
    # by the cache count above).
    for s in sorted(set(ref.holder) | {k[0] for k in ref.caches} | set(running) | {0}):
        L = b.cached_tokens(s)
        expect = np.zeros(DEP.n, dtype=np.int64)
        for (s2, a), c in ref.caches.items():
            if s2 == s:
                expect[a] = c[0]
                assert 0 < c[0] or c[2]  # empty caches only while their turn runs
                assert c[0] <= last_ctx[(s, a)]
        np.testing.assert_array_equal(L, expect)
        assert b.slot_holder(s) == ref.holder.get(s, -1)
        held = b.slot_holder(s)
        np.testing.assert_array_equal(
            b.available(s), (DEP.pool == held) | (free[DEP.pool] > 0))
        if s in running:
            assert b.cache(s, running[s]).pinned
            assert b.cache_length(s, running[s]) == pinned_len[s]
    c = b.counters()
    assert (c["evicted_tokens"], c["expired_caches"], c["kv_overflow_events"]) == \
        (ref.evicted, ref.expired, ref.overflows)



def test_the_used_view_follows_the_backend_without_a_copy():
    # pool_used_view is the backend's own counts (what the horizon router reads per decision):
    # taken once, it follows every change; read-only; a copy's is the copy's
    b = make(kv=100.0)
    view = b.pool_used_view()
    assert not view.flags.writeable and view.dtype == np.int64
    turn(b, 1, P0[0], 0.0, 60)
    c = b.copy()
    c.dispatch(2, P0[1], 1.0, 70)  # evicts 30 of session 1 in the copy only
    np.testing.assert_array_equal(view, b.pool_used_tokens())
    assert view[0] == 60 and c.pool_used_view()[0] == 100
    b.advance(1e9)  # the TTL expires session 1's cache
    assert view[0] == 0 == b.pool_used_tokens()[0]

@settings(max_examples=300, deadline=None)
@given(ops=st.lists(op_strategy, min_size=40, max_size=100), slots=st.integers(1, 3),
       cap=st.integers(40, 300))
def test_random_operations_match_reference(ops, slots, cap):
    run_ops(ops, slots, cap)


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(op_strategy, min_size=40, max_size=100), slots=st.integers(1, 3),
       cap=st.integers(40, 300))
def test_random_operations_with_per_deployment_kv_pools_match_reference(ops, slots, cap):
    run_ops(ops, slots, cap, per_deployment=True)


def test_per_deployment_kv_pools_evict_only_within_the_deployment():
    caps = [100.0] * DEP.n
    b = Backend(DEP, BackendConfig(4, None, ttl_s=1e9, kv_tokens_per_deployment=caps))
    turn(b, 1, P0[0], 0.0, 90)  # idle cache of model 0 on A10/AT
    turn(b, 2, P0[1], 1.0, 90)  # model 1, same (region, GPU) pool: its own KV memory
    assert b.cache_length(1, P0[0]) == 90 and b.counters()["evicted_tokens"] == 0
    turn(b, 3, P0[0], 2.0, 50)  # model 0 again: evicts 40 from session 1 only
    assert b.cache_length(1, P0[0]) == 50 and b.cache_length(2, P0[1]) == 90
    assert b.kv_used_share(P0[0]) == 1.0 and b.kv_used_share(P0[1]) == 0.9
    assert b.kv_pool_of().tolist() == list(range(DEP.n))
    with pytest.raises(ValueError, match="per deployment"):
        _ = b.kv_capacity_tokens


def test_per_deployment_config_is_validated():
    with pytest.raises(ValueError, match="exactly one"):
        BackendConfig(2, 10.0, kv_tokens_per_deployment=[1.0] * DEP.n)
    with pytest.raises(ValueError, match="exactly one"):
        BackendConfig(2, None)
    with pytest.raises(ValueError, match=r"kv_tokens_per_deployment\[1\]"):
        BackendConfig(2, None, kv_tokens_per_deployment=[1.0, 0.0])
    with pytest.raises(ValueError, match="2 values for 30 deployments"):
        Backend(DEP, BackendConfig(2, None, kv_tokens_per_deployment=[1.0, 2.0]))
    cfg = BackendConfig(2, None, kv_tokens_per_deployment=(1.5, 2))
    assert cfg.to_dict()["kv_tokens_per_deployment"] == [1.5, 2.0]


@settings(max_examples=40, deadline=None)
@given(ops=st.lists(op_strategy, min_size=40, max_size=100), cap=st.integers(40, 300))
def test_deterministic(ops, cap):
    def snapshot(b):
        return (b.counters(), b.pool_used_tokens().tolist(), b.free_slots().tolist(),
                [sorted((a, tuple(b.cache(s, a))) for a in b.session_caches(s))
                 for s in range(N_SESSIONS)])

    assert snapshot(run_ops(ops, 2, cap, check=False)) == \
        snapshot(run_ops(ops, 2, cap, check=False))


def test_long_random_workload_matches_reference():
    """A longer mixed workload (many evictions, expiries, departures) step by step."""
    rng = np.random.default_rng(7)
    kinds = ["turn"] * 14 + ["depart", "advance"]
    # Session ids from a sliding window, so departed sessions are replaced by new ones.
    ops = [(kinds[rng.integers(len(kinds))], i // 10 + int(rng.integers(20)),
            int(rng.integers(12)), DT[rng.integers(len(DT))], int(rng.integers(-15, 50)))
           for i in range(1500)]
    b = run_ops(ops, 25, 300)  # plenty of slots: old sessions never depart here
    c = b.counters()
    assert c["evicted_tokens"] > 0 and c["expired_caches"] > 0 and c["dispatches"] > 300


@settings(max_examples=120, deadline=None)
@given(ops=st.lists(op_strategy, min_size=30, max_size=90), slots=st.integers(1, 3),
       cap=st.integers(40, 300), per_deployment=st.booleans(),
       probe=st.tuples(st.integers(0, N_SESSIONS - 1), st.integers(0, 11),
                       st.integers(0, 120), st.sampled_from([0.0, 0.5, 3.0]),
                       st.sampled_from([0.0, 2.0, 9.9, 10.0, 10.5, 40.0])))
def test_session_after_turn_equals_playing_the_turn_on_a_copy(ops, slots, cap, per_deployment,
                                                                probe):
    b = run_ops(ops, slots, cap, check=False, per_deployment=per_deployment)
    s, a, ctx, service, think = probe
    if b.has_departed(s) or b.running(s) >= 0 or not b.available(s)[a]:
        with pytest.raises(ValueError):
            b.session_after_turn(s, a, b.now, ctx, b.now + service, b.now + service + think)
        return
    now, done, later = b.now, b.now + service, b.now + service + think
    before = (b.counters(), b.pool_used_tokens().tolist(), b.n_caches)
    caches, available, free = b.session_after_turn(s, a, now, ctx, done, later)
    assert (b.counters(), b.pool_used_tokens().tolist(), b.n_caches) == before  # read only
    c = b.copy()
    c.dispatch(s, a, now, ctx)
    c.complete(s, a, done)
    c.advance(later)
    assert caches == c.session_caches(s)
    np.testing.assert_array_equal(available, c.available(s))
    np.testing.assert_array_equal(free, c.free_slots())
