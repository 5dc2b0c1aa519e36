"""The LiteLLM routing strategy: a real ``litellm.Router`` over emulated engines, routed by the
same decision as the proxy (stickiness, a switch when the carbon flips, an engine failure)."""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import

import asyncio  # noqa: E402
import math  # noqa: E402

import litellm  # noqa: E402
import pytest  # noqa: E402
from test_serve_proxy import T0, StaticProvider  # noqa: E402

from carbonrouter_lib.serve.carbon_providers import CachedSignal  # noqa: E402
from carbonrouter_lib.serve.clock import ManualClock  # noqa: E402
from carbonrouter_lib.serve.config import ConfigError  # noqa: E402
from carbonrouter_lib.serve.emulator import EmulatorCluster, free_ports  # noqa: E402
from carbonrouter_lib.serve.litellm_strategy import attach, config_from_router  # noqa: E402

# litellm's own pydantic models warn about ReadOnly TypedDict items at import
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

SETTINGS = {"router": {"policy": "carbonrouter-no-gate", "cooldown_s": 60,
                       "read_timeout_s": 10}}


def _model_list(ports):
    return [{"model_name": "carbonrouter",
             "litellm_params": {"model": "openai/llama-70b", "api_base":
                                f"http://127.0.0.1:{p}/v1", "api_key": "unused"},
             "model_info": {"id": f"{r.lower()}-h100", "catalog_model": "Llama-3.1-70B",
                            "gpu": "H100", "region": r, "zone": r, "slots": 8,
                            "kv_tokens": 2e5}}
            for r, p in zip(("GB", "BE"), ports, strict=True)]


def test_config_from_router_names_bad_entries():
    ml = _model_list([1, 2])
    ml[1]["model_info"]["region"] = None
    with pytest.raises(ConfigError, match=r"deployments\[1\] \(id 'be-h100'\): region"):
        config_from_router(ml, SETTINGS)


def test_litellm_router_routes_with_the_carbonrouter_decision():
    ports = free_ports(2)
    model_list = _model_list(ports)
    cfg = config_from_router(model_list, SETTINGS)
    provider = StaticProvider({"GB": 100.0, "BE": 300.0})
    router = litellm.Router(model_list=model_list, num_retries=0)
    clock = ManualClock(T0)
    strategy = attach(router, SETTINGS, signal=CachedSignal(provider, cfg.zones), clock=clock)
    core = strategy.core

    async def turn(key, msgs):
        r = await router.acompletion(model="carbonrouter", messages=msgs, max_tokens=8,
                                     metadata={"session_id": key})
        msgs += [{"role": "assistant", "content": r.choices[0].message.content},
                 {"role": "user", "content": "go on"}]
        return r._hidden_params["model_id"]

    async def scenario(cluster):
        long = [{"role": "user", "content": "alpha beta gamma delta " * 1500}]
        short = [{"role": "user", "content": "hi"}]
        first = [await turn("long", long), await turn("short", short)]
        provider.values.update(GB=300.0, BE=150.0)  # BE twice as clean
        second = [await turn("long", long), await turn("short", short)]
        # an engine error: the failure callback frees the turn and cools the engine down
        provider.values.update(GB=100.0, BE=300.0)
        cluster.engines["gb-h100"].faults.errors = 1
        with pytest.raises(litellm.InternalServerError):
            await turn("err", [{"role": "user", "content": "hello"}])
        after = await turn("err", [{"role": "user", "content": "hello"}])
        # "short" idles past session_idle_s and leaves; resumed, it is a new incarnation whose
        # turns the callbacks still find (two turns: the first one's was reported and freed)
        clock.set(clock.now() + cfg.router.session_idle_s + 1.0)
        await turn("short", short)
        await turn("short", short)
        return first, second, after

    with EmulatorCluster(cfg, scale=math.inf) as cluster:
        first, second, after = asyncio.run(scenario(cluster))
    assert first == ["gb-h100", "gb-h100"]
    assert second == ["gb-h100", "be-h100"]  # the long history stays, the short one moves
    assert after == "be-h100" and core.cooling() == ["gb-h100"]
    # the success callback reported each turn: the engine's cached tokens are recorded
    recs = [d for d in core.decisions() if d["session_key"] == "long"]
    assert len(recs) == 2 and 0 <= recs[1]["cached"] - recs[1]["engine_cached"] < 16
    assert recs[1]["engine_cached"] > 5000
    from carbonrouter_lib.serve.core import REVIVED_BASE

    resumed = [d for d in core.decisions() if d["session_key"] == "short"][2:]
    assert [d["session"] for d in resumed] == [REVIVED_BASE] * 2
    assert [d["turn"] for d in resumed] == [2, 3]
    assert all(d["output_tokens"] > 0 for d in resumed)  # finished by the success callback
