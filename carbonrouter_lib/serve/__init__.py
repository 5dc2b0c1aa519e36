"""CarbonRouter in front of real engines (optional extra: ``pip install -e .[serve]``).

The same policy objects the notebooks evaluate, routing live OpenAI-compatible traffic:

- :mod:`~carbonrouter_lib.serve.config` — the YAML configuration (deployments, profiles, carbon
  provider, clock, policy), validated at start-up;
- :mod:`~carbonrouter_lib.serve.core` — :class:`RouterCore`: requests → the simulator's query
  context → ``feasibility`` → ``Policy.choose``; the router's cache estimate (the backend
  emulator's rules) corrected by what engines report;
- :mod:`~carbonrouter_lib.serve.proxy` — the FastAPI proxy (``/v1/chat/completions``,
  ``/v1/models``, ``/healthz``, ``/metrics``);
- :mod:`~carbonrouter_lib.serve.carbon_providers` — replay, Electricity Maps, WattTime, Carbon
  Aware SDK, behind a TTL cache with fallbacks;
- :mod:`~carbonrouter_lib.serve.litellm_strategy` — the decision as a LiteLLM routing strategy;
- :mod:`~carbonrouter_lib.serve.emulator` — emulated engines (prefix cache, profile timing,
  faults) for tests and demos;
- :mod:`~carbonrouter_lib.serve.replay` — drive a prepared workload through the proxy with the
  ``openai`` client and compare with the simulator.

``python -m carbonrouter_lib.serve demo`` (``make serve``) starts emulated engines and the proxy.
"""

from carbonrouter_lib.serve.config import ConfigError, ServeConfig, load_config
from carbonrouter_lib.serve.core import RouterCore

__all__ = ["ConfigError", "ServeConfig", "load_config", "RouterCore"]
