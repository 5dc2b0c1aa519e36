"""Carbon forecasts: hand-built signals with known answers, no reading of the future, and the
fitted blend on the real signal."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from carbonrouter_lib import forecast
from carbonrouter_lib.carbon import CarbonSignal

STEP = pd.Timedelta("1h")


def hourly(values: dict[str, np.ndarray], start: str = "2022-01-01") -> CarbonSignal:
    n = len(next(iter(values.values())))
    idx = pd.date_range(start, periods=n, freq=STEP, tz="UTC")
    return CarbonSignal(pd.DataFrame(values, index=idx))


def test_persistence_and_same_hour_yesterday_by_hand():
    v = np.arange(24 * 5, dtype=float)  # hour h has value h
    sig = hourly({"A": v, "B": 1000 - v})
    p, y = forecast.Persistence(sig), forecast.SameHourYesterday(sig)
    assert y.day_steps == 24
    row = 50  # day 2, 02:00
    leads = np.array([0, 1, 5, 24, 25, 48])
    np.testing.assert_array_equal(p.predict(row, leads), [[50.0] * 6, [950.0] * 6])
    # lead 1 → target hour 51, same hour one day earlier: 27; lead 24 → 50; 25 → 51 − 48 = 3
    np.testing.assert_array_equal(y.predict(row, leads)[0], [50, 27, 31, 50, 27, 50])
    np.testing.assert_array_equal(p.leads([0, 1800, 3600, 5400]), [0, 0, 1, 2])


def test_blend_learns_the_daily_cycle_and_clips_its_weights():
    hours = np.arange(24 * 40)
    daily = 200 + 100 * np.sin(2 * np.pi * hours / 24)  # a pure daily cycle: yesterday is exact
    flat = np.full(len(hours), 300.0)
    sig = hourly({"A": daily, "B": flat})
    b = forecast.Blend(sig, fit_days=28, max_lead_steps=30)
    w = b.weights(24 * 35)
    seasonal = np.arange(31) % 24 != 0  # at whole days the two forecasts are the same value
    assert np.allclose(w[0, seasonal], 1.0)  # region A: the seasonal forecast is perfect
    assert np.allclose(w[1], 0.0)      # region B: no signal, weight 0
    row = 24 * 36 + 3
    np.testing.assert_allclose(b.predict(row, np.array([5, 40]))[0], daily[[row + 5, row + 40]])
    # the first day has no history to fit on: persistence
    np.testing.assert_array_equal(b.predict(3, np.array([5]))[0], [daily[3]])


def test_blend_fits_only_the_leads_asked_for_with_the_values_of_fitting_all():
    rng = np.random.default_rng(3)
    v = rng.uniform(50, 500, size=(24 * 40, 2))
    day = 24 * 35

    def blend():  # each signal object has its own fits
        return forecast.Blend(hourly({"A": v[:, 0], "B": v[:, 1]}), fit_days=28,
                              max_lead_steps=30)

    lazy = blend()
    rows, leads = np.array([day + 2, day + 9]), np.array([3, 7, 70])
    some = lazy.predict_rows(rows, leads)
    fits = next(iter(forecast._BLEND_FITS[lazy.signal].values()))
    assert sorted(np.flatnonzero(fits[day][1]).tolist()) == [0, 3, 7, 30]  # 70 uses max_lead's
    full = blend()
    w = full.weights(day)
    np.testing.assert_array_equal(lazy.weights(day), w)
    np.testing.assert_array_equal(some, full.predict_rows(rows, leads))
    # lead 7 by hand: least squares of (target − now) on (same hour yesterday − now), per region
    origins = np.arange(day - 28 * 24, day - 7)
    x, y = v[origins + 7 - 24] - v[origins], v[origins + 7] - v[origins]
    np.testing.assert_allclose(w[:, 7], np.clip((x * y).sum(0) / (x * x).sum(0), 0, 1), rtol=1e-12)


@pytest.mark.parametrize("name", forecast.FORECASTERS)
def test_forecasts_never_read_after_their_row(name):
    rng = np.random.default_rng(1)
    v = rng.uniform(50, 500, size=(24 * 45, 2))
    sig = hourly({"A": v[:, 0], "B": v[:, 1]})
    f = forecast.make_forecaster(name, sig)
    row, leads = 24 * 41 + 7, np.array([0, 1, 3, 12, 30, 70])
    before = f.predict(row, leads)
    # change every value after the forecast's row: the forecast does not move
    w = v.copy()
    w[row + 1:] = rng.uniform(50, 500, size=w[row + 1:].shape)
    g = forecast.make_forecaster(name, hourly({"A": w[:, 0], "B": w[:, 1]}))
    np.testing.assert_array_equal(g.predict(row, leads), before)


def test_forecast_errors_on_the_real_signal():
    sig = CarbonSignal.from_config()
    start = pd.Timestamp("2022-01-03", tz="UTC").timestamp()
    errs = pd.concat([forecast.forecast_errors(forecast.make_forecaster(n, sig), start,
                                               start + 7 * 86400, lead_hours=(1, 12))
                      for n in forecast.FORECASTERS])
    mae = errs.groupby(["forecaster", "lead_h"])["mae_g_per_kwh"].mean()
    # persistence is near-perfect one hour ahead and degrades with the lead
    assert mae[("persistence", 1.0)] < mae[("persistence", 12.0)]
    # the blend, fitted on the days before, is never worse than both of its parts
    for lead in (1.0, 12.0):
        assert mae[("blend", lead)] <= max(mae[("persistence", lead)],
                                           mae[("same-hour-yesterday", lead)]) + 1e-9
    with pytest.raises(KeyError, match="unknown forecaster"):
        forecast.make_forecaster("oracle", sig)


@pytest.mark.parametrize("name", forecast.FORECASTERS)
def test_predict_rows_equals_predict_row_by_row(name):
    # predict_rows precomputes the horizon router's forecasts for its compiled loop: it must
    # give exactly predict's values, row by row, over several days (several blend fits)
    rng = np.random.default_rng(0)
    hours = 24 * 12
    sig = hourly({"A": rng.uniform(50, 500, hours), "B": rng.uniform(50, 500, hours)})
    fc = forecast.make_forecaster(name, sig)
    rows = np.array([0, 1, 5, 23, 24, 25, 47, 100, 200, hours - 1])
    for leads in (np.array([1, 2, 3, 30]), np.array([0, 24, 25, 49, 400])):
        got = fc.predict_rows(rows, leads)
        want = np.stack([fc.predict(int(r), leads) for r in rows])
        assert got.shape == (len(rows), 2, len(leads))
        np.testing.assert_array_equal(got, want)


def test_the_clairvoyant_reference_reads_the_future():
    # not a forecast (not in FORECASTERS): the value that will be in force at each lead, the
    # last row's beyond the signal
    assert "clairvoyant" not in forecast.FORECASTERS
    v = np.arange(24 * 3, dtype=float)
    c = forecast.make_forecaster("clairvoyant", hourly({"A": v, "B": 2 * v}))
    assert c.name in forecast.REFERENCE_FORECASTERS
    np.testing.assert_array_equal(c.predict(10, np.array([0, 1, 30, 100])),
                                  [[10, 11, 40, 71], [20, 22, 80, 142]])
    rows, leads = np.array([0, 5, 70]), np.array([2, 3])
    np.testing.assert_array_equal(c.predict_rows(rows, leads),
                                  np.stack([c.predict(int(r), leads) for r in rows]))
