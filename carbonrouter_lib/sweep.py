"""Sweeps: many independent replays (policy × parameter cell × seed) on a Dask cluster, cached.

A :class:`RunSpec` names one replay completely: the workload (:class:`~.prepared.WorkloadConfig`
fields), the setting (:class:`~.setting.SimulationConfig` fields), the policy and its
parameters, and the seed. :func:`run_one` executes it and returns the per-query records.
:func:`run_sweep` runs a list of specs through ``dask.distributed`` — a ``LocalCluster`` sized to
the machine by default, or any running scheduler given by address (argument or the environment
variable :data:`SCHEDULER_ENV`), so a notebook runs unchanged on a real cluster — and caches every
result on disk under the spec's :meth:`RunSpec.key` (the spec and the code of the replay), as an
entry of :mod:`carbonrouter_lib.cache`:

- ``<cache_dir>/run-<key[:20]>.parquet`` (the records, or for a spec with ``output="summary"`` the
  per-conversation sums of :class:`~.metrics.RunSummary`) and its manifest
  ``run-<key[:20]>.manifest.json`` (the spec, a summary's metrics, the parquet's SHA-256). The
  parquet is written first, the manifest last, each atomically, so a run counts as complete only
  when its manifest exists and its parquet matches it (anything else — an interrupted write, a
  truncated or modified file — is recomputed, with a warning for a broken file).
- Each result is written as soon as it arrives, so an interrupted sweep resumes without redoing
  finished runs.
- A summary is a function of its run's records: a spec with ``output="summary"`` whose records
  twin (the same spec with ``output="records"``) is cached, or is computed in the same sweep, is
  made from those records instead of being replayed again (the records' manifest keeps the
  replay's scale and capacity for it).

The parent process builds every prepared workload and carbon signal before submitting (both are
parquet-cached in :func:`~.datasets.derived_dir`), so workers only read those caches; a worker
keeps the tables it has read in a small module-level cache.

Inputs of one's own reach the workers by name, never as objects, so a spec stays plain JSON and
its key says what produced the result:

- a policy class outside the registry by its import name, ``RunSpec(policy="mypkg.mod:MyPolicy")``
  (:func:`~.policies.policy_class`; checked when the spec is made; the module must be importable
  on the workers). Its key holds the name and the SHA-256 of the module's source file, so editing
  the policy reruns it;
- measured profiles and a carbon signal by file path: ``SimulationConfig(profiles="my.csv")`` and
  ``SimulationConfig(carbon_file="signal.csv", regions=...)`` (a wide CSV, e.g.
  :meth:`~.carbon.CarbonSignal.to_csv`). The spec holds each file's absolute path and SHA-256
  (in the key); a worker reads the file and refuses it if its content has changed since. The
  path must be readable where the workers run (any path on one machine's LocalCluster).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
import json
import math
import os
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from carbonrouter_lib import arrivals, cache, metrics, prepared
from carbonrouter_lib.build import build_policy
from carbonrouter_lib.carbon import CarbonConfig, CarbonSignal
from carbonrouter_lib.datasets import derived_dir, sha256_of
from carbonrouter_lib.policies import POLICIES, Policy, make_policy, policy_class
from carbonrouter_lib.prepared import WorkloadConfig, dataset_columns, prepare_workload
from carbonrouter_lib.setting import SimulationConfig, backend_config
from carbonrouter_lib.simulator import SimulationResult, simulate

__all__ = [
    "SCHEDULER_ENV",
    "RunSpec",
    "SweepResults",
    "cell_savings",
    "default_cache_dir",
    "grid_specs",
    "is_complete",
    "replay",
    "run_named",
    "run_one",
    "run_sweep",
]

#: The module whose code (with all it imports: simulator, backend, policies, cost model, metrics,
#: prepared workload, gate) is part of every run's key.
_MODULE = "carbonrouter_lib.sweep"
#: What a run returns and caches: its records, or a :class:`~.metrics.RunSummary`.
OUTPUTS: tuple[str, ...] = ("records", "summary")
#: Environment variable holding the address of a running Dask scheduler (e.g.
#: ``tcp://10.0.0.5:8786``); used when ``run_sweep`` gets no client or address.
SCHEDULER_ENV = "CARBONROUTER_DASK_SCHEDULER"


def _canonical(obj: Any) -> Any:
    """Plain JSON form (tuples → lists, numpy scalars → Python) or a clear error."""
    try:
        return json.loads(json.dumps(obj, sort_keys=True, allow_nan=True,
                                     default=_json_default))
    except TypeError as exc:
        raise TypeError(f"RunSpec: parameters must be JSON-serializable: {exc}") from None


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalar
        return obj.item()
    raise TypeError(f"{obj!r} ({type(obj).__name__}) is not JSON-serializable")


def _floats_as_declared(cls: type, d: dict[str, Any]) -> dict[str, Any]:
    """Cast fields whose default is a float to float, so ``kappa=6`` and ``kappa=6.0`` (the same
    run) give the same key."""
    for f in dataclasses.fields(cls):
        if isinstance(f.default, float) and isinstance(d.get(f.name), int) and not isinstance(
            d.get(f.name), bool
        ):
            d[f.name] = float(d[f.name])
    return d


def _workload_config(d: Mapping[str, Any], seed: int) -> WorkloadConfig:
    d = dict(d)
    arrival = d.pop("arrival", None)
    if isinstance(arrival, Mapping):
        arrival = arrivals.ArrivalConfig(**arrival)
    if arrival is not None:
        d["arrival"] = arrival
    return WorkloadConfig(**d, seed=seed)


def _simulation_config(d: Mapping[str, Any]) -> SimulationConfig:
    # File fields come as {"path", "sha256"}; SimulationConfig reads and checks them.
    return SimulationConfig(**d)


def _policy_code(name: str) -> str | None:
    """SHA-256 of the source file defining a policy given by import name (None for the
    registry's, which the code hash of the key covers)."""
    if name in POLICIES:
        return None
    cls = policy_class(name)
    try:
        source = inspect.getsourcefile(cls)
    except TypeError:  # a built-in class
        source = None
    if source is None or not os.path.isfile(source):  # e.g. defined in a notebook cell
        return f"unversioned:{cls.__module__}.{cls.__qualname__}"
    return sha256_of(source)


@dataclass(frozen=True, eq=False)
class RunSpec:
    """One replay of a sweep: workload, setting, policy with its parameters, and seed.

    Construct it from config objects with :meth:`make` (or from plain dicts directly). On
    construction the dicts are validated by building the configs and stored in canonical,
    complete form (every field, defaults filled in), so equal runs have equal keys however they
    were written.

    Attributes
    ----------
    workload
        :class:`~.prepared.WorkloadConfig` fields except ``seed`` (``arrival`` as a dict).
    simulation
        :class:`~.setting.SimulationConfig` fields (``profiles`` and ``carbon_file`` as file
        paths; see the module doc).
    policy
        Registry name (:data:`carbonrouter_lib.policies.POLICIES`) or import name
        ``"package.module:Class"`` of a :class:`~.policies.Policy` subclass, imported by the
        workers (a class added to ``POLICIES`` at run time is unknown to them).
    policy_params
        Keyword arguments of the policy (JSON-serializable: a learned gate must be passed by
        reference, e.g. a path, not as an object).
    seed
        Seed of the run: the workload's seed (session sampling, start times, think times).
        Policies are deterministic given the workload.
    output
        ``"records"`` (default): the per-query records. ``"summary"``: a
        :class:`~.metrics.RunSummary` (the metrics and the per-conversation sums the paired
        bootstrap needs) — for service-scale replays, whose records run to millions of rows.
    """

    workload: Mapping[str, Any]
    simulation: Mapping[str, Any]
    policy: str
    policy_params: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    seed: int = 0
    output: str = "records"

    def __post_init__(self) -> None:
        try:
            policy_class(self.policy)
        except (KeyError, ValueError, TypeError) as exc:
            raise type(exc)(f"RunSpec: {exc.args[0]}") from None
        arrivals.check_seed(self.seed, "RunSpec.seed")
        if "seed" in self.workload:
            raise ValueError("RunSpec.workload must not contain 'seed': use RunSpec.seed")
        if self.output not in OUTPUTS:
            raise ValueError(f"RunSpec.output must be one of {OUTPUTS}, got {self.output!r}")
        wl = _workload_config(self.workload, self.seed).to_dict()
        del wl["seed"]
        wl["arrival"] = _floats_as_declared(arrivals.ArrivalConfig, wl["arrival"])
        sim = _floats_as_declared(SimulationConfig,
                                  _simulation_config(self.simulation).to_dict())
        params = _canonical(dict(self.policy_params))
        make_policy(self.policy, **params)  # fails early, in the parent, on bad parameters
        object.__setattr__(self, "workload", _canonical(wl))
        object.__setattr__(self, "simulation", _canonical(sim))
        object.__setattr__(self, "policy_params", params)
        object.__setattr__(self, "_policy_code", _policy_code(self.policy))

    @classmethod
    def make(
        cls,
        workload_config: WorkloadConfig,
        simulation_config: SimulationConfig,
        policy: str,
        policy_params: Mapping[str, Any] | None = None,
        output: str = "records",
    ) -> RunSpec:
        """The spec of ``policy`` on these configs (the seed is ``workload_config.seed``)."""
        wl = workload_config.to_dict()
        seed = wl.pop("seed")
        return cls(wl, simulation_config.to_dict(), policy, dict(policy_params or {}), seed,
                   output)

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (what the manifest of its cached result holds)."""
        d = {"workload": self.workload, "simulation": self.simulation,
             "policy": self.policy, "policy_params": self.policy_params, "seed": self.seed}
        if self.output != "records":
            d["output"] = self.output
        return d

    def key(self) -> str:
        """SHA-256 (hex, 64 characters) of the canonical JSON of the spec and of the code of the
        replay (:func:`carbonrouter_lib.cache.key`; for a policy given by import name, also its
        source file's SHA-256)."""
        doc = {"spec": self.to_dict()}
        if self._policy_code is not None:
            doc["policy_code"] = self._policy_code
        return cache.key("run", doc, _MODULE)

    def workload_config(self) -> WorkloadConfig:
        """The :class:`~.prepared.WorkloadConfig` of this run."""
        return _workload_config(self.workload, self.seed)

    def simulation_config(self) -> SimulationConfig:
        """The :class:`~.setting.SimulationConfig` of this run."""
        return _simulation_config(self.simulation)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunSpec) and self.key() == other.key()

    def __hash__(self) -> int:
        return hash(self.key())


# ---------------------------------------------------------------------------------------------
# One run (executed on a worker)
# ---------------------------------------------------------------------------------------------


def _signal(sim: SimulationConfig) -> CarbonSignal:
    # A file of one's own is read (and cached) by the setting itself.
    return sim.signal() if sim.carbon_file is not None else _mirrored_signal(sim.carbon_year,
                                                                            sim.regions)


@functools.lru_cache(maxsize=4)
def _mirrored_signal(year: int, regions: tuple[str, ...]) -> CarbonSignal:
    # One signal per worker process and setting (built from its parquet cache).
    return CarbonSignal.from_config(CarbonConfig(year=year, regions=regions))


@functools.lru_cache(maxsize=2)
def _table(workload_key: str, config: WorkloadConfig) -> pd.DataFrame:
    # Keyed by the config's hash; the config itself is hashable (frozen) and carried along.
    # Two at most: a service-scale table is gigabytes.
    return prepare_workload(config)


def run_one(spec: RunSpec, gate_dir: str | os.PathLike | None = None
            ) -> pd.DataFrame | metrics.RunSummary:
    """Replay ``spec`` and return its per-query records (:data:`.metrics.RECORD_COLUMNS` plus
    ``policy``), in dispatch order, or their :class:`~.metrics.RunSummary` for
    ``spec.output == "summary"``. Reads (or, if missing, builds) the prepared workload and the
    carbon signal from their parquet caches, and a learned gate from ``gate_dir`` (default
    :func:`carbonrouter_lib.gate.gate_path`'s, ``derived_dir()/gates``), training and storing it
    there first if it is missing."""
    return _run(spec, gate_dir)[0]


def replay(spec: RunSpec, gate_dir: str | os.PathLike | None = None,
           policy: Policy | None = None, engine: str = "auto") -> SimulationResult:
    """Replay ``spec`` as :func:`run_one` does, uncached, and return the simulator's whole result:
    its records and the backend's counters (evictions, expiries; :data:`.kernel.COUNTERS`).
    ``policy``: replay this policy (e.g. a subclass of your own, built and fitted here) in
    ``spec``'s setting instead of ``spec``'s; ``engine``: :func:`.simulator.simulate`'s."""
    return _replay(spec, gate_dir, policy, engine)[0]


def _replay(spec: RunSpec, gate_dir: str | os.PathLike | None = None,
            policy: Policy | None = None, engine: str = "auto"
            ) -> tuple[SimulationResult, pd.DataFrame, SimulationConfig, Any]:
    """:func:`replay`'s result with the table, simulation config and capacity it ran on."""
    wl = spec.workload_config()
    sim = spec.simulation_config()
    table = _table(wl.key(), wl)
    signal = _signal(sim)
    capacity = backend_config(table, sim)
    if policy is None:
        policy = make_policy(spec.policy, **spec.policy_params)
    # A learned gate is trained once per setting and cached, whichever worker gets it first.
    policy = build_policy(policy, table, sim, signal=signal, backend=capacity, workload=wl,
                          gate_dir=gate_dir)
    return (simulate(table, policy, sim, signal=signal, backend=capacity, engine=engine),
            table, sim, capacity)


def _run(spec: RunSpec, gate_dir: str | os.PathLike | None = None
         ) -> tuple[pd.DataFrame | metrics.RunSummary, dict[str, float]]:
    """:func:`run_one`'s result and the replay's scale and capacity (:func:`_scale_of`), which
    the cache keeps with the result so that a summary can later be made from cached records."""
    res, table, sim, capacity = _replay(spec, gate_dir)
    records = res.records.reset_index(drop=True)
    records.attrs = {}
    scale = _scale_of(table, sim, capacity)
    if spec.output == "summary":
        return _summary_of(records, scale), scale
    return records, scale


def _scale_of(table: pd.DataFrame, sim: SimulationConfig, capacity) -> dict[str, float]:
    """The scale and capacity of a replay (recorded with its metrics): the workload's
    :func:`~.prepared.scale_summary`, the slots per pool and the KV memory in all, tokens."""
    kv = (capacity.kv_tokens_per_pool * sim.deployments().n_pools
          if capacity.kv_tokens_per_deployment is None
          else sum(capacity.kv_tokens_per_deployment))
    return {**{k: float(v) for k, v in prepared.scale_summary(table).items()},
            "slots_per_pool": float(capacity.slots_per_pool), "kv_tokens_total": float(kv)}


def _summary_of(records: pd.DataFrame, scale: Mapping[str, float]) -> metrics.RunSummary:
    """The :class:`~.metrics.RunSummary` of a run's records, its scale appended to the metrics
    (what a spec with ``output="summary"`` returns)."""
    summary = metrics.RunSummary.from_records(records)
    extra = pd.Series(dict(scale), dtype=np.float64)
    return metrics.RunSummary(pd.concat([summary.summary, extra]), summary.by_conversation)


# ---------------------------------------------------------------------------------------------
# The on-disk cache
# ---------------------------------------------------------------------------------------------


def default_cache_dir() -> Path:
    """``derived_dir()/"sweeps"``: where sweep results are cached by default."""
    return derived_dir() / "sweeps"


def _entry(cache_dir: str | os.PathLike | None, spec: RunSpec) -> cache.Entry:
    return cache.Entry(Path(cache_dir or default_cache_dir()), "run", spec.key(),
                       params=spec.to_dict())


def is_complete(spec: RunSpec, cache_dir: str | os.PathLike | None = None) -> bool:
    """Whether ``spec``'s result is in the cache: its manifest exists (it is written last, so a
    parquet alone is an interrupted write) and its parquet matches it (size and SHA-256)."""
    return _entry(cache_dir, spec).is_complete()


def _write_result(cache_dir: Path, spec: RunSpec, result: pd.DataFrame | metrics.RunSummary,
                  scale: Mapping[str, float] | None = None) -> None:
    meta: dict[str, Any] = {}
    if isinstance(result, metrics.RunSummary):
        table = result.by_conversation.reset_index()
        meta["summary"] = {k: float(v) for k, v in result.summary.items()}
    else:
        table = result
    meta["n_records"] = len(table)
    if scale is not None:
        meta["scale"] = dict(scale)
    _entry(cache_dir, spec).save(table, meta)


def _records_twin(spec: RunSpec) -> RunSpec:
    """The same run with ``output="records"``: a summary is a function of its records."""
    return dataclasses.replace(spec, output="records")


def _summary_from_cache(cache_dir: Path, spec: RunSpec) -> metrics.RunSummary | None:
    """The summary of ``spec`` made from its records twin's cached records, or None if those
    are not cached (or were cached without their scale, before it was recorded)."""
    hit = _entry(cache_dir, _records_twin(spec)).load()
    if hit is None or "scale" not in hit[1]:
        return None
    records, meta = hit
    return _summary_of(records, meta["scale"])


def _read_result(cache_dir: Path, spec: RunSpec) -> pd.DataFrame | metrics.RunSummary | None:
    """The cached result of ``spec``, or None if it is not there (or broken: warned)."""
    hit = _entry(cache_dir, spec).load()
    if hit is None:
        return None
    records, meta = hit
    if spec.output == "summary":
        return metrics.RunSummary(pd.Series(meta["summary"], dtype=np.float64),
                                  records.set_index("conversation"))
    return records


# ---------------------------------------------------------------------------------------------
# The sweep
# ---------------------------------------------------------------------------------------------


class SweepResults(dict):
    """``{spec key: records}`` of a sweep (a :class:`~.metrics.RunSummary` for a spec with
    ``output="summary"``), with how it went.

    Attributes
    ----------
    specs
        ``{key: RunSpec}`` of every result.
    n_cached, n_computed, n_derived
        Runs read from the cache, runs executed by this call, and summaries made from the
        records of the same run (cached, or computed by this call) instead of running again.
    wall_s
        Wall time of the call, s.
    """

    specs: dict[str, RunSpec]
    n_cached: int = 0
    n_computed: int = 0
    n_derived: int = 0
    wall_s: float = math.nan


def _prepare_inputs(specs: Iterable[RunSpec]) -> None:
    """Build every prepared workload and carbon signal once, in this process, so that workers
    only read their parquet caches (and never build the same one concurrently)."""
    done: set[str] = set()
    for spec in specs:
        wl, sim = spec.workload_config(), spec.simulation_config()
        tag = f"{wl.key()}|{sim.carbon_year}|{sim.regions}|{sim.carbon_file}"
        if tag not in done:
            if wl.sessions_per_s is None:
                prepare_workload(wl)
            else:  # not cached on disk: workers rebuild it from the cached dataset columns
                dataset_columns(wl)
            _signal(sim)  # a file of one's own is checked here, before any worker reads it
            done.add(tag)


def _connect(address: str, connect_timeout: str):
    from distributed import Client

    try:
        return Client(address, timeout=connect_timeout)
    except (OSError, TimeoutError, ValueError) as exc:
        raise ConnectionError(
            f"run_sweep: cannot connect to the Dask scheduler at {address!r} (from the argument "
            f"or ${SCHEDULER_ENV}) within {connect_timeout}: {exc}"
        ) from None


def run_sweep(
    specs: Iterable[RunSpec],
    client: Any = None,
    cache_dir: str | os.PathLike | None = None,
    progress: bool = True,
    serial: bool = False,
    n_workers: int | None = None,
    connect_timeout: str = "10s",
    on_submit: Callable[[list[RunSpec]], None] | None = None,
) -> SweepResults:
    """Run every spec not yet in the cache through Dask and return all results.

    Parameters
    ----------
    specs
        The runs; duplicates (equal keys) run once.
    client
        Where to run: a ``distributed.Client``; a Dask cluster object (e.g. a ``LocalCluster``,
        left running); a scheduler address string; or None — then the address in
        ``$CARBONROUTER_DASK_SCHEDULER`` if set, else a ``LocalCluster(n_workers, 1 thread per
        worker, processes)`` created for this call and closed at its end.
    cache_dir
        Result cache (default :func:`default_cache_dir`). Learned gates trained by the runs go
        to its ``gates`` folder when given, else to the default gate folder.
    progress
        Show a tqdm bar over runs (cached runs count as done from the start).
    serial
        Run the missing specs in this process, one after the other, without Dask (debugging, and
        the oracle of the tests).
    n_workers
        Workers of the default LocalCluster (default: ``os.cpu_count()``).
    connect_timeout
        How long to wait for a scheduler given by address (Dask duration string).
    on_submit
        Called once with the specs about to run (after the cache check), e.g. to count them.

    Returns
    -------
    SweepResults
        ``{key: records}`` for every spec (see :class:`SweepResults`).

    Raises
    ------
    ConnectionError
        The scheduler address cannot be reached.
    RuntimeError
        Some runs failed; every successful run has been cached first, the first failure is
        chained.
    """
    t0 = time.perf_counter()
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    unique: dict[str, RunSpec] = {}
    for spec in specs:
        if not isinstance(spec, RunSpec):
            raise TypeError(f"run_sweep: expected RunSpec, got {type(spec).__name__}")
        unique.setdefault(spec.key(), spec)
    results = SweepResults()
    results.specs = dict(unique)
    pending = []
    for k, spec in unique.items():
        result = _read_result(folder, spec)  # None: missing, or broken (then warned)
        if result is None and spec.output == "summary":
            result = _summary_from_cache(folder, spec)
            if result is not None:
                _write_result(folder, spec, result)
                results.n_derived += 1
        if result is None:
            pending.append(spec)
        else:
            results[k] = result
    results.n_cached = len(results) - results.n_derived
    if on_submit is not None:
        on_submit(list(pending))
    # A summary whose records are computed in this sweep too is made from them, not rerun.
    pending_keys = {s.key() for s in pending}
    waiting: dict[str, list[RunSpec]] = {}
    to_run = []
    for spec in pending:
        twin = _records_twin(spec).key()
        if spec.output == "summary" and twin in pending_keys:
            waiting.setdefault(twin, []).append(spec)
        else:
            to_run.append(spec)

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(unique), initial=len(results), desc="sweep", unit="run",
                   mininterval=2.0)
    failures: list[tuple[RunSpec, BaseException]] = []

    def finish(spec: RunSpec, result: pd.DataFrame | metrics.RunSummary,
               scale: dict[str, float]) -> None:
        # The cache's round trip is exact (tests/test_sweep.py), so the result as computed is
        # what a resumed sweep would read back; reading it again would cost as much as writing.
        _write_result(folder, spec, result, scale)
        results[spec.key()] = result
        results.n_computed += 1
        if bar is not None:
            bar.update(1)
        for summary_spec in waiting.pop(spec.key(), []):
            summary = _summary_of(result, scale)
            _write_result(folder, summary_spec, summary, scale)
            results[summary_spec.key()] = summary
            results.n_derived += 1
            if bar is not None:
                bar.update(1)

    try:
        if to_run:
            _prepare_inputs(to_run)
        # Gates live beside a custom result cache (so an empty cache means a full rerun),
        # else in the default gate folder, where notebooks find them with gate.ensure_gate.
        gate_dir = None if cache_dir is None else str(folder / "gates")
        if to_run and serial:
            for spec in to_run:
                try:
                    finish(spec, *_run(spec, gate_dir))
                except Exception as exc:  # noqa: BLE001 — collected, re-raised below
                    failures.append((spec, exc))
        elif to_run:
            _run_distributed(to_run, client, n_workers, connect_timeout, finish, failures,
                             gate_dir)
    finally:
        if bar is not None:
            bar.close()
    for key, specs_left in waiting.items():  # their records run failed
        failures.extend((spec, RuntimeError(f"the records run {key[:16]}… it is made from "
                                            f"failed")) for spec in specs_left)
    results.wall_s = time.perf_counter() - t0
    if failures:
        spec, exc = failures[0]
        raise RuntimeError(
            f"run_sweep: {len(failures)} of {len(pending)} runs failed (the others are cached); "
            f"first: policy {spec.policy!r}, key {spec.key()[:16]}…: {exc!r}"
        ) from exc
    return results


