"""Horizon pricing: route each query to the deployment with the least expected carbon of the
*rest of the session* (beyond the paper).

CarbonRouter's proposal prices one turn: Ĉ_k(a) = CI_r(d)·E_k(a) with Eq. 4's E_k(a) =
e_in·(N_new + N_hist − L(a)) + e_cache·L(a) + e_out·N̂_out. A cache's value, though, accrues over
every *remaining* turn — if the cache survives — and a region's advantage lasts only as long as
its intensity does. The horizon router adds, for each candidate a, the expected carbon of the
session's future turns:

    H(a) = Ĉ_k(a) + Σ_{j=1..J} S_k(j)·ρ^(j−1)·V_j(a)
    V_j(a) = U_j(a) − (1 − φ_{p*_j})·max(U_j(a) − X_j, 0)                     (option to move)
    U_j(a) = q_m·(p_a·C⁺_j(a) + (1 − p_a)·C⁻_j(a)) + (1 − q_m)·Σ_{m′} f_{m→m′}·M_j(m′)   (commit)

- S_k(j) = P(K > k + j | K > k): the chance the session (K turns, 0-based turn k now) reaches
  turn k + j, from the session lengths of *training* conversations (other folds of a hash of the
  conversation, as the gate's; never the session itself or a copy of its conversation); ρ the
  continuation, the chance a later turn stays where this one goes (the share of the router's
  own later turns that stayed, online; ``continuation``).
- C⁺_j(a) = Î_r(d + j·τ) · (e_in·n̄_new + e_cache·H_j + e_out·n̄_out): turn k + j on a with its
  history cached, and C⁻_j(a) the same with the history recomputed (e_in·H_j for e_cache·H_j);
  H_j = H_0 + (j − 1)·(n̄_new + n̄_out) its history, H_0 = N_hist + N_new + N̂_out after this turn,
  n̄_new, n̄_out the mean tokens of a later turn (training conversations, in a's model's tokens),
  τ the mean time between a session's turns (think time + service), Î_r a carbon forecast made
  now from the data up to now (:mod:`carbonrouter_lib.forecast`).
- p_a: the chance a's cache survives a think time — TTL and eviction by other sessions —
  estimated online per KV pool from what returning sessions find (L(b) / N_hist on their
  previous deployment b; an exponential average, started at the training sessions' share of
  think times within the TTL).
- q_m: the chance model m stays quality-feasible at the next turn given it is now (training
  conversations). With 1 − q_m the session must leave m (*model stickiness*: a small model
  feasible for this turn against the big model's cache), and it goes where training sessions
  went: f_{m→m′}, the share of the turns where m turned infeasible whose smallest feasible model
  was m′ (:attr:`HorizonModel.fallback`), recomputing its history on the cheapest deployment of
  m′, M_j(m′) = min over deployments a′ of m′ of C⁻_j(a′). The former router sent it to the
  cheapest recomputing deployment of *any* other model (``exit="cheapest"``), on ShareGPT
  Gemma-3-1B, which is never feasible: a turn on a small model looked cheap to leave, and the
  router hopped there and back, recomputing the big model's history each time.
- X_j = min over deployments a′ of the models a later turn can need (:attr:`HorizonModel.
  eligible`) of C⁻_j(a′): moving at turn k + j to the least-carbon deployment, recomputing; p*_j
  its KV pool. φ_p is the chance a new cache in pool p evicts another: an exponential average
  (``smoothing``) over queries of whether this query's context (in the reference model's tokens)
  would not fit in p's free KV memory, started at 1.

Why the option is weighted by φ. Committing to a (U_j) is right when leaving is expensive: the
move recomputes the history, and the caches a session leaves behind and the one it builds
elsewhere take memory other sessions lose. Where the move's pool has room, a later move costs its
recomputation only, so a future turn costs at most X_j, whatever a is; where the pool is full
(φ = 1) the move's cache evicts others' as much as it saves and the router commits, as the former
router always did. Both parts were designed on the tuned setting and on ShareGPT with ample KV
memory in winter (where committing lost to CarbonRouter's one-turn proposal); they add no
parameter (φ's smoothing is the cache survival's).

With J = 0 the sum is empty and the router is CarbonRouter's proposal (argmin Ĉ_k, first index
on ties); it decides only from what is known at dispatch. The former router's sum (``exit=
"cheapest"``, ``option=False``) has a closed form: with w_j = S_k(j)·ρ^(j−1)·Î_r(d + j·τ),
Σ_j w_j·H_j = H_0·A_r + (n̄_new + n̄_out)·B_r with A_r = Σ_j w_j and B_r = Σ_j (j − 1)·w_j, and
its exit takes the deployment of least total recomputation over the J turns; with the fallback
exit or the option the terms are summed turn by turn, O(J·deployments) per decision. Parts switch
off for ablations: ``horizon=0`` (no horizon pricing), ``forecast="persistence"`` (no forecast),
``cache_survival=False`` (p = 1), ``model_stickiness=False`` (q = 1), ``exit="cheapest"``,
``option=False``. ``release=True`` is a variant that needs the backend: when a turn leaves a
session's previous deployment it asks the backend to drop the cache left there (it would only
crowd other sessions' caches), via :meth:`Policy.released`.

The *return exit* (``exit="return"``, a variant). The fallback exit prices a fall from m to m′
as recomputing the history on m′'s least-carbon deployment, even where the session still has a
cache of m′: the one it left when it moved to m. A session that hops from the 70B to a small
model and comes back finds that cache if it survived, and the clairvoyant bound's paths do just
that (a quarter of their later turns on ShareGPT return to a cache, docs/model.md §11.4c). With
``exit="return"``, for each fallback model m′ with a cache of the session on deployment h (the
longest, L_h tokens; :func:`carbonrouter_lib.kernel.return_targets`), the exit's term of m′ at
turn k + j is

    E_j(m′) − p_h^(j+1)·max(E_j(m′) − R_j(h), 0),
    R_j(h) = Î_{r(h)}(d + j·τ)·(E⁻_j(h) − (e_in − e_cache)·L_h)

E_j(m′) = M_j(m′) the least recomputing turn of m′ as before, E⁻_j(h) turn k + j on h with its
history recomputed, and p_h the chance a cache *left behind* in h's KV pool survives a think
time, raised to the j + 1 think times the cache waits: the session takes the cheaper of the two
if the cache is still there. With no cache of m′ it is the fallback exit. It reads only the
session's caches at dispatch. p_h is learned online, per KV pool, from what sessions find of the
caches they left (:func:`carbonrouter_lib.kernel.leave` records, per model, the longest cache a
served turn leaves behind; :func:`~carbonrouter_lib.kernel.observe_left` compares it with what
the session holds there at its next turn), not from p_a, what sessions find of the cache they
stayed on: a cache left behind is the least recently used of its pool and is evicted before
those. Two earlier rules stand in the history: p_a^(j+1) (commit c786c95) lost 9–18 points of
the bound's possible saving on ShareGPT under the paper's memory rule and gained 0.2–4.3 points
with ample memory; (1 − φ_h)·p_a^(j+1) (commit 83a30e1, φ_h the option's chance a new cache in
h's pool evicts another, a proxy for the left cache's fate) lost 1.4–3.6 points there and gained
up to 0.8 (docs/model.md §11.4a).

The *slot price* (``slot_price``; on by default where J ≥ 1, ``slot_price=False`` is the router
without it) prices the session slot a choice takes from the next sessions (docs/model.md
§11.4a): a session holds its (region, GPU) pool's slot until it ends, and a full clean pool
sends new sessions elsewhere. At every first turn the router observes the
displacement g = Ĉ(greedy choice among the available) − Ĉ(least-carbon feasible deployment) when
that deployment's pool p is full (0 otherwise), and keeps per pool an average over first turns
m_p (smoothing ``slot_smoothing``), the mean displacement ḡ_p of the displaced ones and the rate
Λ of first turns (1/s). A slot of p is worth π_p = min(m_p·Λ, ḡ_p / D̄) gCO2e per second — the
displacement it would absorb, at most one displaced session per session duration D̄ = τ·(½ +
Σ_j S_0(j)). A candidate a then costs H(a) + π_{p(a)}·T_k, with T_k = τ·(½ + Σ_j S_k(j)) the
session's expected remaining time, unless p(a) is the pool the session holds (then 0); leaving
that pool b frees its slot, so a switch pays (π_{p(a)} − π_b)·T_k (the *slot credit*). It reads
only past first turns; both replay loops run it. With ``slot_credit=False`` a switch is not
credited the slot it frees and pays π_{p(a)}·T_k (staying in the held pool still costs 0). The
credit pays a session to leave the pool it holds, and each move recomputes the history where
it lands: with ample KV memory on ShareGPT that raised the router's P95 TTFT above
CarbonRouter's, and without the credit the router met that target in every setting evaluated, at
a carbon cost on the Mooncake trace (a variant; docs/evidence/slot_credit.py, docs/model.md
§11.4a). With ``slot_residence=True`` a slot is held only while the
session stays: T_k = τ·(½ + Σ_j S_k(j)·ρ^(j−1)) and D̄ likewise, with the continuation ρ of the
future term (the chance a later turn stays where this one goes), so the price shrinks where the
router switches often — where the cache survives a switch (ample KV memory) — and is the plain
slot price where it never switches (ρ = 1).

The *TTFT price* (``ttft_slo_s``: on when the router is given an SLO, off without one;
docs/model.md §11.4b) keeps the P95 of the served queries' TTFT (Eq. 6) at most that SLO: the
chance constraint P(TTFT > SLO) ≤ ``ttft_share`` (0.05) enters the choice through a Lagrange
multiplier ν ≥ 0. A candidate whose TTFT (N_new + N_hist − L(a)) / v_pre exceeds the SLO costs
ν·min_a′ Ĉ_k(a′) more (ν counts turns of this query's least carbon), and after each served query
ν ← max(0, ν + ``ttft_step``·(1{TTFT > SLO} − share)) (dual ascent). Where more than the share
of queries exceed the SLO, ν rises until they no longer do. Where fewer do, ν is 0 except just
after an exceedance, which raises it by step·(1 − share) for the next (1 − share)/share queries
(19): an SLO no query misses leaves every decision the router's without the price, one that is
missed rarely changes a few. A query whose every candidate exceeds the SLO (a long prompt) is
priced alike on all of them: the price cannot move it, and where such queries exceed the share ν
keeps rising and the router meets the SLO wherever a candidate can. It reads only TTFTs already
served; both replay loops run it.

The *KV price* (``kv_price``, on by default where J ≥ 1 since 2026-12-06, counting the losses
within the TTL; docs/model.md §11.4a). Under the paper's memory
rule a turn that builds a cache in a full KV pool evicts other sessions' caches, and they
recompute that history at their next turn: a cost the session's own horizon does not see. For
each candidate a in KV pool p the router counts the tokens its turn would evict, max(0, H_0(a) −
L(a) − free_p) (free_p the pool's free KV tokens at dispatch), and prices each at λ_p = (carbon
the sessions in p lost to missing history) / (tokens the router's own choices evicted in p), both
summed since the run's start: at each session's turn, what it lost on its previous deployment b
is (N_hist − L(b))·(e_in − e_cache)·CI_b now (TTL and eviction alike), and each served turn adds
its evicted tokens (:func:`carbonrouter_lib.kernel.kv_prices`). Caches of sessions that have left
are evicted first and lose nothing, so λ_p stays low where a full pool holds them. It adds no
parameter, reads only the past, and both replay loops run it. With ``kv_loss="within_ttl"``
(the default) the numerator counts only the losses of sessions that came back within the TTL of
their latest completion: a loss after it is the TTL's, which no choice of the router can spare.
The default router is the pair, the KV price within the TTL beside the TTFT price where it is
given an SLO; ``kv_price=False`` is the router before it (docs/model.md §11.4a, the decision).

*Told the future* (references, not online policies; docs/evidence/told.py). ``forecast=
"clairvoyant"`` prices the future turns with the intensities that will be in force at d + j·τ
(:class:`carbonrouter_lib.forecast.Clairvoyant`), and ``session_length="told"`` with the
session's true number of turns K: S_k(j) = 1{k + j < K} in the future term and in the slot
price's T_k (D̄ stays the training sessions' mean). ``future_models="told"`` prices each future
turn k + j the session has with the models it will need: q_m = 1{m quality-feasible at turn
k + j} and the exit the least-carbon recomputing deployment of the smallest model that will be
(past the session's last turn, and so beyond it for a router not also told the length, the
learned q_m and exit). They measure how much of the clairvoyant bound's possible saving is the
information the router lacks; both replay loops run them.

Units: gCO2e, kWh, tokens, seconds, gCO2e/kWh.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from carbonrouter_lib import cost, kernel
from carbonrouter_lib.paper import DEFAULTS
from carbonrouter_lib.policies.base import Candidates, Policy, QueryContext
from carbonrouter_lib.profiles import MODELS, REFERENCE_DEPLOYMENT

__all__ = ["HorizonModel", "HorizonRouter", "fit_horizon_model", "forecast_error", "LEARNED",
           "EXITS", "SESSION_LENGTHS", "FUTURE_MODELS", "survival_rows", "survival_table",
           "turn_starts"]

#: ``model=LEARNED``: the horizon model is fitted on the replayed workload by the runner.
LEARNED = "learned"
#: Which losses λ_p of the KV price counts (``HorizonRouter.kv_loss``).
KV_LOSSES = ("all", "within_ttl")
#: Where model stickiness sends a session whose model turns infeasible (``HorizonRouter.exit``).
EXITS: tuple[str, ...] = ("fallback", "cheapest", "return")
#: Where S_k(j) comes from (``HorizonRouter.session_length``): the training sessions, or the
#: session's own number of turns (a reference that reads the future).
SESSION_LENGTHS: tuple[str, ...] = ("learned", "told")
#: Where q_m and the exit of each future turn come from (``HorizonRouter.future_models``): the
#: training sessions, or the models the session's own future turns will need (a reference that
#: reads the future).
FUTURE_MODELS: tuple[str, ...] = ("learned", "told")


@dataclass
class HorizonModel:
    """What the horizon router learns from training conversations, per conversation fold.

    Attributes
    ----------
    folds, seed
        Conversations are split into ``folds`` folds by a hash of the conversation (seeded,
        :func:`carbonrouter_lib.prepared.conversation_folds`); fold f's values come from the others.
    horizon
        J: future turns priced.
    survival
        (folds, K_max + 1, J): S_k(j) = P(K > k + j | K > k); turns k ≥ K_max use row K_max.
    new_tokens, out_tokens
        (folds, n_models): mean new input and output tokens of a later turn (turn ≥ 1), tokens.
    stay_feasible
        (folds, n_models): P(model feasible at turn k + 1 | feasible at turn k).
    gap_s
        (folds,): mean time between the dispatches of consecutive turns (think + reference
        service), s.
    keep_prior
        (folds,): share of think times within the TTL (the prior of the cache survival).
    beta_q
        The quality threshold the feasibility rates were computed with.
    fallback
        (folds, n_models, n_models): row m, the share of the training turns where model m,
        feasible at turn k, is infeasible at turn k + 1 whose smallest feasible model is each
        other model — where a session on m goes when m turns infeasible. Zero diagonal, rows
        sum to 1; a model never seen turning infeasible falls back to the largest model (the
        second largest for the largest). None (a hand-built model): that default everywhere.
    eligible
        (folds, n_models) bool: the models feasible at some later turn (turn ≥ 1) of a training
        conversation, the ones a future move can go to. None: every model.
    turns
        (n_conversations,) int64: each conversation's number of turns, by conversation code
        (:func:`carbonrouter_lib.prepared.conversation_codes`) — the future, read only by the
        references told the session length or the models (``session_length="told"``,
        ``future_models="told"``). None (every fitted model unless ``fit_horizon_model(
        tell_turns=True)`` or ``tell_models=True``).
    feasible_turns
        (rows, n_models) bool: the quality-feasible models (at ``beta_q``) of every turn of
        every conversation, conversation c's turns at rows s[c] … s[c + 1] − 1 with s =
        :func:`turn_starts` of ``turns`` — the future, read only by the reference told the models
        of the future turns (``future_models="told"``). None unless ``fit_horizon_model(
        tell_models=True)``.
    """

    folds: int
    seed: int
    horizon: int
    survival: np.ndarray
    new_tokens: np.ndarray
    out_tokens: np.ndarray
    stay_feasible: np.ndarray
    gap_s: np.ndarray
    keep_prior: np.ndarray
    beta_q: float
    meta: dict = field(default_factory=dict)
    fallback: np.ndarray | None = None
    eligible: np.ndarray | None = None
    turns: np.ndarray | None = None
    feasible_turns: np.ndarray | None = None

    def __post_init__(self) -> None:
        n_m = self.new_tokens.shape[1]
        if self.fallback is None:
            self.fallback = np.repeat(_largest_fallback(n_m)[None], self.folds, axis=0)
        if self.eligible is None:
            self.eligible = np.ones((self.folds, n_m), dtype=bool)
        self.fallback = np.ascontiguousarray(self.fallback, np.float64)
        self.eligible = np.ascontiguousarray(self.eligible, np.bool_)
        if self.fallback.shape != (self.folds, n_m, n_m) or self.eligible.shape != (
                self.folds, n_m):
            raise ValueError(f"HorizonModel: fallback must be (folds, models, models) and "
                             f"eligible (folds, models), got {self.fallback.shape}, "
                             f"{self.eligible.shape}")

    def fold_of(self, conversation: int) -> int:
        return kernel.conversation_fold(conversation, self.folds, self.seed)


def fit_horizon_model(table: pd.DataFrame, beta_q: float = DEFAULTS["beta_q"],
                      ttl_s: float = DEFAULTS["ttl_s"],
                      horizon: int = 16, folds: int = 5, seed: int = 0,
                      tell_turns: bool = False, tell_models: bool = False,
                      models: tuple[str, ...] = MODELS) -> HorizonModel:
    """Fit the :class:`HorizonModel` on a prepared workload: for each conversation fold f, the
    session-length survival, the mean tokens of later turns, the models' next-turn feasibility,
    the mean gap between turns and the share of think times within ``ttl_s`` — all from the
    conversations of the *other* folds (each conversation counted once, however many copies the
    replay has of it). ``tell_turns``: also record every conversation's number of turns
    (:attr:`HorizonModel.turns`, for the reference told the session length only);
    ``tell_models``: also every turn's quality-feasible models (:attr:`HorizonModel.
    feasible_turns`, with ``turns``, for the reference told the models of the future turns
    only). ``models``: the deployments' models (catalog names in the catalog's order, as
    :class:`~carbonrouter_lib.deployments.Deployments` has them), the model axes of the fit's
    arrays; a session whose model turns infeasible goes to the smallest of these feasible then
    (the live router fits it for the models it serves)."""
    from carbonrouter_lib import prepared

    if horizon < 0 or folds < 2:
        raise ValueError(f"horizon must be ≥ 0 and folds ≥ 2, got {horizon}, {folds}")
    unknown = [m for m in models if m not in MODELS]
    if unknown or not models or list(models) != sorted(models, key=MODELS.index):
        raise ValueError(f"fit_horizon_model: models must be catalog models {MODELS} in that "
                         f"order (the workload has their tokens and quality), got {models}")
    cols = [MODELS.index(m) for m in models]
    conv = prepared.conversation_codes(table)
    fold_row = prepared.conversation_folds(conv, folds, seed)
    turn = table["turn"].to_numpy()
    n_turns = table["n_turns"].to_numpy()
    think = table["think_s"].to_numpy(np.float64)
    new, out, q = (prepared.model_matrix(table, name)[:, cols].astype(np.float64)
                   for name in ("new_tokens", "output_tokens", "quality"))
    feasible = cost.quality_feasible(q, beta_q)
    service = prepared._reference_service(table)
    # one row per conversation (its first session's rows), so copies do not weigh it more
    first_copy = np.zeros(len(table), dtype=bool)
    sessions = table["session"].to_numpy()
    first_session = pd.Series(sessions).groupby(conv).transform("min").to_numpy()
    first_copy[sessions == first_session] = True
    k_max = int(n_turns.max())
    n_m = len(models)
    surv = np.zeros((folds, k_max + 1, horizon))
    new_mean = np.zeros((folds, n_m))
    out_mean = np.zeros((folds, n_m))
    stay = np.ones((folds, n_m))
    fallback = np.repeat(_largest_fallback(n_m)[None], folds, axis=0)
    eligible = np.zeros((folds, n_m), dtype=bool)
    smallest = np.argmax(feasible, axis=1)  # MODELS run from the smallest to the largest
    gap = np.zeros(folds)
    keep = np.zeros(folds)
    for f in range(folds):
        train = (fold_row != f) & first_copy
        if not train.any():
            raise ValueError(f"fit_horizon_model: no training conversations for fold {f}")
        lengths = n_turns[train & (turn == 0)]
        # reach[n] = conversations with more than n turns (turn n exists)
        reach = np.array([(lengths > n).sum() for n in range(k_max + horizon + 2)], np.float64)
        for k in range(k_max + 1):
            if reach[k] > 0:
                surv[f, k] = reach[k + 1:k + 1 + horizon] / reach[k]
        later = train & (turn > 0)
        if later.any():
            new_mean[f] = new[later].mean(axis=0)
            out_mean[f] = out[later].mean(axis=0)
            gap[f] = float((think[later] + service[later]).mean())
            keep[f] = float((think[later] <= ttl_s).mean())
        # next-turn feasibility: pairs of consecutive rows of one session
        nxt = train[:-1] & (sessions[1:] == sessions[:-1])
        now, after = feasible[:-1][nxt], feasible[1:][nxt]
        both = now & after
        with np.errstate(invalid="ignore", divide="ignore"):
            rate = both.sum(axis=0) / now.sum(axis=0)
        stay[f] = np.where(now.sum(axis=0) > 0, rate, 1.0)
        # where a session goes when its model turns infeasible: the smallest model feasible then
        dest = smallest[1:][nxt]
        for m in range(n_m):
            lost = now[:, m] & ~after[:, m]
            if lost.any():
                fallback[f, m] = np.bincount(dest[lost], minlength=n_m) / lost.sum()
        eligible[f] = feasible[later].any(axis=0) if later.any() else True
    turns_of = feasible_turns = None
    if tell_turns or tell_models:
        turns_of = np.zeros(int(conv.max()) + 1, np.int64)
        turns_of[conv] = n_turns
        if np.any(turns_of[conv] != n_turns):  # copies of a conversation replay all its turns
            raise ValueError("fit_horizon_model: copies of a conversation differ in n_turns")
    if tell_models:
        # each conversation's turns once (its first session's rows), in turn order
        rows = np.flatnonzero(first_copy)
        rows = rows[np.lexsort((turn[rows], conv[rows]))]
        start = turn_starts(turns_of)
        if len(rows) != start[-1] or np.any(
                turn[rows] != np.arange(len(rows)) - start[conv[rows]]):
            raise ValueError("fit_horizon_model: a conversation's turns are not 0 … K − 1")
        feasible_turns = np.ascontiguousarray(feasible[rows], np.bool_)
    return HorizonModel(folds=folds, seed=seed, horizon=horizon, survival=surv,
                        new_tokens=new_mean, out_tokens=out_mean, stay_feasible=stay, gap_s=gap,
                        keep_prior=keep, beta_q=float(beta_q),
                        meta={"n_conversations": int(len(np.unique(conv))), "ttl_s": ttl_s},
                        fallback=fallback, eligible=eligible, turns=turns_of,
                        feasible_turns=feasible_turns)


def reference_model(models: tuple[str, ...]) -> int:
    """The model whose tokens measure a query's context for the option to move (φ_p): the
    reference deployment's, else the largest of ``models`` (the catalog runs from the smallest
    to the largest). An index into ``models``."""
    ref = REFERENCE_DEPLOYMENT[0]
    return models.index(ref) if ref in models else len(models) - 1


def turn_starts(turns: np.ndarray) -> np.ndarray:
    """(len(turns) + 1,) int64: where each conversation's turns start in
    :attr:`HorizonModel.feasible_turns` (the cumulative numbers of turns ``turns``)."""
    return np.concatenate([[0], np.cumsum(turns)]).astype(np.int64)


def _largest_fallback(n_m: int) -> np.ndarray:
    """(n_m, n_m): every model falls back to the largest, the largest to the second largest."""
    w = np.zeros((n_m, n_m))
    w[:, n_m - 1] = 1.0
    if n_m > 1:
        w[n_m - 1] = 0.0
        w[n_m - 1, n_m - 2] = 1.0
    return w


class HorizonRouter(Policy):
    """The horizon router (module docstring). Registry name ``carbonrouter-horizon``.

    Parameters
    ----------
    horizon : int
        J, future turns priced (0: CarbonRouter's proposal). Default 1, with the slot price's
        remaining time over ``slot_turns`` = 16 (since 2026-12-07; before, J = 16 for both, chosen
        at the tuned setting: docs/model.md §11.4a, "The pair's horizon J": J = 1 with the slot
        price over 16 turns emits less than J = 16 in 57 of notebook 09's 80 settings and more in
        none, with paired CIs).
    forecast : str
        Carbon forecast of the future turns' regions (:data:`carbonrouter_lib.forecast.
        FORECASTERS`). Default ``"blend"``.
    cache_survival : bool
        Price the chance a cache is gone at the next turn (False: it always survives).
    model_stickiness : bool
        Price the chance the model is infeasible at the next turn (False: it never is).
    release : bool
        Variant: ask the backend to drop the cache a session leaves behind when it switches.
    smoothing : float
        Weight of a new observation in the per-pool cache-survival average, in (0, 1].
    model : HorizonModel or "learned"
        The fitted model; ``"learned"`` (default) to be fitted by the runner on the replayed
        workload (:meth:`set_model`).
    forecast_noise : float
        σ ≥ 0 of a multiplicative log-normal error put on every forecast value, Î·exp(σ·ε −
        σ²/2) with ε ~ N(0, 1) (mean-preserving), drawn per (grid row, fold) from
        ``noise_seed`` — the forecast-error sensitivity. Default 0 (the forecast as made).
    noise_seed : int
        Seed of those draws.
    slot_price : bool or None
        Price the session slot a choice takes from the next sessions (module docstring).
        Default None: on when ``horizon`` ≥ 1 (the default since it had the lowest CO2 in 18 of
        the full grid's 32 settings against 2 without it, 19 against 3 with the machine-independent
        estimators; docs/evidence/horizon_plain_full_*.csv
        is the router without it); False: off; True with ``horizon=0`` is an error.
    slot_smoothing : float
        Weight of a new first turn in the slot price's averages, in (0, 1]. Default 0.01.
    slot_turns : int or None
        The future turns the slot price's T_k and D̄ sum S_k(j) over
        (``τ·(½ + Σ_{j ≤ slot_turns} S_k(j))``), apart from the future term's J; None: J. Default
        16. It acts only with the slot price and without ``slot_residence`` (which weights the
        future term's J turns); elsewhere the router is the same whatever it is
        (:attr:`slot_horizon`). The horizon model is fitted for max(J, the slot price's turns)
        (:attr:`model_horizon`).
    slot_residence : bool
        With ``slot_price``: a slot is held only while the session stays on the pool, so T_k
        and D̄ count the future turns weighted by the continuation ρ^(j−1) of the future term
        (``τ·(½ + Σ_j S_k(j)·ρ^(j−1))``) — the price backs off where the router switches
        often (module docstring). Default False.
    exit : str
        Where model stickiness sends a session whose model turns infeasible: ``"fallback"``
        (default) the model the training conversations fell back to
        (:attr:`HorizonModel.fallback`), ``"cheapest"`` the cheapest recomputing deployment of
        any other model (the former router's M_j), ``"return"`` the fallback, except that a
        fallback model m′ the session still has a cache of may be served there: a variant
        (module docstring, "The return exit").
    slot_credit : bool
        With ``slot_price``: a switch is credited the slot it frees in the pool the session
        holds, so it pays (π_{p(a)} − π_b)·T_k (default True); False: staying in the held pool
        is free and a switch pays π_{p(a)}·T_k, with no credit for leaving (module docstring).
    ttft_slo_s : float or None
        The TTFT the served queries' P95 should not exceed, s (the TTFT price, module
        docstring); None (default): no TTFT price.
    ttft_share : float
        With ``ttft_slo_s``: the share of queries allowed above it, in (0, 1). Default 0.05 (a
        P95 objective).
    ttft_step : float
        With ``ttft_slo_s``: the dual step of ν per served query, in (0, 1). Default 0.05.
    option : bool
        Price each future turn at the cheaper of committing to the candidate and moving to the
        least-carbon deployment of a model a later turn can need, the move weighted by the chance
        its KV pool has room (1 − φ; module docstring). Default True.
    session_length : str
        ``"learned"`` (default): S_k(j) from the training sessions. ``"told"``: the session's
        true number of turns (a reference that reads the future, not an online policy; its model
        must be fitted with ``tell_turns=True``, as :func:`carbonrouter_lib.build.build_policy`
        does). ``forecast="clairvoyant"`` is the intensities' counterpart.
    future_models : str
        ``"learned"`` (default): q_m and the exit from the training sessions. ``"told"``: at
        each future turn that the session has, q_m is whether model m will be quality-feasible
        there and the exit the smallest model that will be (a reference that reads the future;
        its model must be fitted with ``tell_models=True``; needs ``model_stickiness``).
    kv_price : bool or None
        Price the cached tokens of other sessions a choice evicts in a full KV pool at λ_p, the
        carbon sessions lost there to missing history per token this router's choices evicted
        there (module docstring, "The KV price"). Default None: on where ``horizon`` ≥ 1.
    kv_loss : str or None
        With ``kv_price``: which losses λ_p counts. ``"within_ttl"`` (the default with the KV
        price): only those where the session came back within the TTL of its latest completion
        (``Backend.last_completion``), which no expiry can have caused, so only an eviction.
        ``"all"``: every loss a session finds on its previous deployment.
    """

    name = "carbonrouter-horizon"

    def __init__(self, horizon: int = 1, forecast: str = "blend", cache_survival: bool = True,
                 model_stickiness: bool = True, release: bool = False, smoothing: float = 0.05,
                 continuation: float | str = "online",
                 model: HorizonModel | str = LEARNED, forecast_noise: float = 0.0,
                 noise_seed: int = 0, slot_price: bool | None = None,
                 slot_smoothing: float = 0.01, slot_residence: bool = False,
                 exit: str = "fallback", option: bool = True, slot_credit: bool = True,
                 ttft_slo_s: float | None = None, ttft_share: float = 0.05,
                 ttft_step: float = 0.05, session_length: str = "learned",
                 future_models: str = "learned", kv_price: bool | None = None,
                 kv_loss: str | None = None, slot_turns: int | None = 16) -> None:
        from carbonrouter_lib.forecast import FORECASTERS, REFERENCE_FORECASTERS

        if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 0:
            raise ValueError(f"HorizonRouter.horizon must be an integer ≥ 0, got {horizon!r}")
        if forecast not in FORECASTERS + REFERENCE_FORECASTERS:
            raise ValueError(f"HorizonRouter.forecast must be one of "
                             f"{FORECASTERS + REFERENCE_FORECASTERS}, got {forecast!r}")
        if session_length not in SESSION_LENGTHS:
            raise ValueError(f"HorizonRouter.session_length must be one of {SESSION_LENGTHS}, "
                             f"got {session_length!r}")
        if session_length == "told" and horizon == 0:
            raise ValueError("HorizonRouter.session_length='told' needs horizon ≥ 1")
        self.session_length = session_length
        if future_models not in FUTURE_MODELS:
            raise ValueError(f"HorizonRouter.future_models must be one of {FUTURE_MODELS}, "
                             f"got {future_models!r}")
        if future_models == "told" and (horizon == 0 or not model_stickiness):
            raise ValueError("HorizonRouter.future_models='told' needs horizon ≥ 1 and "
                             "model_stickiness=True (it tells q_m and the exit)")
        self.future_models = future_models
        if slot_price is None:
            slot_price = horizon > 0
        if kv_price is None:
            kv_price = horizon > 0
        if exit not in EXITS:
            raise ValueError(f"HorizonRouter.exit must be one of {EXITS}, got {exit!r}")
        if exit == "return" and future_models == "told":
            raise ValueError("HorizonRouter.exit='return' prices the learned exit; with "
                             "future_models='told' the exit is told")
        for name, v in (("cache_survival", cache_survival), ("model_stickiness",
                                                             model_stickiness),
                        ("release", release), ("slot_price", slot_price),
                        ("slot_residence", slot_residence), ("option", option),
                        ("slot_credit", slot_credit), ("kv_price", kv_price)):
            if not isinstance(v, bool):
                raise ValueError(f"HorizonRouter.{name} must be a bool, got {v!r}")
        for name, v in (("smoothing", smoothing), ("slot_smoothing", slot_smoothing)):
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= 1:
                raise ValueError(f"HorizonRouter.{name} must be in (0, 1], got {v!r}")
        if slot_price and horizon == 0:
            raise ValueError("HorizonRouter.slot_price needs horizon ≥ 1 (it prices the "
                             "session's remaining time from the survival of its length)")
        if slot_residence and not slot_price:
            raise ValueError("HorizonRouter.slot_residence needs slot_price=True")
        if slot_turns is not None:
            if isinstance(slot_turns, bool) or not isinstance(slot_turns, int) or slot_turns < 1:
                raise ValueError(f"HorizonRouter.slot_turns must be None or an integer ≥ 1, "
                                 f"got {slot_turns!r}")
        self.slot_turns = slot_turns
        self.slot_price, self.slot_smoothing = slot_price, float(slot_smoothing)
        if not slot_credit and not slot_price:
            raise ValueError("HorizonRouter.slot_credit=False needs slot_price=True")
        self.slot_residence, self.slot_credit = slot_residence, slot_credit
        if kv_price and horizon == 0:
            raise ValueError("HorizonRouter.kv_price needs horizon ≥ 1 (with J = 0 the router is "
                             "CarbonRouter's proposal)")
        self.kv_price = kv_price
        if kv_loss is None:
            kv_loss = "within_ttl" if kv_price else "all"
        if kv_loss not in KV_LOSSES:
            raise ValueError(f"HorizonRouter.kv_loss must be one of {KV_LOSSES}, got {kv_loss!r}")
        if kv_loss != "all" and not kv_price:
            raise ValueError("HorizonRouter.kv_loss needs kv_price=True")
        self.kv_loss = kv_loss
        self.exit, self.option = exit, option
        if ttft_slo_s is not None and (isinstance(ttft_slo_s, bool) or not isinstance(
                ttft_slo_s, int | float) or not 0 < ttft_slo_s < math.inf):
            raise ValueError(f"HorizonRouter.ttft_slo_s must be None or a number of seconds > 0, "
                             f"got {ttft_slo_s!r}")
        for name, v in (("ttft_share", ttft_share), ("ttft_step", ttft_step)):
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < 1:
                raise ValueError(f"HorizonRouter.{name} must be in (0, 1), got {v!r}")
        if ttft_slo_s is not None and horizon == 0:
            raise ValueError("HorizonRouter.ttft_slo_s needs horizon ≥ 1 (with J = 0 the router "
                             "is CarbonRouter's proposal)")
        self.ttft_slo_s = None if ttft_slo_s is None else float(ttft_slo_s)
        self.ttft_share, self.ttft_step = float(ttft_share), float(ttft_step)
        if not (continuation == "online" or (isinstance(continuation, int | float)
                                              and not isinstance(continuation, bool)
                                              and 0 <= continuation <= 1)):
            raise ValueError(f"HorizonRouter.continuation must be 'online' or in [0, 1], "
                             f"got {continuation!r}")
        if isinstance(forecast_noise, bool) or not isinstance(forecast_noise, int | float) or not (
                0 <= forecast_noise < 10):
            raise ValueError(f"HorizonRouter.forecast_noise must be a number in [0, 10), "
                             f"got {forecast_noise!r}")
        if isinstance(noise_seed, bool) or not isinstance(noise_seed, int) or noise_seed < 0:
            raise ValueError(f"HorizonRouter.noise_seed must be an integer ≥ 0, "
                             f"got {noise_seed!r}")
        self.forecast_noise, self.noise_seed = float(forecast_noise), noise_seed
        self.continuation = continuation
        if not (model == LEARNED or isinstance(model, HorizonModel)):
            raise ValueError(f"HorizonRouter.model must be a HorizonModel or {LEARNED!r}")
        self.horizon, self.forecast = horizon, forecast
        self.cache_survival, self.model_stickiness = cache_survival, model_stickiness
        self.release, self.smoothing = release, float(smoothing)
        self.releases_caches = release
        self.model: HorizonModel | str = model
        self._bound = None  # per-run state, set on the first query (the run's deployments)

    @property
    def slot_horizon(self) -> int:
        """The future turns the slot price's T_k and D̄ sum S_k(j) over: ``slot_turns`` where the
        slot price is on without the residence, else J (None: J)."""
        if self.slot_price and not self.slot_residence and self.slot_turns is not None:
            return self.slot_turns
        return self.horizon

    @property
    def model_horizon(self) -> int:
        """The future turns its horizon model must price: J, or the slot price's where more."""
        return max(self.horizon, self.slot_horizon)

    @property
    def needs_model(self) -> bool:
        """Whether the model is still to be fitted (``model == "learned"`` and J > 0)."""
        return self.horizon > 0 and isinstance(self.model, str)

    def unready(self) -> str | None:
        return "its horizon model is not fitted" if self.needs_model else None

    def fit_model(self, table: pd.DataFrame, beta_q: float, ttl_s: float,
                  models: tuple[str, ...] = MODELS) -> HorizonModel:
        """:func:`fit_horizon_model` on ``table`` as this router reads it: over its
        :attr:`model_horizon`, with what a reference told the session length or the future
        turns' models is told, for the deployments' ``models``; β_Q and the TTL ``ttl_s`` (s)
        of the setting."""
        return fit_horizon_model(table, beta_q, ttl_s, self.model_horizon,
                                 tell_turns=self.session_length == "told",
                                 tell_models=self.future_models == "told", models=models)

    def set_model(self, model: HorizonModel) -> None:
        """Set the fitted :class:`HorizonModel`."""
        if model.horizon < self.model_horizon:
            raise ValueError(f"the model prices {model.horizon} future turns, the router "
                             f"{self.model_horizon}")
        if self.session_length == "told" and model.turns is None:
            raise ValueError("HorizonRouter(session_length='told') needs a model fitted with "
                             "fit_horizon_model(tell_turns=True)")
        if self.future_models == "told" and model.feasible_turns is None:
            raise ValueError("HorizonRouter(future_models='told') needs a model fitted with "
                             "fit_horizon_model(tell_models=True)")
        self.model = model
        self._bound = None

    def params(self) -> dict:
        p = {"horizon": self.horizon, "forecast": self.forecast,
             "continuation": self.continuation,
             "cache_survival": self.cache_survival,
             "model_stickiness": self.model_stickiness, "release": self.release,
             "smoothing": self.smoothing, "forecast_noise": self.forecast_noise,
             "noise_seed": self.noise_seed}
        # recorded on or off, so a run's parameters rebuild its router whatever the default;
        # the smoothing only where it acts
        p["slot_price"] = self.slot_price
        if self.slot_price:
            p["slot_smoothing"] = self.slot_smoothing
        if self.slot_residence:
            p |= {"slot_residence": True}
        if self.slot_price and not self.slot_residence:
            p["slot_turns"] = self.slot_turns
        if not self.slot_credit:
            p |= {"slot_credit": False}
        if self.ttft_slo_s is not None:
            p |= {"ttft_slo_s": self.ttft_slo_s, "ttft_share": self.ttft_share,
                  "ttft_step": self.ttft_step}
        if self.session_length != "learned":
            p |= {"session_length": self.session_length}
        if self.future_models != "learned":
            p |= {"future_models": self.future_models}
        p["kv_price"] = self.kv_price
        if self.kv_price:
            p["kv_loss"] = self.kv_loss
        return p | {"exit": self.exit, "option": self.option}

    # ---- per-run state ----------------------------------------------------------------------

    def _bind(self, ctx: QueryContext) -> _RunState:
        from carbonrouter_lib.forecast import make_forecaster

        d = ctx.deployments
        if ctx.backend is None:
            raise ValueError("HorizonRouter needs ctx.backend (run it in simulate() or the live "
                             "router)")
        if ctx.signal is None:  # the live router behind a live provider (which checked it)
            self.check_live(history=False)
        model = self.model
        if isinstance(model, str):
            raise RuntimeError("HorizonRouter: the horizon model has not been fitted; "
                               "build.build_policy() fits it (experiments.run_policies and the "
                               "sweeps call it), or set_model(fit_horizon_model(...))")
        if model.new_tokens.shape[1] != len(d.models):
            raise ValueError(f"HorizonRouter: the horizon model was fitted for "
                             f"{model.new_tokens.shape[1]} models, the deployments have "
                             f"{len(d.models)} ({d.models}); fit_horizon_model(models=...)")
        kv_cap = ctx.backend.kv_capacities()  # fixed for a run, like the pools
        state = _RunState(
            # without a signal (a live provider's current values only): the current
            # intensities, held (persistence; check_live)
            forecaster=None if ctx.signal is None else make_forecaster(self.forecast,
                                                                       ctx.signal),
            noise=(self.forecast_noise, self.noise_seed),
            kv_pool=ctx.backend.kv_pool_of(),
            keep=np.full(len(kv_cap), float(model.keep_prior.mean())),
            gaps_s=model.gap_s, horizon=self.horizon,
        )
        state.kv_cap = np.asarray(kv_cap, np.int64)
        # writeable copies of the deployments' read-only arrays: the types the compiled loop's
        # are, so that Numba compiles the decision (kernel.horizon_decide) once for both
        state.e_in, state.e_cache, state.e_out = (np.array(x, np.float64)
                                                  for x in (d.e_in, d.e_cache, d.e_out))
        state.region, state.model = (np.array(x, np.int64) for x in (d.region, d.model))
        state.kv_pool = np.asarray(state.kv_pool, np.int64)
        state.future, state.miss = np.zeros(d.n), np.zeros(d.n)
        state.post = np.zeros(len(d.models))  # H_0 per model, tokens
        state.pool = np.array(d.pool, np.int64)
        state.displaced = np.zeros(d.n_pools)  # m_p, gCO2e per first turn
        state.gap = np.zeros(d.n_pools)  # ḡ_p, gCO2e per displaced first turn
        state.clock = np.array([0.0, math.nan])  # Λ (1/s), the last first turn's time (s)
        state.pi, state.price = np.zeros(d.n_pools), np.zeros(d.n)
        state.ttft_price, state.v_pre = np.zeros(d.n), np.array(d.v_pre, np.float64)
        state.surv = survival_table(model, self.session_length == "told")
        state.surv_sum = _survival_sums(state.surv, self.slot_horizon)
        state.stay_j = state.exit_j = None  # the told models' q_m and exits per future turn
        state.ret_dep = np.full(len(d.models), -1, np.int64)  # the return exit's targets
        state.ret_len = np.zeros(len(d.models))
        # the return exit's p_left per KV pool, and per session the caches it left (leave)
        state.keep_left = state.keep.copy()
        state.left = {}
        # the KV price (kernel.kv_prices): per KV pool the carbon lost to missing history and
        # the tokens this router's choices evicted; per deployment the price and evicted tokens
        state.kv_loss, state.kv_evicted = np.zeros(len(state.keep)), np.zeros(len(state.keep))
        state.kv_lam = np.zeros(len(state.keep))  # λ_p, renewed where loss or evicted change
        state.kv_price, state.kv_evict = np.zeros(d.n), np.zeros(d.n)
        if self.future_models == "told":
            state.stay_j = np.ones((len(d.models), self.horizon))
            state.exit_j = np.full(self.horizon, -1, np.int64)
            state.turn_start = turn_starts(model.turns)
        state.work = np.empty(kernel.horizon_work_size(len(d.regions), len(d.models), d.n,
                                                       self.horizon))
        # per KV pool: the chance a new cache there evicts another; 1 until seen otherwise, so
        # that a router with no evidence of room commits as the former router did
        state.phi = np.ones(len(state.keep))
        state.ref = reference_model(d.models)
        state.dom = kernel.dominant_blocks(state.e_in, state.e_out, state.model, len(d.models),
                                           d.n // len(d.regions))
        state.backend = state.used = None  # the backend and its KV tokens held per pool
        state.extra = type(self).extra_prices is not HorizonRouter.extra_prices
        # the parameters each decision branches on, read once
        state.kv_ttl = self.kv_price and self.kv_loss == "within_ttl"
        state.returns = self.exit == "return"
        state.online = self.continuation == "online"
        state.value, state.ttft = np.zeros(d.n), np.zeros(d.n)  # Ĉ and the TTFTs, per decision
        n_m = len(d.models)
        # the return exit's caches left by a session at its first turn: none
        state.no_left = (np.full(n_m, -1, np.int64), np.zeros(n_m))
        state.hs = self._struct(state, d)
        return state

    def _struct(self, state: _RunState, d) -> kernel.HorizonState:
        """The run's :class:`kernel.HorizonState` over ``state``'s arrays (shared, not copied)
        for the deployments ``d``, made at the bind."""
        model = self.model
        n_m, n_j = len(d.models), max(self.horizon, 1)
        told = self.future_models == "told"
        return kernel.new_horizon_state(  # kernel.HORIZON_STATE_FIELDS' order
            state.e_in, state.e_cache, state.e_out, state.e_in - state.e_cache, state.v_pre,
            state.region, state.model, state.kv_pool, state.pool, state.kv_cap, state.dom, n_m,
            d.n // len(d.regions),
            state.surv, *(np.ascontiguousarray(x, np.float64) for x in (
                model.new_tokens, model.out_tokens, model.stay_feasible)),
            model.fallback, model.eligible, state.surv_sum,
            np.ascontiguousarray(model.gap_s, np.float64),
            model.folds, model.seed & 0xFFFFFFFF, self.session_length == "told",
            np.asarray(model.turns, np.int64) if self.session_length == "told"
            else np.zeros(1, np.int64),
            self.horizon, self.smoothing, self.cache_survival, self.model_stickiness,
            self.exit != "cheapest", self.option, state.ref, self.slot_price,
            float(self.slot_smoothing), self.slot_residence, self.slot_credit,
            0.0 if self.ttft_slo_s is None else float(self.ttft_slo_s), self.kv_price, told,
            self.exit == "return",
            state.stay_j if told else np.ones((n_m, n_j)),
            state.exit_j if told else np.full(n_j, -1, np.int64),
            model.feasible_turns if told else np.zeros((1, 1), np.bool_),
            state.turn_start if told else np.zeros(2, np.int64),
            state.keep, state.phi, state.keep_left, state.post, state.future, state.miss,
            state.work, state.value, state.price, state.pi, state.displaced, state.gap,
            state.clock, state.ttft_price, state.ttft, state.kv_loss, state.kv_evicted,
            state.kv_lam, state.kv_price, state.kv_evict, state.ret_dep, state.ret_len,
            np.zeros(d.n, np.int64), np.zeros(d.n), np.zeros(d.n // len(d.regions)),
            np.zeros(d.n // len(d.regions)))

    # ---- the decision -----------------------------------------------------------------------

    def choose(self, ctx: QueryContext, cand: Candidates) -> int:
        if self.horizon == 0:
            return cand.argmin(cand.carbon)
        st = self._bound
        # (a copied or unpickled state has no compiled struct: a new run state, as a copy's
        # state meets deployments of its own anyway)
        if st is None or st.deployments is not ctx.deployments or st.hs is None:
            st = self._bound = self._bind(ctx)
            st.deployments = ctx.deployments
        backend, turn, prev, t = ctx.backend, ctx.turn, ctx.prev, ctx.time_s
        if st.backend is not backend:  # the KV tokens held per pool: the backend's own counts
            st.backend, st.used = backend, backend.pool_used_view()
        fcs = st.forecasts(t, ctx.ci_region)
        # the KV price observes no loss where the session's caches had outlived the TTL
        expired = (st.kv_ttl and turn > 0 and prev >= 0
                   and backend.last_completion(ctx.session) + backend.config.ttl_s < t)
        left = st.left.get(ctx.session, st.no_left) if st.returns else st.no_left
        # the whole decision in one compiled call (kernel.horizon_decide): the Python loop's
        # cost is in its calls and their arguments, not in the arithmetic
        a = kernel.horizon_decide(
            st.hs, ctx.conversation, turn, prev, t, expired,
            st.stayed if st.online else float(self.continuation), st.nu,
            ctx.batch.tokens, ctx.row, ctx.cached, ctx.ci, cand.mask, ctx.available,
            cand.ok_if_free, st.used, fcs[0], fcs[1], fcs[2], left[0], left[1])
        if not st.extra:
            return a
        extra = self.extra_prices(ctx, cand, st)
        if extra is None:
            return a
        return kernel.pick(st.value, st.future, st.price, st.ttft_price, st.kv_price, extra,
                           cand.mask, self.slot_price,
                           self.ttft_slo_s is not None and st.nu > 0.0, self.kv_price, True)

    def extra_prices(self, ctx: QueryContext, cand: Candidates, st: _RunState
                     ) -> np.ndarray | None:
        """A price per deployment (gCO2e, (n,); only the candidates' entries are read) added to
        the router's objective before the choice (J ≥ 1), for a subclass that prices something more
        (a prototype of one's own: the KV price began as one); None (the router): nothing. A
        subclass runs in the Python loop only: the compiled loop knows the router's own terms,
        so its :meth:`compiled` must return None."""
        return None

    def check_live(self, history: bool) -> None:
        """Raise ValueError (naming the parameter) where this router cannot route requests as
        they come: a reference told the future (``session_length``, ``future_models`` or the
        clairvoyant forecast); without the carbon signal's ``history`` (a live provider gives
        the current intensities only), any forecast but ``persistence``, or forecast noise."""
        told = {k: v for k, v in (("session_length", self.session_length),
                                  ("future_models", self.future_models),
                                  ("forecast", self.forecast)) if v in ("told", "clairvoyant")}
        if told:
            raise ValueError(f"HorizonRouter: {told} reads the future; a reference cannot route "
                             f"live")
        if not history and (self.forecast != "persistence" or self.forecast_noise > 0):
            raise ValueError(
                f"HorizonRouter: forecast={self.forecast!r}"
                f"{f' with forecast_noise={self.forecast_noise}' if self.forecast_noise else ''}"
                f" needs the carbon signal's history, and the carbon provider gives the current "
                f"intensities only: use forecast='persistence' (params: {{forecast: "
                f"persistence}}) or the replay provider")

    def compiled(self, info: kernel.ReplayInfo) -> dict | None:
        """The compiled rule (:mod:`carbonrouter_lib.kernel`), with the forecasts of every
        grid row of ``info.span_s`` and fold precomputed; None for a subclass."""
        if type(self) is not HorizonRouter:
            return None
        if self.horizon == 0:
            return kernel.rule(self.name)
        model = self.model
        if isinstance(model, str):
            return None  # not fitted: simulate refuses it before asking
        from carbonrouter_lib.forecast import make_forecaster
        from carbonrouter_lib.prepared import conversation_folds

        forecaster = make_forecaster(self.forecast, info.signal)
        row0 = info.signal.row_index(info.span_s[0])
        end = min(info.span_s[1], info.signal.row_interval(len(info.signal.frame) - 1)[0])
        row1 = info.signal.row_index(end)
        n_r = len(info.signal.regions)
        fc = np.empty((row1 - row0 + 1, model.folds, n_r, self.horizon))
        rows = np.arange(row0, row1 + 1)
        for f in range(model.folds):
            leads = forecaster.leads(model.gap_s[f] * np.arange(1, self.horizon + 1))
            fc[:, f] = forecaster.predict_rows(rows, leads)
            if self.forecast_noise > 0:
                for i, row in enumerate(rows.tolist()):
                    fc[i, f] *= forecast_error(self.forecast_noise, self.noise_seed, row, f,
                                               fc.shape[2:])
        online = self.continuation == "online"
        folds = conversation_folds(info.conversations, model.folds, model.seed).astype(np.int64)
        surv = survival_table(model, self.session_length == "told")
        return kernel.rule(
            self.name, h_j=self.horizon, h_online=online,
            h_rho=1.0 if online else float(self.continuation), h_smoothing=self.smoothing,
            h_cache_survival=self.cache_survival, h_stickiness=self.model_stickiness,
            h_release=self.release, h_survival=surv,
            h_new=np.ascontiguousarray(model.new_tokens, np.float64),
            h_out=np.ascontiguousarray(model.out_tokens, np.float64),
            h_stay=np.ascontiguousarray(model.stay_feasible, np.float64),
            h_keep0=float(model.keep_prior.mean()), h_fc=fc, h_row0=int(row0),
            h_fold=folds, h_sfold=survival_rows(model, info.conversations, folds,
                                                self.session_length == "told"),
            h_slot=self.slot_price, h_slot_s=self.slot_smoothing,
            h_surv_sum=_survival_sums(surv, self.slot_horizon),
            h_tau=np.ascontiguousarray(model.gap_s, np.float64), h_slot_res=self.slot_residence,
            h_slot_credit=self.slot_credit,
            h_fallback=model.fallback, h_eligible=model.eligible,
            h_use_fallback=self.exit != "cheapest", h_option=self.option,
            h_return=self.exit == "return", h_kvp=self.kv_price,
            h_kv_ttl=self.kv_loss == "within_ttl",
            h_ref=reference_model(MODELS),  # a replay deploys every catalog model
            h_tg_slo=0.0 if self.ttft_slo_s is None else self.ttft_slo_s,
            h_tg_share=self.ttft_share, h_tg_step=self.ttft_step,
            **(dict(h_told_m=True, h_tfeas=model.feasible_turns, h_tstart=turn_starts(model.turns),
                    h_conv=np.ascontiguousarray(info.conversations, np.int64))
               if self.future_models == "told" else {}))

    def on_served(self, ctx: QueryContext, a: int) -> None:
        st = self._bound
        if st is not None and self.ttft_slo_s is not None:
            # the TTFT price's multiplier, from the TTFT this query is served with (Eq. 6)
            ttft = cost.ttft_s(ctx.n_new_m[st.model[a]], ctx.n_hist_m[st.model[a]],
                               float(ctx.cached[a]), st.v_pre[a])
            st.nu = kernel.ttft_dual(st.nu, float(ttft), self.ttft_slo_s, self.ttft_share,
                                     self.ttft_step)
        if st is not None and ctx.turn > 0 and ctx.prev >= 0:
            # how often this router keeps a session where it was: the chance a future turn is
            # still on the deployment chosen now, per turn (the "online" continuation)
            st.stayed = kernel.running_mean(st.stayed, float(a == ctx.prev), self.smoothing)
        if st is not None and self.kv_price:  # the tokens the chosen turn evicted, for λ_p
            kernel.kv_evicted(st.kv_evicted, st.kv_lam, st.kv_loss, st.kv_pool[a],
                              float(st.kv_evict[a]))
        if st is not None and self.exit == "return":  # the caches the session leaves behind now
            left = st.left.get(ctx.session)
            if left is None:
                left = st.left[ctx.session] = (np.full(len(st.ret_dep), -1, np.int64),
                                               np.zeros(len(st.ret_dep)))
            kernel.leave(left[0], left[1], st.ret_dep, st.ret_len, a)

    def on_session_end(self, session: int) -> None:
        if self._bound is not None:
            self._bound.left.pop(session, None)

    def released(self, ctx: QueryContext, a: int) -> tuple[int, ...]:
        """With ``release``: the cache the session leaves on its previous deployment when it
        moves away from it (the backend drops it once idle)."""
        b = ctx.prev
        return (b,) if self.release and b >= 0 and b != a else ()


class _RunState:
    """Per-run state of a :class:`HorizonRouter`: the forecaster (cached per grid row), the
    per-pool cache-survival averages, the deployments' arrays."""

    def __init__(self, forecaster, kv_pool: np.ndarray, keep: np.ndarray, gaps_s: np.ndarray,
                 horizon: int, noise: tuple[float, int] = (0.0, 0)) -> None:
        self.forecaster = forecaster
        self.noise = noise
        self.horizon = int(horizon)
        # every fold's leads, j·τ_f for j = 1 … J (grid steps), in one vector: a grid row's
        # forecasts are made for every fold at once
        lead_s = (np.asarray(gaps_s, np.float64)[:, None]
                  * np.arange(1, self.horizon + 1)[None, :]).ravel()
        self._leads = lead_s if forecaster is None else forecaster.leads(lead_s)
        self.kv_pool = kv_pool
        self.keep = keep
        self.stayed = 1.0
        self.nu = 0.0  # the TTFT price's multiplier ν
        self.deployments = None
        # per grid row (a live provider: per value of the current intensities), and the row in
        # force: its interval [from, until) (s) and forecasts
        self._fc: dict[int | bytes, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._from, self._until = math.inf, -math.inf
        self._cur: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def __getstate__(self) -> dict:
        # a copy or a pickle carries the arrays (to read), not the compiled struct over them nor
        # the backend's view, which neither can carry: the copy binds a new run state at its
        # next decision (HorizonRouter.choose)
        return self.__dict__ | {"hs": None, "backend": None, "used": None}

    def forecast(self, t: float, fold: int, ci: np.ndarray | None = None) -> np.ndarray:
        """Forecast (n_regions, J) for fold ``fold``'s J future turns, j·τ_f ahead, made at t's
        row (with the router's forecast error for the fold, if any); without a forecaster (a
        live provider), the current intensities ``ci`` (n_regions,) held."""
        return self.forecasts(t, ci)[0][fold]

    def forecasts(self, t: float, ci: np.ndarray | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`forecast` of every fold, (folds, n_regions, J), with, per fold and future
        turn, its least intensity (gCO2e/kWh, (folds, J)) and that region ((folds, J) int64;
        :func:`carbonrouter_lib.kernel.forecast_minima`): made on a grid row's first query and
        cached per row (one ``predict`` per row: a replay meets a new row every few decisions;
        the row in force is kept with its interval, so a query in it looks nothing up);
        without a forecaster, per value of ``ci``."""
        if self.forecaster is None:
            key, row = ci.tobytes(), -1
        elif self._from <= t < self._until:
            return self._cur
        else:
            row = key = self.forecaster.row(t)
        got = self._fc.get(key)
        if got is None:
            if len(self._fc) > 4096:
                self._fc.clear()
            n_j = self.horizon
            # (n_regions, folds·J)
            every = (np.repeat(np.asarray(ci, np.float64)[:, None], len(self._leads), axis=1)
                     if row < 0 else self.forecaster.predict(row, self._leads))
            n_r, n_f = every.shape[0], every.shape[1] // n_j
            sigma, seed = self.noise
            if sigma > 0:
                for f in range(n_f):
                    every[:, f * n_j:(f + 1) * n_j] *= forecast_error(sigma, seed, row, f,
                                                                     (n_r, n_j))
            lo, arg = np.empty((n_f, n_j)), np.empty((n_f, n_j), np.int64)
            kernel.forecast_minima(every, lo.reshape(-1), arg.reshape(-1))
            fc = np.ascontiguousarray(every.reshape(n_r, n_f, n_j).transpose(1, 0, 2))
            got = self._fc[key] = (fc, lo, arg)
        if row >= 0:
            self._from, self._until = self.forecaster.signal.row_interval(row)
            self._cur = got
        return got


def survival_table(model: HorizonModel, told: bool = False) -> np.ndarray:
    """S_k(j) as both replay loops index it: (rows, K_max + 1, J), row f the fold's learned
    survival; ``told``: followed by one row per number of turns K = 0 … max, S_k(j) = 1{k + j <
    K} (the reference told the session length reads row ``folds + K``)."""
    surv = np.ascontiguousarray(model.survival, np.float64)
    if not told:
        return surv
    k = np.arange(surv.shape[1])[None, :, None]
    j = np.arange(1, surv.shape[2] + 1)[None, None, :]
    big_k = np.arange(int(model.turns.max()) + 1)[:, None, None]
    return np.ascontiguousarray(np.concatenate([surv, (k + j < big_k).astype(np.float64)]))


def survival_rows(model: HorizonModel, conversations: np.ndarray, folds: np.ndarray,
                  told: bool = False) -> np.ndarray:
    """The row of :func:`survival_table` of each conversation (int64, as ``conversations``):
    its fold (``folds``, :func:`carbonrouter_lib.prepared.conversation_folds`), or, told the
    session length, the folds' count plus its number of turns
    (:func:`carbonrouter_lib.kernel.horizon_decide` finds the same per decision)."""
    if told:
        return (model.folds + model.turns[conversations]).astype(np.int64)
    return np.asarray(folds, np.int64)


def _survival_sums(surv: np.ndarray, horizon: int) -> np.ndarray:
    """Σ_{j=1..J} S_k(j) per row of :func:`survival_table` and k: the expected number of the
    session's turns after turn k (the slot price's remaining time, in gaps τ); one array for
    both replay loops."""
    return np.ascontiguousarray(surv[:, :, :horizon].sum(axis=2), np.float64)


def forecast_error(sigma: float, seed: int, row: int, fold: int,
                   shape: tuple[int, ...]) -> np.ndarray:
    """The multiplicative forecast error of grid row ``row`` and fold ``fold``:
    exp(σ·ε − σ²/2), ε ~ N(0, 1) of shape ``shape`` (regions × leads), drawn from
    ``numpy.random.default_rng((seed, row, fold))`` — the same in both replay loops."""
    eps = np.random.default_rng((seed, row, fold)).standard_normal(shape)
    return np.exp(sigma * eps - 0.5 * sigma * sigma)

