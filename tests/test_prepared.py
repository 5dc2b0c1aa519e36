"""The prepared workload table: schema, arrivals, sampling, quality borrowing, caching, errors."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from carbonrouter_lib import datasets, prepared, sharegpt
from carbonrouter_lib.arrivals import ArrivalConfig
from carbonrouter_lib.profiles import MODELS

SMALL = prepared.WorkloadConfig(dataset="sharegpt", max_conversations=60, seed=1)


@pytest.fixture(scope="module")
def small_table() -> pd.DataFrame:
    return prepared.prepare_workload(SMALL, use_cache=False)


def test_config_rejects_bad_parameters():
    with pytest.raises(ValueError, match="unknown dataset 'sharechat'"):
        prepared.WorkloadConfig(dataset="sharechat")
    with pytest.raises(ValueError, match="n_sessions"):
        prepared.WorkloadConfig(n_sessions=0)
    with pytest.raises(ValueError, match="think_source"):
        prepared.WorkloadConfig(dataset="sharegpt", think_source="trace")
    with pytest.raises(KeyError, match="unknown model"):
        prepared.column("quality", "GPT-4")


def test_schema_has_every_per_model_column(small_table):
    for q in prepared.QUANTITIES:
        for m in MODELS:
            assert prepared.column(q, m) in small_table.columns
    assert prepared.model_matrix(small_table, "quality").shape == (len(small_table), 5)
    q = prepared.model_matrix(small_table, "quality")
    assert np.all((q >= 0) & (q <= 1))
    assert (prepared.model_matrix(small_table, "est_output_tokens") >= 1).all()


def test_tokens_follow_each_models_tokenizer(small_table):
    turns, _ = sharegpt.load_sharegpt_turns(max_conversations=60, progress=False)
    merged = small_table.merge(turns, on=["conversation_id", "turn"], validate="one_to_one")
    assert len(merged) == len(turns) == len(small_table)
    for m, f in [("Gemma-3-1B", "gemma3"), ("Gemma-3-4B", "gemma3"), ("Llama-3.2-3B", "llama3"),
                 ("Llama-3.1-70B", "llama3"), ("Mistral-7B-v0.2", "mistral")]:
        for q in ("new_tokens", "history_tokens", "output_tokens"):
            assert (merged[prepared.column(q, m)] == merged[f"{q}_{f}"]).all()


def test_history_is_the_sum_of_earlier_turns(small_table):
    col = lambda q: small_table[prepared.column(q, "Mistral-7B-v0.2")]  # noqa: E731
    per_turn = col("new_tokens") + col("output_tokens")
    earlier = per_turn.groupby(small_table["session"]).cumsum() - per_turn
    assert (col("history_tokens") == earlier).all()


def test_arrivals_and_think_times(small_table):
    t = small_table
    first = t["turn"] == 0
    cfg = ArrivalConfig()
    assert t.loc[first, "arrival_s"].between(cfg.start_epoch_s, cfg.end_epoch_s).all()
    assert t.loc[~first, "arrival_s"].isna().all()
    assert (t.loc[first, "think_s"] == 0).all() and (t.loc[~first, "think_s"] > 0).all()
    # Sessions are numbered in start order and every session's turns are contiguous and ordered.
    starts = t.loc[first, "arrival_s"].to_numpy()
    assert np.all(np.diff(starts) >= 0)
    assert list(t.loc[first, "session"]) == list(range(first.sum()))
    for _, g in t.groupby("session"):
        assert list(g["turn"]) == list(range(len(g))) and g["conversation_id"].nunique() == 1


def test_deterministic_and_cached(small_table):
    again = prepared.prepare_workload(SMALL, use_cache=False)
    pd.testing.assert_frame_equal(small_table, again)
    prepared.prepare_workload(SMALL)  # writes the cache
    cached = prepared.prepare_workload(SMALL)
    pd.testing.assert_frame_equal(small_table, cached, check_dtype=False)
    assert cached.attrs["config"]["max_conversations"] == 60
    other = prepared.prepare_workload(dataclasses.replace(SMALL, seed=2), use_cache=False)
    assert not np.allclose(other["think_s"].sum(), small_table["think_s"].sum())


def test_session_sampling():
    cfg = dataclasses.replace(SMALL, n_sessions=10)
    t = prepared.prepare_workload(cfg, use_cache=False)
    assert t["session"].nunique() == t["conversation_id"].nunique() == 10
    with pytest.raises(ValueError, match="n_sessions=61 exceeds the 60 sessions"):
        prepared.prepare_workload(dataclasses.replace(SMALL, n_sessions=61), use_cache=False)


def test_borrow_quality_draws_donors_of_similar_length():
    donor_len = np.arange(1000, dtype=float)
    donor_q = np.column_stack([donor_len / 1000] * 5)
    q, donors = prepared.borrow_quality(np.array([0.0, 500.0, 5000.0]), donor_len, donor_q,
                                        seed=3, neighbours=10)
    assert donors[0] < 10 and 495 <= donors[1] < 505 and donors[2] >= 990
    np.testing.assert_array_equal(q, donor_q[donors])
    q2, donors2 = prepared.borrow_quality(np.array([0.0, 500.0, 5000.0]), donor_len, donor_q,
                                          seed=3, neighbours=10)
    np.testing.assert_array_equal(donors, donors2)
    with pytest.raises(ValueError, match="no donor"):
        prepared.borrow_quality(np.array([1.0]), np.array([]), np.zeros((0, 5)), seed=0)


def test_mooncake_table_borrows_quality_and_can_replay_trace_think_times():
    cfg = prepared.WorkloadConfig(dataset="mooncake", max_conversations=300, seed=0,
                                  think_source="trace")
    t = prepared.prepare_workload(cfg, use_cache=False)
    assert (t["dataset"] == "mooncake").all()
    assert t["quality_donor"].notna().all()
    q = prepared.model_matrix(t, "quality")
    assert np.all((q >= 0) & (q <= 1))
    later = t["turn"] > 0
    expected = np.maximum(t.loc[later, "think_time_trace_s"].fillna(0), 0)
    np.testing.assert_allclose(t.loc[later, "think_s"], expected)
    # Without text every model sees the trace's one token count.
    tok = prepared.model_matrix(t, "new_tokens")
    assert (tok == tok[:, :1]).all()


def test_borrowed_quality_is_cached_per_seed(tmp_path, monkeypatch):
    # The donors are drawn by the workload's seed: a table cached under one seed must not be
    # served for another (it was, whichever seed ran first).
    monkeypatch.setenv("CARBONROUTER_CACHE_DIR", str(tmp_path))
    runs = [prepared.dataset_columns(
        prepared.WorkloadConfig(dataset="mooncake", max_conversations=40, seed=seed))
        for seed in (0, 1, 0)]
    assert not np.array_equal(runs[0]["quality_donor"], runs[1]["quality_donor"])
    pd.testing.assert_frame_equal(runs[0], runs[2])


def test_missing_mirror_file_is_a_clear_error(tmp_path, monkeypatch):
    name = "conversations/mooncake/conversation_trace.jsonl"
    entry = datasets.REGISTRY[name]
    monkeypatch.setitem(datasets.REGISTRY, name, dataclasses.replace(entry, origin="local:test"))
    monkeypatch.setenv(datasets.MIRROR_ENV, str(tmp_path / "no-mirror"))
    monkeypatch.setenv(datasets.CACHE_ENV, str(tmp_path / "cache"))
    with pytest.raises(datasets.DataUnavailableError, match="conversation_trace.jsonl"):
        prepared.base_turns("mooncake")


# ---------------------------------------------------------------------------------------------
# Replay scale: resampled conversations at a chosen session-start rate


def _scaled(copies: float, base: prepared.WorkloadConfig = SMALL) -> pd.DataFrame:
    return prepared.prepare_workload(prepared.with_copies(base, copies), use_cache=False)


def test_one_copy_is_exactly_the_unscaled_table(small_table):
    cfg = prepared.with_copies(SMALL, 1)
    assert cfg.sessions_per_s == pytest.approx(60 / SMALL.arrival.window_s)
    pd.testing.assert_frame_equal(prepared.prepare_workload(cfg, use_cache=False), small_table)
    sample = dataclasses.replace(SMALL, n_sessions=25)
    pd.testing.assert_frame_equal(
        prepared.prepare_workload(prepared.with_copies(sample, 1.0), use_cache=False),
        prepared.prepare_workload(sample, use_cache=False))


def test_resampling_keeps_every_conversation_intact_and_ordered(small_table):
    t = _scaled(3.5)
    assert t["session"].nunique() == round(3.5 * 60) == 210
    per_conv = t.groupby("conversation_id")["session"].nunique()
    # stratified: every conversation 3 or 4 times, 30 of them 4 times
    assert set(per_conv) == {3, 4} and (per_conv == 4).sum() == 30
    base = small_table.set_index(["conversation_id", "turn"])
    cols = [c for c in small_table.columns
            if c not in ("session", "arrival_s", "think_s", "dataset", "conversation_id")]
    for _, g in t.groupby("session"):
        assert list(g["turn"]) == list(range(len(g))) == list(range(g["n_turns"].iloc[0]))
        assert g["conversation_id"].nunique() == 1
        ref = base.loc[g["conversation_id"].iloc[0]].reset_index()
        # the copy's turns, tokens, estimated outputs and quality are its conversation's
        pd.testing.assert_frame_equal(g[cols].reset_index(drop=True),
                                      ref[cols].reset_index(drop=True), check_dtype=False)


def test_copies_draw_their_own_starts_and_think_times():
    t = _scaled(4)
    first = t[t["turn"] == 0]
    starts = first.groupby("conversation_id")["arrival_s"].apply(list)
    assert all(len(set(v)) == 4 for v in starts)  # four distinct start times per conversation
    later = t[t["turn"] > 0]
    # the copies of one (conversation, turn) think for different times
    spread = later.groupby(["conversation_id", "turn"])["think_s"].nunique()
    assert (spread == 4).all()
    cfg = SMALL.arrival
    assert first["arrival_s"].between(cfg.start_epoch_s, cfg.end_epoch_s).all()
    assert np.all(np.diff(first["arrival_s"].to_numpy()) >= 0)
    assert list(first["session"]) == list(range(len(first)))


def test_sessions_starting_at_the_same_instant_keep_their_own_turns(monkeypatch):
    # At service scale some sessions draw the same start (float64 at epoch seconds); their rows
    # must not interleave into each other's sessions.
    from carbonrouter_lib import arrivals

    draw = arrivals.session_start_times

    def coarse(n, config, rng):  # every start on a 6-hour grid: many ties
        t = draw(n, config, rng)
        return np.floor(t / 21_600.0) * 21_600.0

    monkeypatch.setattr(arrivals, "session_start_times", coarse)
    t = _scaled(3)
    first = t[t["turn"] == 0]
    assert first["arrival_s"].duplicated().sum() > 100
    from carbonrouter_lib.simulator import check_table

    check_table(t)  # turns 0, 1, … grouped by session, n_turns rows each
    assert t.groupby("session")["conversation_id"].nunique().eq(1).all()
    assert t["session"].nunique() == 180


def test_scaled_tables_are_deterministic_and_depend_on_the_seed():
    a, b = _scaled(2.5), _scaled(2.5)
    pd.testing.assert_frame_equal(a, b)
    c = _scaled(2.5, dataclasses.replace(SMALL, seed=9))
    assert not np.allclose(a["think_s"].sum(), c["think_s"].sum())


def test_peak_grows_about_linearly_with_the_rate():
    cfg = prepared.WorkloadConfig(dataset="sharegpt", max_conversations=400, seed=2)
    peaks = {k: prepared.peak_active_sessions(_scaled(k, cfg)) for k in (4, 8, 16, 32)}
    ratios = [peaks[2 * k] / peaks[k] for k in (4, 8, 16)]
    # doubling the rate doubles P up to the fluctuation of a peak (a few √P)
    assert all(1.6 < r < 2.3 for r in ratios), peaks


def test_with_peak_hits_the_target_and_records_the_rate():
    cfg = prepared.WorkloadConfig(dataset="sharegpt", max_conversations=400, seed=2)
    target = 60
    scaled = prepared.with_peak(cfg, target, rel_tol=0.05)
    t = prepared.prepare_workload(scaled, use_cache=False)
    summary = prepared.scale_summary(t)
    assert abs(summary["peak_sessions"] - target) <= 0.05 * target
    assert summary["sessions"] == round(scaled.sessions_per_s * cfg.arrival.window_s)
    assert summary["sessions_per_s"] == pytest.approx(scaled.sessions_per_s, rel=1e-3)
    assert t.attrs["config"]["sessions_per_s"] == scaled.sessions_per_s


def test_estimates_of_copies_come_from_the_dataset_level_cross_fit():
    # Output-length estimates and quality are computed once per dataset row (folds by
    # conversation) and copied: no estimate was fitted on a copy of its own conversation.
    cols = prepared.dataset_columns(SMALL).set_index(["conversation_id", "turn"])
    t = _scaled(3).set_index(["conversation_id", "turn"])
    for q in ("est_output_tokens", "quality"):
        for m in MODELS:
            c = prepared.column(q, m)
            np.testing.assert_array_equal(t[c].to_numpy(), cols.loc[t.index, c].to_numpy())


def test_conversation_codes_are_the_session_at_one_copy(small_table):
    np.testing.assert_array_equal(prepared.conversation_codes(small_table),
                                  small_table["session"].to_numpy())
    t = _scaled(3)
    codes = prepared.conversation_codes(t)
    assert len(np.unique(codes)) == 60
    assert (pd.Series(codes).groupby(t["conversation_id"].to_numpy()).nunique() == 1).all()


@pytest.mark.parametrize("rate", [0, -1.0, math.nan, math.inf, "1", True])
def test_bad_rates_are_rejected(rate):
    with pytest.raises(ValueError, match="sessions_per_s"):
        prepared.WorkloadConfig(sessions_per_s=rate)
    with pytest.raises(ValueError, match="copies"):
        prepared.with_copies(SMALL, rate if rate != 0 else -2)


def test_one_copy_replays_to_the_same_records_for_every_policy():
    from carbonrouter_lib import experiments, setting

    cfg = prepared.WorkloadConfig(dataset="mooncake", max_conversations=120, seed=3)
    plain = prepared.prepare_workload(cfg, use_cache=False)
    one = prepared.prepare_workload(prepared.with_copies(cfg, 1), use_cache=False)
    sim = setting.SimulationConfig(regions=("GB", "BE"))
    a = experiments.run_policies(plain, sim, [*experiments.MAIN_POLICIES[:-1],
                                              "carbonrouter-no-gate"])
    b = experiments.run_policies(one, sim, list(a))
    for p in a:
        pd.testing.assert_frame_equal(a[p], b[p])
        # one copy: every session is its own conversation
        assert (a[p]["conversation"] == a[p]["session"]).all()


@pytest.mark.parametrize("seed", [-1, "abc", 1.5, True])
def test_bad_seeds_are_rejected(seed):
    with pytest.raises(ValueError, match="WorkloadConfig.seed must be an integer ≥ 0"):
        prepared.WorkloadConfig(seed=seed)


@pytest.mark.parametrize("seed", [-1, "abc", 1.5])
def test_from_turns_names_a_bad_seed_before_reading(seed):
    with pytest.raises(ValueError, match="from_turns: seed must be an integer ≥ 0"):
        prepared.from_turns("no-such-file.jsonl", seed=seed)

# ---------------------------------------------------------------------------------------------
# A trace of one's own: from_turns

BYO = Path(__file__).parent / "data" / "byo"
EXAMPLE = BYO / "chat_trace.jsonl"


def counts_trace(n_conv: int = 4) -> pd.DataFrame:
    """Conversations of 1–3 turns with token counts only (no text, no times)."""
    rows = []
    for c in range(n_conv):
        for k in range(1 + c % 3):
            rows.append({"conversation_id": f"conv{c}", "turn": k, "new_tokens": 50 + 10 * c + k,
                         "output_tokens": 20 + 5 * k})
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def byo_table() -> pd.DataFrame:
    return prepared.from_turns(EXAMPLE)


def test_from_turns_has_exactly_the_prepared_columns(byo_table, small_table):
    assert list(byo_table.columns) == list(small_table.columns)
    assert byo_table.dtypes.astype(str).to_dict() == small_table.dtypes.astype(str).to_dict()
    assert (byo_table["dataset"] == "chat_trace").all()
    q = prepared.model_matrix(byo_table, "quality")
    assert np.all((q >= 0) & (q <= 1)) and (
        prepared.model_matrix(byo_table, "est_output_tokens") >= 1).all()
    assert byo_table.attrs["config"]["trace"]["sha256"] == datasets.sha256_of(EXAMPLE)
    assert byo_table.attrs["config"]["quality_source"] == "predictor"


def test_from_turns_takes_the_traces_times_and_numbers_sessions(byo_table):
    t = byo_table
    raw = pd.read_json(EXAMPLE, lines=True)
    first = t["turn"] == 0
    starts = raw.loc[raw["turn"] == 0].set_index("conversation_id")["timestamp"]
    want = pd.to_datetime(starts[t.loc[first, "conversation_id"]]).map(pd.Timestamp.timestamp)
    assert list(t.loc[first, "arrival_s"]) == list(want)
    assert np.all(np.diff(t.loc[first, "arrival_s"].to_numpy()) >= 0)
    assert list(t.loc[first, "session"]) == list(range(8))
    think = raw.set_index(["conversation_id", "turn"])["think_s"]
    later = t.loc[~first]
    assert list(later["think_s"]) == list(think[list(zip(later["conversation_id"],
                                                         later["turn"], strict=True))])
    cfg = t.attrs["config"]["arrival"]
    assert cfg["window_start"] == "2022-01-03T08:15:00+00:00"
    assert prepared.scale_summary(t)["sessions"] == 8


def test_from_turns_quality_and_estimates_are_the_datasets_pipeline(byo_table):
    from carbonrouter_lib import output_length, quality, traces

    turns = traces.read_turns(EXAMPLE)
    est = output_length.estimate_output_tokens(turns, n_folds=5, seed=0)
    q = quality.score_turns(turns, context_turns=1)
    order = byo_table.set_index(["conversation_id", "turn"]).index
    key = pd.MultiIndex.from_frame(turns[["conversation_id", "turn"]])
    for j, m in enumerate(MODELS):
        f = prepared.TOKENIZER_OF_MODEL[m]
        want = pd.Series(est[f"est_output_tokens_{f}"].to_numpy(), index=key)[order]
        assert list(byo_table[prepared.column("est_output_tokens", m)]) == list(want)
        wq = pd.Series(q[:, j], index=key)[order]
        np.testing.assert_allclose(byo_table[prepared.column("quality", m)], wq, rtol=1e-12)


def test_from_turns_draws_what_the_trace_does_not_give():
    trace = counts_trace()
    for j, m in enumerate(MODELS):
        trace[f"quality_{m}"] = 0.2 * j
    a = prepared.from_turns(trace, seed=3)
    assert a.attrs["config"]["quality_source"] == "columns" and (a["dataset"] == "trace").all()
    cfg = ArrivalConfig()
    first = a["turn"] == 0
    assert a.loc[first, "arrival_s"].between(cfg.start_epoch_s, cfg.end_epoch_s).all()
    assert (a.loc[~first, "think_s"] > 0).all()
    pd.testing.assert_frame_equal(a, prepared.from_turns(trace, seed=3))
    b = prepared.from_turns(trace, seed=4)
    assert not np.allclose(a.loc[first, "arrival_s"], b.loc[first, "arrival_s"])
    np.testing.assert_allclose(prepared.model_matrix(a, "quality")[0], [0, 0.2, 0.4, 0.6, 0.8])
    short = ArrivalConfig(window_start="2022-06-01", window_days=1.0)
    c = prepared.from_turns(trace, arrival=short)
    assert c["arrival_s"].dropna().between(short.start_epoch_s, short.end_epoch_s).all()


def test_from_turns_borrows_quality_for_a_trace_without_text():
    trace = counts_trace()
    donor = dataclasses.replace(SMALL, seed=0)
    t = prepared.from_turns(trace, donor=donor, seed=2)
    assert t.attrs["config"]["quality_source"] == "borrow"
    cols = prepared.dataset_columns(donor)
    big = "Llama-3.1-70B"
    donor_len = (cols[prepared.column("new_tokens", big)]
                 + cols[prepared.column("history_tokens", big)]).to_numpy()
    target = (t[prepared.column("new_tokens", big)]
              + t[prepared.column("history_tokens", big)]).to_numpy()
    # borrow_quality draws in the trace's conversation order; the table is in start order
    conv = t["conversation_id"].str.removeprefix("conv").astype(int).to_numpy()
    order = np.lexsort((t["turn"].to_numpy(), conv))
    q, _ = prepared.borrow_quality(target[order], donor_len,
                                   prepared.model_matrix(cols, "quality"), seed=2)
    np.testing.assert_array_equal(prepared.model_matrix(t, "quality")[order], q)


def test_from_turns_errors():
    trace = counts_trace()
    with pytest.raises(ValueError, match="quality_source must be one of"):
        prepared.from_turns(trace, quality_source="oracle")
    with pytest.raises(ValueError, match="quality_source='columns' but the trace has no"):
        prepared.from_turns(trace, quality_source="columns")
    with pytest.raises(ValueError, match="quality_source='predictor' needs user_text"):
        prepared.from_turns(trace, quality_source="predictor")
    one = counts_trace(1)
    with pytest.raises(ValueError, match="one conversation: the output-length estimate"):
        prepared.from_turns(one, quality_source="borrow", donor=SMALL)
    with pytest.raises(ValueError, match=r"row 1 \(conversation 'conv1', turn 0\): new_tokens"):
        prepared.from_turns(trace.assign(new_tokens=[1, -1, 2, 3, 4, 5, 6]))


def test_from_turns_takes_given_estimates_even_for_one_conversation():
    one = counts_trace(1).assign(est_output_tokens=7)
    for m in MODELS:
        one[f"quality_{m}"] = 0.5
    t = prepared.from_turns(one)
    assert (prepared.model_matrix(t, "est_output_tokens") == 7).all()
    # two conversations starting at the same instant keep their turns together
    two = pd.concat([one, one.assign(conversation_id="other")], ignore_index=True)
    two["timestamp"] = np.where(two["turn"] == 0, "2022-01-04T00:00:00Z", None)
    t = prepared.from_turns(two.assign(think_s=np.where(two["turn"] == 0, np.nan, 5.0)))
    assert list(t["session"]) == [0, 1] and list(t["conversation_id"]) == ["conv0", "other"]


def _splitmix_fold(conversation: int, folds: int, seed: int) -> int:
    """SplitMix64 of (seed, id) modulo folds in Python integers (the hash's reference)."""
    mask = (1 << 64) - 1
    golden = 0x9E3779B97F4A7C15
    x = (conversation + (seed & 0xFFFFFFFF) * golden + golden) & mask
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
    return (x ^ (x >> 31)) % folds


@pytest.mark.parametrize("folds, seed", [(5, 0), (4, 7), (10, 2**40 + 3), (3, -1)])
def test_conversation_folds_are_the_splitmix_hash(folds, seed):
    # the compiled hash against Python's unbounded integers, over the whole int64 range
    rng = np.random.default_rng(folds)
    ids = np.concatenate([rng.integers(-(2**63), 2**63 - 1, 300, dtype=np.int64),
                          np.array([-(2**63), -1, 0, 1, 2**63 - 1], np.int64), np.arange(200)])
    expected = [_splitmix_fold(int(i), folds, seed) for i in ids]
    np.testing.assert_array_equal(prepared.conversation_folds(ids, folds, seed), expected)
    assert [prepared.conversation_fold(int(i), folds, seed) for i in ids] == expected
    assert [prepared.conversation_fold(i, folds, seed) for i in ids[:20]] == expected[:20]
    counts = np.bincount(prepared.conversation_folds(np.arange(5000), folds, seed))
    assert len(counts) == folds and counts.min() > 0.8 * 5000 / folds
