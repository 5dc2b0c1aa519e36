"""Output length at routing time: a cross-fitted estimator of N_out (``docs/model.md`` §4, §5,
§8).

The router needs N_out(m), the output tokens of a query under model m's tokenizer, *before* the
response exists: the context check (Eq. 7; ``docs/model.md`` §5, §6a.1: N_new + N_hist + N_out ≤
window), Eq. 4's output energy e_out·N_out and the completion time use it. Accounting uses the
realized value, which in the trace-driven replay is the trace's response under the serving model's
tokenizer (``docs/model.md`` §8). The response is the same whichever model serves, so there is one
estimate per tokenizer family (column ``est_output_tokens_<family>``); a model's estimate is its
family's (:func:`estimate_column`).

What the estimator sees (all known at routing time of turn k of a conversation):

- the user message: TF-IDF of its word 1–2-grams (hashed, so the vocabulary is not fitted; the
  IDF is fitted on the training folds only) and a few counts (characters, lines, code fences,
  question marks) — only when the table has ``user_text`` (the Mooncake trace has no text);
- new and history tokens, the turn index;
- the realized outputs of the *earlier* turns of the same conversation (their responses have
  completed before turn k is sent): last, mean and max of log1p(output tokens), and the new tokens
  of the previous turn. ``n_turns`` (the conversation's final length) is *not* used: it is not
  known while the conversation runs.

Target: log1p(output tokens); the estimate is expm1 of the prediction, rounded, clipped to
``[1, max_output_tokens]``. A log target makes the estimate a typical (median-like) length rather
than a mean, so it under-estimates sums of heavy-tailed outputs a little (``total_ratio`` in
:func:`output_length_report` shows by how much).

Cross-fitting (no query sees its own response): conversations are split into ``n_folds`` folds by
a seeded permutation of the sorted conversation ids (:func:`conversation_folds`); each row is
estimated by a model fitted on the *other* folds' conversations only, so neither the row's own
response nor any other turn of its session enters the fit (its earlier turns' outputs enter only
as the row's own routing-time features). Everything fitted (IDF, spline knots, regressor) is
fitted on the training folds; the output is deterministic for a seed.

Model choice (held-out, 5 conversation folds, seed 0, all 61,239 ShareGPT turns; MAE of
log1p(tokens) for gemma3 / llama3 / mistral, and wall time, one thread on a shared 2-core
machine, for all three families and five folds, text hashing included) — reproduced by
:func:`compare_models`:

======================================================  ======  ======  =======  ======
predictor                                               gemma3  llama3  mistral  time s
======================================================  ======  ======  =======  ======
global median of the training folds (baseline)          0.734   0.715   0.738
median per turn index (baseline)                        0.733   0.714   0.737
``ridge``, numeric features only (cubic splines)        0.589   0.578   0.594    2.0
``hgb``, numeric features only                          0.572   0.562   0.577    5.3
``hgb``, numeric features + text counts                 0.563   0.555   0.571    7.1
``ridge``, TF-IDF + splines of numerics + text counts   0.522   0.513   0.527    16.3
======================================================  ======  ======  =======  ======

Hence ``model="auto"``: ``"ridge"`` (Ridge on sparse TF-IDF + additive cubic splines of the
numeric features) when text is used, ``"hgb"`` (HistGradientBoosting on the numeric features)
without text, where it beats the spline Ridge. Averaging ridge and hgb with text gained < 0.002
for twice the time, so it is not offered. With text the estimator's median absolute percentage
error is 0.35 (baseline 0.44–0.45), Spearman 0.65 (baseline ≈ 0), 67–68% of estimates within
±50% (baseline 54–56%); Σ estimate / Σ realized is 0.83–0.84 (a median-like estimate of a
heavy-tailed length; baselines 0.89–0.91).
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import scipy.sparse as sp
from scipy.stats import spearmanr
from threadpoolctl import threadpool_limits

from carbonrouter_lib.tokenizers import TOKENIZER_FAMILIES, family_of

__all__ = [
    "ESTIMATE_PREFIX",
    "MODEL_KINDS",
    "NUMERIC_FEATURES",
    "TEXT_STAT_FEATURES",
    "PREDICTORS",
    "TURN_MEDIAN_POOL_FROM",
    "OutputLengthConfig",
    "estimate_column",
    "conversation_folds",
    "routing_features",
    "log1p_grid",
    "estimate_output_tokens",
    "baseline_estimates",
    "output_length_report",
    "compare_models",
]

#: Estimate columns are ``ESTIMATE_PREFIX + family``.
ESTIMATE_PREFIX = "est_output_tokens_"
#: Regressors: ``"auto"`` resolves to ``"ridge"`` with text, ``"hgb"`` without.
MODEL_KINDS: tuple[str, ...] = ("auto", "ridge", "hgb")
#: Numeric routing-time features of :func:`routing_features` (always present).
NUMERIC_FEATURES: tuple[str, ...] = (
    "log_new_tokens",
    "log_history_tokens",
    "log_turn",
    "has_previous",
    "prev_last_log_output",
    "prev_mean_log_output",
    "prev_max_log_output",
    "prev_log_new_tokens",
)
#: Counts taken from the user message (only with text).
TEXT_STAT_FEATURES: tuple[str, ...] = (
    "log_chars",
    "log_lines",
    "has_code_fence",
    "question_marks",
)
#: Row labels of :func:`output_length_report`'s ``predictor`` column.
PREDICTORS: tuple[str, ...] = ("estimator", "global_median", "turn_median")
#: The per-turn-index baseline pools all turns with index ≥ this into one group (few long
#: conversations: a median of a handful of rows is noise).
TURN_MEDIAN_POOL_FROM = 20
# Question marks beyond this count carry no more information (several questions = a list).
_QUESTION_MARK_CAP = 5
_ATTRS_KEY = "output_length"


@dataclass(frozen=True)
class OutputLengthConfig:
    """Hyper-parameters of the output-length estimator (chosen on held-out ShareGPT folds).

    Attributes
    ----------
    model
        ``"auto"`` (``"ridge"`` with text, ``"hgb"`` without), ``"ridge"`` or ``"hgb"``.
    max_output_tokens
        Cap of an estimate, tokens (default 8,192, a common ``max_new_tokens`` of serving
        stacks; it bounds what one estimate can take of a 32K window in the context check). The
        ShareGPT estimates never come near it: it only guards against extrapolation.
    ridge_alpha
        L2 penalty of the Ridge regressor (default 3.0; 1, 2, 3, 5, 10 were tried).
    ridge_tol
        Tolerance of Ridge's LSQR solver (default 1e-12). LSQR stops at the tolerance, so a loose
        one leaves the answer to rounding: at 1e-3 the estimates moved by up to 77 tokens (37,625
        of 61,239 ShareGPT turns) when NumPy and OpenBLAS took other SIMD kernels (AVX2 off), and
        whole replays moved by 1–2% between two machines; at 1e-9 one estimate of 183,717 still
        moved by a token, at 1e-12 none (tests/test_machine_independence.py), for 3.3× the
        fitting time of 1e-3 (103 s against 31 s for the three tokenizer families, one core).
    spline_knots
        Knots of the cubic B-spline of each numeric feature in the Ridge (uniform over the
        training range, constant extrapolation), default 6.
    hash_features
        Columns of the hashed TF-IDF (default 2**18; 2**20 gained 0.003 at 4× the time).
    text_head_chars, text_tail_chars
        Characters of a long user message that are vectorized: the first ``head`` and the last
        ``tail`` (defaults 2,000 and 1,000) — the instruction sits at the start or the end of a
        pasted document; its length is a numeric feature anyway.
    hgb_max_iter, hgb_learning_rate
        Boosting iterations and learning rate of HistGradientBoosting (defaults 100 and 0.15:
        as good as 200 × 0.1 on held-out folds in half the time).
    threads
        OpenMP / BLAS threads while fitting (default 1). Measured on 2 shared cores: with the
        libraries' default of one thread per core, their spin-waiting made the whole ShareGPT
        estimate 3× (ridge, 62 s vs 20 s) to 7× (hgb, 58 s vs 8.6 s) *slower* as soon as another
        process used a core; on idle cores two threads gained < 2×.
    """

    model: str = "auto"
    max_output_tokens: int = 8192
    ridge_alpha: float = 3.0
    ridge_tol: float = 1e-12
    spline_knots: int = 6
    hash_features: int = 2**18
    text_head_chars: int = 2000
    text_tail_chars: int = 1000
    hgb_max_iter: int = 100
    hgb_learning_rate: float = 0.15
    threads: int = 1

    def __post_init__(self) -> None:
        if self.model not in MODEL_KINDS:
            raise ValueError(f"OutputLengthConfig.model must be one of {MODEL_KINDS}, "
                             f"got {self.model!r}")
        for name in ("max_output_tokens", "spline_knots", "hash_features", "hgb_max_iter",
                     "threads"):
            value = getattr(self, name)
            if not isinstance(value, int | np.integer) or value < 1:
                raise ValueError(f"OutputLengthConfig.{name} must be a positive int, got {value!r}")
        if self.spline_knots < 2:
            raise ValueError(f"OutputLengthConfig.spline_knots must be >= 2, "
                             f"got {self.spline_knots}")
        for name in ("text_head_chars", "text_tail_chars"):
            value = getattr(self, name)
            if not isinstance(value, int | np.integer) or value < 0:
                raise ValueError(f"OutputLengthConfig.{name} must be an int >= 0, got {value!r}")
        if self.text_head_chars + self.text_tail_chars == 0:
            raise ValueError("OutputLengthConfig: text_head_chars + text_tail_chars must be > 0")
        for name in ("ridge_alpha", "ridge_tol", "hgb_learning_rate"):
            value = getattr(self, name)
            if not np.isfinite(value) or value <= 0:
                raise ValueError(f"OutputLengthConfig.{name} must be positive, got {value!r}")

    def resolved_model(self, use_text: bool) -> str:
        """The regressor used: ``model``, with ``"auto"`` resolved by whether text is used."""
        if self.model == "auto":
            return "ridge" if use_text else "hgb"
        return self.model


def estimate_column(model_or_family: str) -> str:
    """Estimate column of a model (``"Llama-3.1-70B"``) or family (``"llama3"``).

    A model's estimate is its tokenizer family's: the replayed response is the same.
    """
    return ESTIMATE_PREFIX + family_of(model_or_family)


# --------------------------------------------------------------------------------------------
# Input checks, folds, features


def _required_columns(families: Sequence[str]) -> list[str]:
    cols = ["conversation_id", "turn"]
    for fam in families:
        cols += [f"new_tokens_{fam}", f"output_tokens_{fam}", f"history_tokens_{fam}"]
    return cols


def _check_turns(turns_df: pd.DataFrame, families: Sequence[str]) -> None:
    """Raise a clear error for a turns table the estimator cannot use."""
    if not isinstance(turns_df, pd.DataFrame):
        raise TypeError(f"turns_df must be a pandas DataFrame, got {type(turns_df).__name__}")
    missing = [c for c in _required_columns(families) if c not in turns_df.columns]
    if missing:
        raise KeyError(f"turns table lacks column(s) {missing}; the output-length estimator "
                       f"needs {_required_columns(families)}")
    if len(turns_df) == 0:
        raise ValueError("turns table is empty")
    if not turns_df.index.is_unique:
        raise ValueError("turns table index has duplicate labels; estimates are aligned on it")
    ids = turns_df["conversation_id"]
    if ids.isna().any():
        raise ValueError(f"conversation_id is missing in {int(ids.isna().sum())} row(s), first "
                         f"at index {ids.index[ids.isna().to_numpy()][0]!r}")
    for col in _required_columns(families)[1:]:
        values = turns_df[col]
        if not pd.api.types.is_numeric_dtype(values) or values.isna().any():
            raise ValueError(f"column {col!r} must be numeric without missing values")
        arr = values.to_numpy(dtype=float)
        bad = (arr < 0) | (arr != np.round(arr))
        if bad.any():
            raise ValueError(f"column {col!r} must hold integers >= 0; row "
                             f"{turns_df.index[bad][0]!r} has {arr[bad][0]!r}")
    dup = turns_df.duplicated(["conversation_id", "turn"])
    if dup.any():
        first = turns_df.loc[dup.to_numpy()].iloc[0]
        raise ValueError(f"{int(dup.sum())} duplicate (conversation_id, turn) pair(s), first "
                         f"({first['conversation_id']!r}, {first['turn']!r})")


def _resolve_use_text(turns_df: pd.DataFrame, use_text: bool | None) -> bool:
    if use_text is None:
        return "user_text" in turns_df.columns
    if use_text and "user_text" not in turns_df.columns:
        raise KeyError("use_text=True but the turns table has no 'user_text' column")
    return bool(use_text)


def conversation_folds(conversation_ids: Sequence | pd.Series, n_folds: int = 5,
                       seed: int = 0) -> np.ndarray:
    """Fold (0 … n_folds−1) of every row, all rows of a conversation in the same fold.

    The distinct ids are sorted, permuted with ``numpy.random.default_rng(seed)`` and dealt
    round-robin, so the folds depend only on the set of ids and the seed (not on row order or
    on any token count) and hold as many conversations as possible (±1).

    Raises
    ------
    ValueError
        ``n_folds`` < 2, a missing id, or fewer distinct conversations than folds.
    """
    if not isinstance(n_folds, int | np.integer) or n_folds < 2:
        raise ValueError(f"n_folds must be an int >= 2, got {n_folds!r}")
    codes, uniques = pd.factorize(pd.Series(conversation_ids), sort=True)
    if (codes < 0).any():
        raise ValueError("conversation_ids has missing values")
    if len(uniques) < n_folds:
        raise ValueError(f"{len(uniques)} conversation(s) cannot fill n_folds={n_folds} "
                         f"folds: need at least one conversation per fold")
    perm = np.random.default_rng(seed).permutation(len(uniques))
    fold_of = np.empty(len(uniques), dtype=np.int64)
    fold_of[perm] = np.arange(len(uniques)) % n_folds
    return fold_of[codes]


def routing_features(turns_df: pd.DataFrame, family: str, *,
                     use_text: bool | None = None) -> pd.DataFrame:
    """Routing-time features of every turn for one tokenizer family (rows aligned to the table).

    Parameters
    ----------
    turns_df
        Turns table (``conversation_id``, ``turn``, ``new_tokens_<family>``,
        ``output_tokens_<family>``, ``history_tokens_<family>``, optionally ``user_text``).
        Rows may be in any order; "earlier turns" are the rows of the same conversation with a
        smaller ``turn``.
    family
        Tokenizer family (or a model name, mapped to its family).
    use_text
        Add :data:`TEXT_STAT_FEATURES`; default: when the table has ``user_text``.

    Returns
    -------
    pandas.DataFrame
        Columns :data:`NUMERIC_FEATURES` (+ :data:`TEXT_STAT_FEATURES`), float64, index of
        ``turns_df``. Token features are log1p(tokens) on a grid (:func:`log1p_grid`); ``prev_*``
        are 0 at a conversation's first row. A row's own ``output_tokens`` never enters its own
        features.
    """
    family = family_of(family)
    _check_turns(turns_df, [family])
    use_text = _resolve_use_text(turns_df, use_text)
    conv = pd.factorize(turns_df["conversation_id"])[0]
    turn = turns_df["turn"].to_numpy(dtype=np.int64)
    order = np.lexsort((turn, conv))  # by conversation, then turn
    group = conv[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = group[1:] != group[:-1]

    def sorted_log(col: str) -> np.ndarray:
        return log1p_grid(turns_df[col].to_numpy(dtype=float)[order])

    log_out = sorted_log(f"output_tokens_{family}")
    log_new = sorted_log(f"new_tokens_{family}")
    by = pd.Series(log_out).groupby(group, sort=False)
    n_prev = pd.Series(np.ones(len(order))).groupby(group, sort=False).cumsum().to_numpy() - 1
    # Shifted by one row within the conversation: turn k sees only outputs of turns < k.
    prev_last = np.where(first, 0.0, np.roll(log_out, 1))
    prev_sum = by.cumsum().to_numpy() - log_out
    prev_mean = np.where(first, 0.0, prev_sum / np.maximum(n_prev, 1))
    prev_max = by.cummax().groupby(group, sort=False).shift(1).fillna(0.0).to_numpy()
    prev_new = np.where(first, 0.0, np.roll(log_new, 1))
    feats = {
        "log_new_tokens": log_new,
        "log_history_tokens": sorted_log(f"history_tokens_{family}"),
        "log_turn": log1p_grid(turn[order].astype(float)),
        "has_previous": (~first).astype(float),
        "prev_last_log_output": prev_last,
        "prev_mean_log_output": prev_mean,
        "prev_max_log_output": prev_max,
        "prev_log_new_tokens": prev_new,
    }
    if use_text:
        text = turns_df["user_text"].astype("string").fillna("").iloc[order].str
        feats.update({
            "log_chars": log1p_grid(text.len().to_numpy(dtype=float)),
            "log_lines": log1p_grid(text.count("\n").to_numpy(dtype=float)),
            "has_code_fence": text.contains("```", regex=False).to_numpy(dtype=float),
            "question_marks": np.minimum(text.count(r"\?").to_numpy(dtype=float),
                                         _QUESTION_MARK_CAP),
        })
    sorted_frame = pd.DataFrame(feats)
    out = np.empty((len(order), sorted_frame.shape[1]))
    out[order] = sorted_frame.to_numpy()
    return pd.DataFrame(out, index=turns_df.index, columns=sorted_frame.columns)


#: Resolution of :func:`log1p_grid`: 2^-20 in log1p(tokens), a relative 1e-6 of a token count.
LOG_GRID = 2.0 ** -20


def log1p_grid(x: np.ndarray) -> np.ndarray:
    """log1p(x) rounded to a multiple of :data:`LOG_GRID`, the same on every CPU.

    NumPy dispatches log1p by the CPU (SVML on AVX-512, its own kernels elsewhere), and the
    results differ in the last bit. Those bits decided HistGradientBoosting's ties between
    equally good splits: the Mooncake trace's estimates moved by up to 347 tokens in 2,814 of
    12,031 turns between an AVX-512 and an AVX2 machine. On the grid the two agree unless a value
    lies within one ulp (≈ 2^-49) of a rounding boundary, a chance of about 2^-28 per value;
    multiples of 2^-20 also add and subtract exactly, so the ``prev_*`` sums are exact.
    """
    return np.rint(np.log1p(x) / LOG_GRID) * LOG_GRID


def _hashed_text(texts: pd.Series, cfg: OutputLengthConfig) -> sp.csr_matrix:
    """Raw counts of hashed word 1–2-grams of (the head and tail of) each user message."""
    from sklearn.feature_extraction.text import HashingVectorizer

    head, tail = cfg.text_head_chars, cfg.text_tail_chars
    clipped = [
        t if len(t) <= head + tail else t[:head] + "\n" + (t[-tail:] if tail else "")
        for t in texts.astype("string").fillna("").tolist()
    ]
    vectorizer = HashingVectorizer(n_features=cfg.hash_features, ngram_range=(1, 2),
                                   alternate_sign=False, norm=None)
    return vectorizer.transform(clipped).tocsr()


# --------------------------------------------------------------------------------------------
# Cross-fitted estimates


def _to_tokens(log_pred: np.ndarray, cap: int) -> np.ndarray:
    """Predicted log1p(tokens) → integer tokens in [1, cap]."""
    tokens = np.rint(np.expm1(np.clip(log_pred, 0.0, np.log1p(cap))))
    return np.clip(tokens, 1, cap).astype(np.int64)


def _fit_predict(kind: str, cfg: OutputLengthConfig, x_tr: np.ndarray, y_tr: np.ndarray,
                 x_te: np.ndarray, t_tr: sp.csr_matrix | None,
                 t_te: sp.csr_matrix | None) -> np.ndarray:
    """Fit one regressor on a training fold and predict log1p(tokens) of the held-out rows."""
    if kind == "hgb":
        from sklearn.ensemble import HistGradientBoostingRegressor

        reg = HistGradientBoostingRegressor(max_iter=cfg.hgb_max_iter,
                                            learning_rate=cfg.hgb_learning_rate,
                                            early_stopping=False, random_state=0)
        return reg.fit(x_tr, y_tr).predict(x_te)
    from sklearn.linear_model import Ridge
    from sklearn.preprocessing import SplineTransformer

    spline = SplineTransformer(n_knots=cfg.spline_knots, degree=3).fit(x_tr)
    a_tr, a_te = sp.csr_matrix(spline.transform(x_tr)), sp.csr_matrix(spline.transform(x_te))
    if t_tr is not None:
        a_tr, a_te = sp.hstack([t_tr, a_tr]).tocsr(), sp.hstack([t_te, a_te]).tocsr()
    reg = Ridge(alpha=cfg.ridge_alpha, solver="lsqr", tol=cfg.ridge_tol)
    return reg.fit(a_tr, y_tr).predict(a_te)


def estimate_output_tokens(turns_df: pd.DataFrame, n_folds: int = 5, seed: int = 0, *,
                           use_text: bool | None = None,
                           config: OutputLengthConfig | None = None,
                           families: Sequence[str] = TOKENIZER_FAMILIES) -> pd.DataFrame:
    """Cross-fitted output-length estimates of every turn, per tokenizer family (tokens).

    Each row is estimated by a model fitted on the conversations of the other folds
    (:func:`conversation_folds`), from its routing-time features (:func:`routing_features`):
    its own response and every other turn of its conversation stay out of the fit.

    Parameters
    ----------
    turns_df
        Turns table: ``conversation_id``, ``turn`` and, per family, ``new_tokens_<f>``,
        ``output_tokens_<f>``, ``history_tokens_<f>`` (tokens); ``user_text`` optional.
    n_folds
        Conversation folds (≥ 2; at least one conversation per fold).
    seed
        Seed of the fold split; the result is deterministic for a seed.
    use_text
        Use the user message (TF-IDF and counts); default: when the table has ``user_text``.
        False forces the numeric-only path.
    config
        Hyper-parameters; default :class:`OutputLengthConfig`.
    families
        Tokenizer families to estimate (default all three).

    Returns
    -------
    pandas.DataFrame
        One int64 column ``est_output_tokens_<f>`` per family (tokens, in
        [1, ``config.max_output_tokens``]), index of ``turns_df``. ``attrs["output_length"]``
        records ``n_folds``, ``seed``, the resolved ``model``, ``use_text``, the config and the
        wall time (s); :func:`output_length_report` reads the folds from it.

    Raises
    ------
    KeyError
        A required column is missing (or ``use_text=True`` without ``user_text``).
    ValueError
        Bad values (negative or non-integer tokens, duplicate (conversation, turn), missing
        ids), fewer conversations than folds, or ``n_folds`` < 2.
    """
    t0 = time.perf_counter()
    cfg = OutputLengthConfig() if config is None else config
    families = tuple(family_of(f) for f in families)
    if not families:
        raise ValueError("families is empty")
    _check_turns(turns_df, families)
    use_text = _resolve_use_text(turns_df, use_text)
    kind = cfg.resolved_model(use_text)
    folds = conversation_folds(turns_df["conversation_id"], n_folds, seed)

    # A family whose token columns equal an earlier family's (the Mooncake trace has one count
    # for all) gets the same features and targets, hence the same estimates: fit it once.
    same_as: dict[str, str] = {}
    for i, fam in enumerate(families):
        for prev in families[:i]:
            if prev not in same_as and all(
                np.array_equal(turns_df[f"{c}_{fam}"].to_numpy(),
                               turns_df[f"{c}_{prev}"].to_numpy())
                for c in ("new_tokens", "output_tokens", "history_tokens")
            ):
                same_as[fam] = prev
                break
    fitted = [f for f in families if f not in same_as]
    x = {f: routing_features(turns_df, f, use_text=use_text).to_numpy() for f in fitted}
    y = {f: log1p_grid(turns_df[f"output_tokens_{f}"].to_numpy(dtype=float)) for f in fitted}
    hashed = _hashed_text(turns_df["user_text"], cfg) if use_text and kind == "ridge" else None

    pred = {f: np.empty(len(turns_df)) for f in fitted}
    with threadpool_limits(limits=cfg.threads):
        for k in range(n_folds):
            tr, te = folds != k, folds == k
            t_tr = t_te = None
            if hashed is not None:
                from sklearn.feature_extraction.text import TfidfTransformer

                # IDF from the training folds only; shared by the families (same text).
                tfidf = TfidfTransformer(sublinear_tf=True).fit(hashed[tr])
                t_tr, t_te = tfidf.transform(hashed[tr]), tfidf.transform(hashed[te])
            for f in fitted:
                pred[f][te] = _fit_predict(kind, cfg, x[f][tr], y[f][tr], x[f][te], t_tr, t_te)

    est = pd.DataFrame(index=turns_df.index)
    for f in families:
        est[ESTIMATE_PREFIX + f] = _to_tokens(pred[same_as.get(f, f)], cfg.max_output_tokens)
    est.attrs[_ATTRS_KEY] = {
        "n_folds": int(n_folds),
        "seed": int(seed),
        "model": kind,
        "use_text": use_text,
        "config": dataclasses.asdict(cfg),
        "seconds": round(time.perf_counter() - t0, 3),
    }
    return est


# --------------------------------------------------------------------------------------------
# Baselines and report


def baseline_estimates(turns_df: pd.DataFrame, kind: str = "global_median", n_folds: int = 5,
                       seed: int = 0, *,
                       families: Sequence[str] = TOKENIZER_FAMILIES) -> pd.DataFrame:
    """Cross-fitted baseline estimates (tokens), same folds and columns as the estimator's.

    Parameters
    ----------
    kind
        ``"global_median"``: median output tokens of the training folds;
        ``"turn_median"``: median of the training rows with the same turn index (indices ≥
        :data:`TURN_MEDIAN_POOL_FROM` pooled), the global training median where the training
        folds have no row with that index.

    Returns
    -------
    pandas.DataFrame
        ``est_output_tokens_<f>`` per family, int64, rounded and at least 1 token.
    """
    if kind not in PREDICTORS[1:]:
        raise ValueError(f"kind must be one of {PREDICTORS[1:]}, got {kind!r}")
    families = tuple(family_of(f) for f in families)
    _check_turns(turns_df, families)
    folds = conversation_folds(turns_df["conversation_id"], n_folds, seed)
    bucket = np.minimum(turns_df["turn"].to_numpy(dtype=np.int64), TURN_MEDIAN_POOL_FROM)
    est = pd.DataFrame(index=turns_df.index)
    for f in families:
        out = turns_df[f"output_tokens_{f}"].to_numpy(dtype=float)
        value = np.empty(len(out))
        for k in range(n_folds):
            tr, te = folds != k, folds == k
            overall = np.median(out[tr])
            if kind == "global_median":
                value[te] = overall
            else:
                medians = pd.Series(out[tr]).groupby(bucket[tr]).median()
                value[te] = pd.Series(bucket[te]).map(medians).fillna(overall).to_numpy()
        est[ESTIMATE_PREFIX + f] = np.maximum(np.rint(value), 1).astype(np.int64)
    return est


def _metrics(est: np.ndarray, real: np.ndarray) -> dict[str, float]:
    est, real = est.astype(float), real.astype(float)
    err = np.abs(est - real)
    with warnings.catch_warnings():  # a constant predictor has no rank correlation: NaN
        warnings.simplefilter("ignore")
        rho = float(spearmanr(est, real).statistic) if len(est) > 1 else float("nan")
    return {
        "mae_tokens": float(err.mean()),
        "mae_log": float(np.abs(np.log1p(est) - np.log1p(real)).mean()),
        "mdape": float(np.median(err / np.maximum(real, 1.0))),
        "spearman": rho,
        "within_50pct": float((err <= 0.5 * real).mean()),
        "total_ratio": float(est.sum() / real.sum()) if real.sum() > 0 else float("nan"),
    }


def output_length_report(turns_df: pd.DataFrame, estimates: pd.DataFrame, *,
                         n_folds: int | None = None, seed: int | None = None) -> pd.DataFrame:
    """Held-out accuracy of the estimates and of the two baselines, per family.

    Parameters
    ----------
    turns_df
        The table the estimates were made for (realized ``output_tokens_<f>``).
    estimates
        Output of :func:`estimate_output_tokens` (same index); its families are reported.
    n_folds, seed
        The fold split for the baselines; default: read from ``estimates.attrs``.

    Returns
    -------
    pandas.DataFrame
        One row per (family, predictor) with ``predictor`` in :data:`PREDICTORS`, and columns
        ``n_turns``; ``mae_tokens`` (mean |est − real|, tokens); ``mae_log`` (mean
        |log1p est − log1p real|); ``mdape`` (median |est − real| / max(real, 1));
        ``spearman`` (rank correlation; NaN for a constant predictor); ``within_50pct`` (share
        with |est − real| ≤ 0.5·real); ``total_ratio`` (Σ est / Σ real).
    """
    meta = estimates.attrs.get(_ATTRS_KEY, {})
    n_folds = meta.get("n_folds") if n_folds is None else n_folds
    seed = meta.get("seed") if seed is None else seed
    if n_folds is None or seed is None:
        raise ValueError("n_folds and seed are not in estimates.attrs (the frame was not made "
                         "by estimate_output_tokens, or lost its attrs): pass them")
    families = [c[len(ESTIMATE_PREFIX):] for c in estimates.columns
                if c.startswith(ESTIMATE_PREFIX) and c[len(ESTIMATE_PREFIX):] in TOKENIZER_FAMILIES]
    if not families:
        raise KeyError(f"estimates has no {ESTIMATE_PREFIX}<family> column; columns: "
                       f"{list(estimates.columns)}")
    if not estimates.index.equals(turns_df.index):
        raise ValueError("estimates and turns_df have different indexes; estimates must be made "
                         "for this very table")
    est_cols = [ESTIMATE_PREFIX + f for f in families]
    bad = estimates[est_cols].isna().any(axis=1) | (estimates[est_cols] < 1).any(axis=1)
    if bad.any():
        raise ValueError(f"{int(bad.sum())} estimate row(s) are missing or < 1 token, first at "
                         f"index {estimates.index[bad.to_numpy()][0]!r}")
    frames = {
        "estimator": estimates,
        "global_median": baseline_estimates(turns_df, "global_median", n_folds, seed,
                                            families=families),
        "turn_median": baseline_estimates(turns_df, "turn_median", n_folds, seed,
                                          families=families),
    }
    rows = []
    for f in families:
        real = turns_df[f"output_tokens_{f}"].to_numpy()
        for name in PREDICTORS:
            est = frames[name][ESTIMATE_PREFIX + f].to_numpy()
            rows.append({"family": f, "predictor": name, "n_turns": len(real),
                         **_metrics(est, real)})
    return pd.DataFrame(rows)


def compare_models(turns_df: pd.DataFrame, n_folds: int = 5, seed: int = 0,
                   config: OutputLengthConfig | None = None) -> pd.DataFrame:
    """Held-out comparison of the candidate regressors (the table in this module's docstring).

    Runs :func:`estimate_output_tokens` with ``ridge`` and ``hgb``, with and without text (text
    variants only when the table has ``user_text``), and reports each with
    :func:`output_length_report`'s metrics plus the wall time (s).

    Returns
    -------
    pandas.DataFrame
        Columns ``variant``, ``seconds`` and the report's columns; the baselines once each.
    """
    base = OutputLengthConfig() if config is None else config
    text_options = (False, True) if "user_text" in turns_df.columns else (False,)
    parts = []
    for use_text in text_options:
        for kind in ("ridge", "hgb"):
            cfg = dataclasses.replace(base, model=kind)
            est = estimate_output_tokens(turns_df, n_folds, seed, use_text=use_text, config=cfg)
            rep = output_length_report(turns_df, est)
            if parts:
                rep = rep[rep["predictor"] == "estimator"]
            variant = f"{kind}, {'numeric + text' if use_text else 'numeric only'}"
            rep = rep.assign(variant=np.where(rep["predictor"] == "estimator", variant,
                                              rep["predictor"]),
                             seconds=np.where(rep["predictor"] == "estimator",
                                              est.attrs[_ATTRS_KEY]["seconds"], np.nan))
            parts.append(rep)
    out = pd.concat(parts, ignore_index=True)
    return out[["variant", "seconds", *[c for c in out.columns if c not in ("variant", "seconds")]]]
