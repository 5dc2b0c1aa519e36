"""Tests of carbonrouter_lib.profiles: golden values recomputed by hand from Appendix A
(docs/model.md §3)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from carbonrouter_lib.profiles import (
    GPU_SPECS,
    GPUS,
    MODEL_SPECS,
    MODELS,
    PROFILE_COLUMNS,
    GPUSpec,
    ModelSpec,
    ProfileConstants,
    ProfileError,
    analytical_profiles,
    appendix_a_table,
    load_measured_profiles,
    validate_profiles,
)

# Appendix A numbers typed again here (not imported) so a typo in the module is caught.
PARAMS = {
    "Gemma-3-1B": 1e9,
    "Llama-3.2-3B": 3e9,
    "Gemma-3-4B": 4e9,
    "Mistral-7B-v0.2": 7e9,
    "Llama-3.1-70B": 70e9,
}
PEAK = {"A10": 125e12, "A100": 312e12, "H100": 989.5e12}  # FLOP/s
TDP = {"A10": 150.0, "A100": 400.0, "H100": 700.0}  # W
BW = {"A10": 600e9, "A100": 1555e9, "H100": 3350e9}  # bytes/s
ETA_H = {"A10": 0.653, "A100": 1.0, "H100": 0.69}
N_GPUS_70B = {"A10": 8, "A100": 8, "H100": 4}


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    return analytical_profiles()


def row(df: pd.DataFrame, model: str, gpu: str) -> pd.Series:
    sel = df[(df["model"] == model) & (df["gpu"] == gpu)]
    assert len(sel) == 1
    return sel.iloc[0]


def test_catalog_constants():
    assert MODELS == (
        "Gemma-3-1B",
        "Llama-3.2-3B",
        "Gemma-3-4B",
        "Mistral-7B-v0.2",
        "Llama-3.1-70B",
    )
    assert GPUS == ("A10", "A100", "H100")
    windows = [MODEL_SPECS[m].context_window for m in MODELS]
    assert windows == [32 * 1024, 128 * 1024, 128 * 1024, 32 * 1024, 128 * 1024]


def test_shape_order_columns(table):
    assert len(table) == 15
    assert tuple(table.columns[: len(PROFILE_COLUMNS)]) == PROFILE_COLUMNS
    assert list(table["model"]) == [m for m in MODELS for _ in GPUS]
    assert list(table["gpu"]) == list(GPUS) * len(MODELS)
    expected_n = [N_GPUS_70B[g] if m == "Llama-3.1-70B" else 1 for m in MODELS for g in GPUS]
    assert list(table["n_gpus"]) == expected_n


def test_golden_mistral_a100(table):
    eta = 0.5 * (7 / 70) ** 0.2 * 1.0
    e_in_j = 2 * 7e9 * 0.85 * 400 / (eta * 312e12)
    r = row(table, "Mistral-7B-v0.2", "A100")
    assert r["mfu"] == pytest.approx(eta, rel=1e-12)
    assert r["e_in_kwh"] == pytest.approx(e_in_j / 3.6e6, rel=1e-12)
    assert r["e_in_kwh"] * 1e3 * 1e6 == pytest.approx(13.4332, abs=1e-3)  # mWh per 1K tokens
    assert r["prefill_tok_s"] == pytest.approx(eta * 312e12 / 14e9, rel=1e-12)
    assert r["decode_tok_s"] == pytest.approx(1555e9 / 14e9, rel=1e-12)
    assert r["e_out_kwh"] == pytest.approx(6 * e_in_j / 3.6e6, rel=1e-12)
    assert r["e_cache_kwh"] == pytest.approx(0.05 * e_in_j / 3.6e6, rel=1e-12)


def test_golden_70b(table):
    ref = row(table, "Llama-3.1-70B", "A100")
    assert ref["relative_energy"] == 1.0
    assert ref["mfu"] == pytest.approx(0.5)
    assert ref["prefill_tok_s"] == pytest.approx(0.5 * 8 * 312e12 / 140e9)
    h100 = row(table, "Llama-3.1-70B", "H100")
    assert h100["decode_tok_s"] == pytest.approx(4 * 3350e9 / (2 * 70e9))  # 95.71 tok/s
    assert h100["n_gpus"] == 4


def test_relative_energy_closed_form(table):
    # ρ = (P/70B)^α · [TDP_h / (η_h F_h)] / [TDP_A100 / (η_A100 F_A100)]: P^(1-α) cancels one P.
    ref_gpu = TDP["A100"] / (ETA_H["A100"] * PEAK["A100"])
    for m in MODELS:
        for g in GPUS:
            expected = (PARAMS[m] / 70e9) ** 0.8 * (TDP[g] / (ETA_H[g] * PEAK[g])) / ref_gpu
            assert row(table, m, g)["relative_energy"] == pytest.approx(expected, rel=1e-12)


def test_energy_equals_power_over_throughput(table):
    # Physical identity: J/token = deployment power (G·f·TDP watts) / prefill rate (tokens/s).
    # It shows why e_in carries no G: the G in power cancels the G in throughput.
    for _, r in table.iterrows():
        power_w = r["n_gpus"] * 0.85 * TDP[r["gpu"]]
        assert r["e_in_kwh"] * 3.6e6 == pytest.approx(power_w / r["prefill_tok_s"], rel=1e-12)
        assert r["decode_tok_s"] == pytest.approx(
            r["n_gpus"] * BW[r["gpu"]] / (2 * PARAMS[r["model"]]), rel=1e-12
        )


def test_energy_orderings(table):
    # Bigger models cost more per token on every GPU; H100 < A100 < A10 per token for each model.
    for g in GPUS:
        e = [row(table, m, g)["e_in_kwh"] for m in MODELS]
        assert e == sorted(e)
    for m in MODELS:
        e = [row(table, m, g)["e_in_kwh"] for g in ("H100", "A100", "A10")]
        assert e == sorted(e)


def test_kappa_gamma_overrides_change_only_their_column(table):
    other = analytical_profiles(kappa=8.0, gamma=0.1)
    for col in table.columns:
        if col == "e_out_kwh":
            np.testing.assert_allclose(other[col], 8.0 * table["e_in_kwh"], rtol=1e-12)
        elif col == "e_cache_kwh":
            np.testing.assert_allclose(other[col], 0.1 * table["e_in_kwh"], rtol=1e-12)
        else:
            pd.testing.assert_series_equal(other[col], table[col])


def test_gpu_field_override_changes_only_that_gpu(table):
    other = analytical_profiles(gpus={"A10": {"tdp_w": 300.0}})
    a10 = table["gpu"] == "A10"
    np.testing.assert_allclose(other.loc[a10, "e_in_kwh"], 2 * table.loc[a10, "e_in_kwh"])
    pd.testing.assert_series_equal(other.loc[~a10, "e_in_kwh"], table.loc[~a10, "e_in_kwh"])
    for col in ("prefill_tok_s", "decode_tok_s", "mfu", "n_gpus"):
        pd.testing.assert_series_equal(other[col], table[col])
    # A full spec replaces too, and memory bandwidth touches decode only.
    spec = dataclasses.replace(GPU_SPECS["H100"], mem_bw_gb_s=2 * 3350.0)
    other = analytical_profiles(gpus={"H100": spec})
    h100 = table["gpu"] == "H100"
    np.testing.assert_allclose(other.loc[h100, "decode_tok_s"], 2 * table.loc[h100, "decode_tok_s"])
    for col in ("e_in_kwh", "prefill_tok_s", "relative_energy"):
        pd.testing.assert_series_equal(other[col], table[col])


def test_gpu_count_override_changes_throughput_not_energy(table):
    other = analytical_profiles(models={"Llama-3.1-70B": {"gpus_per_deployment": {"H100": 8}}})
    sel = (table["model"] == "Llama-3.1-70B") & (table["gpu"] == "H100")
    assert other.loc[sel, "n_gpus"].item() == 8
    for col in ("prefill_tok_s", "decode_tok_s"):
        assert other.loc[sel, col].item() == pytest.approx(2 * table.loc[sel, col].item())
        pd.testing.assert_series_equal(other.loc[~sel, col], table.loc[~sel, col])
    pd.testing.assert_series_equal(other["e_in_kwh"], table["e_in_kwh"])


def test_alpha_override_leaves_70b_unchanged(table):
    other = analytical_profiles(alpha=0.5)
    is70 = table["model"] == "Llama-3.1-70B"
    pd.testing.assert_series_equal(other.loc[is70, "e_in_kwh"], table.loc[is70, "e_in_kwh"])
    # Smaller models get a lower MFU (exponent 0.5 > 0.2), hence more energy per token.
    assert (other.loc[~is70, "e_in_kwh"] > table.loc[~is70, "e_in_kwh"]).all()


def test_new_gpu_is_appended():
    b200 = GPUSpec("B200", peak_tflops=2250.0, tdp_w=1000.0, mem_bw_gb_s=8000.0, eta=0.7)
    df = analytical_profiles(gpus={"B200": b200})
    assert len(df) == 20
    assert list(df["gpu"].iloc[:4]) == ["A10", "A100", "H100", "B200"]


@settings(max_examples=30, deadline=None)
@given(
    f=st.floats(0.1, 1.0),
    eta_ref=st.floats(0.1, 1.0),
    scale=st.floats(0.1, 10.0),
)
def test_relative_energy_ignores_common_factors(f, eta_ref, scale):
    # f, η_ref and a common TDP factor scale every e_in alike: relative energies must not move.
    base = analytical_profiles()
    gpus = {g: {"tdp_w": TDP[g] * scale} for g in GPUS}
    other = analytical_profiles(f=f, eta_ref=eta_ref, gpus=gpus)
    np.testing.assert_allclose(other["relative_energy"], base["relative_energy"], rtol=1e-9)
    factor = (f / 0.85) * (0.5 / eta_ref) * scale
    np.testing.assert_allclose(other["e_in_kwh"], base["e_in_kwh"] * factor, rtol=1e-9)


def test_bad_overrides_and_specs():
    with pytest.raises(TypeError, match="unknown keyword.*tdp"):
        analytical_profiles(tdp=100)
    with pytest.raises(ValueError, match="gamma"):
        analytical_profiles(gamma=1.5)
    with pytest.raises(ValueError, match="MFU"):
        analytical_profiles(eta_ref=1.0, gpus={"A10": {"eta": 2.0}})
    with pytest.raises(TypeError, match="unknown field"):
        analytical_profiles(gpus={"A10": {"tdp": 100.0}})
    with pytest.raises(ValueError, match="unknown name"):
        analytical_profiles(gpus={"B200": {"tdp_w": 100.0}})
    with pytest.raises(ValueError, match="tdp_w"):
        GPUSpec("X", peak_tflops=1.0, tdp_w=-1.0, mem_bw_gb_s=1.0, eta=1.0)
    with pytest.raises(ValueError, match="context_window"):
        ModelSpec("X", 1.0, 0)
    with pytest.raises(ValueError, match="gpus_per_deployment"):
        ModelSpec("X", 1.0, 1024, {"A10": 0})
    with pytest.raises(ValueError, match="alpha"):
        ProfileConstants(alpha=1.2)
    with pytest.raises(ValueError, match=r"\bf\b"):
        ProfileConstants(f=0.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ProfileConstants().kappa = 1.0  # type: ignore[misc]


def test_model_spec_hashable_and_normalized():
    a = ModelSpec("X", 1.0, 1024, {"H100": 2, "A10": 4})
    b = ModelSpec("X", 1.0, 1024, (("A10", 4), ("H100", 2)))
    assert a == b and hash(a) == hash(b)
    assert a.n_gpus("A10") == 4 and a.n_gpus("A100") == 1


# --- measured profiles -------------------------------------------------------------------------


def test_csv_round_trip(tmp_path, table):
    path = tmp_path / "profiles.csv"
    table.to_csv(path, index=False)
    loaded = load_measured_profiles(path)
    pd.testing.assert_frame_equal(loaded, table, check_exact=False, rtol=1e-12)


def test_minimal_measured_file_fills_catalog_columns(tmp_path):
    path = tmp_path / "measured.csv"
    path.write_text(
        "model,gpu,e_in_kwh,e_out_kwh,e_cache_kwh,prefill_tok_s,decode_tok_s\n"
        "Llama-3.1-70B,A100,2e-7,1e-6,1e-8,5000,40\n"
        "Mistral-7B-v0.2,H100,5e-8,3e-7,0,9000,150\n"
    )
    # two models on two GPU types, but not every pair: a replay could not deploy them
    with pytest.raises(ProfileError, match=r"\('Llama-3.1-70B', 'H100'\), \('Mistral-7B-v0.2', "
                                           r"'A100'\)"):
        load_measured_profiles(path)
    df = load_measured_profiles(path, complete=False)
    assert list(df["n_gpus"]) == [8, 1]
    assert list(df["context_window"]) == [131_072, 32_768]
    assert df["relative_energy"].tolist() == pytest.approx([1.0, 0.25])
    assert df["mfu"].isna().all()


def test_unknown_names_allowed_with_their_columns(tmp_path):
    path = tmp_path / "own.csv"
    path.write_text(
        "model,gpu,n_gpus,context_window,e_in_kwh,e_out_kwh,e_cache_kwh,prefill_tok_s,decode_tok_s\n"
        "MyModel,MI300X,2,65536,1e-7,6e-7,5e-9,8000,100\n"
    )
    df = load_measured_profiles(path)
    assert df.loc[0, "model"] == "MyModel" and df.loc[0, "n_gpus"] == 2
    assert df.loc[0, "relative_energy"] == 1.0  # no reference pair: normalized to the largest


HEADER = "model,gpu,e_in_kwh,e_out_kwh,e_cache_kwh,prefill_tok_s,decode_tok_s\n"
GOOD = "Gemma-3-1B,A10,1e-8,6e-8,5e-10,9000,300\n"


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (HEADER + GOOD + GOOD, r"appears in line 2, line 3"),
        (HEADER + GOOD + "Gemma-3-1B,A100,-1e-8,6e-8,5e-10,9000,300\n", r"line 3: e_in_kwh"),
        (HEADER + "Gemma-3-1B,A10,1e-8,6e-8,5e-10,fast,300\n", r"line 2: prefill_tok_s"),
        (HEADER + "Gemma-3-1B,A10,1e-8,6e-8,2e-8,9000,300\n", r"line 2: e_cache_kwh"),
        (HEADER + "Gemma-3-1B,A10,1e-8,,5e-10,9000,300\n", r"line 2: e_out_kwh"),
        (HEADER + "NewModel,A10,1e-8,6e-8,5e-10,9000,300\n", r"line 2: no n_gpus"),
        (HEADER + ",A10,1e-8,6e-8,5e-10,9000,300\n", r"line 2: model"),
        ("model,gpu,e_in_kwh\nGemma-3-1B,A10,1e-8\n", r"missing column"),
        (HEADER, r"no rows"),
        ("", r"empty file"),
    ],
)
def test_bad_files_rejected_naming_file_and_line(tmp_path, body, match):
    path = tmp_path / "bad.csv"
    path.write_text(body)
    with pytest.raises(ProfileError, match=match) as info:
        load_measured_profiles(path)
    assert str(path) in str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.csv"):
        load_measured_profiles(tmp_path / "nope.csv")


def test_validate_profiles_rejects_bad_mfu(table):
    bad = table.copy()
    bad.loc[3, "mfu"] = 1.5
    with pytest.raises(ProfileError, match="row 3: mfu"):
        validate_profiles(bad)


def test_appendix_a_table_units(table):
    t = appendix_a_table(table)
    r = t[(t["model"] == "Llama-3.1-70B") & (t["gpu"] == "A100")].iloc[0]
    e_in_j = 2 * 70e9 * 0.85 * 400 / (0.5 * 312e12)  # J/token
    # J/token × 1,000 tokens / 3.6e6 J/kWh × 1e6 mWh/kWh
    assert r["e_in_mwh_per_1k"] == pytest.approx(e_in_j * 1000 / 3.6e6 * 1e6)
    assert math.isclose(r["e_out_mwh_per_1k"], 6 * r["e_in_mwh_per_1k"])


def test_kv_memory_per_instance_follows_appendix_a():
    from carbonrouter_lib.profiles import KV_GEOMETRY, kv_tokens_per_instance

    geo = KV_GEOMETRY["Llama-3.1-70B"]
    assert geo.kv_bytes_per_token == 80 * 8 * 128 * 2 * 2 == 320 * 1024
    # Appendix A: 8×A10 (24 GB), 8×A100-40GB, 4×H100 (80 GB); 90% usable, minus 16-bit weights
    # of 70.6B parameters → 32 GB and 147 GB left for the KV cache.
    for gpu, free_gb in [("A10", 32), ("A100", 147), ("H100", 147)]:
        free = kv_tokens_per_instance("Llama-3.1-70B", gpu) * geo.kv_bytes_per_token / 1e9
        assert round(free) == free_gb
    assert kv_tokens_per_instance("Llama-3.1-70B", "A100") == pytest.approx(
        (8 * 40e9 * 0.9 - 2 * 70.55e9) / 327_680)
    # Mistral-7B on one A10: 21.6 GB − 14.5 GB at 128 KiB per token.
    assert kv_tokens_per_instance("Mistral-7B-v0.2", "A10") == pytest.approx(
        (24e9 * 0.9 - 2 * 7.24e9) / (32 * 8 * 128 * 4))
    with pytest.raises(ValueError, match="unknown model"):
        kv_tokens_per_instance("GPT-4", "A10")
    with pytest.raises(ValueError, match="do not fit"):
        kv_tokens_per_instance("Mistral-7B-v0.2", "A10", memory_fraction=0.5)


# ---------------------------------------------------------------------------------------------
# ProfileTable: a table with its content hash (what SimulationConfig.profiles holds)


BYO_PROFILES = Path(__file__).parent / "data" / "byo" / "profiles_l4_h200.csv"


def test_profile_table_from_a_dataframe_a_path_and_json(tmp_path):
    from carbonrouter_lib.datasets import sha256_of
    from carbonrouter_lib.profiles import ProfileTable

    a = ProfileTable.of(analytical_profiles())
    b = ProfileTable.of(analytical_profiles().copy())
    assert a == b and hash(a) == hash(b) and a.path is None and len(a.sha256) == 64
    assert ProfileTable.of(a) is a
    assert ProfileTable.of(analytical_profiles(kappa=5.0)) != a
    f = ProfileTable.of(BYO_PROFILES)
    assert f.path == str(BYO_PROFILES.resolve()) and f.sha256 == sha256_of(BYO_PROFILES)
    assert list(f.frame["gpu"].unique()) == ["L4", "H200"]
    assert ProfileTable.of(f.to_json()) == f
    # the JSON form checks that the file still holds what it held
    copy = tmp_path / "p.csv"
    copy.write_bytes(BYO_PROFILES.read_bytes())
    ref = ProfileTable.of(str(copy)).to_json()
    copy.write_text(copy.read_text().replace("9000", "9100"))
    with pytest.raises(ProfileError, match=r"p\.csv: content changed"):
        ProfileTable.of(ref)
    with pytest.raises(TypeError, match="cannot be rebuilt from JSON"):
        ProfileTable.of(a.to_json())
    with pytest.raises(TypeError, match="DataFrame, a CSV path"):
        ProfileTable.of(42)
    with pytest.raises(ProfileError, match="line 3: e_in_kwh must be > 0"):
        bad = tmp_path / "bad.csv"
        bad.write_text(BYO_PROFILES.read_text().replace("5e-09", "-5e-09", 1))
        ProfileTable.of(bad)
