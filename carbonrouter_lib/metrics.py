"""Evaluation metrics of a replay (``docs/model.md`` §9) and paired, session-level bootstrap CIs.

The simulator returns, per policy run, a *records* table: one row per query in dispatch order,
rejected queries included (see :data:`RECORD_COLUMNS`). A rejected query's row has deployment
−1, empty model / GPU / region, zero energy, carbon, cached and recomputed tokens, NaN TTFT,
quality and ``completion_s`` (it never completes), and the history it would have carried under
the 70B's tokenizer. This module turns it into

- :func:`summarize` — every metric of ``docs/model.md`` §9 for one run, units in the names;
  :func:`summary_table` — one row per policy; :func:`normalize` — ratios to Session-Affinity = 1
  (the paper's Table 1 / Table 2 normalization);
- :func:`paired_saving_ci`, :func:`paired_change_ci`, :func:`paired_ratio_ci` — a statistic of
  policy A relative to policy B with a percentile CI from resampling *sessions* with replacement,
  the same draws for both policies (paired); :func:`paired_table` / :func:`saving_table` — one row
  per baseline (Table 1's last column, Table 2's Δ columns);
- :func:`by_session_length` and :func:`paired_by_session_length` — the same per group of sessions
  with more than t turns (the paper's Figure 4; ``paper.FIGURE4``).

Why a session bootstrap: the turns of a session share its history, model choice and cache, so
queries are not independent; sessions are (their arrivals are a Poisson process). When a replay
resamples conversations (replay scale, :mod:`carbonrouter_lib.prepared`), the copies of one
conversation share its content — its length and prompts, the main source of a session's carbon —
so the resampled unit is the *conversation* (records' ``conversation`` column: all sessions of a
conversation are drawn together, a cluster bootstrap); with one copy per conversation this is
exactly the session bootstrap. Why paired: all
policies replay the same sessions, and most of the variance of a session's carbon (its length, its
prompts, its arrival hour) is common to both policies; resampling the same sessions for A and B
cancels it, so the CI measures the *difference* between policies (as rliable's paired bootstrap
does). The bootstrap is vectorized: per-session statistics are computed once, and each chunk of
draws is a (draws × sessions) matrix of multiplicities, so ~10K sessions × 2,000 draws need a few
tens of MB at a time (``chunk_elements``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pandas as pd
from numba import njit

__all__ = [
    "RECORD_COLUMNS",
    "REFERENCE_POLICY",
    "LARGE_MODEL",
    "NORMALIZED_COLUMNS",
    "validate_records",
    "summarize",
    "summary_table",
    "normalize",
    "BootstrapCI",
    "bootstrap_counts",
    "paired_ratio_ci",
    "paired_change_ci",
    "paired_saving_ci",
    "paired_table",
    "saving_table",
    "sessions_longer_than",
    "by_session_length",
    "paired_by_session_length",
    "RunSummary",
    "SUMMARY_METRICS",
    "conversation_sums",
    "paired_saving_ci_sums",
]

#: Columns of a records table and their kind ("int", "float", "str", "bool").
RECORD_COLUMNS: dict[str, str] = {
    "session": "int",
    "turn": "int",
    "n_turns": "int",
    "deployment": "int",
    "model": "str",
    "gpu": "str",
    "region": "str",
    "dispatch_s": "float",
    "completion_s": "float",
    "history_tokens": "float",
    "cached_tokens": "float",
    "recomputed_tokens": "float",
    "energy_kwh": "float",
    "carbon_g": "float",
    "est_energy_kwh": "float",
    "est_carbon_g": "float",
    "recompute_energy_kwh": "float",
    "ttft_s": "float",
    "quality": "float",
    "best_effort": "bool",
    "rejected": "bool",
    "in_cleanest_region": "bool",
    "switched": "bool",
    "switch_opportunity": "bool",
    "gate_blocked": "bool",
}

#: The policy every ratio is normalized to (docs/model.md §9: Session-Affinity = 1).
REFERENCE_POLICY = "session-affinity"

#: The model whose share of served queries the paper reports (Section 6; paper.MECHANISMS).
LARGE_MODEL = "Llama-3.1-70B"

#: Summary columns that :func:`normalize` turns into ratios by default (Table 1 / Table 2), and
#: the names of the ratio columns (unitless, so the unit leaves the name).
NORMALIZED_COLUMNS: dict[str, str] = {
    "total_co2_kg": "co2_rel",
    "total_energy_kwh": "energy_rel",
    "mean_quality": "quality_rel",
}

#: Quantile of the TTFT distribution reported by :func:`summarize`.
_TTFT_QUANTILE = 0.95

#: Rows of a records table checked for consistency are compared with this tolerance (tokens).
_TOKEN_TOL = 1e-6

# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------


def validate_records(records: pd.DataFrame, name: str = "records") -> None:
    """Check a records table and raise a clear error naming the column or row at fault.

    Checks: every column of :data:`RECORD_COLUMNS` is present with a compatible dtype; at least
    one row; no missing session / turn / token / energy / carbon values; 0 ≤ cached ≤ history and
    recomputed = history − cached (tokens) on a served query; a rejected query is not best-effort
    and has zero recomputed tokens, energy and carbon. Extra columns are allowed.

    Raises
    ------
    ValueError, TypeError
        Naming ``name``, the column and the first offending row index.
    """
    if not isinstance(records, pd.DataFrame):
        raise TypeError(f"{name}: expected a pandas DataFrame, got {type(records).__name__}")
    missing = [c for c in RECORD_COLUMNS if c not in records.columns]
    if missing:
        raise ValueError(f"{name}: missing column(s) {missing}")
    if len(records) == 0:
        raise ValueError(f"{name}: empty records table (no queries)")
    for col, kind in RECORD_COLUMNS.items():
        s = records[col]
        if kind == "bool" and not pd.api.types.is_bool_dtype(s.dtype):
            raise TypeError(f"{name}: column {col!r} must be boolean, got dtype {s.dtype}")
        if kind == "int" and not pd.api.types.is_integer_dtype(s.dtype):
            raise TypeError(f"{name}: column {col!r} must be integer, got dtype {s.dtype}")
        if kind == "float" and not pd.api.types.is_numeric_dtype(s.dtype):
            raise TypeError(f"{name}: column {col!r} must be numeric, got dtype {s.dtype}")
    # Quality and TTFT may be NaN on rejected rows; everything we sum must not be.
    for col in (
        "history_tokens",
        "cached_tokens",
        "recomputed_tokens",
        "energy_kwh",
        "carbon_g",
        "recompute_energy_kwh",
    ):
        _first_bad(records, records[col].isna().to_numpy(), f"{name}: NaN in column {col!r}")
    hist = records["history_tokens"].to_numpy(np.float64)
    cached = records["cached_tokens"].to_numpy(np.float64)
    recomputed = records["recomputed_tokens"].to_numpy(np.float64)
    _first_bad(records, cached < 0, f"{name}: negative cached_tokens")
    _first_bad(records, cached > hist + _TOKEN_TOL, f"{name}: cached_tokens > history_tokens")
    rejected = records["rejected"].to_numpy(bool)
    _first_bad(
        records,
        np.abs(recomputed - np.where(rejected, 0.0, hist - cached)) > _TOKEN_TOL,
        f"{name}: recomputed_tokens != history_tokens - cached_tokens (0 on a rejected query)",
    )
    _first_bad(
        records,
        rejected & records["best_effort"].to_numpy(bool),
        f"{name}: a query is both rejected and best-effort",
    )
    for col in ("energy_kwh", "carbon_g"):
        _first_bad(
            records,
            rejected & (records[col].to_numpy(np.float64) != 0),
            f"{name}: rejected query with nonzero {col}",
        )
    served = ~rejected
    for col in ("quality", "ttft_s"):
        _first_bad(
            records,
            served & records[col].isna().to_numpy(),
            f"{name}: NaN {col} on a served query",
        )


def _first_bad(records: pd.DataFrame, bad: np.ndarray, message: str) -> None:
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        row = records.iloc[i]
        raise ValueError(
            f"{message} ({int(bad.sum())} row(s); first at index {records.index[i]!r}, "
            f"session {row['session']}, turn {row['turn']})"
        )


# ---------------------------------------------------------------------------------------------
# Summary of one run (docs/model.md §9)
# ---------------------------------------------------------------------------------------------


def _div(num: float, den: float) -> float:
    """num / den, NaN when the denominator is zero (a metric with an empty population)."""
    return float(num) / float(den) if den else float("nan")


def summarize(records: pd.DataFrame) -> pd.Series:
    """Every metric of ``docs/model.md`` §9 for one policy run.

    Populations: *queries* = all rows (served and rejected); *served* = rows with
    ``rejected == False``; *sessions* = distinct ``session`` values (including sessions whose every
    turn was rejected). A metric whose denominator is zero is NaN.

    Returns
    -------
    pd.Series
        ``n_queries``, ``n_served``, ``n_sessions`` (counts);
        ``total_co2_kg`` — Σ carbon_g / 1,000 over all queries (rejected ones emit 0), kg CO2e;
        ``total_energy_kwh`` — Σ energy_kwh over all queries, kWh;
        ``mean_quality`` — mean predicted quality of the chosen model over served queries;
        ``p95_ttft_s`` — 95th percentile of the estimated TTFT over served queries, s, as the
        smallest value whose empirical CDF reaches 0.95 (numpy ``method="inverted_cdf"``; the
        same definition the session bootstrap uses for quantiles);
        ``share_best_effort`` — best-effort queries / all queries;
        ``share_rejected`` — rejected queries / all queries;
        ``kv_hit_rate_tokens`` — Σ cached_tokens / Σ history_tokens over served queries;
        ``full_hit_share`` — served queries with history > 0 and cached == history / served
        queries with history > 0 (first turns, which have nothing to hit, are excluded);
        ``share_history_recomputed`` — Σ recomputed_tokens / Σ history_tokens over served
        queries (= 1 − kv_hit_rate_tokens; history of rejected queries is neither cached nor
        recomputed, so it is not counted);
        ``switches_per_session`` — Σ switched / sessions;
        ``switch_opportunities_per_session`` — Σ switch_opportunity / sessions;
        ``gate_blocked_per_session`` — Σ gate_blocked / sessions;
        ``recompute_energy_per_query_mwh`` — Σ recompute_energy_kwh · 10⁶ / served queries, mWh;
        ``share_in_cleanest_region`` — served queries with in_cleanest_region / served queries;
        ``share_on_70b`` — served queries with model == "Llama-3.1-70B" / served queries.
    """
    validate_records(records)
    return pd.Series(_summary_dict(records), dtype=np.float64)


#: The metrics :func:`summarize` returns, in order.
SUMMARY_METRICS: tuple[str, ...] = (
    "n_queries", "n_served", "n_sessions", "total_co2_kg", "total_energy_kwh", "mean_quality",
    "p95_ttft_s", "share_best_effort", "share_rejected", "kv_hit_rate_tokens", "full_hit_share",
    "share_history_recomputed", "switches_per_session", "switch_opportunities_per_session",
    "gate_blocked_per_session", "recompute_energy_per_query_mwh", "share_in_cleanest_region",
    "share_on_70b",
)


def _summary_dict(records: pd.DataFrame) -> dict[str, float | int]:
    """The metrics of :func:`summarize` as a dict (counts stay int); records already validated."""
    rejected = records["rejected"].to_numpy(bool)
    served = ~rejected
    n_queries = len(records)
    n_served = int(served.sum())
    n_sessions = int(records["session"].nunique())

    hist = records["history_tokens"].to_numpy(np.float64)[served]
    cached = records["cached_tokens"].to_numpy(np.float64)[served]
    recomputed = records["recomputed_tokens"].to_numpy(np.float64)[served]
    with_history = hist > 0
    # Full hit: every history token cached (token counts are integers stored as numbers).
    full_hit = with_history & (cached >= hist - _TOKEN_TOL)

    # The bootstrap's quantile routine with every query weighted 1 (one pseudo-session), so
    # the paired CI of a P95 ratio is centred on exactly this value.
    ttft = np.sort(records["ttft_s"].to_numpy(np.float64)[served])
    p95 = float(
        _weighted_quantile(
            ttft, np.zeros(len(ttft), np.int64), np.ones((1, 1), np.int64), _TTFT_QUANTILE
        )[0]
    )

    def total(col: str, mask: np.ndarray | None = None) -> float:
        v = records[col].to_numpy(np.float64)
        return float(v.sum() if mask is None else v[mask].sum())

    def count(col: str, mask: np.ndarray | None = None) -> int:
        v = records[col].to_numpy(bool)
        return int(v.sum() if mask is None else v[mask].sum())

    return {
        "n_queries": n_queries,
        "n_served": n_served,
        "n_sessions": n_sessions,
        "total_co2_kg": total("carbon_g") / 1e3,
        "total_energy_kwh": total("energy_kwh"),
        "mean_quality": _div(total("quality", served), n_served),
        "p95_ttft_s": p95,
        "share_best_effort": _div(count("best_effort", served), n_queries),
        "share_rejected": _div(int(rejected.sum()), n_queries),
        "kv_hit_rate_tokens": _div(cached.sum(), hist.sum()),
        "full_hit_share": _div(full_hit.sum(), with_history.sum()),
        "share_history_recomputed": _div(recomputed.sum(), hist.sum()),
        "switches_per_session": _div(count("switched"), n_sessions),
        "switch_opportunities_per_session": _div(count("switch_opportunity"), n_sessions),
        "gate_blocked_per_session": _div(count("gate_blocked"), n_sessions),
        "recompute_energy_per_query_mwh": _div(
            total("recompute_energy_kwh", served) * 1e6, n_served
        ),
        "share_in_cleanest_region": _div(count("in_cleanest_region", served), n_served),
        "share_on_70b": _div(
            int((records["model"].to_numpy(object)[served] == LARGE_MODEL).sum()), n_served
        ),
    }


def summary_table(records_by_policy: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """:func:`summarize` of each run, one row per policy (index ``policy``, in mapping order)."""
    if not records_by_policy:
        raise ValueError("records_by_policy is empty")
    rows = {}
    for policy, records in records_by_policy.items():
        try:
            validate_records(records)
        except (ValueError, TypeError) as exc:
            raise type(exc)(f"policy {policy!r}: {exc}") from exc
        rows[policy] = _summary_dict(records)
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "policy"
    return table


def _find_label(index: pd.Index, label: str, what: str) -> object:
    """``label`` in ``index``, else its unique case-insensitive match, else a KeyError."""
    if label in index:
        return label
    matches = [x for x in index if str(x).lower() == str(label).lower()]
    if len(matches) == 1:
        return matches[0]
    raise KeyError(f"{what} {label!r} not found; available: {list(index)}")


def normalize(
    summary: pd.DataFrame,
    reference: str = REFERENCE_POLICY,
    columns: Mapping[str, str] | Sequence[str] = NORMALIZED_COLUMNS,
    keep: Sequence[str] | None = ("p95_ttft_s",),
) -> pd.DataFrame:
    """Ratios of summary columns to the reference policy's row (``docs/model.md`` §9:
    Session-Affinity = 1).

    Parameters
    ----------
    summary : DataFrame
        One row per policy (e.g. :func:`summary_table`), index = policy names.
    reference : str
        Row to divide by; matched exactly, else case-insensitively.
    columns : mapping or sequence
        Columns to normalize. A mapping gives the output name of each ratio (default: CO2, energy
        and quality → ``co2_rel``, ``energy_rel``, ``quality_rel``); a sequence names them
        ``<column>_rel``.
    keep : sequence or None
        Columns copied unchanged after the ratios (default the P95 TTFT, which the paper reports
        in seconds); None keeps every column that is not normalized.

    Returns
    -------
    DataFrame
        Same index as ``summary``; the reference row's ratios are exactly 1.

    Raises
    ------
    KeyError
        Unknown reference or column. ValueError: a reference value is zero or NaN.
    """
    ref = _find_label(summary.index, reference, "reference policy")
    names = dict(columns) if isinstance(columns, Mapping) else {c: f"{c}_rel" for c in columns}
    out = {}
    for col, new in names.items():
        if col not in summary.columns:
            raise KeyError(f"column {col!r} not in the summary; available: {list(summary.columns)}")
        denom = float(summary.at[ref, col])
        if not np.isfinite(denom) or denom == 0:
            raise ValueError(f"cannot normalize {col!r}: reference {ref!r} has value {denom}")
        out[new] = summary[col].astype(np.float64) / denom
    kept = [c for c in summary.columns if c not in names] if keep is None else list(keep)
    for col in kept:
        if col not in summary.columns:
            raise KeyError(f"column {col!r} not in the summary; available: {list(summary.columns)}")
        out[col] = summary[col]
    return pd.DataFrame(out, index=summary.index)


# ---------------------------------------------------------------------------------------------
# Paired session-level bootstrap
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BootstrapCI:
    """A point estimate with a percentile bootstrap confidence interval.

    Attributes
    ----------
    estimate
        The statistic on the full sample (every session once), in the unit of the function
        that made it (%, or a plain ratio).
    low, high
        Percentile CI bounds: the (1 − ci)/2 and (1 + ci)/2 quantiles of the valid draws
        (numpy's default linear interpolation).
    ci
        Confidence level, e.g. 0.95.
    n_sessions, n_boot
        Sessions compared; bootstrap draws.
    n_clusters
        Units resampled: conversations (their sessions drawn together), or the sessions when
        the records carry no ``conversation`` column.
    n_invalid
        Draws whose statistic was undefined (e.g. a zero denominator) and left out of the CI.
    draws
        The statistic of every draw, shape (n_boot,) (NaN for invalid draws).
    """

    estimate: float
    low: float
    high: float
    ci: float
    n_sessions: int
    n_boot: int
    n_invalid: int = 0
    draws: np.ndarray = field(default_factory=lambda: np.empty(0), repr=False, compare=False)
    n_clusters: int = -1


def bootstrap_counts(
    n_sessions: int, n_boot: int, seed: int | np.random.Generator = 0, chunk_rows: int = 256
) -> Iterator[np.ndarray]:
    """Session multiplicities of ``n_boot`` bootstrap draws, in chunks.

    Each draw picks ``n_sessions`` sessions uniformly with replacement; its row of the yielded
    (chunk × n_sessions) int64 matrix says how many times each session was drawn (rows sum to
    ``n_sessions``). The draws do not depend on ``chunk_rows`` (the generator's stream is
    consumed row after row), so it is only a memory knob.
    """
    if n_sessions < 1:
        raise ValueError(f"n_sessions must be >= 1, got {n_sessions}")
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    for start in range(0, n_boot, chunk_rows):
        rows = min(chunk_rows, n_boot - start)
        idx = rng.integers(0, n_sessions, size=(rows, n_sessions))
        # Offset each row's indices into its own block so one bincount counts every row.
        flat = (idx + (np.arange(rows) * n_sessions)[:, None]).ravel()
        yield np.bincount(flat, minlength=rows * n_sessions).reshape(rows, n_sessions)


Statistic = str  # "sum", "mean" or a quantile "pNN" (e.g. "p95")


def _parse_statistic(statistic: Statistic) -> tuple[str, float]:
    if statistic in ("sum", "mean"):
        return statistic, float("nan")
    if isinstance(statistic, str) and statistic.startswith("p"):
        try:
            q = float(statistic[1:]) / 100.0
        except ValueError:
            q = float("nan")
        if 0.0 < q <= 1.0:
            return "quantile", q
    raise ValueError(f"statistic must be 'sum', 'mean' or 'pNN' (e.g. 'p95'), got {statistic!r}")


def _weighted_quantile(
    sorted_values: np.ndarray, sorted_codes: np.ndarray, counts: np.ndarray, q: float,
    per_session: np.ndarray | None = None,
) -> np.ndarray:
    """Inverted-CDF q-quantile of ``sorted_values`` under each row of session weights ``counts``.

    Value i (ascending) carries weight ``counts[r, sorted_codes[i]]`` in draw r. The quantile is
    the smallest value whose weighted empirical CDF reaches q: with integer weights, cumulative
    weight W_i and total T, it is value number #{i : W_i < m}, m = ceil(q·T) — numpy's
    ``method="inverted_cdf"``. Returns NaN where T = 0.

    Why from the top: the weight strictly above position i is T − W_i, and W_i < m ⇔ T − W_i >
    T − m, so the quantile's position is the lowest i whose weight above is at most T − m. A
    scan down from the largest value finds it after the top (1 − q) of the weight, without the
    cumulative sums of every value. ``per_session``: values per session
    (``np.bincount(sorted_codes)``), when the caller has it.
    """
    if per_session is None:
        per_session = np.bincount(sorted_codes, minlength=counts.shape[1])
    total = counts @ per_session
    above = total - np.ceil(q * total)  # weight that may lie strictly above the quantile
    out = np.full(len(counts), np.nan)
    if len(sorted_values):
        _scan_quantile(np.ascontiguousarray(sorted_values, np.float64),
                       np.ascontiguousarray(sorted_codes, np.int64),
                       np.ascontiguousarray(counts, np.int64), total, above, out)
    return out


@njit(cache=True)
def _scan_quantile(sorted_values, sorted_codes, counts, total, above, out):
    """The scan of :func:`_weighted_quantile`: per draw with T > 0, move down from the top value
    while the weight above the next lower position stays within ``above``."""
    n = len(sorted_values)
    for r in range(counts.shape[0]):
        if total[r] <= 0:
            continue
        lim = above[r]
        acc = 0
        i = n - 1
        while i > 0:
            w = counts[r, sorted_codes[i]]
            if acc + w > lim:
                break
            acc += w
            i -= 1
        out[r] = sorted_values[i]


class _SessionStatistic:
    """A statistic of one run, precomputed per session so each draw costs one product.

    - "sum": Σ metric over all queries (rejected ones included: they add 0 energy/carbon);
    - "mean": Σ metric / count over served queries;
    - "quantile": inverted-CDF quantile of the metric over served queries, each query weighted by
      its session's multiplicity in the draw.
    """

    def __init__(
        self, records: pd.DataFrame, codes: np.ndarray, n: int, metric: str, statistic: Statistic
    ) -> None:
        self.kind, self.q = _parse_statistic(statistic)
        values = records[metric].to_numpy(np.float64)
        if self.kind != "sum":
            served = ~records["rejected"].to_numpy(bool)
            values, codes = values[served], codes[served]
        if np.isnan(values).any():
            raise ValueError(f"NaN in column {metric!r} of the rows the statistic uses")
        self.n = n
        if self.kind == "sum":
            self.sums = np.bincount(codes, weights=values, minlength=n)
        elif self.kind == "mean":
            self.sums = np.bincount(codes, weights=values, minlength=n)
            self.counts = np.bincount(codes, minlength=n).astype(np.float64)
        else:
            order = np.argsort(values, kind="stable")
            self.sorted_values = np.ascontiguousarray(values[order])
            self.sorted_codes = np.ascontiguousarray(codes[order], dtype=np.int64)
            self.per_session = np.bincount(self.sorted_codes, minlength=n)

    @property
    def width(self) -> int:
        """Columns of the per-chunk work matrix (sets the chunk size): one per session, every
        statistic (the quantile scans the sorted values in place)."""
        return self.n

    def __call__(self, counts: np.ndarray) -> np.ndarray:
        """The statistic for each row of session multiplicities ``counts`` (draws × sessions)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            if self.kind == "sum":
                return counts @ self.sums
            if self.kind == "mean":
                return (counts @ self.sums) / (counts @ self.counts)
            return _weighted_quantile(self.sorted_values, self.sorted_codes, counts, self.q,
                                      self.per_session)


def _session_index(records: pd.DataFrame) -> pd.Series:
    """Queries per session, indexed by session id (sorted)."""
    return records.groupby("session", sort=True).size()


def _aligned_sessions(
    records_a: pd.DataFrame, records_b: pd.DataFrame, sessions: Sequence[int] | None
) -> np.ndarray:
    """The sorted session ids both runs hold (restricted to ``sessions``), or a clear error."""
    validate_records(records_a, "records_a")
    validate_records(records_b, "records_b")
    qa, qb = _session_index(records_a), _session_index(records_b)
    only_a = qa.index.difference(qb.index)
    only_b = qb.index.difference(qa.index)
    if len(only_a) or len(only_b):
        raise ValueError(
            "records_a and records_b do not hold the same sessions: "
            f"{len(only_a)} only in A (e.g. {list(only_a[:5])}), "
            f"{len(only_b)} only in B (e.g. {list(only_b[:5])}); a paired comparison needs "
            "runs of the same trace"
        )
    differ = qa.index[qa.to_numpy() != qb.to_numpy()]
    if len(differ):
        s = differ[0]
        raise ValueError(
            f"records_a and records_b differ in queries per session for {len(differ)} session(s) "
            f"(e.g. session {s}: {qa[s]} in A, {qb[s]} in B); a paired comparison needs runs of "
            "the same trace with every query recorded (rejected ones included)"
        )
    ids = qa.index.to_numpy()
    if sessions is None:
        return ids
    wanted = np.asarray(sessions)
    if wanted.ndim != 1:
        raise ValueError(f"sessions must be one-dimensional, got shape {wanted.shape}")
    if len(wanted) == 0:
        raise ValueError("sessions is empty: nothing to compare")
    # Sort-based: numpy 2.4's hash-based np.unique / setdiff1d cost ~70× a sort here.
    uniq = np.sort(wanted)
    n_dup = int((uniq[1:] == uniq[:-1]).sum())
    if n_dup:
        raise ValueError(f"sessions holds {n_dup} duplicate id(s)")
    pos = np.minimum(np.searchsorted(ids, uniq), max(len(ids) - 1, 0))
    absent = uniq[ids[pos] != uniq] if len(ids) else uniq
    if len(absent):
        raise ValueError(
            f"{len(absent)} requested session(s) are not in the records "
            f"(e.g. {absent[:5].tolist()})"
        )
    return uniq


def _codes(records: pd.DataFrame, ids: np.ndarray) -> tuple[pd.DataFrame, np.ndarray]:
    """Rows of ``records`` whose session is in ``ids``, and each row's position in ``ids``."""
    sess = records["session"].to_numpy()
    keep = np.isin(sess, ids)
    return records.loc[keep], np.searchsorted(ids, sess[keep])


def _conversation_of(records: pd.DataFrame, name: str) -> pd.Series | None:
    """The conversation of each session (indexed by session id, sorted), or None without a
    ``conversation`` column; a session with two conversations is an error."""
    if "conversation" not in records.columns:
        return None
    per = records.groupby("session", sort=True)["conversation"]
    first = per.first()
    if (per.nunique() > 1).any():
        s = int(first.index[(per.nunique() > 1).to_numpy()][0])
        raise ValueError(f"{name}: session {s} has rows of several conversations")
    return first


def _clusters(records_a: pd.DataFrame, records_b: pd.DataFrame,
              ids: np.ndarray) -> tuple[np.ndarray, int]:
    """The resampling unit of each session of ``ids`` (its conversation's position among the
    conversations of ``ids``; the session itself without conversations) and their number."""
    conv_a = _conversation_of(records_a, "records_a")
    conv_b = _conversation_of(records_b, "records_b")
    if conv_a is None or conv_b is None:
        return np.arange(len(ids)), len(ids)
    ca, cb = conv_a.loc[ids].to_numpy(), conv_b.loc[ids].to_numpy()
    if not np.array_equal(ca, cb):
        raise ValueError("records_a and records_b map sessions to different conversations; a "
                         "paired comparison needs runs of the same trace")
    units, unit_of = np.unique(ca, return_inverse=True)
    return unit_of.ravel(), len(units)


def _paired_ratio_draws(
    records_a: pd.DataFrame,
    records_b: pd.DataFrame,
    metric: str,
    statistic: Statistic,
    n_boot: int,
    seed: int | np.random.Generator,
    sessions: Sequence[int] | None,
    chunk_elements: int,
) -> tuple[float, np.ndarray, int, int]:
    """Full-sample ratio stat(A)/stat(B), its bootstrap draws, the number of sessions and of
    resampled units (conversations)."""
    for name, rec in (("records_a", records_a), ("records_b", records_b)):
        if metric not in rec.columns:
            raise KeyError(f"{name}: metric column {metric!r} not found")
    ids = _aligned_sessions(records_a, records_b, sessions)
    unit_of, n = _clusters(records_a, records_b, ids)
    rows_a, codes_a = _codes(records_a, ids)
    rows_b, codes_b = _codes(records_b, ids)
    stat_a = _SessionStatistic(rows_a, unit_of[codes_a], n, metric, statistic)
    stat_b = _SessionStatistic(rows_b, unit_of[codes_b], n, metric, statistic)
    ones = np.ones((1, n), dtype=np.int64)
    full_a, full_b = float(stat_a(ones)[0]), float(stat_b(ones)[0])
    if not np.isfinite(full_b) or full_b == 0 or not np.isfinite(full_a):
        raise ValueError(
            f"{statistic} of {metric!r} is {full_a} for A and {full_b} for B over {n} sessions: "
            "the ratio A/B is undefined"
        )
    chunk_rows = max(1, chunk_elements // max(stat_a.width, stat_b.width, n))
    return full_a / full_b, _ratio_draws(stat_a, stat_b, n, n_boot, seed, chunk_rows), len(ids), n


def _ratio_draws(stat_a: Callable[[np.ndarray], np.ndarray],
                 stat_b: Callable[[np.ndarray], np.ndarray], n: int, n_boot: int,
                 seed: int | np.random.Generator, chunk_rows: int) -> np.ndarray:
    """``n_boot`` draws of stat_a / stat_b, each statistic a function of a (rows, n) matrix of
    resampling multiplicities of the n units (:func:`bootstrap_counts`, ``chunk_rows`` rows at
    a time). The same multiplicities for A and B: this is what makes the bootstrap paired."""
    draws = np.empty(n_boot)
    start = 0
    for counts in bootstrap_counts(n, n_boot, seed, chunk_rows):
        with np.errstate(divide="ignore", invalid="ignore"):
            draws[start : start + len(counts)] = stat_a(counts) / stat_b(counts)
        start += len(counts)
    return draws


def _percentile_ci(estimate: float, draws: np.ndarray, ci: float, n_sessions: int,
                   n_clusters: int = -1) -> BootstrapCI:
    valid = np.isfinite(draws)
    n_invalid = int((~valid).sum())
    if not valid.any():
        raise ValueError(f"all {len(draws)} bootstrap draws are undefined")
    draws = np.where(valid, draws, np.nan)
    low, high = np.quantile(draws[valid], [(1 - ci) / 2, (1 + ci) / 2])
    return BootstrapCI(
        estimate=float(estimate),
        low=float(low),
        high=float(high),
        ci=ci,
        n_sessions=n_sessions,
        n_boot=len(draws),
        n_invalid=n_invalid,
        draws=draws,
        n_clusters=n_clusters,
    )


def _check_ci(ci: float, n_boot: int) -> None:
    if not 0 < ci < 1:
        raise ValueError(f"ci must be in (0, 1), got {ci}")
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")


def paired_ratio_ci(
    records_a: pd.DataFrame,
    records_b: pd.DataFrame,
    metric: str = "carbon_g",
    statistic: Statistic = "sum",
    n_boot: int = 2000,
    seed: int | np.random.Generator = 0,
    ci: float = 0.95,
    sessions: Sequence[int] | None = None,
    chunk_elements: int = 1 << 22,
) -> BootstrapCI:
    """Ratio stat(A) / stat(B) of two runs of the same trace, with a paired session bootstrap CI.

    Parameters
    ----------
    records_a, records_b : DataFrame
        Records tables of two policies over the same sessions (same queries per session).
    metric : str
        Column the statistic is taken of (e.g. ``carbon_g``, ``energy_kwh``, ``ttft_s``).
    statistic : str
        ``"sum"`` over all queries (rejected rows included; they carry zero energy and carbon);
        ``"mean"`` over served queries; ``"pNN"`` (e.g. ``"p95"``) the inverted-CDF quantile over
        served queries — the definition :func:`summarize` uses for ``p95_ttft_s``.
    n_boot : int
        Bootstrap draws. Each draws the sessions uniformly with replacement (as many as there
        are); A and B use the same draws (paired).
    seed : int or Generator
        Seed of the draws; the same seed resamples the same sessions for any
        ``chunk_elements`` (the statistics then agree up to floating-point summation order).
    ci : float
        Confidence level of the percentile interval.
    sessions : sequence of int, optional
        Restrict both runs to these session ids (e.g. :func:`sessions_longer_than`).
    chunk_elements : int
        Memory knob: elements of the per-chunk (draws × sessions) work matrix (8 bytes each).

    Raises
    ------
    ValueError
        The runs do not hold the same sessions / queries per session, a requested session is
        missing, or stat(B) is zero on the full sample.
    """
    _check_ci(ci, n_boot)
    est, draws, n, units = _paired_ratio_draws(
        records_a, records_b, metric, statistic, n_boot, seed, sessions, chunk_elements
    )
    return _percentile_ci(est, draws, ci, n, units)


def paired_change_ci(
    records_a: pd.DataFrame,
    records_b: pd.DataFrame,
    metric: str = "carbon_g",
    statistic: Statistic = "sum",
    n_boot: int = 2000,
    seed: int | np.random.Generator = 0,
    ci: float = 0.95,
    sessions: Sequence[int] | None = None,
    chunk_elements: int = 1 << 22,
) -> BootstrapCI:
    """Change of A relative to B in %, 100·(stat(A)/stat(B) − 1), with a paired bootstrap CI.

    Table 2's "ΔCO2" / "ΔTTFT" of an ablation A over CarbonRouter B (``metric="ttft_s",
    statistic="p95"`` for ΔTTFT). Parameters and errors as :func:`paired_ratio_ci`; the CI is the
    percentile interval of the transformed draws.
    """
    _check_ci(ci, n_boot)
    est, draws, n, units = _paired_ratio_draws(
        records_a, records_b, metric, statistic, n_boot, seed, sessions, chunk_elements
    )
    return _percentile_ci(100.0 * (est - 1.0), 100.0 * (draws - 1.0), ci, n, units)


def paired_saving_ci(
    records_a: pd.DataFrame,
    records_b: pd.DataFrame,
    metric: str = "carbon_g",
    n_boot: int = 2000,
    seed: int | np.random.Generator = 0,
    ci: float = 0.95,
    sessions: Sequence[int] | None = None,
    chunk_elements: int = 1 << 22,
) -> BootstrapCI:
    """Saving of policy A over policy B in %, 100·(1 − ΣA/ΣB), with a paired session bootstrap CI.

    The sums run over every query of the (selected) sessions; e.g. ``metric="carbon_g"`` gives
    Table 1's last column with A = CarbonRouter. The CI is the percentile interval of the
    savings of ``n_boot`` draws of sessions with replacement, the same draws for A and B. See
    :func:`paired_ratio_ci` for the parameters and errors.
    """
    _check_ci(ci, n_boot)
    est, draws, n, units = _paired_ratio_draws(
        records_a, records_b, metric, "sum", n_boot, seed, sessions, chunk_elements
    )
    return _percentile_ci(100.0 * (1.0 - est), 100.0 * (1.0 - draws), ci, n, units)


_KINDS = {
    "saving": (paired_saving_ci, ("saving_pct", "ci_low_pct", "ci_high_pct")),
    "change": (paired_change_ci, ("change_pct", "ci_low_pct", "ci_high_pct")),
    "ratio": (paired_ratio_ci, ("ratio", "ci_low", "ci_high")),
}


def _ci_row(res: BootstrapCI, kind: str) -> dict[str, float | int]:
    names = _KINDS[kind][1]
    return {
        names[0]: res.estimate,
        names[1]: res.low,
        names[2]: res.high,
        "n_sessions": res.n_sessions,
        "n_boot": res.n_boot,
        "n_invalid": res.n_invalid,
    }


def _paired(
    kind: str, records_a: pd.DataFrame, records_b: pd.DataFrame, statistic: Statistic, **kwargs
) -> BootstrapCI:
    """Dispatch on ``kind`` (see :func:`paired_table`)."""
    _check_kind(kind, statistic)
    if kind == "saving":
        return paired_saving_ci(records_a, records_b, **kwargs)
    return _KINDS[kind][0](records_a, records_b, statistic=statistic, **kwargs)


def _check_kind(kind: str, statistic: Statistic) -> None:
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {sorted(_KINDS)}, got {kind!r}")
    _parse_statistic(statistic)
    if kind == "saving" and statistic != "sum":
        raise ValueError("kind='saving' is defined on sums; use kind='change' for other statistics")


def paired_table(
    records_by_policy: Mapping[str, pd.DataFrame],
    target: str = "carbonrouter",
    kind: Literal["saving", "change", "ratio"] = "saving",
    metric: str = "carbon_g",
    statistic: Statistic = "sum",
    n_boot: int = 2000,
    seed: int = 0,
    ci: float = 0.95,
    sessions: Sequence[int] | None = None,
) -> pd.DataFrame:
    """The target policy against every other policy, one row per other policy, with paired CIs.

    - ``kind="saving"``: the target's saving over the row's policy, 100·(1 − Σtarget/Σrow) %
      (Table 1's last column); columns ``saving_pct, ci_low_pct, ci_high_pct``;
    - ``kind="change"``: the row's change relative to the target, 100·(stat(row)/stat(target) − 1)
      % (Table 2's ΔCO2, ΔTTFT of each ablation); columns ``change_pct, ci_low_pct, ci_high_pct``;
    - ``kind="ratio"``: stat(row)/stat(target); columns ``ratio, ci_low, ci_high``.

    Every row also has ``n_sessions``, ``n_boot``, ``n_invalid``. All rows use the same seed, so
    the same session draws. Index: ``baseline`` (policy names, mapping order, target left out).
    """
    _check_kind(kind, statistic)
    ref = _find_label(pd.Index(list(records_by_policy)), target, "target policy")
    rows = {}
    for policy, records in records_by_policy.items():
        if policy == ref:
            continue
        # Saving: the target over the row; change and ratio: the row relative to the target.
        a, b = (
            (records_by_policy[ref], records)
            if kind == "saving"
            else (records, records_by_policy[ref])
        )
        try:
            res = _paired(
                kind,
                a,
                b,
                statistic,
                metric=metric,
                n_boot=n_boot,
                seed=seed,
                ci=ci,
                sessions=sessions,
            )
        except (ValueError, KeyError) as exc:
            raise type(exc)(f"{policy!r} vs {ref!r}: {exc}") from exc
        rows[policy] = _ci_row(res, kind)
    if not rows:
        raise ValueError(f"no policy besides the target {ref!r}")
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "baseline"
    return table


def saving_table(
    records_by_policy: Mapping[str, pd.DataFrame],
    target: str = "carbonrouter",
    metric: str = "carbon_g",
    n_boot: int = 2000,
    seed: int = 0,
    ci: float = 0.95,
    sessions: Sequence[int] | None = None,
) -> pd.DataFrame:
    """Saving % of ``target`` over every other policy with paired CIs (Table 1's last column).

    :func:`paired_table` with ``kind="saving"``: columns ``saving_pct, ci_low_pct, ci_high_pct,
    n_sessions, n_boot, n_invalid``, index ``baseline``.
    """
    return paired_table(
        records_by_policy,
        target=target,
        kind="saving",
        metric=metric,
        n_boot=n_boot,
        seed=seed,
        ci=ci,
        sessions=sessions,
    )


# ---------------------------------------------------------------------------------------------
# Session-length groups (the paper's Figure 4)
# ---------------------------------------------------------------------------------------------


def _turns_per_session(records: pd.DataFrame) -> pd.Series:
    """The session length (``n_turns``, turns in the trace) of each session, checked constant."""
    g = records.groupby("session", sort=True)["n_turns"]
    lo, hi = g.min(), g.max()
    bad = lo.index[lo.to_numpy() != hi.to_numpy()]
    if len(bad):
        raise ValueError(
            f"n_turns differs within {len(bad)} session(s) (e.g. session {bad[0]}: "
            f"{lo[bad[0]]} vs {hi[bad[0]]})"
        )
    return lo


def sessions_longer_than(records: pd.DataFrame, turns: int) -> np.ndarray:
    """Sorted ids of the sessions with more than ``turns`` turns (``n_turns > turns``)."""
    n_turns = _turns_per_session(records)
    return n_turns.index.to_numpy()[n_turns.to_numpy() > turns]


def _group_labels(thresholds: Sequence[int], include_all: bool) -> list[tuple[str, int]]:
    ts = [int(t) for t in thresholds]
    if any(t < 0 for t in ts):
        raise ValueError(f"thresholds must be >= 0, got {ts}")
    groups = [("all", 0)] if include_all else []
    return groups + [(f"> {t}", t) for t in ts]


def by_session_length(
    records: pd.DataFrame,
    thresholds: Sequence[int] = (5, 10, 20, 30),
    include_all: bool = True,
) -> pd.DataFrame:
    """:func:`summarize` per session-length group (sessions with more than t turns).

    Groups are nested ("> 5" contains "> 10"), as in the paper's Figure 4; a session's length is
    its ``n_turns`` (turns in the trace, whatever was served). Figure 4 reads
    ``kv_hit_rate_tokens``, ``switches_per_session``, ``recompute_energy_per_query_mwh`` and
    ``gate_blocked_per_session``; savings per group come from :func:`paired_by_session_length`.

    Returns
    -------
    DataFrame
        Index ``group`` ("all", "> 5", ...), a ``more_than_turns`` column (t; 0 for "all")
        and every :func:`summarize` column. A group without sessions has ``n_sessions = 0``,
        ``n_queries = 0`` and NaN metrics.
    """
    validate_records(records)
    rows = {}
    for label, t in _group_labels(thresholds, include_all):
        ids = sessions_longer_than(records, t)
        sub = records.loc[records["session"].isin(ids)]
        if len(sub):
            row = _summary_dict(sub)
        else:
            row = {k: np.nan for k in _summary_dict(records)}
            row.update(n_queries=0, n_served=0, n_sessions=0)
        rows[label] = {"more_than_turns": t, **row}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "group"
    return table


def paired_by_session_length(
    records_a: pd.DataFrame,
    records_b: pd.DataFrame,
    thresholds: Sequence[int] = (5, 10, 20, 30),
    kind: Literal["saving", "change", "ratio"] = "saving",
    metric: str = "carbon_g",
    statistic: Statistic = "sum",
    n_boot: int = 2000,
    seed: int = 0,
    ci: float = 0.95,
    include_all: bool = True,
) -> pd.DataFrame:
    """A paired comparison of A and B per session-length group, with bootstrap CIs.

    ``kind="saving"``: saving of A over B, 100·(1 − ΣA/ΣB) % (the paper's Figure 4: CarbonRouter
    over FairCarbon by session length); ``kind="change"``: 100·(stat(A)/stat(B) − 1) % (e.g. the CO2
    cost of removing the gate, A = w/o Gate, B = CarbonRouter); ``kind="ratio"``. Each group is
    bootstrapped on its own sessions (resampled within the group). Columns as :func:`paired_table`
    plus ``more_than_turns``; a group without sessions is a NaN row with ``n_sessions = 0``.
    """
    _check_kind(kind, statistic)
    _aligned_sessions(records_a, records_b, None)  # same trace, or a clear error first
    n_turns_a, n_turns_b = _turns_per_session(records_a), _turns_per_session(records_b)
    if not n_turns_a.equals(n_turns_b):
        raise ValueError("records_a and records_b disagree on n_turns of some session")
    rows = {}
    for label, t in _group_labels(thresholds, include_all):
        ids = sessions_longer_than(records_b, t)
        if len(ids) == 0:
            row: dict[str, float | int] = {c: np.nan for c in _KINDS[kind][1]}
            row.update(n_sessions=0, n_boot=n_boot, n_invalid=0)
        else:
            res = _paired(
                kind,
                records_a,
                records_b,
                statistic,
                metric=metric,
                n_boot=n_boot,
                seed=seed,
                ci=ci,
                sessions=ids,
            )
            row = _ci_row(res, kind)
        rows[label] = {"more_than_turns": t, **row}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "group"
    return table


# ---------------------------------------------------------------------------------------------
# Compact runs: what a service-scale replay keeps instead of its millions of records
# ---------------------------------------------------------------------------------------------

#: Additive quantities kept per conversation by :func:`conversation_sums`.
_SUM_COLUMNS: tuple[str, ...] = ("carbon_g", "energy_kwh")


def conversation_sums(records: pd.DataFrame) -> pd.DataFrame:
    """Per conversation (records' ``conversation``; the session without it): Σ carbon_g (gCO2e),
    Σ energy_kwh (kWh), queries and sessions — what the paired bootstrap of a saving resamples.
    Index ``conversation`` (sorted)."""
    validate_records(records)
    unit = records["conversation" if "conversation" in records.columns else "session"]
    grouped = records.groupby(unit.to_numpy(), sort=True)
    out = grouped[list(_SUM_COLUMNS)].sum()
    out["n_queries"] = grouped.size()
    out["n_sessions"] = grouped["session"].nunique()
    out.index.name = "conversation"
    return out


@dataclass(frozen=True)
class RunSummary:
    """A replay reduced to its metrics (:func:`summarize`) and its per-conversation sums
    (:func:`conversation_sums`): enough for Table 1's normalized quantities and the paired
    savings with their CIs (:func:`paired_saving_ci_sums`), at a few hundred kB whatever the
    number of queries. :func:`carbonrouter_lib.sweep.run_one` returns one for a spec with
    ``output="summary"``."""

    summary: pd.Series
    by_conversation: pd.DataFrame

    @classmethod
    def from_records(cls, records: pd.DataFrame) -> RunSummary:
        """The summary of a records table."""
        return cls(summarize(records), conversation_sums(records))


def paired_saving_ci_sums(
    sums_a: pd.DataFrame,
    sums_b: pd.DataFrame,
    metric: str = "carbon_g",
    n_boot: int = 2000,
    seed: int | np.random.Generator = 0,
    ci: float = 0.95,
) -> BootstrapCI:
    """:func:`paired_saving_ci` from per-conversation sums (:func:`conversation_sums` of two
    runs of the same trace): the same estimate and the same draws (conversations resampled
    with replacement, the same draws for A and B), without the records."""
    _check_ci(ci, n_boot)
    if not sums_a.index.equals(sums_b.index) or not np.array_equal(
        sums_a["n_queries"].to_numpy(), sums_b["n_queries"].to_numpy()
    ):
        raise ValueError("paired_saving_ci_sums: the runs do not hold the same conversations "
                         "with the same queries; a paired comparison needs runs of one trace")
    a = sums_a[metric].to_numpy(np.float64)
    b = sums_b[metric].to_numpy(np.float64)
    n = len(a)
    if b.sum() == 0:
        raise ValueError(f"sum of {metric!r} is 0 for B: the saving is undefined")
    draws = _ratio_draws(lambda counts: counts @ a, lambda counts: counts @ b, n, n_boot, seed,
                         max(1, (1 << 22) // max(n, 1)))
    est = float(a.sum() / b.sum())
    return _percentile_ci(100.0 * (1.0 - est), 100.0 * (1.0 - draws), ci,
                          int(sums_a["n_sessions"].sum()), n)
