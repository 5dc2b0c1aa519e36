"""The proxy's configuration: one YAML file, validated at start-up (pydantic).

A file declares the deployments the proxy routes to (engine base URL, catalog model, GPU type,
region, grid zone, session slots, KV tokens), where their profiles come from, the carbon-signal
provider, the clock and the router's policy and constraints. Everything is checked before a
socket opens; a bad entry fails with a message naming the file, the entry (``deployments[3]
(id 'gb-h100')``) and the field.

How the declared deployments meet the library's model (one code path, ``docs/model.md`` §1–§6):

- The router's :class:`~carbonrouter_lib.deployments.Deployments` is the grid of every
  (catalog model, GPU, region) the file uses, in tie-break order (``docs/model.md`` §6a.9:
  regions as declared, GPUs in :data:`~carbonrouter_lib.profiles.GPUS` order, models in catalog
  order); grid entries that no deployment declares are never available.
- A pool is a (region, GPU type) as in :mod:`carbonrouter_lib.backend`: ``slots`` and
  ``kv_tokens`` are the pool's, so the deployments of one pool must declare the same values,
  and (the backend's :class:`~carbonrouter_lib.backend.BackendConfig` is uniform) so must every
  pool.
- Every deployment of a region draws on that region's grid zone.

Units: tokens, seconds, gCO2e/kWh.
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import pandas as pd
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from carbonrouter_lib.backend import BackendConfig
from carbonrouter_lib.deployments import Deployments
from carbonrouter_lib.paper import DEFAULTS
from carbonrouter_lib.policies import POLICIES, ConstraintConfig
from carbonrouter_lib.profiles import (
    GPUS,
    MODELS,
    ProfileError,
    analytical_profiles,
    load_measured_profiles,
)
from carbonrouter_lib.tokenizers import TOKENIZER_FAMILIES, TOKENIZER_OF_MODEL

__all__ = [
    "DEFAULT_CONFIG",
    "ConfigError",
    "DeploymentSpec",
    "CarbonSpec",
    "ClockSpec",
    "RouterSpec",
    "ServeConfig",
    "config_from_dict",
    "load_config",
]

#: The embedded default (``make serve``): emulated engines in three regions, replayed carbon.
DEFAULT_CONFIG = Path(__file__).with_name("default.yaml")


class ConfigError(ValueError):
    """A serve configuration that cannot be used; the message names the file, entry and field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DeploymentSpec(_Strict):
    """One engine the proxy routes to.

    Attributes
    ----------
    id
        Unique name (metrics, headers, logs).
    base_url
        The engine's OpenAI-compatible base URL, e.g. ``http://10.0.0.5:8000/v1``.
    model
        Catalog model whose profile and tokenizer apply (a row of the profile table).
    served_model
        The model name the engine serves (sent as ``model``); default ``model``.
    gpu
        GPU type (a column of the profile table, e.g. ``H100``).
    region
        Region label (tie-break order: :attr:`ServeConfig.regions`, else first appearance).
    zone
        Grid zone of the carbon provider (Electricity Maps zone, WattTime region, ...).
    slots
        Sessions the deployment's (region, GPU) pool holds at once, ≥ 1.
    kv_tokens
        KV-cache memory of that pool, tokens, > 0.
    tokenizer
        Tokenizer family (``gemma3``, ``llama3``, ``mistral``); default the catalog model's.
    """

    id: str = Field(min_length=1)
    base_url: str = Field(pattern=r"^https?://")
    model: str
    served_model: str | None = None
    gpu: str
    region: str = Field(min_length=1)
    zone: str = Field(min_length=1)
    slots: int = Field(ge=1)
    kv_tokens: float = Field(gt=0)
    tokenizer: str | None = None

    @field_validator("kv_tokens")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be finite")
        return v

    @property
    def engine_model(self) -> str:
        """The ``model`` field sent to the engine."""
        return self.served_model or self.model

    @property
    def family(self) -> str:
        """Tokenizer family of the deployment's model."""
        return self.tokenizer or TOKENIZER_OF_MODEL[self.model]


