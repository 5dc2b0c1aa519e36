"""Tests of carbonrouter_lib.sweep: keys, the result cache, Dask vs serial execution."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from carbonrouter_lib import cache, metrics, prepared, sweep
from carbonrouter_lib.experiments import run_policies
from carbonrouter_lib.prepared import WorkloadConfig, prepare_workload
from carbonrouter_lib.setting import SimulationConfig
from carbonrouter_lib.sweep import RunSpec, run_sweep

WORKLOAD = WorkloadConfig(dataset="mooncake", max_conversations=40)
CELLS = (0.05, 0.1)  # γ
POLICIES = ("faircarbon", "carbonrouter")


def grid() -> list[RunSpec]:
    """2 parameter cells × 2 policies on a small Mooncake workload."""
    return [RunSpec.make(WORKLOAD, SimulationConfig(gamma=g), p) for g in CELLS for p in POLICIES]


@pytest.fixture(scope="module")
def cluster():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as c:
        yield c


# --- keys ------------------------------------------------------------------------------------


def test_key_is_stable_and_canonical():
    a = RunSpec.make(WORKLOAD, SimulationConfig(), "faircarbon")
    b = RunSpec.make(WORKLOAD, SimulationConfig(), "faircarbon")
    assert a.key() == b.key() and len(a.key()) == 64
    # Defaults filled in, ints read as the declared floats, tuples as lists: the same run.
    c = RunSpec({"dataset": "mooncake", "max_conversations": 40}, {"kappa": 6, "c": 0.5},
                "faircarbon", {}, 0)
    assert c.key() == a.key()
    # The key survives a JSON round trip of the spec (what the sidecar stores).
    d = RunSpec(**json.loads(json.dumps(a.to_dict())))
    assert d.key() == a.key() and d == a


@pytest.mark.parametrize(
    "change",
    [
        {"workload": {"dataset": "mooncake", "max_conversations": 41}},
        {"workload": {"dataset": "mooncake", "max_conversations": 40,
                      "arrival": {"window_days": 6.0}}},
        {"simulation": {"kappa": 8.0}},
        {"simulation": {"gamma": 0.025}},
        {"simulation": {"c": 0.35}},
        {"simulation": {"beta_q": 0.9}},
        {"simulation": {"regions": ["CH", "GB", "BE", "US-CAL-CISO"]}},
        {"policy": "carbonrouter"},
        {"policy_params": {"pricing": False}},
        {"seed": 1},
    ],
)
def test_any_parameter_change_changes_the_key(change):
    base = {"workload": {"dataset": "mooncake", "max_conversations": 40}, "simulation": {},
            "policy": "faircarbon", "policy_params": {}, "seed": 0}
    if "policy_params" in change:
        base["policy"] = "carbonrouter"
    assert RunSpec(**base).key() != RunSpec(**{**base, **change}).key()


def test_code_of_the_replay_is_part_of_the_key(monkeypatch):
    spec = grid()[0]
    before = spec.key()
    assert "carbonrouter_lib.simulator" in cache.dependencies("carbonrouter_lib.sweep")
    real = cache.code_hash
    monkeypatch.setattr(cache, "code_hash", lambda *modules: real(*modules) + "edited")
    assert spec.key() != before


def test_bad_specs_raise_clear_errors():
    with pytest.raises(KeyError, match="unknown policy 'carbon-router'"):
        RunSpec.make(WORKLOAD, SimulationConfig(), "carbon-router")
    with pytest.raises(TypeError, match="bad parameters"):
        RunSpec.make(WORKLOAD, SimulationConfig(), "faircarbon", {"delta": 1.0})
    with pytest.raises(TypeError, match="JSON-serializable"):
        RunSpec.make(WORKLOAD, SimulationConfig(), "carbonrouter", {"gate": lambda *a: 0.0})
    with pytest.raises(ValueError, match="use RunSpec.seed"):
        RunSpec({"dataset": "mooncake", "seed": 3}, {}, "faircarbon")
    with pytest.raises(TypeError, match="kapa"):
        RunSpec({"dataset": "mooncake"}, {"kapa": 6.0}, "faircarbon")


# --- execution and cache --------------------------------------------------------------------


def test_serial_sweep_equals_an_independent_replay(tmp_path):
    res = run_sweep(grid(), cache_dir=tmp_path, serial=True, progress=False)
    assert res.n_computed == 4 and res.n_cached == 0 and len(res) == 4
    table = prepare_workload(WORKLOAD)
    for g in CELLS:
        direct = run_policies(table, SimulationConfig(gamma=g), POLICIES)
        for p in POLICIES:
            got = res[RunSpec.make(WORKLOAD, SimulationConfig(gamma=g), p).key()]
            pd.testing.assert_frame_equal(got, direct[p].reset_index(drop=True),
                                          check_dtype=False)
    # The cells differ (γ changes the energies), so results are not mixed up between keys.
    a, b = (res[RunSpec.make(WORKLOAD, SimulationConfig(gamma=g), "faircarbon").key()]
            for g in CELLS)
    assert not a["energy_kwh"].equals(b["energy_kwh"])


def test_dask_sweep_equals_serial_and_resume_skips_cached_runs(tmp_path, cluster):
    specs = grid()
    serial = run_sweep(specs, cache_dir=tmp_path / "serial", serial=True, progress=False)

    # Interrupted sweep: only the first two runs made it to the cache.
    cache = tmp_path / "dask"
    run_sweep(specs[:2], cache_dir=cache, serial=True, progress=False)
    mtimes = {p.name: p.stat().st_mtime_ns for p in cache.iterdir() if p.is_file()}
    assert len(mtimes) == 4  # 2 × (parquet + manifest); the learned gate is in cache/gates
    assert len(list((cache / "gates").glob("gate-*.manifest.json"))) == 1  # one setting, one gate

    submitted: list[list[RunSpec]] = []
    res = run_sweep(specs, client=cluster, cache_dir=cache, progress=False,
                    on_submit=submitted.append)
    assert [s.key() for s in submitted[0]] == [s.key() for s in specs[2:]]
    assert res.n_cached == 2 and res.n_computed == 2
    assert {p.name: p.stat().st_mtime_ns for p in cache.iterdir() if p.name in mtimes} == mtimes
    assert set(res) == set(serial) == {s.key() for s in specs}
    for key in serial:
        pd.testing.assert_frame_equal(res[key], serial[key])

    # A complete resume submits nothing and returns the same records.
    submitted.clear()
    again = run_sweep(specs, client=cluster, cache_dir=cache, progress=False,
                      on_submit=submitted.append)
    assert submitted == [[]] and again.n_cached == 4 and again.n_computed == 0
    for key in serial:
        pd.testing.assert_frame_equal(again[key], serial[key])


def test_partial_results_are_not_complete(tmp_path):
    specs = grid()[:2]
    run_sweep(specs, cache_dir=tmp_path, serial=True, progress=False)
    key0 = specs[0].key()
    entry0, entry1 = sweep._entry(tmp_path, specs[0]), sweep._entry(tmp_path, specs[1])
    # Run 0: parquet without its manifest (interrupted between the two writes).
    entry0.manifest.unlink()
    # Run 1 intact, plus a stray temporary file of an interrupted write of it.
    (tmp_path / f".{entry1.payload.name}.abc123.tmp").write_bytes(b"half a parquet")
    assert not sweep.is_complete(specs[0], tmp_path)
    assert sweep.is_complete(specs[1], tmp_path)

    submitted: list[list[RunSpec]] = []
    res = run_sweep(specs, cache_dir=tmp_path, serial=True, progress=False,
                    on_submit=submitted.append)
    assert [s.key() for s in submitted[0]] == [key0]
    assert res.n_cached == 1 and res.n_computed == 1
    assert sweep.is_complete(specs[0], tmp_path)
    manifest = json.loads(entry0.manifest.read_text())
    assert manifest["key"] == key0 and manifest["meta"]["n_records"] == len(res[key0])
    assert RunSpec(**manifest["params"]).key() == key0


def test_duplicate_specs_run_once(tmp_path):
    spec = grid()[0]
    submitted: list[list[RunSpec]] = []
    res = run_sweep([spec, RunSpec(**spec.to_dict())], cache_dir=tmp_path, serial=True,
                    progress=False, on_submit=submitted.append)
    assert len(submitted[0]) == 1 and len(res) == 1


def test_bad_scheduler_address_raises(tmp_path, monkeypatch):
    spec = grid()[0]
    with pytest.raises(ConnectionError, match="tcp://127.0.0.1:9"):
        run_sweep([spec], client="tcp://127.0.0.1:9", cache_dir=tmp_path, progress=False,
                  connect_timeout="1s")
    monkeypatch.setenv(sweep.SCHEDULER_ENV, "tcp://127.0.0.1:9")
    with pytest.raises(ConnectionError, match=sweep.SCHEDULER_ENV):
        run_sweep([spec], cache_dir=tmp_path, progress=False, connect_timeout="1s")
    with pytest.raises(TypeError, match="client must be"):
        run_sweep([spec], client=42, cache_dir=tmp_path, progress=False)


# --- grids ----------------------------------------------------------------------------------


def test_grid_specs_is_full_factorial_and_shares_equal_runs():
    g = sweep.grid_specs(WORKLOAD, SimulationConfig(), {"gamma": [0.025, 0.05, 0.1],
                                                        "kappa": [5.0, 6.0, 8.0]}, POLICIES)
    assert len(g) == 3 * 3 * 2 and g["key"].is_unique
    row = g[(g["gamma"] == 0.1) & (g["kappa"] == 8.0) & (g["policy"] == "carbonrouter")].iloc[0]
    assert row["spec"].simulation_config() == SimulationConfig(gamma=0.1, kappa=8.0)
    # Table 4's default cell (c = 0.5, β_Q = 0.85) is Table 3's default cell: the same runs.
    h = sweep.grid_specs(WORKLOAD, SimulationConfig(), {"c": [0.5, 0.25],
                                                        "beta_q": [0.85, 0.9]}, POLICIES)
    shared = set(g["key"]) & set(h["key"])
    assert shared == set(g[(g["gamma"] == 0.05) & (g["kappa"] == 6.0)]["key"])
    with pytest.raises(KeyError, match="not SimulationConfig fields"):
        sweep.grid_specs(WORKLOAD, SimulationConfig(), {"delta": [1.0]}, POLICIES)


def test_cell_savings_matches_the_totals(tmp_path):
    g = sweep.grid_specs(WORKLOAD, SimulationConfig(), {"gamma": list(CELLS)}, POLICIES)
    res = run_sweep(g["spec"], cache_dir=tmp_path, serial=True, progress=False)
    out = sweep.cell_savings(res, g, n_boot=200)
    assert list(out["gamma"]) == list(CELLS)
    for _, row in out.iterrows():
        keys = g[g["gamma"] == row["gamma"]].set_index("policy")["key"]
        a = res[keys["carbonrouter"]]["carbon_g"].to_numpy().sum()
        b = res[keys["faircarbon"]]["carbon_g"].to_numpy().sum()
        assert row["saving_pct"] == pytest.approx(100.0 * (1.0 - a / b), rel=1e-12)
        assert row["ci_low_pct"] <= row["saving_pct"] <= row["ci_high_pct"]
    with pytest.raises(KeyError, match="no results"):
        sweep.cell_savings({}, g)


# --- compact runs (service scale) -----------------------------------------------------------


def test_summary_runs_are_cached_and_equal_their_records(tmp_path):
    scaled = prepared.with_copies(WORKLOAD, 3)
    specs = {(out, p): RunSpec.make(scaled, SimulationConfig(regions=("GB", "BE")), p,
                                    output=out)
             for out in sweep.OUTPUTS for p in POLICIES}
    assert specs[("records", "faircarbon")].key() != specs[("summary", "faircarbon")].key()
    res = sweep.run_named(specs, cache_dir=tmp_path, serial=True, progress=False)
    again = sweep.run_named(specs, cache_dir=tmp_path, serial=True, progress=False)
    for p in POLICIES:
        summ, rec = res[("summary", p)], res[("records", p)]
        assert isinstance(summ, metrics.RunSummary)
        plain = metrics.summarize(rec)
        pd.testing.assert_series_equal(summ.summary[plain.index], plain, check_names=False)
        # the scale and capacity of the replay travel with its metrics
        table = prepare_workload(scaled)
        assert summ.summary["peak_sessions"] == prepared.peak_active_sessions(table)
        assert summ.summary["copies"] == 3.0 and summ.summary["sessions"] == 120
        pd.testing.assert_frame_equal(summ.by_conversation, metrics.conversation_sums(rec))
        pd.testing.assert_frame_equal(again[("summary", p)].by_conversation,
                                      summ.by_conversation)
        # three copies of each conversation: sums over sessions, 40 conversations
        assert len(summ.by_conversation) == 40
        assert (summ.by_conversation["n_sessions"] == 3).all()
    # The paired saving from the sums is the records' (conversations resampled together).
    a = metrics.paired_saving_ci(res[("records", "carbonrouter")], res[("records", "faircarbon")],
                                 n_boot=300, seed=2)
    b = metrics.paired_saving_ci_sums(res[("summary", "carbonrouter")].by_conversation,
                                      res[("summary", "faircarbon")].by_conversation,
                                      n_boot=300, seed=2)
    assert b.n_clusters == a.n_clusters == 40 and b.n_sessions == a.n_sessions
    assert b.estimate == pytest.approx(a.estimate, rel=1e-12)
    np.testing.assert_allclose(b.draws, a.draws, rtol=1e-10)
    with pytest.raises(ValueError, match="output"):
        RunSpec.make(WORKLOAD, SimulationConfig(), "faircarbon", output="everything")


def test_the_result_cache_round_trip_is_exact(tmp_path):
    # run_sweep returns a computed result as it is, not as read back from its cache entry: the
    # two must be the same frames, to the last bit and dtype (records and summaries).
    spec = RunSpec.make(prepared.with_copies(WORKLOAD, 2), SimulationConfig(), "carbonrouter")
    for s in (spec, dataclasses.replace(spec, output="summary")):
        result, scale = sweep._run(s)
        sweep._write_result(tmp_path, s, result, scale)
        back = sweep._read_result(tmp_path, s)
        if s.output == "records":
            assert set(result.dtypes.astype(str)) >= {"int64", "float64", "bool", "str"}
            pd.testing.assert_frame_equal(back, result, check_exact=True)
            assert back.index.equals(result.index) and back.attrs == result.attrs == {}
        else:
            pd.testing.assert_series_equal(back.summary, result.summary, check_exact=True)
            pd.testing.assert_frame_equal(back.by_conversation, result.by_conversation,
                                          check_exact=True)


def test_a_summary_is_made_from_its_runs_records_not_replayed(tmp_path):
    # A summary and the records of the same run: one replay. In one sweep the summary is made
    # from the records computed there; in a later sweep from the cached records. Either way it
    # is the summary a replay of its own returns (metrics, scale and per-conversation sums).
    scaled = prepared.with_copies(WORKLOAD, 2)
    sim = SimulationConfig(regions=("GB", "BE"))
    summary = {p: RunSpec.make(scaled, sim, p, output="summary") for p in POLICIES}
    records = {p: RunSpec.make(scaled, sim, p) for p in POLICIES}
    alone = sweep.run_sweep(summary.values(), cache_dir=tmp_path / "alone", serial=True,
                            progress=False)
    both = sweep.run_sweep([*records.values(), *summary.values()], cache_dir=tmp_path / "both",
                           serial=True, progress=False)
    assert (both.n_computed, both.n_derived, both.n_cached) == (2, 2, 0)
    first = sweep.run_sweep([records["faircarbon"]], cache_dir=tmp_path / "later", serial=True,
                            progress=False)
    later = sweep.run_sweep(summary.values(), cache_dir=tmp_path / "later", serial=True,
                            progress=False)
    assert first.n_computed == 1
    assert (later.n_computed, later.n_derived, later.n_cached) == (1, 1, 0)
    again = sweep.run_sweep(summary.values(), cache_dir=tmp_path / "later", serial=True,
                            progress=False)
    assert (again.n_computed, again.n_derived, again.n_cached) == (0, 0, 2)
    for spec in summary.values():
        want = alone[spec.key()]
        for got in (both[spec.key()], later[spec.key()], again[spec.key()]):
            pd.testing.assert_series_equal(got.summary, want.summary)
            pd.testing.assert_frame_equal(got.by_conversation, want.by_conversation)
    # a records run that fails takes the summary made from it down too, by name
    def dies(spec, gate_dir=None):
        raise OSError("worker died")

    bad = RunSpec.make(scaled, SimulationConfig(regions=("GB", "BE"), ttl_s=1.0), "faircarbon")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(sweep, "_run", dies)
        with pytest.raises(RuntimeError, match="2 of 2 runs failed.*worker died"):
            sweep.run_sweep([bad, dataclasses.replace(bad, output="summary")],
                            cache_dir=tmp_path / "bad", serial=True, progress=False)


# --- inputs of one's own: a policy by import name, profiles and a signal by file -----------------

BYO = Path(__file__).parent / "data" / "byo"
BYO_POLICY = "my_policies:LowestEnergy"


@pytest.fixture
def byo_setting(tmp_path, monkeypatch):
    """The example policy importable, the made-up regions' signal as a sweep's carbon file and
    the example measured profiles: a setting of one's own by file paths."""
    from carbonrouter_lib.carbon import CarbonSignal

    monkeypatch.syspath_prepend(str(BYO))
    signal = CarbonSignal.from_csv({"Solaria": BYO / "solaria_hourly.csv",
                                    "Ventosa": BYO / "ventosa_15min.csv"})
    carbon = signal.to_csv(tmp_path / "signal.csv")
    return SimulationConfig(regions=signal.regions, carbon_file=str(carbon),
                            profiles=str(BYO / "profiles_l4_h200.csv"))