def run_named(
    specs: Mapping[Hashable, RunSpec], **kwargs: Any
) -> dict[Hashable, pd.DataFrame | metrics.RunSummary]:
    """:func:`run_sweep` over named runs: ``{name: spec}`` → ``{name: records}`` (names are any
    hashable labels, e.g. ``(dataset, region set, policy)``; equal specs under two names run
    once). Keyword arguments go to :func:`run_sweep` (where it runs, cache, progress); call
    :func:`run_sweep` itself for the counters and wall time of :class:`SweepResults`."""
    results = run_sweep(specs.values(), **kwargs)
    return {name: results[spec.key()] for name, spec in specs.items()}


def _run_distributed(
    pending: list[RunSpec],
    client: Any,
    n_workers: int | None,
    connect_timeout: str,
    finish: Callable[[RunSpec, Any], None],
    failures: list[tuple[RunSpec, BaseException]],
    gate_dir: str | None,
) -> None:
    from distributed import Client, LocalCluster, as_completed

    with ExitStack() as stack:
        if isinstance(client, Client):
            pass
        elif isinstance(client, str):
            client = stack.enter_context(_connect(client, connect_timeout))
        elif client is not None and hasattr(client, "scheduler_address"):  # a Cluster object
            client = stack.enter_context(Client(client))
        elif client is None and os.environ.get(SCHEDULER_ENV):
            client = stack.enter_context(_connect(os.environ[SCHEDULER_ENV], connect_timeout))
        elif client is None:
            cluster = stack.enter_context(LocalCluster(
                n_workers=n_workers or os.cpu_count() or 1, threads_per_worker=1,
                processes=True, dashboard_address=":0",
            ))
            client = stack.enter_context(Client(cluster))
        else:
            raise TypeError(f"run_sweep: client must be a distributed.Client, a cluster, an "
                            f"address or None, got {type(client).__name__}")
        by_key = {s.key(): s for s in pending}
        # Explicit keys: the same run submitted twice (e.g. two notebooks on one cluster) is
        # computed once by the scheduler.
        futures = client.map(_run, pending, gate_dir=gate_dir,
                             key=[f"carbonrouter-run-{k}" for k in by_key])
        spec_of = {f.key: s for f, s in zip(futures, pending, strict=True)}
        for future in as_completed(futures):
            spec = spec_of[future.key]
            if future.status == "error":
                failures.append((spec, future.exception()))
            else:
                finish(spec, *future.result())
            future.release()


