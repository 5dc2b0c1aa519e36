"""Tests of carbonrouter_lib.r2router: R2-Router's released heads behind the QualityPredictor
interface."""

from __future__ import annotations

import joblib
import numpy as np
import pytest

from carbonrouter_lib.datasets import fetch
from carbonrouter_lib.profiles import MODELS
from carbonrouter_lib.r2router import R2ROUTER_NAMES, R2RouterPredictor

R2_DIRS = {
    "Gemma-3-1B": "gemma-3-1b-it_ridge_alpha10.0",
    "Llama-3.2-3B": "Llama-3.2-3B-Instruct_ridge_alpha10.0",
    "Gemma-3-4B": "gemma-3-4b-it_ridge_alpha10.0",
    "Mistral-7B-v0.2": "Mistral-7B-Instruct-v0.2_ridge_alpha10.0",
    "Llama-3.1-70B": "Llama-3.1-70B-Instruct_ridge_alpha10.0",
}


@pytest.fixture(scope="module")
def r2_embedding():
    emb = np.random.default_rng(3).normal(0, 1, size=(6, 1024))
    seen: list[list[str]] = []

    def embed(texts):
        seen.append(list(texts))
        return emb[: len(texts)]

    return emb, embed, seen


def test_r2router_matches_sklearn(r2_embedding):
    emb, embed, seen = r2_embedding
    r2 = R2RouterPredictor(embed)
    q = r2.predict([f"q{i}" for i in range(6)])
    tokens = r2.predict_output_tokens([f"q{i}" for i in range(6)])
    for m, model in enumerate(MODELS):
        head = joblib.load(fetch(f"quality/r2router/{R2_DIRS[model]}/"
                                 f"unlimited_score_predictor.joblib"))
        np.testing.assert_array_equal(q[:, m], np.clip(head.predict(emb), 0, 1))
        # Independently: a Ridge head is an affine map.
        np.testing.assert_allclose(q[:, m], np.clip(emb @ head.coef_ + head.intercept_, 0, 1),
                                   atol=1e-5)
        tok = joblib.load(fetch(f"quality/r2router/{R2_DIRS[model]}/"
                                f"unlimited_token_predictor.joblib"))
        np.testing.assert_array_equal(tokens[:, m], np.maximum(tok.predict(emb), 0))
    assert ((q >= 0) & (q <= 1)).all() and q.shape == (6, 5)
    # Context is prepended to the query for the embedding.
    r2.predict(["q"], ["ctx"])
    assert seen[-1] == ["ctx\n\nq"]


def test_r2router_errors(r2_embedding):
    with pytest.raises(RuntimeError, match=r"Qwen/Qwen3-0\.6B.*embed_fn="):
        R2RouterPredictor(None).predict(["hello"])
    with pytest.raises(ValueError, match=r"shape \(1, 512\).*\(1, 1024\)"):
        R2RouterPredictor(lambda t: np.zeros((len(t), 512))).predict(["hello"])
    with pytest.raises(ValueError, match="shape"):
        R2RouterPredictor(lambda t: np.zeros((len(t) + 1, 1024))).predict(["hello"])
    with pytest.raises(ValueError, match="non-finite"):
        R2RouterPredictor(lambda t: np.full((len(t), 1024), np.nan)).predict(["hello"])


def test_r2router_names_cover_the_models():
    assert tuple(R2ROUTER_NAMES) == MODELS
    assert all(R2_DIRS[m].startswith(R2ROUTER_NAMES[m] + "_") for m in MODELS)
