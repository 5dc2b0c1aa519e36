"""CarbonRouter as a LiteLLM routing strategy (``CustomRoutingStrategyBase``).

A ``litellm.Router``'s deployments become the router's deployments: each entry of its
``model_list`` declares in ``model_info`` its ``id``, the catalog ``catalog_model`` (profile and
tokenizer; default the entry's ``model_name``), ``gpu``, ``region``, ``zone``, ``slots`` and
``kv_tokens``. :func:`attach` builds a :class:`~carbonrouter_lib.serve.core.RouterCore` over
them (same configuration schema as the proxy, minus the engines' URLs, which LiteLLM owns) and
registers :class:`CarbonRouterStrategy` with ``Router.set_custom_routing_strategy``;
``async_get_available_deployment`` is the same decision as the proxy's (``RouterCore.route``:
the simulator's context, ``feasibility``, ``Policy.choose``).

LiteLLM gives a routing strategy the request but not the response, so the strategy is also a
``CustomLogger``: the success callback reports the realized output and
``usage.prompt_tokens_details.cached_tokens`` (``RouterCore.finish``); the failure callback
frees the turn and cools the deployment down (LiteLLM's own retries then ask the strategy
again). Sessions: ``metadata={"session_id": ...}`` in the call, else a hash of the first
messages; per-request inputs in ``metadata={"carbonrouter": {...}}``.

Pinned: ``litellm==1.108.14`` (classic Python Router). Never 1.82.7 or 1.82.8 (compromised
PyPI releases, March 2026). 1.110 replaced the Router's core and deprecated
``set_custom_routing_strategy``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import Any

# LiteLLM fetches a model-cost map from the network at import unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from litellm.integrations.custom_logger import CustomLogger  # noqa: E402
from litellm.types.router import CustomRoutingStrategyBase  # noqa: E402

from carbonrouter_lib.serve.config import ServeConfig, config_from_dict  # noqa: E402
from carbonrouter_lib.serve.core import RouterCore, Turn, _count  # noqa: E402

__all__ = ["CarbonRouterStrategy", "config_from_router", "attach"]


def config_from_router(model_list: list[Mapping[str, Any]],
                       settings: Mapping[str, Any] | None = None) -> ServeConfig:
    """A serve configuration whose deployments are a LiteLLM ``model_list``'s (see the module
    docstring); ``settings`` holds the other sections (``carbon``, ``clock``, ``router``, ...).
    Errors name the entry as ``deployments[i]``."""
    entries = []
    for i, d in enumerate(model_list):
        info = dict(d.get("model_info") or {})
        params = d.get("litellm_params") or {}
        entries.append({
            "id": info.get("id"), "model": info.get("catalog_model", d.get("model_name")),
            "served_model": params.get("model"),
            "base_url": params.get("api_base") or f"https://litellm.invalid/{i}",
            **{k: info.get(k) for k in ("gpu", "region", "zone", "slots", "kv_tokens")}})
    return config_from_dict({**dict(settings or {}), "deployments": entries}, "<litellm>")


class CarbonRouterStrategy(CustomRoutingStrategyBase, CustomLogger):
    """Routes a ``litellm.Router``'s requests with :class:`RouterCore` (module docstring).

    Parameters
    ----------
    core
        The router core over the Router's deployments (:func:`attach` builds it).
    model_list
        The Router's ``model_list``: the returned deployment is its element whose
        ``model_info.id`` is the chosen deployment's id.
    """

    def __init__(self, core: RouterCore, model_list: list[dict]) -> None:
        CustomLogger.__init__(self)
        self.core = core
        self._by_id = {str((d.get("model_info") or {}).get("id")): d for d in model_list}
        self._turns: dict[int, Turn] = {}

    def _identity(self, messages, request_kwargs: Mapping[str, Any] | None):
        meta = dict((request_kwargs or {}).get("metadata") or {})
        return meta.get("session_id"), meta.get("carbonrouter")

    async def async_get_available_deployment(self, model: str, messages=None, input=None,
                                             specific_deployment: bool | None = False,
                                             request_kwargs: dict | None = None) -> dict:
        """The deployment (an element of the Router's ``model_list``) CarbonRouter chooses."""
        if not messages:
            raise ValueError("CarbonRouterStrategy routes chat requests (messages) only")
        key, ext = self._identity(messages, request_kwargs)
        q = self.core.query(messages, key, ext, (request_kwargs or {}).get("max_tokens"))
        st = self.core.session(q.session)
        # One turn of a session at a time; the previous turn's success callback may still be
        # on its way (LiteLLM logs in a background task).
        try:
            await asyncio.wait_for(st.lock.acquire(),
                                   timeout=self.core.config.router.read_timeout_s)
        except TimeoutError:
            stale = self._turns.pop(q.session, None)
            if stale is not None:
                self.core.fail(stale, "no_callback", cooldown=False)
        turn = await self.core.route(q)
        if turn is None:
            self._release(q.session)
            raise ValueError("carbonrouter: no deployment can serve this query (capacity, "
                             "quality or context window)")
        self._turns[q.session] = turn
        return self._by_id[self.core.specs[turn.a].id]

    def get_available_deployment(self, *args, **kwargs):  # pragma: no cover - sync path
        raise NotImplementedError("CarbonRouterStrategy is async: use Router.acompletion")

    def _release(self, s: int) -> None:
        st = self.core.session(s)
        if st.lock.locked():
            st.lock.release()

    def _turn_of(self, kwargs: Mapping[str, Any]) -> Turn | None:
        params = kwargs.get("litellm_params") or {}
        meta = params.get("metadata") or {}
        s = self.core.session_of(meta.get("session_id"), kwargs.get("messages") or [])
        return self._turns.pop(s, None)

    async def async_log_success_event(self, kwargs, response_obj, start_time, end_time) -> None:
        """Report the realized output and the engine's cached tokens of the turn."""
        turn = self._turn_of(kwargs)
        if turn is None:
            return
        resp = kwargs.get("complete_streaming_response") or response_obj
        text = "".join((c.message.content or "") for c in resp.choices)
        usage = getattr(resp, "usage", None)
        details = getattr(usage, "prompt_tokens_details", None)
        cached = getattr(details, "cached_tokens", None)
        spec = self.core.specs[turn.a]
        self.core.finish(turn, _count(text, spec.family), cached)
        self._release(turn.query.session)

    async def async_log_failure_event(self, kwargs, response_obj, start_time, end_time) -> None:
        """Free the failed turn and cool its deployment down."""
        turn = self._turn_of(kwargs)
        if turn is None:
            return
        self.core.fail(turn, "litellm_error")
        self._release(turn.query.session)


def attach(router, settings: Mapping[str, Any] | None = None, **core_kwargs: Any
           ) -> CarbonRouterStrategy:
    """Build the router core over ``router.model_list`` and install the strategy on ``router``
    (``set_custom_routing_strategy``) and as a LiteLLM callback. ``core_kwargs`` go to
    :class:`RouterCore` (e.g. ``clock``, ``policy``)."""
    import litellm

    core = RouterCore(config_from_router(router.model_list, settings), **core_kwargs)
    strategy = CarbonRouterStrategy(core, router.model_list)
    router.set_custom_routing_strategy(strategy)
    litellm.callbacks = [*litellm.callbacks, strategy]
    return strategy
