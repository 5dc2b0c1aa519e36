"""CarbonRouter's learned switch gate (docs/model.md §7.5): features, two-branch labels, XGBoost, δ.

At a *switch opportunity* (turn k > 0, proposal g ≠ previous deployment b, b still a candidate and
L(b) > 0) CarbonRouter asks the gate for Â, the carbon (gCO2e) saved by staying on b over this and
the next turn, and stays when Â > δ. This module builds that gate:

1. **Features** (:func:`gate_features`, :data:`FEATURES`): what is known at dispatch — estimated
   carbon and energy of both options and their difference, history / new / estimated output
   tokens, turn index, cached fractions, KV memory in use and free slots of both pools, carbon
   intensity of both regions and its change over the last hour, hour of day, which of model / GPU /
   region the switch changes, predicted quality of both models. Never the session's future (its
   number of turns, think times or realized output).
2. **Labels** (:class:`TwoBranchLabeler`): a replay of the *proposal* policy (CarbonRouter without
   gate, so the opportunities are those it meets) in which, at each opportunity, the backend is
   copied twice and the session is played on in each copy: *switch* (serve this turn on g) and
   *stay* (serve it on b); then the next turn, a think time after the branch's completion, is
   routed by the same proposal rule on that branch's backend (cache, TTL) and intensity. The label
   is (carbon of switching now + next turn) − (carbon of staying now + next turn), realized output
   lengths, 0 next-turn term when there is no next turn. While a branch is played on, *the other
   sessions are frozen* (their pending completions and arrivals are not replayed): over the
   lookahead of one think time (median ≈ 2 min) the session's own cache placement dominates the
   difference, and freezing keeps a label O(one query) instead of O(a re-simulation).
3. **Training** (:func:`train_gate`): conversations are split into K folds by a hash of their id
   (:attr:`QueryContext.conversation`: the session id when every conversation is replayed once;
   all copies of a conversation in a resampled replay share one fold). The model that routes
   fold f is trained on the K − 2 folds other than f and v = f + 1 (mod K); δ_f is chosen on the
   validation fold v from a grid that includes +∞, as the δ that maximizes the realized saving
   Σ y·[Â > δ] of the opportunities it would block; fold f itself is the test fold (never seen in
   training or in choosing δ). So no session is routed by a gate trained on it or on a copy of
   its conversation, nor with a δ chosen on them.
4. **Routing** (:class:`LearnedGate`): ``CarbonRouter(delta=0.0, gate=gate)``; the gate returns
   the margin Â_f(z) − δ_f of the conversation's fold (−∞ where δ_f = +∞), so the router stays
   exactly when Â_f > δ_f. One XGBoost call per opportunity and none otherwise.

Units: gCO2e, kWh, tokens, seconds, gCO2e/kWh.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from carbonrouter_lib import cache, cost, kernel, prepared
from carbonrouter_lib.backend import BackendConfig
from carbonrouter_lib.carbon import CarbonSignal
from carbonrouter_lib.outputs import atomic_path
from carbonrouter_lib.policies import (
    Candidates,
    CarbonRouter,
    QueryContext,
    feasibility,
)
from carbonrouter_lib.prepared import conversation_fold, conversation_folds
from carbonrouter_lib.setting import SimulationConfig

if TYPE_CHECKING:  # XGBoost is imported where a gate is trained or loaded
    import xgboost

__all__ = [
    "FEATURES",
    "GateTrainingConfig",
    "LearnedGate",
    "OracleGate",
    "TwoBranchLabeler",
    "collect_opportunities",
    "ensure_gate",
    "gate_features",
    "gate_path",
    "train_gate",
]

#: Gate features, in the order of :func:`gate_features`' vector (b = previous deployment,
#: g = proposal; tokens under b's model tokenizer).
FEATURES: tuple[str, ...] = (
    "est_carbon_g", "est_carbon_b", "est_carbon_diff",  # Ĉ(g), Ĉ(b), Ĉ(b) − Ĉ(g); gCO2e
    "base_carbon_g", "base_carbon_b",  # CI·E_base, gCO2e
    "est_energy_g", "est_energy_b", "est_energy_diff",  # kWh
    "hist_tokens", "new_tokens", "est_out_tokens",
    "turn_index", "cached_frac_b", "cached_frac_g",  # k (0-based); L(a) / N_hist
    "kv_used_b", "kv_used_g",  # share of the deployment's KV pool in use
    "free_slots_b", "free_slots_g",
    "ci_b", "ci_g", "ci_change_b", "ci_change_g",  # gCO2e/kWh; change over the last hour
    "hour_utc",
    "change_model", "change_gpu", "change_region",  # 0/1
    "quality_b", "quality_g",
)
_N_F = len(FEATURES)
#: The columns of :meth:`TwoBranchLabeler.frame`.
_LABEL_COLUMNS = ["session", "conversation", "turn", "row", "g", "b", *FEATURES,
                  "carbon_switch_g", "carbon_stay_g", "label"]
_HOUR_S = 3600.0


def gate_features(
    ctx: QueryContext, cand: Candidates, g: int, b: int, out: np.ndarray | None = None
) -> np.ndarray:
    """The feature vector z (:data:`FEATURES` order) of a switch opportunity, float64.

    ``ctx.backend`` and ``ctx.signal`` (set by the simulator) give the KV memory in use and the
    intensity an hour earlier; without them those features are NaN (XGBoost's missing value).
    Writes into ``out`` when given.
    """
    z = np.empty(_N_F) if out is None else out
    d = ctx.deployments
    carbon, base, energy = cand.carbon, cand.carbon_base, cand.energy
    mb, mg = int(d.model[b]), int(d.model[g])
    n_hist = ctx.n_hist_m
    hist_b, hist_g = float(n_hist[mb]), float(n_hist[mg])
    pb, pg = int(d.pool[b]), int(d.pool[g])
    rb, rg = int(d.region[b]), int(d.region[g])
    ci = ctx.ci_region
    be, signal = ctx.backend, ctx.signal
    if be is not None:
        kv_b, kv_g = be.kv_used_share(b), be.kv_used_share(g)
    else:
        kv_b = kv_g = math.nan
    t = ctx.time_s
    if signal is not None and math.isfinite(t):
        earlier = signal.at(max(t - _HOUR_S, signal.row_interval(0)[0]))
        dci_b, dci_g = ci[rb] - earlier[rb], ci[rg] - earlier[rg]
        hour = (t % 86400.0) / _HOUR_S
    else:
        dci_b = dci_g = hour = math.nan
    z[:] = (
        carbon[g], carbon[b], carbon[b] - carbon[g],
        base[g], base[b],
        energy[g], energy[b], energy[b] - energy[g],
        hist_b, ctx.n_new_m[mb], ctx.n_out_est_m[mb],
        ctx.turn,
        ctx.cached[b] / hist_b if hist_b > 0 else 0.0,
        ctx.cached[g] / hist_g if hist_g > 0 else 0.0,
        kv_b, kv_g,
        ctx.free_slots[pb], ctx.free_slots[pg],
        ci[rb], ci[rg], dci_b, dci_g,
        hour,
        mb != mg, d.gpu[b] != d.gpu[g], rb != rg,
        ctx.quality[mb], ctx.quality[mg],
    )
    return z


# ---------------------------------------------------------------------------------------------
# Labels: the two-branch replay
# ---------------------------------------------------------------------------------------------


class TwoBranchLabeler:
    """A gate that never blocks and records, at every switch opportunity, the features and the
    two-branch label (module docstring, step 2).

    Use it as ``CarbonRouter(delta=0.0, gate=labeler, pricing=...)`` in a replay of ``table``
    (:func:`collect_opportunities` does): it returns −∞, so the routing is exactly the proposal
    policy's. ``pricing`` must be the router's: the next turn of each branch is routed by the
    same proposal rule.

    Attributes
    ----------
    rows : list[dict]
        One per opportunity: session, turn, row, g, b, the features, ``carbon_switch_g`` and
        ``carbon_stay_g`` (this turn + next turn in each branch) and ``label`` (their
        difference, gCO2e saved by staying).
    """

    name = "two-branch-labeler"

    def __init__(self, table: pd.DataFrame, config: SimulationConfig, pricing: bool = True
                 ) -> None:
        self._deps = config.deployments()
        self._constraints = config.constraints()
        self._new = prepared.model_matrix(table, "new_tokens").astype(np.float64)
        self._hist = prepared.model_matrix(table, "history_tokens").astype(np.float64)
        self._out = prepared.model_matrix(table, "output_tokens").astype(np.float64)
        self._think = table["think_s"].to_numpy(dtype=np.float64)
        self._last = (table["turn"].to_numpy() == table["n_turns"].to_numpy() - 1)
        self.pricing = pricing
        self._proposer = CarbonRouter(pricing=pricing)
        self._ctx2 = QueryContext(self._deps)
        self._cand2 = Candidates(self._deps.n)
        self._z = np.empty(_N_F)
        self.rows: list[dict] = []
        # for the compiled replay's opportunities: ids by row, and the finished tables
        self._session = table["session"].to_numpy(np.int64)
        self._turn = table["turn"].to_numpy(np.int64)
        self._conversation = prepared.conversation_codes(table)
        self._parts: list[pd.DataFrame] = []
        self._pending: dict[str, np.ndarray] | None = None

    def branch_carbon(self, ctx: QueryContext, a: int) -> float:
        """Realized carbon, gCO2e, of serving the current query on ``a`` plus the session's next
        turn routed by the proposal rule on what the session would see then
        (:meth:`Backend.session_after_turn`); the other sessions are frozen at the dispatch
        time."""
        d = self._deps
        i, s, t = ctx.row, ctx.session, ctx.time_s
        m = int(d.model[a])
        n_new, n_hist, n_out = self._new[i, m], self._hist[i, m], self._out[i, m]
        cached = float(ctx.cached[a])
        e_in, e_cache, e_out = float(d.e_in[a]), float(d.e_cache[a]), float(d.e_out[a])
        now = ctx.ci[a] * cost.energy_kwh(e_in, e_cache, e_out, n_new, n_hist, cached, n_out)
        if self._last[i]:
            return float(now)
        if ctx.backend is None or ctx.signal is None:
            raise ValueError("TwoBranchLabeler needs ctx.backend and ctx.signal (run it inside "
                             "simulate())")
        done = t + cost.service_time_s(n_new, n_hist, cached, n_out, float(d.v_pre[a]),
                                       float(d.v_dec[a]))
        t2 = done + self._think[i + 1]
        # The session's view at its next turn, other sessions frozen (no backend copy).
        caches, available, free = ctx.backend.session_after_turn(
            s, a, t, int(n_hist + n_new + n_out), done, t2)
        ctx2, cand2 = self._ctx2, self._cand2
        ctx2.set_ci(ctx.signal.at(t2))
        ctx2.fill_row(ctx.batch, i + 1, session=s, turn=ctx.turn + 1, prev=a, cached=caches,
                      available=available, free_slots=free, time_s=t2)
        feasibility(ctx2, self._constraints, out=cand2)
        if cand2.rejected:  # no next-turn carbon in this branch
            return float(now)
        a2 = self._proposer.propose(cand2)
        m2 = int(d.model[a2])
        nxt = ctx2.ci[a2] * cost.energy_kwh(
            float(d.e_in[a2]), float(d.e_cache[a2]), float(d.e_out[a2]), self._new[i + 1, m2],
            self._hist[i + 1, m2], float(ctx2.cached[a2]), self._out[i + 1, m2])
        return float(now + nxt)

    def __call__(self, ctx: QueryContext, cand: Candidates, g: int, b: int) -> float:
        z = gate_features(ctx, cand, g, b, self._z)
        c_switch = self.branch_carbon(ctx, g)
        c_stay = self.branch_carbon(ctx, b)
        row = {"session": ctx.session, "conversation": ctx.conversation, "turn": ctx.turn,
               "row": ctx.row, "g": g, "b": b}
        row.update(zip(FEATURES, z.tolist(), strict=True))
        row.update(carbon_switch_g=c_switch, carbon_stay_g=c_stay, label=c_switch - c_stay)
        self.rows.append(row)
        return -math.inf

    def compiled(self, conversations: np.ndarray) -> dict[str, np.ndarray] | None:
        """The labelling as the compiled loop's gate (:func:`carbonrouter_lib.kernel.rule`):
        the loop computes the same features and branch carbons and writes them to arrays that
        :meth:`frame` reads after the replay. ``conversations``: unused (the labels need no
        folds). None for a subclass (its ``__call__`` may differ)."""
        if type(self) is not TwoBranchLabeler:
            return None
        self._flush()
        cap = int((self._turn > 0).sum())  # an opportunity is a later turn of its session
        self._pending = dict(
            g_kind=kernel.GATE_KINDS["labels"], l_row=np.empty(cap, np.int64),
            l_g=np.empty(cap, np.int64), l_b=np.empty(cap, np.int64), l_z=np.empty((cap, _N_F)),
            l_sw=np.empty(cap), l_st=np.empty(cap), l_n=np.zeros(1, np.int64))
        return self._pending

    def _flush(self) -> None:
        """Move the rows of earlier replays (the Python loop's, then a compiled one's) into
        :attr:`_parts`, in replay order."""
        if self.rows:
            self._parts.append(pd.DataFrame(self.rows, columns=_LABEL_COLUMNS))
            self.rows = []
        out, self._pending = self._pending, None
        if out is None or out["l_n"][0] == 0:
            return
        q = int(out["l_n"][0])
        row = out["l_row"][:q]
        sw, st = out["l_sw"][:q], out["l_st"][:q]
        part = pd.DataFrame({"session": self._session[row],
                             "conversation": self._conversation[row].astype(np.int64),
                             "turn": self._turn[row], "row": row, "g": out["l_g"][:q],
                             "b": out["l_b"][:q]})
        part = pd.concat([part, pd.DataFrame(out["l_z"][:q], columns=list(FEATURES))], axis=1)
        self._parts.append(part.assign(carbon_switch_g=sw, carbon_stay_g=st, label=sw - st))

    def frame(self) -> pd.DataFrame:
        """The opportunities as a table (columns: ids, :data:`FEATURES`, carbon of both
        branches, ``label``), in the order the replays met them."""
        self._flush()
        if not self._parts:
            return pd.DataFrame([], columns=_LABEL_COLUMNS)
        return pd.concat(self._parts, ignore_index=True)


class OracleGate:
    """Perfect two-turn lookahead at switch opportunities: returns the realized two-branch label
    of the live state (gCO2e saved by staying; :class:`TwoBranchLabeler`), so
    ``CarbonRouter(delta=0.0, gate=OracleGate(...))`` stays exactly when staying is better over
    this and the next turn. It reads the session's future (next turn's tokens, think time,
    realized outputs, intensity): a ceiling for any gate of this form, not an online policy.
    Registry: ``carbonrouter-oracle-gate``."""

    name = "oracle-gate"

    def __init__(self, table: pd.DataFrame, config: SimulationConfig, pricing: bool = True
                 ) -> None:
        self.pricing = pricing
        self._labeler = TwoBranchLabeler(table, config, pricing=pricing)

    def compiled(self, conversations: np.ndarray) -> dict[str, Any] | None:
        """The oracle as the compiled loop's gate (:func:`carbonrouter_lib.kernel.rule`): the
        loop computes the same two branches. None for a subclass."""
        return {"g_kind": kernel.GATE_KINDS["oracle"]} if type(self) is OracleGate else None

    def __call__(self, ctx: QueryContext, cand: Candidates, g: int, b: int) -> float:
        branch = self._labeler.branch_carbon
        return branch(ctx, g) - branch(ctx, b)


def collect_opportunities(
    table: pd.DataFrame,
    config: SimulationConfig | None = None,
    signal: CarbonSignal | None = None,
    backend: BackendConfig | None = None,
    pricing: bool = True,
    progress: bool = False,
    engine: str = "auto",
) -> pd.DataFrame:
    """Replay ``table`` with the proposal policy (CarbonRouter without gate, ``pricing`` as
    given) and return every switch opportunity with its features and two-branch label
    (:meth:`TwoBranchLabeler.frame`).

    ``config``, ``signal``, ``backend``, ``engine``: as
    :func:`carbonrouter_lib.simulator.simulate` (both engines give the same table).
    """
    from carbonrouter_lib.simulator import simulate  # the replay of the labels

    config = config or SimulationConfig()
    signal = config.signal(signal)
    labeler = TwoBranchLabeler(table, config, pricing=pricing)
    simulate(table, CarbonRouter(delta=0.0, gate=labeler, pricing=pricing), config, signal,
             backend, progress=progress, engine=engine)
    return labeler.frame()


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------




@dataclass(frozen=True)
class GateTrainingConfig:
    """How a gate is trained (stored with it).

    Attributes
    ----------
    folds
        K session folds (≥ 3: one to route, one to validate, the rest to train on).
    seed
        Seed of the fold hash and of XGBoost's row / column subsampling.
    deltas
        The δ grid, gCO2e (must include +∞: "no gate" is always an option).
    n_estimators, max_depth, learning_rate, subsample, colsample_bytree, min_child_weight
        XGBoost regressor parameters (squared error, ``hist`` trees, one thread: deterministic).
    """

    folds: int = 5
    seed: int = 0
    deltas: tuple[float, ...] = (0.0, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, math.inf)
    n_estimators: int = 300
    max_depth: int = 5
    learning_rate: float = 0.05
    subsample: float = 0.8
    colsample_bytree: float = 0.8
    min_child_weight: float = 5.0

    def __post_init__(self) -> None:
        if not (isinstance(self.folds, int) and self.folds >= 3):
            raise ValueError(f"GateTrainingConfig.folds must be an int ≥ 3, got {self.folds!r}")
        deltas = tuple(float(x) for x in self.deltas)
        if any(math.isnan(x) for x in deltas) or math.inf not in deltas:
            raise ValueError(f"GateTrainingConfig.deltas must be numbers and include +inf, got "
                             f"{self.deltas!r}")
        object.__setattr__(self, "deltas", tuple(sorted(set(deltas))))

    def to_dict(self) -> dict:
        """Plain-JSON form (+∞ as JSON ``Infinity``)."""
        d = dataclasses.asdict(self)
        d["deltas"] = list(d["deltas"])
        return d

    def xgb_params(self) -> dict:
        return {"objective": "reg:squarederror", "tree_method": "hist", "nthread": 1,
                "seed": self.seed, "max_depth": self.max_depth, "eta": self.learning_rate,
                "subsample": self.subsample, "colsample_bytree": self.colsample_bytree,
                "min_child_weight": self.min_child_weight}


def _choose_delta(pred: np.ndarray, label: np.ndarray, deltas: Sequence[float]) -> float:
    """The δ of the grid with the largest realized saving Σ label·[pred > δ] (gCO2e); ties go to
    the larger δ (fewer blocks), so +∞ wins unless some δ saves carbon."""
    best, best_saving = math.inf, 0.0
    for delta in sorted(deltas, reverse=True):
        saving = float(label[pred > delta].sum()) if delta < math.inf else 0.0
        if saving > best_saving:
            best, best_saving = delta, saving
    return best


def _errors(pred: np.ndarray, label: np.ndarray, prefix: str) -> dict[str, float]:
    from scipy.stats import spearmanr

    n = label.size
    if n == 0:
        return {f"{prefix}_{k}": math.nan for k in ("mae", "rmse", "r2", "spearman")}
    res = label - pred
    var = float(np.var(label))
    rho = spearmanr(pred, label).statistic if n > 2 and np.ptp(pred) > 0 else math.nan
    return {f"{prefix}_mae": float(np.mean(np.abs(res))),
            f"{prefix}_rmse": float(np.sqrt(np.mean(res ** 2))),
            f"{prefix}_r2": 1.0 - float(np.mean(res ** 2)) / var if var > 0 else math.nan,
            f"{prefix}_spearman": float(rho)}


class _Forest:
    """An XGBoost regression model as arrays, for one-row predictions at dispatch.

    XGBoost's own ``inplace_predict`` costs ≈ 0.3 ms per call, mostly fixed overhead; walking the
    trees level by level over arrays takes a fraction of that. Same arithmetic as XGBoost's CPU
    predictor: features and thresholds in float32, ``x < threshold`` goes left, a missing value
    (NaN) follows the node's default direction, leaf values summed in float32 in tree order
    onto the base score (tested against XGBoost's predictions).
    """

    def __init__(self, booster: xgboost.Booster) -> None:
        doc = json.loads(bytes(booster.save_raw(raw_format="json")))
        learner = doc["learner"]
        if learner["objective"]["name"] != "reg:squarederror":
            raise ValueError(f"_Forest: objective {learner['objective']['name']!r} not supported")
        self.base = np.float32(float(learner["learner_model_param"]["base_score"].strip("[]")))
        trees = learner["gradient_booster"]["model"]["trees"]
        n_trees = len(trees)
        width = max((len(t["left_children"]) for t in trees), default=1)
        left_a = np.zeros((n_trees, width), np.int64)
        right_a = np.zeros((n_trees, width), np.int64)
        feature = np.zeros((n_trees, width), np.int64)
        threshold = np.zeros((n_trees, width), np.float32)  # the leaf value at a leaf
        default_left = np.zeros((n_trees, width), bool)
        depth = 0
        for i, t in enumerate(trees):
            if any(t["split_type"]):
                raise ValueError("_Forest: categorical splits are not supported")
            n = len(t["left_children"])
            left = np.asarray(t["left_children"], np.int64)
            left_a[i, :n] = np.where(left == -1, np.arange(n), left)
            right = np.asarray(t["right_children"], np.int64)
            right_a[i, :n] = np.where(right == -1, np.arange(n), right)
            feature[i, :n] = t["split_indices"]
            threshold[i, :n] = np.asarray(t["split_conditions"], np.float32)
            default_left[i, :n] = np.asarray(t["default_left"], bool)
            d, stack = 0, [(0, 0)]
            while stack:  # the tree's depth
                node, k = stack.pop()
                d = max(d, k)
                if left[node] != -1:
                    stack += [(int(left[node]), k + 1), (int(right[node]), k + 1)]
            depth = max(depth, d)
        self.depth = depth
        # Flat arrays, children as flat indices (a leaf points to itself): one gather per level.
        self._offset = np.arange(n_trees, dtype=np.int64) * width
        self._left = (left_a + self._offset[:, None]).ravel()
        self._right = (right_a + self._offset[:, None]).ravel()
        self._feature = feature.ravel()
        self._threshold = threshold.ravel()
        self._default_left = default_left.ravel()
        self._acc = np.empty(n_trees + 1, np.float32)
        self._acc[0] = self.base

    def predict(self, x: np.ndarray) -> float:
        """Prediction for one feature vector (float64, NaN = missing)."""
        xf = np.asarray(x, dtype=np.float32)
        missing = bool(np.isnan(xf).any())
        idx = self._offset.copy()  # flat index of each tree's current node
        for _ in range(self.depth):
            v = xf[self._feature[idx]]
            go_left = v < self._threshold[idx]
            if missing:
                go_left = np.where(np.isnan(v), self._default_left[idx], go_left)
            idx = np.where(go_left, self._left[idx], self._right[idx])
        # float32, one tree after the other onto the base score, as XGBoost (a cumulative sum
        # is sequential; numpy's sum would be pairwise)
        self._acc[1:] = self._threshold[idx]
        return float(np.cumsum(self._acc, dtype=np.float32)[-1])


class LearnedGate:
    """The trained gate: one XGBoost regressor and one δ per session fold.

    ``gate(ctx, cand, g, b)`` returns Â_f(z) − δ_f for the session's fold f (−∞ where δ_f = +∞,
    without calling the model): use it with ``CarbonRouter(delta=0.0, gate=gate)``.
    :meth:`advantage` gives Â itself. Save / load with :meth:`save` / :meth:`load` (one JSON
    file with the models, δs, training parameters and report).

    Attributes
    ----------
    deltas : list[float]
        δ_f per fold, gCO2e.
    report : pandas.DataFrame
        Per fold: sizes, validation and test errors (MAE, RMSE, R², Spearman of Â vs the
        label, and the MAE of predicting the training mean), δ_f, the realized label saving
        at δ_f on the validation and test folds, and the oracle saving Σ max(label, 0).
    meta : dict
        Training parameters and provenance (setting, pricing, code version).
    """

    def __init__(self, boosters: Sequence[xgboost.Booster], deltas: Sequence[float], training:
                 GateTrainingConfig, report: pd.DataFrame, meta: Mapping[str, Any]) -> None:
        if len(boosters) != training.folds or len(deltas) != training.folds:
            raise ValueError(f"LearnedGate: {len(boosters)} models and {len(deltas)} deltas for "
                             f"{training.folds} folds")
        self.boosters = list(boosters)
        self.deltas = [float(x) for x in deltas]
        self.training = training
        self.report = report
        self.meta = dict(meta)
        self.name = f"xgboost-gate:{self.meta.get('key', 'unsaved')}"
        self._x = np.empty((1, _N_F))
        self._forests: list[_Forest | None] = [None] * len(self.boosters)  # built on first use

    def fold_of(self, conversation: int) -> int:
        """The fold of a conversation (:attr:`QueryContext.conversation`; the session id when
        each session is its own conversation): the model that routes it never saw it."""
        # not cached per conversation: a live router meets new conversations without end, and
        # the compiled hash takes 0.14 µs
        return conversation_fold(conversation, self.training.folds, self.training.seed)

    def advantage(self, ctx: QueryContext, cand: Candidates, g: int, b: int) -> float:
        """Â: predicted gCO2e saved by staying on b (model of the conversation's fold)."""
        gate_features(ctx, cand, g, b, self._x[0])
        return self.predict(self.fold_of(ctx.conversation), self._x[0])

    def predict(self, fold: int, z: np.ndarray) -> float:
        """Â of fold ``fold``'s model for the feature vector ``z`` (:data:`FEATURES` order)."""
        forest = self._forests[fold]
        if forest is None:
            forest = self._forests[fold] = _Forest(self.boosters[fold])
        return forest.predict(z)

    def compiled(self, conversations: np.ndarray) -> dict[str, np.ndarray]:
        """The gate for the compiled replay loop (:func:`carbonrouter_lib.kernel.rule`'s
        parameters): the fold of each session's conversation, δ_f per fold and every fold's
        trees (:class:`_Forest`'s arrays, padded to the largest)."""
        forests = [_Forest(b) for b in self.boosters]
        width = max(len(f._left) for f in forests)
        trees = max(len(f._offset) for f in forests)
        n_f = len(forests)
        out = {"fold": conversation_folds(conversations, self.training.folds,
                                          self.training.seed).astype(np.int64),
               "fold_delta": np.array(self.deltas, np.float64),
               "f_left": np.zeros((n_f, width), np.int64),
               "f_right": np.zeros((n_f, width), np.int64),
               "f_feature": np.zeros((n_f, width), np.int64),
               "f_threshold": np.zeros((n_f, width), np.float32),
               "f_default_left": np.zeros((n_f, width), np.bool_),
               "f_tree_start": np.zeros((n_f, trees), np.int64),
               "f_n_trees": np.array([len(f._offset) for f in forests], np.int64),
               "f_depth": np.array([f.depth for f in forests], np.int64),
               "f_base": np.array([f.base for f in forests], np.float32)}
        for k, f in enumerate(forests):
            m = len(f._left)
            out["f_left"][k, :m], out["f_right"][k, :m] = f._left, f._right
            out["f_feature"][k, :m], out["f_threshold"][k, :m] = f._feature, f._threshold
            out["f_default_left"][k, :m] = f._default_left
            out["f_tree_start"][k, :len(f._offset)] = f._offset
        return out

    def __call__(self, ctx: QueryContext, cand: Candidates, g: int, b: int) -> float:
        delta = self.deltas[self.fold_of(ctx.conversation)]
        if delta == math.inf:
            return -math.inf
        return self.advantage(ctx, cand, g, b) - delta

    def feature_importance(self) -> pd.DataFrame:
        """Share of each feature in the models' total split gain (XGBoost ``total_gain``), per
        fold and averaged: index :data:`FEATURES`, columns ``fold_0`` … and ``mean``."""
        cols = {}
        for f, booster in enumerate(self.boosters):
            # Models are stored without feature names: XGBoost names them f0, f1, … in order.
            score = booster.get_score(importance_type="total_gain")
            gain = np.array([score.get(f"f{j}", score.get(name, 0.0))
                             for j, name in enumerate(FEATURES)])
            cols[f"fold_{f}"] = gain / gain.sum() if gain.sum() > 0 else gain
        out = pd.DataFrame(cols, index=pd.Index(FEATURES, name="feature"))
        out["mean"] = out.mean(axis=1)
        return out.sort_values("mean", ascending=False)

    # ---- storage ----------------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> Path:
        """Write the gate to one JSON file, atomically."""
        doc = {"format": 1, "features": list(FEATURES), "deltas": self.deltas,
               "training": self.training.to_dict(), "meta": self.meta,
               "report": self.report.to_dict(orient="records"),
               "models": [bytes(b.save_raw(raw_format="json")).decode() for b in self.boosters]}
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps(doc, allow_nan=True, default=_json_scalar))
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> LearnedGate:
        """Read a gate written by :meth:`save`."""
        import xgboost as xgb

        path = Path(path)
        try:
            doc = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read a gate from {path}: {exc}") from None
        if doc.get("format") != 1 or tuple(doc.get("features", ())) != FEATURES:
            raise ValueError(f"{path}: not a gate of this version (format {doc.get('format')!r}, "
                             f"features differ from gate.FEATURES)")
        boosters = []
        for raw in doc["models"]:
            b = xgb.Booster()
            b.load_model(bytearray(raw.encode()))
            b.set_param({"nthread": 1})
            boosters.append(b)
        training = GateTrainingConfig(**{**doc["training"],
                                         "deltas": tuple(doc["training"]["deltas"])})
        return cls(boosters, doc["deltas"], training, pd.DataFrame(doc["report"]), doc["meta"])


