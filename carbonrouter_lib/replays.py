"""The replays of the results notebooks (04, 05, 06): their settings and the grid of runs.

A results notebook replays each dataset × region set it is given at the default scale
(:func:`carbonrouter_lib.scale.setting`: the peak of active sessions P, the KV-memory rule) under a
list of policies, all on the same sessions. :func:`settings` builds those settings (a workload
and a simulation config each), :func:`setting` one of them replayed from another Monday of the
year, :func:`specs` the :class:`~carbonrouter_lib.sweep.RunSpec` of every setting × policy (sent
through :func:`carbonrouter_lib.sweep.run_named`), and :func:`describe` the table of their scales
each notebook prints above its results.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import pandas as pd

from carbonrouter_lib import scale
from carbonrouter_lib.arrivals import ArrivalConfig
from carbonrouter_lib.prepared import WorkloadConfig
from carbonrouter_lib.setting import SimulationConfig
from carbonrouter_lib.sweep import RunSpec

__all__ = ["SEASONS", "Setting", "setting", "settings", "specs", "describe"]

#: Replay windows: the Monday (00:00 UTC) that starts each season's 7-day window, as in
#: notebook 04's robustness over the year; any other date of the carbon year works too.
SEASONS: dict[str, str] = {
    "winter": "2022-01-03", "spring": "2022-04-04", "summer": "2022-07-04", "autumn": "2022-10-03",
}

#: A replay's workload and simulation configs.
Setting = tuple[WorkloadConfig, SimulationConfig]


def setting(dataset: str, region_set: str = "paper", peak: int | str | None = None,
            memory: str | None = None, window_start: str | None = None,
            **workload_fields: Any) -> Setting:
    """:func:`carbonrouter_lib.scale.setting`, with the replay window starting at 00:00 UTC of
    the date ``window_start`` (``YYYY-MM-DD``, 7 days as :class:`.arrivals.ArrivalConfig`'s
    default; None: the default window). A window in another year than the default carbon year
    replays that year's carbon signal (``SimulationConfig.carbon_year``; the signal covers one
    calendar year, so a window must end in the year it starts in). ``workload_fields`` go to
    :class:`~carbonrouter_lib.prepared.WorkloadConfig` (seed, n_sessions, max_conversations, …)."""
    if window_start is None:
        return scale.setting(dataset, region_set, peak, memory, **workload_fields)
    if "arrival" in workload_fields:
        raise ValueError("replays.setting: give window_start or arrival, not both")
    arrival = ArrivalConfig(window_start=f"{window_start}T00:00:00Z")
    wcfg, sim = scale.setting(dataset, region_set, peak, memory, arrival=arrival,
                              **workload_fields)
    if arrival.window_start.year != sim.carbon_year:
        sim = dataclasses.replace(sim, carbon_year=arrival.window_start.year)
    return wcfg, sim


def settings(datasets: Sequence[str], region_sets: Sequence[str], peak: int | str | None = None,
             memory: str | None = None, **workload_fields: Any) -> dict[tuple[str, str], Setting]:
    """The setting of every dataset × region set, keyed ``(dataset, region_set)``, datasets
    first: each is :func:`setting` with the same ``peak`` (None: :data:`.scale.DEFAULT_PEAK`;
    ``"unscaled"``: every conversation once), KV-memory rule ``memory`` and workload fields."""
    return {(ds, rs): setting(ds, rs, peak, memory, **workload_fields)
            for ds in datasets for rs in region_sets}


def specs(settings: Mapping[Hashable, Setting], policies: Sequence[str],
          output: str = "records") -> dict[tuple, RunSpec]:
    """The run of every setting × policy, keyed ``(*setting key, policy)`` (a key that is not a
    tuple counts as a 1-tuple: ``"unscaled"`` gives ``("unscaled", policy)``), settings first,
    policies in the order given. ``output``: what each run returns (``"records"`` or
    ``"summary"``, :class:`~carbonrouter_lib.sweep.RunSpec`)."""
    return {(*(key if isinstance(key, tuple) else (key,)), p):
            RunSpec.make(wcfg, scfg, p, output=output)
            for key, (wcfg, scfg) in settings.items() for p in policies}


def describe(settings: Mapping[Hashable, Setting]) -> pd.DataFrame:
    """The scale of every setting (:func:`carbonrouter_lib.scale.describe`: session-start rate,
    copies, sessions, queries, peak P, slots per pool, KV memory), one row per setting, indexed
    by its key (a tuple joined with ``" / "``)."""
    return pd.DataFrame({k if isinstance(k, str) else " / ".join(k): scale.describe(*v)
                         for k, v in settings.items()}).T