@pytest.mark.parametrize("seed", [-1, "abc", 1.5, True])
def test_a_bad_run_seed_is_named(seed):
    with pytest.raises(ValueError, match="RunSpec.seed must be an integer ≥ 0"):
        RunSpec({"dataset": "sharegpt"}, SimulationConfig().to_dict(), "faircarbon", {}, seed)


def test_specs_of_ones_own_inputs_are_checked_json_and_keyed_by_content(byo_setting, tmp_path,
                                                                       monkeypatch):
    spec = RunSpec.make(WORKLOAD, byo_setting, BYO_POLICY, {"tolerance": 0.1})
    d = json.loads(json.dumps(spec.to_dict()))
    assert d["simulation"]["profiles"]["path"].endswith("profiles_l4_h200.csv")
    assert RunSpec(**d).key() == spec.key() and RunSpec(**d).simulation_config() == byo_setting
    assert RunSpec.make(WORKLOAD, byo_setting, BYO_POLICY).key() != spec.key()
    # a policy module's source is part of the key
    (tmp_path / "mod_v.py").write_text("from carbonrouter_lib.policies.oblivious import "
                                       "FairCarbon as F\nclass P(F):\n    name = 'p'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = RunSpec.make(WORKLOAD, SimulationConfig(), "mod_v:P").key()
    (tmp_path / "mod_v.py").write_text((tmp_path / "mod_v.py").read_text() + "# edited\n")
    assert RunSpec.make(WORKLOAD, SimulationConfig(), "mod_v:P").key() != before
    # a changed profile file changes the key (and an old spec of it is refused)
    prof = tmp_path / "p.csv"
    prof.write_bytes((BYO / "profiles_l4_h200.csv").read_bytes())
    a = RunSpec.make(WORKLOAD, SimulationConfig(profiles=str(prof)), "faircarbon")
    prof.write_text(prof.read_text().replace("9000", "9001"))
    b = RunSpec.make(WORKLOAD, SimulationConfig(profiles=str(prof)), "faircarbon")
    assert a.key() != b.key()
    with pytest.raises(ValueError, match="content changed"):
        RunSpec(**a.to_dict())
    # checked when made, in the parent
    with pytest.raises(ValueError, match="RunSpec: policy 'my_policies:Nope'"):
        RunSpec.make(WORKLOAD, SimulationConfig(), "my_policies:Nope")
    with pytest.raises(TypeError, match="cannot be rebuilt from JSON"):
        RunSpec.make(WORKLOAD, SimulationConfig(profiles=pd.read_csv(prof)), "faircarbon")


def test_sweep_with_ones_own_inputs_serial_and_on_dask(byo_setting, tmp_path):
    distributed = pytest.importorskip("distributed")
    specs = {p: RunSpec.make(WORKLOAD, byo_setting, p) for p in (BYO_POLICY, "faircarbon")}
    serial = sweep.run_named(specs, cache_dir=tmp_path / "serial", serial=True, progress=False)
    # The replay the specs name, run directly.
    direct = run_policies(prepare_workload(WORKLOAD), byo_setting, list(specs))
    for p in specs:
        pd.testing.assert_frame_equal(serial[p], direct[p].reset_index(drop=True),
                                      check_dtype=False)
        assert set(serial[p]["gpu"]) <= {"L4", "H200"}
        assert set(serial[p]["region"]) <= {"Solaria", "Ventosa"}
    assert (serial[BYO_POLICY]["policy"] == "lowest-energy").all()
    # Workers started after the policy's folder is on sys.path import it by name.
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as cluster:
        on_dask = sweep.run_named(specs, client=cluster, cache_dir=tmp_path / "dask",
                                  progress=False)
    for p in specs:
        pd.testing.assert_frame_equal(on_dask[p], serial[p])
