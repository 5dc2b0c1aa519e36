"""The interactive explorer (``notebooks/explore.ipynb``): Table 1 and its mechanisms anywhere.

The notebook's widgets give an :class:`ExplorerSettings` (:meth:`ExplorerSettings.from_values`
reads the widgets' values); :func:`explore` replays the chosen policies in that setting and returns
Table 1 (:func:`.experiments.table1`) and the mechanism quantities (:func:`.experiments.mechanisms`)
as an :class:`Exploration`; :func:`table1_view` formats Table 1 beside the paper's and
:func:`plot_mechanisms` draws the mechanism figure. The notebook only wires widgets to these.

Every replay is a compact run (``output="summary"``) sent through :func:`.sweep.run_sweep`, so a
setting explored before is read back from the run cache, not replayed. When a notebook has cached
the full records of the same run (notebook 04's Table 1 at the default scale), they are read and
summarized instead of replaying again.

Units: CO2 and energy relative to Session-Affinity, P95 TTFT in s, savings in %, γ and κ as in
:class:`~.setting.SimulationConfig` (dimensionless), c in sessions per active session, β_Q in
[0, 1]; the replay window starts at 00:00 UTC of a date and lasts 7 days.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from carbonrouter_lib import experiments, metrics, scale, sweep
from carbonrouter_lib import paper as paper_numbers
from carbonrouter_lib.arrivals import ArrivalConfig
from carbonrouter_lib.carbon import REGION_SETS
from carbonrouter_lib.paper import PAPER_DATASET
from carbonrouter_lib.plots import MECHANISMS_SHOWN, POLICY_LABELS
from carbonrouter_lib.policies import POLICIES
from carbonrouter_lib.prepared import DATASETS, WorkloadConfig
from carbonrouter_lib.replays import SEASONS
from carbonrouter_lib.setting import SimulationConfig

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "SEASONS",
    "PEAKS",
    "CONVERSATIONS",
    "N_BOOT",
    "EXPLORER_POLICIES",
    "PAPER_DATASET",
    "POLICY_LABELS",
    "MECHANISMS_SHOWN",
    "ExplorerSettings",
    "PRESETS",
    "Exploration",
    "run_specs",
    "explore",
    "table1_view",
    "plot_mechanisms",
]


#: Replay scales offered: the peak of active sessions P (``"unscaled"``: every conversation once,
#: the replay before the scale study), up to the results notebooks' default.
PEAKS: tuple[int | str, ...] = ("unscaled", 4, 25, 100, scale.DEFAULT_PEAK)

#: Dataset sizes offered (first conversations of the dataset; None: all of them).
CONVERSATIONS: tuple[int | None, ...] = (40, 150, 1000, None)

#: Bootstrap resamples offered for the savings' CIs.
N_BOOT: tuple[int, ...] = (200, 1000, 2000)

#: Policies the explorer can compare: Table 1's and CarbonRouter's ablations (Table 2's rows).
EXPLORER_POLICIES: tuple[str, ...] = tuple(dict.fromkeys(
    (*experiments.MAIN_POLICIES, *experiments.ABLATIONS)))

# Slider values arrive as binary floats (0.1 + 0.05 ...); rounding keeps one setting one cache key.
_DECIMALS = 6


@dataclass(frozen=True)
class ExplorerSettings:
    """One setting of the explorer: the workload, its scale, the simulation parameters and the
    policies to compare. Defaults are the results notebooks' (:mod:`.scale`) and the paper's
    (:class:`~.setting.SimulationConfig`).

    Attributes
    ----------
    dataset
        ``"sharegpt"`` or ``"mooncake"`` (the Mooncake trace, standing in for ShareChat).
    region_set
        A :data:`.carbon.REGION_SETS` key.
    window_start
        First day of the 7-day replay window (``YYYY-MM-DD``, 00:00 UTC), e.g. a :data:`SEASONS`
        value.
    peak
        Peak of active sessions P of the replay (int ≥ 1), or ``"unscaled"``.
    memory
        KV-memory rule, a :data:`.scale.MEMORY_RULES` key.
    gamma, kappa, c, beta_q
        Cached/uncached and output/input energy ratios, capacity factor, quality threshold β_Q.
    policies
        Policies to compare; Session-Affinity (the reference of Table 1) and ``target`` are
        always replayed too.
    target
        The policy whose CO2 saving over every other is reported.
    max_conversations
        Truncate the dataset to its first conversations (None: all).
    seed
        Workload seed (session sampling, start and think times).
    n_boot
        Bootstrap resamples of the savings' 95% CIs.
    """

    dataset: str = "sharegpt"
    region_set: str = "paper"
    window_start: str = SEASONS["winter"]
    peak: int | str = scale.DEFAULT_PEAK
    memory: str = scale.DEFAULT_MEMORY
    gamma: float = SimulationConfig.gamma
    kappa: float = SimulationConfig.kappa
    c: float = SimulationConfig.c
    beta_q: float = SimulationConfig.beta_q
    policies: tuple[str, ...] = experiments.MAIN_POLICIES
    target: str = "carbonrouter"
    max_conversations: int | None = None
    seed: int = 0
    n_boot: int = 1000

    def __post_init__(self) -> None:
        if self.dataset not in DATASETS:
            raise ValueError(f"dataset must be one of {DATASETS}, got {self.dataset!r}")
        if self.region_set not in REGION_SETS:
            raise ValueError(f"region_set must be one of {list(REGION_SETS)}, "
                             f"got {self.region_set!r}")
        if self.memory not in scale.MEMORY_RULES:
            raise ValueError(f"memory must be one of {list(scale.MEMORY_RULES)}, "
                             f"got {self.memory!r}")
        if self.peak != "unscaled" and (isinstance(self.peak, bool)
                                        or not isinstance(self.peak, int) or self.peak < 1):
            raise ValueError(f"peak must be an integer ≥ 1 or 'unscaled', got {self.peak!r}")
        unknown = [p for p in (*self.policies, self.target) if p not in POLICIES]
        if unknown:
            raise ValueError(f"unknown policies {unknown}; one of {sorted(POLICIES)}")
        if self.max_conversations is not None and self.max_conversations < 1:
            raise ValueError(f"max_conversations must be ≥ 1 or None, "
                             f"got {self.max_conversations!r}")
        if self.n_boot < 1:
            raise ValueError(f"n_boot must be ≥ 1, got {self.n_boot!r}")
        # The window and the simulation parameters, checked by their configs (cheap: building
        # the workload at this scale is left to configs()).
        ArrivalConfig(window_start=f"{self.window_start}T00:00:00Z")
        SimulationConfig(gamma=self.gamma, kappa=self.kappa, c=self.c, beta_q=self.beta_q)

    @classmethod
    def from_values(cls, **values: Any) -> ExplorerSettings:
        """Settings from widget values: the field names as keywords, unknown names refused.

        Floats are rounded to 6 decimals (a slider's 0.15000000000000002 is 0.15, the same
        run), a date or timestamp becomes ``YYYY-MM-DD``, a sequence of policies a tuple,
        ``max_conversations`` of 0 means all, and a peak given as a digit string an int.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise TypeError(f"ExplorerSettings: unknown settings {unknown}; known: {sorted(names)}")
        v = dict(values)
        for name in ("gamma", "kappa", "c", "beta_q"):
            if name in v:
                v[name] = round(float(v[name]), _DECIMALS)
        if "window_start" in v:
            v["window_start"] = pd.Timestamp(v["window_start"]).strftime("%Y-%m-%d")
        if "policies" in v:
            v["policies"] = tuple(v["policies"])
        if v.get("max_conversations") == 0:
            v["max_conversations"] = None
        if isinstance(v.get("peak"), str) and v["peak"].isdigit():
            v["peak"] = int(v["peak"])
        return cls(**v)

    def values(self) -> dict[str, Any]:
        """The widget values of these settings (the inverse of :meth:`from_values`)."""
        return dataclasses.asdict(self)

    def configs(self) -> tuple[WorkloadConfig, SimulationConfig]:
        """The workload and simulation configs of this setting, as a results notebook builds
        them (:func:`.scale.setting`), with this window and these parameters."""
        arrival = ArrivalConfig(window_start=f"{self.window_start}T00:00:00Z")
        wcfg, sim = scale.setting(self.dataset, self.region_set, self.peak, self.memory,
                                  arrival=arrival, max_conversations=self.max_conversations,
                                  seed=self.seed)
        sim = dataclasses.replace(sim, gamma=self.gamma, kappa=self.kappa, c=self.c,
                                  beta_q=self.beta_q)
        return wcfg, sim

    def run_policies(self) -> tuple[str, ...]:
        """The policies replayed: :attr:`policies` with the reference and the target, in
        :data:`EXPLORER_POLICIES` order (others after)."""
        wanted = {metrics.REFERENCE_POLICY, self.target, *self.policies}
        ordered = [p for p in EXPLORER_POLICIES if p in wanted]
        return tuple(ordered + sorted(wanted - set(ordered)))