class CarbonSpec(_Strict):
    """The carbon-intensity signal (:mod:`carbonrouter_lib.serve.carbon_providers`).

    Attributes
    ----------
    provider
        ``replay`` (the project's data on the proxy's clock; offline default),
        ``electricitymaps``, ``watttime`` or ``carbon-aware-sdk``.
    year
        Replay: carbon year of the project's data.
    base_url
        Live providers: API base URL (default the provider's public one; the Carbon Aware SDK
        has none: it is self-hosted).
    ttl_s
        Live providers: seconds a fetched value is reused.
    max_stale_s
        A failed fetch falls back to the last known value while it is at most this old (s), then
        to ``default_gco2_per_kwh``.
    default_gco2_per_kwh
        The value of last resort, one number or one per zone, gCO2e/kWh.
    kind
        Carbon Aware SDK: whether its data source is ``average`` or ``marginal``.
    timeout_s
        HTTP timeout of one fetch, s.
    """

    provider: Literal["replay", "electricitymaps", "watttime", "carbon-aware-sdk"] = "replay"
    year: int = 2022
    base_url: str | None = None
    ttl_s: float = Field(default=300.0, ge=0)
    max_stale_s: float = Field(default=3600.0, ge=0)
    default_gco2_per_kwh: float | dict[str, float] = 400.0
    kind: Literal["average", "marginal"] = "average"
    timeout_s: float = Field(default=5.0, gt=0)


class ClockSpec(_Strict):
    """The proxy's clock: the time its backend, TTL, carbon replay and accounting run on.

    Attributes
    ----------
    start
        Virtual time at start-up (ISO 8601, UTC); None: the wall clock.
    scale
        Virtual seconds per wall second (> 0): at 60 a 30-min TTL passes in 30 s.
    """

    start: str | None = None
    scale: float = Field(default=1.0, gt=0)

    @field_validator("start")
    @classmethod
    def _iso(cls, v: str | None) -> str | None:
        if v is not None:
            pd.Timestamp(v)  # raises on a bad stamp
        return v

    def start_epoch_s(self) -> float | None:
        """``start`` as seconds since the Unix epoch (naive stamps read as UTC), or None."""
        if self.start is None:
            return None
        ts = pd.Timestamp(self.start)
        ts = ts.tz_localize("UTC") if ts.tz is None else ts.tz_convert("UTC")
        return ts.value / 1e9


