"""Tests of carbonrouter_lib.quality_eval: held-out accuracy of the offline predictor's heads."""

from __future__ import annotations

from carbonrouter_lib.profiles import MODELS
from carbonrouter_lib.quality import PROXY_MAP
from carbonrouter_lib.quality_eval import heldout_accuracy


def test_heldout_accuracy_is_sane():
    """Real data, seed 0: what is true of the table (see the module doc for the splits)."""
    h = heldout_accuracy().set_index(["source", "judged_model"])
    dc = h.loc["dcrouter"]
    ae = h.loc["alpaca_eval"]
    assert (dc["n_eval"] == 381).all() and (dc["n_left_out"] == 119).all()
    assert (ae["n_eval"] >= 803).all()
    # DCRouter (graded benchmark scores): every head ranks questions well above both baselines.
    assert (dc["spearman"] > 0.25).all()
    assert (dc["spearman"] > dc["spearman_length"]).all()
    assert (dc["auc"] > 0.6).all()
    assert (dc["rmse"] < dc["rmse_mean_only"]).all()
    # AlpacaEval (GPT-4-turbo preference): weak but positive signal for every head used, i.e.
    # better than the mean-only baseline (Spearman 0, AUC 0.5) ...
    used = [j for m in MODELS for j in PROXY_MAP[m]["alpaca_eval"]]
    assert (ae.loc[used, "spearman"] > 0).all()
    assert (ae.loc[used, "auc"] > 0.5).all()
    # ... and better than length alone except for gemma-2b-it and humpback-llama2-70b.
    beats_length = ae.loc[used, "spearman"] > ae.loc[used, "spearman_length"]
    assert set(beats_length[~beats_length].index) == {"gemma-2b-it", "humpback-llama2-70b"}
