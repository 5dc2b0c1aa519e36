"""The router behind the proxy and the LiteLLM strategy: the library's decision on live requests.

Per request the :class:`RouterCore`

1. turns the chat messages into the query of ``docs/model.md`` §4: session id, turn index k
   (assistant messages so far), N_new (messages after the last assistant message) and N_hist (all
   before it) under every model's tokenizer (:func:`carbonrouter_lib.tokenizers.count_tokens`, no
   chat template, as the prepared workloads count), the estimated output and Q(m);
2. brings its own estimate of the engines' state up to the clock: a
   :class:`~carbonrouter_lib.backend.Backend` (slots, KV pools, TTL, LRU eviction — the
   simulator's rules) fed with the proxy's dispatches and completions, since the router cannot
   query the engines' caches;
3. fills the simulator's :class:`~carbonrouter_lib.policies.QueryContext` (``ctx.fill``) with
   L(a), availability (minus undeclared, cooling-down and already-failed deployments), free
   slots and the carbon intensity, runs :func:`~carbonrouter_lib.policies.feasibility` and
   ``policy.choose`` — the same objects and the same code the notebooks evaluate;
4. dispatches the turn on its backend with the *estimated* post-turn context and, when the
   response ends, corrects it to the realized one (:meth:`Backend.correct`); a failed engine
   call restores the cache it had and cools the deployment down.

Engines report ``usage.prompt_tokens_details.cached_tokens``: how much of the prompt they
found cached *before* the turn. The turn itself rebuilds the whole prompt on that engine, so the
report does not change the post-turn estimate; it is the truth the estimate is measured against
(``cache_error`` per turn, ``/metrics``) and the L used for the realized carbon.

Completions: ``observed`` (default) at the clock's time when the response ends; ``modelled``
at d + TTFT(a) + N_out/v_dec as the simulator, queued and applied in time order (completions
before dispatches at equal times, ``docs/model.md`` §6a.9) — with a
:class:`~carbonrouter_lib.serve.clock.ManualClock` driven through a workload turn by turn this
reproduces the simulator's decisions.

Sessions leave when a request says it is the last turn (extension field ``last_turn``), else
after ``session_idle_s`` without a request. A session that comes back after it left (a user
resuming a conversation, the same session key) is routed as a new incarnation with an id of its
own (from :data:`REVIVED_BASE` up; the decision log's ``session``): it starts without a cache in
the router's backend, where the earlier incarnation's caches stay as a departed session's (evicted
first, expiring at the TTL; both 1,800 s by default).

The horizon router (``carbonrouter-horizon``, the project's default router) learns its model at
start-up from ``gate_workload``'s sessions, for the served models
(:func:`~carbonrouter_lib.policies.horizon.fit_horizon_model`'s ``models``). Its forecast reads
the carbon signal's history, which only the replay provider has; behind a live provider (current
intensities only) it must forecast by persistence (``params: {forecast: persistence}``), and its
references told the future cannot route: both are refused at start-up, naming the parameter.

Units: tokens, kWh, gCO2e, gCO2e/kWh, seconds (virtual, on the router's clock).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import hashlib
import heapq
import json
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from carbonrouter_lib import cost
from carbonrouter_lib.backend import Backend
from carbonrouter_lib.policies import (
    Candidates,
    CarbonRouter,
    HorizonRouter,
    Policy,
    QueryContext,
    feasibility,
    make_policy,
)
from carbonrouter_lib.serve.carbon_providers import CachedSignal, ReplayProvider
from carbonrouter_lib.serve.clock import Clock, ManualClock, ScaledClock, WallClock
from carbonrouter_lib.serve.config import ServeConfig
from carbonrouter_lib.serve.metrics import RouterMetrics
from carbonrouter_lib.tokenizers import count_tokens

__all__ = ["EXTENSION", "Query", "Turn", "RouterCore", "session_id", "message_text",
           "build_clock"]

#: Request-body field (stripped before forwarding) with per-request routing inputs:
#: ``quality`` and ``est_output_tokens`` (per model: a mapping or a list in the router's model
#: order; ``est_output_tokens`` also one number) and ``last_turn`` (bool).
EXTENSION = "carbonrouter"

_DECIMAL = re.compile(r"^[0-9]{1,18}$")

#: The first id of a session that came back after it left (above every id
#: :func:`session_id` gives: decimal keys < 10^18, hashed ones < 2^62; int64).
REVIVED_BASE = 2**62
#: Departures between two of the backend's :meth:`~carbonrouter_lib.backend.Backend.
#: forget_departed` at least (more while it still knows as many departed sessions with caches).
_FORGET_EVERY = 1024


def message_text(message: Mapping[str, Any]) -> str:
    """The text of one chat message: ``content`` as a string, or its text parts joined."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    raise ValueError(f"message content must be a string or a list of parts, got "
                     f"{type(content).__name__}")


