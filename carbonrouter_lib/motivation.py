"""Section 2 of the paper (motivation): how far apart grids are, how long conversation histories
are, and what a KV-cache miss costs. The paper's own numbers are in :mod:`carbonrouter_lib.paper`
(``SECTION2_*``).

Section 2.1, Figure 1 (notebook 01) works on a carbon frame — gCO2e/kWh, one column per region,
one row per instant of a regular grid, e.g. :attr:`carbonrouter_lib.carbon.CarbonSignal.frame`:
the spread within and across regions and who is cleanest (:func:`section2_stats`, set beside the
paper's by :func:`section2_comparison`), the runs of the cleanest region that Figure 1(b) shades
(:func:`cleanest_intervals`), and Figure 1(a)'s annual means of 21 countries
(:func:`load_annual_means` of Ember's values, :data:`PAPER_COUNTRIES_21`,
:func:`annual_means_span`).

Section 2.2, Figure 2(a) is the distribution of history length per query (its shares come from
:func:`carbonrouter_lib.sharegpt.history_shares`); Figure 2(b) the extra carbon and the extra
prefill latency of serving a query *without* its cached history on the same deployment.
Both work on the turns table of :func:`carbonrouter_lib.sharegpt.load_sharegpt_turns`
(columns ``history_tokens_<family>``, ``new_tokens_<family>``, ``output_tokens_<family>``), as
does :func:`workload_summary`, the headline numbers of a turn table (ShareGPT, or the Mooncake
trace's :func:`carbonrouter_lib.mooncake.mooncake_turns`) that notebook 00 sets beside Figure 2(a).

"4K" means 4,096 tokens throughout (as 32K means 32,768 in the models' context windows,
``docs/model.md`` §2).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path

import numpy as np
import pandas as pd

from carbonrouter_lib import cost
from carbonrouter_lib.carbon import CarbonDataError
from carbonrouter_lib.paper import SECTION2_CARBON

__all__ = [
    "ANNUAL_MEANS_NAME",
    "PAPER_COUNTRIES_21",
    "AnnualSpan",
    "load_annual_means",
    "annual_means_span",
    "range_ratio",
    "cross_region_ratio",
    "median_cross_region_ratio",
    "cleanest_shares",
    "cleanest_intervals",
    "section2_stats",
    "section2_comparison",
    "DEFAULT_BUCKETS",
    "sample_sessions",
    "miss_penalty",
    "bucket_summary",
    "workload_summary",
]

#: Registry name of Ember's annual mean intensity per country (co2.js), Figure 1(a).
ANNUAL_MEANS_NAME = "carbon/annual/co2js_ember_average_intensities.json"

#: Our reconstruction of the paper's 21 countries (ISO3) for Fig. 1(a). The paper names only its
#: extremes, India (highest) and Switzerland (lowest): ``paper.SECTION2_CARBON``'s
#: ``annual_max`` and ``annual_min``. We take countries that
#: host major public-cloud regions (AWS / Azure / GCP), including the paper's four regions'
#: countries (AT, GB, BE, US), and keep only countries whose Ember value lies between
#: Switzerland's and India's so that the paper's extremes stay the extremes; this excludes Sweden
#: and Norway (below CH in Ember) and South Africa (above India). Not the paper's list.
PAPER_COUNTRIES_21: tuple[str, ...] = (
    "IND", "CHE", "AUT", "GBR", "BEL", "USA", "DEU", "FRA", "NLD", "IRL", "FIN",
    "ITA", "ESP", "POL", "CAN", "BRA", "JPN", "KOR", "SGP", "AUS", "CHN",
)  # fmt: skip

# --------------------------------------------------------------------------------------------
# Section 2.1, Figure 1: carbon intensity across regions and time
# --------------------------------------------------------------------------------------------
# All take a frame of gCO2e/kWh with one column per region and one row per instant of a regular
# grid, so every row weighs the same span of time and "share of rows" is "share of time".


def _values(frame: pd.DataFrame) -> np.ndarray:
    v = frame.to_numpy(dtype=np.float64)
    if v.size == 0:
        raise ValueError("empty carbon frame")
    if not np.isfinite(v).all():
        raise ValueError("carbon frame has non-finite values")
    if (v <= 0).any():
        r, c = np.argwhere(v <= 0)[0]
        raise ValueError(f"ratio undefined: intensity {v[r, c]} <= 0 at row {r}, "
                         f"column {frame.columns[c]}")
    return v


def range_ratio(frame: pd.DataFrame, q: float = 0.0) -> pd.Series:
    """Per region, max / min intensity over the frame (dimensionless; the paper's range over its
    year: ``paper.SECTION2_CARBON["range_ratio_low"]`` to ``["range_ratio_high"]``).

    Parameters
    ----------
    q
        Tail share to ignore: with ``q > 0`` the ratio is the ``1 - q`` quantile over the ``q``
        quantile (linear interpolation), e.g. ``q=0.01`` gives P99 / P1, which a single extreme
        hour cannot move. ``q = 0`` (default) is max / min.
    """
    if not 0.0 <= q < 0.5:
        raise ValueError(f"q must be in [0, 0.5), got {q}")
    v = _values(frame)
    hi, lo = (v.max(axis=0), v.min(axis=0)) if q == 0 else (
        np.quantile(v, 1 - q, axis=0), np.quantile(v, q, axis=0))
    name = "max_over_min" if q == 0 else f"p{100 * (1 - q):g}_over_p{100 * q:g}"
    return pd.Series(hi / lo, index=frame.columns, name=name)


def cross_region_ratio(frame: pd.DataFrame) -> pd.Series:
    """Per instant, dirtiest region / cleanest region at that instant (dimensionless)."""
    v = _values(frame)
    return pd.Series(v.max(axis=1) / v.min(axis=1), index=frame.index, name="cross_region_ratio")


def median_cross_region_ratio(frame: pd.DataFrame) -> float:
    """Median over time of :func:`cross_region_ratio` (the paper's:
    ``paper.SECTION2_CARBON["median_cross_region_ratio"]``)."""
    return float(np.median(cross_region_ratio(frame).to_numpy()))


def cleanest_shares(frame: pd.DataFrame, ties: str = "split") -> pd.Series:
    """Share of time each region is the cleanest (fractions summing to 1; the paper's range:
    ``paper.SECTION2_CARBON["cleanest_share_low"]`` to ``["cleanest_share_high"]`` each).

    Parameters
    ----------
    ties
        ``"split"`` (default): an instant where k regions share the minimum counts 1/k for each;
        ``"first"``: it counts for the first of them in column order (as
        :meth:`.carbon.CarbonSignal.cleanest_region` decides). The number of tied instants is in
        ``result.attrs["tied_instants"]``.
    """
    v = _values(frame)
    is_min = v == v.min(axis=1, keepdims=True)
    n_min = is_min.sum(axis=1)
    if ties == "split":
        credit = is_min / n_min[:, None]
    elif ties == "first":
        credit = np.zeros_like(v)
        credit[np.arange(len(v)), np.argmin(v, axis=1)] = 1.0
    else:
        raise ValueError(f"ties must be 'split' or 'first', got {ties!r}")
    out = pd.Series(credit.mean(axis=0), index=frame.columns, name="cleanest_share")
    out.attrs["tied_instants"] = int((n_min > 1).sum())
    return out


def cleanest_intervals(frame: pd.DataFrame, end: pd.Timestamp | None = None) -> pd.DataFrame:
    """Runs of constant cleanest region (ties: first in column order), for shading plots.

    Returns
    -------
    pd.DataFrame
        Columns ``start``, ``end`` (UTC; a run's end is the next run's start, the last ends at
        ``end``, default the last row plus one step) and ``region``.
    """
    v = _values(frame)
    idx = np.argmin(v, axis=1)
    change = np.flatnonzero(np.diff(idx)) + 1
    starts = np.concatenate([[0], change])
    index = pd.DatetimeIndex(frame.index)
    if end is None:
        end = index[-1] + (index[-1] - index[-2]) if len(index) > 1 else index[-1]
    stops = list(index[change]) + [pd.Timestamp(end)]
    return pd.DataFrame({
        "start": index[starts],
        "end": pd.DatetimeIndex(stops),
        "region": np.asarray(frame.columns, dtype=object)[idx[starts]],
    })


def load_annual_means(path: str | PathLike | None = None) -> pd.DataFrame:
    """Ember annual mean intensity per country (co2.js ``average-intensities.json``).

    Parameters
    ----------
    path
        The JSON file; default the registry's
        ``carbon/annual/co2js_ember_average_intensities.json``.

    Returns
    -------
    pd.DataFrame
        Columns ``iso3``, ``country``, ``year`` (the Ember year of that value, mostly 2024),
        ``gco2_per_kwh``; one row per country, sorted by ``iso3``. Aggregates (World, EU, G20,
        continents: entries without a 3-letter ISO code) are dropped.

    Raises
    ------
    CarbonDataError
        An entry lacks a field, or its intensity is non-numeric or negative.
    """
    if path is None:
        from carbonrouter_lib.datasets import fetch

        path = fetch(ANNUAL_MEANS_NAME)
    path = Path(path)
    data = json.loads(path.read_text(encoding="utf-8"))
    rows = []
    for key, entry in data.items():
        code = entry.get("country_code", "") if isinstance(entry, dict) else None
        if code is None:
            raise CarbonDataError(f"{path}: entry {key!r} is not an object")
        if not (isinstance(code, str) and len(code) == 3 and code.isalpha() and code.isupper()):
            continue  # an aggregate (World, EU, ...), not a country
        try:
            value = float(entry["emissions_intensity_gco2_per_kwh"])
            year = int(entry["year"])
            country = str(entry["country_or_region"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CarbonDataError(f"{path}: entry {key!r}: bad or missing field ({exc})") from exc
        if not np.isfinite(value) or value < 0:
            raise CarbonDataError(f"{path}: entry {key!r}: invalid intensity {value}")
        rows.append((code, country, year, value))
    df = pd.DataFrame(rows, columns=["iso3", "country", "year", "gco2_per_kwh"])
    if df["iso3"].duplicated().any():
        dups = sorted(df["iso3"][df["iso3"].duplicated()])
        raise CarbonDataError(f"{path}: duplicated ISO3 codes {dups}")
    return df.sort_values("iso3", ignore_index=True)


@dataclass(frozen=True)
class AnnualSpan:
    """Dirtiest and cleanest country among a set, and their ratio (the paper's:
    ``paper.SECTION2_CARBON["annual_span_ratio"]``)."""

    n_countries: int
    max_iso3: str
    max_country: str
    max_gco2_per_kwh: float
    min_iso3: str
    min_country: str
    min_gco2_per_kwh: float
    ratio: float
    years: dict[int, int] = field(default_factory=dict)


def annual_means_span(annual: pd.DataFrame, countries: Sequence[str] | None = None) -> AnnualSpan:
    """Span of annual means over ``countries`` (ISO3; default all rows of ``annual``).

    Parameters
    ----------
    annual
        As returned by :func:`load_annual_means`.
    countries
        ISO3 codes to keep, e.g. :data:`PAPER_COUNTRIES_21`; an unknown code is an error.

    Returns
    -------
    AnnualSpan
        ``ratio`` = max / min gCO2e/kWh; ``years`` counts the Ember years of the values used.
    """
    df = annual
    if countries is not None:
        missing = sorted(set(countries) - set(annual["iso3"]))
        if missing:
            raise KeyError(f"countries not in the annual means: {missing}")
        df = annual[annual["iso3"].isin(countries)]
    if len(df) < 2:
        raise ValueError("need at least 2 countries for a span")
    hi = df.loc[df["gco2_per_kwh"].idxmax()]
    lo = df.loc[df["gco2_per_kwh"].idxmin()]
    if lo["gco2_per_kwh"] <= 0:
        raise ValueError(f"{lo['country']} has intensity {lo['gco2_per_kwh']}: ratio undefined")
    return AnnualSpan(
        n_countries=len(df),
        max_iso3=str(hi["iso3"]),
        max_country=str(hi["country"]),
        max_gco2_per_kwh=float(hi["gco2_per_kwh"]),
        min_iso3=str(lo["iso3"]),
        min_country=str(lo["country"]),
        min_gco2_per_kwh=float(lo["gco2_per_kwh"]),
        ratio=float(hi["gco2_per_kwh"] / lo["gco2_per_kwh"]),
        years={int(y): int(n) for y, n in df["year"].value_counts().sort_index().items()},
    )


def section2_stats(frame: pd.DataFrame) -> pd.DataFrame:
    """The paper's Section-2 statistics of one signal as a tidy table.

    Returns
    -------
    pd.DataFrame
        Columns ``quantity``, ``region`` (a region, or ``"all"``), ``value``. Quantities:
        ``max_over_min`` and ``p99_over_p1`` (per region, see :func:`range_ratio`),
        ``median_cross_region_ratio`` (all),
        ``cleanest_share`` (per region; ties split, see :func:`cleanest_shares`),
        ``tied_instants`` (all).
    """
    rr = range_ratio(frame)
    shares = cleanest_shares(frame)
    rows = [("max_over_min", r, float(x)) for r, x in rr.items()]
    rows += [("p99_over_p1", r, float(x)) for r, x in range_ratio(frame, q=0.01).items()]
    rows.append(("median_cross_region_ratio", "all", median_cross_region_ratio(frame)))
    rows += [("cleanest_share", r, float(x)) for r, x in shares.items()]
    rows.append(("tied_instants", "all", float(shares.attrs["tied_instants"])))
    return pd.DataFrame(rows, columns=["quantity", "region", "value"])


def section2_comparison(stats: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Put :func:`section2_stats` of several region sets side by side with the paper's numbers.

    Parameters
    ----------
    stats
        ``{region set name: section2_stats(frame)}``.

    Returns
    -------
    pd.DataFrame
        One row per (quantity, region) plus summary rows (``"lowest/highest over regions"``),
        columns ``quantity``, ``region``, ``paper`` (text), one float column ``ours (<set>)`` per
        set (NaN where the set lacks the region) and ``note``.
    """
    p = SECTION2_CARBON
    paper_text = {
        "max_over_min": (f"{p['range_ratio_low']}–{p['range_ratio_high']}× "
                         f"(over {p['range_ratio_year']})"),
        "p99_over_p1": "",
        "median_cross_region_ratio": f"{p['median_cross_region_ratio']}×",
        "cleanest_share": f"{p['cleanest_share_low']:.0%}–{p['cleanest_share_high']:.0%} each",
        "tied_instants": "",
    }
    notes = {
        "max_over_min": "max / min over the year, per region",
        "p99_over_p1": "99th / 1st percentile over the year (robust to single extreme hours)",
        "median_cross_region_ratio": "median over time of (max region / min region) per instant",
        "cleanest_share": "share of grid instants a region is the cleanest (ties split)",
        "tied_instants": "instants where >1 region is cleanest",
    }
    keys: list[tuple[str, str]] = []
    for df in stats.values():
        for q, r in zip(df["quantity"], df["region"], strict=True):
            if (q, r) not in keys:
                keys.append((q, r))
    order = {q: i for i, q in enumerate(paper_text)}
    keys.sort(key=lambda k: order.get(k[0], len(order)))
    rows = []
    for q, r in keys:
        row = {"quantity": q, "region": r, "paper": paper_text.get(q, "")}
        for name, df in stats.items():
            hit = df[(df["quantity"] == q) & (df["region"] == r)]["value"]
            row[f"ours ({name})"] = float(hit.iloc[0]) if len(hit) else np.nan
        row["note"] = notes.get(q, "")
        rows.append(row)
    for q in ("max_over_min", "p99_over_p1", "cleanest_share"):
        for which, fn in (("lowest", np.min), ("highest", np.max)):
            row = {"quantity": q, "region": f"{which} over regions", "paper": paper_text[q]}
            for name, df in stats.items():
                vals = df[df["quantity"] == q]["value"]
                row[f"ours ({name})"] = float(fn(vals)) if len(vals) else np.nan
            row["note"] = f"{which} value over the set's regions"
            rows.append(row)
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# Section 2.2, Figure 2: history lengths and the cost of a cache miss
# --------------------------------------------------------------------------------------------

