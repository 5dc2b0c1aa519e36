"""A conversation trace of one's own: the format, reading it, and checking it row by row.

:func:`read_turns` reads a trace (a JSONL, CSV or parquet file, or a DataFrame) into a turns table
of the ShareGPT schema (:func:`carbonrouter_lib.sharegpt.turn_table`); :func:`carbonrouter_lib.
prepared.from_turns` turns that into the prepared workload every replay takes.

The trace format
----------------
One row per turn (a user message and the assistant's response); rows in any order. Columns (any
other column is ignored and named in a warning and in the report's ``ignored_columns``; a column
that looks like a time of its own, e.g. ``arrival_s`` or ``start_time``, is an error, since the
replay would otherwise draw the times it seems to give):

======================================  ==========================================================
column                                  meaning
======================================  ==========================================================
``conversation_id`` (or ``session_id``)  the conversation: a non-empty string or an integer ≥ 0
``turn``                                 its index in the conversation, an integer; a
                                         conversation's turns are exactly 0, 1, …, n−1
``new_tokens`` or ``user_text``          the user message: tokens (one count for every model), or
                                         per tokenizer family ``new_tokens_gemma3``,
                                         ``new_tokens_llama3``, ``new_tokens_mistral``; or its text,
                                         counted here under each family's tokenizer
``output_tokens`` or ``assistant_text``  the response, the same way (``output_tokens_<family>``)
``history_tokens`` (optional)            tokens of the context before the message (or per
                                         family); default the sum of all earlier turns' message and
                                         response tokens. 0 on turn 0; never more than the previous
                                         turn's history + message + response
``timestamp`` (optional)                 when the turn's message was sent: ISO 8601 (no zone =
                                         UTC, offsets converted) or seconds since the Unix epoch
                                         (numbers; seconds after ``time_origin`` when given). On
                                         turn 0 it is the session's start; on later turns (all or
                                         none) the think time is the gap to the previous message
                                         minus that turn's service time on the reference deployment
                                         (Llama-3.1-70B, 8×A100; floored at 0 s, counted)
``think_s`` (optional)                   seconds the user waited after the previous response
                                         before sending this message (turns ≥ 1; ignored, and
                                         counted, on turn 0)
``quality_<model>`` (optional)           predicted quality Q(m) ∈ [0, 1] for every model of
                                         :data:`~carbonrouter_lib.profiles.MODELS`
``est_output_tokens`` (optional)         output-length estimates of one's own (or per family)
======================================  ==========================================================

Without timestamps, sessions start by the arrival model (:class:`arrivals.ArrivalConfig`:
Poisson over the replay window); without ``think_s`` or later-turn timestamps, think times come
from its distribution. Tokens are whole numbers ≥ 0 and times are in seconds: a non-integer or
negative count, a string where a number belongs, a negative or missing think time, a
timestamp that looks like milliseconds (a number above 1e11) or a think time above 30 days
(milliseconds?), a duplicated (conversation, turn), a conversation whose turns are not 0…n−1, or
a timestamp earlier than its conversation's previous one is a ``ValueError`` naming the file and
the row (``line`` in JSONL and CSV files, ``row`` in parquet files and DataFrames), with the
conversation and turn.

JSONL: one JSON object per line (blank lines are skipped). CSV: a header row; ids are read as
text, an empty text cell as an empty message. Parquet: the columns above.
"""

from __future__ import annotations

import json
import math
import os
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from carbonrouter_lib.arrivals import ServiceTimeModel
from carbonrouter_lib.profiles import MODELS
from carbonrouter_lib.tokenizers import TOKENIZER_FAMILIES, count_tokens

__all__ = ["ID_COLUMNS", "MAX_THINK_S", "MS_STAMP", "TraceError", "read_turns"]

#: Accepted names of the conversation column (exactly one of them).
ID_COLUMNS: tuple[str, ...] = ("conversation_id", "session_id")
#: A numeric timestamp above this is taken for milliseconds (1e11 s is the year 5138).
MS_STAMP = 1e11
#: A think time above this (30 days) is taken for milliseconds or a unit mix-up.
MAX_THINK_S = 30 * 86_400.0
_NEGATIVE_INT_TEXT = re.compile(r"^\s*-\d+\s*$")


