"""benchmarks/gpu_profile.py on the CPU with tiny configs: no energy counter, but the whole
procedure runs and writes the raw measurement and the profile table in their schemas."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from carbonrouter_lib import measured
from carbonrouter_lib.profiles import MODELS, PROFILE_COLUMNS

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_profile.py"


def _script():
    spec = importlib.util.spec_from_file_location("gpu_profile", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_profile"] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_tiny_cpu_run_writes_the_measurement_and_the_profile_schema(tmp_path):
    gp = _script()
    doc = gp.main(["--tiny", "--device", "cpu", "--out", str(tmp_path), "--repeats", "1"])
    raw = json.loads((tmp_path / "gpu_profile.json").read_text())
    assert raw["meta"]["nvml_counter"] is False and raw["meta"]["tiny"] is True
    st = gp.TINY_SETTINGS
    assert [r["model"] for r in raw["results"]] == list(gp.CONFIGS)
    for r in raw["results"]:
        assert r["prefill_tok_per_s"] > 0 and math.isnan(r["prefill_J_per_tok"])
        assert [c["history"] for c in r["cached"]] == list(st.histories)
        assert [d["batch"] for d in r["decode"]] == list(st.batches)
        assert all(d["seq_tok_per_s"] > 0 for d in r["decode"])
    big = raw["results"][-1]
    assert big["layers_measured"] == st.layers_70b and big["layer_scale"] == 80 / st.layers_70b
    table = pd.read_csv(tmp_path / "gpu_profile_table.csv")
    assert list(table.columns) == [*PROFILE_COLUMNS, "params_b"]
    assert list(table["model"]) == list(MODELS)
    assert (table["prefill_tok_s"] > 0).all() and table["e_in_kwh"].isna().all()
    # The 70B's throughput is scaled back to the whole model (80 layers from the measured ones).
    assert table["prefill_tok_s"].iloc[-1] == np.float64(big["prefill_tok_per_s"]) / (
        80 / st.layers_70b)
    assert doc["meta"]["settings"]["prefill_tokens"] == st.prefill_tokens


def test_profile_table_of_a_measurement_is_a_valid_profile_table():
    table = measured.profile_table(measured.load_measurement(), gpu="H200", decode_batch=64)
    assert set(PROFILE_COLUMNS) <= set(table.columns)
    assert (table["gpu"] == "H200").all() and (table["n_gpus"] == 1).all()
    np.testing.assert_allclose(table["e_out_kwh"] / table["e_in_kwh"],
                               measured.measured_summary(measured.load_measurement())["kappa_b64"])