def session_id(key: str | None, messages: Sequence[Mapping[str, Any]]) -> tuple[int, str]:
    """The session's integer id and its key.

    With a key (the session header): a decimal key is the id itself (the simulator's session
    numbers in replays); any other key is hashed. Without one: a hash of the conversation's
    first messages, up to and including the first user message (stable across its turns).
    """
    if key:
        if _DECIMAL.match(key):
            return int(key), key
        digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    else:
        head = []
        for m in messages:
            head.append([m.get("role", ""), message_text(m)])
            if m.get("role") == "user":
                break
        digest = hashlib.blake2b(json.dumps(head).encode(), digest_size=8).digest()
        key = "h:" + digest.hex()
    # 62 bits, offset past 10^18 so that no hash meets a decimal id
    return 10**18 + int.from_bytes(digest, "big") % (2**62 - 10**18), key


@functools.lru_cache(maxsize=1 << 16)
def _count(text: str, family: str) -> int:
    # Histories are re-sent with every turn; counting each message once keeps a turn O(new).
    return int(count_tokens([text], family, num_threads=1)[0])


@dataclass
class Query:
    """One request as the cost model sees it (per-model arrays in the router's model order)."""

    session: int
    key: str
    turn: int
    last: bool
    n_new: np.ndarray
    n_hist: np.ndarray
    n_out_est: np.ndarray
    quality: np.ndarray


@dataclass
class Turn:
    """A dispatched turn (what :meth:`RouterCore.finish` / :meth:`RouterCore.fail` take).

    Estimates are at dispatch, under the chosen deployment's model; ``cached`` is L(a) after
    clipping to N_hist, ``cache_before`` the backend's raw cache length there.
    """

    query: Query
    a: int
    dispatch_s: float
    cached: float
    cache_before: int
    est_energy_kwh: float
    est_carbon_g: float
    est_ttft_s: float
    ci: float
    best_effort: bool
    switched: bool
    opportunity: bool
    blocked: bool
    decision_s: float
    attempt: int = 0
    done: bool = False


@dataclass
class _Session:
    key: str | None = None  # the session key of an incarnation that came back
    prev: int = -1
    started: bool = False
    running: Turn | None = None
    version: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def build_clock(config: ServeConfig) -> Clock:
    """The clock of a configuration: scaled from ``clock.start``, else the wall clock."""
    start = config.clock.start_epoch_s()
    if start is None:
        return WallClock()
    return ScaledClock(start, config.clock.scale)


