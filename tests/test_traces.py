"""Traces of one's own (carbonrouter_lib.traces): the format's columns, timing modes and every
check, on the example trace of tests/data/byo and on small traces written here (JSONL, CSV,
parquet, DataFrame)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from carbonrouter_lib import traces
from carbonrouter_lib.arrivals import ServiceTimeModel
from carbonrouter_lib.profiles import MODELS
from carbonrouter_lib.tokenizers import TOKENIZER_FAMILIES, count_tokens
from carbonrouter_lib.traces import TraceError, read_turns

BYO = Path(__file__).parent / "data" / "byo"
EXAMPLE = BYO / "chat_trace.jsonl"


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def counts_trace() -> list[dict]:
    """Two conversations with token counts, a start timestamp and think times."""
    return [
        {"conversation_id": "a", "turn": 0, "new_tokens": 100, "output_tokens": 50,
         "timestamp": "2022-01-03T10:00:00Z"},
        {"conversation_id": "a", "turn": 1, "new_tokens": 20, "output_tokens": 30,
         "think_s": 60.0},
        {"conversation_id": "b", "turn": 0, "new_tokens": 7, "output_tokens": 9,
         "timestamp": "2022-01-03T09:00:00Z"},
        {"conversation_id": "a", "turn": 2, "new_tokens": 5, "output_tokens": 5,
         "think_s": 10.0},
    ]


# ---------------------------------------------------------------------------------------------
# What is read


def test_example_trace_is_tokenized_per_family_with_histories():
    t = read_turns(EXAMPLE)
    raw = [json.loads(line) for line in EXAMPLE.read_text().splitlines()]
    assert len(t) == len(raw) == 19 and t["conversation_id"].nunique() == 8
    assert t.attrs["trace"]["tokenized"] == ["user_text", "assistant_text"]
    assert t.attrs["trace"]["sha256"] and t.attrs["trace"]["timing"] == (
        "timestamps (starts) + think_s")
    for f in TOKENIZER_FAMILIES:
        new = count_tokens([r["user_text"] for r in raw], f)
        by_key = dict(zip(((r["conversation_id"], r["turn"]) for r in raw), new, strict=True))
        got = [by_key[(c, k)] for c, k in zip(t["conversation_id"], t["turn"], strict=True)]
        assert list(t[f"new_tokens_{f}"]) == got
        per_turn = t[f"new_tokens_{f}"] + t[f"output_tokens_{f}"]
        earlier = per_turn.groupby(t["conversation_id"], sort=False).cumsum() - per_turn
        assert (t[f"history_tokens_{f}"] == earlier).all()
    first = t["turn"] == 0
    assert t.loc[first, "start_s"].iloc[0] == pd.Timestamp("2022-01-03T08:15:00Z").timestamp()
    assert t.loc[first, "think_s"].isna().all() and (t.loc[~first, "think_s"] > 0).all()
    assert list(t["source_row"][:2]) == ["line 1", "line 2"]


def test_rows_in_any_order_are_grouped_by_conversation_and_turn(tmp_path):
    t = read_turns(write_jsonl(tmp_path / "t.jsonl", counts_trace()))
    assert list(t["conversation_id"]) == ["a", "a", "a", "b"]
    assert list(t["turn"]) == [0, 1, 2, 0] and list(t["n_turns"]) == [3, 3, 3, 1]
    for f in TOKENIZER_FAMILIES:  # one count for every family
        assert list(t[f"new_tokens_{f}"]) == [100, 20, 5, 7]
        assert list(t[f"history_tokens_{f}"]) == [0, 150, 200, 0]
    assert list(t["think_s"].fillna(-1)) == [-1, 60.0, 10.0, -1]
    assert list(t["source_row"]) == ["line 1", "line 2", "line 4", "line 3"]
    assert "user_text" not in t.columns


def test_csv_parquet_and_dataframe_give_the_same_table(tmp_path):
    rows = counts_trace()
    df = pd.DataFrame(rows)
    a = read_turns(write_jsonl(tmp_path / "t.jsonl", rows))
    df.to_csv(tmp_path / "t.csv", index=False)
    df.to_parquet(tmp_path / "t.parquet")
    cols = [c for c in a.columns if c != "source_row"]
    for other in (read_turns(tmp_path / "t.csv"), read_turns(tmp_path / "t.parquet"),
                  read_turns(df)):
        pd.testing.assert_frame_equal(other[cols], a[cols])
    assert list(read_turns(tmp_path / "t.csv")["source_row"][:2]) == ["line 2", "line 3"]
    assert read_turns(df)["source_row"][3] == "row 2"


def test_per_family_counts_history_quality_and_estimates_are_taken_as_given():
    df = pd.DataFrame({"session_id": [5, 5], "turn": [0, 1]})
    for f, k in zip(TOKENIZER_FAMILIES, (1, 2, 3), strict=True):
        df[f"new_tokens_{f}"] = [10 * k, 5 * k]
        df[f"output_tokens_{f}"] = [4 * k, 4 * k]
        df[f"history_tokens_{f}"] = [0, 12 * k]  # less than the 14·k before: a trimmed context
        df[f"est_output_tokens_{f}"] = [3, 3]
    for j, m in enumerate(MODELS):
        df[f"quality_{m}"] = [0.1 * j, 0.2]
    t = read_turns(df)
    assert list(t["conversation_id"]) == ["5", "5"]
    assert list(t["history_tokens_mistral"]) == [0, 36] and list(t["new_tokens_llama3"]) == [20, 10]
    assert list(t["est_output_tokens_gemma3"]) == [3, 3]
    assert t[f"quality_{MODELS[-1]}"].tolist() == pytest.approx([0.4, 0.2])
    assert t.attrs["trace"]["timing"] == "arrival model + think model"


def test_timestamps_on_every_turn_give_think_times_less_service(tmp_path):
    rows = [{"conversation_id": "a", "turn": 0, "new_tokens": 1000, "output_tokens": 100,
             "timestamp": 1641200000},
            {"conversation_id": "a", "turn": 1, "new_tokens": 10, "output_tokens": 10,
             "timestamp": 1641200100.5},
            {"conversation_id": "a", "turn": 2, "new_tokens": 10, "output_tokens": 10,
             "timestamp": 1641200100.6}]  # 0.1 s later: less than the service time, floored
    t = read_turns(write_jsonl(tmp_path / "t.jsonl", rows))
    service = ServiceTimeModel().service_s([1000, 10], [100, 10])
    assert t["start_s"][0] == 1641200000.0
    assert t["think_s"][1] == pytest.approx(100.5 - service[0], rel=1e-12)
    assert t["think_s"][2] == 0.0
    assert t.attrs["trace"]["think_floored_at_zero"] == 1
    assert t.attrs["trace"]["timing"] == "timestamps (every turn)"
    # numbers after an origin, and ISO times with an offset
    rel = [dict(r, timestamp=r["timestamp"] - 1641200000) for r in rows]
    t2 = read_turns(pd.DataFrame(rel), time_origin="2022-01-03 09:00")
    assert t2["start_s"][0] == pd.Timestamp("2022-01-03T09:00Z").timestamp()
    iso = [dict(rows[0], timestamp="2022-01-03T10:00:00+01:00")]
    assert read_turns(pd.DataFrame(iso))["start_s"][0] == pd.Timestamp(
        "2022-01-03T09:00Z").timestamp()


# ---------------------------------------------------------------------------------------------
# Every check: a bad trace, and the words its message must contain


def _bad(i: int, **change) -> list[dict]:
    rows = [dict(r) for r in counts_trace()]
    for k, v in change.items():
        if v is _DROP:
            rows[i].pop(k, None)
        else:
            rows[i][k] = v
    return rows


_DROP = object()

BAD = [
    ("negative think", _bad(1, think_s=-4.0), ["line 2", "'a', turn 1", "think_s must be ≥ 0"]),
    ("missing think", _bad(3, think_s=None), ["line 4", "turn 2", "think_s is missing"]),
    ("think in ms", _bad(1, think_s=3.0e9), ["line 2", "over 30 days", "milliseconds"]),
    ("timestamp in ms", _bad(0, timestamp=1641204000000), ["line 1", "looks like milliseconds"]),
    ("bad timestamp", _bad(2, timestamp="noonish"), ["line 3", "'noonish'", "ISO 8601"]),
    ("first turn without start", _bad(2, timestamp=_DROP), ["line 3", "needs a timestamp"]),
    ("stamp and think", _bad(1, timestamp="2022-01-03T11:00:00Z"),
     ["line 2", "both a timestamp and think_s"]),
    ("fractional tokens", _bad(1, new_tokens=12.5), ["line 2", "whole number", "12.5"]),
    ("negative tokens", _bad(2, output_tokens=-9), ["line 3", "output_tokens", "-9"]),
    ("tokens as text", _bad(0, new_tokens="100"), ["line 1", "must be a number", "a string"]),
    ("missing tokens", _bad(3, output_tokens=None), ["line 4", "output_tokens is missing"]),
    ("turn as text", _bad(1, turn="1"), ["line 2", "turn must be a number", "a string '1'"]),
    ("negative turn", _bad(2, turn=-1), ["line 3", "turn must be a whole number"]),
    ("boolean turn", _bad(2, turn=True), ["line 3", "turn must be a number"]),
    ("duplicate turn", _bad(3, turn=1), ["line 2", "duplicate (conversation, turn)",
                                         "also at line 4"]),
    ("turn gap", _bad(3, turn=3), ["conversation 'a'", "turns must be 0 … n−1",
                                   "[0, 1, 3]", "missing [2]"]),
    ("negative id", _bad(2, conversation_id=-2), ["line 3", "integer ≥ 0", "-2"]),
    ("fractional id", _bad(2, conversation_id=2.5), ["line 3", "integer ≥ 0"]),
    ("missing id", _bad(2, conversation_id=""), ["line 3", "conversation_id is missing"]),
    ("history on first turn", [dict(r, history_tokens=0 if r["turn"] else 3)
                               for r in counts_trace()],
     ["line 1", "on a first turn"]),
    ("history too long", [dict(r, history_tokens=0 if r["turn"] == 0 else 999)
                          for r in counts_trace()],
     ["line 2", "more than the previous turn's history + message + response (150)"]),
    ("quality out of range", [dict(r, **{f"quality_{m}": 1.5 for m in MODELS})
                              for r in counts_trace()], ["line 1", "must be in [0, 1]"]),
    ("text missing", [dict(r, user_text=None if i == 1 else "hi")
                      for i, r in enumerate(counts_trace())], ["line 2", "user_text must be text"]),
]


@pytest.mark.parametrize("rows,words", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_traces_name_the_file_and_row(tmp_path, rows, words):
    path = write_jsonl(tmp_path / "bad_trace.jsonl", rows)
    with pytest.raises(TraceError, match=f"^{re.escape(str(path))}, ") as err:
        read_turns(path)
    missing = [w for w in words if w not in str(err.value)]
    assert not missing, (missing, str(err.value))


@pytest.mark.parametrize("column", ["arrival_s", "start_time", "sent_at", "created"])
def test_a_time_column_outside_the_format_is_an_error(tmp_path, column):
    rows = [dict(r, **{column: 1641200000.0}) for r in counts_trace()]
    path = write_jsonl(tmp_path / "t.jsonl", rows)
    with pytest.raises(TraceError, match=rf"{re.escape(str(path))}: column\(s\) \['{column}'\] "
                                         r"are not part of the trace format.*'timestamp'"):
        read_turns(path)


def test_other_unknown_columns_are_named_and_reported(tmp_path):
    rows = [dict(r, topic="x", model_hint="y") for r in counts_trace()]
    path = write_jsonl(tmp_path / "t.jsonl", rows)
    with pytest.warns(UserWarning, match=r"\['topic', 'model_hint'\] are not part of the trace"):
        t = read_turns(path)
    assert t.attrs["trace"]["ignored_columns"] == ["topic", "model_hint"]
    assert read_turns(write_jsonl(tmp_path / "ok.jsonl", counts_trace())).attrs["trace"][
        "ignored_columns"] == []


def test_later_timestamps_are_all_or_none(tmp_path):
    rows = [{"conversation_id": "a", "turn": k, "new_tokens": 1, "output_tokens": 1,
             "timestamp": 1641200000 + 100 * k} for k in range(3)]
    rows[2]["timestamp"] = None
    with pytest.raises(TraceError, match=r"line 3 .*timestamp is missing \(later turns"):
        read_turns(write_jsonl(tmp_path / "t.jsonl", rows))
    rows[2]["timestamp"] = 1641200050
    with pytest.raises(TraceError, match=r"line 3 .*50\.000 s earlier than the previous"):
        read_turns(write_jsonl(tmp_path / "t.jsonl", rows))


def test_negative_id_in_a_csv_file(tmp_path):
    df = pd.DataFrame(counts_trace())
    df["conversation_id"] = ["7", "7", "-1", "7"]
    df.to_csv(tmp_path / "t.csv", index=False)
    with pytest.raises(TraceError, match=r"t\.csv, line 4: conversation_id '-1' is a negative"):
        read_turns(tmp_path / "t.csv")


def test_bad_columns(tmp_path):
    base = pd.DataFrame(counts_trace())
    cases = [
        (base.drop(columns="conversation_id"), "needs one of"),
        (base.assign(session_id=1), "needs one of"),
        (base.drop(columns="new_tokens"), "needs 'new_tokens'"),
        (base.assign(**{f"new_tokens_{f}": 1 for f in TOKENIZER_FAMILIES}),
         "both 'new_tokens' and"),
        (base.drop(columns="new_tokens").assign(new_tokens_llama3=1),
         "not ['new_tokens_gemma3', 'new_tokens_mistral']"),
        (base.assign(**{f"quality_{MODELS[0]}": 0.5}), "give all of them or none"),
        (base.iloc[:0], "no turns"),
    ]
    for df, words in cases:
        with pytest.raises(TraceError, match=words.replace("(", r"\(").replace("[", r"\[")):
            read_turns(df)


def test_bad_files(tmp_path):
    (tmp_path / "t.jsonl").write_text('{"turn": 0}\n\n{not json}\n')
    with pytest.raises(TraceError, match=r"t\.jsonl, line 3: not JSON"):
        read_turns(tmp_path / "t.jsonl")
    (tmp_path / "t.jsonl").write_text('[1, 2]\n')
    with pytest.raises(TraceError, match=r"line 1: a turn must be a JSON object"):
        read_turns(tmp_path / "t.jsonl")
    (tmp_path / "t.txt").write_text("x")
    with pytest.raises(TraceError, match="unknown trace format '.txt'"):
        read_turns(tmp_path / "t.txt")
    with pytest.raises(FileNotFoundError, match="no such file"):
        read_turns(tmp_path / "absent.jsonl")
    with pytest.raises(TypeError, match="DataFrame or a path"):
        read_turns([{"turn": 0}])
    assert issubclass(traces.TraceError, ValueError)


def test_more_bad_values(tmp_path):
    rows = counts_trace()
    cases = [
        (pd.DataFrame(rows).assign(new_tokens=[1.0, float("inf"), 2.0, 3.0]),
         r"row 1 \(conversation 'a', turn 1\): new_tokens must be finite"),
        (pd.DataFrame(rows).assign(timestamp=[True, None, "2022-01-03T09:00:00Z", None]),
         r"row 0 .*timestamp must be a number"),
        (pd.DataFrame(rows).assign(conversation_id=[["a"], "a", "b", "a"]),
         r"row 0: conversation_id must be a string or an integer ≥ 0, got list"),
    ]
    for df, words in cases:
        with pytest.raises(TraceError, match=words):
            read_turns(df)
    (tmp_path / "t.csv").write_text('a,b\n1,"2\n')
    with pytest.raises(TraceError, match=r"t\.csv: not a readable CSV"):
        read_turns(tmp_path / "t.csv")
