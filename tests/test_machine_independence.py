"""The derived workload does not depend on the machine's floating-point kernels.

NumPy and OpenBLAS pick SIMD kernels at run time by the CPU (AVX-512, AVX2, …), which changes the
rounding of sums, dot products and functions such as log1p. The fitted estimators of the prepared
workload — the output lengths (a Ridge regression solved by LSQR on ShareGPT, gradient boosting on
the Mooncake trace) and the quality scores (Ridge) — must give the same answers on another
machine, or every replay moves with it (it did: 1–2% in CO2 with LSQR stopped at 1e-3 / 1e-4,
when these estimates moved by up to 77 tokens and 6e-4; on the Mooncake trace, log1p's last bits
flipped the boosting's split ties and moved estimates by up to 347 tokens). Each test fits once
here and once in a child process with the wider kernels switched off
(``NPY_DISABLE_CPU_FEATURES``, ``OPENBLAS_CORETYPE``) and compares.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
TEXTS = ["Write a Python function that merges two sorted lists.",
         "What is the capital of Australia?",
         "Prove that the square root of 2 is irrational, step by step.",
         "Translate 'good morning' into French and German.",
         "Summarize the plot of Hamlet in three sentences."]

CHILD = """
import json, sys
import numpy as np
from numpy._core import _multiarray_umath as umath
still = [t for t in umath.__cpu_dispatch__ if umath.__cpu_features__.get(t)]
assert not still, f"NumPy kernels not switched off: {still}"
from carbonrouter_lib import output_length
from carbonrouter_lib.quality import fit_offline_predictor
from carbonrouter_lib.sharegpt import load_sharegpt_turns
what, texts = sys.argv[1], json.loads(sys.argv[2])
if what in ("lengths", "mooncake"):
    if what == "lengths":
        df, _ = load_sharegpt_turns(max_conversations=300, progress=False)
    else:
        from carbonrouter_lib.prepared import base_turns
        df = base_turns("mooncake", None)
    output_length._to_tokens = lambda log_pred, cap: log_pred  # the unrounded log estimates
    est = output_length.estimate_output_tokens(df, families=("llama3",))
    print(json.dumps(est["est_output_tokens_llama3"].astype(float).tolist()))
else:
    print(json.dumps(fit_offline_predictor().predict(texts).ravel().tolist()))
"""


def _narrow_env() -> dict[str, str]:
    from numpy._core import _multiarray_umath as umath

    features = umath.__cpu_features__
    if platform.machine() not in ("x86_64", "AMD64") or not features.get("AVX"):
        pytest.skip("needs an x86-64 CPU with AVX (the kernels switched off are x86's)")
    # NumPy's dispatch targets by its own names (≥ 2.4: X86_V3 for AVX2, X86_V4 for AVX-512,
    # AVX512_ICL, AVX512_SPR); it ignores other names, so a list of single features (AVX2,
    # AVX512F, …) switched off nothing of NumPy's, only OpenBLAS's
    off = [t for t in umath.__cpu_dispatch__ if features.get(t)]
    if not off:
        pytest.skip("this CPU has no kernel wider than NumPy's baseline to switch off")
    return dict(os.environ, NPY_DISABLE_CPU_FEATURES=" ".join(off),
                OPENBLAS_CORETYPE="Sandybridge", PYTHONPATH=str(REPO))


def _child(what: str) -> np.ndarray:
    done = subprocess.run([sys.executable, "-c", CHILD, what, json.dumps(TEXTS)],
                          env=_narrow_env(), capture_output=True, text=True, check=False,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return np.array(json.loads(done.stdout.strip().splitlines()[-1]))


def test_output_lengths_do_not_depend_on_the_kernels(monkeypatch):
    from carbonrouter_lib import output_length
    from carbonrouter_lib.sharegpt import load_sharegpt_turns

    # compared before rounding to tokens, which hides most differences in a small sample
    monkeypatch.setattr(output_length, "_to_tokens", lambda log_pred, cap: log_pred)
    df, _ = load_sharegpt_turns(max_conversations=300, progress=False)
    here = output_length.estimate_output_tokens(df, families=("llama3",))
    there = _child("lengths")
    # log1p(tokens): 1e-9 moves an estimate of 8,192 tokens by 1e-5 of a token
    np.testing.assert_allclose(there, here["est_output_tokens_llama3"].to_numpy(np.float64),
                               rtol=0, atol=1e-9)


def test_gradient_boosted_output_lengths_do_not_depend_on_the_kernels(monkeypatch):
    """The Mooncake trace's estimates (HistGradientBoosting, no text) are bit-identical: its
    features and target are log1p on a grid (output_length.log1p_grid). With NumPy's log1p
    straight, 4,750 of its 12,031 log estimates differed, by up to 0.78 (a factor of 2.2)."""
    from carbonrouter_lib import output_length
    from carbonrouter_lib.prepared import base_turns

    monkeypatch.setattr(output_length, "_to_tokens", lambda log_pred, cap: log_pred)
    df = base_turns("mooncake", None)
    here = output_length.estimate_output_tokens(df, families=("llama3",))
    assert here.attrs["output_length"]["model"] == "hgb"
    there = _child("mooncake")
    np.testing.assert_array_equal(there, here["est_output_tokens_llama3"].to_numpy(np.float64))


def test_quality_scores_do_not_depend_on_the_kernels():
    from carbonrouter_lib.quality import fit_offline_predictor

    here = fit_offline_predictor().predict(TEXTS).ravel()
    there = _child("quality")
    # far below any gap that matters to β_Q (scores differ by rounding only: 4e-9 with NumPy's
    # kernels switched off too, 0.034 before the vocabulary's ties were broken by the term)
    np.testing.assert_allclose(there, here, rtol=0, atol=1e-8)
