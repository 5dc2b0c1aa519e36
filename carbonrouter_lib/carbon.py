"""Grid carbon intensity CI_r(t) (gCO2e/kWh) per region, on a regular 5-minute grid.

The paper routes each query by the carbon intensity of every region at the query's arrival time
(``docs/model.md`` §1–§2; Eq. 5). This module turns the mirrored data into that signal; the paper's
Section-2 statistics of it (Figure 1) are in :mod:`carbonrouter_lib.motivation`.

Sources (``docs/model.md`` §8a, data README ``carbon/``):

- Electricity Maps hourly exports (GB, US-CAL-CISO 2021–2024; BE, CH, DE, FR, NL, PL 2021–2022):
  consumption-based life-cycle (LCA) intensity; each stamp is the start of its hour (UTC).
- ENTSO-E-derived series (AT 15-minute, BE hourly, 2017–2020): production-based LCA intensity
  (ignores imports, so cleaner than a consumption-based figure). No Electricity Maps series exists
  here for AT, so AT comes from this file for ``at_source_year`` (default 2020), moved onto the
  carbon year by a whole number of weeks (:func:`shift_by_weeks`) so weekdays match.

Step-hold: every source value (hourly or 15-minute) is the intensity of the interval that starts
at its stamp, so on the 5-minute grid it is held constant until the next source stamp. The signal
answers "latest grid value at or before t" (:meth:`CarbonSignal.at`).

Units: intensities in gCO2e/kWh; times in UTC; the simulator's time axis is float64 seconds since
the Unix epoch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from os import PathLike
from pathlib import Path

import numpy as np
import pandas as pd

__all__ = [
    "CarbonConfig",
    "CarbonDataError",
    "CarbonSignal",
    "EM_LCA_COLUMN",
    "EM_TIME_COLUMN",
    "ENTSOE_LCA_COLUMN",
    "ENTSOE_TIME_COLUMN",
    "REGION_SETS",
    "ShiftedSeries",
    "electricitymaps_name",
    "entsoe_name",
    "hold_on_grid",
    "load_electricitymaps_csv",
    "load_entsoe_csv",
    "shift_by_weeks",
    "year_grid",
]

EM_TIME_COLUMN = "Datetime (UTC)"
EM_LCA_COLUMN = "Carbon Intensity gCO₂eq/kWh (LCA)"
ENTSOE_TIME_COLUMN = "datetime_utc"
ENTSOE_LCA_COLUMN = "ci_lca_gco2eq_per_kwh"

WEEK = pd.Timedelta(weeks=1)
#: Whole weeks that :func:`shift_by_weeks` wraps by when the shifted source leaves a gap at an end
#: of the target year (52 weeks = 364 days keeps the weekday and the season).
WRAP_WEEKS = 52

#: Region sets (docs/model.md §2, §8a). "paper": the paper's four regions, AT from ENTSO-E
#: (production-based); "em-only": CH (Electricity Maps, same method as the others) in place of AT.
REGION_SETS: dict[str, tuple[str, ...]] = {
    "paper": ("AT", "GB", "BE", "US-CAL-CISO"),
    "em-only": ("CH", "GB", "BE", "US-CAL-CISO"),
}


class CarbonDataError(ValueError):
    """A carbon-intensity file or frame is malformed; the message names the file and row/stamp."""


# --------------------------------------------------------------------------------------------
# Registry names
# --------------------------------------------------------------------------------------------


def electricitymaps_name(zone: str, year: int) -> str:
    """Registry name of an Electricity Maps hourly export, e.g. ``GB_2022_hourly.csv``."""
    return f"carbon/electricitymaps/{zone}_{year}_hourly.csv"


def entsoe_name(zone: str, year: int) -> str:
    """Registry name of the ENTSO-E-derived series of ``zone`` for ``year`` (any cadence).

    Raises
    ------
    KeyError
        No such file is registered; the message lists the registered ENTSO-E-derived files.
    """
    from carbonrouter_lib.datasets import REGISTRY

    pattern = re.compile(
        rf"^carbon/entsoe_derived/{re.escape(zone)}_{year}_\d+min_lca_entsoe\.csv$"
    )
    found = sorted(n for n in REGISTRY if pattern.match(n))
    if len(found) != 1:
        have = sorted(n.rsplit("/", 1)[-1] for n in REGISTRY if "entsoe_derived/" in n)
        raise KeyError(f"no unique ENTSO-E-derived file for {zone} {year}; registered: {have}")
    return found[0]


# --------------------------------------------------------------------------------------------
# Loaders and validation
# --------------------------------------------------------------------------------------------

# ISO-like stamp with an optional zone designator: 2022-01-01 00:00:00, 2019-12-31T23:00:00Z,
# 2022-01-01T00:00:00+01:00.
_STAMP_RE = re.compile(
    r"^\s*(?P<base>\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?)"
    r"\s*(?P<tz>Z|[+-]\d{2}:?\d{2})?\s*$"
)
_UTC_DESIGNATORS = {"Z", "+00:00", "+0000", "-00:00", "-0000"}


def _line(i: int, lines: np.ndarray | None = None) -> int:
    """File line number of data row ``i`` (0-based): ``lines[i]`` when given (a subset of a
    file's rows), else ``i + 2`` (line 1 is the header)."""
    return int(lines[i]) if lines is not None else i + 2


def _read_header(path: Path) -> list[str]:
    try:
        return list(pd.read_csv(path, nrows=0, encoding="utf-8-sig").columns)
    except FileNotFoundError:
        raise
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise CarbonDataError(f"{path}: cannot read a CSV header ({exc})") from exc


def _read_columns(path: Path, time_col: str, *value_cols: str) -> pd.DataFrame:
    header = _read_header(path)
    missing = [c for c in (time_col, *value_cols) if c not in header]
    if missing:
        raise CarbonDataError(f"{path}: missing column(s) {missing}; columns are {header}")
    # Read as text: the numeric and timestamp checks below must see what the file really says.
    df = pd.read_csv(path, usecols=[time_col, *value_cols], dtype=str, encoding="utf-8-sig")
    if len(df) < 2:
        raise CarbonDataError(f"{path}: {len(df)} data row(s); need at least 2 to know the cadence")
    return df


def _zone(path: Path, zone: str):
    """The IANA time zone ``zone`` (``"UTC"`` included), or an error naming the file."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        return ZoneInfo(str(zone))
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise CarbonDataError(
            f"{path}: unknown time zone {zone!r}; give an IANA name such as 'UTC' or "
            f"'Europe/Berlin'"
        ) from None


def _localize(path: Path, raw: pd.Series, base: pd.Series, naive: np.ndarray, zone: str,
              lines: np.ndarray | None) -> np.ndarray:
    """int64 ns UTC of the naive stamps ``base[naive]`` read as local times of ``zone``; a local
    time that does not exist (spring DST gap) or cannot be told apart (autumn repeat, when the
    order does not settle it) is an error naming its line."""
    tzinfo = _zone(path, zone)
    local = pd.DatetimeIndex(pd.to_datetime(base[naive], format="ISO8601"))
    try:
        return local.tz_localize(tzinfo, ambiguous="infer", nonexistent="raise").as_unit(
            "ns").asi8
    except (ValueError, OverflowError):
        probe = local.tz_localize(tzinfo, ambiguous=np.ones(len(local), bool), nonexistent="NaT")
        rows = np.flatnonzero(naive)
        if probe.isna().any():
            i = int(rows[np.flatnonzero(probe.isna())[0]])
            what = "does not exist (daylight-saving gap)"
        else:
            i = int(rows[np.flatnonzero(local.tz_localize(tzinfo, ambiguous="NaT").isna())[0]])
            what = "is ambiguous (daylight-saving repeat not in order)"
        raise CarbonDataError(f"{path}: line {_line(i, lines)}: local time {raw.iloc[i]!r} "
                              f"{what} in time zone {zone!r}") from None


def _parse_stamps(path: Path, raw: pd.Series, naive_is_utc: bool, *,
                  zone: str | None = None, lines: np.ndarray | None = None) -> pd.DatetimeIndex:
    """Parse ISO stamps to a UTC index.

    ``zone`` None (the mirrored exports): reject offsets other than UTC, and naive stamps unless
    ``naive_is_utc``. ``zone`` an IANA name (files of one's own): naive stamps are local times of
    ``zone``; stamps with an offset are converted to UTC.
    """
    if raw.isna().any():
        i = int(np.flatnonzero(raw.isna().to_numpy())[0])
        raise CarbonDataError(f"{path}: line {_line(i, lines)}: empty timestamp")
    parts = raw.str.extract(_STAMP_RE)
    bad = parts["base"].isna().to_numpy()
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise CarbonDataError(
            f"{path}: line {_line(i, lines)}: unparseable timestamp {raw.iloc[i]!r}")
    tz = parts["tz"]
    naive = tz.isna().to_numpy()
    if zone is not None:
        try:
            ns = np.empty(len(raw), np.int64)
            if (~naive).any():
                ns[~naive] = pd.DatetimeIndex(pd.to_datetime(
                    raw[~naive].str.strip(), format="ISO8601", utc=True)).as_unit("ns").asi8
            if naive.any():
                ns[naive] = _localize(path, raw, parts["base"], naive, zone, lines)
        except (ValueError, OverflowError) as exc:
            if isinstance(exc, CarbonDataError):
                raise
            raise CarbonDataError(f"{path}: invalid timestamp ({exc})") from exc
        return pd.DatetimeIndex(pd.to_datetime(ns, unit="ns", utc=True)).rename("time_utc")
    if naive.any() and not naive_is_utc:
        i = int(np.flatnonzero(naive)[0])
        raise CarbonDataError(
            f"{path}: line {_line(i, lines)}: timestamp {raw.iloc[i]!r} has no zone designator; "
            "this format requires UTC stamps ending in 'Z'"
        )
    offset = (~naive) & ~tz.isin(_UTC_DESIGNATORS).to_numpy()
    if offset.any():
        i = int(np.flatnonzero(offset)[0])
        raise CarbonDataError(
            f"{path}: line {_line(i, lines)}: timestamp {raw.iloc[i]!r} is not UTC (offset "
            f"{tz.iloc[i]}); the file must be in UTC"
        )
    try:
        stamps = pd.to_datetime(parts["base"], format="ISO8601", utc=True)
    except (ValueError, OverflowError) as exc:
        raise CarbonDataError(f"{path}: invalid timestamp ({exc})") from exc
    return pd.DatetimeIndex(stamps).as_unit("ns").rename("time_utc")


def _parse_values(path: Path, raw: pd.Series, stamps: pd.DatetimeIndex, col: str,
                  lines: np.ndarray | None = None) -> np.ndarray:
    """Parse intensities (gCO2e/kWh): no missing, non-numeric, non-finite or negative values."""
    missing = raw.isna().to_numpy() | (raw.str.strip() == "").to_numpy()
    if missing.any():
        i = int(np.flatnonzero(missing)[0])
        raise CarbonDataError(
            f"{path}: line {_line(i, lines)} ({stamps[i]}): missing value in column {col!r} "
            f"({int(missing.sum())} missing in all)"
        )
    values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=float)
    bad = ~np.isfinite(values)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise CarbonDataError(
            f"{path}: line {_line(i, lines)} ({stamps[i]}): non-numeric value {raw.iloc[i]!r} in "
            f"column {col!r} ({int(bad.sum())} such rows)"
        )
    neg = values < 0
    if neg.any():
        i = int(np.flatnonzero(neg)[0])
        raise CarbonDataError(
            f"{path}: line {_line(i, lines)} ({stamps[i]}): negative intensity {values[i]} in "
            f"column {col!r}"
        )
    return values


def _check_index(path: Path, stamps: pd.DatetimeIndex, cadence: pd.Timedelta | None,
                 lines: np.ndarray | None = None, epoch_aligned: bool = True) -> None:
    """Duplicates, order, alignment and gaps; ``cadence`` None = the most common step.

    Alignment: with ``epoch_aligned`` every stamp must start a cadence interval counted from the
    Unix epoch (whole hours for hourly data); otherwise only the steps are checked (local-time
    files of zones with a half-hour offset, for example)."""
    dup = stamps.duplicated(keep=False)
    if dup.any():
        rows = np.flatnonzero(dup)
        first = stamps[rows[0]]
        where = [_line(int(i), lines) for i in rows if stamps[i] == first]
        raise CarbonDataError(f"{path}: duplicated timestamp {first} on lines {where}")
    ns = stamps.asi8
    step = np.diff(ns)
    back = step < 0
    if back.any():
        i = int(np.flatnonzero(back)[0]) + 1
        raise CarbonDataError(
            f"{path}: line {_line(i, lines)}: timestamp {stamps[i]} is earlier than the previous "
            f"one ({stamps[i - 1]}); stamps must increase"
        )
    if cadence is None:
        values, counts = np.unique(step, return_counts=True)
        cadence_ns = int(values[np.argmax(counts)])
    else:
        cadence_ns = int(pd.Timedelta(cadence).value)
    off_grid = (ns % cadence_ns != 0) if epoch_aligned else np.zeros(len(ns), bool)
    if off_grid.any():
        i = int(np.flatnonzero(off_grid)[0])
        raise CarbonDataError(
            f"{path}: line {_line(i, lines)}: timestamp {stamps[i]} is not at the start of a "
            f"{pd.Timedelta(cadence_ns)} interval"
        )
    irregular = step != cadence_ns
    if irregular.any():
        i = int(np.flatnonzero(irregular)[0]) + 1
        gap = pd.Timedelta(int(step[i - 1]))
        n_missing = int(step[irregular].sum() // cadence_ns - irregular.sum())
        raise CarbonDataError(
            f"{path}: gap before line {_line(i, lines)}: {stamps[i - 1]} -> {stamps[i]} is "
            f"{gap}, cadence is {pd.Timedelta(cadence_ns)} ({int(irregular.sum())} irregular "
            f"step(s), {n_missing} missing stamp(s) in all)"
        )


def _series(
    path: Path,
    raw_time: pd.Series,
    raw_value: pd.Series,
    value_col: str,
    *,
    naive_is_utc: bool = True,
    zone: str | None = None,
    cadence: str | pd.Timedelta | None = None,
    lines: np.ndarray | None = None,
) -> pd.Series:
    """One region's validated intensities (gCO2e/kWh) on a regular UTC index, from the raw text
    of its time and value columns: the one code path of every CSV loader here."""
    stamps = _parse_stamps(path, raw_time, naive_is_utc, zone=zone, lines=lines)
    values = _parse_values(path, raw_value, stamps, value_col, lines)
    _check_index(path, stamps, None if cadence is None else pd.Timedelta(cadence), lines,
                 epoch_aligned=zone is None)
    series = pd.Series(values, index=stamps, name="gco2_per_kwh")
    series.attrs["source"] = str(path)
    return series


def _load(
    path: str | PathLike,
    time_col: str,
    value_col: str,
    naive_is_utc: bool,
    cadence: str | pd.Timedelta | None,
) -> pd.Series:
    path = Path(path)
    df = _read_columns(path, time_col, value_col)
    return _series(path, df[time_col], df[value_col], value_col, naive_is_utc=naive_is_utc,
                   cadence=cadence)


def load_electricitymaps_csv(path: str | PathLike, cadence: str | None = "1h") -> pd.Series:
    """Load an Electricity Maps export's life-cycle intensity.

    Parameters
    ----------
    path
        CSV with columns ``Datetime (UTC)`` and ``Carbon Intensity gCO₂eq/kWh (LCA)``.
        Stamps may be naive (the column header declares UTC, as in the exports) or carry a UTC
        designator (``Z``/``+00:00``); any other offset is an error.
    cadence
        Expected step between stamps (default one hour); None infers the most common step.

    Returns
    -------
    pd.Series
        gCO2e/kWh indexed by a UTC ``DatetimeIndex`` named ``time_utc``; each stamp is the
        start of the interval (hour) the value describes.

    Raises
    ------
    CarbonDataError
        Missing column, missing/non-numeric/negative value, unparseable or non-UTC stamp,
        duplicated or decreasing stamps, a stamp off the cadence grid, or a gap; the message
        names the file and the line/timestamp.
    """
    return _load(path, EM_TIME_COLUMN, EM_LCA_COLUMN, naive_is_utc=True, cadence=cadence)


def load_entsoe_csv(path: str | PathLike, cadence: str | None = None) -> pd.Series:
    """Load an ENTSO-E-derived series (``datetime_utc``, ``ci_lca_gco2eq_per_kwh``).

    Stamps must carry a UTC designator (``...Z``); naive or offset stamps are errors. The cadence
    (15 min for AT, 60 min for BE) is inferred as the most common step unless given. Same return
    value and errors as :func:`load_electricitymaps_csv`.
    """
    return _load(path, ENTSOE_TIME_COLUMN, ENTSOE_LCA_COLUMN, naive_is_utc=False, cadence=cadence)


# --------------------------------------------------------------------------------------------
# Year alignment
# --------------------------------------------------------------------------------------------


def _year_bounds(year: int) -> tuple[pd.Timestamp, pd.Timestamp]:
    return pd.Timestamp(f"{year}-01-01", tz="UTC"), pd.Timestamp(f"{year + 1}-01-01", tz="UTC")


def _cadence(index: pd.DatetimeIndex) -> pd.Timedelta:
    steps = np.diff(index.asi8)
    if len(steps) == 0 or (steps != steps[0]).any() or steps[0] <= 0:
        raise CarbonDataError("series must have a regular, increasing index of at least 2 stamps")
    return pd.Timedelta(int(steps[0]))


@dataclass(frozen=True)
class ShiftedSeries:
    """Result of :func:`shift_by_weeks`.

    Attributes
    ----------
    series
        gCO2e/kWh on the source cadence, covering the target year exactly
        ``[Jan 1 00:00, next Jan 1 00:00)`` UTC.
    weeks
        Whole weeks added to the source stamps.
    source_year, target_year
        Calendar years.
    filled_start, filled_end
        Steps at the start / end of the target year that the shifted source did not reach and
        that were filled by wrapping round the source by :data:`WRAP_WEEKS` weeks.
    """

    series: pd.Series
    weeks: int
    source_year: int
    target_year: int
    filled_start: int
    filled_end: int

    @property
    def filled(self) -> int:
        """All filled steps (start + end)."""
        return self.filled_start + self.filled_end


def shift_by_weeks(
    series: pd.Series, target_year: int, source_year: int | None = None
) -> ShiftedSeries:
    """Move a (roughly one-year) series onto ``target_year`` by a whole number of weeks.

    A shift by whole weeks keeps every value on the same weekday and time of day, which matters
    because demand (and so intensity) follows the working week. The shift chosen is the one whose
    shifted source overlaps the target year most; ties go to the shift closest to moving
    ``source_year``'s Jan 1 onto the target's Jan 1.

    The target year is then filled completely: a target instant ``t`` takes the source value at
    ``t - shift``; where that lies before the source's first stamp (after its last interval) it
    takes ``t - shift + 52 weeks`` (``- 52 weeks``) instead, i.e. the ends wrap round the source
    year by whole weeks, so weekday and season are kept. The number of filled steps at each end
    is reported.

    Parameters
    ----------
    series
        gCO2e/kWh on a regular UTC index (each stamp the start of its interval), at least 52
        weeks long.
    target_year
        Calendar year to cover.
    source_year
        Calendar year the series represents; default the year of its middle stamp (the
        ENTSO-E files start at 23:00 UTC on Dec 31 of the year before, local midnight).

    Returns
    -------
    ShiftedSeries
        The shifted series (source cadence, exactly the target year) and the shift's report.

    Raises
    ------
    CarbonDataError
        The index is irregular, not aligned so that a week is a whole number of steps, or
        shorter than 52 weeks.
    """
    index = pd.DatetimeIndex(series.index)
    if index.tz is None or str(index.tz) != "UTC":
        raise CarbonDataError(f"shift_by_weeks: index must be tz-aware UTC, got tz={index.tz}")
    index = index.as_unit("ns")
    cadence = _cadence(index)
    if WEEK % cadence != pd.Timedelta(0) or pd.Timedelta(days=1) % cadence != pd.Timedelta(0):
        raise CarbonDataError(f"shift_by_weeks: cadence {cadence} does not divide a day")
    src_start, src_end = index[0], index[-1] + cadence  # coverage [src_start, src_end)
    if src_end - src_start < WRAP_WEEKS * WEEK:
        raise CarbonDataError(
            f"shift_by_weeks: series covers {src_end - src_start}, need at least {WRAP_WEEKS} weeks"
        )
    if source_year is None:
        source_year = (src_start + (src_end - src_start) / 2).year
    t0, t1 = _year_bounds(target_year)
    natural = t0 - _year_bounds(source_year)[0]

    def overlap(k: int) -> pd.Timedelta:
        lo, hi = max(src_start + k * WEEK, t0), min(src_end + k * WEEK, t1)
        return max(hi - lo, pd.Timedelta(0))

    k_lo = int(np.floor((t0 - src_end) / WEEK))
    k_hi = int(np.ceil((t1 - src_start) / WEEK))
    weeks = max(range(k_lo, k_hi + 1), key=lambda k: (overlap(k), -abs(k * WEEK - natural)))

    target = pd.date_range(t0, t1, freq=cadence, inclusive="left", unit="ns", name=index.name)
    shift_ns = (weeks * WEEK).value
    wrap_ns = (WRAP_WEEKS * WEEK).value
    src_ns = target.asi8 - shift_ns
    before = src_ns < src_start.value
    after = src_ns >= src_end.value
    # One wrap always suffices: the source is >= 52 weeks long and the best shift overlaps the
    # target year by at least the source length minus the part that sticks out.
    src_ns = src_ns + wrap_ns * before - wrap_ns * after
    pos = (src_ns - src_start.value) // cadence.value
    if (pos < 0).any() or (pos >= len(index)).any() or (src_ns % cadence.value
                                                        != src_start.value % cadence.value).any():
        raise CarbonDataError("shift_by_weeks: the target year cannot be covered by one wrap")
    out = pd.Series(series.to_numpy()[pos], index=target, name=series.name)
    out.attrs = dict(series.attrs)
    return ShiftedSeries(
        series=out,
        weeks=weeks,
        source_year=int(source_year),
        target_year=int(target_year),
        filled_start=int(before.sum()),
        filled_end=int(after.sum()),
    )


# --------------------------------------------------------------------------------------------
# The 5-minute grid
# --------------------------------------------------------------------------------------------


def year_grid(year: int, step: str | pd.Timedelta = "5min") -> pd.DatetimeIndex:
    """Regular UTC grid ``[Jan 1 00:00, next Jan 1 00:00)`` of ``year`` with spacing ``step``."""
    t0, t1 = _year_bounds(year)
    return pd.date_range(t0, t1, freq=pd.Timedelta(step), inclusive="left", unit="ns",
                         name="time_utc")


def hold_on_grid(
    series: pd.Series, grid: pd.DatetimeIndex, end: pd.Timestamp | None = None
) -> np.ndarray:
    """Step-hold ``series`` onto ``grid``: each grid instant takes the latest stamp at or before it.

    A source value describes the interval from its stamp to the next stamp (the last one: one
    cadence long), so it is held constant over that interval.

    Parameters
    ----------
    series
        gCO2e/kWh on a regular, increasing UTC index.
    grid
        Increasing UTC instants.
    end
        End (exclusive) of the period the grid stands for; default ``grid[-1]``. The source must
        cover ``[grid[0], end)``.

    Returns
    -------
    np.ndarray
        float64 values, one per grid instant (gCO2e/kWh).

    Raises
    ------
    CarbonDataError
        The source does not cover the grid's period.
    """
    index = pd.DatetimeIndex(series.index).as_unit("ns")
    cadence = _cadence(index)
    cover_end = index[-1] + cadence
    end = grid[-1] if end is None else end
    if grid[0] < index[0] or grid[-1] >= cover_end or end > cover_end:
        raise CarbonDataError(
            f"source {series.attrs.get('source', '')} covers [{index[0]}, {cover_end}), "
            f"the grid needs [{grid[0]}, {end})"
        )
    pos = np.searchsorted(index.asi8, grid.as_unit("ns").asi8, side="right") - 1
    return series.to_numpy(dtype=float)[pos]


@dataclass(frozen=True)
class CarbonConfig:
    """Which carbon-intensity signal to build (``docs/model.md`` §2, §8a).

    Attributes
    ----------
    year
        Carbon year (UTC calendar year) the signal covers; default 2022, the latest year all
        mirrored Electricity Maps zones share.
    regions
        Region codes, in column order; default the paper's ``REGION_SETS["paper"]``.
    step
        Grid spacing (pandas offset string); default ``"5min"``. Must divide one day.
    entsoe_regions
        Regions taken from the ENTSO-E-derived files (production-based) instead of Electricity
        Maps; default ``("AT",)`` since no Electricity Maps series exists here for AT.
    at_source_year
        Year of the ENTSO-E-derived file used for every region in ``entsoe_regions`` (named after
        AT, the only one by default), moved onto ``year`` by :func:`shift_by_weeks`; default 2020.
    """

    year: int = 2022
    regions: tuple[str, ...] = REGION_SETS["paper"]
    step: str = "5min"
    entsoe_regions: tuple[str, ...] = ("AT",)
    at_source_year: int = 2020

    def __post_init__(self) -> None:
        object.__setattr__(self, "regions", tuple(self.regions))
        object.__setattr__(self, "entsoe_regions", tuple(self.entsoe_regions))
        if not self.regions:
            raise ValueError("CarbonConfig.regions is empty")
        if len(set(self.regions)) != len(self.regions):
            raise ValueError(f"CarbonConfig.regions has duplicates: {self.regions}")
        try:
            step = pd.Timedelta(self.step)
        except ValueError as exc:
            raise ValueError(f"CarbonConfig.step {self.step!r} is not a time step") from exc
        if step <= pd.Timedelta(0) or pd.Timedelta(days=1) % step != pd.Timedelta(0):
            raise ValueError(f"CarbonConfig.step {self.step!r} must be positive and divide a day")
        self.source_names()  # raises if a region has no file for the year

    @classmethod
    def from_region_set(cls, name: str, **kwargs) -> CarbonConfig:
        """Config for a named region set of :data:`REGION_SETS` (``"paper"`` or ``"em-only"``)."""
        if name not in REGION_SETS:
            raise ValueError(f"unknown region set {name!r}; known: {sorted(REGION_SETS)}")
        return cls(regions=REGION_SETS[name], **kwargs)

    def source_names(self) -> dict[str, str]:
        """Registry name of each region's source file, in region order.

        Raises
        ------
        ValueError
            A region has no registered file for the configured year.
        """
        from carbonrouter_lib.datasets import REGISTRY

        names = {}
        for region in self.regions:
            if region in self.entsoe_regions:
                try:
                    names[region] = entsoe_name(region, self.at_source_year)
                except KeyError as exc:
                    raise ValueError(f"CarbonConfig: region {region}: {exc.args[0]}") from None
                continue
            name = electricitymaps_name(region, self.year)
            if name not in REGISTRY:
                prefix = re.compile(rf"^carbon/electricitymaps/{re.escape(region)}_(\d{{4}})_")
                years = sorted(int(m.group(1)) for n in REGISTRY if (m := prefix.match(n)))
                raise ValueError(
                    f"CarbonConfig: no Electricity Maps file for region {region!r} in {self.year} "
                    f"({name} is not registered); years available for it: {years or 'none'}"
                )
            names[region] = name
        return names


def _cache_entry(cfg: CarbonConfig, names: Mapping[str, str]):
    from carbonrouter_lib import cache
    from carbonrouter_lib.datasets import REGISTRY

    # The registry's SHA-256 is the file's: fetch() refuses a file whose hash differs.
    params = {
        "config": asdict(cfg),
        "sources": {region: [name, REGISTRY[name].sha256] for region, name in names.items()},
    }
    return cache.entry("carbon_signal", params, "carbonrouter_lib.carbon")


def _to_query(times) -> tuple[np.ndarray, bool, bool]:
    """Normalize query times: (values, is_ns_int64, was_scalar).

    Real numbers are seconds since the Unix epoch (float64); datetime-likes become int64 ns UTC
    (naive ones are read as UTC, tz-aware ones are converted).
    """
    scalar = np.ndim(times) == 0
    ts = None
    if isinstance(times, pd.Timestamp | datetime):
        ts = pd.DatetimeIndex([times])
    elif isinstance(times, pd.DatetimeIndex):
        ts = times
    else:
        arr = np.atleast_1d(np.asarray(times))
        if arr.dtype.kind in "Mo":
            ts = pd.DatetimeIndex(arr)
        elif arr.dtype.kind not in "fiu":
            raise TypeError(f"cannot read times of dtype {arr.dtype} (want seconds or datetimes)")
    if ts is not None:
        if ts.tz is not None:
            ts = ts.tz_convert("UTC").tz_localize(None)
        if ts.isna().any():
            raise ValueError("carbon signal queried at NaT")
        return ts.as_unit("ns").asi8, True, scalar
    arr = arr.astype(np.float64, copy=False)
    if not np.isfinite(arr).all():
        raise ValueError("carbon signal queried at a non-finite time (seconds since epoch)")
    return arr, False, scalar


class CarbonSignal:
    """Carbon intensity of several regions on a regular grid, with step-hold lookup.

    The value at time ``t`` is the grid value at the latest grid instant at or before ``t``
    (the grid itself holds each hourly/15-minute source value until the next source stamp).
    Coverage is ``[start, end)``; a query outside raises ``ValueError``.

    Parameters
    ----------
    frame
        gCO2e/kWh, one column per region, indexed by increasing, unique UTC instants; no NaN.
    end
        End (exclusive) of the last row's interval; default the last stamp plus the last step.
    provenance
        Per region, where its values come from (source file, shift); kept for reports.
    """

    def __init__(
        self,
        frame: pd.DataFrame,
        end: pd.Timestamp | None = None,
        provenance: Mapping[str, Mapping] | None = None,
    ) -> None:
        index = pd.DatetimeIndex(frame.index)
        if index.tz is None:
            raise CarbonDataError("CarbonSignal: frame index must be tz-aware UTC")
        # Rebuilt from the int64 stamps so a cached frame equals a fresh one (no freq attribute).
        index = pd.to_datetime(index.tz_convert("UTC").as_unit("ns").asi8, unit="ns", utc=True)
        if len(index) < 1 or (len(index) < 2 and end is None):
            raise CarbonDataError("CarbonSignal: need at least 2 rows (or 1 row and an end)")
        if not index.is_unique or not index.is_monotonic_increasing:
            raise CarbonDataError("CarbonSignal: frame index must be unique and increasing")
        try:
            values = frame.to_numpy(dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise CarbonDataError(f"CarbonSignal: values must be numbers (gCO2e/kWh): {exc}") \
                from None
        if not np.isfinite(values).all():
            r, c = np.argwhere(~np.isfinite(values))[0]
            raise CarbonDataError(
                f"CarbonSignal: non-finite value at {index[r]}, region {frame.columns[c]}"
            )
        if (values < 0).any():
            r, c = np.argwhere(values < 0)[0]
            raise CarbonDataError(
                f"CarbonSignal: negative intensity {values[r, c]} gCO2e/kWh at {index[r]}, "
                f"region {frame.columns[c]} ({int((values < 0).sum())} values)"
            )
        if end is None:
            end = index[-1] + (index[-1] - index[-2])
        end = pd.Timestamp(end)
        end = end.tz_localize("UTC") if end.tz is None else end.tz_convert("UTC")
        if end <= index[-1]:
            raise CarbonDataError(f"CarbonSignal: end {end} is not after the last row {index[-1]}")
        self._frame = pd.DataFrame(values, index=index.rename("time_utc"),
                                   columns=[str(c) for c in frame.columns])
        self.regions: tuple[str, ...] = tuple(self._frame.columns)
        self._col = {r: i for i, r in enumerate(self.regions)}
        self._values = np.ascontiguousarray(values)
        self._t_ns = index.asi8
        self._t_s = self._t_ns / 1e9  # float64 seconds: exact for whole-second stamps
        # A regular grid of whole seconds (every grid built by from_config) turns the per-query
        # lookup into index arithmetic: _t_s[k] == t0 + k·step exactly (integers < 2**53).
        t0, n_rows = float(self._t_s[0]), len(self._t_s)
        step = float(self._t_s[1] - self._t_s[0]) if n_rows > 1 else 0.0
        regular = (step > 0 and t0 == int(t0) and step == int(step)
                   and np.array_equal(self._t_s, t0 + step * np.arange(n_rows)))
        self._grid = (t0, step, n_rows - 1) if regular else None
        self.start: pd.Timestamp = index[0]
        self.end: pd.Timestamp = end
        self._end_ns = end.as_unit("ns").value
        self._span_s = (t0, self._end_ns / 1e9)  # coverage [start, end) as float seconds
        self.provenance: dict[str, dict] = {k: dict(v) for k, v in (provenance or {}).items()}

    # ---- construction from the data ---------------------------------------------------------

    @classmethod
    def from_config(cls, cfg: CarbonConfig | None = None, cache: bool = True) -> CarbonSignal:
        """Build the signal of ``cfg`` on its grid covering the whole carbon year.

        Electricity Maps regions are read for ``cfg.year``; ENTSO-E-derived regions for
        ``cfg.at_source_year`` and moved onto ``cfg.year`` by :func:`shift_by_weeks` (steps filled
        at the year's ends are recorded in :attr:`provenance`). Every source is step-held onto the
        grid. With ``cache`` the frame is stored in the derived cache (:mod:`.cache`) under a key
        of the config, the source files' SHA-256 and this module's code, and reused when the key
        matches and the entry checks out.
        """
        from carbonrouter_lib.datasets import fetch

        cfg = CarbonConfig() if cfg is None else cfg
        names = cfg.source_names()
        t0, t1 = _year_bounds(cfg.year)
        entry = _cache_entry(cfg, names)
        grid = year_grid(cfg.year, cfg.step)
        if cache and (hit := entry.load()) is not None:
            frame, provenance = hit
            if list(frame.columns) == list(cfg.regions) and frame.index.equals(grid):
                return cls(frame, end=t1, provenance=provenance)

        columns, provenance = {}, {}
        for region, name in names.items():
            path = fetch(name)
            info: dict = {"file": name, "sha256": _registry_sha(name)}
            if region in cfg.entsoe_regions:
                shifted = shift_by_weeks(load_entsoe_csv(path), cfg.year, cfg.at_source_year)
                series = shifted.series
                info.update(kind="entsoe_derived (production-based)",
                            source_year=cfg.at_source_year, shift_weeks=shifted.weeks,
                            filled_steps_start=shifted.filled_start,
                            filled_steps_end=shifted.filled_end,
                            cadence=str(_cadence(series.index)))
            else:
                series = load_electricitymaps_csv(path)
                info.update(kind="electricitymaps (consumption-based)", source_year=cfg.year,
                            shift_weeks=0, filled_steps_start=0, filled_steps_end=0,
                            cadence=str(_cadence(series.index)))
            columns[region] = hold_on_grid(series, grid, end=t1)
            provenance[region] = info
        frame = pd.DataFrame(columns, index=grid)
        if cache:
            entry.save(frame, meta=provenance)
        return cls(frame, end=t1, provenance=provenance)

    @classmethod
    def from_csv(
        cls,
        source: str | PathLike | Mapping[str, str | PathLike],
        region: str | Sequence[str] | None = None,
        *,
        time_column: str = "datetime",
        value_column: str | None = None,
        region_column: str | None = None,
        tz: str = "UTC",
        cadence: str | None = None,
        step: str | None = None,
    ) -> CarbonSignal:
        """A signal from CSV files of one's own: any region, any hourly or sub-hourly cadence.

        Every file is checked like the mirrored exports (one code path): each stamp is the start
        of the interval its value describes; values in gCO2e/kWh, none missing, non-numeric or
        negative; stamps unique, increasing and without gaps at the file's cadence. Errors name
        the file, the line and the problem.

        Parameters
        ----------
        source
            One CSV file, or ``{region: file}`` for one region per file (each file then holds
            one value column, or names it with ``value_column``).
        region
            With one file: which region(s) it holds. A name: the file's only value column (or
            the column of that name, or ``value_column``) is that region. A list: the value
            columns of those names (a *wide* file: one column per region). None: every column
            but the time column is a region named by its header (or the one ``value_column``).
            With ``region_column`` (a *long* file): the regions to keep, in this order (None:
            all, in order of first appearance).
        time_column
            Header of the time column (default ``"datetime"``).
        value_column
            Header of the intensity column (default: the only column besides time and region).
        region_column
            Header of a column naming each row's region (a long file).
        tz
            IANA time zone of stamps without an offset (default ``"UTC"``); stamps with an
            offset (``Z``, ``+01:00``) are converted to UTC. An unknown zone, a local time that
            does not exist (DST gap) or cannot be placed (DST repeat out of order) is an error.
        cadence
            Expected step between stamps of every file (e.g. ``"15min"``); default the most
            common step of each file.
        step
            Spacing of the signal's grid; default the largest that keeps every source stamp on
            the grid (the finest cadence, for files on whole hours). Each value is held until
            the next stamp of its file (step-hold).

        Returns
        -------
        CarbonSignal
            Regions in the order given (mapping order, list order, or column / first-appearance
            order), covering the period all regions share: ``[latest first stamp, earliest end)``
            where a file ends one cadence after its last stamp. :attr:`provenance` names each
            region's file, SHA-256, column, cadence and time zone.

        Raises
        ------
        CarbonDataError
            A malformed file (see above), an unknown region or column, regions that share no
            period, or a ``step`` that does not divide the files' cadences.
        FileNotFoundError
            A file does not exist.

        Examples
        --------
        ``CarbonSignal.from_csv("solaria.csv", region="Solaria")`` (columns ``datetime`` and one
        value column); ``CarbonSignal.from_csv({"Solaria": "solaria.csv", "Ventosa":
        "ventosa.csv"})``; ``CarbonSignal.from_csv("zones.csv", region_column="zone",
        value_column="gco2")``.
        """
        from carbonrouter_lib.datasets import sha256_of

        series: dict[str, pd.Series] = {}
        provenance: dict[str, dict] = {}

        def add(name: object, path: Path, raw_time: pd.Series, raw_value: pd.Series,
                col: str, lines: np.ndarray | None = None) -> None:
            if not isinstance(name, str) or not name.strip():
                raise CarbonDataError(f"{path}: region names must be non-empty strings, got "
                                      f"{name!r}")
            if name in series:
                raise CarbonDataError(f"{path}: region {name!r} is given twice (also from "
                                      f"{provenance[name]['file']})")
            _zone(path, tz)  # an unknown zone is an error even when every stamp has an offset
            series[name] = _series(path, raw_time, raw_value, col, zone=tz, cadence=cadence,
                                   lines=lines)
            provenance[name] = {"kind": "csv", "file": str(path), "sha256": sha256_of(path),
                                "column": col, "tz": tz,
                                "cadence": str(_cadence(series[name].index))}

        if isinstance(source, Mapping):
            if region is not None or region_column is not None:
                raise CarbonDataError("from_csv: with a {region: file} mapping the regions are "
                                      "its keys; leave region and region_column unset")
            if not source:
                raise CarbonDataError("from_csv: the {region: file} mapping is empty")
            for name, file in source.items():
                path = Path(file)
                col = _value_column(path, time_column, value_column, ())
                df = _read_columns(path, time_column, col)
                add(name, path, df[time_column], df[col], col)
        else:
            path = Path(source)
            if region_column is not None:
                col = _value_column(path, time_column, value_column, (region_column,))
                df = _read_columns(path, time_column, region_column, col)
                zones = df[region_column]
                if zones.isna().any():
                    i = int(np.flatnonzero(zones.isna().to_numpy())[0])
                    raise CarbonDataError(f"{path}: line {_line(i)}: empty region in column "
                                          f"{region_column!r}")
                present = list(pd.unique(zones))
                wanted = present if region is None else (
                    [region] if isinstance(region, str) else list(region))
                unknown = [r for r in wanted if r not in present]
                if unknown:
                    raise CarbonDataError(f"{path}: region(s) {unknown} not in column "
                                          f"{region_column!r}; it has {present}")
                for name in wanted:
                    rows = np.flatnonzero((zones == name).to_numpy())
                    add(name, path, df[time_column].iloc[rows], df[col].iloc[rows], col,
                        lines=rows + 2)
            else:
                header = _read_header(path)
                others = [c for c in header if c != time_column]
                if not others or time_column not in header:
                    raise CarbonDataError(f"{path}: need a time column {time_column!r} and at "
                                          f"least one value column; columns are {header}")
                if value_column is not None:
                    if not (region is None or isinstance(region, str)):
                        raise CarbonDataError(f"{path}: value_column={value_column!r} is one "
                                              f"region's column; give one region name")
                    pairs = [(region or value_column, value_column)]
                elif isinstance(region, str):
                    pairs = [(region, others[0] if len(others) == 1 else region)]
                else:
                    pairs = [(c, c) for c in (others if region is None else list(region))]
                df = _read_columns(path, time_column, *dict.fromkeys(c for _, c in pairs))
                for name, col in pairs:
                    add(name, path, df[time_column], df[col], col)
        frame, end = _joint_grid(series, step)
        return cls(frame, end=end, provenance=provenance)

    @classmethod
    def combine(cls, *signals: CarbonSignal, step: str | None = None) -> CarbonSignal:
        """One signal of the regions of several (e.g. a region of one's own beside mirrored ones:
        ``CarbonSignal.combine(mine, CarbonSignal.from_config(cfg))``), on a grid that keeps every
        signal's stamps, over the period all share. Regions must not repeat."""
        series: dict[str, pd.Series] = {}
        provenance: dict[str, dict] = {}
        for sig in signals:
            for r in sig.regions:
                if r in series:
                    raise CarbonDataError(f"combine: region {r!r} is in more than one signal")
                s = pd.Series(sig._values[:, sig._col[r]], index=sig._frame.index)
                s.attrs["source"] = sig.provenance.get(r, {}).get("file", f"signal {r}")
                s.attrs["end"] = sig.end
                series[r] = s
                provenance[r] = dict(sig.provenance.get(r, {}))
        if not series:
            raise CarbonDataError("combine: no signals given")
        frame, end = _joint_grid(series, step)
        return cls(frame, end=end, provenance=provenance)

    def to_csv(self, path: str | PathLike) -> Path:
        """Write the signal as a wide CSV (``datetime`` in UTC with ``Z``, one column per
        region, gCO2e/kWh) that ``CarbonSignal.from_csv(path)`` reads back (the file of a
        sweep's ``SimulationConfig.carbon_file``). Returns the path."""
        path = Path(path)
        out = self._frame.copy()
        out.index = out.index.strftime("%Y-%m-%dT%H:%M:%SZ")
        out.index.name = "datetime"
        out.to_csv(path)
        return path

    # ---- lookups -------------------------------------------------------------------------------

    @property
    def frame(self) -> pd.DataFrame:
        """The grid (gCO2e/kWh), one column per region (a copy)."""
        return self._frame.copy()

    def row_index(self, t: float) -> int:
        """Row of the grid in force at ``t`` (float seconds since the Unix epoch): the latest
        grid instant at or before ``t``, as ``searchsorted(side="right") − 1`` would give.

        The fast path of the per-query simulator loop (callers may cache per-row values); raises
        ``ValueError`` outside the coverage like :meth:`at`.
        """
        lo, hi = self._span_s
        if not (lo <= t < hi):  # also rejects NaN
            self._rows(np.array([t]))  # raises the full error
        if self._grid is None:
            return int(np.searchsorted(self._t_s, t, side="right")) - 1
        t0, step, last = self._grid
        k = min(int((t - t0) // step), last)
        # The float division can be off by one at a grid instant; settle it with exact compares.
        if t < t0 + k * step:
            k -= 1
        elif k < last and t >= t0 + (k + 1) * step:
            k += 1
        return k

    def row_interval(self, row: int) -> tuple[float, float]:
        """The interval ``[start, end)`` (float seconds since the Unix epoch) in which grid row
        ``row`` is in force: a caller holding the row's values needs a new lookup only when a
        time leaves it."""
        end = self._t_s[row + 1] if row + 1 < len(self._t_s) else self._span_s[1]
        return float(self._t_s[row]), float(end)

    def _rows(self, times) -> tuple[np.ndarray, bool]:
        q, is_ns, scalar = _to_query(times)
        grid = self._t_ns if is_ns else self._t_s
        end = self._end_ns if is_ns else self._end_ns / 1e9
        lo = q < grid[0]
        hi = q >= end
        if lo.any() or hi.any():
            bad = q[np.flatnonzero(lo | hi)[0]]
            when = pd.Timestamp(int(bad), tz="UTC") if is_ns else pd.Timestamp(bad, unit="s",
                                                                                tz="UTC")
            raise ValueError(
                f"carbon signal queried at {when} ({'' if is_ns else f'{bad} s, '}"
                f"{int(lo.sum())} time(s) before, {int(hi.sum())} at/after the coverage); it "
                f"covers [{self.start}, {self.end})"
            )
        return np.searchsorted(grid, q, side="right") - 1, scalar

    def at(self, times) -> np.ndarray:
        """Intensity of every region at ``times`` (latest grid value at or before each time).

        Parameters
        ----------
        times
            Primary form: float64 seconds since the Unix epoch (scalar or array). Also
            ``numpy.datetime64`` (read as UTC), ``pd.Timestamp``/``DatetimeIndex`` (tz-aware ones
            are converted to UTC, naive ones read as UTC).

        Returns
        -------
        np.ndarray
            gCO2e/kWh, shape ``(len(times), n_regions)`` in :attr:`regions` order; shape
            ``(n_regions,)`` for a scalar time.

        Raises
        ------
        ValueError
            A time is before :attr:`start`, at/after :attr:`end`, or not finite.
        """
        if isinstance(times, float | int) and not isinstance(times, bool):
            return self._values[self.row_index(float(times))]
        rows, scalar = self._rows(times)
        out = self._values[rows]
        return out[0] if scalar else out

    def region_index(self, region: str) -> int:
        """Column of ``region``; ``KeyError`` naming the known regions otherwise."""
        try:
            return self._col[region]
        except KeyError:
            raise KeyError(f"unknown region {region!r}; this signal has {self.regions}") from None

    def at_region(self, region: str, times) -> np.ndarray | float:
        """Intensity of one region at ``times`` (gCO2e/kWh): shape ``(len(times),)``, or a float."""
        col = self.region_index(region)
        if isinstance(times, float | int) and not isinstance(times, bool):
            return float(self._values[self.row_index(float(times)), col])
        rows, scalar = self._rows(times)
        out = self._values[rows, col]
        return float(out[0]) if scalar else out

    def cleanest_index(self, times) -> np.ndarray | int:
        """Column of the cleanest region at ``times``; ties go to the first region in order."""
        rows, scalar = self._rows(times)
        idx = np.argmin(self._values[rows], axis=1)
        return int(idx[0]) if scalar else idx

    def cleanest_region(self, times) -> np.ndarray | str:
        """Name of the cleanest region at ``times`` (ties: first region in :attr:`regions`)."""
        idx = self.cleanest_index(times)
        names = np.asarray(self.regions, dtype=object)
        return names[idx] if isinstance(idx, np.ndarray) else self.regions[idx]

    def __repr__(self) -> str:
        return (f"CarbonSignal(regions={self.regions}, start={self.start}, end={self.end}, "
                f"rows={len(self._t_ns)})")


def _value_column(path: Path, time_column: str, value_column: str | None,
                  exclude: Sequence[str]) -> str:
    """``value_column``, or the file's only column besides the time column and ``exclude``."""
    if value_column is not None:
        return value_column
    others = [c for c in _read_header(path) if c != time_column and c not in exclude]
    if len(others) != 1:
        raise CarbonDataError(f"{path}: cannot tell the value column among {others}; pass "
                              f"value_column=")
    return others[0]


def _joint_grid(series: Mapping[str, pd.Series], step: str | None
                ) -> tuple[pd.DataFrame, pd.Timestamp]:
    """Step-hold every region's series onto one grid over the period all cover.

    A series covers ``[first stamp, attrs["end"] or last stamp + cadence)``. The grid step
    (default: the gcd of the cadences and of the offsets between the series' first stamps, so
    every source stamp is a grid instant) must keep every source stamp on the grid."""
    starts, ends, cadences = {}, {}, {}
    for r, s in series.items():
        index = pd.DatetimeIndex(s.index).as_unit("ns")
        cadences[r] = _cadence(index).value
        starts[r] = int(index.asi8[0])
        end = s.attrs.get("end")
        ends[r] = int(pd.Timestamp(end).as_unit("ns").value if end is not None
                      else index.asi8[-1] + cadences[r])
    first = next(iter(starts.values()))
    phases = [starts[r] - first for r in series]
    if step is None:
        step_ns = int(np.gcd.reduce(np.array(list(cadences.values()) + phases, dtype=np.int64)))
    else:
        step_ns = int(pd.Timedelta(step).value)
        if step_ns <= 0:
            raise CarbonDataError(f"step {step!r} must be positive")
        for r in series:
            if cadences[r] % step_ns or (starts[r] - first) % step_ns:
                raise CarbonDataError(
                    f"step {step!r} does not keep the stamps of region {r!r} "
                    f"({series[r].attrs.get('source', '')}, cadence "
                    f"{pd.Timedelta(cadences[r])}) on the grid; leave step unset")
    lo, hi = max(starts.values()), min(ends.values())
    if lo >= hi:
        spans = ", ".join(f"{r} [{pd.Timestamp(starts[r], tz='UTC')}, "
                          f"{pd.Timestamp(ends[r], tz='UTC')})" for r in series)
        raise CarbonDataError(f"the regions share no period: {spans}")
    n_rows = (hi - lo) // step_ns
    if n_rows > 20_000_000:
        raise CarbonDataError(f"a grid step of {pd.Timedelta(step_ns)} over the shared period "
                              f"gives {n_rows} rows; pass a coarser step=")
    start, end = pd.Timestamp(lo, tz="UTC"), pd.Timestamp(hi, tz="UTC")
    grid = pd.date_range(start, end, freq=pd.Timedelta(step_ns), inclusive="left", unit="ns",
                         name="time_utc")
    frame = pd.DataFrame({r: hold_on_grid(s, grid, end=end) for r, s in series.items()},
                         index=grid)
    return frame, end


def _registry_sha(name: str) -> str:
    from carbonrouter_lib.datasets import REGISTRY

    return REGISTRY[name].sha256
