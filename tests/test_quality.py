"""Tests of carbonrouter_lib.quality: the quality constraint, calibration, the offline predictor."""

from __future__ import annotations

import json
import math
import warnings

import joblib
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from carbonrouter_lib.datasets import fetch
from carbonrouter_lib.profiles import MODELS
from carbonrouter_lib.quality import (
    DEFAULT_TARGETS,
    PROXY_MAP,
    OfflineQualityPredictor,
    QualityConfig,
    calibrate_offsets,
    calibration_evidence,
    derive_calibration_targets,
    feasible_models,
    fit_offline_predictor,
    load_dcrouter,
    load_offline_predictor,
    quality_summary,
    score_turns,
    turn_contexts,
)
from carbonrouter_lib.quality import _parse_scores as parse_scores

TEXTS = [
    "Write a python function that reverses a linked list.",
    "What is the capital of France?",
    "Explain the difference between TCP and UDP in simple terms.",
    "Prove that the square root of 2 is irrational.",
    "",
]


# --------------------------------------------------------------------------------------------
# The quality constraint (Eq. 7) on hand-made Q


def test_feasible_inclusive_bound_and_beta_one():
    q = np.array([
        [0.50, 0.85 * 0.50, 0.4249, 0.10, 0.50],  # exactly on the bound: feasible
        [0.00, 0.00, 0.00, 0.00, 0.00],  # all equal (zero): all feasible
        [0.20, 0.90, 0.30, 0.77, 0.76],
    ])
    f = feasible_models(q, beta=0.85)
    assert f.tolist() == [
        [True, True, False, False, True],
        [True, True, True, True, True],
        [False, True, False, True, False],  # 0.85 * 0.9 = 0.765: 0.77 in, 0.76 out
    ]
    # β = 1: only the best model(s) of each query
    assert feasible_models(q, beta=1.0).tolist() == [
        [True, False, False, False, True],
        [True] * 5,
        [False, True, False, False, False],
    ]


@settings(max_examples=200, deadline=None)
@given(
    q=arrays(np.float64, st.tuples(st.integers(1, 6), st.just(5)),
             elements=st.floats(0, 1, allow_nan=False)),
    b1=st.floats(0.01, 1.0),
    b2=st.floats(0.01, 1.0),
)
def test_feasible_never_empty_and_monotone(q, b1, b2):
    lo, hi = sorted((b1, b2))
    f_lo, f_hi = feasible_models(q, lo), feasible_models(q, hi)
    assert f_hi.any(axis=1).all()  # never empty
    assert f_hi[np.arange(len(q)), q.argmax(axis=1)].all()  # the best is always feasible
    assert not (f_hi & ~f_lo).any()  # a lower β keeps every model a higher β keeps


@pytest.mark.parametrize("beta", [0.0, -0.1, 1.01, float("nan")])
def test_feasible_rejects_bad_beta(beta):
    with pytest.raises(ValueError, match="beta"):
        feasible_models(np.full((1, 5), 0.5), beta)


@pytest.mark.parametrize(
    "q, match",
    [(np.array([0.5, 0.4]), "2-D"), (np.array([[0.5, 1.2]]), r"\[0, 1\]"),
     (np.array([[0.5, np.nan]]), "non-finite")],
)
def test_feasible_rejects_bad_q(q, match):
    with pytest.raises(ValueError, match=match):
        feasible_models(q)


def test_quality_summary_by_hand():
    models = ("a", "b", "c")
    q = np.array([
        [0.9, 0.8, 0.1],  # best a; feasible at 0.85: a, b (0.8 >= 0.765); at 0.9: a only
        [0.5, 0.5, 0.2],  # tie a/b: 1/2 each; feasible a, b at both β
        [0.1, 0.2, 0.6],  # best c; only c
        [0.3, 0.6, 0.55],  # best b; at 0.85 (0.51): b, c; at 0.9 (0.54): b, c
    ])
    s = quality_summary(q, betas=(0.85, 0.9), models=models)
    assert list(s.columns) == ["mean_quality", "share_best", "share_feasible_0.85",
                               "share_feasible_0.9"]
    np.testing.assert_allclose(s["mean_quality"], [1.8 / 4, 2.1 / 4, 1.45 / 4])
    np.testing.assert_allclose(s["share_best"], [1.5 / 4, 1.5 / 4, 1 / 4])
    np.testing.assert_allclose(s["share_feasible_0.85"], [2 / 4, 3 / 4, 2 / 4])
    np.testing.assert_allclose(s["share_feasible_0.9"], [2 / 4, 2 / 4, 2 / 4])
    assert math.isclose(s["share_best"].sum(), 1.0)