# ---------------------------------------------------------------------------------------------
# Parameter grids (sensitivity tables)
# ---------------------------------------------------------------------------------------------


def grid_specs(
    workload_config: WorkloadConfig,
    simulation_config: SimulationConfig,
    axes: Mapping[str, Sequence[Any]],
    policies: Sequence[str],
    seeds: Sequence[int] | None = None,
    policy_params: Mapping[str, Mapping[str, Any]] | None = None,
    output: str = "records",
) -> pd.DataFrame:
    """The runs of a full-factorial grid over :class:`~.setting.SimulationConfig` fields.

    Parameters
    ----------
    workload_config, simulation_config
        The base run; each cell replaces the ``axes`` fields of ``simulation_config``.
    axes
        ``{SimulationConfig field: values}``, e.g. ``{"gamma": [...], "kappa": [...]}``.
    policies
        Policies run in every cell (on the same workload and setting, so they can be paired).
    seeds
        Workload seeds (default: ``[workload_config.seed]``).
    policy_params
        ``{policy: parameters}`` for policies that take any.
    output
        What each run returns (:data:`OUTPUTS`).

    Returns
    -------
    pandas.DataFrame
        One row per run: the axis values, ``seed``, ``policy``, ``key`` and ``spec`` (the
        :class:`RunSpec`), in grid order.
    """
    names = list(axes)
    unknown = set(names) - {f.name for f in dataclasses.fields(SimulationConfig)}
    if unknown:
        raise KeyError(f"grid_specs: {sorted(unknown)} are not SimulationConfig fields")
    seeds = [workload_config.seed] if seeds is None else list(seeds)
    params = policy_params or {}
    rows = []
    for values in itertools.product(*(axes[n] for n in names)):
        sim = dataclasses.replace(simulation_config, **dict(zip(names, values, strict=True)))
        for seed in seeds:
            wl = dataclasses.replace(workload_config, seed=seed)
            for policy in policies:
                spec = RunSpec.make(wl, sim, policy, params.get(policy), output)
                rows.append({**dict(zip(names, values, strict=True)), "seed": seed,
                             "policy": policy, "key": spec.key(), "spec": spec})
    return pd.DataFrame(rows)


