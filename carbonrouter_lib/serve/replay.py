"""Drive a prepared workload through the proxy with the ``openai`` client; compare with the
simulator query by query.

- :func:`grid_config`: a serve configuration with one (emulated) engine per deployment of a
  :class:`~carbonrouter_lib.setting.SimulationConfig` and the simulator's capacity, so that
  the proxy and :func:`~carbonrouter_lib.simulator.simulate` route over the same deployments,
  pools and carbon signal.
- :func:`conversation_texts`: the ShareGPT texts of a prepared workload's turns (the emulated
  engines answer each turn with the trace's response, so histories match the trace).
- :func:`replay_stepwise`: the workload in the simulator's event order on a
  :class:`~carbonrouter_lib.serve.clock.ManualClock` with modelled completions: one request at a
  time, each at its simulated dispatch time. Decisions must equal the simulator's.
- :func:`replay_live`: every session as its own asyncio task with the real ``openai`` client,
  on a scaled clock, arrivals and think times divided by the scale; completions as observed.
- :func:`compare_with_simulator`: agreement per query and where (and why) they differ.

Requests carry the workload's predicted quality and output estimate in the ``carbonrouter``
body field, the trace's response in ``emulator.response``, the session number in
``X-Session-ID`` and ``last_turn`` on a session's last turn.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from carbonrouter_lib import prepared, sharegpt
from carbonrouter_lib.profiles import MODELS
from carbonrouter_lib.serve.config import ServeConfig, config_from_dict
from carbonrouter_lib.setting import SimulationConfig, backend_config

__all__ = ["grid_config", "conversation_texts", "request_for", "truncate_sessions",
           "replay_stepwise", "replay_live", "load_test", "compare_with_simulator",
           "overhead_summary"]


def grid_config(sim: SimulationConfig, table: pd.DataFrame, ports: Sequence[int],
                proxy_port: int = 0, **router: Any) -> ServeConfig:
    """A serve configuration over the simulator's deployments (every model × GPU × region of
    ``sim``, in its order), emulated on 127.0.0.1 ``ports`` (one per deployment), with the
    simulator's capacity for ``table`` and replayed carbon; ``router`` fields override
    :class:`~carbonrouter_lib.serve.config.RouterSpec`'s (e.g. ``completion="modelled"``)."""
    deps = sim.deployments()
    if len(ports) != deps.n:
        raise ValueError(f"grid_config: {deps.n} deployments need {deps.n} ports, got "
                         f"{len(ports)}")
    cap = backend_config(table, sim)
    entries = []
    for a in range(deps.n):
        m, g, r = (deps.models[deps.model[a]], deps.gpus[deps.gpu[a]],
                   deps.regions[deps.region[a]])
        entries.append({"id": f"{r}-{g}-{m}".lower(), "base_url": f"http://127.0.0.1:"
                        f"{ports[a]}/v1", "model": m, "gpu": g, "region": r, "zone": r,
                        "slots": cap.slots_per_pool, "kv_tokens": cap.kv_tokens_per_pool})
    raw = {"port": proxy_port, "regions": list(sim.regions),
           "profile_constants": {"kappa": sim.kappa, "gamma": sim.gamma, "alpha": sim.alpha},
           "carbon": {"provider": "replay", "year": sim.carbon_year},
           "router": {"beta_q": sim.beta_q, "d_ttft_s": sim.d_ttft_s, "ttl_s": sim.ttl_s,
                      "session_idle_s": 10 * 86400.0, **router},
           "deployments": entries}
    return config_from_dict(raw, "<grid_config>")


def conversation_texts(table: pd.DataFrame, max_conversations: int | None = None
                       ) -> pd.DataFrame:
    """``user_text`` and ``assistant_text`` of every row of a prepared ShareGPT workload (same
    row order), from :func:`carbonrouter_lib.sharegpt.load_sharegpt_turns`."""
    turns, _ = sharegpt.load_sharegpt_turns(max_conversations=max_conversations,
                                            progress=False)
    texts = turns[["conversation_id", "turn", "user_text", "assistant_text"]]
    out = table[["conversation_id", "turn"]].merge(texts, on=["conversation_id", "turn"],
                                                   how="left", validate="one_to_one")
    if out["user_text"].isna().any():
        raise ValueError("conversation_texts: some rows have no ShareGPT text (max_conversations "
                         "smaller than the workload's?)")
    return out[["user_text", "assistant_text"]].set_index(table.index)


