"""The prepared workload: one table of every query the simulator replays (spec §4, §5, §8).

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
- ``"mooncake"``: the Mooncake conversation trace (:func:`.workload.mooncake_turns`),
  **standing in for the paper's ShareChat, which is not obtainable here**. It has no text, so each
  query borrows the quality vector of a ShareGPT query of similar input length
  (:func:`borrow_quality`, seeded); its token counts are the trace's (one count for every model).

Quality and output estimates depend only on the dataset (not on arrivals or sampling), so they are
computed once per dataset and cached; the whole table is cached by a hash of its parameters.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from carbonrouter_lib import output_length, quality, sharegpt, workload
from carbonrouter_lib.datasets import derived_dir
from carbonrouter_lib.outputs import atomic_path
from carbonrouter_lib.profiles import MODELS
from carbonrouter_lib.tokenizers import TOKENIZER_OF_MODEL

__all__ = [
    "CODE_VERSION",
    "DATASETS",
    "QUANTITIES",
    "WorkloadConfig",
    "base_turns",
    "borrow_quality",
    "column",
    "dataset_columns",
    "model_matrix",
    "prepare_workload",
]

#: Bump when the table's construction changes, so stale caches are not reused.
CODE_VERSION = "1"
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
    """The ``(n_queries, 5)`` array of one per-model quantity, columns in MODELS order."""
    return table[[column(quantity, m) for m in MODELS]].to_numpy()


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
        Replay window and think-time distribution (:class:`workload.ArrivalConfig`).
    max_conversations
        Use only the first N conversations of the dataset (quick runs and tests); None for all.
    think_source
        ``"model"`` draws think times from ``arrival``'s distribution; ``"trace"`` (Mooncake only)
        uses each turn's measured think time (floored at 0 s).
    context_turns
        Earlier turns of the conversation that the quality predictor sees as context.
    output_folds
        Folds (by conversation) of the cross-fitted output-length estimate.
    """

    dataset: str = "sharegpt"
    n_sessions: int | None = None
    seed: int = 0
    arrival: workload.ArrivalConfig = field(default_factory=workload.ArrivalConfig)
    max_conversations: int | None = None
    think_source: str = "model"
    context_turns: int = 1
    output_folds: int = 5

    def __post_init__(self) -> None:
        if self.dataset not in DATASETS:
            raise ValueError(f"unknown dataset {self.dataset!r}: choose one of {DATASETS}")
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

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (the arrival config nested)."""
        d = dataclasses.asdict(self)
        d["arrival"] = self.arrival.to_dict()
        return d

    def key(self) -> str:
        """Short hash of the parameters and the code version (cache key)."""
        text = json.dumps({"config": self.to_dict(), "code": CODE_VERSION}, sort_keys=True,
                          default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def base_turns(dataset: str, max_conversations: int | None = None) -> pd.DataFrame:
    """The dataset's turns table (ShareGPT schema; Mooncake without text), optionally truncated."""
    if dataset == "sharegpt":
        turns, _ = sharegpt.load_sharegpt_turns(max_conversations=max_conversations,
                                                progress=False)
        return turns
    if dataset == "mooncake":
        turns = workload.mooncake_turns()
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


def _cached(name: str, build, meta: dict[str, Any]) -> pd.DataFrame:
    """Load ``derived/<name>.parquet`` if present, else build, write atomically, return."""
    path = derived_dir() / f"{name}.parquet"
    if path.is_file():
        return pd.read_parquet(path)
    df = build()
    df.attrs = {}
    with atomic_path(path) as tmp:
        df.to_parquet(tmp, index=False)
    with atomic_path(derived_dir() / f"{name}.json") as tmp:
        tmp.write_text(json.dumps(meta, indent=1, default=str))
    return df


def dataset_columns(config: WorkloadConfig) -> pd.DataFrame:
    """Per-query columns that depend only on the dataset: tokens, estimated outputs, quality.

    Cached per (dataset, max_conversations, context_turns, output_folds); arrivals and sampling
    do not invalidate it. Row order is the base turns table's.
    """
    meta = {"dataset": config.dataset, "max_conversations": config.max_conversations,
            "context_turns": config.context_turns, "output_folds": config.output_folds,
            # Upstream versions too, so a changed predictor or parser never reuses stale columns.
            "code": CODE_VERSION, "quality_code": quality.CODE_VERSION,
            "sharegpt_code": sharegpt.CODE_VERSION}
    key = hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:16]

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

    return _cached(f"workload_{config.dataset}_columns_{key}", build, meta)


def prepare_workload(config: WorkloadConfig | None = None, use_cache: bool = True) -> pd.DataFrame:
    """The prepared workload table of ``config`` (see the module docstring for its columns).

    Cached as parquet in :func:`~carbonrouter_lib.datasets.derived_dir` under a hash of the
    parameters; ``table.attrs["config"]`` holds the parameters. Rows are sorted by session start,
    then turn; ``session`` numbers sessions 0…n−1 in that order.
    """
    config = config or WorkloadConfig()
    path = derived_dir() / f"workload_{config.dataset}_{config.key()}.parquet"
    if use_cache and path.is_file():
        table = pd.read_parquet(path)
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
    starts = workload.session_start_times(len(ids), config.arrival, rng)
    # Sessions are assigned start times in a seeded random order (not in trace order).
    start_of = dict(zip(rng.permutation(ids), starts, strict=True))
    table = cols.copy()
    session_start = table["conversation_id"].map(start_of).to_numpy(dtype=np.float64)
    first = table["turn"].to_numpy() == 0
    table.insert(0, "dataset", config.dataset)
    table.insert(1, "arrival_s", np.where(first, session_start, np.nan))
    if config.think_source == "trace":
        think = np.nan_to_num(np.maximum(table["think_time_trace_s"].to_numpy(), 0.0))
    else:
        think = workload.think_times(len(table), config.arrival, rng)
    table.insert(2, "think_s", np.where(first, 0.0, think))
    table["_start"] = session_start
    table = table.sort_values(["_start", "turn"], kind="stable").drop(columns="_start")
    table.insert(1, "session", np.cumsum(table["turn"].to_numpy() == 0) - 1)
    table = table.reset_index(drop=True)

    with atomic_path(path) as tmp:
        table.to_parquet(tmp, index=False)
    with atomic_path(path.with_suffix(".json")) as tmp:
        tmp.write_text(json.dumps(config.to_dict(), indent=1, default=str))
    table.attrs["config"] = config.to_dict()
    return table
