"""The prepared workload: one table of every query the simulator replays (docs/model.md §4, §5, §8).

For a dataset and a :class:`WorkloadConfig`, :func:`prepare_workload` returns one row per query
(session, turn) with

- when it is sent: ``arrival_s`` (session start, float seconds since the Unix epoch, first turns
  only; NaN for later turns) and ``think_s`` (seconds after the previous turn's response
  completes; 0 for first turns) — the simulator resolves dispatch times, since completion depends
  on routing;
- per model m of :data:`~carbonrouter_lib.profiles.MODELS`, under m's tokenizer:
  ``new_tokens_<m>``, ``history_tokens_<m>``, ``output_tokens_<m>`` (realized: the trace's
  response), ``est_output_tokens_<m>`` (cross-fitted estimate that never saw this response) and
  ``quality_<m>`` (predicted Q(m) ∈ [0, 1]).

Datasets:

- ``"sharegpt"``: the salvaged ShareGPT conversations (:mod:`carbonrouter_lib.sharegpt`), quality
  from the offline predictor on the query and its recent context (:mod:`carbonrouter_lib.quality`).
- ``"mooncake"``: the Mooncake conversation trace (:func:`.mooncake.mooncake_turns`),
  **standing in for the paper's ShareChat, which is not obtainable here**. It has no text, so each
  query borrows the quality vector of a ShareGPT query of similar input length
  (:func:`borrow_quality`, seeded); its token counts are the trace's (one count for every model).

Quality and output estimates depend only on the dataset (not on arrivals or sampling), so they are
computed once per dataset and cached; the whole table is cached by a hash of its parameters and
of the code (:mod:`carbonrouter_lib.cache`).

A trace of one's own (JSONL, CSV or parquet; the format is in :mod:`carbonrouter_lib.traces`)
becomes a table with exactly these columns through :func:`from_turns`, so every replay, sweep
and metric takes it as it takes ours.

Replay scale
------------
How densely sessions overlap is a parameter of its own (``WorkloadConfig.sessions_per_s``), not a
by-product of the dataset's size. By default every conversation is replayed once over the window
(the whole ShareGPT prefix over 7 days: 0.0156 sessions/s, a peak of P = 40 active sessions). At a
higher session-start rate λ the window holds N = round(λ·T) sessions, drawn from the conversations
by *stratified resampling with replacement*: each conversation ⌊N / n⌋ times, plus N mod n
conversations drawn without replacement (seeded). Every replayed session (a *copy*) gets its own
start time and think times; its turns, tokens, output estimates and quality are its conversation's,
and ``conversation_id`` is kept, so analyses group by conversation and cross-fitted estimates (folds
by conversation) never see a copy of the conversation they predict. Stratified rather than iid
draws: the copies reproduce the dataset's mix exactly (iid draws would add sampling noise to every
comparison across scales), and one copy is *exactly* the unscaled table. :func:`with_copies` and
:func:`with_peak` set the rate from a number of copies or a target peak concurrency P.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from carbonrouter_lib import (
    arrivals,
    cache,
    kernel,
    mooncake,
    output_length,
    quality,
    sharegpt,
    traces,
)
from carbonrouter_lib.kernel import conversation_fold  # noqa: F401  (one id's fold, re-exported)
from carbonrouter_lib.profiles import MODELS, REFERENCE_DEPLOYMENT
from carbonrouter_lib.tokenizers import TOKENIZER_FAMILIES, TOKENIZER_OF_MODEL

__all__ = [
    "DATASETS",
    "QUANTITIES",
    "WorkloadConfig",
    "base_turns",
    "borrow_quality",
    "column",
    "dataset_columns",
    "from_turns",
    "model_matrix",
    "prepare_workload",
    "peak_active_sessions",
    "mean_context_tokens",
    "n_conversations",
    "scale_summary",
    "service_utilization",
    "conversation_codes",
    "with_copies",
    "with_peak",
]

_MODULE = "carbonrouter_lib.prepared"
DATASETS: tuple[str, ...] = ("sharegpt", "mooncake")
#: Per-model quantities, one column each per model.
QUANTITIES: tuple[str, ...] = (
    "new_tokens", "history_tokens", "output_tokens", "est_output_tokens", "quality",
)
#: Tokenizer family whose input lengths are matched to Mooncake's (Kimi's tokenizer is not
#: available; Llama-3's 128K BPE is the closest modern vocabulary we have).
BORROW_FAMILY = "llama3"


def column(quantity: str, model: str) -> str:
    """Name of a per-model column, e.g. ``column("quality", "Gemma-3-1B")``."""
    if quantity not in QUANTITIES:
        raise KeyError(f"unknown per-model quantity {quantity!r}; one of {QUANTITIES}")
    if model not in MODELS:
        raise KeyError(f"unknown model {model!r}; one of {MODELS}")
    return f"{quantity}_{model}"


def model_matrix(table: pd.DataFrame, quantity: str) -> np.ndarray:
    """The ``(n_queries, 5)`` array of one per-model quantity, columns in MODELS order,
    C-contiguous (a row's models side by side: flat views of it need no copy)."""
    return np.ascontiguousarray(table[[column(quantity, m) for m in MODELS]].to_numpy())


@dataclass(frozen=True)
class WorkloadConfig:
    """Everything that determines a prepared workload table (serialized with every result).

    Attributes
    ----------
    dataset
        ``"sharegpt"`` or ``"mooncake"`` (the latter standing in for ShareChat).
    n_sessions
        Sessions to replay, drawn without replacement (seeded); None for every session.
    seed
        Seed of session sampling, session start times, think times and quality borrowing.
    arrival
        Replay window and think-time distribution (:class:`arrivals.ArrivalConfig`).
    max_conversations
        Use only the first N conversations of the dataset (quick runs and tests); None for all.
    think_source
        ``"model"`` draws think times from ``arrival``'s distribution; ``"trace"`` (Mooncake only)
        uses each turn's measured think time (floored at 0 s).
    context_turns
        Earlier turns of the conversation that the quality predictor sees as context.
    output_folds
        Folds (by conversation) of the cross-fitted output-length estimate.
    sessions_per_s
        Replay scale: the session-start rate λ, sessions/s (> 0). The window then holds
        N = round(λ·window) sessions resampled from the conversations (see the module doc). None
        (default): every conversation (or the ``n_sessions`` sample) once.
    """

    dataset: str = "sharegpt"
    n_sessions: int | None = None
    seed: int = 0
    arrival: arrivals.ArrivalConfig = field(default_factory=arrivals.ArrivalConfig)
    max_conversations: int | None = None
    think_source: str = "model"
    context_turns: int = 1
    output_folds: int = 5
    sessions_per_s: float | None = None

    def __post_init__(self) -> None:
        if self.dataset not in DATASETS:
            raise ValueError(f"unknown dataset {self.dataset!r}: choose one of {DATASETS}")
        arrivals.check_seed(self.seed, "WorkloadConfig.seed")
        for name in ("n_sessions", "max_conversations"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
        if self.think_source not in ("model", "trace"):
            raise ValueError(f"think_source must be 'model' or 'trace', got {self.think_source!r}")
        if self.think_source == "trace" and self.dataset != "mooncake":
            raise ValueError("think_source='trace' needs a trace with think times (mooncake)")
        if self.context_turns < 0 or self.output_folds < 2:
            raise ValueError("context_turns must be ≥ 0 and output_folds ≥ 2")
        rate = self.sessions_per_s
        if rate is not None:
            if isinstance(rate, bool) or not isinstance(rate, int | float | np.number) or not (
                math.isfinite(rate) and rate > 0
            ):
                raise ValueError(f"WorkloadConfig.sessions_per_s must be a finite number > 0 "
                                 f"sessions/s or None, got {rate!r}")
            object.__setattr__(self, "sessions_per_s", float(rate))

    def n_replayed(self, n_conversations: int) -> int:
        """N: sessions replayed over the window when the dataset (or the ``n_sessions`` sample)
        holds ``n_conversations`` conversations — ``round(sessions_per_s · window)``, or
        ``n_conversations`` when unscaled. At least 1."""
        if self.sessions_per_s is None:
            return int(n_conversations)
        return max(1, round(self.sessions_per_s * self.arrival.window_s))

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (the arrival config nested)."""
        d = dataclasses.asdict(self)
        d["arrival"] = self.arrival.to_dict()
        return d

    def key(self) -> str:
        """Key of the table: hash of the parameters and of the code that prepares it
        (:func:`carbonrouter_lib.cache.key`)."""
        return cache.key("workload", self.to_dict(), _MODULE)


def base_turns(dataset: str, max_conversations: int | None = None) -> pd.DataFrame:
    """The dataset's turns table (ShareGPT schema; Mooncake without text), optionally truncated."""
    if dataset == "sharegpt":
        turns, _ = sharegpt.load_sharegpt_turns(max_conversations=max_conversations,
                                                progress=False)
        return turns
    if dataset == "mooncake":
        turns = mooncake.mooncake_turns()
        if max_conversations is not None:
            keep = turns["conversation_id"].unique()[:max_conversations]
            turns = turns[turns["conversation_id"].isin(keep)].reset_index(drop=True)
        if turns.empty:
            raise ValueError("the Mooncake trace yielded no turns")
        return turns
    raise ValueError(f"unknown dataset {dataset!r}: choose one of {DATASETS}")


def borrow_quality(
    target_input_tokens: np.ndarray,
    donor_input_tokens: np.ndarray,
    donor_quality: np.ndarray,
    seed: int,
    neighbours: int = 50,
) -> tuple[np.ndarray, np.ndarray]:
    """Give each target query the quality vector of a donor query of similar input length.

    For each target length x, a donor is drawn uniformly (seeded) among the ``neighbours`` donors
    whose input length is closest to x in rank order (the window around x's position among the
    sorted donor lengths). Returns ``(quality (n, 5), donor index (n,))``.
    """
    donor_input_tokens = np.asarray(donor_input_tokens, dtype=np.float64)
    if donor_input_tokens.size == 0:
        raise ValueError("borrow_quality: no donor queries")
    order = np.argsort(donor_input_tokens, kind="stable")
    sorted_len = donor_input_tokens[order]
    n = sorted_len.size
    k = min(neighbours, n)
    pos = np.searchsorted(sorted_len, np.asarray(target_input_tokens, dtype=np.float64))
    lo = np.clip(pos - k // 2, 0, n - k)
    pick = lo + np.random.default_rng(seed).integers(0, k, size=pos.size)
    donors = order[pick]
    return donor_quality[donors], donors


def dataset_columns(config: WorkloadConfig) -> pd.DataFrame:
    """Per-query columns that depend only on the dataset: tokens, estimated outputs, quality.

    Cached per (dataset, max_conversations, context_turns, output_folds, and for a dataset whose
    quality is borrowed from ShareGPT donors the seed that draws them); arrivals and sampling do
    not invalidate it. Row order is the base turns table's.
    """
    params = {"dataset": config.dataset, "max_conversations": config.max_conversations,
              "context_turns": config.context_turns, "output_folds": config.output_folds}
    if config.dataset != "sharegpt":  # quality borrowed from ShareGPT donors drawn by the seed
        params["seed"] = config.seed
    # The code hash covers the predictor and the parser too (this module imports them).
    entry = cache.entry("workload_columns", params, _MODULE)
    if (hit := entry.load()) is not None:
        return hit[0]

    def build() -> pd.DataFrame:
        turns = base_turns(config.dataset, config.max_conversations)
        est = output_length.estimate_output_tokens(turns, n_folds=config.output_folds,
                                                   seed=0)
        out = pd.DataFrame({"conversation_id": turns["conversation_id"].to_numpy(),
                            "turn": turns["turn"].to_numpy(),
                            "n_turns": turns["n_turns"].to_numpy()})
        for m in MODELS:
            f = TOKENIZER_OF_MODEL[m]
            out[column("new_tokens", m)] = turns[f"new_tokens_{f}"].to_numpy()
            out[column("history_tokens", m)] = turns[f"history_tokens_{f}"].to_numpy()
            out[column("output_tokens", m)] = turns[f"output_tokens_{f}"].to_numpy()
            out[column("est_output_tokens", m)] = est[output_length.estimate_column(f)].to_numpy()
        if config.dataset == "sharegpt":
            q = quality.score_turns(turns, context_turns=config.context_turns)
        else:
            donor_cfg = dataclasses.replace(config, dataset="sharegpt", think_source="model")
            donor = dataset_columns(donor_cfg)
            donor_len = (donor[column("new_tokens", "Llama-3.1-70B")]
                         + donor[column("history_tokens", "Llama-3.1-70B")]).to_numpy()
            f = BORROW_FAMILY
            target_len = (turns[f"new_tokens_{f}"] + turns[f"history_tokens_{f}"]).to_numpy()
            q, donors = borrow_quality(target_len, donor_len, model_matrix(donor, "quality"),
                                       seed=config.seed)
            out["quality_donor"] = donors
            out["think_time_trace_s"] = turns["think_time_s"].to_numpy()
        for j, m in enumerate(MODELS):
            out[column("quality", m)] = q[:, j]
        return out

    df = build()
    df.attrs = {}
    return entry.save(df)


def prepare_workload(config: WorkloadConfig | None = None, use_cache: bool = True) -> pd.DataFrame:
    """The prepared workload table of ``config`` (see the module docstring for its columns).

    Cached as parquet (:mod:`carbonrouter_lib.cache`) under :meth:`WorkloadConfig.key`, when it
    replays each conversation at most once; a resampled (``sessions_per_s``)
    table is rebuilt from the cached dataset columns instead (seconds, and deterministic: a
    service-scale table is millions of rows, not worth its disk). ``table.attrs["config"]`` holds
    the parameters. Rows are sorted by session start, then turn; ``session`` numbers sessions
    0…N−1 in that order.
    """
    config = config or WorkloadConfig()
    entry = cache.entry("workload", config.to_dict(), _MODULE)  # its key is config.key()
    if use_cache and (hit := entry.load()) is not None:
        table = hit[0]
        table.attrs["config"] = config.to_dict()
        return table

    cols = dataset_columns(config)
    ids = cols["conversation_id"].unique()
    rng = np.random.default_rng(config.seed)
    if config.n_sessions is not None:
        if config.n_sessions > len(ids):
            raise ValueError(f"n_sessions={config.n_sessions} exceeds the {len(ids)} sessions of "
                             f"{config.dataset} (max_conversations={config.max_conversations})")
        ids = np.sort(rng.choice(ids, size=config.n_sessions, replace=False))
        cols = cols[cols["conversation_id"].isin(ids)]
    n_total = config.n_replayed(len(ids))
    copies, extra = divmod(n_total, len(ids))
    starts = arrivals.session_start_times(n_total, config.arrival, rng)
    # Unit u = copy·n + j replays conversation ids[j] (then the `extra` units); sessions are
    # assigned start times in a seeded random order (not in trace order).
    n = len(ids)
    unit_conv = np.tile(np.arange(n), copies)
    if extra:
        unit_conv = np.concatenate([unit_conv, np.sort(rng.choice(n, extra, replace=False))])
    unit_start = np.empty(n_total)
    unit_start[rng.permutation(n_total)] = starts
    # Rows of every unit: its conversation's rows in the dataset's order; units copy after copy,
    # conversations in the order the dataset lists them, so that one copy keeps the dataset's row
    # order (the think-time draws below fall on the same rows: one copy is the unscaled table).
    conv_of_row = pd.Index(ids).get_indexer(cols["conversation_id"])
    listed = pd.unique(conv_of_row)  # conversations in dataset order
    rank = np.empty(n, dtype=np.int64)
    rank[listed] = np.arange(n)
    units = np.lexsort((rank[unit_conv], np.arange(n_total) // n))  # copy, then dataset order
    unit_conv, unit_start = unit_conv[units], unit_start[units]
    by_conv = np.argsort(conv_of_row, kind="stable")
    bounds = np.searchsorted(conv_of_row[by_conv], np.arange(n + 1))
    lengths = np.diff(bounds)[unit_conv]
    within = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    src = by_conv[np.repeat(bounds[:-1][unit_conv], lengths) + within]
    table = cols.iloc[src].reset_index(drop=True)
    session_start = np.repeat(unit_start, lengths)
    first = table["turn"].to_numpy() == 0
    table.insert(0, "dataset", config.dataset)
    table.insert(1, "arrival_s", np.where(first, session_start, np.nan))
    if config.think_source == "trace":
        think = np.nan_to_num(np.maximum(table["think_time_trace_s"].to_numpy(), 0.0))
    else:
        think = arrivals.think_times(len(table), config.arrival, rng)
    table.insert(2, "think_s", np.where(first, 0.0, think))
    table["_start"] = session_start
    # Sessions that start at the same instant (at service scale, draws a float64 ulp apart at
    # epoch seconds: about 37 pairs among 13.7M sessions) stay apart: ties break by unit.
    table["_unit"] = np.repeat(np.arange(n_total), lengths)
    table = table.sort_values(["_start", "_unit", "turn"], kind="stable").drop(
        columns=["_start", "_unit"])
    table.insert(1, "session", np.cumsum(table["turn"].to_numpy() == 0) - 1)
    table = table.reset_index(drop=True)

    if n_total <= len(ids):
        entry.save(table)
    table.attrs["config"] = config.to_dict()
    return table


#: How :func:`from_turns` gets each query's quality vector.
QUALITY_SOURCES: tuple[str, ...] = ("auto", "columns", "predictor", "borrow")


def from_turns(
    turns: Any,
    *,
    name: str | None = None,
    arrival: arrivals.ArrivalConfig | None = None,
    seed: int = 0,
    quality_source: str = "auto",
    context_turns: int = 1,
    output_folds: int = 5,
    donor: WorkloadConfig | None = None,
    time_origin: Any = None,
) -> pd.DataFrame:
    """The prepared workload of a trace of one's own, with exactly :func:`prepare_workload`'s
    columns (so :func:`~carbonrouter_lib.simulator.simulate`, the sweeps and the metrics take it).

    Parameters
    ----------
    turns
        A trace: a ``.jsonl``, ``.csv`` or ``.parquet`` file or a DataFrame, one row per turn
        (format and checks: :mod:`carbonrouter_lib.traces`; texts are tokenized under each
        model's tokenizer, counts are taken as given).
    name
        The ``dataset`` column (default the file's stem, or ``"trace"``).
    arrival
        Replay window and think-time model for what the trace does not give (session starts
        without timestamps, think times without ``think_s`` or later-turn timestamps); default
        :class:`arrivals.ArrivalConfig()` (7 days from Monday 2022-01-03 UTC).
    seed
        Seed of the drawn start times and think times (and of quality borrowing).
    quality_source
        Where Q(m) comes from: ``"columns"`` (the trace's ``quality_<model>``), ``"predictor"``
        (the offline predictor on ``user_text`` and the previous ``context_turns`` turns, as for
        ShareGPT), ``"borrow"`` (each query borrows the quality vector of a ShareGPT query of
        similar input length, seeded, as for the Mooncake trace: :func:`borrow_quality`; for a
        trace without text), or ``"auto"`` (the first of these the trace allows).
    context_turns
        Earlier turns the quality predictor sees.
    output_folds
        Folds (by conversation) of the cross-fitted output-length estimate (at most the number of
        conversations; at least 2 conversations are needed unless the trace gives
        ``est_output_tokens``).
    donor
        The ShareGPT workload quality is borrowed from (default every conversation).
    time_origin
        Numeric timestamps are seconds after this time instead of the Unix epoch.

    Returns
    -------
    pandas.DataFrame
        One row per query, sorted by session start then turn, ``session`` numbering sessions
        0…N−1 (one session per conversation); ``attrs["config"]`` records the source (path and
        SHA-256), the arrival window, the seed and how quality and timing were obtained, and
        ``attrs["trace"]`` what :func:`traces.read_turns` counted.

    Raises
    ------
    ValueError
        A malformed trace (:class:`traces.TraceError`, naming the file and row), an unknown
        ``quality_source`` or one the trace does not allow.
    """
    if quality_source not in QUALITY_SOURCES:
        raise ValueError(f"quality_source must be one of {QUALITY_SOURCES}, got "
                         f"{quality_source!r}")
    seed = arrivals.check_seed(seed, "from_turns: seed")
    arrival = arrival or arrivals.ArrivalConfig()
    t = traces.read_turns(turns, time_origin=time_origin)
    report = t.attrs["trace"]
    if name is None:
        name = Path(turns).stem if isinstance(turns, str | os.PathLike) else "trace"
    families = [f"est_output_tokens_{f}" for f in TOKENIZER_FAMILIES]
    n_conv = int(t["conversation_id"].nunique())
    if all(c in t.columns for c in families):
        est = t[families]
    else:
        if n_conv < 2:
            raise ValueError(f"{report['source']}: one conversation: the output-length "
                             f"estimate is cross-fitted over conversations (at least 2), or give "
                             f"est_output_tokens")
        folds = min(output_folds, n_conv)
        est = output_length.estimate_output_tokens(t, n_folds=folds, seed=0)
        report["output_folds"] = folds

    qcols = [column("quality", m) for m in MODELS]
    if quality_source == "auto":
        quality_source = ("columns" if qcols[0] in t.columns
                          else "predictor" if "user_text" in t.columns else "borrow")
    if quality_source == "columns":
        if qcols[0] not in t.columns:
            raise ValueError(f"{report['source']}: quality_source='columns' but the trace has no "
                             f"{qcols} columns")
        q = t[qcols].to_numpy(dtype=np.float64)
    elif quality_source == "predictor":
        if "user_text" not in t.columns:
            raise ValueError(f"{report['source']}: quality_source='predictor' needs user_text")
        q = quality.score_turns(t, context_turns=context_turns)
    else:
        donor = donor or WorkloadConfig(dataset="sharegpt", context_turns=context_turns)
        donor_cols = dataset_columns(donor)
        big = "Llama-3.1-70B"
        donor_len = (donor_cols[column("new_tokens", big)]
                     + donor_cols[column("history_tokens", big)]).to_numpy()
        f = TOKENIZER_OF_MODEL[big]
        target_len = (t[f"new_tokens_{f}"] + t[f"history_tokens_{f}"]).to_numpy()
        q, _ = borrow_quality(target_len, donor_len, model_matrix(donor_cols, "quality"),
                              seed=seed)

    out = pd.DataFrame({"conversation_id": t["conversation_id"].to_numpy(),
                        "turn": t["turn"].to_numpy(), "n_turns": t["n_turns"].to_numpy()})
    for m in MODELS:
        f = TOKENIZER_OF_MODEL[m]
        out[column("new_tokens", m)] = t[f"new_tokens_{f}"].to_numpy(np.int64)
        out[column("history_tokens", m)] = t[f"history_tokens_{f}"].to_numpy(np.int64)
        out[column("output_tokens", m)] = t[f"output_tokens_{f}"].to_numpy(np.int64)
        out[column("est_output_tokens", m)] = est[f"est_output_tokens_{f}"].to_numpy(np.int64)
    for j, m in enumerate(MODELS):
        out[column("quality", m)] = q[:, j]

    # Arrivals: the trace's where it gives them, else the arrival model (drawn in the order
    # prepare_workload draws: starts, their assignment, think times).
    rng = np.random.default_rng(seed)
    first = out["turn"].to_numpy() == 0
    conv_code, _ = pd.factorize(out["conversation_id"], sort=False)
    given_start = t["start_s"].to_numpy()[first]
    if np.isnan(given_start).all():
        starts = arrivals.session_start_times(n_conv, arrival, rng)
        unit_start = np.empty(n_conv)
        unit_start[rng.permutation(n_conv)] = starts
        window = arrival
    else:
        unit_start = given_start
        lo, hi = float(unit_start.min()), float(unit_start.max())
        window = dataclasses.replace(arrival, window_start=pd.Timestamp(math.floor(lo), unit="s",
                                                                        tz="UTC"),
                                     window_days=max(hi - math.floor(lo), 1.0) / 86_400.0)
    drawn = arrivals.think_times(len(out), arrival, rng)
    given_think = t["think_s"].to_numpy()
    think = np.where(np.isnan(given_think), drawn, given_think)
    session_start = unit_start[conv_code]
    out.insert(0, "dataset", name)
    out.insert(1, "arrival_s", np.where(first, session_start, np.nan))
    out.insert(2, "think_s", np.where(first, 0.0, think))
    out["_start"], out["_conv"] = session_start, conv_code
    out = out.sort_values(["_start", "_conv", "turn"], kind="stable").drop(
        columns=["_start", "_conv"])
    out.insert(1, "session", np.cumsum(out["turn"].to_numpy() == 0) - 1)
    out = out.reset_index(drop=True)
    report["quality"] = quality_source
    out.attrs["config"] = {
        "dataset": name, "trace": {"path": str(Path(turns).resolve())
                                   if isinstance(turns, str | os.PathLike) else None,
                                   "sha256": report["sha256"]},
        "seed": seed, "arrival": window.to_dict(), "quality_source": quality_source,
        "context_turns": context_turns, "timing": report["timing"],
    }
    out.attrs["trace"] = report
    return out


def _reference_service(table: pd.DataFrame) -> np.ndarray:
    m = MODELS.index(REFERENCE_DEPLOYMENT[0])
    service = arrivals.ServiceTimeModel.from_profile(*REFERENCE_DEPLOYMENT)
    return service.service_s(model_matrix(table, "new_tokens")[:, m],
                             model_matrix(table, "output_tokens")[:, m])


def peak_active_sessions(table: pd.DataFrame) -> int:
    """P: the peak number of simultaneously active sessions of a workload (docs/model.md §6).

    A session is active from its first arrival to its last completion. Completion depends on
    routing, and P is a property of the trace, not of a policy: so it is measured with the
    service times of :data:`profiles.REFERENCE_DEPLOYMENT` (no capacity limit) for every turn
    (prefill of the new tokens, history cached; decode of the realized output) and the table's
    think times. Intervals are half-open [start, end): a session ending when another
    starts does not overlap it (completions before dispatches, §6a.9).
    """
    if table.empty:
        raise ValueError("peak_active_sessions: empty workload")
    service = _reference_service(table)
    first = table["turn"].to_numpy() == 0
    # Turn k is sent think_k after turn k-1 completes: session end = start + Σ(think + service).
    per_turn = table["think_s"].to_numpy() + service
    session = table["session"].to_numpy()
    length = np.bincount(session, weights=per_turn)
    start = np.zeros(length.size)
    start[session[first]] = table["arrival_s"].to_numpy()[first]
    end = start + length
    times = np.concatenate([start, end])
    delta = np.concatenate([np.ones(start.size), -np.ones(end.size)])
    order = np.lexsort((delta, times))  # at equal times, ends (-1) before starts (+1)
    return int(np.max(np.cumsum(delta[order])))


def mean_context_tokens(table: pd.DataFrame) -> float:
    """C̄: mean query context (history + new input tokens) of the workload, in the reference
    model's tokens (docs/model.md §6: KV memory per region = K·C̄)."""
    m = MODELS.index(REFERENCE_DEPLOYMENT[0])
    ctx = (model_matrix(table, "history_tokens")[:, m]
           + model_matrix(table, "new_tokens")[:, m])
    return float(np.mean(ctx))


def n_conversations(config: WorkloadConfig) -> int:
    """Conversations the workload draws its sessions from: the dataset's (after
    ``max_conversations``), or the ``n_sessions`` sample."""
    if config.n_sessions is not None:
        return config.n_sessions
    return int(dataset_columns(config)["conversation_id"].nunique())


def with_copies(config: WorkloadConfig, copies: float) -> WorkloadConfig:
    """``config`` replayed at ``copies`` times its unscaled session-start rate over the same
    window: ``sessions_per_s = copies · n / window`` (n: :func:`n_conversations`), so the window
    holds round(copies · n) sessions. ``copies = 1`` replays the unscaled table exactly."""
    if isinstance(copies, bool) or not isinstance(copies, int | float | np.number) or not (
        math.isfinite(copies) and copies > 0
    ):
        raise ValueError(f"with_copies: copies must be a finite number > 0, got {copies!r}")
    rate = float(copies) * n_conversations(config) / config.arrival.window_s
    return dataclasses.replace(config, sessions_per_s=rate)


def with_peak(
    config: WorkloadConfig, target_peak: int, rel_tol: float = 0.02, max_iter: int = 12
) -> WorkloadConfig:
    """``config`` at the session-start rate whose table has a peak of ``target_peak`` active
    sessions (:func:`peak_active_sessions`), within ``rel_tol`` (at least ±0.5: P is an integer).

    P grows about linearly with the rate (Little's law: mean active sessions = rate × mean
    session duration; the peak sits a few standard deviations above the mean), so the search
    starts from that proportion, brackets the target and narrows the bracket by interpolating
    log P against log rate (bisection when that stalls), on the measured P of the built tables
    (deterministic for a seed). P of a resampled table is a random step function of the rate, so
    when no rate hits the tolerance within ``max_iter`` tables the closest one is returned if it
    is within 25%; otherwise ``ValueError``.
    """
    if isinstance(target_peak, bool) or not isinstance(target_peak, int | np.integer) or (
        target_peak < 1
    ):
        raise ValueError(f"with_peak: target_peak must be an integer ≥ 1, got {target_peak!r}")
    if not 0 < rel_tol < 1:
        raise ValueError(f"with_peak: rel_tol must be in (0, 1), got {rel_tol!r}")
    base = dataclasses.replace(config, sessions_per_s=None)
    n = n_conversations(base)
    tol = max(rel_tol * target_peak, 0.5)

    def peak(k: float) -> float:
        return float(peak_active_sessions(prepare_workload(with_copies(base, k))))

    tried = [(1.0, peak(1.0))]
    lo = hi = None
    k = 1.0
    for _ in range(max_iter):
        k_now, p = tried[-1]
        if abs(p - target_peak) <= tol:
            return with_copies(base, k_now)
        if p < target_peak:
            lo = (k_now, p) if lo is None or k_now > lo[0] else lo
        else:
            hi = (k_now, p) if hi is None or k_now < hi[0] else hi
        if hi is None:  # grow: proportional to the shortfall, at least ×1.5
            k = k_now * max(target_peak / max(p, 0.5), 1.5)
        elif lo is None:  # shrink, not below one session in the window
            k = max(k_now * min(target_peak / p, 0.67), 1.0 / n)
        else:
            (k0, p0), (k1, p1) = lo, hi
            k = math.exp(np.interp(math.log(target_peak), [math.log(max(p0, 0.5)),
                                                           math.log(p1)],
                                   [math.log(k0), math.log(k1)]))
            if not k0 * 1.001 < k < k1 / 1.001:
                k = math.sqrt(k0 * k1)
            if k1 / k0 < 1.0005:  # the bracket has closed: P jumps over the target here
                break
        tried.append((k, peak(k)))
    best_k, best_p = min(tried, key=lambda kp: abs(kp[1] - target_peak))
    if abs(best_p - target_peak) <= 0.25 * target_peak:
        return with_copies(base, best_k)
    raise ValueError(f"with_peak: no rate gives P = {target_peak} within {rel_tol:.0%} after "
                     f"{len(tried)} tables (copies, P tried: {tried})")


def scale_summary(table: pd.DataFrame) -> dict[str, float | int]:
    """The replay scale of a prepared table, to print beside every result: session-start rate
    (sessions/s) over the window, copies of each conversation (mean), sessions, queries and the
    peak of active sessions P."""
    cfg = table.attrs.get("config", {})
    window_s = float(cfg.get("arrival", {}).get("window_days", 7.0)) * 86_400.0
    sessions = int(table["session"].nunique())
    conversations = int(table["conversation_id"].nunique())
    return {"sessions_per_s": sessions / window_s,
            "copies": sessions / conversations,
            "sessions": sessions,
            "conversations": conversations,
            "queries": len(table),
            "peak_sessions": peak_active_sessions(table)}


def service_utilization(table: pd.DataFrame) -> float:
    """u: the share of an active session's time during which one of its turns runs — Σ service
    / Σ (think + service) over every turn, with the service times of
    :data:`profiles.REFERENCE_DEPLOYMENT` as in :func:`peak_active_sessions`. With P active
    sessions, about u·P turns run at once (Little's law)."""
    if table.empty:
        raise ValueError("service_utilization: empty workload")
    service = _reference_service(table)
    return float(service.sum() / (table["think_s"].to_numpy().sum() + service.sum()))


def conversation_codes(table: pd.DataFrame) -> np.ndarray:
    """The conversation of every row as an integer, int64: conversations numbered in the order
    their first session appears in the table (the table is sorted by session start). With one
    copy of each conversation this is the ``session`` column itself; copies share a code. A
    table without ``conversation_id`` gets its ``session`` column."""
    if "conversation_id" not in table.columns:
        return table["session"].to_numpy(np.int64)
    codes, _ = pd.factorize(table["conversation_id"], sort=False)
    return codes.astype(np.int64)


def conversation_folds(ids: np.ndarray | list[int], folds: int, seed: int) -> np.ndarray:
    """Fold (0 … folds−1) of each conversation (or session) id, for held-out training (the
    learned gate, the horizon model): a SplitMix64 hash of (seed, id), so any id has a fold
    without a stored table and folds do not follow the id order."""
    return kernel.fold_hashes(np.asarray(ids, dtype=np.int64), int(folds), seed & 0xFFFFFFFF)
