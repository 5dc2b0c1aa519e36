"""Tests of carbonrouter_lib.carbon: loaders, validation, year shift, lookup."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from carbonrouter_lib import carbon
from carbonrouter_lib.carbon import (
    EM_LCA_COLUMN,
    EM_TIME_COLUMN,
    CarbonConfig,
    CarbonDataError,
    CarbonSignal,
    hold_on_grid,
    load_electricitymaps_csv,
    load_entsoe_csv,
    shift_by_weeks,
    year_grid,
)

# ---------------------------------------------------------------------------------------------
# hand-made files
# ---------------------------------------------------------------------------------------------

EM_HEADER = (
    f"{EM_TIME_COLUMN},Country,Zone Name,Zone Id,Carbon Intensity gCO₂eq/kWh (direct),"
    f"{EM_LCA_COLUMN},Low Carbon Percentage"
)


def write_em(path, rows):
    """rows: (stamp text, LCA text); the other columns are filler."""
    lines = [EM_HEADER] + [f"{t},Testland,Testland,TL,1.0,{v},50" for t, v in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_entsoe(path, rows):
    lines = ["datetime_utc,ci_lca_gco2eq_per_kwh,generation_mw"]
    lines += [f"{t},{v},1000.0" for t, v in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


GOOD_EM = [
    ("2022-01-01 00:00:00", "100.5"),
    ("2022-01-01 01:00:00", "120"),
    ("2022-01-01 02:00:00", "90.25"),
    ("2022-01-01 03:00:00", "80"),
]
GOOD_ENTSOE = [
    ("2019-12-31T23:00:00Z", "166.74"),
    ("2019-12-31T23:15:00Z", "172.55"),
    ("2019-12-31T23:30:00Z", "170.0"),
    ("2019-12-31T23:45:00Z", "160.0"),
]


def test_load_electricitymaps_good(tmp_path):
    s = load_electricitymaps_csv(write_em(tmp_path / "TL_2022_hourly.csv", GOOD_EM))
    assert str(s.index.tz) == "UTC"
    assert list(s.to_numpy()) == [100.5, 120.0, 90.25, 80.0]
    assert s.index[0] == pd.Timestamp("2022-01-01 00:00", tz="UTC")
    assert (s.index.minute == 0).all()  # each stamp is the start of its hour
    assert np.all(np.diff(s.index.asi8) == 3600 * 10**9)


def test_load_electricitymaps_accepts_explicit_utc(tmp_path):
    rows = [("2022-01-01T00:00:00Z", "1"), ("2022-01-01T01:00:00+00:00", "2")]
    s = load_electricitymaps_csv(write_em(tmp_path / "em.csv", rows))
    assert list(s.index) == list(pd.date_range("2022-01-01", periods=2, freq="1h", tz="UTC"))


def test_load_entsoe_good(tmp_path):
    s = load_entsoe_csv(write_entsoe(tmp_path / "AT_2020_15min_lca_entsoe.csv", GOOD_ENTSOE))
    assert s.index[0] == pd.Timestamp("2019-12-31 23:00", tz="UTC")
    assert np.all(np.diff(s.index.asi8) == 15 * 60 * 10**9)
    assert s.iloc[1] == pytest.approx(172.55)


def _replace(rows, i, stamp=None, value=None):
    rows = list(rows)
    t, v = rows[i]
    rows[i] = (t if stamp is None else stamp, v if value is None else value)
    return rows


# (case id, loader, rows, words the message must contain)
BAD_EM = [
    ("missing value", _replace(GOOD_EM, 2, value=""), ["line 4", "missing", "02:00"]),
    ("non-numeric", _replace(GOOD_EM, 1, value="abc"), ["line 3", "non-numeric", "'abc'"]),
    ("infinite", _replace(GOOD_EM, 1, value="inf"), ["line 3", "non-numeric"]),
    ("negative", _replace(GOOD_EM, 3, value="-5"), ["line 5", "negative", "03:00"]),
    ("duplicate", _replace(GOOD_EM, 2, stamp="2022-01-01 01:00:00"),
     ["duplicated", "2022-01-01 01:00:00", "[3, 4]"]),
    ("non-monotonic", [GOOD_EM[0], GOOD_EM[2], GOOD_EM[1], GOOD_EM[3]],
     ["line 4", "earlier", "2022-01-01 01:00:00"]),
    ("gap", [GOOD_EM[0], GOOD_EM[1], GOOD_EM[3]], ["gap", "01:00:00", "03:00:00", "line 4"]),
    ("offset", _replace(GOOD_EM, 1, stamp="2022-01-01T02:00:00+01:00"),
     ["line 3", "not UTC", "+01:00"]),
    ("off the hour", _replace(GOOD_EM, 1, stamp="2022-01-01 01:30:00"),
     ["line 3", "start of"]),
    ("unparseable", _replace(GOOD_EM, 1, stamp="yesterday"), ["line 3", "unparseable"]),
]


@pytest.mark.parametrize("rows,words", [c[1:] for c in BAD_EM], ids=[c[0] for c in BAD_EM])
def test_load_electricitymaps_bad_files(tmp_path, rows, words):
    path = write_em(tmp_path / "bad_em.csv", rows)
    with pytest.raises(CarbonDataError) as err:
        load_electricitymaps_csv(path)
    msg = str(err.value)
    assert "bad_em.csv" in msg
    for w in words:
        assert w in msg, (w, msg)


BAD_ENTSOE = [
    ("naive", _replace(GOOD_ENTSOE, 2, stamp="2019-12-31T23:30:00"), ["line 4", "zone"]),
    ("offset", _replace(GOOD_ENTSOE, 0, stamp="2020-01-01T00:00:00+01:00"),
     ["line 2", "not UTC"]),
    ("gap", [GOOD_ENTSOE[0], GOOD_ENTSOE[1], GOOD_ENTSOE[3], ("2020-01-01T00:00:00Z", "1")],
     ["gap", "23:15", "23:45", "0 days 00:15:00"]),
    ("missing value", _replace(GOOD_ENTSOE, 1, value=""), ["line 3", "missing"]),
]


@pytest.mark.parametrize("rows,words", [c[1:] for c in BAD_ENTSOE],
                         ids=[c[0] for c in BAD_ENTSOE])
def test_load_entsoe_bad_files(tmp_path, rows, words):
    path = write_entsoe(tmp_path / "bad_entsoe.csv", rows)
    with pytest.raises(CarbonDataError) as err:
        load_entsoe_csv(path)
    msg = str(err.value)
    assert "bad_entsoe.csv" in msg
    for w in words:
        assert w in msg, (w, msg)


def test_missing_column(tmp_path):
    path = tmp_path / "nolca.csv"
    path.write_text(f"{EM_TIME_COLUMN},Other\n2022-01-01 00:00:00,1\n2022-01-01 01:00:00,2\n")
    with pytest.raises(CarbonDataError, match=r"nolca\.csv: missing column.*LCA"):
        load_electricitymaps_csv(path)
    path = tmp_path / "entsoe_nocol.csv"
    path.write_text("datetime_utc,generation_mw\n2022-01-01T00:00:00Z,1\n")
    with pytest.raises(CarbonDataError, match=r"entsoe_nocol\.csv: missing column"):
        load_entsoe_csv(path)


# ---------------------------------------------------------------------------------------------
# shift_by_weeks
# ---------------------------------------------------------------------------------------------


def hour_of_week_series(start: str, end: str, freq: str = "1h") -> pd.Series:
    """A series whose value is its own hour of the week (Mon 00:00 = 1 ... Sun 23:00 = 168)."""
    idx = pd.date_range(start, end, freq=freq, inclusive="left", tz="UTC", name="time_utc")
    return pd.Series(idx.day_of_week * 24 + idx.hour + 1.0, index=idx)


def test_shift_by_weeks_at_like_2020_to_2022():
    # Like the AT file: local calendar year 2020 = [2019-12-31 23:00Z, 2020-12-31 23:00Z).
    src = hour_of_week_series("2019-12-31 23:00", "2020-12-31 23:00", "15min")
    out = shift_by_weeks(src, 2022, source_year=2020)
    # By hand: 2020-01-01 -> 2022-01-01 is 731 days; 104 weeks (728 d) puts the source on
    # [2021-12-28 23:00, 2022-12-29 23:00): 49 h missing at the end; 105 weeks leaves
    # [2022-01-01, 2022-01-05 23:00) = 119 h missing at the start. 104 wins.
    assert out.weeks == 104
    assert (out.filled_start, out.filled_end) == (0, 49 * 4)
    s = out.series
    assert s.index[0] == pd.Timestamp("2022-01-01", tz="UTC")
    assert s.index[-1] == pd.Timestamp("2022-12-31 23:45", tz="UTC")
    assert len(s) == 365 * 96
    # Weekday and hour kept everywhere, the filled end included.
    np.testing.assert_array_equal(s.to_numpy(), s.index.day_of_week * 24 + s.index.hour + 1.0)
    # Unfilled part is exactly the source moved by 104 weeks.
    moved = src.copy()
    moved.index = moved.index + pd.Timedelta(weeks=104)
    common = s.index.intersection(moved.index)
    assert len(common) == len(s) - out.filled
    np.testing.assert_array_equal(s[common].to_numpy(), moved[common].to_numpy())


@settings(max_examples=25, deadline=None)
@given(src_year=st.integers(2015, 2024), tgt_year=st.integers(2015, 2026),
       lead_h=st.integers(-30, 30))
def test_shift_by_weeks_property(src_year, tgt_year, lead_h):
    start = pd.Timestamp(f"{src_year}-01-01") + pd.Timedelta(hours=lead_h)
    src = hour_of_week_series(start, start + pd.DateOffset(years=1), "1h")
    out = shift_by_weeks(src, tgt_year, source_year=src_year)
    s = out.series
    expect = pd.date_range(f"{tgt_year}-01-01", f"{tgt_year + 1}-01-01", freq="1h",
                           inclusive="left", tz="UTC")
    assert s.index.equals(expect)  # covers the target year exactly
    np.testing.assert_array_equal(s.to_numpy(), s.index.day_of_week * 24 + s.index.hour + 1.0)
    assert out.filled_start + out.filled_end <= 7 * 24  # best shift leaves less than a week
    # No other whole-week shift overlaps the target year more.
    one_h = pd.Timedelta("1h")

    def overlap(k):
        lo = max(src.index[0] + k * carbon.WEEK, expect[0])
        hi = min(src.index[-1] + one_h + k * carbon.WEEK, expect[-1] + one_h)
        return max(hi - lo, pd.Timedelta(0))

    assert all(overlap(out.weeks) >= overlap(out.weeks + d) for d in (-2, -1, 1, 2))


def test_shift_by_weeks_rejects_short_series():
    src = hour_of_week_series("2020-01-01", "2020-06-01")
    with pytest.raises(CarbonDataError, match="52 weeks"):
        shift_by_weeks(src, 2022)


# ---------------------------------------------------------------------------------------------
# step-hold and lookups
# ---------------------------------------------------------------------------------------------

T0 = pd.Timestamp("2022-03-01 00:00", tz="UTC")
S0 = T0.timestamp()


def make_small_signal() -> CarbonSignal:
    """Two regions, hourly source held on a 5-minute grid over 3 hours."""
    hours = pd.date_range(T0, periods=3, freq="1h")
    a = pd.Series([100.0, 200.0, 300.0], index=hours)
    b = pd.Series([150.0, 50.0, 400.0], index=hours)
    grid = pd.date_range(T0, T0 + pd.Timedelta("3h"), freq="5min", inclusive="left")
    end = T0 + pd.Timedelta("3h")
    frame = pd.DataFrame({"A": hold_on_grid(a, grid, end), "B": hold_on_grid(b, grid, end)},
                         index=grid)
    return CarbonSignal(frame, end=end)


@pytest.fixture
def small_signal():
    return make_small_signal()


SMALL_SIGNAL = make_small_signal()  # shared by the hypothesis test (read-only)


def test_hold_on_grid_values(small_signal):
    f = small_signal.frame
    assert len(f) == 36
    # Each hour's value is held for its 12 five-minute steps.
    np.testing.assert_array_equal(f["A"].to_numpy(), np.repeat([100.0, 200.0, 300.0], 12))
    np.testing.assert_array_equal(f["B"].to_numpy(), np.repeat([150.0, 50.0, 400.0], 12))


def test_hold_on_grid_rejects_uncovered_grid():
    s = pd.Series([1.0, 2.0], index=pd.date_range(T0, periods=2, freq="1h"))
    grid = pd.date_range(T0, T0 + pd.Timedelta("3h"), freq="5min", inclusive="left")
    with pytest.raises(CarbonDataError, match="covers"):
        hold_on_grid(s, grid)


def test_at_latest_at_or_before(small_signal):
    sig = small_signal
    h1 = S0 + 3600.0
    np.testing.assert_array_equal(sig.at(h1), [200.0, 50.0])  # exactly at a stamp
    np.testing.assert_array_equal(sig.at(h1 - 1e-3), [100.0, 150.0])  # just before
    np.testing.assert_array_equal(sig.at(h1 + 1e-3), [200.0, 50.0])  # just after
    np.testing.assert_array_equal(sig.at(S0), [100.0, 150.0])  # first instant
    np.testing.assert_array_equal(sig.at(S0 + 3 * 3600 - 1e-3), [300.0, 400.0])  # last instant
    got = sig.at(np.array([S0, h1 - 1.0, h1, S0 + 2 * 3600 + 299.0]))
    assert got.shape == (4, 2)
    np.testing.assert_array_equal(got[:, 0], [100.0, 100.0, 200.0, 300.0])
    assert sig.at_region("B", h1 - 1e-3) == 150.0
    np.testing.assert_array_equal(sig.at_region("B", np.array([h1, h1 + 3600.0])), [50.0, 400.0])


def test_at_with_datetimes(small_signal):
    sig = small_signal
    stamp = np.datetime64("2022-03-01T01:00:00", "ns")
    times = np.array([stamp - np.timedelta64(1, "ns"), stamp, stamp + np.timedelta64(1, "ns")])
    np.testing.assert_array_equal(sig.at(times)[:, 0], [100.0, 200.0, 200.0])
    # tz-aware Timestamp in another zone is converted: 02:00 Vienna (CET) = 01:00 UTC.
    np.testing.assert_array_equal(sig.at(pd.Timestamp("2022-03-01 02:00", tz="Europe/Vienna")),
                                  [200.0, 50.0])
    idx = pd.DatetimeIndex([T0, T0 + timedelta(hours=2)])
    np.testing.assert_array_equal(sig.at(idx)[:, 1], [150.0, 400.0])


def test_at_out_of_range_and_unknown_region(small_signal):
    sig = small_signal
    with pytest.raises(ValueError, match="before"):
        sig.at(S0 - 1e-3)
    with pytest.raises(ValueError, match="covers"):
        sig.at(S0 + 3 * 3600)  # coverage end is exclusive
    with pytest.raises(ValueError, match="covers"):
        sig.at(np.array([S0, S0 + 10 * 3600]))
    with pytest.raises(ValueError):
        sig.at(np.datetime64("2022-02-28T23:59:59", "ns"))
    with pytest.raises(ValueError, match="non-finite"):
        sig.at(np.array([np.nan]))
    with pytest.raises(KeyError, match="unknown region 'C'"):
        sig.at_region("C", S0)


def test_cleanest_region(small_signal):
    sig = small_signal
    times = np.array([S0, S0 + 3600.0, S0 + 7200.0])
    assert list(sig.cleanest_region(times)) == ["A", "B", "A"]
    assert sig.cleanest_region(S0 + 3600.0) == "B"


@settings(max_examples=30, deadline=None)
@given(offset=st.floats(0.0, 3 * 3600 - 1e-3, allow_nan=False))
def test_seconds_and_datetimes_agree(offset):
    small_signal = SMALL_SIGNAL
    # datetime64 at whole microseconds so both representations name the same instant.
    t_ns = int(round((S0 + offset) * 1e6)) * 1000
    by_seconds = small_signal.at(t_ns / 1e9)
    by_datetime = small_signal.at(np.array([t_ns], dtype="datetime64[ns]"))[0]
    np.testing.assert_array_equal(by_seconds, by_datetime)
    # Independent: hour index from arithmetic.
    h = int((t_ns // 10**9 - int(S0)) // 3600)
    assert by_seconds[0] == [100.0, 200.0, 300.0][h]


def test_signal_rejects_bad_frames():
    idx = pd.date_range(T0, periods=3, freq="5min")
    with pytest.raises(CarbonDataError, match="tz-aware"):
        CarbonSignal(pd.DataFrame({"A": [1.0, 2, 3]}, index=idx.tz_localize(None)))
    with pytest.raises(CarbonDataError, match="non-finite"):
        CarbonSignal(pd.DataFrame({"A": [1.0, np.nan, 3]}, index=idx))
    with pytest.raises(CarbonDataError, match="increasing"):
        CarbonSignal(pd.DataFrame({"A": [1.0, 2, 3]}, index=idx[::-1]))


# ---------------------------------------------------------------------------------------------
# config
# ---------------------------------------------------------------------------------------------


def test_config_validation():
    assert CarbonConfig().regions == ("AT", "GB", "BE", "US-CAL-CISO")
    assert CarbonConfig.from_region_set("em-only").regions[0] == "CH"
    with pytest.raises(ValueError, match="divide a day"):
        CarbonConfig(step="7min")
    with pytest.raises(ValueError, match="duplicates"):
        CarbonConfig(regions=("GB", "GB"))
    with pytest.raises(ValueError, match="BE.*2024"):
        CarbonConfig(year=2024)  # BE has Electricity Maps data for 2021-2022 only
    with pytest.raises(ValueError, match="AT"):
        CarbonConfig(at_source_year=2021)
    with pytest.raises(ValueError, match="unknown region set"):
        CarbonConfig.from_region_set("nope")
    assert len(year_grid(2024)) == 366 * 288


# ---------------------------------------------------------------------------------------------
# real data (the mirror)
# ---------------------------------------------------------------------------------------------


def _real_signal(cfg, **kw):
    from carbonrouter_lib.datasets import DataUnavailableError

    try:
        return CarbonSignal.from_config(cfg, **kw)
    except DataUnavailableError as exc:  # no mirror and no network
        pytest.skip(f"carbon data unavailable: {exc}")


def test_real_2022_grid(tmp_path, monkeypatch):
    monkeypatch.setenv("CARBONROUTER_CACHE_DIR", str(tmp_path))
    sig = _real_signal(CarbonConfig())
    f = sig.frame
    assert f.shape == (365 * 288, 4) == (105_120, 4)
    assert not f.isna().any().any()
    assert list(f.columns) == ["AT", "GB", "BE", "US-CAL-CISO"]
    assert sig.provenance["AT"]["shift_weeks"] == 104
    assert sig.provenance["AT"]["filled_steps_end"] == 49 * 4
    # Second build comes from the parquet cache and is identical.
    cached = list((tmp_path / "derived").glob("carbon_signal-*.parquet"))
    assert len(cached) == 1
    again = CarbonSignal.from_config(CarbonConfig())
    pd.testing.assert_frame_equal(again.frame, f)
    assert again.provenance == sig.provenance


def test_row_index_fast_path_equals_searchsorted():
    # The simulator's grid-arithmetic lookup must agree with a plain binary search, including
    # exactly at, just before and just after grid instants.
    idx = pd.date_range("2022-01-03", periods=2000, freq="5min", tz="UTC")
    sig = carbon.CarbonSignal(pd.DataFrame({"A": np.arange(2000.0)}, index=idx))
    stamps = idx.as_unit("ns").asi8 / 1e9
    rng = np.random.default_rng(0)
    times = np.concatenate([
        stamps, np.nextafter(stamps[1:], -np.inf), np.nextafter(stamps, np.inf),
        rng.uniform(stamps[0], stamps[-1] + 300.0 - 1e-6, 5000),
    ])
    expected = np.searchsorted(stamps, times, side="right") - 1
    got = np.array([sig.row_index(float(t)) for t in times])
    np.testing.assert_array_equal(got, expected)
    lo, hi = sig.row_interval(10)
    assert lo == stamps[10] and hi == stamps[11]
    with pytest.raises(ValueError):
        sig.row_index(stamps[0] - 1.0)


def test_signal_rejects_negative_and_non_numeric_intensities():
    idx = pd.date_range("2022-01-01", periods=3, freq="h", tz="UTC")
    with pytest.raises(CarbonDataError, match=r"negative intensity -68.0 gCO2e/kWh at "
                                              r"2022-01-01 01:00:00\+00:00, region GB"):
        CarbonSignal(pd.DataFrame({"GB": [100.0, -68.0, 50.0]}, index=idx))
    with pytest.raises(CarbonDataError, match="values must be numbers"):
        CarbonSignal(pd.DataFrame({"GB": ["100", "x", "50"]}, index=idx))

# ---------------------------------------------------------------------------------------------
# CSV files of one's own: CarbonSignal.from_csv, combine, to_csv
# ---------------------------------------------------------------------------------------------

BYO = __import__("pathlib").Path(__file__).parent / "data" / "byo"


def write_csv(path, header, rows):
    path.write_text("\n".join([header] + [",".join(map(str, r)) for r in rows]) + "\n",
                    encoding="utf-8")
    return path


HOURLY = [("2022-01-03T00:00:00Z", 100), ("2022-01-03T01:00:00Z", 200),
          ("2022-01-03T02:00:00Z", 300), ("2022-01-03T03:00:00Z", 400)]


def test_from_csv_one_region_and_its_provenance(tmp_path):
    path = write_csv(tmp_path / "mine.csv", "datetime,gco2", HOURLY)
    sig = CarbonSignal.from_csv(path, region="Mine")
    assert sig.regions == ("Mine",)
    assert sig.start == pd.Timestamp("2022-01-03T00:00Z") and sig.end == pd.Timestamp(
        "2022-01-03T04:00Z")
    assert sig.at_region("Mine", pd.Timestamp("2022-01-03T02:59Z")) == 300.0
    prov = sig.provenance["Mine"]
    assert prov["file"] == str(path) and prov["column"] == "gco2" and len(prov["sha256"]) == 64
    assert prov["cadence"] == str(pd.Timedelta("1h"))
    # value_column names the column; without region the region is named after it
    assert CarbonSignal.from_csv(path, value_column="gco2").regions == ("gco2",)


def test_from_csv_mapping_of_files_with_different_cadences():
    sig = CarbonSignal.from_csv({"Solaria": BYO / "solaria_hourly.csv",
                                 "Ventosa": BYO / "ventosa_15min.csv"})
    assert sig.regions == ("Solaria", "Ventosa")
    assert len(sig.frame) == 14 * 96  # 15-minute grid over the 14 shared days
    raw = pd.read_csv(BYO / "solaria_hourly.csv")
    # the hourly value is held over its four 15-minute grid rows
    held = sig.frame["Solaria"].to_numpy().reshape(-1, 4)
    assert (held == raw["carbon_intensity"].to_numpy()[:, None]).all()
    raw15 = pd.read_csv(BYO / "ventosa_15min.csv")
    assert (sig.frame["Ventosa"].to_numpy() == raw15["carbon_intensity"].to_numpy()).all()
    assert sig.provenance["Ventosa"]["cadence"] == str(pd.Timedelta("15min"))


def test_from_csv_wide_file_and_region_selection(tmp_path):
    rows = [(t, v, 2 * v, 3 * v) for t, v in HOURLY]
    path = write_csv(tmp_path / "wide.csv", "time,XA,XB,XC", rows)
    sig = CarbonSignal.from_csv(path, time_column="time")
    assert sig.regions == ("XA", "XB", "XC")
    picked = CarbonSignal.from_csv(path, ["XC", "XA"], time_column="time")
    assert picked.regions == ("XC", "XA")
    assert (picked.frame["XC"].to_numpy() == [300, 600, 900, 1200]).all()
    one = CarbonSignal.from_csv(path, "XB", time_column="time")
    assert one.regions == ("XB",) and one.at_region("XB", sig.start) == 200.0


def test_from_csv_long_file(tmp_path):
    rows = [(t, z, v + k) for t, v in HOURLY for k, z in enumerate(("North", "South"))]
    path = write_csv(tmp_path / "long.csv", "datetime,zone,ci", rows)
    sig = CarbonSignal.from_csv(path, region_column="zone")
    assert sig.regions == ("North", "South")
    assert (sig.frame["South"].to_numpy() == [101, 201, 301, 401]).all()
    assert CarbonSignal.from_csv(path, "South", region_column="zone").regions == ("South",)
    with pytest.raises(CarbonDataError, match=r"long\.csv: region\(s\) \['East'\] not in"):
        CarbonSignal.from_csv(path, ["East"], region_column="zone")


def test_from_csv_long_file_names_the_file_line(tmp_path):
    rows = [(t, z, v) for t, v in HOURLY for z in ("North", "South")]
    rows[5] = (rows[5][0], "South", -3)  # line 7 of the file: South at 02:00
    path = write_csv(tmp_path / "long.csv", "datetime,zone,ci", rows)
    with pytest.raises(CarbonDataError, match=r"long\.csv: line 7 .*negative intensity -3"):
        CarbonSignal.from_csv(path, region_column="zone")


def test_from_csv_time_zones(tmp_path):
    # naive local stamps of a zone are converted to UTC (Berlin is UTC+1 in January)
    local = [(f"2022-01-03 0{h}:00", v) for h, (_, v) in enumerate(HOURLY)]
    path = write_csv(tmp_path / "berlin.csv", "datetime,ci", local)
    sig = CarbonSignal.from_csv(path, "DE-like", tz="Europe/Berlin")
    assert sig.start == pd.Timestamp("2022-01-02T23:00Z")
    # explicit offsets are converted, whatever tz says about naive stamps
    offs = [(f"2022-01-03T0{h}:00+05:30", v) for h, (_, v) in enumerate(HOURLY)]
    sig = CarbonSignal.from_csv(write_csv(tmp_path / "ist.csv", "datetime,ci", offs), "IN-like")
    assert sig.start == pd.Timestamp("2022-01-02T18:30Z") and len(sig.frame) == 4
    # the autumn repeat of 02:00 in order is two different hours
    autumn = [("2022-10-30 01:00", 1), ("2022-10-30 02:00", 2), ("2022-10-30 02:00", 3),
              ("2022-10-30 03:00", 4)]
    sig = CarbonSignal.from_csv(write_csv(tmp_path / "autumn.csv", "datetime,ci", autumn),
                                "X", tz="Europe/Berlin")
    assert len(sig.frame) == 4 and sig.start == pd.Timestamp("2022-10-29T23:00Z")


BAD_BYO = [
    ("gap", [HOURLY[0], HOURLY[1], HOURLY[3]], {}, ["gap before line 4", "cadence is"]),
    ("duplicate", [HOURLY[0], HOURLY[1], HOURLY[1], HOURLY[2]], {},
     ["duplicated timestamp", "[3, 4]"]),
    ("negative", _replace(HOURLY, 2, value=-1), {}, ["line 4", "negative intensity -1"]),
    ("non-numeric", _replace(HOURLY, 1, value="high"), {}, ["line 3", "non-numeric", "'high'"]),
    ("missing value", _replace(HOURLY, 1, value=""), {}, ["line 3", "missing value"]),
    ("unparseable stamp", _replace(HOURLY, 0, stamp="Monday"), {}, ["line 2", "unparseable"]),
    ("decreasing", [HOURLY[0], HOURLY[2], HOURLY[1], HOURLY[3]], {}, ["line 4", "earlier"]),
    ("unknown zone", HOURLY, {"tz": "Mars/Olympus"}, ["unknown time zone 'Mars/Olympus'"]),
    ("DST gap", [("2022-03-27 01:00", 1), ("2022-03-27 02:00", 2), ("2022-03-27 03:00", 3)],
     {"tz": "Europe/Berlin"}, ["line 3", "does not exist", "Europe/Berlin"]),
    ("wrong cadence", HOURLY, {"cadence": "15min"}, ["gap before line 3"]),
]


@pytest.mark.parametrize("rows,kwargs,words", [c[1:] for c in BAD_BYO],
                         ids=[c[0] for c in BAD_BYO])
def test_from_csv_bad_files(tmp_path, rows, kwargs, words):
    path = write_csv(tmp_path / "bad_mine.csv", "datetime,ci", rows)
    with pytest.raises(CarbonDataError) as err:
        CarbonSignal.from_csv(path, "Mine", **kwargs)
    msg = str(err.value)
    assert "bad_mine.csv" in msg
    for w in words:
        assert w in msg, (w, msg)


def test_from_csv_bad_requests(tmp_path):
    two = write_csv(tmp_path / "two.csv", "datetime,a,b", [(t, v, v) for t, v in HOURLY])
    with pytest.raises(CarbonDataError, match=r"two\.csv: cannot tell the value column"):
        CarbonSignal.from_csv({"X": two})
    with pytest.raises(CarbonDataError, match=r"two\.csv: need a time column .when."):
        CarbonSignal.from_csv(two, time_column="when")
    with pytest.raises(CarbonDataError, match="leave region and region_column unset"):
        CarbonSignal.from_csv({"X": two}, region="X")
    with pytest.raises(FileNotFoundError):
        CarbonSignal.from_csv(tmp_path / "absent.csv", "X")
    later = write_csv(tmp_path / "later.csv", "datetime,ci",
                      [(t.replace("01-03", "01-05"), v) for t, v in HOURLY])
    one = write_csv(tmp_path / "one.csv", "datetime,ci", HOURLY)
    with pytest.raises(CarbonDataError, match="share no period"):
        CarbonSignal.from_csv({"A": one, "B": later})
    with pytest.raises(CarbonDataError, match="does not keep the stamps of region 'A'"):
        CarbonSignal.from_csv({"A": one}, step="25min")


def test_to_csv_round_trip_and_combine(tmp_path):
    sig = CarbonSignal.from_csv({"Solaria": BYO / "solaria_hourly.csv",
                                 "Ventosa": BYO / "ventosa_15min.csv"})
    back = CarbonSignal.from_csv(sig.to_csv(tmp_path / "signal.csv"))
    pd.testing.assert_frame_equal(back.frame, sig.frame)
    assert back.end == sig.end
    a = CarbonSignal.from_csv(BYO / "solaria_hourly.csv", "Solaria")
    b = CarbonSignal.from_csv(BYO / "ventosa_15min.csv", "Ventosa")
    both = CarbonSignal.combine(a, b)
    pd.testing.assert_frame_equal(both.frame, sig.frame)
    assert both.provenance["Solaria"]["file"].endswith("solaria_hourly.csv")
    with pytest.raises(CarbonDataError, match="region 'Solaria' is in more than one signal"):
        CarbonSignal.combine(a, a)


def test_from_csv_more_bad_requests(tmp_path):
    one = write_csv(tmp_path / "one.csv", "datetime,ci", HOURLY)
    long = write_csv(tmp_path / "long.csv", "datetime,zone,ci",
                     [(t, "", v) if i == 2 else (t, "N", v) for i, (t, v) in enumerate(HOURLY)])
    autumn = write_csv(tmp_path / "autumn.csv", "datetime,ci",
                       [("2022-10-30 01:00", 1), ("2022-10-30 02:00", 2),
                        ("2022-10-30 03:00", 3), ("2022-10-30 02:00", 4)])
    cases = [
        (lambda: CarbonSignal.from_csv({}), "mapping is empty"),
        (lambda: CarbonSignal.from_csv({"": one}), "region names must be non-empty strings"),
        (lambda: CarbonSignal.from_csv(one, ["ci", "ci"]), "region 'ci' is given twice"),
        (lambda: CarbonSignal.from_csv(one, ["A", "B"], value_column="ci"),
         "give one region name"),
        (lambda: CarbonSignal.from_csv(long, region_column="zone"),
         r"long\.csv: line 4: empty region in column 'zone'"),
        (lambda: CarbonSignal.from_csv(autumn, "X", tz="Europe/Berlin"),
         r"autumn\.csv: line .*ambiguous"),
        (lambda: CarbonSignal.from_csv(one, "X", step="1ns"), "pass a coarser step"),
        (lambda: CarbonSignal.combine(), "no signals given"),
    ]
    for call, words in cases:
        with pytest.raises(CarbonDataError, match=words):
            call()