class RouterSpec(_Strict):
    """The routing policy, constraints and the proxy's own behaviour.

    Attributes
    ----------
    policy, params
        A registry name of :data:`carbonrouter_lib.policies.POLICIES` and its parameters.
    gate
        CarbonRouter's gate: ``none`` (never stays, as ``carbonrouter-no-gate``) or
        ``learned``: :func:`carbonrouter_lib.gate.ensure_gate` for ``gate_workload`` on the
        configured zones (trained once, then cached).
    gate_workload
        :class:`carbonrouter_lib.prepared.WorkloadConfig` fields of the training replay: the
        learned gate's, and the sessions the horizon router (``carbonrouter-horizon``) learns
        its model from (how sessions continue, their later turns' tokens and models, think
        times), fitted for the served models at start-up.
    beta_q, d_ttft_s
        β_Q and D_TTFT of Eq. 7.
    ttl_s
        KV-cache TTL of the router's cache estimate, s.
    quality
        Q(m) per catalog model for requests that carry none (default 1.0 for every model).
    est_output_tokens
        Routing-time output estimate for requests that carry none (capped by ``max_tokens``).
    session_header
        Header naming the session; without it, a hash of the conversation's first messages.
    session_idle_s
        A session that sent nothing for this long (virtual s) leaves: its slot is released. If
        it comes back, it is routed as a new incarnation, without a cache (``serve.core``).
    completion
        ``observed``: a turn completes when its response ends (the clock's time then);
        ``modelled``: at d + TTFT(a) + N_out / v_dec, as the simulator (for replays on a
        manual clock).
    retries
        Further deployments tried after an engine error or timeout.
    cooldown_s
        Wall seconds a failed deployment is left out.
    connect_timeout_s, read_timeout_s
        Engine timeouts, wall s.
    """

    policy: str = "carbonrouter"
    params: dict[str, Any] = Field(default_factory=dict)
    gate: Literal["none", "learned"] = "none"
    gate_workload: dict[str, Any] = Field(default_factory=lambda: {"max_conversations": 400})
    beta_q: float = Field(default=DEFAULTS["beta_q"], gt=0, le=1)
    d_ttft_s: float = Field(default=DEFAULTS["d_ttft_s"], gt=0)
    ttl_s: float = Field(default=DEFAULTS["ttl_s"], gt=0)
    quality: dict[str, float] = Field(default_factory=dict)
    est_output_tokens: float = Field(default=256.0, ge=0)
    session_header: str = "X-Session-ID"
    session_idle_s: float = Field(default=1800.0, gt=0)
    completion: Literal["observed", "modelled"] = "observed"
    retries: int = Field(default=2, ge=0)
    cooldown_s: float = Field(default=30.0, ge=0)
    connect_timeout_s: float = Field(default=2.0, gt=0)
    read_timeout_s: float = Field(default=60.0, gt=0)

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, v: str) -> str:
        if v not in POLICIES:
            raise ValueError(f"unknown policy {v!r}; one of {sorted(POLICIES)}")
        return v

    @field_validator("quality")
    @classmethod
    def _quality(cls, v: dict[str, float]) -> dict[str, float]:
        for m, q in v.items():
            if not 0.0 <= q <= 1.0:
                raise ValueError(f"quality of {m!r} must be in [0, 1], got {q}")
        return v

    def constraints(self) -> ConstraintConfig:
        """β_Q and D_TTFT as the library's :class:`ConstraintConfig`."""
        return ConstraintConfig(beta_q=self.beta_q, d_ttft_s=self.d_ttft_s)


class ServeConfig(_Strict):
    """A whole serve configuration (see the module docstring); build with :func:`load_config`.

    Attributes
    ----------
    host, port
        Where the proxy listens (default 127.0.0.1:8000).
    regions
        Region labels in tie-break order; a deployment's region must be one of them. Default:
        order of first appearance.
    profiles
        ``analytical`` (Appendix A, ``docs/model.md`` §3, with ``profile_constants``) or the path
        of a measured profile
        table (:func:`carbonrouter_lib.profiles.load_measured_profiles`), relative to the file.
    profile_constants
        κ, γ, α, ... of the analytical profiles.
    """

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    regions: list[str] | None = None
    profiles: str = "analytical"
    profile_constants: dict[str, float] = Field(default_factory=dict)
    carbon: CarbonSpec = Field(default_factory=CarbonSpec)
    clock: ClockSpec = Field(default_factory=ClockSpec)
    router: RouterSpec = Field(default_factory=RouterSpec)
    deployments: list[DeploymentSpec] = Field(min_length=1)
    source: str = "<memory>"

    # -------------------------------------------------------------------------------------
    # the library's objects

    @property
    def region_order(self) -> tuple[str, ...]:
        """Regions in tie-break order."""
        if self.regions is not None:
            return tuple(self.regions)
        return tuple(dict.fromkeys(d.region for d in self.deployments))

    @property
    def zones(self) -> tuple[str, ...]:
        """The grid zone of each region (region order)."""
        zone = {d.region: d.zone for d in self.deployments}
        return tuple(zone.get(r, "") for r in self.region_order)

    def profile_table(self) -> pd.DataFrame:
        """The (model, GPU) profiles: analytical or the measured table."""
        return _profiles(self.profiles, tuple(sorted(self.profile_constants.items())),
                         self.source)

    def deployments_grid(self) -> tuple[Deployments, list[int]]:
        """The library's deployments over the file's (model, GPU, region) grid, and the grid
        index of each declared deployment (file order)."""
        table = self.profile_table()
        used_m = {d.model for d in self.deployments}
        used_g = {d.gpu for d in self.deployments}
        catalog = list(MODELS) + [m for m in table["model"].unique() if m not in MODELS]
        gpu_order = list(GPUS) + [g for g in table["gpu"].unique() if g not in GPUS]
        models = tuple(m for m in catalog if m in used_m)
        gpus = tuple(g for g in gpu_order if g in used_g)
        grid = Deployments.build(self.region_order, table, models=models, gpus=gpus)
        index = [grid.index(d.model, d.gpu, d.region) for d in self.deployments]
        return grid, index

    def on_loopback(self, ports: list[int], proxy_port: int, **router: Any) -> ServeConfig:
        """A copy whose engines listen on 127.0.0.1 ``ports`` (one per deployment, file order)
        and whose proxy on ``proxy_port`` (emulated demos and tests); ``router`` fields
        override :class:`RouterSpec`'s."""
        if len(ports) != len(self.deployments):
            raise ValueError(f"{len(self.deployments)} deployments need as many ports, got "
                             f"{len(ports)}")
        deps = [d.model_copy(update={"base_url": f"http://127.0.0.1:{p}/v1"})
                for d, p in zip(self.deployments, ports, strict=True)]
        return self.model_copy(update={"deployments": deps, "port": proxy_port, "host":
                                       "127.0.0.1", "router": self.router.model_copy(
                                           update=router)})

    def backend_config(self) -> BackendConfig:
        """Slots and KV tokens per pool and the TTL of the router's cache estimate."""
        d = self.deployments[0]
        return BackendConfig(slots_per_pool=d.slots, kv_tokens_per_pool=d.kv_tokens,
                             ttl_s=self.router.ttl_s)


