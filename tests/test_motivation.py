"""Section-2 analysis: history shares and the cost of a cache miss, against hand computations."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from carbonrouter_lib import motivation, profiles


def _turns() -> pd.DataFrame:
    # Conversations a (3 turns) and b (2): history = cumulative new + output of earlier turns.
    rows = [
        ("a", 0, 100, 1000, 0),
        ("a", 1, 200, 3000, 1100),
        ("a", 2, 300, 500, 4300),
        ("b", 0, 50, 8000, 0),
        ("b", 1, 60, 10, 8050),
    ]
    df = pd.DataFrame(rows, columns=["conversation_id", "turn", "new", "out", "hist"])
    return pd.DataFrame({
        "conversation_id": df["conversation_id"],
        "turn": df["turn"],
        "new_tokens_mistral": df["new"],
        "output_tokens_mistral": df["out"],
        "history_tokens_mistral": df["hist"],
    })


def _mistral_a100() -> pd.Series:
    table = profiles.analytical_profiles().set_index(["model", "gpu"])
    return table.loc[("Mistral-7B-v0.2", "A100")]


def test_miss_penalty_matches_eq4_by_hand():
    prof = _mistral_a100()
    pen = motivation.miss_penalty(_turns(), prof, "mistral")
    assert len(pen) == 3 and pen.attrs["first_turns"] == 2 and pen.attrs["dropped_context"] == 0
    e_in, gamma, kappa = prof["e_in_kwh"], 0.05, 6.0
    # turn a/1: new 200, hist 1100, out 3000
    hit = e_in * (200 + gamma * 1100 + kappa * 3000)
    miss = e_in * (200 + 1100 + kappa * 3000)
    assert pen.loc[0, "extra_carbon_pct"] == pytest.approx(100 * (miss - hit) / hit)
    assert pen.loc[0, "extra_prefill_s"] == pytest.approx(1100 / prof["prefill_tok_s"])
    # Longer history and short output → larger relative penalty.
    assert pen.loc[2, "extra_carbon_pct"] > pen.loc[0, "extra_carbon_pct"]


def test_miss_penalty_drops_queries_beyond_the_context_window():
    turns = _turns()
    turns.loc[4, "history_tokens_mistral"] = 40_000
    prof = _mistral_a100()
    pen = motivation.miss_penalty(turns, prof, "mistral")
    assert pen.attrs["dropped_context"] == 1 and len(pen) == 2


def test_bucket_summary_medians_and_empty_buckets():
    pen = pd.DataFrame({
        "history_tokens": [100, 500, 900, 3000, 3500, 5000],
        "extra_carbon_pct": [1.0, 2.0, 3.0, 10.0, 20.0, 50.0],
        "extra_prefill_s": [0.1, 0.2, 0.3, 1.0, 2.0, 5.0],
    })
    s = motivation.bucket_summary(pen).set_index("bucket")
    assert s.loc["0–1K", "n_queries"] == 3 and s.loc["0–1K", "extra_carbon_pct_median"] == 2.0
    assert s.loc["2K–4K", "extra_carbon_pct_median"] == 15.0
    assert s.loc["1K–2K", "n_queries"] == 0 and np.isnan(s.loc["1K–2K", "extra_carbon_pct_median"])
    assert s["n_queries"].sum() == len(pen)


def test_sample_sessions_is_seeded_and_whole():
    turns = _turns()
    a = motivation.sample_sessions(turns, 1, seed=3)
    b = motivation.sample_sessions(turns, 1, seed=3)
    pd.testing.assert_frame_equal(a, b)
    assert a["conversation_id"].nunique() == 1
    assert len(a) == (turns["conversation_id"] == a["conversation_id"].iloc[0]).sum()
    with pytest.raises(ValueError, match="n_sessions=3"):
        motivation.sample_sessions(turns, 3, seed=0)