def _json_scalar(x: Any) -> Any:
    # numpy scalars in the report; JSON keeps ±Infinity (allow_nan), unlike DataFrame.to_json.
    if isinstance(x, np.integer | np.bool_):
        return x.item()
    if isinstance(x, np.floating):
        return float(x)
    raise TypeError(f"not JSON-serializable: {type(x).__name__}")


def train_gate(
    opportunities: pd.DataFrame,
    training: GateTrainingConfig | None = None,
    meta: Mapping[str, Any] | None = None,
) -> LearnedGate:
    """Train the gate on the opportunities of :func:`collect_opportunities` (module docstring,
    step 3): per fold f, an XGBoost regressor of the label on :data:`FEATURES` over the folds
    other than f and v = f + 1 (mod K), δ_f chosen on fold v, errors reported on v and f."""
    import xgboost as xgb

    training = training or GateTrainingConfig()
    missing = [c for c in (*FEATURES, "session", "label") if c not in opportunities.columns]
    if missing:
        raise ValueError(f"train_gate: opportunities lack columns {missing}")
    y = opportunities["label"].to_numpy(np.float64)
    if not np.isfinite(y).all():
        bad = int(np.flatnonzero(~np.isfinite(y))[0])
        raise ValueError(f"train_gate: label of opportunity row {bad} is not finite")
    x = opportunities[list(FEATURES)].to_numpy(np.float64)
    k = training.folds
    # Folds by conversation: copies of one conversation (replay scale) are never split between
    # a model and the sessions it routes (with one copy each, the conversation is the session).
    units = opportunities["conversation" if "conversation" in opportunities.columns
                          else "session"].to_numpy()
    fold = conversation_folds(units, k, training.seed)
    boosters, deltas, report = [], [], []
    for f in range(k):
        v = (f + 1) % k
        tr, va, te = (fold != f) & (fold != v), fold == v, fold == f
        info: dict[str, Any] = {"fold": f, "validation_fold": v, "n_train": int(tr.sum()),
                                "n_validation": int(va.sum()), "n_test": int(te.sum())}
        if tr.sum() < 2:  # too few opportunities to learn anything: never block
            booster = xgb.train(training.xgb_params(),
                                xgb.DMatrix(np.zeros((1, _N_F)), label=[0.0],
                                            feature_names=list(FEATURES)), num_boost_round=0)
            boosters.append(booster)
            deltas.append(math.inf)
            report.append(info | {"delta": math.inf})
            continue
        dtrain = xgb.DMatrix(x[tr], label=y[tr], feature_names=list(FEATURES))
        booster = xgb.train(training.xgb_params(), dtrain, num_boost_round=training.n_estimators)
        booster.set_param({"nthread": 1})
        booster.feature_names = None  # inplace_predict on plain arrays
        p_va = booster.inplace_predict(x[va]) if va.any() else np.empty(0)
        p_te = booster.inplace_predict(x[te]) if te.any() else np.empty(0)
        delta = _choose_delta(p_va, y[va], training.deltas)
        mean = float(y[tr].mean())
        info.update(_errors(p_va, y[va], "validation"))
        info.update(_errors(p_te, y[te], "test"))
        info.update(
            validation_mae_mean=float(np.mean(np.abs(y[va] - mean))) if va.any() else math.nan,
            test_mae_mean=float(np.mean(np.abs(y[te] - mean))) if te.any() else math.nan,
            delta=delta,
            validation_saving_g=float(y[va][p_va > delta].sum()) if delta < math.inf else 0.0,
            test_saving_g=float(y[te][p_te > delta].sum()) if delta < math.inf else 0.0,
            test_blocked=int((p_te > delta).sum()) if delta < math.inf else 0,
            test_oracle_saving_g=float(np.maximum(y[te], 0.0).sum()),
            test_positive=int((y[te] > 0).sum()),
        )
        boosters.append(booster)
        deltas.append(delta)
        report.append(info)
    return LearnedGate(boosters, deltas, training, pd.DataFrame(report), meta or {})


