"""The Mooncake trace (carbonrouter_lib.mooncake): loading, session inference, gaps and think
times, the think-time calibration, the trace as a turn table."""

from __future__ import annotations

import json
import time

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from carbonrouter_lib import mooncake
from carbonrouter_lib.arrivals import ArrivalConfig, ServiceTimeModel
from carbonrouter_lib.tokenizers import TOKENIZER_FAMILIES

# --------------------------------------------------------------------------------------------
# Loading the trace


def _write(tmp_path, lines):
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _rec(t=0, il=1100, ol=10, h=None):
    h = h if h is not None else list(range(-(-il // 512)))
    return json.dumps({"timestamp": t, "input_length": il, "output_length": ol, "hash_ids": h})


def test_load_reads_a_small_trace(tmp_path):
    path = _write(tmp_path, [_rec(0, 1100, 5, [0, 1, 2]), _rec(1000, 600, 7, [0, 3])])
    df = mooncake.load_mooncake_trace(path)
    assert df["line"].tolist() == [1, 2]
    assert df["timestamp"].tolist() == [0, 1000]
    assert df["hash_ids"].tolist() == [(0, 1, 2), (0, 3)]


@pytest.mark.parametrize(
    "lines, match",
    [
        ([_rec(), "{not json"], r":2: bad JSON"),
        ([_rec(), "[1, 2]"], r":2: expected a JSON object"),
        (['{"timestamp": 0, "input_length": 10, "hash_ids": [0]}'], r":1: missing.*output_length"),
        ([_rec(il=-5, h=[])], r":1: input_length must be"),
        ([_rec(ol=-1)], r":1: negative output_length"),
        ([_rec(t=-3)], r":1: negative timestamp"),
        ([_rec(il=1100, h=[0, 1])], r":1: 2 hash_ids for input_length 1100"),
        ([_rec(il=10, h=["a"])], r":1: hash_ids must be"),
        (['{"timestamp": 1.5, "input_length": 10, "output_length": 1, "hash_ids": [0]}'],
         r":1: timestamp must be an integer"),
        ([_rec(t=5000), _rec(t=4000)], r":2: timestamp 4000 ms is earlier"),
        ([_rec(), ""], r":2: empty line"),
    ],
)
def test_load_rejects_bad_lines_naming_them(tmp_path, lines, match):
    with pytest.raises(ValueError, match=match):
        mooncake.load_mooncake_trace(_write(tmp_path, lines))


def test_load_rejects_an_empty_trace(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    with pytest.raises(ValueError, match="empty trace"):
        mooncake.load_mooncake_trace(path)


# --------------------------------------------------------------------------------------------
# Session inference on hand-made hash chains


def _trace(rows):
    """rows: (timestamp_ms, input_length, output_length, hash_ids)."""
    return pd.DataFrame({
        "timestamp": [r[0] for r in rows],
        "input_length": [r[1] for r in rows],
        "output_length": [r[2] for r in rows],
        "hash_ids": pd.Series([tuple(r[3]) for r in rows], dtype=object),
    })


def test_two_interleaved_sessions_and_the_most_recent_of_equal_predecessors():
    s = mooncake.infer_sessions(_trace([
        (0, 1200, 100, [0, 1, 2]),        # A1: 2 complete blocks [0, 1], block 2 partial
        (1000, 1600, 50, [0, 3, 4, 5]),   # B1: complete [0, 3, 4]
        (5000, 1400, 500, [0, 1, 6]),     # A2 = A1 + 100 out + 100 new; repeats all but A1's last
        (8000, 1700, 5, [0, 3, 4, 7]),    # B2 = B1 + 50 + 50
        (9000, 2000, 5, [0, 1, 8, 9]),    # A3: complete prefixes of A1 and A2 are both [0, 1]
    ]))
    assert s["session_id"].tolist() == [0, 1, 0, 1, 0]
    assert s["turn"].tolist() == [0, 0, 1, 1, 2]
    assert s["n_turns"].tolist() == [3, 2, 3, 2, 3]
    assert s["parent"].tolist() == [-1, -1, 0, 1, 2]
    assert s["prev"].tolist() == [-1, -1, 0, 1, 2]
    assert s["parent_candidates"].tolist() == [0, 0, 1, 1, 2]  # A3 is ambiguous: A2 (recent)
    assert s["relation"].tolist() == ["first", "first", "follow-up", "follow-up", "follow-up"]
    # history = min(input, prev input + prev output); new = input - history.
    assert s["history_tokens"].tolist() == [0, 0, 1300, 1650, 1900]
    assert s["new_tokens"].tolist() == [1200, 1600, 100, 50, 100]


def test_block_zero_alone_never_links_and_partial_overlap_does_not_either():
    s = mooncake.infer_sessions(_trace([
        (0, 1536, 10, [0, 20, 21]),        # D1: 3 complete blocks (1536 = 3 × 512)
        (1000, 1100, 10, [0, 10, 11]),     # C1 shares only block 0 with D1
        (2000, 1800, 10, [0, 20, 22, 23]), # shares [0, 20] with D1 but not D1's block 21
        (3000, 1700, 10, [0, 20, 21, 24]), # extends D1 (all its complete blocks)
    ]))
    assert s["session_id"].tolist() == [0, 1, 2, 0]
    assert s["shares_prefix_only"].tolist() == [False, False, True, False]
    assert s["parent"].tolist() == [-1, -1, -1, 0]
    # D1's last block is complete, so its follow-up repeats all three of its blocks.
    assert s.loc[3, "shared_blocks_prev"] == 3


def test_a_predecessor_needs_two_complete_blocks():
    s = mooncake.infer_sessions(_trace([
        (0, 900, 10, [0, 1]),            # 1 complete block: cannot be linked to
        (1000, 1100, 10, [0, 1, 2]),     # contains [0, 1] but block 1 was partial in the first
    ]))
    assert s["session_id"].tolist() == [0, 1]


def test_branch_two_requests_extend_the_same_prefix():
    s = mooncake.infer_sessions(_trace([
        (0, 1600, 100, [0, 40, 41, 42]),          # F1: complete [0, 40, 41]
        (10_000, 2100, 300, [0, 40, 41, 43, 44]), # F2 extends F1: complete [0, 40, 41, 43]
        (20_000, 2000, 50, [0, 40, 41, 45]),      # F3 extends F1 too, not F2
    ]))
    assert s["session_id"].tolist() == [0, 0, 0]
    assert s["turn"].tolist() == [0, 1, 2]
    assert s["parent"].tolist() == [-1, 0, 0]
    assert s["prev"].tolist() == [-1, 0, 1]
    assert s["relation"].tolist() == ["first", "follow-up", "branch"]
    assert s.loc[2, "shared_blocks_prev"] == 3
    # Branch: history = the block-aligned prefix F3 shares with F2's context, 3 × 512.
    assert s.loc[2, "history_tokens"] == 1536 and s.loc[2, "new_tokens"] == 464
    assert s.loc[1, "history_tokens"] == 1700


def test_repeat_and_short_follow_up():
    s = mooncake.infer_sessions(_trace([
        (0, 1200, 300, [0, 1, 2]),
        (5000, 1200, 280, [0, 1, 2]),   # regenerate: identical input
        (9000, 1450, 10, [0, 1, 3]),    # input < 1200 + 280: a trimmed response
    ]))
    assert s["relation"].tolist() == ["first", "repeat", "short follow-up"]
    assert s["history_tokens"].tolist() == [0, 1200, 1450]
    assert s["new_tokens"].tolist() == [1200, 0, 0]
    counts = mooncake.session_counts(s).set_index("quantity")["value"]
    assert counts["sessions"] == 1 and counts["follow-ups with 0 new tokens"] == 2


def test_ids_that_are_not_prefix_hashes_are_rejected():
    with pytest.raises(ValueError, match="request 1.*not prefix hashes"):
        mooncake.infer_sessions(_trace([(0, 1100, 1, [0, 1, 2]), (1, 600, 1, [0, 2])]))
    with pytest.raises(ValueError, match="arrival order"):
        mooncake.infer_sessions(_trace([(5, 1100, 1, [0, 1, 2]), (1, 600, 1, [0, 3])]))
    with pytest.raises(ValueError, match="empty trace"):
        mooncake.infer_sessions(_trace([]).astype({"timestamp": "int64"}))


def _synthetic_trace(sessions: list[list[tuple[int, int]]], order: list[int]):
    """Content-hashed blocks of real conversations: 512 system tokens, then per turn a message
    of ``new`` tokens and a response of ``out`` tokens (unique token values per segment)."""
    ids: dict[tuple, int] = {}
    contexts = [[0] * 512 for _ in sessions]  # the shared system prompt = block 0
    next_turn = [0] * len(sessions)
    rows, truth = [], []
    for t, k in enumerate(order):
        turn = next_turn[k]
        new, out = sessions[k][turn]
        label = 1 + 2 * (1000 * k + turn)
        contexts[k] = contexts[k] + [label] * new
        ctx = contexts[k]
        blocks, parent = [], -1
        for b in range(0, len(ctx), 512):
            key = (parent, tuple(ctx[b:b + 512]))
            parent = ids.setdefault(key, len(ids))
            blocks.append(parent)
        rows.append((1000 * t, len(ctx), out, blocks))
        truth.append((k, turn))
        contexts[k] = ctx + [label + 1] * out
        next_turn[k] += 1
    return _trace(rows), truth


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_inference_recovers_synthetic_sessions(data):
    n_sess = data.draw(st.integers(1, 4))
    sessions = []
    for _ in range(n_sess):
        first = (data.draw(st.integers(600, 1500)), data.draw(st.integers(0, 700)))
        later = data.draw(st.lists(st.tuples(st.integers(1, 700), st.integers(0, 700)),
                                   max_size=3))
        sessions.append([first, *later])
    order = data.draw(st.permutations([k for k, s in enumerate(sessions) for _ in s]))
    # Within a session the turns keep their order whatever the interleaving.
    trace, truth = _synthetic_trace(sessions, list(order))
    s = mooncake.infer_sessions(trace)
    truth_sess = [k for k, _ in truth]
    pairs = set(zip(s["session_id"], truth_sess, strict=True))
    assert len(pairs) == n_sess == s["session_id"].nunique()  # same partition
    assert s["turn"].tolist() == [turn for _, turn in truth]
    later = s["turn"] > 0
    assert (s.loc[later, "relation"] == "follow-up").all()
    for i in np.flatnonzero(later):
        k, turn = truth[i]
        prev_new = sum(n for n, _ in sessions[k][:turn])
        prev_out = sum(o for _, o in sessions[k][:turn])
        assert s.loc[i, "history_tokens"] == 512 + prev_new + prev_out
        assert s.loc[i, "new_tokens"] == sessions[k][turn][0]


# --------------------------------------------------------------------------------------------
# Gaps and think times (the fit itself: tests/test_arrivals.py)


def _gap_trace():
    return _trace([
        (0, 1200, 100, [0, 1, 2]),           # A1
        (10_000, 1100, 500, [0, 5, 6]),      # B1
        (40_000, 1700, 10, [0, 5, 7, 8]),    # B2
        (60_000, 1400, 20, [0, 1, 9]),       # A2: history 1300, new 100
        (90_000, 1500, 10, [0, 1, 9]),       # A3: history min(1500, 1420) = 1420, new 80
    ])


def test_gaps_service_and_think_times_by_hand():
    s = mooncake.infer_sessions(_gap_trace())
    g = mooncake.inter_turn_gaps(s, ServiceTimeModel(prefill_tok_s=1000, decode_tok_s=10))
    g = g.set_index("request")
    # B2 after B1: gap 30 s; service of B1 = 1100/1000 + 500/10 = 51.1 s → think −21.1 s.
    # A2 after A1: gap 60 s; service of A1 = 1200/1000 + 100/10 = 11.2 s → think 48.8 s.
    # A3 after A2: gap 30 s; service of A2 = 100/1000 + 20/10 = 2.1 s (new tokens only).
    assert g["gap_s"].to_dict() == pytest.approx({2: 30.0, 3: 60.0, 4: 30.0})
    assert g["service_s"].to_dict() == pytest.approx({2: 51.1, 3: 11.2, 4: 2.1})
    assert g["think_s"].to_dict() == pytest.approx({2: -21.1, 3: 48.8, 4: 27.9})
    # Bound: trace end (90 s) − predecessor arrival − its service.
    assert g["bound_s"].to_dict() == pytest.approx({2: 90 - 10 - 51.1, 3: 90 - 11.2,
                                                    4: 90 - 60 - 2.1})
    with pytest.raises(ValueError, match="before the last request"):
        mooncake.inter_turn_gaps(s, trace_end_s=50.0)


# --------------------------------------------------------------------------------------------
# Mooncake as a turn table


def test_mooncake_turns_schema_on_a_hand_made_trace():
    turns = mooncake.mooncake_turns(_gap_trace(),
                                    ServiceTimeModel(prefill_tok_s=1000, decode_tok_s=10))
    # Sessions in order of their first request, turns contiguous and in order.
    assert turns["conversation_id"].tolist() == ["mooncake-0"] * 3 + ["mooncake-1"] * 2
    assert turns["turn"].tolist() == [0, 1, 2, 0, 1]
    assert turns["n_turns"].tolist() == [3, 3, 3, 2, 2]
    assert turns["request"].tolist() == [0, 3, 4, 1, 2]
    for f in TOKENIZER_FAMILIES:  # one count per request: the same for every family
        assert turns[f"history_tokens_{f}"].tolist() == [0, 1300, 1420, 0, 1600]
        assert turns[f"new_tokens_{f}"].tolist() == [1200, 100, 80, 1100, 100]
        assert turns[f"output_tokens_{f}"].tolist() == [100, 20, 10, 500, 10]
    assert turns["trace_time_s"].tolist() == [0.0, 60.0, 90.0, 10.0, 40.0]
    assert turns["think_time_s"].iloc[[1, 2, 4]].tolist() == pytest.approx([48.8, 27.9, -21.1])
    assert turns["think_time_s"].iloc[[0, 3]].isna().all()


# --------------------------------------------------------------------------------------------
# The real trace (mirror)


@pytest.fixture(scope="module")
def real_sessions():
    trace = mooncake.load_mooncake_trace()
    t0 = time.perf_counter()
    s = mooncake.infer_sessions(trace)
    return s, time.perf_counter() - t0


def test_real_trace_sessions(real_sessions):
    s, seconds = real_sessions
    assert len(s) == 12_031
    assert seconds < 1.5  # ~0.1 s on a laptop core
    counts = mooncake.session_counts(s).set_index("quantity")["value"]
    assert counts["sessions"] == 8056 and counts["follow-up requests (turn ≥ 1)"] == 3975
    assert (s["history_tokens"] + s["new_tokens"] == s["input_length"]).all()
    assert (s["new_tokens"] >= 0).all()
    # History never exceeds the previous turn's context (history + new + output).
    later = s[s["prev"] >= 0]
    p = s.loc[later["prev"]]
    assert (later["history_tokens"].to_numpy()
            <= (p["input_length"] + p["output_length"]).to_numpy()).all()


def test_calibration_reproduces_the_arrival_defaults(real_sessions):
    s, _ = real_sessions
    fit, gaps = mooncake.calibrate_think_time(s)
    cfg = ArrivalConfig()
    assert fit.truncated and fit.n_used + fit.n_nonpositive == len(gaps)
    assert fit.lognormal_mu == pytest.approx(cfg.lognormal_mu, rel=5e-4)
    assert fit.lognormal_sigma == pytest.approx(cfg.lognormal_sigma, rel=5e-4)
    assert fit.exponential_mean_s == pytest.approx(cfg.exponential_mean_s, rel=5e-4)
    assert fit.lognormal_aic < fit.exponential_aic
    turns = mooncake.mooncake_turns(s)
    assert len(turns) == len(s) and turns["think_time_s"].notna().sum() == len(gaps)
