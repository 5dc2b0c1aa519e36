"""serve.core and its hook in the backend: sessions, token counting as the prepared workloads
count, Backend.correct (realized post-turn contexts and failed turns)."""

from __future__ import annotations

import numpy as np
import pytest

from carbonrouter_lib.backend import Backend, BackendConfig
from carbonrouter_lib.deployments import Deployments
from carbonrouter_lib.serve.clock import ManualClock
from carbonrouter_lib.serve.config import load_config
from carbonrouter_lib.serve.core import RouterCore, session_id
from carbonrouter_lib.tokenizers import count_tokens


def _backend(kv: float = 100.0) -> Backend:
    deps = Deployments.build(["R0"])
    return Backend(deps, BackendConfig(slots_per_pool=4, kv_tokens_per_pool=kv))


def test_backend_correct_grows_with_eviction_and_shrinks():
    be = _backend(kv=100)
    be.dispatch(1, 0, 0.0, 60)
    be.complete(1, 0, 1.0)
    be.dispatch(2, 1, 2.0, 30)  # same pool (A10): 90 tokens in use
    be.correct(2, 1, 70, 2.5)  # the realized context is longer: 30 of session 1's evicted
    assert be.cache_length(2, 1) == 70 and be.cache_length(1, 0) == 30
    assert be.counters()["evicted_tokens"] == 30
    be.correct(2, 1, 10, 2.5)  # shorter: frees the tokens
    assert be.pool_used_tokens()[0] == 40
    be.correct(2, 1, 500, 3.0)  # more than the pool: the prefix that fits, overflow counted
    assert be.cache_length(2, 1) == 100 and be.cache_length(1, 0) == 0
    assert be.counters()["kv_overflow_events"] == 1
    be.complete(2, 1, 4.0)
    with pytest.raises(ValueError, match="no turn running"):
        be.correct(2, 1, 5, 5.0)
    be.dispatch(2, 1, 5.0, 120)
    with pytest.raises(ValueError, match="≥ 0"):
        be.correct(2, 1, -1, 5.0)


def test_session_ids():
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    later = [*msgs, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "?"}]
    assert session_id(None, msgs) == session_id(None, later)  # stable across turns
    assert session_id(None, msgs)[0] != session_id(None, [{"role": "user", "content": "x"}])[0]
    assert session_id("42", msgs) == (42, "42")  # the simulator's numbers, in replays
    s, key = session_id("alice-7", msgs)
    assert key == "alice-7" and s >= 10**18  # hashes never meet a decimal id


def test_query_counts_tokens_like_the_prepared_workloads():
    core = RouterCore(load_config().model_copy(update={"router": load_config().router.model_copy(
        update={"gate": "none"})}), clock=ManualClock(1_641_168_000.0))
    texts = ["What is a KV cache?", "It stores keys and values.", "And why does it matter?"]
    msgs = [{"role": "user", "content": texts[0]}, {"role": "assistant", "content": texts[1]},
            {"role": "user", "content": [{"type": "text", "text": texts[2]}]}]
    q = core.query(msgs, None, {"quality": {"Llama-3.1-70B": 0.5}}, max_tokens=7)
    assert q.turn == 1
    for j, m in enumerate(core.deployments.models):
        fam = {"Gemma-3-4B": "gemma3", "Mistral-7B-v0.2": "mistral"}.get(m, "llama3")
        n = count_tokens(texts, fam)
        assert q.n_new[j] == n[2] and q.n_hist[j] == n[0] + n[1]
    assert q.n_out_est.tolist() == [7.0] * 3  # the default estimate, capped by max_tokens
    assert q.quality[core.deployments.models.index("Llama-3.1-70B")] == 0.5
    with pytest.raises(ValueError, match="unknown models"):
        core.query(msgs, None, {"quality": {"GPT-9": 1.0}})
    with pytest.raises(ValueError, match="non-empty"):
        core.query([], None)
    np.testing.assert_array_equal(core.declared.nonzero()[0],
                                  sorted(core.ids.values()))


def test_make_serve_demo_smoke(capsys):
    """``make serve``'s command on the embedded default (learned gate, replayed carbon), on free
    ports, answers three-turn conversations and exits."""
    from carbonrouter_lib.serve.__main__ import main

    assert main(["demo", "--free-ports", "--smoke", "2"]) == 0
    out = capsys.readouterr().out
    assert "OpenAI(base_url=" in out
    routes = [line.split()[4] for line in out.splitlines() if line.startswith("session smoke-")]
    assert len(routes) == 6 and set(routes) <= {d.id for d in load_config().deployments}


def test_check_rejects_a_bad_file(tmp_path, capsys):
    from carbonrouter_lib.serve.__main__ import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("deployments: [{id: a}]\n")
    assert main(["check", "--config", str(bad)]) == 2
    assert "deployments[0] (id 'a')" in capsys.readouterr().err
    assert main(["check"]) == 0


def test_replay_needs_a_virtual_clock():
    cfg = load_config()
    wall = cfg.model_copy(update={"clock": cfg.clock.model_copy(update={"start": None})})
    with pytest.raises(ValueError, match="clock.start is required"):
        RouterCore(wall)