@functools.lru_cache(maxsize=8)
def _profiles(source: str, constants: tuple[tuple[str, float], ...], where: str) -> pd.DataFrame:
    if source == "analytical":
        return analytical_profiles(**dict(constants))
    path = Path(source)
    if not path.is_absolute() and where != "<memory>":
        path = Path(where).parent / path
    return load_measured_profiles(path)


def _entry(i: int, d: Mapping[str, Any] | DeploymentSpec) -> str:
    ident = d.get("id") if isinstance(d, Mapping) else d.id
    return f"deployments[{i}]" + (f" (id {ident!r})" if ident else "")


def _check(cfg: ServeConfig) -> None:
    """Cross-entry rules pydantic cannot state field by field."""
    where = cfg.source
    seen: dict[str, int] = {}
    zone_of: dict[str, tuple[str, int]] = {}
    pool_of: dict[tuple[str, str], tuple[int, float, int]] = {}
    table = cfg.profile_table()
    pairs = set(zip(table["model"], table["gpu"], strict=True))
    known_regions = None if cfg.regions is None else set(cfg.regions)
    if cfg.regions is not None and len(set(cfg.regions)) != len(cfg.regions):
        raise ConfigError(f"{where}: regions has duplicates: {cfg.regions}")
    for i, d in enumerate(cfg.deployments):
        at = f"{where}: {_entry(i, d)}"
        if d.id in seen:
            raise ConfigError(f"{at}: duplicate id (also deployments[{seen[d.id]}])")
        seen[d.id] = i
        if known_regions is not None and d.region not in known_regions:
            raise ConfigError(f"{at}: unknown region {d.region!r}; regions: {cfg.regions}")
        if (d.model, d.gpu) not in pairs:
            raise ConfigError(f"{at}: no profile for model {d.model!r} on GPU {d.gpu!r} in "
                              f"{cfg.profiles!r}; models {sorted(set(table['model']))}, GPUs "
                              f"{sorted(set(table['gpu']))}")
        if d.tokenizer is None and d.model not in TOKENIZER_OF_MODEL:
            raise ConfigError(f"{at}: model {d.model!r} has no known tokenizer; set tokenizer to "
                              f"one of {list(TOKENIZER_FAMILIES)}")
        if d.tokenizer is not None and d.tokenizer not in TOKENIZER_FAMILIES:
            raise ConfigError(f"{at}: unknown tokenizer {d.tokenizer!r}; one of "
                              f"{list(TOKENIZER_FAMILIES)}")
        z = zone_of.setdefault(d.region, (d.zone, i))
        if z[0] != d.zone:
            raise ConfigError(f"{at}: zone {d.zone!r} differs from zone {z[0]!r} of region "
                              f"{d.region!r} in {_entry(z[1], cfg.deployments[z[1]])}")
        p = pool_of.setdefault((d.region, d.gpu), (d.slots, d.kv_tokens, i))
        first = cfg.deployments[0]
        if (d.slots, d.kv_tokens) != (p[0], p[1]) or (d.slots, d.kv_tokens) != (
                first.slots, first.kv_tokens):
            raise ConfigError(f"{at}: slots/kv_tokens ({d.slots}, {d.kv_tokens:g}) differ from "
                              f"{_entry(0, first)} ({first.slots}, {first.kv_tokens:g}); every "
                              f"(region, GPU) pool has the same capacity (backend.BackendConfig)")
    unknown_q = sorted(set(cfg.router.quality) - set(table["model"]))
    if unknown_q:
        raise ConfigError(f"{where}: router.quality names unknown models {unknown_q}")
    if cfg.regions is not None:
        empty = [r for r in cfg.regions if r not in zone_of]
        if empty:
            raise ConfigError(f"{where}: regions {empty} have no deployment")
    if isinstance(cfg.carbon.default_gco2_per_kwh, dict):
        missing = sorted(set(cfg.zones) - set(cfg.carbon.default_gco2_per_kwh))
        if missing:
            raise ConfigError(f"{where}: carbon.default_gco2_per_kwh lacks zones {missing}")


