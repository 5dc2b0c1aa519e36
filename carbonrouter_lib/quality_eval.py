"""How well the offline quality predictor's regressors rank held-out judgments.

:func:`heldout_accuracy` refits the featurizer and every judged model's head of
:class:`carbonrouter_lib.quality.OfflineQualityPredictor` without the evaluated questions and
scores them, beside a mean-only and a length-only baseline (notebook 00). Its table is cached
(:mod:`carbonrouter_lib.cache`) under the predictor's parameters (training files, config,
scikit-learn version) and the code of this module and all it imports.

Held-out accuracy (:func:`heldout_accuracy`, seed 0)
----------------------------------------------------
DCRouter heads rank held-out questions well (Spearman 0.30–0.59, AUC 0.65–0.83; length-only
baseline 0.02–0.30); AlpacaEval heads only weakly (Spearman 0.01–0.19): a GPT-4-turbo preference
depends mostly on the answer, not on the instruction. Most per-query variation of Q therefore
comes from the DCRouter heads (what makes a question hard), most of each model's level from the
calibration.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from carbonrouter_lib.profiles import MODELS
from carbonrouter_lib.quality import (
    PROXY_MAP,
    SOURCES,
    QualityConfig,
    _cache_entry,
    _dc_models,
    _fit_featurizer_and_bank,
    _length_features,
    load_alpaca_eval,
    load_dcrouter,
)

__all__ = ["heldout_accuracy"]


def _spearman(pred: np.ndarray, y: np.ndarray) -> float:
    from scipy.stats import spearmanr

    if np.ptp(pred) == 0 or np.ptp(y) == 0:
        return 0.0  # a constant ranks nothing
    return float(spearmanr(pred, y).statistic)


def _auc(pred: np.ndarray, positive: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    if positive.all() or not positive.any():
        return float("nan")
    return float(roc_auc_score(positive, pred))


def heldout_accuracy(config: QualityConfig | None = None, use_cache: bool = True) -> pd.DataFrame:
    """Held-out accuracy of every judged model's head, next to two baselines.

    Splits: AlpacaEval by instruction, ``config.heldout_folds``-fold (seed ``config.seed``),
    out-of-fold predictions pooled; DCRouter the released train/test split, the 119 test questions
    also in train left out. Each fold refits the featurizer on its training texts only. Baselines:
    *mean-only* (the training mean: Spearman 0 and AUC 0.5 by construction, RMSE reported) and
    *length-only* (Ridge on the six shape features).

    Returns
    -------
    pandas.DataFrame
        One row per judged model: ``source``, ``judged_model``, ``used_for``, ``n_eval``,
        ``n_left_out`` (test questions also in train), ``mean_label``, ``spearman``,
        ``spearman_length``, ``auc`` and ``auc_length`` (AUC of "beats the reference", i.e.
        preference − 1 > 0.5, for AlpacaEval; of "score ≥ 0.5" for DCRouter), ``auc_mean_only``
        (0.5), ``rmse``, ``rmse_mean_only``, ``rmse_length``. Cached as parquet.
    """
    config = QualityConfig() if config is None else config
    entry = _cache_entry(config, "heldout", "parquet", module=__name__)
    if use_cache and (hit := entry.load()) is not None:
        return hit[0]
    from sklearn.linear_model import Ridge
    from sklearn.model_selection import KFold

    alpaca, dcrouter = load_alpaca_eval(), load_dcrouter()
    instructions = np.array(sorted(alpaca["instruction"].unique()), dtype=object)
    folds = KFold(config.heldout_folds, shuffle=True, random_state=config.seed)
    dc_train = dcrouter[dcrouter["split"] == "train"]
    dc_test_all = dcrouter[dcrouter["split"] == "test"]
    dc_test = dc_test_all[~dc_test_all["in_train"]]
    n_left_out = int(dc_test_all["in_train"].sum())
    oof: dict[str, pd.Series] = {}
    oof_len: dict[str, pd.Series] = {}
    means_by_fold: dict[str, pd.Series] = {}
    dc_pred = dc_len = None
    for k, (tr_idx, _) in enumerate(folds.split(instructions)):
        train_inst = set(instructions[tr_idx])
        ae_tr = alpaca[alpaca["instruction"].isin(train_inst)]
        ae_te = alpaca[~alpaca["instruction"].isin(train_inst)]
        # The featurizer always sees the DCRouter train texts (as the final model does); the
        # DCRouter heads are fitted once, their split being fixed.
        featurizer, bank, _ = _fit_featurizer_and_bank(config, ae_tr, dc_train,
                                                       dcrouter_heads=(k == 0))
        for j, g in ae_te.groupby("judged_model"):
            col = bank.keys.index(("alpaca_eval", j))
            x = featurizer.transform(g["instruction"].tolist())
            pred = bank.predict(x)[:, col]
            oof[j] = pd.concat([oof.get(j, pd.Series(dtype=float)),
                                pd.Series(pred, index=g.index)])
            tr_j = ae_tr[ae_tr["judged_model"] == j]
            lr = Ridge(alpha=1.0).fit(_length_features(tr_j["instruction"].tolist()),
                                      tr_j["target"])
            oof_len[j] = pd.concat([oof_len.get(j, pd.Series(dtype=float)), pd.Series(
                lr.predict(_length_features(g["instruction"].tolist())), index=g.index)])
            means_by_fold[j] = pd.concat([means_by_fold.get(j, pd.Series(dtype=float)),
                                          pd.Series(tr_j["target"].mean(), index=g.index)])
        if k == 0:
            x = featurizer.transform(dc_test["question"].tolist())
            cols = [bank.keys.index(("dcrouter", j)) for j in _dc_models(dcrouter)]
            dc_pred = bank.predict(x)[:, cols]
            shape_tr = _length_features(dc_train["question"].tolist())
            shape_te = _length_features(dc_test["question"].tolist())
            dc_len = np.column_stack([
                Ridge(alpha=1.0).fit(shape_tr, dc_train[j]).predict(shape_te)
                for j in _dc_models(dcrouter)
            ])
    users = {(s, j): ", ".join(m for m in MODELS if j in PROXY_MAP[m].get(s, ()))
             for s in SOURCES for j in set(alpaca["judged_model"]) | set(_dc_models(dcrouter))}
    rows = []

    def row(src, j, y, pred, pred_len, mean_only, positive, n_out):
        rmse = lambda p: float(np.sqrt(np.mean((p - y) ** 2)))  # noqa: E731
        return {
            "source": src, "judged_model": j, "used_for": users[(src, j)],
            "n_eval": len(y), "n_left_out": n_out, "mean_label": float(np.mean(y)),
            "spearman": _spearman(pred, y), "spearman_length": _spearman(pred_len, y),
            "auc": _auc(pred, positive), "auc_length": _auc(pred_len, positive),
            "auc_mean_only": 0.5,
            "rmse": rmse(pred), "rmse_mean_only": rmse(mean_only), "rmse_length": rmse(pred_len),
        }

    for j in sorted(oof):
        idx = oof[j].index
        y = alpaca.loc[idx, "target"].to_numpy()
        rows.append(row("alpaca_eval", j, y, oof[j].to_numpy(), oof_len[j].loc[idx].to_numpy(),
                        means_by_fold[j].loc[idx].to_numpy(), y > 0.5, 0))
    for c, j in enumerate(_dc_models(dcrouter)):
        y = dc_test[j].to_numpy()
        rows.append(row("dcrouter", j, y, dc_pred[:, c], dc_len[:, c],
                        np.full(len(y), dc_train[j].mean()), y >= 0.5, n_left_out))
    out = pd.DataFrame(rows)
    if use_cache:
        entry.save(out)
    return out