#: History buckets of Fig. 2(b), in tokens: (lower, upper] with K = 1,024.
DEFAULT_BUCKETS: tuple[tuple[str, int, float], ...] = (
    ("0–1K", 0, 1024),
    ("1K–2K", 1024, 2048),
    ("2K–4K", 2048, 4096),
    ("4K–8K", 4096, 8192),
    ("> 8K", 8192, np.inf),
)


def sample_sessions(turns: pd.DataFrame, n_sessions: int, seed: int) -> pd.DataFrame:
    """All turns of ``n_sessions`` conversations drawn uniformly without replacement (seeded)."""
    ids = turns["conversation_id"].unique()
    if not 0 < n_sessions <= len(ids):
        raise ValueError(
            f"n_sessions={n_sessions} must be between 1 and the {len(ids)} conversations available"
        )
    chosen = np.random.default_rng(seed).choice(ids, size=n_sessions, replace=False)
    return turns[turns["conversation_id"].isin(chosen)].reset_index(drop=True)


def miss_penalty(turns: pd.DataFrame, profile: pd.Series, family: str) -> pd.DataFrame:
    """Per turn with a history: extra energy (= carbon) and extra prefill time of a cache miss.

    A miss and a hit are compared on the same deployment at the same time, so the carbon intensity
    cancels: extra carbon (%) = 100 · (E_miss − E_hit) / E_hit with Eq. 4 at L = 0 vs L = N_hist,
    using the trace's realized output length. Extra prefill (s) = N_hist / v_pre (Eq. 6).

    Parameters
    ----------
    turns
        Turns table (one row per query).
    profile
        One row of a profiles table (``e_in_kwh``, ``e_cache_kwh``, ``e_out_kwh``,
        ``prefill_tok_s``, and ``context_window`` if present: queries that would not fit are
        dropped and counted in ``DataFrame.attrs["dropped_context"]``).
    family
        Tokenizer family of the profile's model ("gemma3", "llama3", "mistral").
    """
    n_hist = turns[f"history_tokens_{family}"].to_numpy(dtype=np.float64)
    n_new = turns[f"new_tokens_{family}"].to_numpy(dtype=np.float64)
    n_out = turns[f"output_tokens_{family}"].to_numpy(dtype=np.float64)
    fits = np.ones(len(turns), dtype=bool)
    if "context_window" in profile.index:
        fits = n_new + n_hist + n_out <= float(profile["context_window"])
    keep = (n_hist > 0) & fits
    e_in, e_cache, e_out = (float(profile[c]) for c in ("e_in_kwh", "e_cache_kwh", "e_out_kwh"))
    v_pre = float(profile["prefill_tok_s"])
    new, hist, out_tok = n_new[keep], n_hist[keep], n_out[keep]
    e_miss = cost.energy_kwh(e_in, e_cache, e_out, new, hist, 0.0, out_tok)
    e_hit = cost.energy_kwh(e_in, e_cache, e_out, new, hist, hist, out_tok)
    out = pd.DataFrame(
        {
            "conversation_id": turns["conversation_id"].to_numpy()[keep],
            "history_tokens": hist,
            "extra_carbon_pct": 100.0 * (e_miss - e_hit) / e_hit,
            "extra_prefill_s": cost.ttft_s(new, hist, 0.0, v_pre)
            - cost.ttft_s(new, hist, hist, v_pre),
        }
    )
    out.attrs["dropped_context"] = int(np.sum((n_hist > 0) & ~fits))
    out.attrs["first_turns"] = int(np.sum(n_hist == 0))
    return out