def test_quality_summary_rejects_mismatch_and_empty():
    with pytest.raises(ValueError, match="columns"):
        quality_summary(np.full((2, 3), 0.5))
    with pytest.raises(ValueError, match="no rows"):
        quality_summary(np.zeros((0, 5)))


# --------------------------------------------------------------------------------------------
# Calibration


def test_calibration_hits_targets_on_synthetic_signal():
    rng = np.random.default_rng(7)
    # Wide signals so that clipping at 0 and 1 is active for many rows.
    signal = rng.normal(0.0, [0.05, 0.3, 0.6, 0.2, 1.0], size=(4000, 5))
    targets = [0.1, 0.3, 0.5, 0.7, 0.9]
    scale = [1.0, 2.0, 1.0, 0.5, 1.0]
    a = calibrate_offsets(signal, targets, scale)
    q = np.clip(a + signal * np.asarray(scale), 0, 1)
    np.testing.assert_allclose(q.mean(axis=0), targets, atol=1e-9)
    assert ((q == 0) | (q == 1)).mean() > 0.05  # clipping did happen
    # Per-query variation is kept: inside (0, 1), Q - a = scale * signal exactly.
    inside = (q > 0) & (q < 1)
    np.testing.assert_allclose((q - a)[inside], (signal * np.asarray(scale))[inside])
    # Weights: only the first half counts.
    w = np.r_[np.ones(2000), np.zeros(2000)]
    a_w = calibrate_offsets(signal, targets, scale, weights=w)
    q_w = np.clip(a_w + signal[:2000] * np.asarray(scale), 0, 1)
    np.testing.assert_allclose(q_w.mean(axis=0), targets, atol=1e-9)
    # Scale 0: every query gets the target.
    np.testing.assert_allclose(calibrate_offsets(signal, targets, [0.0] * 5), targets)


def test_calibration_rejects_bad_input():
    s = np.zeros((3, 2))
    with pytest.raises(ValueError, match="targets"):
        calibrate_offsets(s, [0.5, 1.0])
    with pytest.raises(ValueError, match="scale"):
        calibrate_offsets(s, [0.5, 0.5], [1.0, -1.0])
    with pytest.raises(ValueError, match="weights"):
        calibrate_offsets(s, [0.5, 0.5], weights=np.zeros(3))


def test_targets_recomputed_from_the_raw_files():
    """DEFAULT_TARGETS = the documented chain, recomputed here straight from the JSON files."""

    def dc_mean(model: str) -> float:
        vals = []
        for split in ("train", "test"):
            recs = json.loads(fetch(f"quality/dcrouter/dcrouter_{split}.json").read_text())
            vals += [r["scores"][model] for r in recs]
        return float(np.mean(vals))

    def ae_winrate(model: str) -> float:
        recs = json.loads(fetch(
            f"quality/alpaca_eval/{model}.weighted_alpaca_eval_gpt4_turbo.annotations.json"
        ).read_text())
        return float(np.mean([r["preference"] - 1 for r in recs]))

    wr = {s: ae_winrate(f"FuseChat-Llama-3.{v}-{s}B-Instruct")
          for s, v in ((1, "2"), (3, "2"), (8, "1"))}
    base = dc_mean("llama-3.1-8b-instruct")
    r4 = wr[3] / wr[8] + (1 - wr[3] / wr[8]) * math.log(4 / 3) / math.log(8 / 3)
    expected = {
        "Gemma-3-1B": base * wr[1] / wr[8],
        "Llama-3.2-3B": base * wr[3] / wr[8],
        "Gemma-3-4B": base * r4,
        "Mistral-7B-v0.2": dc_mean("mistral-7b-instruct-v0.3"),
        "Llama-3.1-70B": dc_mean("llama-3.1-nemotron-51b-instruct"),
    }
    derived = derive_calibration_targets()
    for m in MODELS:
        assert derived[m] == pytest.approx(expected[m], abs=1e-12)
    np.testing.assert_allclose(DEFAULT_TARGETS, [expected[m] for m in MODELS], atol=5e-4)
    # The sanity requirement's ordering holds for the targets themselves.
    assert max(derived, key=derived.get) == "Llama-3.1-70B"
    assert min(derived, key=derived.get) == "Gemma-3-1B"


