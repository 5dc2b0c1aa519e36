"""Per-query answer quality of each model, Q(m) ∈ [0, 1], and the quality constraint (Eq. 7;
``docs/model.md`` §5, §8).

The paper scores every query once, from the current query and recent context, with the released
R2-Router predictors, and keeps the models with Q(m) ≥ β_Q · max_m Q(m) (the paper's β_Q:
``paper.DEFAULTS["beta_q"]``; the set is never empty). R2-Router's heads need a Qwen3-0.6B
embedding that is not available offline, so this module has

- :class:`QualityPredictor`, the interface (one method, :meth:`~QualityPredictor.predict`, returning
  an (n, 5) array in :data:`~carbonrouter_lib.profiles.MODELS` order);
- :func:`feasible_models` (the quality constraint of Eq. 7) and :func:`quality_summary`;
- :class:`OfflineQualityPredictor`, the default: TF-IDF text features → per-judged-model Ridge
  regressors trained on real judgments → a documented mapping to our five models → a documented
  calibration of each model's level;
- :func:`score_turns`, which scores a ShareGPT turn table from each query and its recent context.

The paper's own predictor, usable when an embedding function is given, is
:class:`carbonrouter_lib.r2router.R2RouterPredictor`; the held-out accuracy of the offline
predictor's regressors is :func:`carbonrouter_lib.quality_eval.heldout_accuracy`.

Judgments (data mirror, ``quality/``)
-------------------------------------
- **AlpacaEval 2** (``alpaca_eval/*.annotations.json``): 805 instructions; a GPT-4-turbo judge
  compares the judged model's answer with GPT-4-turbo's (``gpt4_1106_preview``). Target =
  ``preference − 1`` = probability that the judged model's answer is preferred (continuous for the
  ``weighted_alpaca_eval_gpt4_turbo`` files; 0 or 1 for Mistral-7B-Instruct-v0.2, whose file is
  from the discrete ``alpaca_eval_cot_gpt4_turbo_fn`` judge).
- **DCRouter** (``dcrouter/dcrouter_{train,test}.json``, LLMRouter's preprocessing): 5,608 + 500
  benchmark questions (14 benchmarks), graded scores in [0, 1] for 9 models of 7–70B. 119 test
  questions also occur in the train file (50 of them with different scores): they are kept for the
  final fit and left out of the held-out evaluation (counted in
  :func:`.quality_eval.heldout_accuracy`).

Mapping: our model ← judged models (:data:`PROXY_MAP`)
------------------------------------------------------
None of the judged models is one of ours except Mistral-7B-Instruct-v0.2. Each of our models takes,
from each source, the judged models nearest in family and size. A proxy contributes only its
*per-query deviation* from its own mean (what makes a query easier or harder for that kind of
model); the *level* of each of our models comes from the calibration below, never from a proxy's
raw mean (proxies of other generations or fine-tuning recipes have levels that say little about
our models: raw, FuseChat-Llama-3.2-1B wins 30% of AlpacaEval, the two Llama-2-70B fine-tunes
8–10%).

============== ===================================================== ==============================
our model      AlpacaEval proxies                                    DCRouter proxies
============== ===================================================== ==============================
Gemma-3-1B     gemma-2b-it (Gemma family, smallest judged Gemma);    gemma-2-9b-it (the only Gemma
               FuseChat-Llama-3.2-1B-Instruct (the only 1B judged)   in DCRouter; deviation only)
Llama-3.2-3B   FuseChat-Llama-3.2-3B-Instruct (a fine-tune of        llama-3.1-8b-instruct (the
               Llama-3.2-3B-Instruct itself: same base model)        nearest Llama-3.x sibling)
Gemma-3-4B     gemma-7b-it (Gemma family, nearest judged size)       gemma-2-9b-it (nearest Gemma)
Mistral-7B-v0.2 Mistral-7B-Instruct-v0.2 (exact; discrete judge);    mistral-7b-instruct-v0.3 (the
               OpenHermes-2.5-Mistral-7B (same architecture, size)   next release of the same model)
Llama-3.1-70B  humpback-llama2-70b, openbuddy-llama2-70b-v10.1       llama-3.1-nemotron-51b-instruct
               (the only judged 70B Llamas; Llama-2 generation,      (pruned and distilled from
               older and weaker: deviations only)                    Llama-3.1-70B-Instruct itself)
============== ===================================================== ==============================

Not used (their heads are trained and evaluated all the same): FuseChat-Llama-3.1-8B-Instruct
(used for the size ladder of the calibration), minichat-3b and phi-2 (other families), codegemma-7b
(code specialist), qwen2.5-7b-instruct (other family), llama3-chatqa-1.5-8b/70b (Llama-3 tuned for
retrieval-grounded QA: the 70B scores 0.20 on DCRouter, far below the general 8B Llama-3.1 at 0.56,
so it does not represent a general 70B chat model) and llama-3.3-nemotron-super-49b-v1 (derived
from the later Llama-3.3-70B; the 51B model derived from Llama-3.1-70B is the closer one).

Signal of our model m for query x:
``s_m(x) = Σ_src w_src · mean_{p ∈ proxies_src(m)} (f_p(x) − μ_p)``, with ``f_p`` the Ridge
prediction of proxy p, ``μ_p`` its mean label in training (so in-sample deviations average 0),
and ``w_src`` the source weights (default 1/2 each).

Calibration (``docs/model.md`` §8, Quality: sanity requirement)
---------------------------------------------------------------
``Q_m(x) = clip(a_m + c_m · s_m(x), 0, 1)``: an affine map per model with scale ``c_m``
(:attr:`QualityConfig.signal_scale`, default 1: the regressors' per-query variation is kept as is)
and offset ``a_m`` solved (bisection) so that the mean of Q_m over the reference set — the training
questions, AlpacaEval and DCRouter weighted by ``w_src`` — equals the target level ``T_m``
(:attr:`QualityConfig.targets`). The targets (:data:`DEFAULT_TARGETS`) are on DCRouter's scale (mean
graded benchmark score) and are derived only from the mirror (:func:`derive_calibration_targets`,
:func:`calibration_evidence`):

- Llama-3.1-70B: mean score of llama-3.1-nemotron-51b-instruct (derived from Llama-3.1-70B-Instruct;
  a conservative stand-in, the parent is not scored) = 0.617.
- Mistral-7B-v0.2: mean score of mistral-7b-instruct-v0.3 = 0.363.
- The 1–4B models: DCRouter has no model under 7B, so they are placed by a *size ladder* measured
  in AlpacaEval on one fine-tuning recipe at three sizes, FuseChat-3.0 on Llama-3.2-1B, Llama-3.2-3B
  and Llama-3.1-8B (same judge, same 805 instructions, so the recipe's verbosity bias cancels in the
  ratios): r(1B) = 0.299/0.633 = 0.472, r(3B) = 0.513/0.633 = 0.810, r(8B) = 1, linear in log(size)
  between rungs. Level = r(P) × mean score of llama-3.1-8b-instruct (0.556): Gemma-3-1B
  0.263 (r(1B)), Llama-3.2-3B 0.451 (r(3B)), Gemma-3-4B 0.482 (r(4B) = 0.866, interpolated; the
  Gemma-3 models are placed by size because no Gemma-3 model is judged in the mirror).

These order Llama-3.1-70B highest and Gemma-3-1B lowest, as the mirror's evidence does: the
Llama-3.1-70B derivative has the highest DCRouter mean of the models we use (0.617 vs 0.556 for the
8B Llama, 0.528 gemma-2-9b-it, 0.363 Mistral-7B-v0.3), and the 1B rung is at 47% of the 8B in
AlpacaEval. No external figure is used. A cross-check that is *not* used: the intercepts of the
R2-Router heads order the five models the same way at both ends (0.83 for the 70B, 0.48 for the
1B), but an intercept is not a mean prediction, so no number is taken from it. Known tension: on
AlpacaEval, Mistral-7B-Instruct-v0.2 wins 15.5% against FuseChat-8B's 63%, which would put it
below the 1B rung; that comparison crosses fine-tuning recipes (FuseChat is preference-optimized
for this kind of judge), so the absolute levels are taken from DCRouter, where Mistral-v0.3 and
the Llama-3.1 models are graded on the same benchmark questions.

Taken raw (no calibration, :meth:`OfflineQualityPredictor.raw_quality`, query only), the mapped
proxies' means over all ShareGPT turns are 0.338, 0.540, 0.293, 0.287, 0.346 (MODELS order):
Llama-3.2-3B first, Llama-3.1-70B barely above Gemma-3-1B. Calibration is not optional.
The mean over *ShareGPT* queries differs from the targets by the regressors' view of how ShareGPT
differs from the training questions; :meth:`OfflineQualityPredictor.recalibrated` re-solves the
offsets on any reference queries when exact levels on a workload are wanted.

Features and fitting
--------------------
Word (1–2-gram) and character (2–4-gram, within word boundaries) TF-IDF of the query (first
``max_query_chars`` characters), plus six length/shape features of the whole query (log chars, log
words, log lines, code marker, digit share, question mark), standardized. With context, the word
block is ``normalize(tfidf(query) + context_weight · tfidf(context))`` (unit norm, as in training,
where there is no context), so the recent context (its last ``max_context_chars`` characters)
shifts the topic without outweighing the query; character n-grams and shape describe the query.
One Ridge regressor per judged model (alpha per source), fitted on all its judgments. Fitting takes
about 6–12 s on two CPU cores; scoring all 61,239 ShareGPT turns with one turn of context about
20–25 s (:func:`score_turns`). The fitted predictor is cached with :mod:`joblib` in the derived
cache (:mod:`carbonrouter_lib.cache`), keyed by the training files' SHA-256, the
:class:`QualityConfig`, :data:`PROXY_MAP`, the scikit-learn version and the code.
"""