class TraceError(ValueError):
    """A trace breaks the format; the message names the source and the row."""


def _read(source: Any) -> tuple[pd.DataFrame, list[str], str, str | None]:
    """(table, where each row is, name of the source, SHA-256 of the file or None)."""
    if isinstance(source, pd.DataFrame):
        where = [f"row {label!r}" for label in source.index]
        return source.reset_index(drop=True), where, "turns (DataFrame)", None
    if not isinstance(source, str | os.PathLike):
        raise TypeError(f"a trace is a DataFrame or a path, got {type(source).__name__}")
    from carbonrouter_lib.datasets import sha256_of

    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"trace: no such file {path}")
    name, suffix = str(path), path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        records, where = [], []
        with open(path, encoding="utf-8") as fh:
            for n, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise TraceError(f"{name}, line {n}: not JSON ({exc.msg})") from None
                if not isinstance(rec, dict):
                    raise TraceError(f"{name}, line {n}: a turn must be a JSON object, got "
                                     f"{type(rec).__name__}")
                records.append(rec)
                where.append(f"line {n}")
        df = pd.DataFrame.from_records(records) if records else pd.DataFrame()
        # Keep values as written (an int stays an int, a string a string) for the checks.
        df = df.astype(object).where(df.notna(), None) if len(df) else df
    elif suffix == ".csv":
        try:
            df = pd.read_csv(path, dtype={c: str for c in ID_COLUMNS}, encoding="utf-8-sig")
        except (pd.errors.EmptyDataError, pd.errors.ParserError) as exc:
            raise TraceError(f"{name}: not a readable CSV ({exc})") from None
        for col in ("user_text", "assistant_text"):
            if col in df.columns:  # an empty cell is an empty message
                df[col] = df[col].astype(object).where(df[col].notna(), "")
        where = [f"line {i + 2}" for i in range(len(df))]
    elif suffix == ".parquet":
        df = pd.read_parquet(path)
        where = [f"row {i}" for i in range(len(df))]
    else:
        raise TraceError(f"{name}: unknown trace format {suffix!r}; use .jsonl, .csv or .parquet")
    return df, where, name, sha256_of(path)


class _Rows:
    """Error messages that name the source, the row and (once known) the conversation/turn."""

    def __init__(self, source: str, where: list[str]) -> None:
        self.source, self.where = source, where
        self.conv: list[str] | None = None
        self.turn: np.ndarray | None = None

    def fail(self, i: int, msg: str) -> None:
        ctx = ""
        if self.conv is not None:
            ctx = f" (conversation {self.conv[i]!r}"
            ctx += f", turn {int(self.turn[i])})" if self.turn is not None else ")"
        raise TraceError(f"{self.source}, {self.where[i]}{ctx}: {msg}")


def _is_missing(v: Any) -> bool:
    return v is None or (isinstance(v, float | np.floating) and math.isnan(v)) or v is pd.NA


def _numbers(df: pd.DataFrame, col: str, rows: _Rows, what: str, *, whole: bool,
             allow_missing: bool = False) -> np.ndarray:
    """float64 values of a numeric column: strings and booleans are errors, missing values are
    errors unless allowed (NaN then), and with ``whole`` non-integers and negatives are too."""
    series = df[col]
    if pd.api.types.is_numeric_dtype(series) and not pd.api.types.is_bool_dtype(series):
        out = series.to_numpy(dtype=np.float64, na_value=np.nan)  # the fast path: numbers only
    else:
        out = np.full(len(series), np.nan)
        for i, v in enumerate(series.to_numpy(dtype=object)):
            if _is_missing(v):
                continue
            if isinstance(v, bool | np.bool_) or not isinstance(v, int | float | np.integer
                                                                | np.floating):
                kind = "a string" if isinstance(v, str) else type(v).__name__
                rows.fail(i, f"{col} must be a number ({what}), got {kind} {v!r}")
            out[i] = float(v)
    missing = np.isnan(out)
    checks = [(np.isinf(out), "must be finite")]
    if not allow_missing:
        checks.insert(0, (missing, "is missing"))
    if whole:
        with np.errstate(invalid="ignore"):
            checks.append((~missing & ((out < 0) | (out != np.round(out))),
                           "must be a whole number ≥ 0"))
    bad = [(int(np.flatnonzero(mask)[0]), words) for mask, words in checks if mask.any()]
    if bad:
        i, words = min(bad)
        got = "" if words == "is missing" else f", got {series.iloc[i]!r}"
        rows.fail(i, f"{col} {words} ({what}){got}")
    return out