def test_evidence_shows_raw_proxies_would_misorder():
    """Why calibration: raw, the 1B proxy out-wins both Llama-2-70B proxies on AlpacaEval."""
    ev = calibration_evidence().set_index(["source", "judged_model"])["mean"]
    one_b = ev[("alpaca_eval", "FuseChat-Llama-3.2-1B-Instruct")]
    for j in PROXY_MAP["Llama-3.1-70B"]["alpaca_eval"]:
        assert ev[("alpaca_eval", j)] < one_b


def test_config_validation():
    with pytest.raises(ValueError, match="targets"):
        QualityConfig(targets=(0.5,) * 4)
    with pytest.raises(ValueError, match="source_weights"):
        QualityConfig(source_weights=(0.7, 0.7))
    with pytest.raises(ValueError, match="signal_scale"):
        QualityConfig(signal_scale=(1, 1, 1, 1, -1))
    with pytest.raises(ValueError, match="unknown models"):
        QualityConfig().with_targets({"GPT-5": 0.9})
    cfg = QualityConfig().with_targets({"Gemma-3-1B": 0.2})
    assert cfg.targets == (0.2, *DEFAULT_TARGETS[1:])


def test_parse_scores_is_safe():
    assert parse_scores("{'m': 0.5, 'n': 1}", "x") == {"m": 0.5, "n": 1.0}
    assert parse_scores('{"m": 0.25}', "x") == {"m": 0.25}
    with pytest.raises(ValueError, match="not a dict literal"):
        parse_scores("__import__('os').system('true')", "rec 3")
    with pytest.raises(ValueError, match=r"rec 4: score of 'm' must be in \[0, 1\]"):
        parse_scores({"m": 1.5}, "rec 4")


def test_dcrouter_overlap_counted():
    dc = load_dcrouter()
    assert (dc["split"] == "train").sum() == 5608 and (dc["split"] == "test").sum() == 500
    assert int(dc["in_train"].sum()) == 119


# --------------------------------------------------------------------------------------------
# The offline predictor


@pytest.fixture(scope="module")
def predictor() -> OfflineQualityPredictor:
    return load_offline_predictor()


def test_offline_interface(predictor):
    q = predictor.predict(TEXTS)
    assert q.shape == (len(TEXTS), len(MODELS)) and q.dtype == np.float64
    assert (q >= 0).all() and (q <= 1).all()
    assert np.array_equal(q, predictor.predict(TEXTS))  # deterministic
    assert np.array_equal(q[1:3], predictor.predict(TEXTS[1:3]))  # row-independent
    assert predictor.predict([]).shape == (0, len(MODELS))
    # An empty context is no context; a real one changes the query's features.
    assert np.array_equal(q, predictor.predict(TEXTS, [""] * len(TEXTS)))
    ctx = predictor.predict(TEXTS[:1], ["We were discussing cooking recipes and wine."])
    assert not np.array_equal(ctx, q[:1])
    with pytest.raises(TypeError, match="sequence of strings"):
        predictor.predict("a single string")
    with pytest.raises(ValueError, match="contexts has 1 entries"):
        predictor.predict(TEXTS, ["x"])


def test_offline_reference_means_equal_targets(predictor):
    np.testing.assert_allclose(predictor.reference_means, predictor.config.targets, atol=1e-9)


def test_fit_is_deterministic_and_cache_round_trip_is_identical(predictor, tmp_path):
    fresh = fit_offline_predictor()
    assert np.array_equal(fresh.predict(TEXTS), predictor.predict(TEXTS))
    joblib.dump(fresh, tmp_path / "p.joblib")
    again = joblib.load(tmp_path / "p.joblib")
    assert np.array_equal(again.predict(TEXTS), fresh.predict(TEXTS))
    assert np.array_equal(load_offline_predictor().predict(TEXTS), predictor.predict(TEXTS))


def test_recalibrated_hits_targets_on_new_queries(predictor):
    new = predictor.recalibrated(TEXTS * 3, targets={"Gemma-3-1B": 0.3})
    means = new.predict(TEXTS * 3).mean(axis=0)
    expected = (0.3, *predictor.config.targets[1:])
    np.testing.assert_allclose(means, expected, atol=1e-9)