#: Presets of the explorer. "quick": 40 conversations at P = 4, in seconds (what the browser
#: test runs); "paper default": the results notebooks' setting (whole dataset at the default P;
#: hours on two cores unless notebook 04 has cached its runs).
PRESETS: dict[str, ExplorerSettings] = {
    "quick": ExplorerSettings(peak=4, max_conversations=40, n_boot=200),
    "paper default": ExplorerSettings(),
}


@dataclass(frozen=True)
class Exploration:
    """What :func:`explore` returns.

    Attributes
    ----------
    settings
        The setting explored.
    workload, simulation
        Its configs.
    scale
        :func:`.scale.describe` of the replay (rate, copies, sessions, queries, P, slots per
        pool, KV memory).
    runs
        ``{policy: RunSummary}``.
    table1
        :func:`.experiments.table1` of the runs (normalized to Session-Affinity, savings of the
        target with paired bootstrap 95% CIs, %).
    mechanisms
        :func:`.experiments.mechanisms` of the runs (policy, metric, value).
    n_cached, n_from_records, n_computed
        Runs read from the cache as summaries, summarized from cached records, and replayed.
    wall_s
        Wall time of :func:`explore`, s.
    """

    settings: ExplorerSettings
    workload: WorkloadConfig
    simulation: SimulationConfig
    scale: dict[str, Any]
    runs: dict[str, metrics.RunSummary]
    table1: pd.DataFrame
    mechanisms: pd.DataFrame
    n_cached: int
    n_from_records: int
    n_computed: int
    wall_s: float

    def describe(self) -> str:
        """One line on the replay's scale and where its runs came from."""
        s = self.scale
        return (f"{self.settings.dataset} on '{self.settings.region_set}' from "
                f"{self.settings.window_start}: {s['sessions']:,} sessions, {s['queries']:,} "
                f"queries, peak P = {s['peak_sessions']:.0f}, {s['slots_per_pool']} slots per "
                f"pool, KV memory '{self.settings.memory}' | {len(self.runs)} runs: "
                f"{self.n_cached} cached, {self.n_from_records} from cached records, "
                f"{self.n_computed} replayed, {self.wall_s:.1f} s")