def test_prefix_cache_blocks_lru_and_prefix_kept():
    from carbonrouter_lib.serve.emulator import PrefixCache

    c = PrefixCache(capacity_tokens=64, block=16)  # 4 blocks
    a = list(range(40))  # 2 full blocks
    assert c.lookup("m", a) == 0
    c.insert("m", a)
    assert c.lookup("m", a) == 32 and c.lookup("m", a[:33]) == 32
    assert c.lookup("m", a[:32]) == 16  # never the whole prompt: its last token is computed
    assert c.lookup("other-model", a) == 0  # block hashes are chained from the model
    assert c.lookup("m", [99] + a[1:]) == 0  # a different first token changes every hash
    b = list(range(1000, 1048))  # 3 blocks: one of a's must go, its tail first
    c.insert("m", b)
    assert c.lookup("m", a) == 16 and c.lookup("m", b + [0]) == 48
    c.insert("m", list(range(5000, 5160)))  # 10 blocks > memory: the 4 leading ones stay
    assert c.lookup("m", list(range(5000, 5160))) == 64 and c.evicted_blocks == 1 + 4


def test_the_horizon_router_routes_live():
    from carbonrouter_lib.policies.horizon import fit_horizon_model
    from carbonrouter_lib.profiles import MODELS
    from carbonrouter_lib.serve.carbon_providers import CachedSignal, CarbonProvider, Reading

    cfg = load_config()  # the embedded default: three of the catalog's models, replayed carbon

    def horizon(**params):
        return cfg.model_copy(update={"router": cfg.router.model_copy(update={
            "policy": "carbonrouter-horizon", "gate": "none", "params": params})})

    now = 1_641_168_000.0
    core = RouterCore(horizon(), clock=ManualClock(now))
    models = core.deployments.models
    assert len(models) == 3
    # its model is fitted at start-up for the served models, on the training workload: each
    # model's own quantities are the catalog fit's columns
    model = core.policy.model
    from carbonrouter_lib import prepared
    table = prepared.prepare_workload(prepared.WorkloadConfig(**cfg.router.gate_workload))
    full = fit_horizon_model(table, cfg.router.beta_q, cfg.router.ttl_s,
                             core.policy.model_horizon)
    cols = [MODELS.index(m) for m in models]
    for name in ("new_tokens", "out_tokens", "stay_feasible"):
        np.testing.assert_array_equal(getattr(model, name), getattr(full, name)[:, cols])
    np.testing.assert_array_equal(model.survival, full.survival)
    np.testing.assert_allclose(model.fallback.sum(axis=2), 1.0)  # over the served models
    msgs = [{"role": "user", "content": "What is a KV cache?"}]
    ci = core.signal.provider.signal.at(now)
    turn = core.decide(core.query(msgs, "s1"), ci, now)
    assert turn is not None and core.declared[turn.a]

    class Flat(CarbonProvider):  # a live provider: current values, no history
        name = "flat"

        async def fetch(self, zone, t):
            return Reading(zone, 300.0, "average", False, t, self.name)

    live = CachedSignal(Flat(), cfg.zones)
    with pytest.raises(ValueError, match="forecast='blend' needs the carbon signal's history"):
        RouterCore(horizon(), signal=live, clock=ManualClock(now))
    core = RouterCore(horizon(forecast="persistence"), signal=live, clock=ManualClock(now))
    turn = core.decide(core.query(msgs, "s2"), np.full(len(cfg.zones), 300.0), now)
    assert turn is not None and core.declared[turn.a]
    for params in ({"session_length": "told"}, {"forecast": "clairvoyant"}):
        with pytest.raises(ValueError, match="reads the future"):
            RouterCore(horizon(**params), clock=ManualClock(now))


def test_the_live_routers_state_is_bounded_by_its_live_sessions():
    # A live router runs without end: what it keeps of a session goes when the session leaves
    # (its state, CarbonRouter's counts, a revived key), and its backend forgets the departed
    # sessions whose caches are gone (without that, one id per session ever seen stayed)
    from carbonrouter_lib.serve.core import REVIVED_BASE, session_id

    cfg = load_config()
    cfg = cfg.model_copy(update={"router": cfg.router.model_copy(update={
        "policy": "carbonrouter-no-gate", "gate": "none"})})
    t = 1_641_168_000.0
    clock = ManualClock(t)
    core = RouterCore(cfg, clock=clock)
    n_r = len(cfg.zones)
    clean_first, clean_second = np.full(n_r, 400.0), np.full(n_r, 400.0)
    clean_first[0], clean_second[1] = 50.0, 50.0  # the carbon flips between the two turns
    n, step = 5000, 1.0
    for i in range(n):
        chat = [{"role": "user", "content": "hi"}]
        for turn, ci in enumerate((clean_first, clean_second)):
            t += step
            clock.set(t)
            q = core.query(chat, f"s{i}", {"last_turn": turn == 1})
            served = core.decide(q, ci, t)
            core.finish(served, 4)
            chat += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "and?"}]
    recs = core.decisions()
    assert sum(r["opportunity"] for r in recs) > n / 2  # the counts were kept while it ran
    assert core.policy.opportunities == {} and core._sessions == {} and core._revived == {}
    # the sessions whose caches expired (TTL) are forgotten: what remains is the last TTL's
    # sessions and at most max(1024, those) departures since the last time it forgot
    within_ttl = cfg.router.ttl_s / (2 * step)
    assert len(core.backend._departed) <= within_ttl + max(1024, within_ttl) < n
    # a forgotten key that comes back is a new session under its own id again, not revived
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "back"}]
    t += step
    clock.set(t)
    q = core.query(chat, "s0")
    assert core.decide(q, clean_first, t) is not None
    assert q.session == session_id("s0", chat)[0] < REVIVED_BASE