# ---------------------------------------------------------------------------------------------
# Cached gates for a setting
# ---------------------------------------------------------------------------------------------


def _gate_entry(workload_config: prepared.WorkloadConfig, simulation_config: SimulationConfig,
                pricing: bool,
                training: GateTrainingConfig,
                cache_dir: str | os.PathLike | None) -> cache.Entry:
    from carbonrouter_lib.datasets import derived_dir

    params = {"workload": workload_config.key(), "simulation": simulation_config.to_dict(),
              "pricing": pricing, "training": training.to_dict()}
    return cache.entry("gate", params, "carbonrouter_lib.gate", fmt="json",
                       folder=cache_dir or derived_dir() / "gates")


def gate_path(workload_config: prepared.WorkloadConfig, simulation_config: SimulationConfig,
              pricing: bool = True,
              training: GateTrainingConfig | None = None,
              cache_dir: str | os.PathLike | None = None) -> Path:
    """Where :func:`ensure_gate` stores the gate of this setting (default
    ``derived_dir()/gates``; beside it, its manifest: :mod:`carbonrouter_lib.cache`)."""
    training = training or GateTrainingConfig()
    return _gate_entry(workload_config, simulation_config, pricing, training, cache_dir).payload


def ensure_gate(
    workload_config: prepared.WorkloadConfig | None,
    simulation_config: SimulationConfig,
    pricing: bool = True,
    training: GateTrainingConfig | Mapping[str, Any] | None = None,
    table: pd.DataFrame | None = None,
    signal: CarbonSignal | None = None,
    backend: BackendConfig | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> LearnedGate:
    """The learned gate of a setting: the opportunities of the proposal policy (CarbonRouter
    without gate, ``pricing`` as given) on the prepared workload, then :func:`train_gate`.

    With a ``workload_config`` the gate is cached (:func:`gate_path`): loaded if present, else
    trained and saved. With ``workload_config=None`` it is trained from ``table`` and not saved
    (:func:`carbonrouter_lib.build.build_policy` does this when it is given no workload config).
    ``table`` / ``signal`` / ``backend``: the prepared workload, carbon signal and
    capacity if already at hand (defaults: built from the configs).
    """
    from carbonrouter_lib.setting import backend_config

    if not isinstance(training, GateTrainingConfig):
        training = GateTrainingConfig(**{k: (tuple(v) if k == "deltas" else v)
                                         for k, v in dict(training or {}).items()})
    entry = None
    if workload_config is not None:
        entry = _gate_entry(workload_config, simulation_config, pricing, training, cache_dir)
        if (hit := entry.load(LearnedGate.load)) is not None:
            return hit[0]
        if table is None:
            table = prepared.prepare_workload(workload_config)
    elif table is None:
        raise ValueError("ensure_gate: give a workload_config or a prepared table")
    signal = simulation_config.signal(signal)
    if backend is None:
        backend = backend_config(table, simulation_config)
    opps = collect_opportunities(table, simulation_config, signal, backend, pricing=pricing)
    meta = {"key": entry.key if entry else "unsaved",
            "workload": workload_config.to_dict() if workload_config is not None else None,
            "simulation": simulation_config.to_dict(), "backend": backend.to_dict(),
            "pricing": pricing, "code": cache.code_hash("carbonrouter_lib.gate"),
            "n_opportunities": len(opps),
            "n_sessions": int(opps["session"].nunique()) if len(opps) else 0,
            "label_mean_g": float(opps["label"].mean()) if len(opps) else math.nan,
            "label_positive_share": float((opps["label"] > 0).mean()) if len(opps) else math.nan}
    gate = train_gate(opps, training, meta)
    if entry is not None:
        entry.save(gate, write=lambda g, path: g.save(path))
    return gate
