"""Deployment numbering follows the spec's tie-break order; arrays match the profiles."""

from __future__ import annotations

import numpy as np
import pytest

from carbonrouter_lib.deployments import Deployments
from carbonrouter_lib.profiles import analytical_profiles

REGIONS = ("AT", "GB", "BE", "US-CAL-CISO")


def test_sixty_deployments_in_tie_break_order():
    d = Deployments.build(REGIONS)
    assert d.n == 60 and d.n_pools == 12
    keys = list(zip(d.region, d.gpu, d.model, strict=True))
    assert keys == sorted(keys)  # region, then GPU, then model
    assert d.label(0) == "Gemma-3-1B/A10/AT"
    assert d.label(59) == "Llama-3.1-70B/H100/US-CAL-CISO"
    for a in range(d.n):
        parts = d.label(a).split("/")
        assert d.index(*parts) == a
        assert d.pool[a] == d.region[a] * 3 + d.gpu[a]


def test_arrays_match_profiles_and_are_read_only():
    prof = analytical_profiles().set_index(["model", "gpu"])
    d = Deployments.build(REGIONS)
    a = d.index("Mistral-7B-v0.2", "A100", "BE")
    assert d.e_in[a] == prof.loc[("Mistral-7B-v0.2", "A100"), "e_in_kwh"]
    assert d.context_window[a] == 32768
    np.testing.assert_array_equal(d.e_in[:15], d.e_in[15:30])  # same profile in every region
    with pytest.raises(ValueError):
        d.e_in[0] = 1.0


def test_bad_regions():
    with pytest.raises(ValueError, match="duplicate"):
        Deployments.build(("GB", "GB"))
    with pytest.raises(ValueError, match="at least one"):
        Deployments.build(())