def bucket_summary(
    penalty: pd.DataFrame,
    buckets: Sequence[tuple[str, int, float]] = DEFAULT_BUCKETS,
) -> pd.DataFrame:
    """Median and interquartile range of the miss penalty per history bucket (lower, upper]."""
    rows = []
    h = penalty["history_tokens"].to_numpy()
    for label, lo, hi in buckets:
        sel = penalty[(h > lo) & (h <= hi)]
        row = {"bucket": label, "lower_tokens": lo, "upper_tokens": hi, "n_queries": len(sel)}
        for col in ("extra_carbon_pct", "extra_prefill_s"):
            q = sel[col].quantile([0.25, 0.5, 0.75]) if len(sel) else pd.Series([np.nan] * 3)
            row |= {f"{col}_q25": q.iloc[0], f"{col}_median": q.iloc[1], f"{col}_q75": q.iloc[2]}
        rows.append(row)
    return pd.DataFrame(rows)


def workload_summary(
    turns: pd.DataFrame, family: str, thresholds: Sequence[int] = (4096, 8192)
) -> dict[str, float]:
    """Headline numbers of a turn table (ShareGPT or Mooncake), under one tokenizer family.

    Returns
    -------
    dict
        ``conversations``, ``queries``, ``mean turns per conversation``, ``median turns per
        conversation``, ``share of conversations with ≥ 2 turns``, per threshold ``share of
        queries with ≥ <t> history tokens``, medians of new, output and history tokens per query
        and the mean context per query (history + new, tokens).
    """
    sizes = turns.groupby("conversation_id", sort=False).size()
    hist = turns[f"history_tokens_{family}"].to_numpy()
    new = turns[f"new_tokens_{family}"].to_numpy()
    out: dict[str, float] = {
        "conversations": int(len(sizes)),
        "queries": int(len(turns)),
        "mean turns per conversation": float(sizes.mean()),
        "median turns per conversation": float(sizes.median()),
        "share of conversations with ≥ 2 turns": float((sizes >= 2).mean()),
    }
    for t in thresholds:
        out[f"share of queries with ≥ {t} history tokens"] = float(np.mean(hist >= t))
    out["median new tokens per query"] = float(np.median(new))
    out["median output tokens per query"] = float(
        np.median(turns[f"output_tokens_{family}"].to_numpy()))
    out["median history tokens per query"] = float(np.median(hist))
    out["mean context tokens per query (history + new)"] = float(np.mean(hist + new))
    return out