class _Trace:
    """A workload's rows as Python lists (a request rebuilds its conversation from them)."""

    def __init__(self, table: pd.DataFrame, texts: pd.DataFrame) -> None:
        self.session = table["session"].astype(int).tolist()
        self.turn = table["turn"].astype(int).tolist()
        self.n_turns = table["n_turns"].astype(int).tolist()
        self.user = texts["user_text"].astype(str).tolist()
        self.assistant = texts["assistant_text"].astype(str).tolist()
        self.quality = {m: table[prepared.column("quality", m)].astype(float).tolist()
                        for m in MODELS}
        self.est = {m: table[prepared.column("est_output_tokens", m)].astype(float).tolist()
                    for m in MODELS}


def request_for(trace: _Trace | tuple[pd.DataFrame, pd.DataFrame], i: int) -> dict[str, Any]:
    """Chat-completion keyword arguments of row ``i`` of a workload (``(table, texts)`` or its
    :class:`_Trace`): the conversation so far (trace texts), its quality and output estimate per
    model, the trace's response for the emulator and the session header."""
    t = trace if isinstance(trace, _Trace) else _Trace(*trace)
    k = t.turn[i]
    messages = []
    for j in range(i - k, i):
        messages += [{"role": "user", "content": t.user[j]},
                     {"role": "assistant", "content": t.assistant[j]}]
    messages.append({"role": "user", "content": t.user[i]})
    ext = {"quality": {m: t.quality[m][i] for m in MODELS},
           "est_output_tokens": {m: t.est[m][i] for m in MODELS},
           "last_turn": k == t.n_turns[i] - 1}
    return {"model": "carbonrouter", "messages": messages,
            "extra_body": {"carbonrouter": ext, "emulator": {"response": t.assistant[i]}},
            "extra_headers": {"X-Session-ID": str(t.session[i])}}


def truncate_sessions(table: pd.DataFrame, max_turns: int) -> pd.DataFrame:
    """The workload with every session cut after its first ``max_turns`` turns (``n_turns``
    updated; the kept rows are unchanged): a live replay lasts as long as its longest session."""
    if max_turns < 1:
        raise ValueError(f"max_turns must be ≥ 1, got {max_turns}")
    out = table[table["turn"] < max_turns].copy()
    out["n_turns"] = np.minimum(out["n_turns"], max_turns)
    out.attrs = dict(table.attrs)
    return out.reset_index(drop=True)


def replay_stepwise(client, clock, table: pd.DataFrame, texts: pd.DataFrame) -> pd.DataFrame:
    """Replay ``table`` one request at a time in the simulator's event order (see the module
    docstring). ``client`` is a synchronous ``openai.OpenAI`` pointed at a proxy whose core runs
    on ``clock`` (a ManualClock) with ``completion="modelled"``.

    Returns one row per query: ``session``, ``turn``, ``dispatch_s``, ``deployment_id`` ("" when
    rejected), ``est_gco2e`` (header) and ``completion_s``.
    """
    from openai import APIStatusError

    n = len(table)
    first = np.flatnonzero(table["turn"].to_numpy() == 0)
    think = table["think_s"].to_numpy(dtype=float)
    last = (table["turn"] == table["n_turns"] - 1).to_numpy()
    events = [(float(table["arrival_s"].iloc[i]), int(i)) for i in first]
    heapq.heapify(events)
    trace = _Trace(table, texts)
    rows = []
    while events:
        t, i = heapq.heappop(events)
        clock.set(t)
        try:
            r = client.chat.completions.with_raw_response.create(**request_for(trace, i))
            r.parse()
            dep, est = r.headers["x-carbonrouter-deployment"], float(r.headers[
                "x-carbonrouter-gco2e"])
            done = float(r.headers["x-carbonrouter-completion-s"])
        except APIStatusError as exc:
            if exc.status_code != 503:
                raise
            dep, est, done = "", math.nan, t  # rejected: the session goes on (docs/model.md §6a.8)
        rows.append({"session": trace.session[i], "turn": trace.turn[i], "dispatch_s": t,
                     "deployment_id": dep, "est_gco2e": est, "completion_s": done})
        if not last[i] and i + 1 < n:
            heapq.heappush(events, (done + think[i + 1], i + 1))
    return pd.DataFrame(rows)


