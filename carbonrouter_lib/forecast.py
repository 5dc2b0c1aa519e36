"""Carbon-intensity forecasts made at a time from the data up to that time.

A router that prices the *rest* of a session needs the intensity of every region over the next
hours. A forecaster made at time ``now`` may read the signal at times ≤ ``now`` only — the
history a live service has — and predicts the intensity ``lead`` grid steps ahead. Three kinds,
each behind :class:`Forecaster` (``predict(row, leads) -> (n_regions, len(leads))``):

- :class:`Persistence` — the current value: I(now + ℓ) = I(now).
- :class:`SameHourYesterday` — the value at the same time of day on the latest day that is
  already known: I(now + ℓ − 24 h · ⌈ℓ / 24 h⌉) (seasonal naive; ℓ ≤ 0 gives the current value).
- :class:`Blend` — a small model fitted on past weeks: per region and lead, I(now) + w_ℓ ·
  (same-hour-yesterday − I(now)), with the weight w_ℓ ∈ [0, 1] that minimizes the squared error
  over the ``fit_days`` days before the current day (refitted each day from the forecasts whose
  targets are already known; persistence until a day of history exists).

One more is not a forecast: :class:`Clairvoyant` reads the signal *after* ``now`` — the value
that will be in force at each lead (:data:`REFERENCE_FORECASTERS`). It is for references only:
how much of the clairvoyant bound's possible saving a router would reach if it knew the future
intensities (docs/evidence/told.py); no online policy may use it.

Forecasts are made on the signal's grid (5-minute steps, values held over a step): the time
``now`` enters as its grid row and a lead as a whole number of steps, so a forecaster can be
cached per row. :func:`forecast_errors` measures a forecaster's error by lead on a span of the
signal. Units: gCO2e/kWh, steps of the signal's grid, seconds.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence

import numpy as np
import pandas as pd

from carbonrouter_lib.carbon import CarbonSignal

__all__ = ["FORECASTERS", "REFERENCE_FORECASTERS", "Forecaster", "Persistence",
           "SameHourYesterday", "Blend", "Clairvoyant", "make_forecaster", "forecast_errors"]

_DAY_S = 86_400.0


class Forecaster:
    """Forecasts of every region's intensity from the data up to a grid row (see the module).

    Parameters
    ----------
    signal
        The carbon signal (only its rows ≤ the forecast's row are read).
    """

    name = ""

    def __init__(self, signal: CarbonSignal) -> None:
        t = signal.frame.index.asi8 / 1e9
        steps = np.diff(t)
        if len(steps) == 0 or not np.allclose(steps, steps[0]):
            raise ValueError("Forecaster: the signal must be on a regular grid")
        self.signal = signal
        self.step_s = float(steps[0])
        self.day_steps = int(round(_DAY_S / self.step_s))
        self._values = signal.frame.to_numpy(np.float64)

    def row(self, t: float) -> int:
        """The grid row in force at ``t`` (s since the Unix epoch)."""
        return self.signal.row_index(t)

    def leads(self, lead_s: Sequence[float] | np.ndarray) -> np.ndarray:
        """Leads in seconds as whole grid steps (nearest, ≥ 0)."""
        return np.maximum(np.rint(np.asarray(lead_s, np.float64) / self.step_s), 0).astype(
            np.int64)

    def predict(self, row: int, leads: np.ndarray) -> np.ndarray:
        """Forecast made at grid row ``row`` for ``leads`` steps ahead: (n_regions, len(leads)),
        gCO2e/kWh, reading rows ≤ ``row`` only."""
        raise NotImplementedError

    def predict_rows(self, rows: np.ndarray, leads: np.ndarray) -> np.ndarray:
        """:meth:`predict` for many forecast rows at once: (len(rows), n_regions, len(leads)),
        the same values (the horizon router's compiled loop precomputes its forecasts so)."""
        return np.stack([self.predict(int(r), leads) for r in rows]) if len(rows) else (
            np.empty((0, self._values.shape[1], len(leads))))

    def _past(self, rows: np.ndarray, row: int) -> np.ndarray:
        """Values (n_regions, len(rows)) at rows that must not be after ``row``."""
        if np.any(rows > row):
            raise AssertionError("a forecast read the future")  # guards the implementations
        return self._values[np.maximum(rows, 0)].T

    def _yesterday_rows(self, row: int, leads: np.ndarray) -> np.ndarray:
        days = np.where(leads > 0, -(-leads // self.day_steps), 0)
        return row + leads - days * self.day_steps


class Persistence(Forecaster):
    """I(now + ℓ) = I(now)."""

    name = "persistence"

    def predict(self, row: int, leads: np.ndarray) -> np.ndarray:
        return np.repeat(self._past(np.array([row]), row), len(leads), axis=1)

    def predict_rows(self, rows: np.ndarray, leads: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, np.int64)
        return np.repeat(self._values[rows][:, :, None], len(leads), axis=2)


class SameHourYesterday(Forecaster):
    """I(now + ℓ) = I at the same time of day on the latest day already known."""

    name = "same-hour-yesterday"

    def predict(self, row: int, leads: np.ndarray) -> np.ndarray:
        return self._past(self._yesterday_rows(row, np.asarray(leads)), row)

    def predict_rows(self, rows: np.ndarray, leads: np.ndarray) -> np.ndarray:
        return _yesterday_values(self, np.asarray(rows, np.int64), np.asarray(leads))


class Blend(Forecaster):
    """I(now) + w_ℓ,r · (same-hour-yesterday − I(now)), per region r and lead ℓ, with w fitted by
    least squares (clipped to [0, 1]) on the ``fit_days`` days before the forecast's day — only
    on forecasts whose targets are before that day's start, so it reads the past only; refitted
    once a day (cached). Leads beyond ``max_lead_steps`` use the last weight; with less than a day
    of history w = 0 (persistence)."""

    name = "blend"

    def __init__(self, signal: CarbonSignal, fit_days: float = 28.0,
                 max_lead_steps: int = 288) -> None:
        super().__init__(signal)
        self.fit_steps = int(round(fit_days * self.day_steps))
        self.max_lead = int(max_lead_steps)
        # The fits depend only on the signal and these settings: shared by every Blend of the
        # same signal (each replay of a horizon router makes one; the fits are its fixed cost).
        # Per day: the weights and which leads are fitted — a lead's weight is its own least
        # squares, so only the leads asked for are fitted (a horizon router asks for J per fold,
        # not all max_lead), with the same values as fitting them all.
        per_signal = _BLEND_FITS.setdefault(signal, {})
        self._fits: dict[int, tuple[np.ndarray, np.ndarray]] = per_signal.setdefault(
            (self.fit_steps, self.max_lead), {})
        # per vector of leads asked for (its bytes): the offsets of yesterday's rows and the
        # leads' weights per day, so that a forecast made every grid row costs a few operations
        self._plans: dict[bytes, tuple[np.ndarray, np.ndarray, dict[int, np.ndarray]]] = {}

    def weights(self, day_start: int) -> np.ndarray:
        """(n_regions, max_lead + 1) weights fitted on the rows before ``day_start``."""
        return self._weights_at(day_start, np.arange(self.max_lead + 1))

    def _weights_at(self, day_start: int, cols: np.ndarray) -> np.ndarray:
        """The weights of leads ``cols`` (≤ max_lead): (n_regions, len(cols)), fitting those not
        fitted yet for this day."""
        fit = self._fits.get(day_start)
        if fit is None:
            fit = (np.zeros((self._values.shape[1], self.max_lead + 1)),
                   np.zeros(self.max_lead + 1, bool))
            fit[1][0] = True  # lead 0: the current value, weight 0
            self._fits[day_start] = fit
        w, done = fit
        todo = np.unique(cols)
        todo = todo[~done[todo]]
        if len(todo):
            v = self._values[:day_start]  # the fit reads nothing at or after the day's start
            start = max(0, day_start - self.fit_steps)
            for lead in todo.tolist():
                days = -(-lead // self.day_steps)
                first = max(start, days * self.day_steps - lead)
                origins = np.arange(first, day_start - lead)
                if len(origins) >= 2:
                    now = v[origins]
                    x = v[origins + lead - days * self.day_steps] - now
                    y = v[origins + lead] - now
                    den = (x * x).sum(axis=0)
                    with np.errstate(invalid="ignore", divide="ignore"):
                        w[:, lead] = np.clip(np.where(den > 0, (x * y).sum(axis=0) / den, 0.0),
                                             0, 1)
                done[lead] = True
        return w[:, cols]

    def predict(self, row: int, leads: np.ndarray) -> np.ndarray:
        leads = np.asarray(leads, np.int64)
        key = leads.tobytes()
        plan = self._plans.get(key)
        if plan is None:  # per vector of leads: yesterday's rows as offsets, the weights per day
            past = self._yesterday_rows(0, leads)
            if np.any(past > 0):
                raise AssertionError("a forecast read the future")
            plan = self._plans[key] = (past, np.minimum(leads, self.max_lead), {})
        past, cols, per_day = plan
        day = row - row % self.day_steps
        w = per_day.get(day)
        if w is None:
            w = per_day[day] = self._weights_at(day, cols)
        now = self._values[max(row, 0)][:, None]
        yday = self._values[np.maximum(row + past, 0)].T
        return now + w * (yday - now)

    def predict_rows(self, rows: np.ndarray, leads: np.ndarray) -> np.ndarray:
        rows, leads = np.asarray(rows, np.int64), np.asarray(leads)
        now = self._values[rows][:, :, None]
        yday = _yesterday_values(self, rows, leads)
        day = rows - rows % self.day_steps
        w = np.empty_like(yday)
        cols = np.minimum(leads, self.max_lead)
        for d in np.unique(day):
            w[day == d] = self._weights_at(int(d), cols)
        return now + w * (yday - now)


class Clairvoyant(Forecaster):
    """I(now + ℓ) as it will be: the signal at row + ℓ (the last row beyond the signal's end).
    Not a forecast — it reads the future — so only for references (the module docstring)."""

    name = "clairvoyant"

    def predict(self, row: int, leads: np.ndarray) -> np.ndarray:
        return self.predict_rows(np.array([row]), leads)[0]

    def predict_rows(self, rows: np.ndarray, leads: np.ndarray) -> np.ndarray:
        at = np.minimum(np.asarray(rows, np.int64)[:, None] + np.asarray(leads, np.int64)[None],
                        len(self._values) - 1)
        return self._values[at].transpose(0, 2, 1)


def _yesterday_values(fc: Forecaster, rows: np.ndarray, leads: np.ndarray) -> np.ndarray:
    """Values (len(rows), n_regions, len(leads)) at the same time of day on the latest day
    known at each row (:meth:`Forecaster._yesterday_rows`, which never reads after the row)."""
    past = fc._yesterday_rows(0, leads)  # offsets ≤ 0 from the forecast's row
    if np.any(past > 0):
        raise AssertionError("a forecast read the future")
    at = np.maximum(rows[:, None] + past[None, :], 0)
    return fc._values[at].transpose(0, 2, 1)


#: Blend fits per signal (weakly held: they go with the signal), then per (fit_steps,
#: max_lead): {day_start: (weights, fitted leads)}.
_BLEND_FITS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

#: Forecaster names (:func:`make_forecaster`).
FORECASTERS: tuple[str, ...] = ("persistence", "same-hour-yesterday", "blend")
#: Forecasters that read the future (:class:`Clairvoyant`): references, never an online policy's.
REFERENCE_FORECASTERS: tuple[str, ...] = ("clairvoyant",)


def make_forecaster(name: str, signal: CarbonSignal) -> Forecaster:
    """The forecaster ``name`` (:data:`FORECASTERS`, or :data:`REFERENCE_FORECASTERS` for a
    reference) on ``signal``."""
    kinds = {"persistence": Persistence, "same-hour-yesterday": SameHourYesterday,
             "blend": Blend, "clairvoyant": Clairvoyant}
    if name not in kinds:
        raise KeyError(f"unknown forecaster {name!r}; one of "
                       f"{FORECASTERS + REFERENCE_FORECASTERS}")
    return kinds[name](signal)


def forecast_errors(forecaster: Forecaster, start: float, end: float,
                    lead_hours: Sequence[float] = (0.5, 1, 2, 4, 8, 12, 24),
                    every_s: float = 3600.0) -> pd.DataFrame:
    """Mean absolute error (gCO2e/kWh) and error relative to the mean intensity, per region and
    lead, of forecasts made every ``every_s`` seconds in [start, end) (s since the Unix epoch),
    each scored against the signal at its target time."""
    leads = forecaster.leads(np.asarray(lead_hours) * 3600.0)
    rows = []
    origins = np.arange(start, end, every_s)
    n_rows = len(forecaster._values)
    errs = np.zeros((len(forecaster.signal.regions), len(leads)))
    count = np.zeros(len(leads))
    level = np.zeros(len(forecaster.signal.regions))
    for t in origins:
        r = forecaster.row(float(t))
        fc = forecaster.predict(r, leads)
        ok = r + leads < n_rows
        target = forecaster._values[np.minimum(r + leads, n_rows - 1)].T
        errs[:, ok] += np.abs(fc - target)[:, ok]
        count[ok] += 1
        level += forecaster._values[r]
    level /= max(len(origins), 1)
    for i, region in enumerate(forecaster.signal.regions):
        for j, h in enumerate(lead_hours):
            mae = errs[i, j] / count[j] if count[j] else math.nan
            rows.append({"forecaster": forecaster.name, "region": region, "lead_h": float(h),
                         "mae_g_per_kwh": mae, "relative_mae": mae / level[i]})
    return pd.DataFrame(rows)
