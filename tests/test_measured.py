"""Measured profiles → the analytical model's quantities, on synthetic measurements whose α, γ
and κ are known by construction."""

from __future__ import annotations

import json

import numpy as np
import pytest

from carbonrouter_lib import measured
from carbonrouter_lib.profiles import MODEL_SPECS


def _doc(alpha=0.9, gamma=0.03, kappa=(40.0, 8.0), scale70=4.0, c0=0.004):
    results = []
    for short, name in measured.MEASUREMENT_MODEL_NAMES.items():
        p = MODEL_SPECS[name].params_b
        e_in = c0 * p ** alpha  # J per token, whole model
        scale = scale70 if name == "Llama-3.1-70B" else 1.0
        base = 128 * e_in  # J of the 128 new tokens
        results.append({
            "model": short, "layer_scale": scale,
            "prefill_J_per_tok": e_in / scale, "prefill_tok_per_s": 1e5 / p * scale,
            "cached": [{"history": h, "J_per_query": (base + gamma * e_in * h) / scale}
                       for h in (0, 1024, 4096, 8192)],
            "decode": [{"batch": b, "J_per_tok": k * e_in / scale, "seq_tok_per_s": 30.0 * scale}
                       for b, k in zip((16, 64), kappa, strict=True)],
        })
    return {"meta": {"device": "test"}, "results": results}


def test_summary_recovers_alpha_gamma_kappa_and_undoes_the_layer_scale(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps(_doc()))
    s = measured.measured_summary(measured.load_measurement(path)).set_index("model")
    np.testing.assert_allclose(s["gamma"], 0.03, rtol=1e-9)
    np.testing.assert_allclose(s["kappa_b16"], 40.0, rtol=1e-12)
    np.testing.assert_allclose(s["kappa_b64"], 8.0, rtol=1e-12)
    big = s.loc["Llama-3.1-70B"]
    assert big["e_in_j"] == pytest.approx(0.004 * 70 ** 0.9)  # × layer_scale back
    assert big["prefill_tok_s"] == pytest.approx(1e5 / 70)  # ÷ layer_scale back
    assert big["relative_energy"] == 1.0
    alpha, r2 = measured.fit_alpha(s.reset_index())
    assert alpha == pytest.approx(0.9) and r2 == pytest.approx(1.0)
    cal = measured.calibration(s.reset_index(), batch=64)
    assert cal == pytest.approx({"alpha": 0.9, "gamma": 0.03, "kappa": 8.0})
    with pytest.raises(KeyError, match="batch 1"):
        measured.calibration(s.reset_index(), batch=1)


def test_bad_measurements_name_the_file_and_the_entry(tmp_path):
    doc = _doc()
    doc["results"][2]["model"] = "gpt-9"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"results\[2\].*gpt-9"):
        measured.measured_summary(measured.load_measurement(path))
    (tmp_path / "empty.json").write_text("{}")
    with pytest.raises(ValueError, match="empty.json"):
        measured.load_measurement(tmp_path / "empty.json")


def test_the_mirror_measurement_is_read_and_verified():
    s = measured.measured_summary(measured.load_measurement())
    assert list(s["model"]) == list(MODEL_SPECS)
    assert (s["e_in_j"] > 0).all() and s["e_in_j"].is_monotonic_increasing  # bigger costs more
