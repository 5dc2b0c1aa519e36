"""The Mooncake conversation trace: its requests, the sessions inferred from its block hashes,
its think times, and the trace as a turn table.

The trace (Kimi, FAST'25; 12,031 requests in one hour; per request a timestamp in ms, input and
output lengths in tokens and ``hash_ids``, the ids of the input's 512-token blocks) has no session
ids; :func:`infer_sessions` recovers them from the block hashes, :func:`inter_turn_gaps` measures
think times, :func:`calibrate_think_time` calibrates the think-time distribution of the arrival
model (:mod:`carbonrouter_lib.arrivals`), and :func:`mooncake_turns` turns the trace into a turn
table of the ShareGPT schema — a second real workload, **standing in for the paper's ShareChat**
(arXiv 2512.17843), which is not obtainable here (``docs/model.md`` §8).

What the data shows (checked on the mirrored trace; the numbers are those of that file)
------------------------------------------------------------------------------------------
- ``hash_ids`` are *prefix* hashes: an id always sits at the same position after the same id,
  so one id names a whole block prefix (0 violations). :func:`infer_sessions` checks this and
  relies on it. New ids are handed out in increasing order; block 0 (the system prompt) is in
  every request. ``len(hash_ids) == ceil(input_length / 512)`` for every request.
- A follow-up repeats every *complete* block of its predecessor's input but not a partial last
  block: a partial block's hash changes once text is appended to it. Of the 3,975 requests that
  extend an earlier one (rules below), 3,880 share all but its last block; the 95 that share all
  of them repeat its input exactly (87, a regenerate) or follow an input that is a multiple of
  512 tokens (8, a complete last block).
- A follow-up's input is the predecessor's input + response + the new message: of the 3,875
  whose input grew, 3,548 have ``input_length >= prev input + prev output`` (median +37 tokens,
  the new message) and 327 are a few tokens short (median -11: the stored response is slightly
  shorter than the generated one; a few are edits).
- Timestamps are non-decreasing and whole seconds (± 1 ms). Consecutive turns of an inferred
  session are 3 s to 50 min apart, median ~2 min.

Session-inference rules (:func:`infer_sessions`)
------------------------------------------------
Requests are taken in file (= time) order. Request *i* **extends** an earlier request *j* when
*i*'s block list starts with all complete blocks of *j* (``input_length_j // 512`` blocks), and *j*
has at least 2 complete blocks: block 0 is shared by every request, so block 0 alone never links.
*i*'s predecessor (``parent``) is the earlier request it extends with the longest complete
prefix (the closest ancestor); among several with that prefix (repeats of one input) the most
recent. A request that extends none starts a new session — also when it shares ≥ 2 blocks with an
earlier request without containing all of that request's complete blocks (flag
``shares_prefix_only``: a conversation edited above its last message, or one document or
template shared by different sessions; we cannot tell which, so we do not link). Sessions are the
trees of predecessor links; turns are numbered in time order within a session, and ``prev`` is
the session's previous request in time. The two differ only where a session branches (a
request extends an earlier turn rather than the latest one).

Tokens of a turn, relative to ``prev`` (what the cache of the deployment that served ``prev``
holds): if the request extends ``prev``, ``history = min(input_length, prev input + prev
output)``; otherwise (a branch), ``history = min(input_length, 512 * common leading blocks)``,
the block-aligned prefix both inputs share. ``new = input_length - history``. A first turn has
history 0. The first request of a session that began before the trace carries its earlier history
inside ``new``: the trace cannot tell it apart.

Think times (:func:`inter_turn_gaps`, :func:`calibrate_think_time`)
--------------------------------------------------------------------
The gap between turn k and k+1 of a session minus the service time our simulator would give turn
k on the reference deployment (:class:`~carbonrouter_lib.arrivals.ServiceTimeModel`), fitted by
:func:`~carbonrouter_lib.arrivals.fit_think_time` with the truncation at the trace's end; the
rules are in :mod:`carbonrouter_lib.arrivals`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from carbonrouter_lib.arrivals import ServiceTimeModel, ThinkTimeFit, fit_think_time
from carbonrouter_lib.datasets import fetch
from carbonrouter_lib.tokenizers import TOKENIZER_FAMILIES

__all__ = [
    "MOONCAKE_TRACE",
    "BLOCK_TOKENS",
    "MIN_LINK_BLOCKS",
    "load_mooncake_trace",
    "infer_sessions",
    "session_counts",
    "inter_turn_gaps",
    "calibrate_think_time",
    "mooncake_turns",
]

#: Data-registry name of the Mooncake conversation trace.
MOONCAKE_TRACE = "conversations/mooncake/conversation_trace.jsonl"
#: Tokens per ``hash_ids`` block of the Mooncake trace.
BLOCK_TOKENS = 512
#: Complete blocks a predecessor must have to be linked (block 0 alone never links).
MIN_LINK_BLOCKS = 2

_TRACE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


# --------------------------------------------------------------------------------------------
# The trace: load, sessions, think times


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def load_mooncake_trace(path: str | os.PathLike | None = None) -> pd.DataFrame:
    """Read and validate the Mooncake conversation trace (JSON lines).

    Parameters
    ----------
    path
        A JSONL file; default the registered, hash-verified trace (:data:`MOONCAKE_TRACE`).

    Returns
    -------
    pandas.DataFrame
        One row per request in file order, columns ``line`` (1-based line number),
        ``timestamp`` (ms since the trace start), ``input_length``, ``output_length`` (tokens),
        ``hash_ids`` (tuple of int block ids). Other fields of a record are ignored.

    Raises
    ------
    ValueError
        Naming the file and line: a line that is not a JSON object, a missing field, a field of
        the wrong type, a negative timestamp or output length, an input length < 1, a
        ``hash_ids`` list whose length is not ``ceil(input_length / 512)``, or a timestamp
        earlier than the line before (session inference and gaps use file order as time order).
        An empty file is an error too.
    """
    path = Path(path) if path is not None else fetch(MOONCAKE_TRACE)
    lines, ts, il, ol, hs = [], [], [], [], []
    with open(path, encoding="utf-8") as fh:
        for lineno, raw in enumerate(fh, start=1):
            where = f"{path}:{lineno}"
            if not raw.strip():
                raise ValueError(f"{where}: empty line (expected one JSON object per line)")
            try:
                rec = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: bad JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(rec, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(rec).__name__}")
            missing = [f for f in _TRACE_FIELDS if f not in rec]
            if missing:
                raise ValueError(f"{where}: missing field(s) {missing}")
            t, i_len, o_len, h = (rec[f] for f in _TRACE_FIELDS)
            for name, value in (("timestamp", t), ("input_length", i_len),
                                ("output_length", o_len)):
                if not _is_int(value):
                    raise ValueError(f"{where}: {name} must be an integer, got {value!r}")
            if t < 0:
                raise ValueError(f"{where}: negative timestamp {t} ms")
            if i_len < 1:
                raise ValueError(f"{where}: input_length must be ≥ 1 token, got {i_len}")
            if o_len < 0:
                raise ValueError(f"{where}: negative output_length {o_len}")
            if not isinstance(h, list) or not all(_is_int(x) and x >= 0 for x in h):
                raise ValueError(f"{where}: hash_ids must be a list of non-negative integers")
            if len(h) != -(-i_len // BLOCK_TOKENS):
                raise ValueError(
                    f"{where}: {len(h)} hash_ids for input_length {i_len}; expected "
                    f"ceil({i_len}/{BLOCK_TOKENS}) = {-(-i_len // BLOCK_TOKENS)}"
                )
            if ts and t < ts[-1]:
                raise ValueError(
                    f"{where}: timestamp {t} ms is earlier than the previous line's {ts[-1]} ms "
                    f"(the trace must be in arrival order)"
                )
            lines.append(lineno)
            ts.append(t)
            il.append(i_len)
            ol.append(o_len)
            hs.append(tuple(h))
    if not ts:
        raise ValueError(f"{path}: empty trace (no requests)")
    return pd.DataFrame({
        "line": np.asarray(lines, dtype=np.int64),
        "timestamp": np.asarray(ts, dtype=np.int64),
        "input_length": np.asarray(il, dtype=np.int64),
        "output_length": np.asarray(ol, dtype=np.int64),
        "hash_ids": pd.Series(hs, dtype=object),
    })


def _where(trace: pd.DataFrame, i: int) -> str:
    if "line" in trace.columns:
        return f"request {i} (line {int(trace['line'].iloc[i])})"
    return f"request {i}"


def _check_trace_frame(trace: pd.DataFrame) -> None:
    missing = [c for c in _TRACE_FIELDS if c not in trace.columns]
    if missing:
        raise ValueError(f"trace lacks column(s) {missing}; use load_mooncake_trace()")
    if len(trace) == 0:
        raise ValueError("empty trace (no requests)")
    ts = trace["timestamp"].to_numpy()
    bad = np.flatnonzero(np.diff(ts) < 0)
    if len(bad):
        raise ValueError(f"{_where(trace, int(bad[0]) + 1)}: timestamp earlier than the request "
                         f"before; the trace must be in arrival order")
    il = trace["input_length"].to_numpy()
    nblocks = np.fromiter((len(h) for h in trace["hash_ids"]), dtype=np.int64, count=len(trace))
    bad = np.flatnonzero((il < 1) | (nblocks != -(-il // BLOCK_TOKENS)))
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"{_where(trace, i)}: {nblocks[i]} hash_ids for input_length {il[i]}; "
                         f"expected ceil(input_length/{BLOCK_TOKENS})")
    if (trace["output_length"].to_numpy() < 0).any():
        i = int(np.flatnonzero(trace["output_length"].to_numpy() < 0)[0])
        raise ValueError(f"{_where(trace, i)}: negative output_length")


def infer_sessions(trace: pd.DataFrame) -> pd.DataFrame:
    """Recover sessions and turns of the Mooncake trace from its block hashes.

    Rules (module docstring, "Session-inference rules"): a request's predecessor is the earlier
    request whose complete blocks (``input_length // 512``, at least :data:`MIN_LINK_BLOCKS`)
    are the longest prefix of its own blocks, the most recent among equals; a request without
    one starts a session. One pass with a dict from "id of a request's last complete block"
    to requests — an id names a whole prefix, which is checked — so the cost is linear in the
    number of blocks (~0.1 s for the 12,031 requests).

    Parameters
    ----------
    trace
        As from :func:`load_mooncake_trace` (file order = arrival order).

    Returns
    -------
    pandas.DataFrame
        The trace's columns plus, per request: ``session_id`` (0, 1, … in order of the
        sessions' first requests), ``turn`` (0-based, time order within the session),
        ``n_turns``; ``parent`` (row of the predecessor, -1 for none) and
        ``parent_candidates`` (earlier requests with the same longest complete prefix;
        > 1 = ambiguous, the most recent was taken); ``prev`` (row of the session's previous
        request in time, -1 for a first turn); ``shared_blocks_prev`` (leading blocks shared
        with ``prev``); ``relation`` to ``prev``: ``"first"``, ``"follow-up"`` (extends
        ``prev`` and holds its whole context, input ≥ prev input + output), ``"short
        follow-up"`` (extends ``prev``, input between prev input and prev input + output),
        ``"repeat"`` (extends ``prev`` with an input no longer than prev's: a regenerate or
        an edit of the last message), ``"branch"`` (extends an earlier turn, not ``prev``);
        ``shares_prefix_only`` (a session start sharing ≥ 2 blocks with an earlier request it
        does not extend); ``history_tokens``, ``new_tokens`` (rules in the module docstring;
        they sum to ``input_length``).

    Raises
    ------
    ValueError
        The trace is empty, out of time order, has a ``hash_ids`` length that does not match its
        input length, or its ids are not prefix hashes (an id at two positions or after two
        different ids) — the message names the request.
    """
    _check_trace_frame(trace)
    hashes: list[tuple[int, ...]] = [tuple(h) for h in trace["hash_ids"]]
    il = trace["input_length"].to_numpy(dtype=np.int64)
    ol = trace["output_length"].to_numpy(dtype=np.int64)
    n = len(hashes)

    # Ids must be prefix hashes: then one id names its whole prefix and a dict on it is exact.
    position: dict[int, tuple[int, int]] = {}
    for i, h in enumerate(hashes):
        before = -1
        for k, x in enumerate(h):
            seen = position.setdefault(x, (k, before))
            if seen != (k, before):
                raise ValueError(
                    f"{_where(trace, i)}: hash id {x} at block {k} after id {before}, but "
                    f"earlier at block {seen[0]} after id {seen[1]}; hash_ids are not prefix "
                    f"hashes, so sessions cannot be inferred from them"
                )
            before = x

    complete = np.minimum(il // BLOCK_TOKENS, [len(h) for h in hashes])
    by_last_complete: dict[int, list[int]] = {}  # id of a request's last complete block → rows
    second_blocks: set[int] = set()  # ids seen at block 1 (sharing ≥ 2 blocks ⟺ same block 1)
    parent = np.full(n, -1, dtype=np.int64)
    candidates = np.zeros(n, dtype=np.int64)
    shares_only = np.zeros(n, dtype=bool)
    session = np.empty(n, dtype=np.int64)
    prev = np.full(n, -1, dtype=np.int64)
    turn = np.zeros(n, dtype=np.int64)
    last_of_session: list[int] = []
    for i, h in enumerate(hashes):
        # Longest prefix of h (≥ 2 blocks) that is some earlier request's complete-block list.
        for k in range(len(h) - 1, MIN_LINK_BLOCKS - 2, -1):
            found = by_last_complete.get(h[k])
            if found:
                parent[i] = found[-1]
                candidates[i] = len(found)
                break
        if parent[i] >= 0:
            s = session[parent[i]]
            session[i] = s
            prev[i] = last_of_session[s]
            turn[i] = turn[prev[i]] + 1
            last_of_session[s] = i
        else:
            session[i] = len(last_of_session)
            last_of_session.append(i)
            shares_only[i] = len(h) > 1 and h[1] in second_blocks
        if complete[i] >= MIN_LINK_BLOCKS:
            by_last_complete.setdefault(h[complete[i] - 1], []).append(i)
        if len(h) > 1:
            second_blocks.add(h[1])

    shared = np.zeros(n, dtype=np.int64)
    history = np.zeros(n, dtype=np.int64)
    relation = np.full(n, "first", dtype=object)
    for i in np.flatnonzero(prev >= 0):
        p = prev[i]
        hi, hp = hashes[i], hashes[p]
        m = 0
        for a, b in zip(hi, hp, strict=False):
            if a != b:
                break
            m += 1
        shared[i] = m
        if m >= complete[p]:  # i extends prev: its input holds prev's context (up to il_i)
            history[i] = min(il[i], il[p] + ol[p])
            if il[i] <= il[p]:
                relation[i] = "repeat"
            elif il[i] < il[p] + ol[p]:
                relation[i] = "short follow-up"
            else:
                relation[i] = "follow-up"
        else:  # branch: only the block-aligned common prefix is known to be shared
            history[i] = min(il[i], BLOCK_TOKENS * m)
            relation[i] = "branch"

    out = trace.copy()
    out["session_id"] = session
    out["turn"] = turn
    out["n_turns"] = np.bincount(session)[session]
    out["parent"] = parent
    out["parent_candidates"] = candidates
    out["prev"] = prev
    out["shared_blocks_prev"] = shared
    out["relation"] = pd.array(relation, dtype="string")
    out["shares_prefix_only"] = shares_only
    out["history_tokens"] = history
    out["new_tokens"] = il - history
    return out


def session_counts(sessions: pd.DataFrame) -> pd.DataFrame:
    """What :func:`infer_sessions` found, as a tidy table (quantity, value).

    Parameters
    ----------
    sessions
        Output of :func:`infer_sessions`.
    """
    s = sessions
    first = s["turn"] == 0
    later = ~first
    sizes = s.loc[first, "n_turns"]
    rel = s["relation"]
    il, ol = s["input_length"].to_numpy(), s["output_length"].to_numpy()
    prev = s["prev"].to_numpy()
    context_prev = np.where(prev >= 0, il[np.maximum(prev, 0)] + ol[np.maximum(prev, 0)], 0)
    rows = [
        ("requests", len(s)),
        ("sessions", int(first.sum())),
        ("one-request sessions", int((sizes == 1).sum())),
        ("sessions with ≥ 2 requests", int((sizes >= 2).sum())),
        ("sessions with ≥ 5 requests", int((sizes >= 5).sum())),
        ("sessions with ≥ 10 requests", int((sizes >= 10).sum())),
        ("largest session (requests)", int(sizes.max())),
        ("mean requests per session", float(sizes.mean())),
        ("follow-up requests (turn ≥ 1)", int(later.sum())),
        ("  follow-up: holds the previous context", int((rel == "follow-up").sum())),
        ("  short follow-up: input < previous input + output", int((rel == "short follow-up")
                                                                     .sum())),
        ("  repeat: input ≤ previous input (regenerate / edit)", int((rel == "repeat").sum())),
        ("  branch: extends an earlier turn, not the previous one", int((rel == "branch").sum())),
        ("predecessor ≠ previous turn of the session",
         int((later & (s["parent"] != s["prev"])).sum())),
        ("ambiguous predecessor (several with the longest prefix)",
         int((s["parent_candidates"] > 1).sum())),
        ("follow-ups whose input < previous context (input + output)",
         int((later & (il < context_prev)).sum())),
        ("follow-ups with 0 new tokens", int((later & (s["new_tokens"] == 0)).sum())),
        ("session starts sharing ≥ 2 blocks with a request they do not extend",
         int(s["shares_prefix_only"].sum())),
        ("requests with < 2 complete blocks (cannot be a predecessor)",
         int((il // BLOCK_TOKENS < MIN_LINK_BLOCKS).sum())),
    ]
    return pd.DataFrame(rows, columns=["quantity", "value"])


def inter_turn_gaps(
    sessions: pd.DataFrame,
    service: ServiceTimeModel | None = None,
    trace_end_s: float | None = None,
) -> pd.DataFrame:
    """Inter-turn gaps, service times and think times of every follow-up request.

    For request i with previous request p of its session (``prev``):
    ``gap_s = (timestamp_i - timestamp_p) / 1000``;
    ``service_s = new_tokens_p / v_pre + output_length_p / v_dec`` (:class:`ServiceTimeModel`);
    ``think_s = gap_s - service_s`` (may be ≤ 0 where the assumed service is slower than the
    real one); ``bound_s = trace_end_s - timestamp_p / 1000 - service_s``, the longest think time
    that could have been observed after p before the trace ends (the truncation bound).

    Parameters
    ----------
    sessions
        Output of :func:`infer_sessions`.
    service
        Speeds; default :class:`ServiceTimeModel()` (reference deployment).
    trace_end_s
        End of the observation (s since the trace start); default the last timestamp.

    Returns
    -------
    pandas.DataFrame
        One row per follow-up (in trace order): ``request`` (row), ``prev``, ``session_id``,
        ``turn``, ``gap_s``, ``service_s``, ``think_s``, ``bound_s``.
    """
    service = service or ServiceTimeModel()
    ts = sessions["timestamp"].to_numpy(dtype=np.float64) / 1000.0
    end = float(ts.max()) if trace_end_s is None else float(trace_end_s)
    if end < ts.max():
        raise ValueError(f"trace_end_s = {end} s is before the last request ({ts.max()} s)")
    prev = sessions["prev"].to_numpy()
    rows = np.flatnonzero(prev >= 0)
    p = prev[rows]
    serv = service.service_s(sessions["new_tokens"].to_numpy()[p],
                             sessions["output_length"].to_numpy()[p])
    gap = ts[rows] - ts[p]
    return pd.DataFrame({
        "request": rows.astype(np.int64),
        "prev": p.astype(np.int64),
        "session_id": sessions["session_id"].to_numpy()[rows],
        "turn": sessions["turn"].to_numpy()[rows],
        "gap_s": gap,
        "service_s": serv,
        "think_s": gap - serv,
        "bound_s": end - ts[p] - serv,
    })


def calibrate_think_time(
    trace: pd.DataFrame | None = None,
    service: ServiceTimeModel | None = None,
    *,
    truncation: bool = True,
    trace_end_s: float | None = None,
) -> tuple[ThinkTimeFit, pd.DataFrame]:
    """Think-time calibration on the Mooncake trace: sessions → gaps → fit.

    Parameters
    ----------
    trace
        A loaded trace or its sessions (:func:`load_mooncake_trace` / :func:`infer_sessions`);
        default the registered trace.
    service
        Service-time model removed from the gaps; default :class:`ServiceTimeModel()`.
    truncation
        Correct for the trace's end (truncated likelihood); False: plain MLE.
    trace_end_s
        End of the observation (s after the trace start); default the last timestamp.

    Returns
    -------
    fit, gaps
        The :class:`ThinkTimeFit` and the table of :func:`inter_turn_gaps`.
    """
    if trace is None:
        trace = load_mooncake_trace()
    sessions = trace if "prev" in trace.columns else infer_sessions(trace)
    gaps = inter_turn_gaps(sessions, service, trace_end_s)
    fit = fit_think_time(gaps["think_s"], gaps["bound_s"] if truncation else None)
    return fit, gaps


# --------------------------------------------------------------------------------------------
# Mooncake as a turn table (stand-in for ShareChat)


def mooncake_turns(
    trace: pd.DataFrame | None = None,
    service: ServiceTimeModel | None = None,
    families: Sequence[str] = TOKENIZER_FAMILIES,
) -> pd.DataFrame:
    """The Mooncake trace as a turn table in the ShareGPT schema (stand-in for ShareChat).

    The paper's second dataset, ShareChat (arXiv 2512.17843), is not obtainable here; the
    Mooncake conversation trace stands in for it as a second real multi-turn workload. Sessions,
    turns, history and new tokens follow :func:`infer_sessions`; a one-request session is a valid
    one-turn conversation. The trace has one token count per request and no text, so **every
    tokenizer family gets the same counts** (Kimi's tokenizer, not the serving model's), and
    there are no ``user_text`` / ``assistant_text`` columns.

    Parameters
    ----------
    trace
        A loaded trace or its sessions; default the registered trace.
    service
        Service-time model for the measured think times; default :class:`ServiceTimeModel()`.
    families
        Tokenizer families to write columns for.

    Returns
    -------
    pandas.DataFrame
        Rows grouped by conversation (sessions in order of their first request), turns in order.
        Columns ``conversation_id`` (``"mooncake-<session>"``), ``turn`` (0-based), ``n_turns``,
        per family ``new_tokens_<f>``, ``output_tokens_<f>``, ``history_tokens_<f>`` (tokens;
        ``history + new = input_length``); then ``request`` (row of the trace), ``trace_time_s``
        (arrival, s after the trace start), ``gap_s`` (since the previous turn's arrival),
        ``think_time_s`` (gap minus the previous turn's service time; may be ≤ 0; NaN for a
        first turn) and ``relation`` (see :func:`infer_sessions`).

    Notes
    -----
    Unlike ShareGPT, ``history_tokens`` of a turn is not always the sum of the earlier turns'
    new and output tokens: it is what the previous turn's context shares with this input, which
    is less after a branch, a repeat or a trimmed response (counted by :func:`session_counts`).
    It never exceeds the previous turn's history + new + output.
    """
    if trace is None:
        trace = load_mooncake_trace()
    s = trace if "prev" in trace.columns else infer_sessions(trace)
    gaps = inter_turn_gaps(s, service)
    think = np.full(len(s), np.nan)
    gap = np.full(len(s), np.nan)
    think[gaps["request"].to_numpy()] = gaps["think_s"].to_numpy()
    gap[gaps["request"].to_numpy()] = gaps["gap_s"].to_numpy()
    order = np.lexsort((s["turn"].to_numpy(), s["session_id"].to_numpy()))
    s = s.iloc[order]
    width = len(str(int(s["session_id"].max())))
    df = pd.DataFrame({
        "conversation_id": pd.array([f"mooncake-{k:0{width}d}" for k in s["session_id"]],
                                    dtype="string"),
        "turn": s["turn"].to_numpy(dtype=np.int64),
        "n_turns": s["n_turns"].to_numpy(dtype=np.int64),
    })
    for fam in families:
        df[f"new_tokens_{fam}"] = s["new_tokens"].to_numpy(dtype=np.int64)
        df[f"output_tokens_{fam}"] = s["output_length"].to_numpy(dtype=np.int64)
        df[f"history_tokens_{fam}"] = s["history_tokens"].to_numpy(dtype=np.int64)
    df["request"] = order.astype(np.int64)
    df["trace_time_s"] = s["timestamp"].to_numpy(dtype=np.float64) / 1000.0
    df["gap_s"] = gap[order]
    df["think_time_s"] = think[order]
    df["relation"] = s["relation"].to_numpy()
    return df
