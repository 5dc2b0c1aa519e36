"""Section-2 analysis (carbonrouter_lib.motivation): the carbon statistics of Figure 1 and the
annual means, history shares and the cost of a cache miss, against hand computations."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from carbonrouter_lib import motivation, profiles
from carbonrouter_lib.carbon import CarbonConfig, CarbonDataError, CarbonSignal
from carbonrouter_lib.motivation import (
    annual_means_span,
    cleanest_intervals,
    cleanest_shares,
    cross_region_ratio,
    load_annual_means,
    median_cross_region_ratio,
    range_ratio,
    section2_comparison,
    section2_stats,
)

T0 = pd.Timestamp("2022-03-01 00:00", tz="UTC")

# ---------------------------------------------------------------------------------------------
# Section 2.1: carbon statistics on a hand-made frame, annual means
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def three_regions():
    # Rows (A, B, C): cleanest A; tie B=C; A; C.
    return pd.DataFrame(
        {"A": [100.0, 300.0, 50.0, 200.0],
         "B": [200.0, 150.0, 100.0, 100.0],
         "C": [400.0, 150.0, 200.0, 80.0]},
        index=pd.date_range(T0, periods=4, freq="5min"),
    )


def test_statistics_by_hand(three_regions):
    f = three_regions
    rr = range_ratio(f)
    assert rr.to_dict() == pytest.approx({"A": 300 / 50, "B": 200 / 100, "C": 400 / 80})
    # Quantiles by hand (linear interpolation over 4 sorted values, position p * 3):
    # A sorted 50, 100, 200, 300; q=0.25 -> position 0.75 -> 87.5; 0.75 -> 2.25 -> 225.
    assert range_ratio(f, q=0.25)["A"] == pytest.approx(225 / 87.5)
    assert range_ratio(f, q=0.25).name == "p75_over_p25"
    with pytest.raises(ValueError):
        range_ratio(f, q=0.5)
    np.testing.assert_allclose(cross_region_ratio(f).to_numpy(), [4.0, 2.0, 4.0, 2.5])
    assert median_cross_region_ratio(f) == pytest.approx((2.5 + 4.0) / 2)
    split = cleanest_shares(f)
    assert split.to_dict() == pytest.approx({"A": 2 / 4, "B": 0.5 / 4, "C": 1.5 / 4})
    assert split.attrs["tied_instants"] == 1
    assert split.sum() == pytest.approx(1.0)
    first = cleanest_shares(f, ties="first")
    assert first.to_dict() == pytest.approx({"A": 0.5, "B": 0.25, "C": 0.25})


def test_section2_tables(three_regions):
    st_a = section2_stats(three_regions)
    value = st_a.set_index(["quantity", "region"])["value"]
    assert value[("median_cross_region_ratio", "all")] == pytest.approx(3.25)
    assert value[("cleanest_share", "C")] == pytest.approx(0.375)
    st_b = section2_stats(three_regions.rename(columns={"A": "Z"}))
    cmp = section2_comparison({"one": st_a, "two": st_b})
    assert {"quantity", "region", "paper", "ours (one)", "ours (two)", "note"} <= set(cmp.columns)
    row_a = cmp[(cmp["quantity"] == "cleanest_share") & (cmp["region"] == "A")].iloc[0]
    assert row_a["ours (one)"] == pytest.approx(0.5) and np.isnan(row_a["ours (two)"])
    hi = cmp[(cmp["quantity"] == "max_over_min") & (cmp["region"] == "highest over regions")]
    assert hi["ours (one)"].iloc[0] == pytest.approx(6.0)


def test_statistics_reject_nonpositive(three_regions):
    f = three_regions.copy()
    f.iloc[0, 0] = 0.0
    with pytest.raises(ValueError, match="<= 0"):
        range_ratio(f)


def test_cleanest_intervals_follow_the_cleanest_region():
    # Hourly values held on a 5-minute grid: A cleanest, then B, then A (ties: first column).
    grid = pd.date_range(T0, T0 + pd.Timedelta("3h"), freq="5min", inclusive="left")
    hour = (grid - T0) // pd.Timedelta("1h")
    frame = pd.DataFrame({"A": np.array([100.0, 200.0, 300.0])[hour],
                          "B": np.array([150.0, 50.0, 400.0])[hour]}, index=grid)
    sig = CarbonSignal(frame, end=T0 + pd.Timedelta("3h"))
    iv = cleanest_intervals(sig.frame)
    assert list(iv["region"]) == ["A", "B", "A"]
    assert iv["end"].iloc[-1] == T0 + pd.Timedelta("3h")
    assert iv["start"].iloc[1] == T0 + pd.Timedelta("1h")
    starts = np.array([t.timestamp() for t in iv["start"]])
    assert list(sig.cleanest_region(starts)) == list(iv["region"])


def test_load_annual_means(tmp_path):
    data = {
        "IND": {"country_code": "IND", "country_or_region": "India", "year": 2024,
                "emissions_intensity_gco2_per_kwh": 700.0},
        "World": {"country_code": "", "country_or_region": "World", "year": 2024,
                  "emissions_intensity_gco2_per_kwh": 470.0},
        "CHE": {"country_code": "CHE", "country_or_region": "Switzerland", "year": 2023,
                "emissions_intensity_gco2_per_kwh": 35.0},
        "FRA": {"country_code": "FRA", "country_or_region": "France", "year": 2024,
                "emissions_intensity_gco2_per_kwh": 50.0},
    }
    path = tmp_path / "annual.json"
    path.write_text(json.dumps(data))
    df = load_annual_means(path)
    assert list(df.columns) == ["iso3", "country", "year", "gco2_per_kwh"]
    assert list(df["iso3"]) == ["CHE", "FRA", "IND"]  # aggregate dropped, sorted
    span = annual_means_span(df, ["IND", "CHE"])
    assert (span.max_country, span.min_country) == ("India", "Switzerland")
    assert span.ratio == pytest.approx(20.0)
    assert span.years == {2023: 1, 2024: 1}
    assert annual_means_span(df).n_countries == 3
    with pytest.raises(KeyError, match="XXX"):
        annual_means_span(df, ["IND", "XXX"])
    data["FRA"]["emissions_intensity_gco2_per_kwh"] = -1
    path.write_text(json.dumps(data))
    with pytest.raises(CarbonDataError, match="FRA"):
        load_annual_means(path)


def test_real_em_only_matches_data_readme():
    from carbonrouter_lib.datasets import DataUnavailableError

    # Data README, measured on 2022 hourly LCA: CH 48%, BE 31%, GB 13%, CAISO 8%, median 2.44.
    try:
        sig = CarbonSignal.from_config(CarbonConfig.from_region_set("em-only"), cache=False)
    except DataUnavailableError as exc:  # no mirror and no network
        pytest.skip(f"carbon data unavailable: {exc}")
    shares = cleanest_shares(sig.frame)
    expect = {"CH": 0.48, "BE": 0.31, "GB": 0.13, "US-CAL-CISO": 0.08}
    assert shares.to_dict() == pytest.approx(expect, abs=0.01)
    assert median_cross_region_ratio(sig.frame) == pytest.approx(2.44, abs=0.01)


# ---------------------------------------------------------------------------------------------
# Section 2.2: history lengths and the cost of a cache miss
# ---------------------------------------------------------------------------------------------




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


def test_workload_summary_by_hand():
    # The turn table of the Mooncake trace's hand-made gap trace (tests/test_mooncake.py): one
    # conversation of three turns, one of two.
    hist, new, out = [0, 1300, 1420, 0, 1600], [1200, 100, 80, 1100, 100], [100, 20, 10, 500, 10]
    turns = pd.DataFrame({"conversation_id": ["mooncake-0"] * 3 + ["mooncake-1"] * 2,
                          "turn": [0, 1, 2, 0, 1], "history_tokens_llama3": hist,
                          "new_tokens_llama3": new, "output_tokens_llama3": out})
    summary = motivation.workload_summary(turns, "llama3", thresholds=(1000, 1500))
    assert summary["conversations"] == 2 and summary["queries"] == 5
    assert summary["mean turns per conversation"] == 2.5
    assert summary["share of queries with ≥ 1000 history tokens"] == pytest.approx(3 / 5)
    assert summary["share of queries with ≥ 1500 history tokens"] == pytest.approx(1 / 5)
    assert summary["median history tokens per query"] == 1300
    assert summary["median new tokens per query"] == 100
    assert summary["mean context tokens per query (history + new)"] == pytest.approx(
        (sum(hist) + sum(new)) / 5)

