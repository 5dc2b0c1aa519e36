"""Make a policy ready to route a workload: train or load what it learns, before the replay.

:func:`~carbonrouter_lib.simulator.simulate` replays a *ready* policy and never trains anything.
Two policies learn from the workload they route, and this module is the one place they are built
(``experiments.run_policies`` and ``sweep.run_one`` call it, and so can anyone calling
``simulate`` directly):

- CarbonRouter with its learned gate (``gate="learned"``, the registry's ``carbonrouter`` and
  ``carbonrouter-no-pricing``): the XGBoost gate of this setting, trained on the workload's
  switch opportunities with conversation-held-out folds (:func:`carbonrouter_lib.gate.
  ensure_gate`), loaded from the gate cache when the workload is named by a
  :class:`~carbonrouter_lib.prepared.WorkloadConfig` and the gate was trained before;
  with the oracle gate (``carbonrouter-oracle-gate``): the workload's
  :class:`~carbonrouter_lib.gate.OracleGate`;
- the horizon router (``carbonrouter-horizon``): its session-continuation and cache-survival
  model, fitted on the workload's conversations (:meth:`carbonrouter_lib.policies.
  HorizonRouter.fit_model`; a fraction of a second).

Every other policy is returned as it is.
"""

from __future__ import annotations

import os

import pandas as pd

from carbonrouter_lib.backend import BackendConfig
from carbonrouter_lib.carbon import CarbonSignal
from carbonrouter_lib.policies import (
    ORACLE,
    CarbonRouter,
    HorizonRouter,
    Policy,
    make_policy,
)
from carbonrouter_lib.prepared import WorkloadConfig
from carbonrouter_lib.setting import SimulationConfig

__all__ = ["build_policy"]


def build_policy(
    policy: Policy | str,
    table: pd.DataFrame,
    config: SimulationConfig,
    *,
    signal: CarbonSignal | None = None,
    backend: BackendConfig | None = None,
    workload: WorkloadConfig | None = None,
    gate_dir: str | os.PathLike | None = None,
) -> Policy:
    """``policy`` (an object, a registry name or ``"package.module:Class"``) ready to route
    ``table`` under ``config``; see the module docstring for what is built.

    Parameters
    ----------
    policy
        The policy; an object is completed in place and returned.
    table
        The prepared workload it will route (a learned gate and a horizon model are trained on
        it, held out by conversation where the policy routes its own training data).
    config
        The setting of the replay.
    signal, backend
        The carbon signal and capacity if already at hand (default: the setting's).
    workload
        The configuration ``table`` was prepared from: names the learned gate in the gate cache
        (loaded if trained before, else trained and stored). None: trained from ``table`` and not
        stored.
    gate_dir
        The gate cache folder (default :func:`carbonrouter_lib.gate.gate_path`'s).
    """
    policy = make_policy(policy) if isinstance(policy, str) else policy
    if isinstance(policy, CarbonRouter) and policy.gate_to_build is not None:
        from carbonrouter_lib import gate as gates  # XGBoost: imported only when a gate is built

        if policy.gate_to_build == ORACLE:
            policy.set_gate(gates.OracleGate(table, config, pricing=policy.pricing))
        else:
            policy.set_gate(gates.ensure_gate(workload, config, policy.pricing,
                                              policy.gate_training, table=table, signal=signal,
                                              backend=backend, cache_dir=gate_dir))
    if isinstance(policy, HorizonRouter) and policy.needs_model:
        policy.set_model(policy.fit_model(table, config.beta_q, config.ttl_s))
    return policy