async def replay_live(base_url: str, table: pd.DataFrame, texts: pd.DataFrame, clock,
                      stream_share: float = 0.0, timeout_s: float = 120.0,
                      seed: int = 0) -> pd.DataFrame:
    """Replay ``table`` with one asyncio task per session and the ``openai`` async client.

    ``clock`` is the proxy's :class:`~carbonrouter_lib.serve.clock.ScaledClock`: a session
    starts when it reads the session's arrival time, and sends each next turn ``think / scale``
    wall seconds after the previous response; a share ``stream_share`` of the requests is
    streamed. Bounded: every request has ``timeout_s``; the replay lasts about the workload's
    span divided by the scale.

    Returns one row per request: ``session``, ``turn``, ``deployment_id`` ("" when refused),
    ``status`` (200, or the HTTP error), ``est_gco2e``, ``latency_s`` (wall, client side) and
    ``streamed``.
    """
    from openai import APIStatusError, AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=timeout_s)
    rng = np.random.default_rng(seed)
    streamed = rng.random(len(table)) < stream_share
    think = table["think_s"].to_numpy(dtype=float)
    trace = _Trace(table, texts)
    out: list[dict] = []

    async def one(i: int) -> None:
        req = request_for(trace, i)
        t = time.monotonic()
        row = {"session": trace.session[i], "turn": trace.turn[i],
               "deployment_id": "", "status": 200, "est_gco2e": math.nan,
               "streamed": bool(streamed[i])}
        try:
            if streamed[i]:
                async with client.chat.completions.with_streaming_response.create(
                        stream=True, **req) as r:
                    headers = r.headers
                    async for _ in await r.parse():
                        pass
            else:
                r = await client.chat.completions.with_raw_response.create(**req)
                r.parse()
                headers = r.headers
            row["deployment_id"] = headers["x-carbonrouter-deployment"]
            row["est_gco2e"] = float(headers["x-carbonrouter-gco2e"])
        except APIStatusError as exc:
            row["status"] = exc.status_code
        row["latency_s"] = time.monotonic() - t
        out.append(row)

    async def session(rows: np.ndarray) -> None:
        arrival = float(table["arrival_s"].iloc[rows[0]])
        await asyncio.sleep(max(0.0, (arrival - clock.now()) / clock.scale))
        for j, i in enumerate(rows):
            if j:
                await asyncio.sleep(think[i] / clock.scale)
            await one(int(i))

    groups = [np.flatnonzero(table["session"].to_numpy() == s)
              for s in table["session"].unique()]
    try:
        await asyncio.gather(*(session(g) for g in groups))
    finally:
        await client.close()
    return pd.DataFrame(out)


async def load_test(base_url: str, n_sessions: int = 200, turns: int = 5,
                    stream_share: float = 0.2, max_tokens: int = 32, timeout_s: float = 60.0,
                    deadline_s: float = 300.0, seed: int = 0) -> pd.DataFrame:
    """A bounded load test: ``n_sessions`` concurrent sessions × ``turns`` turns, each turn sent
    as soon as the previous response ends (``stream_share`` of them streamed), every request
    with a ``timeout_s`` and the whole test within ``deadline_s`` (then the rest is cancelled
    and counted as lost).

    Returns one row per request sent: ``session``, ``turn``, ``status`` (200, an HTTP error, or
    0 for a transport error or timeout), ``deployment_id``, ``latency_s`` (client side, wall)
    and ``streamed``. A request never sent (the deadline) has no row: the caller compares the
    count with ``n_sessions × turns``.
    """
    from openai import APIConnectionError, APIStatusError, AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=timeout_s)
    rng = np.random.default_rng(seed)
    out: list[dict] = []

    async def session(s: int) -> None:
        messages = [{"role": "user", "content": f"Session {s}: explain KV caches. " * 4}]
        for k in range(turns):
            streamed = bool(rng.random() < stream_share)
            row = {"session": s, "turn": k, "status": 200, "deployment_id": "",
                   "streamed": streamed}
            t = time.monotonic()
            kw = {"model": "carbonrouter", "messages": messages, "max_tokens": max_tokens,
                  "extra_headers": {"X-Session-ID": f"load-{seed}-{s}"},
                  "extra_body": {"carbonrouter": {"last_turn": k == turns - 1}}}
            try:
                if streamed:
                    async with client.chat.completions.with_streaming_response.create(
                            stream=True, **kw) as r:
                        row["deployment_id"] = r.headers["x-carbonrouter-deployment"]
                        text = "".join([c.choices[0].delta.content or ""
                                        async for c in await r.parse() if c.choices])
                else:
                    r = await client.chat.completions.with_raw_response.create(**kw)
                    row["deployment_id"] = r.headers["x-carbonrouter-deployment"]
                    text = r.parse().choices[0].message.content
            except APIStatusError as exc:
                row["status"], text = exc.status_code, ""
            except APIConnectionError:
                row["status"], text = 0, ""
            row["latency_s"] = time.monotonic() - t
            out.append(row)
            messages = [*messages, {"role": "assistant", "content": text},
                        {"role": "user", "content": f"Turn {k + 1}: go on."}]

    try:
        await asyncio.wait_for(asyncio.gather(*(session(s) for s in range(n_sessions))),
                               timeout=deadline_s)
    except TimeoutError:
        pass
    finally:
        await client.close()
    return pd.DataFrame(out)