def _ids(df: pd.DataFrame, col: str, rows: _Rows) -> list[str]:
    out = []
    for i, v in enumerate(df[col].to_numpy(dtype=object)):
        if _is_missing(v) or (isinstance(v, str) and not v.strip()):
            rows.fail(i, f"{col} is missing")
        if isinstance(v, str):
            if _NEGATIVE_INT_TEXT.match(v):
                rows.fail(i, f"{col} {v!r} is a negative number; ids are non-empty strings or "
                             f"integers ≥ 0")
            out.append(v.strip())
            continue
        if isinstance(v, bool | np.bool_) or not isinstance(v, int | float | np.integer
                                                            | np.floating):
            rows.fail(i, f"{col} must be a string or an integer ≥ 0, got {type(v).__name__} "
                         f"{v!r}")
        if v < 0 or v != round(v):
            rows.fail(i, f"{col} must be a string or an integer ≥ 0, got {v!r}")
        out.append(str(int(v)))
    return out


def _per_family(df: pd.DataFrame, base: str, rows: _Rows, what: str,
                allow_missing: bool = False) -> dict[str, np.ndarray] | None:
    """``base_<family>`` for every family, or ``base`` for all; None when neither is there."""
    named = [f"{base}_{f}" for f in TOKENIZER_FAMILIES]
    have = [c for c in named if c in df.columns]
    if have and len(have) < len(named):
        missing = sorted(set(named) - set(have))
        raise TraceError(f"{rows.source}: has {have} but not {missing}: give a count for "
                         f"every tokenizer family, or one column {base!r} for all")
    if have and base in df.columns:
        raise TraceError(f"{rows.source}: both {base!r} and {have}; give one of them")
    if have:
        return {f: _numbers(df, c, rows, what, whole=True, allow_missing=allow_missing)
                for f, c in zip(TOKENIZER_FAMILIES, named, strict=True)}
    if base in df.columns:
        one = _numbers(df, base, rows, what, whole=True, allow_missing=allow_missing)
        return {f: one for f in TOKENIZER_FAMILIES}
    return None


def _texts(df: pd.DataFrame, col: str, rows: _Rows) -> list[str]:
    out = []
    for i, v in enumerate(df[col].to_numpy(dtype=object)):
        if not isinstance(v, str):
            rows.fail(i, f"{col} must be text, got {'nothing' if _is_missing(v) else repr(v)}")
        out.append(v)
    return out


def _stamps(df: pd.DataFrame, rows: _Rows, time_origin: Any) -> np.ndarray:
    """Seconds since the Unix epoch (NaN where missing) of the ``timestamp`` column."""
    values = df["timestamp"].to_numpy(dtype=object)
    is_text = np.fromiter((isinstance(v, str) for v in values), bool, len(values))
    out = np.full(len(values), np.nan)
    if is_text.any():
        text = pd.Series(values[is_text], dtype=object).str.strip()
        parsed = pd.to_datetime(text, format="ISO8601", utc=True, errors="coerce")
        if parsed.isna().any():
            i = int(np.flatnonzero(is_text)[np.flatnonzero(parsed.isna().to_numpy())[0]])
            rows.fail(i, f"timestamp {values[i]!r} is not an ISO 8601 time or a number of "
                         f"seconds")
        out[is_text] = parsed.dt.as_unit("ns").to_numpy(np.int64) / 1e9
    numeric = df[["timestamp"]].assign(timestamp=np.where(is_text, None, values))
    seconds = _numbers(numeric, "timestamp", rows, "seconds since the epoch", whole=False,
                       allow_missing=True)
    big = ~is_text & (np.abs(np.nan_to_num(seconds)) > MS_STAMP)
    if big.any():
        i = int(np.flatnonzero(big)[0])
        rows.fail(i, f"timestamp {values[i]!r} looks like milliseconds since the epoch (year "
                     f"{pd.Timestamp(values[i] / 1000, unit='s').year} if divided by 1000); "
                     f"give seconds")
    if time_origin is not None:
        origin = pd.Timestamp(time_origin)
        origin = origin.tz_localize("UTC") if origin.tzinfo is None else origin.tz_convert("UTC")
        seconds = seconds + origin.value / 1e9
    out[~is_text] = seconds[~is_text]
    return out