def run_specs(settings: ExplorerSettings) -> dict[str, sweep.RunSpec]:
    """``{policy: compact RunSpec}`` of every policy replayed in ``settings``."""
    wcfg, sim = settings.configs()
    return {p: sweep.RunSpec.make(wcfg, sim, p, output="summary")
            for p in settings.run_policies()}


def explore(
    settings: ExplorerSettings,
    cache_dir: str | os.PathLike | None = None,
    serial: bool = True,
    client: Any = None,
    n_workers: int | None = None,
    progress: bool = False,
) -> Exploration:
    """Replay the policies of ``settings`` (or read them back) and compute Table 1 and the
    mechanisms.

    Parameters
    ----------
    settings
        The setting.
    cache_dir
        Run cache (default :func:`.sweep.default_cache_dir`, the one the notebooks use).
    serial
        Replay missing runs in this process, one after the other (the quick settings take
        seconds; a Dask cluster takes longer to start). False: through Dask (``client``, else
        ``$CARBONROUTER_DASK_SCHEDULER``, else a LocalCluster of ``n_workers``).
    client, n_workers, progress
        Passed to :func:`.sweep.run_sweep`.

    Returns
    -------
    Exploration
    """
    t0 = time.perf_counter()
    specs = run_specs(settings)
    # A run whose records a notebook cached (e.g. 04's Table 1) is summarized, not replayed.
    done = sweep.run_sweep(list(specs.values()), cache_dir=cache_dir, serial=serial,
                           client=client, n_workers=n_workers, progress=progress)
    runs = {p: done[s.key()] for p, s in specs.items()}  # in run_policies order
    any_spec = next(iter(specs.values()))
    wcfg, sim = any_spec.workload_config(), any_spec.simulation_config()
    table = experiments.table1(runs, n_boot=settings.n_boot, seed=settings.seed,
                               target=settings.target)
    return Exploration(
        settings=settings, workload=wcfg, simulation=sim, scale=scale.describe(wcfg, sim),
        runs=runs, table1=table, mechanisms=experiments.mechanisms(runs),
        n_cached=done.n_cached, n_from_records=done.n_derived, n_computed=done.n_computed,
        wall_s=time.perf_counter() - t0,
    )


