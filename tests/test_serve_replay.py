"""The proxy's decisions equal the simulator's on a small replay (one code path), the cache
estimate against the emulated engines, and a bounded load test that loses no request."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pandas as pd
import pytest
from openai import OpenAI

from carbonrouter_lib import gate as gates
from carbonrouter_lib import prepared, setting, simulator
from carbonrouter_lib.build import build_policy
from carbonrouter_lib.policies import make_policy
from carbonrouter_lib.serve import replay
from carbonrouter_lib.serve.clock import ManualClock
from carbonrouter_lib.serve.config import load_config
from carbonrouter_lib.serve.core import RouterCore
from carbonrouter_lib.serve.emulator import BLOCK_TOKENS, EmulatorCluster, ServerThread, free_ports
from carbonrouter_lib.serve.proxy import create_app

SIM = setting.SimulationConfig(regions=("GB", "BE"))


@pytest.fixture(scope="module")
def workload():
    table = prepared.prepare_workload(prepared.WorkloadConfig(max_conversations=150,
                                                              n_sessions=20, seed=1))
    return table, replay.conversation_texts(table, 150)


def _stepwise(table, texts, policy, history=True):
    ports = free_ports(SIM.deployments().n + 1)
    cfg = replay.grid_config(SIM, table, ports[:-1], ports[-1], completion="modelled")
    clock = ManualClock(float(table["arrival_s"].min()))
    core = RouterCore(cfg, clock=clock, policy=policy)
    if not history:  # as behind a live provider: the current intensities only
        core.ctx.signal = None
    with EmulatorCluster(cfg, scale=math.inf), ServerThread([(create_app(core), ports[-1])]):
        client = OpenAI(base_url=f"http://127.0.0.1:{ports[-1]}/v1", api_key="x",
                        max_retries=0)
        rows = replay.replay_stepwise(client, clock, table, texts)
        client.close()
    return core, rows


@pytest.mark.parametrize("name", ["carbonrouter", "session-affinity", "carbonrouter-horizon",
                                  "carbonrouter-horizon, persistence without the signal"])
def test_proxy_decisions_equal_the_simulators(workload, name):
    table, texts = workload
    # the horizon router behind a live provider forecasts by holding the current intensities:
    # the simulator's persistence forecast from the signal's row
    history = not name.endswith("without the signal")
    name, params = (name, {}) if history else ("carbonrouter-horizon",
                                               {"forecast": "persistence"})
    policies = [make_policy(name, **params), make_policy(name, **params)]
    if name == "carbonrouter":  # one learned gate for both: the same trained object routes
        g = gates.ensure_gate(None, SIM, table=table)
        for p in policies:
            p.set_gate(g)
    if name == "carbonrouter-horizon":  # one horizon model for both, fitted on the workload
        model = build_policy(policies[0], table, SIM).model
        policies[1].set_model(model)
    sim = simulator.simulate(table, policies[0], SIM).records
    core, rows = _stepwise(table, texts, policies[1], history)
    cmp = replay.compare_with_simulator(sim, core.decisions())
    assert len(cmp) == len(table) and (cmp["why"] != "missing").all()
    assert cmp["agree"].all(), cmp.loc[~cmp["agree"]].head().T
    # same inputs, same arithmetic: L(a), Ĉ(a) and dispatch times are the simulator's
    served = ~cmp["sim_rejected"]
    np.testing.assert_array_equal(cmp.loc[served, "proxy_cached_tokens"],
                                  cmp.loc[served, "sim_cached_tokens"])
    np.testing.assert_allclose(cmp.loc[served, "proxy_est_carbon_g"],
                               cmp.loc[served, "sim_est_carbon_g"], rtol=1e-12)
    np.testing.assert_allclose(cmp["proxy_dispatch_s"], cmp["sim_dispatch_s"], rtol=0,
                               atol=1e-6)
    if name == "carbonrouter":
        assert sim["switch_opportunity"].any()  # the gate was exercised
    # the headers the client saw are the router's records
    by_key = rows.set_index(["session", "turn"])
    px = pd.DataFrame(core.decisions()).set_index(["session", "turn"])
    assert (by_key.loc[px.index, "deployment_id"] == px["deployment_id"]).all()


def test_cache_estimate_against_the_engines(workload):
    table, texts = workload
    core, _ = _stepwise(table, texts, make_policy("carbonrouter-no-gate"))
    d = pd.DataFrame(core.decisions())
    d = d[~d["rejected"]]
    err = d["cached"] - d["engine_cached"]
    # Where the router expects the whole history and the engine kept it, the engine reports
    # whole 16-token blocks: L − reported ∈ [0, 16) — the block granularity, nothing more.
    assert (d["engine_cached"] <= d["cached"] + 1e-9).mean() > 0.9
    hit = (d["cached"] > 0) & (d["engine_cached"] > 0)
    assert hit.sum() > 10
    assert ((err[hit] >= 0) & (err[hit] < BLOCK_TOKENS)).mean() > 0.9
    assert float(np.median(np.abs(err))) < BLOCK_TOKENS


def test_bounded_load_test_loses_no_request():
    cfg = load_config()
    ports = free_ports(len(cfg.deployments) + 1)
    cfg = cfg.on_loopback(ports[:-1], ports[-1], gate="none", connect_timeout_s=10.0)
    core = RouterCore(cfg)
    with EmulatorCluster(cfg, scale=600), ServerThread([(create_app(core), ports[-1])]):
        df = asyncio.run(replay.load_test(f"http://127.0.0.1:{ports[-1]}/v1", n_sessions=40,
                                          turns=4, deadline_s=120))
    assert len(df) == 40 * 4 and (df["status"] == 200).all()
    d = pd.DataFrame(core.decisions())
    assert len(d) == 160 and d["overhead_s"].notna().all()
    assert d.groupby("session_key")["turn"].agg(lambda t: sorted(t) == [0, 1, 2, 3]).all()
    # every session left on its last turn: no slot is held afterwards
    assert (core.backend.free_slots() == cfg.deployments[0].slots).all()