#: The format's columns besides the ids (per-family variants are ``<base>_<family>``).
_BASES: tuple[str, ...] = ("new_tokens", "output_tokens", "history_tokens", "est_output_tokens")
_OTHER_COLUMNS: frozenset[str] = frozenset(
    {"turn", "user_text", "assistant_text", "timestamp", "think_s", *_BASES,
     *(f"{b}_{f}" for b in _BASES for f in TOKENIZER_FAMILIES),
     *(f"quality_{m}" for m in MODELS)})
#: Words that make an unknown column look like a time the trace means the replay to use.
_TIME_WORDS: frozenset[str] = frozenset(
    {"arrival", "arrive", "arrived", "start", "started", "time", "timestamp", "ts", "date",
     "datetime", "sent", "created", "at", "s", "ms", "sec", "secs", "seconds"})


def _time_like(column: str) -> bool:
    return any(w in _TIME_WORDS for w in re.split(r"[^a-z0-9]+", column.lower()))


def _unknown_columns(df: pd.DataFrame, name: str) -> list[str]:
    """The columns of ``df`` outside the format (ids excluded); a time-like one is an error."""
    unknown = [str(c) for c in df.columns if c not in _OTHER_COLUMNS and c not in ID_COLUMNS]
    timed = [c for c in unknown if _time_like(c)]
    if timed:
        raise TraceError(
            f"{name}: column(s) {timed} are not part of the trace format, and the replay would "
            f"ignore them: a session's start is 'timestamp' on its turn 0 (ISO 8601 or seconds "
            f"since the epoch) and a later turn's wait is 'think_s' (seconds) or its "
            f"'timestamp'; rename the column, or drop it to draw the times from the arrival model")
    return unknown