class RouterCore:
    """Routing state and decisions of one proxy (see the module docstring).

    Parameters
    ----------
    config
        A validated :class:`~carbonrouter_lib.serve.config.ServeConfig`.
    signal
        The carbon signal (default: the configured provider, cached).
    clock
        The clock (default :func:`build_clock`).
    policy
        A policy instance to use instead of the configured one (replays, tests).
    log_size
        Decisions kept for :meth:`decisions`.
    """

    def __init__(self, config: ServeConfig, signal: CachedSignal | None = None,
                 clock: Clock | None = None, policy: Policy | None = None,
                 log_size: int = 200_000) -> None:
        from carbonrouter_lib.serve.carbon_providers import make_provider

        self.config = config
        rc = config.router
        self.deployments, index = config.deployments_grid()
        d = self.deployments
        self.specs = {a: spec for a, spec in zip(index, config.deployments, strict=True)}
        self.declared = np.zeros(d.n, dtype=bool)
        self.declared[index] = True
        self.ids = {spec.id: a for a, spec in self.specs.items()}
        self.regions = d.regions
        if signal is None:
            spec = config.carbon
            if spec.provider == "replay" and clock is None and config.clock.start is None:
                raise ValueError(f"{config.source}: clock.start is required with carbon.provider "
                                 f"'replay' (the wall clock is not in the carbon year "
                                 f"{spec.year})")
            signal = CachedSignal(make_provider(spec, config.zones), config.zones, spec.ttl_s,
                                  spec.max_stale_s, spec.default_gco2_per_kwh)
        self.signal = signal
        self.clock = clock or build_clock(config)
        self.constraints = rc.constraints()
        if isinstance(policy, HorizonRouter):
            self._check_horizon(policy)
        self.policy = policy if policy is not None else self._make_policy()
        if isinstance(self.policy, CarbonRouter):  # a session's counts go when it leaves
            self.policy.keeps_session_counts = False
        self.backend = Backend(d, config.backend_config())
        self.ctx, self.cand = QueryContext(d), Candidates(d.n)
        self.ctx.backend = self.backend
        self.ctx.signal = (signal.provider.signal if isinstance(signal.provider, ReplayProvider)
                           else None)
        self.metrics = RouterMetrics()
        self._families = [self._family(m) for m in d.models]
        self._q_default = np.array([rc.quality.get(m, 1.0) for m in d.models])
        self._cool_until = np.zeros(d.n)
        self._failures_seen: dict[str, int] = {}
        self._sessions: dict[int, _Session] = {}
        # session key -> id of its current incarnation, for sessions that came back after they
        # left (popped when that incarnation leaves: bounded by the live sessions)
        self._revived: dict[str, int] = {}
        self._next_revived = REVIVED_BASE
        # departures so far, and the count at which the backend next forgets the departed
        # sessions without caches (doubling with what it still knows: amortized O(1) each)
        self._departures, self._forget_at = 0, _FORGET_EVERY
        self._events: list[tuple] = []  # (time, seq, kind, session, arg)
        self._seq = 0
        self.log: collections.deque[dict] = collections.deque(maxlen=log_size)

    # -----------------------------------------------------------------------------------------
    # set-up

    def _family(self, model: str) -> str:
        for spec in self.config.deployments:
            if spec.model == model:
                return spec.family
        raise AssertionError(model)

    def _make_policy(self) -> Policy:
        rc = self.config.router
        policy = make_policy(rc.policy, **rc.params)
        if isinstance(policy, CarbonRouter) and policy.gate_to_build is not None:
            if policy.gate_to_build != "learned":
                raise ValueError(f"policy {rc.policy!r}: the {policy.gate_to_build} gate needs "
                                 f"the future of a replayed workload; it cannot route live")
            policy.set_gate(self._learned_gate(policy) if rc.gate == "learned" else None)
        if isinstance(policy, HorizonRouter):
            self._check_horizon(policy)
            if policy.needs_model:  # for the served models, on gate_workload's sessions
                from carbonrouter_lib import prepared

                table = prepared.prepare_workload(prepared.WorkloadConfig(**rc.gate_workload))
                policy.set_model(policy.fit_model(table, rc.beta_q, rc.ttl_s,
                                                  self.deployments.models))
        return policy

    def _check_horizon(self, policy: HorizonRouter) -> None:
        # a live provider gives the current intensities only: the forecast must be persistence
        # (raises naming the parameter, before the first request)
        policy.check_live(isinstance(self.signal.provider, ReplayProvider))

    def _learned_gate(self, policy: CarbonRouter):
        """The learned gate of the configured zones, trained on ``gate_workload`` (cached)."""
        from carbonrouter_lib import gate, prepared, setting

        rc, prof = self.config.router, self.config.profile_constants
        sim = setting.SimulationConfig(
            regions=tuple(dict.fromkeys(self.config.zones)), ttl_s=rc.ttl_s,
            beta_q=rc.beta_q, d_ttft_s=rc.d_ttft_s,
            **{k: prof[k] for k in ("kappa", "gamma", "alpha") if k in prof})
        return gate.ensure_gate(prepared.WorkloadConfig(**rc.gate_workload), sim,
                                policy.pricing, policy.gate_training)

    # -----------------------------------------------------------------------------------------
    # requests → queries

    def query(self, messages: Sequence[Mapping[str, Any]], session_key: str | None = None,
              extension: Mapping[str, Any] | None = None, max_tokens: int | None = None
              ) -> Query:
        """The query of a chat request (see the module docstring, step 1).

        Raises ``ValueError`` on an empty or malformed ``messages`` list or extension field.
        """
        if not isinstance(messages, Sequence) or not messages:
            raise ValueError("messages must be a non-empty list")
        ext = dict(extension or {})
        last_asst = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"),
                        default=-1)
        texts = [message_text(m) for m in messages]
        n_m = len(self.deployments.models)
        new, hist = np.zeros(n_m), np.zeros(n_m)
        by_family: dict[str, tuple[float, float]] = {}
        for j, fam in enumerate(self._families):
            if fam not in by_family:
                counts = [_count(t, fam) for t in texts]
                by_family[fam] = (sum(counts[last_asst + 1:]), sum(counts[:last_asst + 1]))
            new[j], hist[j] = by_family[fam]
        quality = self._per_model(ext.get("quality"), self._q_default, "quality")
        est_default = self.config.router.est_output_tokens
        if max_tokens is not None:
            est_default = min(est_default, float(max_tokens))
        est = self._per_model(ext.get("est_output_tokens"), np.full(n_m, est_default),
                              "est_output_tokens")
        if not ((quality >= 0) & (quality <= 1)).all() or not (est >= 0).all():
            raise ValueError(f"{EXTENSION}: quality must be in [0, 1] and est_output_tokens ≥ 0")
        s, key = session_id(session_key, messages)
        s = self._revived.get(key, s)
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        return Query(s, key, turn, bool(ext.get("last_turn", False)), new, hist, est, quality)

    def _per_model(self, value: Any, default: np.ndarray, name: str) -> np.ndarray:
        models = self.deployments.models
        if value is None:
            return default.copy()
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - set(models))
            if unknown:
                raise ValueError(f"{EXTENSION}.{name}: unknown models {unknown}; "
                                 f"models: {list(models)}")
            out = default.copy()
            for j, m in enumerate(models):
                if m in value:
                    out[j] = float(value[m])
            return out
        if isinstance(value, int | float):
            return np.full(len(models), float(value))
        arr = np.asarray(value, dtype=np.float64)
        if arr.shape != (len(models),):
            raise ValueError(f"{EXTENSION}.{name}: need {len(models)} values ({list(models)}), "
                             f"got shape {arr.shape}")
        return arr

    # -----------------------------------------------------------------------------------------
    # time and events

    def session(self, s: int) -> _Session:
        """The state of session ``s`` (created on first use)."""
        st = self._sessions.get(s)
        if st is None:
            st = self._sessions[s] = _Session()
        return st

    def _push(self, t: float, kind: int, s: int, arg: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, kind, self._seq, s, arg))

    def advance(self, now: float) -> None:
        """Apply queued completions, departures and idle-session departures up to ``now`` in
        time order (completions before departures at equal times), then move the backend."""
        ev = self._events
        while ev and ev[0][0] <= now:
            t, kind, _, s, arg = heapq.heappop(ev)
            t = max(t, self.backend.now)
            if kind == 0:
                self._complete(arg, t)
            elif kind == 1:
                st = self._sessions.get(s)
                if st is not None and st.version == arg and st.running is None:
                    self._depart(s, t)
        self.backend.advance(max(now, self.backend.now))

    def _complete(self, turn: Turn, t: float) -> None:
        s = turn.query.session
        self.backend.complete(s, turn.a, t)
        st = self._sessions[s]
        st.running = None
        if turn.query.last:
            self._depart(s, t)
        else:
            st.version += 1
            self._push(t + self.config.router.session_idle_s, 1, s, st.version)

    def _depart(self, s: int, t: float) -> None:
        st = self._sessions.pop(s, None)
        if st is not None and st.key is not None and self._revived.get(st.key) == s:
            del self._revived[st.key]
        if st is None or self.backend.has_departed(s):
            return
        self.backend.depart(s, t)
        self.policy.on_session_end(s)
        self._departures += 1
        if self._departures >= self._forget_at:
            self._forget_at = self._departures + max(_FORGET_EVERY,
                                                     self.backend.forget_departed())

    def _incarnation(self, q: Query) -> int:
        """The id ``q`` routes under: its session's current incarnation; a new one where the
        session has left (after ``session_idle_s`` or its last turn) and came back."""
        s = self._revived.get(q.key, q.session)
        if not self.backend.has_departed(s):
            return s
        # the departed id's state holds only the lock the caller took for this request (the
        # proxy, the LiteLLM strategy): the new incarnation keeps it, so that the session's
        # next request waits for this one
        held = self._sessions.pop(s, None)
        s = self._revived[q.key] = self._next_revived
        self._next_revived += 1
        st = self.session(s)
        st.key = q.key
        if held is not None:
            st.lock = held.lock
        return s

    def session_of(self, session_key: str | None, messages: Sequence[Mapping[str, Any]]
                   ) -> int:
        """The id the session of ``session_key`` / ``messages`` routes under now
        (:func:`session_id`, or its current incarnation where it came back after it left)."""
        s, key = session_id(session_key, messages)
        return self._revived.get(key, s)

    def _settle(self, s: int, now: float) -> None:
        """A new request of ``s`` while its previous turn's modelled completion is still queued
        (the engine was faster than the model): complete it now."""
        st = self._sessions.get(s)
        if st is not None and st.running is not None and st.running.done:
            self._events = [e for e in self._events if not (e[1] == 0 and e[3] == s)]
            heapq.heapify(self._events)
            self._complete(st.running, max(now, self.backend.now))

    # -----------------------------------------------------------------------------------------
    # decisions

    async def route(self, q: Query, exclude: Iterable[int] = (), attempt: int = 0
                    ) -> Turn | None:
        """Fetch the intensities and decide (:meth:`decide`)."""
        now = self.clock.now()
        ci = self.signal.intensities_nowait(now)
        if ci is None:
            ci = await self.signal.intensities(now)
        for region, zone in zip(self.regions, self.config.zones, strict=True):
            reading = self.signal.readings.get(zone)
            if reading is not None:
                self.metrics.set_reading(region, reading)
        for zone, n in self.signal.failures.items():
            new = n - self._failures_seen.get(zone, 0)
            if new:
                self.metrics.signal_failures.labels(zone).inc(new)
                self._failures_seen[zone] = n
        return self.decide(q, ci, self.clock.now(), exclude, attempt)

    def decide(self, q: Query, ci: np.ndarray, now: float, exclude: Iterable[int] = (),
               attempt: int = 0) -> Turn | None:
        """Route query ``q`` at ``now`` with intensities ``ci`` (per region, gCO2e/kWh):
        the deployment's turn, dispatched on the router's backend, or None if rejected.

        ``exclude``: deployments already tried for this request (they failed).
        """
        t0 = time.perf_counter()
        self.advance(now)
        s = q.session = self._incarnation(q)
        self._settle(s, now)
        st = self.session(s)
        if st.running is not None:
            raise RuntimeError(f"session {q.key!r} already has a turn running")
        avail = self.backend.available(s) & self.declared
        avail &= self._cool_until <= time.monotonic()
        for a in exclude:
            avail[a] = False
        ctx = self.ctx.fill(session=s, turn=q.turn, prev=st.prev,
                            cached=self.backend.cached_tokens(s), n_new=q.n_new,
                            n_hist=q.n_hist, n_out_est=q.n_out_est, quality=q.quality, ci=ci,
                            available=avail, free_slots=self.backend.free_slots(), time_s=now)
        if not st.started:
            st.started = True
            self.policy.on_session_start(ctx)
        cand = feasibility(ctx, self.constraints, out=self.cand)
        if cand.rejected:
            self.metrics.decision.observe(time.perf_counter() - t0)
            self.metrics.rejected.inc()
            self._log(q, None, now, time.perf_counter() - t0, attempt)
            if q.last:
                self._depart(s, now)
            return None
        a = int(self.policy.choose(ctx, cand))
        if not (0 <= a < ctx.n and cand.mask[a]):
            raise RuntimeError(f"{self.policy.name} chose {a}, not a candidate")
        self.policy.on_served(ctx, a)
        m = int(self.deployments.model[a])
        energy = cand.energy_of(a)
        ci_a = float(ctx.ci[a])
        is_ccar = isinstance(self.policy, CarbonRouter)
        opp = bool(is_ccar and self.policy.last_opportunity)
        turn = Turn(
            query=q, a=a, dispatch_s=now, cached=float(ctx.cached[a]),
            cache_before=self.backend.cache_length(s, a), est_energy_kwh=energy,
            est_carbon_g=ci_a * energy, est_ttft_s=float(cand.ttft[a]), ci=ci_a,
            best_effort=bool(cand.best_effort), switched=bool(st.prev >= 0 and a != st.prev),
            opportunity=opp, blocked=bool(opp and a == st.prev
                                          and self.policy.last_proposal != st.prev),
            decision_s=0.0, attempt=attempt)
        self.backend.dispatch(s, a, now, int(q.n_hist[m] + q.n_new[m] + q.n_out_est[m]))
        st.running = turn
        turn.decision_s = time.perf_counter() - t0
        self.metrics.decision.observe(turn.decision_s)
        return turn

    def finish(self, turn: Turn, output_tokens: float, engine_cached: float | None = None,
               overhead_s: float | None = None) -> dict:
        """The turn's response ended: correct the cache to the realized context, account the
        realized energy and carbon, schedule (or apply) its completion.

        Parameters
        ----------
        turn
            The turn :meth:`decide` returned.
        output_tokens
            Realized N_out under the deployment's model tokenizer.
        engine_cached
            ``usage.prompt_tokens_details.cached_tokens`` (None: not reported).
        overhead_s
            The proxy's own time for this request (wall s), recorded.

        Returns
        -------
        dict
            The decision record (see :meth:`decisions`).
        """
        q, a, d = turn.query, turn.a, self.deployments
        m = int(d.model[a])
        n_new, n_hist = float(q.n_new[m]), float(q.n_hist[m])
        now = self.clock.now()
        self.advance(now)
        self.backend.correct(q.session, a, int(n_hist + n_new + output_tokens),
                             max(now, self.backend.now))
        # Realized: the engine's own cache length where it reports one (clipped to N_hist).
        reported = None if engine_cached is None else min(max(float(engine_cached), 0.0),
                                                          n_hist)
        used = turn.cached if reported is None else reported
        e_in, e_cache, e_out = float(d.e_in[a]), float(d.e_cache[a]), float(d.e_out[a])
        energy = cost.energy_kwh(e_in, e_cache, e_out, n_new, n_hist, used, output_tokens)
        carbon = turn.ci * energy
        region = self.regions[int(d.region[a])]
        spec = self.specs[a]
        mt = self.metrics
        mt.requests.labels(spec.id, region, "ok").inc()
        mt.carbon.labels(spec.id, region).inc(carbon)
        mt.energy.labels(spec.id, region).inc(energy)
        if turn.switched:
            mt.switches.inc()
        if turn.blocked:
            mt.gate_blocks.inc()
        if turn.best_effort:
            mt.best_effort.inc()
        if reported is not None:
            mt.cache_error.observe(turn.cached - reported)
            mt.cache_reported.labels(spec.id).inc(reported)
            mt.cache_estimated.labels(spec.id).inc(turn.cached)
        if overhead_s is not None:
            mt.overhead.observe(overhead_s)
        st = self.session(q.session)
        st.prev = a
        turn.done = True
        if self.config.router.completion == "modelled":
            # f = d + TTFT + N_out / v_dec, summed in the simulator's order (same floats)
            t_f = (turn.dispatch_s + cost.ttft_s(n_new, n_hist, turn.cached, float(d.v_pre[a]))
                   + output_tokens / float(d.v_dec[a]))
            self._push(t_f, 0, q.session, turn)
        else:
            self._complete(turn, max(now, self.backend.now))
            t_f = now
        return self._log(q, turn, turn.dispatch_s, turn.decision_s, turn.attempt,
                         completion_s=t_f, output_tokens=output_tokens,
                         engine_cached=reported, energy_kwh=energy, carbon_g=carbon,
                         overhead_s=overhead_s)

    def fail(self, turn: Turn, reason: str, cooldown: bool = True) -> None:
        """The turn did not complete: restore the cache the session had on the deployment
        and free the turn. With ``cooldown`` (an engine error or timeout, to be retried
        elsewhere) the deployment is left out for ``cooldown_s`` wall seconds."""
        q, a = turn.query, turn.a
        now = max(self.clock.now(), self.backend.now)
        self.backend.correct(q.session, a, turn.cache_before, now)
        self.backend.complete(q.session, a, now)
        self.session(q.session).running = None
        spec = self.specs[a]
        self.metrics.requests.labels(spec.id, self.regions[int(self.deployments.region[a])],
                                     "error").inc()
        if cooldown:
            self._cool_until[a] = time.monotonic() + self.config.router.cooldown_s
            self.metrics.retries.labels(spec.id, reason).inc()
            self.metrics.cooling.labels(spec.id).set(1)

    def cooling(self) -> list[str]:
        """Ids of the deployments now cooling down (and clears the gauge of the others)."""
        now = time.monotonic()
        out = []
        for a, spec in self.specs.items():
            hot = self._cool_until[a] > now
            self.metrics.cooling.labels(spec.id).set(int(hot))
            if hot:
                out.append(spec.id)
        return out

    # -----------------------------------------------------------------------------------------
    # records

    def _log(self, q: Query, turn: Turn | None, dispatch_s: float, decision_s: float,
             attempt: int, **extra: Any) -> dict:
        a = -1 if turn is None else turn.a
        rec = {"session": q.session, "session_key": q.key, "turn": q.turn,
               "deployment": a, "deployment_id": self.specs[a].id if a >= 0 else "",
               "label": self.deployments.label(a) if a >= 0 else "", "dispatch_s": dispatch_s,
               "decision_s": decision_s, "attempt": attempt, "rejected": turn is None}
        if turn is not None:
            rec.update({k: v for k, v in asdict(turn).items()
                        if k not in ("query", "a", "dispatch_s", "decision_s", "attempt", "done")})
        rec.update(extra)
        self.log.append(rec)
        return rec

    def decisions(self) -> list[dict]:
        """The decision records so far (served and rejected requests; failed attempts are not
        recorded, their retries are): session, turn, deployment, estimates at dispatch
        (``cached``, ``est_carbon_g``, ...), realized ``output_tokens``, ``engine_cached``,
        ``energy_kwh``, ``carbon_g``, ``completion_s``, ``decision_s`` and ``overhead_s``."""
        return list(self.log)

    def label_of(self, deployment_id: str) -> str:
        """``model/GPU/region`` of a declared deployment."""
        return self.deployments.label(self.ids[deployment_id])


def make_manual_core(config: ServeConfig, start_s: float, policy: Policy | None = None
                     ) -> RouterCore:
    """A core on a :class:`ManualClock` at ``start_s`` (replays and tests)."""
    return RouterCore(config, clock=ManualClock(start_s), policy=policy)