from __future__ import annotations

import abc
import ast
import dataclasses
import json
import math
import re
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import scipy.sparse as sp

from carbonrouter_lib import cache, cost
from carbonrouter_lib.datasets import REGISTRY, fetch
from carbonrouter_lib.paper import DEFAULTS
from carbonrouter_lib.profiles import MODELS

__all__ = [
    "SOURCES",
    "ALPACA_EVAL_FILES",
    "DCROUTER_FILES",
    "PROXY_MAP",
    "PROXY_RATIONALE",
    "SIZE_LADDER",
    "DEFAULT_TARGETS",
    "QualityPredictor",
    "QualityConfig",
    "TextFeaturizer",
    "OfflineQualityPredictor",
    "feasible_models",
    "quality_summary",
    "load_alpaca_eval",
    "load_dcrouter",
    "calibration_evidence",
    "derive_calibration_targets",
    "calibrate_offsets",
    "fit_offline_predictor",
    "load_offline_predictor",
    "turn_contexts",
    "score_turns",
]

#: Judgment sources, in the order of :attr:`QualityConfig.source_weights`.
SOURCES: tuple[str, ...] = ("alpaca_eval", "dcrouter")

_AE_PREFIX = "quality/alpaca_eval/"
#: AlpacaEval annotation files (registry names), one per judged model.
ALPACA_EVAL_FILES: tuple[str, ...] = tuple(
    sorted(n for n in REGISTRY if n.startswith(_AE_PREFIX) and n.endswith(".annotations.json"))
)
#: DCRouter files (registry names) by split.
DCROUTER_FILES: dict[str, str] = {
    "train": "quality/dcrouter/dcrouter_train.json",
    "test": "quality/dcrouter/dcrouter_test.json",
}

#: Our model -> source -> judged models whose per-query deviations make its signal (see module doc).
PROXY_MAP: dict[str, dict[str, tuple[str, ...]]] = {
    "Gemma-3-1B": {
        "alpaca_eval": ("gemma-2b-it", "FuseChat-Llama-3.2-1B-Instruct"),
        "dcrouter": ("gemma-2-9b-it",),
    },
    "Llama-3.2-3B": {
        "alpaca_eval": ("FuseChat-Llama-3.2-3B-Instruct",),
        "dcrouter": ("llama-3.1-8b-instruct",),
    },
    "Gemma-3-4B": {
        "alpaca_eval": ("gemma-7b-it",),
        "dcrouter": ("gemma-2-9b-it",),
    },
    "Mistral-7B-v0.2": {
        "alpaca_eval": ("Mistral-7B-Instruct-v0.2", "OpenHermes-2.5-Mistral-7B"),
        "dcrouter": ("mistral-7b-instruct-v0.3",),
    },
    "Llama-3.1-70B": {
        "alpaca_eval": ("humpback-llama2-70b", "openbuddy-llama2-70b-v10.1"),
        "dcrouter": ("llama-3.1-nemotron-51b-instruct",),
    },
}

#: One line per model: why these proxies (shown in notebooks next to :data:`PROXY_MAP`).
PROXY_RATIONALE: dict[str, str] = {
    "Gemma-3-1B": "Gemma family (gemma-2b-it, Gemma 1) and the only judged 1B model (FuseChat on "
    "Llama-3.2-1B); DCRouter has no model under 7B, so the nearest Gemma (gemma-2-9b-it) gives the "
    "per-query deviation only",
    "Llama-3.2-3B": "FuseChat-Llama-3.2-3B-Instruct is a fine-tune of Llama-3.2-3B-Instruct (same "
    "base); llama-3.1-8b-instruct is the nearest Llama-3.x model in DCRouter",
    "Gemma-3-4B": "Gemma family at the nearest judged sizes: gemma-7b-it (Gemma 1, AlpacaEval), "
    "gemma-2-9b-it (Gemma 2, DCRouter)",
    "Mistral-7B-v0.2": "the exact model (AlpacaEval, discrete judge), OpenHermes-2.5 (Mistral-7B "
    "fine-tune, continuous judge) and mistral-7b-instruct-v0.3 (next release, DCRouter)",
    "Llama-3.1-70B": "the only judged 70B Llamas in AlpacaEval (Llama-2-70B fine-tunes: older and "
    "weaker, deviations only) and Llama-3.1-Nemotron-51B, pruned and distilled from "
    "Llama-3.1-70B-Instruct (DCRouter)",
}