def _pydantic_message(where: str, raw: Mapping[str, Any], exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = list(err["loc"])
        if len(loc) >= 2 and loc[0] == "deployments" and isinstance(loc[1], int):
            deps = raw.get("deployments") or []
            entry = deps[loc[1]] if loc[1] < len(deps) and isinstance(deps[loc[1]], Mapping) \
                else {}
            head = _entry(loc[1], entry)
            rest = ".".join(str(x) for x in loc[2:])
            lines.append(f"{where}: {head}: {rest or 'entry'}: {err['msg']}")
        else:
            lines.append(f"{where}: {'.'.join(str(x) for x in loc) or 'file'}: {err['msg']}")
    return "\n".join(lines)


def config_from_dict(raw: Mapping[str, Any], source: str = "<memory>") -> ServeConfig:
    """Validate a configuration given as a mapping (the parsed YAML); see :func:`load_config`."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: the file must hold a mapping, got {type(raw).__name__}")
    try:
        cfg = ServeConfig(**{**raw, "source": source})
    except ValidationError as exc:
        raise ConfigError(_pydantic_message(source, raw, exc)) from None
    try:
        _check(cfg)
    except (ProfileError, OSError, TypeError) as exc:
        raise ConfigError(f"{source}: profiles {cfg.profiles!r}: {exc}") from None
    return cfg


def load_config(path: str | os.PathLike | None = None) -> ServeConfig:
    """Read and validate a serve configuration (default: the embedded :data:`DEFAULT_CONFIG`).

    ``${VAR}`` and ``${VAR:-default}`` in the file are replaced by environment variables (for
    engine addresses; API keys are read by the carbon providers themselves and never belong in
    the file).

    Raises
    ------
    ConfigError
        The file is unreadable, not YAML, or an entry breaks a rule; the message names the file,
        the entry and the field.
    """
    path = Path(path) if path is not None else DEFAULT_CONFIG
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the configuration ({exc.strerror})") from None
    text = _ENV.sub(lambda m: os.environ.get(m.group(1), m.group(3) or ""), text)
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    return config_from_dict(raw if raw is not None else {}, str(path))


_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:-([^}]*))?\}")