def compare_with_simulator(sim_records: pd.DataFrame, proxy_records: pd.DataFrame
                           ) -> pd.DataFrame:
    """Query by query: the simulator's and the proxy's deployment, L(a), estimated and realized
    carbon, and whether the decisions agree.

    ``sim_records``: :func:`~carbonrouter_lib.simulator.simulate` records; ``proxy_records``:
    the proxy's decision records (``RouterCore.decisions()``, served and rejected). Both are
    keyed by (session, turn). Where they differ, ``why`` names the first input that differed:
    ``cache`` (L(a) of the simulator's choice as the proxy saw it differs), ``rejected``, else
    ``timing`` (dispatch time, and so carbon or availability, differed).
    """
    sim = sim_records[["session", "turn", "deployment", "dispatch_s", "cached_tokens",
                       "est_carbon_g", "carbon_g", "rejected"]].rename(
        columns=lambda c: c if c in ("session", "turn") else f"sim_{c}")
    px = pd.DataFrame(proxy_records)
    px = px.rename(columns={"deployment": "proxy_deployment", "dispatch_s": "proxy_dispatch_s",
                            "cached": "proxy_cached_tokens", "est_carbon_g":
                            "proxy_est_carbon_g", "carbon_g": "proxy_carbon_g",
                            "engine_cached": "engine_cached_tokens",
                            "rejected": "proxy_rejected"})
    keep = ["session", "turn", "proxy_deployment", "proxy_dispatch_s", "proxy_cached_tokens",
            "engine_cached_tokens", "proxy_est_carbon_g", "proxy_carbon_g", "proxy_rejected",
            "decision_s", "overhead_s"]
    px = px[[c for c in keep if c in px.columns]].drop_duplicates(["session", "turn"],
                                                                     keep="last")
    out = sim.merge(px, on=["session", "turn"], how="outer", validate="one_to_one",
                    indicator=True)
    out["agree"] = out["sim_deployment"] == out["proxy_deployment"]
    why = np.where(out["agree"], "", "timing")
    cache_diff = ~np.isclose(out["sim_cached_tokens"].fillna(0),
                             out["proxy_cached_tokens"].fillna(0))
    why = np.where(~out["agree"] & cache_diff, "cache", why)
    why = np.where(~out["agree"] & (out["sim_rejected"] != out["proxy_rejected"]), "rejected",
                   why)
    why = np.where(out["_merge"] != "both", "missing", why)
    out["why"] = why
    return out.drop(columns="_merge")


def overhead_summary(seconds: Sequence[float]) -> dict[str, float]:
    """p50, p99 and mean of per-request times (s → ms), and their count."""
    x = np.asarray(seconds, dtype=float)
    x = x[np.isfinite(x)]
    if not x.size:
        return {"n": 0, "p50_ms": math.nan, "p99_ms": math.nan, "mean_ms": math.nan}
    return {"n": int(x.size), "p50_ms": float(np.percentile(x, 50) * 1e3),
            "p99_ms": float(np.percentile(x, 99) * 1e3), "mean_ms": float(x.mean() * 1e3)}