#: Size ladder for the 1-4B models: one recipe (FuseChat-3.0) at three sizes, judged in AlpacaEval.
#: Rung size in billions of parameters (nominal) -> judged model.
SIZE_LADDER: dict[float, str] = {
    1.0: "FuseChat-Llama-3.2-1B-Instruct",
    3.0: "FuseChat-Llama-3.2-3B-Instruct",
    8.0: "FuseChat-Llama-3.1-8B-Instruct",
}
#: DCRouter models that anchor the levels: the 8B rung of the ladder, Mistral, the 70B.
_ANCHOR_8B = "llama-3.1-8b-instruct"
_ANCHOR_MISTRAL = "mistral-7b-instruct-v0.3"
_ANCHOR_70B = "llama-3.1-nemotron-51b-instruct"
#: Nominal size (billions of parameters) at which each of our small models sits on the ladder.
_LADDER_SIZE = {"Gemma-3-1B": 1.0, "Llama-3.2-3B": 3.0, "Gemma-3-4B": 4.0}

#: Calibration targets (mean quality level per model, MODELS order), rounded to 3 decimals from
#: :func:`derive_calibration_targets` (the test suite recomputes them from the mirror).
DEFAULT_TARGETS: tuple[float, ...] = (0.263, 0.451, 0.482, 0.363, 0.617)

_N_LENGTH_FEATURES = 6
_CODE_MARKER = re.compile(r"```|\bdef |\bfunction\b|#include|\bimport |;\s*$|\{\s*$", re.M)


# --------------------------------------------------------------------------------------------
# Interface and the quality constraint


class QualityPredictor(abc.ABC):
    """Predicts Q(m) ∈ [0, 1] for every model, once per query (``docs/model.md`` §5, §8).

    Subclasses implement :meth:`predict`. ``models`` names the columns (default
    :data:`~carbonrouter_lib.profiles.MODELS`).
    """

    models: tuple[str, ...] = MODELS

    @abc.abstractmethod
    def predict(
        self, queries: Sequence[str], contexts: Sequence[str | None] | None = None
    ) -> np.ndarray:
        """Predicted quality of every model for each query.

        Parameters
        ----------
        queries
            The current user messages (n strings).
        contexts
            Optional recent context of each query (earlier turns' text; None or "" for none).

        Returns
        -------
        numpy.ndarray
            Shape (n, len(models)), float64, values in [0, 1] (unitless quality), columns in
            ``models`` order.
        """


def _check_q(q: np.ndarray | pd.DataFrame, name: str = "q") -> np.ndarray:
    arr = np.asarray(q, dtype=float)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array (queries × models), got shape {arr.shape}")
    if arr.size and not np.all(np.isfinite(arr)):
        bad = np.argwhere(~np.isfinite(arr))[0]
        raise ValueError(f"{name} has a non-finite value at row {bad[0]}, column {bad[1]}")
    if arr.size and (arr.min() < 0 or arr.max() > 1):
        bad = np.argwhere((arr < 0) | (arr > 1))[0]
        raise ValueError(
            f"{name} must lie in [0, 1]; row {bad[0]}, column {bad[1]} is {arr[tuple(bad)]!r}"
        )
    return arr


def _check_beta(beta: float) -> float:
    if not (isinstance(beta, int | float | np.floating) and 0 < beta <= 1):
        raise ValueError(f"beta (β_Q) must be a number in (0, 1], got {beta!r}")
    return float(beta)


def feasible_models(q: np.ndarray | pd.DataFrame, beta: float = DEFAULTS["beta_q"]) -> np.ndarray:
    """The quality constraint of Eq. 7: {m : Q(m) ≥ β_Q · max_m Q(m)} per query.

    Parameters
    ----------
    q
        Predicted quality, shape (n, n_models), values in [0, 1].
    beta
        β_Q in (0, 1] (paper default 0.85). The bound is inclusive, so the best model is always
        feasible (the set is never empty) and β_Q = 1 keeps exactly the model(s) with the maximum.

    Returns
    -------
    numpy.ndarray
        Boolean, shape (n, n_models).
    """
    arr = _check_q(q)
    beta = _check_beta(beta)
    if arr.shape[1] == 0:
        raise ValueError("q has no model columns; the feasible set would be empty")
    return cost.quality_feasible(arr, beta)


def quality_summary(
    q: np.ndarray | pd.DataFrame,
    betas: Sequence[float] = (0.8, 0.85, 0.9),
    models: Sequence[str] = MODELS,
) -> pd.DataFrame:
    """Per model: mean predicted quality, share of queries where it is best and where feasible.

    Parameters
    ----------
    q
        Predicted quality, shape (n, len(models)), values in [0, 1], n ≥ 1.
    betas
        β_Q values (each in (0, 1]) for the feasibility shares.
    models
        Column names (default MODELS).

    Returns
    -------
    pandas.DataFrame
        Index ``model``; columns ``mean_quality`` (unitless), ``share_best`` (fraction of queries;
        a query whose maximum is shared by k models counts 1/k for each, so the column sums to 1)
        and ``share_feasible_<β>`` per β (fraction of queries where the model meets
        Q ≥ β · max Q; a query can make several models feasible).
    """
    arr = _check_q(q)
    if arr.shape[0] == 0:
        raise ValueError("q has no rows: shares of an empty set are undefined")
    if arr.shape[1] != len(models):
        raise ValueError(f"q has {arr.shape[1]} columns but {len(models)} models were named")
    is_max = arr == arr.max(axis=1, keepdims=True)
    best = (is_max / is_max.sum(axis=1, keepdims=True)).mean(axis=0)
    out = pd.DataFrame(
        {"mean_quality": arr.mean(axis=0), "share_best": best},
        index=pd.Index(list(models), name="model"),
    )
    for beta in betas:
        out[f"share_feasible_{_check_beta(beta):g}"] = feasible_models(arr, beta).mean(axis=0)
    return out


# --------------------------------------------------------------------------------------------
# Judgments


def _judged_name(path_name: str) -> str:
    # "<model>.<annotator>.annotations.json"; model names contain dots, annotator names do not.
    return path_name[len(_AE_PREFIX) :].rsplit(".", 3)[0]