def read_turns(source: Any, *, time_origin: Any = None) -> pd.DataFrame:
    """Read and check a trace of one's own (the format in the module doc).

    Parameters
    ----------
    source
        A ``.jsonl``, ``.csv`` or ``.parquet`` file, or a DataFrame with the trace's columns.
    time_origin
        When given, numeric timestamps are seconds after this time (UTC unless it says
        otherwise) rather than since the Unix epoch.

    Returns
    -------
    pandas.DataFrame
        A turns table (:func:`~carbonrouter_lib.sharegpt.turn_table` schema): rows grouped by
        conversation (in order of first appearance), turns in order; ``conversation_id`` (str),
        ``turn``, ``n_turns``, per tokenizer family ``new_tokens_<f>``, ``output_tokens_<f>``,
        ``history_tokens_<f>`` (int64), then ``user_text`` and ``assistant_text`` (when the trace
        has either; "" for a missing one), the trace's ``quality_<model>`` and
        ``est_output_tokens_<f>`` when given, ``start_s`` (turn 0: start, s since the epoch, or
        NaN) and ``think_s`` (turns ≥ 1: s, or NaN to be drawn), and ``source_row`` (where the
        row is in the source). ``attrs["trace"]``: the source, its SHA-256 (files), how timing
        was given and what was counted (tokenized texts, think times floored or ignored).

    Raises
    ------
    TraceError
        (a ``ValueError``) Any break of the format; the message names the source and the row.
    FileNotFoundError
        The file does not exist.
    """
    df, where, name, sha = _read(source)
    rows = _Rows(name, where)
    if len(df) == 0:
        raise TraceError(f"{name}: no turns")
    id_cols = [c for c in ID_COLUMNS if c in df.columns]
    if len(id_cols) != 1 or "turn" not in df.columns:
        raise TraceError(f"{name}: needs one of {list(ID_COLUMNS)} and 'turn'; columns are "
                         f"{list(df.columns)}")
    ignored = _unknown_columns(df, name)
    if ignored:
        warnings.warn(f"{name}: columns {ignored} are not part of the trace format; ignored",
                      UserWarning, stacklevel=2)
    conv = _ids(df, id_cols[0], rows)
    rows.conv = conv
    turn = _numbers(df, "turn", rows, "the turn's index in its conversation", whole=True)
    rows.turn = turn

    # (conversation, turn) unique, and each conversation's turns exactly 0 … n−1.
    key = pd.DataFrame({"c": conv, "t": turn})
    dup = key.duplicated(keep=False).to_numpy()
    if dup.any():
        i = int(np.flatnonzero(dup)[0])
        same = [where[j] for j in np.flatnonzero(dup) if key.iloc[j].tolist() ==
                key.iloc[i].tolist()]
        rows.fail(i, f"duplicate (conversation, turn): also at {', '.join(same[1:])}")
    codes, order_ids = pd.factorize(pd.Series(conv), sort=False)
    n_turns = np.bincount(codes)
    max_turn = pd.Series(turn).groupby(codes).max().to_numpy()
    gaps = np.flatnonzero(max_turn != n_turns - 1)
    if gaps.size:
        c = int(gaps[0])
        present = sorted(int(t) for t in turn[codes == c])
        missing = sorted(set(range(int(max_turn[c]) + 1)) - set(present))
        i = int(np.flatnonzero(codes == c)[0])
        rows.turn = None
        rows.fail(i, f"turns must be 0 … n−1; it has {present[:12]}"
                     f"{' …' if len(present) > 12 else ''}, missing {missing[:12]}")
    order = np.lexsort((turn, codes))  # grouped by conversation (first appearance), turn order
    inv = np.argsort(order)

    report: dict[str, Any] = {"source": name, "sha256": sha, "rows": len(df),
                              "ignored_columns": ignored,
                              "conversations": len(order_ids), "tokenized": []}
    counts: dict[str, dict[str, np.ndarray]] = {}
    texts: dict[str, list[str]] = {}
    for base, text_col, what in (("new_tokens", "user_text", "tokens of the user message"),
                                 ("output_tokens", "assistant_text",
                                  "tokens of the response")):
        if text_col in df.columns:
            texts[text_col] = _texts(df, text_col, rows)
        given = _per_family(df, base, rows, what)
        if given is None:
            if text_col not in texts:
                raise TraceError(f"{name}: needs {base!r} (or {base}_<family> for "
                                 f"{list(TOKENIZER_FAMILIES)}) or {text_col!r}")
            given = {f: count_tokens(texts[text_col], f).astype(float)
                     for f in TOKENIZER_FAMILIES}
            report["tokenized"].append(text_col)
        counts[base] = given

    hist_given = _per_family(df, "history_tokens", rows, "tokens of the context before")
    first = turn == 0
    out = pd.DataFrame({"conversation_id": pd.array(conv, dtype="string"),
                        "turn": turn.astype(np.int64), "n_turns": n_turns[codes]})
    for f in TOKENIZER_FAMILIES:
        new, res = counts["new_tokens"][f], counts["output_tokens"][f]
        # Sums over the earlier turns, in turn order within each conversation.
        total = (new + res)[order]
        cum = pd.Series(total).groupby(codes[order]).cumsum().to_numpy() - total
        earlier = cum[inv]
        if hist_given is None:
            hist = earlier
        else:
            hist = hist_given[f]
            bad = first & (hist > 0)
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                rows.fail(i, f"history_tokens_{f} is {hist[i]:.0f} on a first turn; a "
                             f"conversation starts without history (count it in new tokens)")
            prev = np.full(len(df), np.nan)
            ordered = (hist + new + res)[order]
            shifted = np.r_[np.nan, ordered[:-1]]
            shifted[np.r_[True, codes[order][1:] != codes[order][:-1]]] = np.nan
            prev = shifted[inv]
            bad = ~first & (hist > prev)
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                rows.fail(i, f"history_tokens_{f} is {hist[i]:.0f}, more than the previous "
                             f"turn's history + message + response ({prev[i]:.0f})")
        out[f"new_tokens_{f}"] = new.astype(np.int64)
        out[f"output_tokens_{f}"] = res.astype(np.int64)
        out[f"history_tokens_{f}"] = hist.astype(np.int64)
    if texts:
        for col in ("user_text", "assistant_text"):
            out[col] = pd.array(texts.get(col, [""] * len(df)), dtype="string")

    qcols = [f"quality_{m}" for m in MODELS]
    have_q = [c for c in qcols if c in df.columns]
    if have_q and len(have_q) < len(qcols):
        raise TraceError(f"{name}: quality columns {have_q} but not "
                         f"{sorted(set(qcols) - set(have_q))}: give all of them or none")
    for c in have_q:
        q = _numbers(df, c, rows, "predicted quality", whole=False)
        bad = (q < 0) | (q > 1)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            rows.fail(i, f"{c} must be in [0, 1], got {q[i]!r}")
        out[c] = q
    est = _per_family(df, "est_output_tokens", rows, "estimated output tokens")
    if est is not None:
        for f in TOKENIZER_FAMILIES:
            out[f"est_output_tokens_{f}"] = est[f].astype(np.int64)

    # Timing.
    think = np.full(len(df), np.nan)
    start = np.full(len(df), np.nan)
    timing = "arrival model"
    stamps = _stamps(df, rows, time_origin) if "timestamp" in df.columns else None
    if stamps is not None:
        no_start = first & np.isnan(stamps)
        if no_start.any():
            rows.fail(int(np.flatnonzero(no_start)[0]), "a first turn needs a timestamp (the "
                      "session's start) when the trace has a timestamp column")
        start[first] = stamps[first]
        timing = "timestamps (starts)"
    later = ~first
    if "think_s" in df.columns:
        given = _numbers(df, "think_s", rows, "seconds after the previous response",
                         whole=False, allow_missing=True)
        bad = later & np.isnan(given)
        if bad.any():
            rows.fail(int(np.flatnonzero(bad)[0]), "think_s is missing (seconds after the "
                      "previous response)")
        bad = later & (given < 0)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            rows.fail(i, f"think_s must be ≥ 0 s, got {float(given[i])!r}")
        bad = later & (given > MAX_THINK_S)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            rows.fail(i, f"think_s {float(given[i])!r} is over 30 days: milliseconds? give seconds")
        if stamps is not None and (later & ~np.isnan(stamps)).any():
            rows.fail(int(np.flatnonzero(later & ~np.isnan(stamps))[0]), "has both a timestamp "
                      "and think_s; give later turns one or the other")
        think[later] = given[later]
        report["think_s_ignored_first_turns"] = int((first & ~np.isnan(given)
                                                     & (given != 0)).sum())
        timing += " + think_s"
    elif stamps is not None and (later & ~np.isnan(stamps)).any():
        bad = later & np.isnan(stamps)
        if bad.any():
            rows.fail(int(np.flatnonzero(bad)[0]), "timestamp is missing (later turns have "
                      "all or none)")
        ordered = stamps[order]
        prev = np.r_[np.nan, ordered[:-1]][inv]
        back = later & (stamps < prev)
        if back.any():
            i = int(np.flatnonzero(back)[0])
            rows.fail(i, f"timestamp is {prev[i] - stamps[i]:.3f} s earlier than the previous "
                         f"turn's")
        llama = counts["new_tokens"]["llama3"], counts["output_tokens"]["llama3"]
        service = ServiceTimeModel().service_s(*llama)
        prev_service = np.r_[np.nan, service[order][:-1]][inv]
        gap = stamps - prev - prev_service
        think[later] = np.maximum(gap[later], 0.0)
        report["think_floored_at_zero"] = int((later & (gap < 0)).sum())
        timing = "timestamps (every turn)"
    else:
        timing += " + think model"
    report["timing"] = timing
    out["start_s"] = start
    out["think_s"] = think
    out["source_row"] = pd.array(where, dtype="string")
    out = out.iloc[order].reset_index(drop=True)
    out.attrs["trace"] = report
    return out