def table1_view(result: Exploration) -> pd.DataFrame:
    """Table 1 for display, one row per policy: CO2, quality and energy relative to
    Session-Affinity, P95 TTFT (s), the target's saving (%, 95% CI), and the paper's CO2 and
    saving for this dataset beside them (the paper's values are for its own setting: P, regions
    and year differ; see notebook 04)."""
    t = result.table1.set_index("policy")
    view = t[["co2_rel", "quality_rel", "energy_rel", "p95_ttft_s"]].round(3)
    view[f"saving of {result.settings.target} % [95% CI]"] = [
        "–" if math.isnan(r.saving_pct) else
        f"{r.saving_pct:.1f} [{r.ci_low_pct:.1f}, {r.ci_high_pct:.1f}]"
        for r in t.itertuples()]
    paper = paper_numbers.TABLE1
    paper = paper[paper["dataset"] == PAPER_DATASET[result.settings.dataset]].set_index("policy")
    view["paper co2_rel"] = paper["co2_rel"].reindex(view.index)
    view["paper saving % (of carbonrouter)"] = [
        "–" if math.isnan(v) else f"{v:.1f}" for v in paper["saving_pct"].reindex(view.index)]
    return view


def plot_mechanisms(
    mechanisms: pd.DataFrame,
    dataset: str | None = None,
    metrics_shown: Sequence[str] = MECHANISMS_SHOWN,
    title: str | None = None,
) -> Figure:
    """The mechanism figure: one panel per quantity (shares in [0, 1], switches per session),
    one bar per policy of ``mechanisms`` (:func:`.experiments.mechanisms`), and the paper's value
    as a black mark where it reports one for ``dataset``'s paper counterpart
    (:func:`.plots.mechanism_panels`, as notebook 04 draws it)."""
    import matplotlib.pyplot as plt

    from carbonrouter_lib.plots import mechanism_panels

    fig, axes = plt.subplots(1, len(metrics_shown), figsize=(3.4 * len(metrics_shown), 3.2),
                             squeeze=False)
    mechanism_panels(axes[0], mechanisms, dataset, metrics_shown, rotation=30, ha="right",
                     fontsize=8)
    for ax in axes[0]:
        ax.set_ylim(bottom=0)  # every quantity is ≥ 0; an all-zero panel would centre on 0
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