def cell_savings(
    results: Mapping[str, pd.DataFrame | metrics.RunSummary],
    grid: pd.DataFrame,
    target: str = "carbonrouter",
    baseline: str = "faircarbon",
    metric: str = "carbon_g",
    n_boot: int = 2000,
    boot_seed: int = 0,
) -> pd.DataFrame:
    """Saving of ``target`` over ``baseline`` (%) in every cell (and seed) of a grid, with the
    paired session-level bootstrap 95% CI of :func:`.metrics.paired_saving_ci`.

    ``grid`` is a :func:`grid_specs` table; ``results`` holds the records (or the
    :class:`~.metrics.RunSummary`, with :func:`.metrics.paired_saving_ci_sums`) of its keys. Returns
    one row per cell and seed: the axis values, ``seed``, ``saving_pct``, ``ci_low_pct``,
    ``ci_high_pct``, ``n_sessions`` and the total ``metric`` of both policies.
    """
    axes = [c for c in grid.columns if c not in ("seed", "policy", "key", "spec")]
    for policy in (target, baseline):
        if policy not in set(grid["policy"]):
            raise KeyError(f"cell_savings: policy {policy!r} is not in the grid")
    if grid[axes].isna().any().any():
        raise ValueError(f"cell_savings: grid axis columns {axes} contain NaN (was it concatenated "
                         f"with another grid?); pass one grid_specs table")
    missing = sorted(set(grid["key"]) - set(results))
    if missing:
        raise KeyError(f"cell_savings: {len(missing)} runs of the grid have no results "
                       f"(first key {missing[0][:16]}…)")
    rows = []
    for cell, runs in grid.groupby(axes + ["seed"], sort=False):
        key = dict(zip(runs["policy"], runs["key"], strict=True))
        a, b = results[key[target]], results[key[baseline]]
        if isinstance(a, metrics.RunSummary):
            a, b = a.by_conversation, b.by_conversation
            ci = metrics.paired_saving_ci_sums(a, b, metric=metric, n_boot=n_boot,
                                               seed=boot_seed)
        else:
            ci = metrics.paired_saving_ci(a, b, metric=metric, n_boot=n_boot, seed=boot_seed)
        rows.append({**dict(zip(axes + ["seed"], cell, strict=True)),
                     "saving_pct": ci.estimate, "ci_low_pct": ci.low, "ci_high_pct": ci.high,
                     "n_sessions": ci.n_sessions, f"{target}_{metric}": float(a[metric].sum()),
                     f"{baseline}_{metric}": float(b[metric].sum())})
    return pd.DataFrame(rows)