# --------------------------------------------------------------------------------------------
# Scoring turns (ShareGPT)


def _turns() -> pd.DataFrame:
    return pd.DataFrame({
        "conversation_id": ["c1", "c1", "c1", "c2"],
        "turn": [0, 1, 2, 0],
        "user_text": ["u0", "u1", "write a sorting function in C", "hello"],
        "assistant_text": ["a0", "a1", "a2", "hi"],
    })


def test_turn_contexts():
    df = _turns()
    assert turn_contexts(df, 0) == (["", "", "", ""], 0)
    assert turn_contexts(df, 1) == (["", "u0\na0", "u1\na1", ""], 0)
    assert turn_contexts(df, 2)[0][2] == "u0\na0\n\nu1\na1"
    # Rows out of order give the same contexts per row.
    shuffled = df.iloc[[2, 3, 0, 1]]
    assert turn_contexts(shuffled, 1)[0] == ["u1\na1", "", "", "u0\na0"]
    with pytest.warns(UserWarning, match="1 earlier turns"):
        assert turn_contexts(df.iloc[[0, 2]], 1) == (["", ""], 1)
    with pytest.raises(ValueError, match="turn 1 twice"):
        turn_contexts(pd.concat([df, df.iloc[[1]]]), 1)


def test_score_turns_uses_context_and_batches(predictor):
    df = _turns()
    q = score_turns(df, predictor, context_turns=1, batch_size=3)
    expected = predictor.predict(df["user_text"].tolist(), ["", "u0\na0", "u1\na1", ""])
    assert np.array_equal(q, expected)
    assert np.array_equal(q, score_turns(df, predictor, context_turns=1, batch_size=1000))
    assert np.array_equal(score_turns(df, predictor, context_turns=0),
                          predictor.predict(df["user_text"].tolist()))


def test_score_turns_in_processes_equals_one_process(predictor):
    """Batches scored by two worker processes give exactly the one-process result, rows in
    place (the chunks interleave the batches)."""
    base = _turns()
    df = pd.concat([base.assign(conversation_id=f"{i}-" + base["conversation_id"].astype(str))
                    for i in range(5)], ignore_index=True)
    one = score_turns(df, predictor, context_turns=1, batch_size=3, n_jobs=1)
    assert np.array_equal(score_turns(df, predictor, context_turns=1, batch_size=3, n_jobs=2), one)
    with pytest.raises(ValueError, match="n_jobs"):
        score_turns(df, predictor, n_jobs=0)


def test_sharegpt_ordering_sanity(predictor):
    """docs/model.md §8 (sanity requirement): mean predicted quality orders Llama-3.1-70B highest
    and Gemma-3-1B lowest."""
    from carbonrouter_lib.sharegpt import load_sharegpt_turns

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        df, _ = load_sharegpt_turns(max_conversations=300, progress=False)
    q = score_turns(df, predictor, context_turns=1)
    s = quality_summary(q)
    assert s["mean_quality"].idxmax() == "Llama-3.1-70B"
    assert s["mean_quality"].idxmin() == "Gemma-3-1B"
    assert s.loc["Llama-3.1-70B", "share_best"] > 0.9
    assert (s["share_feasible_0.85"] <= s["share_feasible_0.8"]).all()
    assert feasible_models(q, 0.85).any(axis=1).all()


def test_the_featurizer_vocabulary_breaks_count_ties_by_the_term():
    # scikit-learn's max_features picks among equal counts by NumPy's unstable, CPU-dispatched
    # argsort; the featurizer's vocabulary is the highest counts, ties by the term, whatever the
    # order of the texts, with scikit-learn's column order (alphabetical)
    from sklearn.feature_extraction.text import TfidfVectorizer

    from carbonrouter_lib.quality import _with_stable_vocabulary

    texts = ["apple apple kiwi fig", "apple date cherry", "banana grape fig"]
    # counts: apple 3; fig 2; banana, cherry, date, grape, kiwi 1 each
    for order in (texts, texts[::-1]):
        vec = _with_stable_vocabulary(TfidfVectorizer(max_features=4), order)
        vec.fit(order)
        assert vec.vocabulary_ == {"apple": 0, "banana": 1, "cherry": 2, "fig": 3}
    assert _with_stable_vocabulary(TfidfVectorizer(), texts).get_params()["vocabulary"] is None