def load_alpaca_eval() -> pd.DataFrame:
    """All AlpacaEval annotations of the mirror, one row per (judged model, instruction).

    Returns
    -------
    pandas.DataFrame
        Columns ``judged_model``, ``instruction``, ``dataset`` (AlpacaEval subset), ``annotator``,
        ``target`` = ``preference − 1`` ∈ [0, 1] (probability that the judged model's answer is
        preferred to GPT-4-turbo's; 0/1 for the discrete judge).

    Raises
    ------
    ValueError
        A file whose judged model differs from its name, a missing or out-of-range preference,
        or a repeated instruction (the message names the file and the record).
    """
    frames = []
    for name in ALPACA_EVAL_FILES:
        judged = _judged_name(name)
        records = json.loads(fetch(name).read_text(encoding="utf-8"))
        rows = []
        for i, rec in enumerate(records):
            pref = rec.get("preference")
            if rec.get("generator_2") != judged:
                raise ValueError(f"{name} record {i}: generator_2 is {rec.get('generator_2')!r}, "
                                 f"expected {judged!r}")
            if not isinstance(pref, int | float) or not 1.0 <= pref <= 2.0:
                raise ValueError(f"{name} record {i}: preference must be in [1, 2], got {pref!r}")
            rows.append((judged, rec["instruction"], rec.get("dataset"), rec.get("annotator"),
                         float(pref) - 1.0))
        df = pd.DataFrame(rows, columns=["judged_model", "instruction", "dataset", "annotator",
                                         "target"])
        dup = df["instruction"].duplicated()
        if dup.any():
            raise ValueError(f"{name}: instruction repeated at record {int(np.argmax(dup))}")
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def _parse_scores(value: Any, where: str) -> dict[str, float]:
    """DCRouter ``scores``: a dict, or its string form (parsed as a literal, never evaluated)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            try:
                value = ast.literal_eval(value)
            except (ValueError, SyntaxError) as exc:
                raise ValueError(f"{where}: scores is not a dict literal ({exc})") from None
    if not isinstance(value, dict) or not value:
        raise ValueError(f"{where}: scores must be a non-empty dict, got {type(value).__name__}")
    out = {}
    for k, v in value.items():
        if not isinstance(v, int | float) or not 0.0 <= float(v) <= 1.0:
            raise ValueError(f"{where}: score of {k!r} must be in [0, 1], got {v!r}")
        out[str(k)] = float(v)
    return out


def load_dcrouter() -> pd.DataFrame:
    """DCRouter questions with graded scores, one row per (split, question), one column per model.

    Returns
    -------
    pandas.DataFrame
        Columns ``split`` ("train"/"test"), ``question``, ``in_train`` (True for a test question
        whose text is also in the train file), then one float column per judged model (score in
        [0, 1]), in the train file's key order.

    Raises
    ------
    ValueError
        A record without ``question``/``scores``, a score outside [0, 1], or records with
        different sets of judged models (the message names file and record).
    """
    frames = []
    models: list[str] | None = None
    for split, name in DCROUTER_FILES.items():
        records = json.loads(fetch(name).read_text(encoding="utf-8"))
        rows = []
        for i, rec in enumerate(records):
            where = f"{name} record {i}"
            if "question" not in rec or "scores" not in rec:
                raise ValueError(f"{where}: needs 'question' and 'scores'")
            scores = _parse_scores(rec["scores"], where)
            if models is None:
                models = list(scores)
            if set(scores) != set(models):
                raise ValueError(f"{where}: judged models {sorted(scores)} differ from "
                                 f"{sorted(models)}")
            rows.append({"split": split, "question": rec["question"], **scores})
        frames.append(pd.DataFrame(rows))
    df = pd.concat(frames, ignore_index=True)
    train_q = set(df.loc[df["split"] == "train", "question"])
    df.insert(2, "in_train", (df["split"] == "test") & df["question"].isin(train_q))
    return df[["split", "question", "in_train", *models]]


def calibration_evidence(
    alpaca: pd.DataFrame | None = None, dcrouter: pd.DataFrame | None = None
) -> pd.DataFrame:
    """Mean judgment of every judged model in the mirror: the evidence behind the targets.

    Returns
    -------
    pandas.DataFrame
        Columns ``source``, ``judged_model``, ``n`` (judgments), ``mean`` (AlpacaEval: win rate
        against GPT-4-turbo, i.e. mean of preference − 1; DCRouter: mean graded score over train
        and test), ``used_for`` (our models whose signal uses it; "" if none) and ``role``
        (the calibration anchor it provides, if any).
    """
    alpaca = load_alpaca_eval() if alpaca is None else alpaca
    dcrouter = load_dcrouter() if dcrouter is None else dcrouter
    users: dict[tuple[str, str], list[str]] = {}
    for ours, per_src in PROXY_MAP.items():
        for src, judged in per_src.items():
            for j in judged:
                users.setdefault((src, j), []).append(ours)
    roles = {("alpaca_eval", j): f"size ladder rung {s:g}B" for s, j in SIZE_LADDER.items()}
    roles[("dcrouter", _ANCHOR_8B)] = "level of the 8B ladder rung"
    roles[("dcrouter", _ANCHOR_MISTRAL)] = "level of Mistral-7B-v0.2"
    roles[("dcrouter", _ANCHOR_70B)] = "level of Llama-3.1-70B"
    rows = []
    for judged, g in alpaca.groupby("judged_model", sort=True):
        rows.append(("alpaca_eval", judged, len(g), float(g["target"].mean())))
    for judged in _dc_models(dcrouter):
        rows.append(("dcrouter", judged, len(dcrouter), float(dcrouter[judged].mean())))
    out = pd.DataFrame(rows, columns=["source", "judged_model", "n", "mean"])
    out["used_for"] = [", ".join(users.get((s, j), [])) for s, j in
                       zip(out["source"], out["judged_model"], strict=True)]
    out["role"] = [roles.get((s, j), "") for s, j in
                   zip(out["source"], out["judged_model"], strict=True)]
    return out


def _dc_models(dcrouter: pd.DataFrame) -> list[str]:
    return [c for c in dcrouter.columns if c not in ("split", "question", "in_train")]


def derive_calibration_targets(evidence: pd.DataFrame | None = None) -> dict[str, float]:
    """Target mean quality per model from the mirror's evidence (see module docstring).

    Parameters
    ----------
    evidence
        Output of :func:`calibration_evidence` (computed when None).

    Returns
    -------
    dict
        Our model -> target level (unitless, DCRouter's mean-score scale), MODELS order.
    """
    ev = calibration_evidence() if evidence is None else evidence
    mean = {(s, j): m for s, j, m in zip(ev["source"], ev["judged_model"], ev["mean"],
                                         strict=True)}
    sizes = sorted(SIZE_LADDER)
    top = mean[("alpaca_eval", SIZE_LADDER[sizes[-1]])]
    ratio = [mean[("alpaca_eval", SIZE_LADDER[s])] / top for s in sizes]

    def ladder(size: float) -> float:
        # Linear in log(size) between rungs; sizes outside the ladder are refused, not extrapolated.
        if not sizes[0] <= size <= sizes[-1]:
            raise ValueError(f"size {size}B is outside the ladder {sizes[0]}-{sizes[-1]}B")
        return float(np.interp(math.log(size), np.log(sizes), ratio))

    anchor_8b = mean[("dcrouter", _ANCHOR_8B)]
    targets = {m: anchor_8b * ladder(_LADDER_SIZE[m]) for m in _LADDER_SIZE}
    targets["Mistral-7B-v0.2"] = mean[("dcrouter", _ANCHOR_MISTRAL)]
    targets["Llama-3.1-70B"] = mean[("dcrouter", _ANCHOR_70B)]
    return {m: float(targets[m]) for m in MODELS}


# --------------------------------------------------------------------------------------------
# Configuration and features


@dataclass(frozen=True)
class QualityConfig:
    """Hyperparameters of the offline predictor (defaults = this project's choices).

    Attributes
    ----------
    word_ngrams, char_ngrams
        n-gram ranges of the word and character (within word boundaries) TF-IDF.
    max_word_features, max_char_features
        Vocabulary sizes (most frequent n-grams kept).
    min_df
        Minimum number of training texts an n-gram must occur in.
    max_query_chars
        Characters of the query (from its start) fed to TF-IDF; length features use all of it.
    max_context_chars
        Characters of the context (its end: the most recent text) fed to the word TF-IDF.
    context_weight
        Weight of the context's word TF-IDF vector added to the query's before re-normalizing
        (≥ 0; 0 ignores the context).
    alpha
        Ridge penalty per source (SOURCES order): AlpacaEval, DCRouter. Chosen from {1, 3, 10}
        on the held-out evaluation of :func:`.quality_eval.heldout_accuracy` (so that table is
        slightly optimistic for these two numbers).
    source_weights
        Weight of each source's deviation in a model's signal and in the calibration reference
        set (SOURCES order); non-negative, summing to 1.
    targets
        Calibration target: mean quality per model over the reference set (MODELS order), in
        (0, 1). Default :data:`DEFAULT_TARGETS`.
    signal_scale
        Scale c_m of each model's signal in the affine calibration (MODELS order), ≥ 0; 1 keeps
        the regressors' per-query variation, 0 gives every query the target level.
    heldout_folds, seed
        K-fold split of the AlpacaEval instructions (by instruction) for
        :func:`.quality_eval.heldout_accuracy`.
    """

    word_ngrams: tuple[int, int] = (1, 2)
    char_ngrams: tuple[int, int] = (2, 4)
    max_word_features: int = 30_000
    max_char_features: int = 30_000
    min_df: int = 2
    max_query_chars: int = 2_000
    max_context_chars: int = 1_000
    context_weight: float = 0.5
    alpha: tuple[float, float] = (10.0, 3.0)
    source_weights: tuple[float, float] = (0.5, 0.5)
    targets: tuple[float, ...] = DEFAULT_TARGETS
    signal_scale: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0, 1.0)
    heldout_folds: int = 5
    seed: int = 0

    def __post_init__(self) -> None:
        def fail(field: str, why: str) -> None:
            raise ValueError(f"QualityConfig.{field} {why}, got {getattr(self, field)!r}")

        for f in ("word_ngrams", "char_ngrams"):
            lo, hi = getattr(self, f)
            if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
                fail(f, "must be (lo, hi) integers with 1 <= lo <= hi")
        for f in ("max_word_features", "max_char_features", "min_df", "max_query_chars",
                  "max_context_chars", "heldout_folds"):
            if not isinstance(getattr(self, f), int) or getattr(self, f) < 1:
                fail(f, "must be a positive integer")
        if self.heldout_folds < 2:
            fail("heldout_folds", "must be >= 2")
        if not (np.isfinite(self.context_weight) and self.context_weight >= 0):
            fail("context_weight", "must be a finite number >= 0")
        if len(self.alpha) != len(SOURCES) or not all(a > 0 for a in self.alpha):
            fail("alpha", f"must be {len(SOURCES)} positive numbers")
        w = self.source_weights
        if len(w) != len(SOURCES) or min(w) < 0 or not math.isclose(sum(w), 1.0):
            fail("source_weights", f"must be {len(SOURCES)} non-negative weights summing to 1")
        if len(self.targets) != len(MODELS) or not all(0 < t < 1 for t in self.targets):
            fail("targets", f"must be {len(MODELS)} levels in (0, 1) ({', '.join(MODELS)})")
        if len(self.signal_scale) != len(MODELS) or not all(
            np.isfinite(c) and c >= 0 for c in self.signal_scale
        ):
            fail("signal_scale", f"must be {len(MODELS)} finite numbers >= 0")

    def with_targets(self, targets: Mapping[str, float]) -> QualityConfig:
        """A copy with the targets of the named models replaced (others kept)."""
        unknown = set(targets) - set(MODELS)
        if unknown:
            raise ValueError(f"unknown models in targets: {sorted(unknown)}; known: {MODELS}")
        new = tuple(float(targets.get(m, t)) for m, t in zip(MODELS, self.targets, strict=True))
        return dataclasses.replace(self, targets=new)


def _as_texts(values: Sequence[str | None] | None, n: int | None, what: str) -> list[str]:
    if values is None:
        return [""] * (n or 0)
    if isinstance(values, str):
        raise TypeError(f"{what} must be a sequence of strings, not a single string")
    out = []
    for i, v in enumerate(values):
        if v is None or (not isinstance(v, str) and pd.isna(v)):
            out.append("")
        elif isinstance(v, str):
            out.append(v)
        else:
            raise TypeError(f"{what}[{i}] must be a string, got {type(v).__name__}")
    if n is not None and len(out) != n:
        raise ValueError(f"{what} has {len(out)} entries but there are {n} queries")
    return out


def _length_features(texts: Sequence[str]) -> np.ndarray:
    """Six shape features per text (log chars, log words, log lines, code, digits, '?')."""
    out = np.zeros((len(texts), _N_LENGTH_FEATURES))
    for i, t in enumerate(texts):
        n = len(t)
        out[i] = (
            math.log1p(n),
            math.log1p(len(t.split())),
            math.log1p(t.count("\n")),
            1.0 if _CODE_MARKER.search(t) else 0.0,
            sum(ch.isdigit() for ch in t) / n if n else 0.0,
            1.0 if "?" in t else 0.0,
        )
    return out


def _with_stable_vocabulary(vectorizer, texts: list[str]):
    """``vectorizer`` (a TfidfVectorizer with ``max_features``) with its vocabulary fixed to the
    ``max_features`` terms of highest count in ``texts`` after ``min_df``, ties broken by the
    term: scikit-learn's own choice sorts the counts with NumPy's unstable argsort, whose order
    among equal counts depends on the CPU's SIMD kernels (AVX-512 and AVX2 machines picked
    different terms, and so scored every query differently). Same vocabulary size, terms in
    alphabetical order (scikit-learn's column order); IDF is then learned by the fit as before."""
    from sklearn.base import clone
    from sklearn.feature_extraction.text import CountVectorizer

    params = vectorizer.get_params()
    limit = params["max_features"]
    if limit is None:
        return vectorizer
    # the vectorizer's own tokenization (every CountVectorizer parameter it has), unlimited
    shared = {k: params[k] for k in CountVectorizer().get_params()}
    counter = CountVectorizer(**{**shared, "max_features": None, "dtype": np.int64})
    counts = counter.fit_transform(texts)
    terms = counter.get_feature_names_out()  # alphabetical
    total = np.asarray(counts.sum(axis=0)).ravel()
    order = np.lexsort((np.arange(len(terms)), -total))  # highest count first, then the term
    keep = np.sort(order[:limit])
    return clone(vectorizer).set_params(
        vocabulary={str(terms[i]): k for k, i in enumerate(keep)}, max_features=None)


class TextFeaturizer:
    """TF-IDF (word + char n-grams) of the query, its context mixed into the word block, + shape.

    The context enters through the word n-grams only (its topic); the character n-grams and the
    shape features describe the query itself, and character n-grams of long contexts would cost
    most of the scoring time. Fit once on the training questions; :meth:`transform` is
    deterministic.
    """

    def __init__(self, config: QualityConfig) -> None:
        from sklearn.feature_extraction.text import TfidfVectorizer

        self.config = config
        common = dict(min_df=config.min_df, sublinear_tf=True, dtype=np.float32)
        self.word = TfidfVectorizer(analyzer="word", ngram_range=config.word_ngrams,
                                    max_features=config.max_word_features, **common)
        self.char = TfidfVectorizer(analyzer="char_wb", ngram_range=config.char_ngrams,
                                    max_features=config.max_char_features, **common)
        self.shape_mean = np.zeros(_N_LENGTH_FEATURES)
        self.shape_std = np.ones(_N_LENGTH_FEATURES)

    def fit_transform(self, texts: Sequence[str]) -> sp.csr_matrix:
        """Learn vocabularies, IDF and the shape standardization; return the texts' features."""
        texts = _as_texts(texts, None, "texts")
        heads = [t[: self.config.max_query_chars] for t in texts]
        self.word = _with_stable_vocabulary(self.word, heads)
        self.char = _with_stable_vocabulary(self.char, heads)
        xw = self.word.fit_transform(heads)
        xc = self.char.fit_transform(heads)
        shape = _length_features(texts)
        self.shape_mean = shape.mean(axis=0)
        std = shape.std(axis=0)
        self.shape_std = np.where(std > 0, std, 1.0)
        shape = (shape - self.shape_mean) / self.shape_std
        return sp.hstack([xw, xc, sp.csr_matrix(shape)], format="csr", dtype=np.float64)

    @property
    def n_features(self) -> int:
        """Number of columns of :meth:`transform`."""
        return len(self.word.vocabulary_) + len(self.char.vocabulary_) + _N_LENGTH_FEATURES

    def _word_tfidf(self, queries: list[str], contexts: list[str] | None) -> sp.csr_matrix:
        from sklearn.preprocessing import normalize

        cfg = self.config
        xq = self.word.transform([q[: cfg.max_query_chars] for q in queries])
        if contexts is None or cfg.context_weight == 0 or not any(contexts):
            return xq
        xc = self.word.transform([c[-cfg.max_context_chars :] for c in contexts])
        return normalize(xq + cfg.context_weight * xc, norm="l2", copy=False)

    def transform(
        self, queries: Sequence[str], contexts: Sequence[str | None] | None = None
    ) -> sp.csr_matrix:
        """Feature matrix (n × :attr:`n_features`, sparse float64)."""
        q = _as_texts(queries, None, "queries")
        c = None if contexts is None else _as_texts(contexts, len(q), "contexts")
        shape = (_length_features(q) - self.shape_mean) / self.shape_std
        heads = [t[: self.config.max_query_chars] for t in q]
        blocks = [self._word_tfidf(q, c), self.char.transform(heads), sp.csr_matrix(shape)]
        return sp.hstack(blocks, format="csr", dtype=np.float64)


# --------------------------------------------------------------------------------------------
# Calibration


def calibrate_offsets(
    signal: np.ndarray,
    targets: Sequence[float],
    scale: Sequence[float] | None = None,
    weights: np.ndarray | None = None,
    tol: float = 1e-12,
) -> np.ndarray:
    """Offsets a_m such that the weighted mean of clip(a_m + c_m · s_m, 0, 1) equals T_m.

    Parameters
    ----------
    signal
        Per-query signal s, shape (n, k) (unitless quality deviations).
    targets
        Target mean T_m per column, each in (0, 1).
    scale
        c_m per column (≥ 0), default 1.
    weights
        Non-negative weight per row (default equal); normalized to sum 1.
    tol
        Bisection stops when the bracket is narrower than this.

    Returns
    -------
    numpy.ndarray
        Offsets a, shape (k,). The clipped mean is continuous and non-decreasing in a_m, from 0 to
        1, so a solution exists for every target in (0, 1); bisection finds it.
    """
    s = np.asarray(signal, dtype=float)
    if s.ndim != 2 or s.shape[0] == 0 or not np.all(np.isfinite(s)):
        raise ValueError(f"signal must be a finite (n ≥ 1, k) array, got shape {s.shape}")
    k = s.shape[1]
    t = np.asarray(targets, dtype=float)
    c = np.ones(k) if scale is None else np.asarray(scale, dtype=float)
    if t.shape != (k,) or not np.all((t > 0) & (t < 1)):
        raise ValueError(f"targets must be {k} values in (0, 1), got {targets!r}")
    if c.shape != (k,) or not np.all(np.isfinite(c) & (c >= 0)):
        raise ValueError(f"scale must be {k} finite values >= 0, got {scale!r}")
    w = np.full(s.shape[0], 1.0) if weights is None else np.asarray(weights, dtype=float)
    if w.shape != (s.shape[0],) or np.any(w < 0) or w.sum() <= 0:
        raise ValueError("weights must be one non-negative value per row, not all zero")
    w = w / w.sum()
    x = s * c
    lo = -x.max(axis=0) - 1.0  # every value clipped to 0: mean 0 < target
    hi = 1.0 - x.min(axis=0) + 1.0  # every value clipped to 1: mean 1 > target
    for _ in range(200):  # halves the bracket; float resolution is reached well before 200
        if np.all(hi - lo <= tol):
            break
        mid = 0.5 * (lo + hi)
        too_low = w @ np.clip(mid + x, 0.0, 1.0) < t
        lo = np.where(too_low, mid, lo)
        hi = np.where(too_low, hi, mid)
    return 0.5 * (lo + hi)


# --------------------------------------------------------------------------------------------
# The offline predictor


#: LSQR tolerance of the Ridge heads: tight enough that the fit does not depend on the machine's
#: floating-point kernels (the solution is unique; only where the solver stops varies).
RIDGE_TOL = 1e-12


def _fit_heads(x: sp.csr_matrix, y: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Ridge per column of y (one multi-output fit); returns coef (p × k) and intercepts (k)."""
    from sklearn.linear_model import Ridge

    # lsqr: iterative, supports an intercept on sparse input. It stops at its tolerance, so at
    # scikit-learn's 1e-4 the scores moved by up to 6e-4 when NumPy / OpenBLAS took other SIMD
    # kernels (AVX2 off); at 1e-9 by up to 6e-8; at RIDGE_TOL by < 1e-9.
    model = Ridge(alpha=alpha, solver="lsqr", tol=RIDGE_TOL).fit(x, y)
    coef = np.atleast_2d(model.coef_).T.astype(np.float64)
    return coef, np.atleast_1d(model.intercept_).astype(np.float64)


@dataclass
class _ProxyBank:
    """Fitted Ridge heads of judged models: predictions = X @ coef + intercept."""

    keys: list[tuple[str, str]]  # (source, judged model) per column
    coef: np.ndarray  # (n_features, n_heads)
    intercept: np.ndarray  # (n_heads,)
    label_mean: np.ndarray  # (n_heads,) mean training label μ_p

    def predict(self, x: sp.csr_matrix) -> np.ndarray:
        return np.asarray(x @ self.coef) + self.intercept


@dataclass
class _TrainingSet:
    """Training texts (unique AlpacaEval instructions, then DCRouter rows) and their features."""

    ae_instructions: list[str]
    dc_questions: list[str]
    x: sp.csr_matrix

    @property
    def texts(self) -> list[str]:
        return self.ae_instructions + self.dc_questions


def _fit_featurizer_and_bank(
    config: QualityConfig, alpaca: pd.DataFrame, dcrouter: pd.DataFrame,
    dcrouter_heads: bool = True,
) -> tuple[TextFeaturizer, _ProxyBank, _TrainingSet]:
    """Featurizer fitted on all training texts, and the Ridge heads (DCRouter's optional)."""
    ae = sorted(alpaca["instruction"].unique())
    dc = dcrouter["question"].tolist()
    featurizer = TextFeaturizer(config)
    train = _TrainingSet(ae, dc, featurizer.fit_transform(ae + dc))
    row = {t: i for i, t in enumerate(ae)}
    keys, coefs, intercepts, means = [], [], [], []
    # AlpacaEval: judged models share most instructions; one multi-output Ridge per identical
    # instruction set (phi-2 lacks 2 of the 805).
    by_model = {j: g.set_index("instruction")["target"] for j, g in
                alpaca.groupby("judged_model", sort=True)}
    groups: dict[tuple[str, ...], list[str]] = {}
    for j, ser in by_model.items():
        groups.setdefault(tuple(sorted(ser.index)), []).append(j)
    for instructions, judged in groups.items():
        x = train.x[[row[t] for t in instructions]]
        y = np.column_stack([by_model[j].loc[list(instructions)].to_numpy() for j in judged])
        coef, icpt = _fit_heads(x, y, config.alpha[0])
        keys += [("alpaca_eval", j) for j in judged]
        coefs.append(coef)
        intercepts.append(icpt)
        means.append(y.mean(axis=0))
    if dcrouter_heads and len(dcrouter):
        dc_models = _dc_models(dcrouter)
        y = dcrouter[dc_models].to_numpy(dtype=float)
        coef, icpt = _fit_heads(train.x[len(ae) :], y, config.alpha[1])
        keys += [("dcrouter", j) for j in dc_models]
        coefs.append(coef)
        intercepts.append(icpt)
        means.append(y.mean(axis=0))
    bank = _ProxyBank(keys, np.hstack(coefs), np.concatenate(intercepts), np.concatenate(means))
    return featurizer, bank, train


class OfflineQualityPredictor(QualityPredictor):
    """Default offline predictor: TF-IDF → judged-model Ridge heads → mapping → calibration.

    Build it with :func:`load_offline_predictor` (cached) or :func:`fit_offline_predictor`.

    Attributes
    ----------
    config
        The :class:`QualityConfig` it was fitted with.
    offsets
        Calibration offsets a_m (MODELS order).
    reference_means
        Mean Q per model over the calibration reference set (equals ``config.targets`` up to the
        bisection tolerance).
    """

    def __init__(
        self,
        config: QualityConfig,
        featurizer: TextFeaturizer,
        bank: _ProxyBank,
        offsets: np.ndarray,
        reference_means: np.ndarray,
        fit_seconds: float,
    ) -> None:
        self.config = config
        self.featurizer = featurizer
        self.bank = bank
        self.offsets = np.asarray(offsets, dtype=float)
        self.reference_means = np.asarray(reference_means, dtype=float)
        self.fit_seconds = fit_seconds
        self._mix = self._mixing_matrix()

    def _mixing_matrix(self) -> np.ndarray:
        """(n_heads × 5) weights: signal = (head predictions − μ) @ mix."""
        index = {k: i for i, k in enumerate(self.bank.keys)}
        mix = np.zeros((len(self.bank.keys), len(MODELS)))
        for m, ours in enumerate(MODELS):
            per_src = {s: PROXY_MAP[ours].get(s, ()) for s in SOURCES}
            weights = {s: w for s, w in zip(SOURCES, self.config.source_weights, strict=True)
                       if per_src[s] and w > 0}
            total = sum(weights.values())
            if total == 0:
                raise ValueError(f"{ours}: no proxy in a source with positive weight")
            for s, w in weights.items():
                for j in per_src[s]:
                    if (s, j) not in index:
                        raise ValueError(f"{ours}: proxy {j!r} has no judgments in {s}")
                    mix[index[(s, j)], m] += w / total / len(per_src[s])
        return mix

    def proxy_predictions(
        self, queries: Sequence[str], contexts: Sequence[str | None] | None = None
    ) -> pd.DataFrame:
        """Prediction of every judged model's head (its own scale, unclipped), one column each.

        Columns are ``"<source>:<judged model>"``.
        """
        x = self.featurizer.transform(queries, contexts)
        cols = [f"{s}:{j}" for s, j in self.bank.keys]
        return pd.DataFrame(self.bank.predict(x), columns=cols)

    def signal(
        self, queries: Sequence[str], contexts: Sequence[str | None] | None = None
    ) -> np.ndarray:
        """Per-query signal s_m(x) (uncalibrated deviation), shape (n, 5)."""
        return self._signal_from_x(self.featurizer.transform(queries, contexts))

    def _signal_from_x(self, x: sp.csr_matrix) -> np.ndarray:
        return (self.bank.predict(x) - self.bank.label_mean) @ self._mix

    def raw_quality(
        self, queries: Sequence[str], contexts: Sequence[str | None] | None = None
    ) -> np.ndarray:
        """The proxies taken raw (their own levels, no calibration), clipped to [0, 1].

        Shown only to make the case for calibration: this is what the mapping alone would give.
        """
        x = self.featurizer.transform(queries, contexts)
        return np.clip(self.bank.predict(x) @ self._mix, 0.0, 1.0)

    def _apply(self, signal: np.ndarray) -> np.ndarray:
        scale = np.asarray(self.config.signal_scale, dtype=float)
        return np.clip(self.offsets + signal * scale, 0.0, 1.0)

    def predict(
        self, queries: Sequence[str], contexts: Sequence[str | None] | None = None
    ) -> np.ndarray:
        """Calibrated quality Q(m) ∈ [0, 1], shape (n, 5), MODELS order (see class doc)."""
        q = _as_texts(queries, None, "queries")
        if not q:
            return np.zeros((0, len(MODELS)))
        return self._apply(self.signal(q, contexts))

    def recalibrated(
        self,
        reference_queries: Sequence[str],
        reference_contexts: Sequence[str | None] | None = None,
        targets: Mapping[str, float] | None = None,
    ) -> OfflineQualityPredictor:
        """A copy whose offsets make the mean Q over ``reference_queries`` equal the targets.

        Parameters
        ----------
        reference_queries, reference_contexts
            The workload sample the levels should hold on (e.g. ShareGPT queries).
        targets
            Replacement targets for some models (default: the config's).
        """
        config = self.config if targets is None else self.config.with_targets(targets)
        sig = self.signal(reference_queries, reference_contexts)
        offsets = calibrate_offsets(sig, config.targets, config.signal_scale)
        new = OfflineQualityPredictor(config, self.featurizer, self.bank, offsets,
                                      np.zeros(len(MODELS)), self.fit_seconds)
        new.reference_means = new._apply(sig).mean(axis=0)
        return new


def fit_offline_predictor(
    config: QualityConfig | None = None,
    alpaca: pd.DataFrame | None = None,
    dcrouter: pd.DataFrame | None = None,
) -> OfflineQualityPredictor:
    """Fit the offline predictor on all judgments (no cache; see :func:`load_offline_predictor`).

    Parameters
    ----------
    config
        Hyperparameters (default :class:`QualityConfig`()).
    alpaca, dcrouter
        Judgment tables (default: :func:`load_alpaca_eval`, :func:`load_dcrouter`); pass subsets
        to fit on part of the data.
    """
    config = QualityConfig() if config is None else config
    t0 = time.perf_counter()
    alpaca = load_alpaca_eval() if alpaca is None else alpaca
    dcrouter = load_dcrouter() if dcrouter is None else dcrouter
    featurizer, bank, train = _fit_featurizer_and_bank(config, alpaca, dcrouter)
    # Calibration reference: the training questions, each source weighted by its source weight.
    n_ae, n_dc = len(train.ae_instructions), len(train.dc_questions)
    weights = np.concatenate([np.full(n_ae, config.source_weights[0] / max(n_ae, 1)),
                              np.full(n_dc, config.source_weights[1] / max(n_dc, 1))])
    pred = OfflineQualityPredictor(config, featurizer, bank, np.zeros(len(MODELS)),
                                   np.zeros(len(MODELS)), 0.0)
    sig = pred._signal_from_x(train.x)
    pred.offsets = calibrate_offsets(sig, config.targets, config.signal_scale, weights)
    pred.reference_means = (weights / weights.sum()) @ pred._apply(sig)
    pred.fit_seconds = time.perf_counter() - t0
    return pred


def _training_files() -> list[str]:
    return [*ALPACA_EVAL_FILES, *DCROUTER_FILES.values()]


def _cache_entry(config: QualityConfig, what: str, fmt: str,
                 module: str = "carbonrouter_lib.quality") -> cache.Entry:
    """The cache entry of what ``module`` computes from the training data under ``config``."""
    import sklearn

    params = {"config": dataclasses.asdict(config),
              "files": {n: REGISTRY[n].sha256 for n in _training_files()},
              "sklearn": sklearn.__version__}  # PROXY_MAP is code: in the code hash
    return cache.entry(f"quality_{what}", params, module, fmt=fmt)


def load_offline_predictor(
    config: QualityConfig | None = None, use_cache: bool = True
) -> OfflineQualityPredictor:
    """The fitted offline predictor, from the joblib cache when present (else fitted and cached).

    The cache entry (:mod:`carbonrouter_lib.cache`) is keyed by the training files' SHA-256,
    the config, the scikit-learn version and the code (:data:`PROXY_MAP` included); a cached
    predictor gives the same predictions, bit for bit.
    """
    config = QualityConfig() if config is None else config
    entry = _cache_entry(config, "predictor", "joblib")
    if use_cache and (hit := entry.load()) is not None:
        pred = hit[0]
        if not isinstance(pred, OfflineQualityPredictor):
            raise TypeError(f"{entry.payload} does not hold an OfflineQualityPredictor; "
                            f"delete it")
        return pred
    # Hash-verify the training files before the result is cached under their hashes.
    for name in _training_files():
        fetch(name)
    pred = fit_offline_predictor(config)
    if use_cache:
        entry.save(pred)
    return pred


# --------------------------------------------------------------------------------------------
# Scoring a turn table


def turn_contexts(turns_df: pd.DataFrame, context_turns: int = 1) -> tuple[list[str], int]:
    """Recent context of every turn: the previous ``context_turns`` turns of its conversation.

    Each earlier turn contributes ``user_text + "\\n" + assistant_text``; turns are joined with a
    blank line, oldest first. The first turn of a conversation has an empty context.

    Returns
    -------
    contexts, n_missing
        One string per row (row order), and the number of earlier turns that should have been in
        the context but are not in the table (e.g. a filtered table); a warning names the count.
    """
    if not isinstance(context_turns, int) or context_turns < 0:
        raise ValueError(f"context_turns must be an integer >= 0, got {context_turns!r}")
    missing_cols = {"conversation_id", "turn", "user_text", "assistant_text"} - set(turns_df)
    if missing_cols:
        raise ValueError(f"turns_df lacks columns {sorted(missing_cols)}")
    if context_turns == 0:
        return [""] * len(turns_df), 0
    cids = turns_df["conversation_id"].astype(str).tolist()
    turns = turns_df["turn"].to_numpy(dtype=np.int64)
    users = _as_texts(turns_df["user_text"].tolist(), None, "user_text")
    answers = _as_texts(turns_df["assistant_text"].tolist(), None, "assistant_text")
    where: dict[tuple[str, int], int] = {}
    for i, key in enumerate(zip(cids, turns.tolist(), strict=True)):
        if key in where:
            raise ValueError(f"turns_df has conversation {key[0]!r} turn {key[1]} twice "
                             f"(rows {where[key]} and {i})")
        where[key] = i
    contexts, n_missing = [], 0
    for cid, k in zip(cids, turns.tolist(), strict=True):
        parts = []
        for prev in range(max(0, k - context_turns), k):
            j = where.get((cid, prev))
            if j is None:
                n_missing += 1
            else:
                parts.append(f"{users[j]}\n{answers[j]}")
        contexts.append("\n\n".join(parts))
    if n_missing:
        warnings.warn(f"turn_contexts: {n_missing} earlier turns are not in the table; those "
                      f"contexts are shorter", stacklevel=2)
    return contexts, n_missing


def score_turns(
    turns_df: pd.DataFrame,
    predictor: QualityPredictor | None = None,
    context_turns: int = 1,
    batch_size: int = 4096,
    progress: bool = False,
    n_jobs: int | None = None,
) -> np.ndarray:
    """Q(m) of every row of a turn table, from its user_text and recent context
    (``docs/model.md`` §8).

    Parameters
    ----------
    turns_df
        A turn table (:func:`~carbonrouter_lib.sharegpt.load_sharegpt_turns`) with
        ``conversation_id``, ``turn``, ``user_text``, ``assistant_text``.
    predictor
        Default :func:`load_offline_predictor`().
    context_turns
        Earlier turns of the same conversation used as context (0: query only).
    batch_size
        Rows per predictor call (bounds memory).
    progress
        Show a tqdm bar.
    n_jobs
        Processes scoring the batches (default: the CPUs this process may use, at most one per
        batch; one inside a daemonic process such as a Dask worker). Each batch is scored
        alone, as in one process, so the result does not depend on ``n_jobs``.

    Returns
    -------
    numpy.ndarray
        Shape (len(turns_df), 5), values in [0, 1], MODELS order, row order of ``turns_df``.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    predictor = load_offline_predictor() if predictor is None else predictor
    contexts, _ = turn_contexts(turns_df, context_turns)
    queries = _as_texts(turns_df["user_text"].tolist(), None, "user_text")
    out = np.zeros((len(queries), len(predictor.models)))
    if n_jobs is not None and n_jobs < 1:
        raise ValueError(f"n_jobs must be >= 1, got {n_jobs}")
    starts = list(range(0, len(queries), batch_size))
    if n_jobs is None:
        import multiprocessing

        from joblib import cpu_count  # the CPUs this process may use (affinity, cgroup quota)

        # A daemonic process (a Dask worker, one per core already) may not start children.
        n_jobs = 1 if multiprocessing.current_process().daemon else cpu_count()
    jobs = min(len(starts), n_jobs)
    batches = [(queries[s : s + batch_size],
                contexts[s : s + batch_size] if context_turns else None) for s in starts]
    if jobs > 1:
        # The TF-IDF analyzers are pure Python: batches go to worker processes (joblib's loky,
        # scikit-learn's own), the predictor pickled once per worker chunk.
        from joblib import Parallel, delayed

        chunks = [list(range(len(starts)))[i::jobs] for i in range(jobs)]
        parts = Parallel(n_jobs=jobs, backend="loky")(
            delayed(_score_batches)(predictor, [batches[i] for i in chunk]) for chunk in chunks)
        for chunk, part in zip(chunks, parts, strict=True):
            for i, q in zip(chunk, part, strict=True):
                out[starts[i] : starts[i] + batch_size] = q
        return out
    if progress:
        from tqdm import tqdm

        batches = tqdm(batches, desc="quality", unit="batch")
    for s, (q, c) in zip(starts, batches, strict=True):
        out[s : s + batch_size] = predictor.predict(q, c)
    return out


def _score_batches(predictor: QualityPredictor,
                   batches: list[tuple[list[str], list[str] | None]]) -> list[np.ndarray]:
    return [predictor.predict(q, c) for q, c in batches]

